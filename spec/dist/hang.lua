-- Run by spec/30-distributed_spec.lua as:
--   mpirun -x MOONGRAD_DIST_TIMEOUT=30 -np 2 moongrad spec/dist/hang.lua
-- Rank 1 hangs without dying (it sleeps 30 s) while rank 0 waits for it in an
-- allreduce: rank 0 must fail after its timeout (1.5 s, set by init's option
-- over the environment's 30) with an error naming the rank that did not
-- arrive, refuse any later collective, and stop the job at exit instead of
-- waiting in MPI_Finalize.
local dist = mg.distributed
local mpi = require "moongrad.mpi"
local rank = dist.init()
assert(mpi.timeout() == 30, "MOONGRAD_DIST_TIMEOUT was not read")
dist.init{timeout = 1.5}                              -- again: only sets the timeout
assert(mpi.timeout() == 1.5)
dist.barrier()
if rank == 1 then
  os.execute("exec sleep 30 </dev/null >/dev/null 2>&1")
  print("rank 1 woke up: it was not stopped")
  os.exit(0)
end
local ok, err = pcall(dist.allreduce, mg.ones(3))
print("rank 0: " .. tostring(err))
ok, err = pcall(dist.barrier)
print("rank 0 then: " .. tostring(err))
