-- Run by spec/30-distributed_spec.lua beside spec/dist/bad_peer.c, a rank
-- that lies in moongrad's call header:
--   mpirun -np 2 moongrad spec/dist/bad_header.lua : -np 1 bad_peer
-- Each case is an allgather of a float32 (2,3) tensor; the peer sends a
-- negative first axis, a shape of more than 2^63 bytes, 99 dimensions, a
-- byte count that does not match its shape, something that is not a header,
-- a failure of its own, another second axis, and 2^40 rows. Each moongrad
-- rank prints "rank <r> <case>: <error>"; then a valid allgather with the
-- peer (its one row is 7 8 9) and a barrier show that they are still in step.
local dist = mg.distributed
local rank, size = dist.init()
local peer = size - 1
assert(rank < peer, "the peer is the last rank")

local function case (name, f)
  local ok, err = pcall(f)
  print(("rank %d %s: %s"):format(rank, name, ok and "no error" or tostring(err)))
end

local x = mg.ones({2, 3})
for _, name in ipairs({"negative first axis", "more than 2^63 bytes", "99 dimensions", "bytes", "not a header",
                       "its own failure", "another second axis", "2^40 rows"}) do
  case(name, function() return dist.allgather(x) end)
end
local all = dist.allgather(x * (rank + 1))
assert(table.concat(all.shape, ",") == ("%d,3"):format(2 * peer + 1), "shape " .. table.concat(all.shape, ","))
local t = all:totable()
assert(t[1][1] == 1 and t[3][1] == 2 and t[2 * peer + 1][1] == 7 and t[2 * peer + 1][3] == 9, "values")
dist.barrier()
print(("rank %d in step with the peer"):format(rank))
