-- mg.distributed (issue 15): collectives, DistributedOptimizer, fit{distributed = true},
-- faults; ranks that disagree on a call, a lying peer and a hanging one (issue 28). The multi-process parts run the programs of spec/dist/ under
-- `mpirun -np 2` (as root Open MPI needs --allow-run-as-root; --oversubscribe
-- lets 2 ranks share fewer cores); without mpirun they are pending, with a message.
local mg = require "moongrad"
local helpers = require "helpers"

local has_mpirun = os.execute("command -v mpirun >/dev/null 2>&1") == true

-- mpirun -np n <moongrad> args, with a time limit: a hang fails the spec instead
-- of CI. Loopback only: shared memory between the ranks (btl self,vader), and
-- mpirun's own connections on lo. Under make asan the ranks keep AddressSanitizer but not LeakSanitizer:
-- Open MPI leaves its own allocations at exit, in plugins it has unloaded by
-- then (so no suppression can name them)
local function mpirun (n, args, limit, extra)
  return helpers.run(('ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" timeout %d mpirun --allow-run-as-root '
                      .. "--oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo %s -np %d %s %s"):format(
                      limit or 180, extra or "", n, helpers.bin, args))
end

-- the lines "rank <r> <case>: <text>" of out as lines[r][case] = text, the
-- error's position (the script's "fit_equal.lua:12: ") left out
local function cases (out)
  local lines = {}
  for r, name, text in out:gmatch("rank (%d+) ([^:\n]+): ([^\n]*)") do
    lines[tonumber(r)] = lines[tonumber(r)] or {}
    lines[tonumber(r)][name] = text:gsub("^[%w_./]+%.lua:%d+: ", "")
  end
  return lines
end

-- every case's text on each of the ranks; want[case] is one text for all, or one per rank
local function same_on_every_rank (out, ranks, want)
  local lines = cases(out)
  for name, text in pairs(want) do
    for r = 0, ranks - 1 do
      local expected = type(text) == "table" and text[r + 1] or text
      assert.equal(expected, (lines[r] or {})[name], ("rank %d, case '%s':\n%s"):format(r, name, out))
    end
  end
end

local function needs_mpirun ()
  if not has_mpirun then
    pending("mpirun not found: install openmpi-bin (make deps) to run the distributed specs")
    return false
  end
  return true
end

describe("mg.distributed", function()
  it("rank 0's progress bar into a file under mpirun: plain lines, no carriage returns", function()
    if not needs_mpirun() then return end
    local prog, log = os.tmpname() .. ".lua", os.tmpname()
    local f = assert(io.open(prog, "w"))
    f:write([[
mg.distributed.init()
local m = mg.nn.Sequential{mg.nn.Dense(1)}
m:compile{optimizer = "sgd", loss = "mse"}
m:fit(mg.ones(8, 2), mg.ones(8, 1), {epochs = 2, batch_size = 2, distributed = true})
]])
    f:close()
    local out, code = mpirun(2, prog .. " > " .. log)
    local text = assert(io.open(log, "rb")):read("a")
    os.remove(prog)
    os.remove(log)
    assert.equal(0, code, out)
    assert.is_nil(text:find("\r", 1, true), text)
    local _, bars = text:gsub("2/2 %[", "")
    assert.equal(2, bars, text)                                      -- one line per epoch, rank 0's
  end)

  it("says to call init first", function()
    local dist = mg.distributed
    assert.is_false(dist.is_initialized())
    for _, f in ipairs({"rank", "size", "barrier"}) do
      assert.has_error(function() dist[f]() end,
        f .. ": mg.distributed is not initialized; call mg.distributed.init() first (and start the program with mpirun)")
    end
    assert.has_error(function() dist.allreduce(mg.zeros(2)) end,
      "allreduce: mg.distributed is not initialized; call mg.distributed.init() first (and start the program with mpirun)")
    assert.has_error(function() dist.DistributedOptimizer(mg.optim.SGD()):apply_gradients({}, {}) end,
      "DistributedOptimizer: mg.distributed is not initialized; call mg.distributed.init() first (and start the program with mpirun)")
  end)

  it("fit{distributed = true} says to call init first", function()
    local m = mg.nn.Sequential{mg.nn.Dense(2)}
    m:compile{optimizer = "sgd", loss = "mse"}
    assert.has_error(function() m:fit(mg.zeros({4, 3}), mg.zeros({4, 2}), {distributed = true, verbose = 0}) end,
      "fit: distributed = true needs mg.distributed.init() first (and the program started with mpirun)")
    assert.has_error(function() m:fit(mg.zeros({4, 3}), mg.zeros({4, 2}), {distributed = 1}) end,
      "fit: option 'distributed' must be true or false, got 1")
  end)

  it("says so plainly in a build without MPI", function()
    local loaded, saved_mpi, saved_preload = package.loaded, package.loaded["moongrad.mpi"], package.preload["moongrad.mpi"]
    local saved = loaded["moongrad.distributed"]
    loaded["moongrad.distributed"], loaded["moongrad.mpi"] = nil, nil
    package.preload["moongrad.mpi"] = function() error("module 'moongrad.mpi' not found") end
    local ok, dist = pcall(require, "moongrad.distributed")
    loaded["moongrad.distributed"], loaded["moongrad.mpi"], package.preload["moongrad.mpi"] = saved, saved_mpi, saved_preload
    assert.is_true(ok)
    assert.is_false(dist.available())
    assert.has_error(function() dist.init() end, "init: this moongrad was built without MPI; install Open MPI "
      .. "(make deps installs libopenmpi-dev and openmpi-bin) and rebuild")
  end)

  it("checks init's timeout option and MOONGRAD_DIST_TIMEOUT (before MPI starts)", function()
    local dist = mg.distributed
    assert.has_error(function() dist.init{timeout = -1} end,
      "init: option 'timeout' must be a number of seconds >= 0 (0: no timeout), got -1")
    assert.has_error(function() dist.init{timeot = 5} end, "init: unknown option 'timeot' (did you mean 'timeout'? known: timeout)")
    assert.is_false(dist.is_initialized())
    if not dist.available() then return end
    local out, code = helpers.run("MOONGRAD_DIST_TIMEOUT=soon " .. helpers.bin .. " -e 'mg.distributed.init()'")
    assert.is_true(code ~= 0, out)
    assert.matches("init: MOONGRAD_DIST_TIMEOUT must be a number of seconds from 0 %(no timeout%) to 1e9, got 'soon'", out)
  end)

  it("checks DistributedOptimizer's arguments", function()
    local D = mg.distributed.DistributedOptimizer
    assert.has_error(function() D(3) end, "DistributedOptimizer: the optimizer must be an optimizer (mg.optim.Adam{...}), got 3")
    assert.has_error(function() D(mg.optim.SGD(), {fusion_bytes = -1}) end,
      "DistributedOptimizer: option 'fusion_bytes' must be a whole number >= 0, got -1")
    assert.has_error(function() D(mg.optim.SGD(), {fusion_bytes = 1.5}) end,
      "DistributedOptimizer: option 'fusion_bytes' must be a whole number >= 0, got 1.5")
    assert.has_error(function() D(mg.optim.SGD(), {fusion_bytes = "8"}) end,
      "DistributedOptimizer: option 'fusion_bytes' must be a whole number >= 0, got '8'")
    assert.equal(4194304, math.tointeger(D(mg.optim.SGD(), {fusion_bytes = 4 * 2^20}).fusion_bytes))   -- 2^20 is a float
    assert.equal("integer", math.type(D(mg.optim.SGD(), {fusion_bytes = 4 * 2^20}).fusion_bytes))
    local opt = D(mg.optim.Adam{learning_rate = 0.01}, {fusion_bytes = 0})
    assert.equal(0.01, opt.learning_rate)                -- the inner optimizer's fields
    assert.equal(0, opt.iterations)
    assert.equal(opt, D(opt))                           -- wrapping twice is once
    local v = mg.Variable({1.0, 2.0}, {name = "w"})         -- a variable twice: refused before any collective
    assert.has_error(function() opt:apply_gradients({{mg.ones({2}), v}, {mg.ones({2}), v}}) end,
      "DistributedOptimizer: variables[2] is variables[1] again ('w'); give each variable once, with the sum of its gradients")
    assert.has_error(function() opt:apply_gradients({mg.ones({2}), mg.ones({2})}, {v, v}) end,
      "DistributedOptimizer: variables[2] is variables[1] again ('w'); give each variable once, with the sum of its gradients")
  end)

  it("matches a serial reference for every collective, dtype and shape (mpirun -np 2)", function()
    if not needs_mpirun() then return end
    local out, code = mpirun(2, "spec/dist/collectives.lua")
    assert.equal(0, code, out)
    assert.matches("ok %d+ checks on 2 ranks", out)
  end)

  it("gives every rank the same error when the ranks disagree on a call, and stays in step (mpirun -np 2)", function()
    if not needs_mpirun() then return end
    local out, code = mpirun(2, "spec/dist/disagree.lua", 120)
    assert.equal(0, code, out)
    local shape = "ranks disagree on the shape after the first axis: "
    same_on_every_rank(out, 2, {
      ["allgather dims"] = "allgather: " .. shape .. "rank 0 gives float32 (2,1), rank 1 gives float32 (2,2)",
      ["allgather ndim"] = "allgather: " .. shape .. "rank 0 gives float32 (2), rank 1 gives float32 (2,1)",
      ["allreduce op"] = "allreduce: ranks disagree on op: rank 0 gives 'sum', rank 1 gives 'max'",
      ["allreduce dtype"] = "allreduce: ranks disagree on the dtype: rank 0 gives float32 (3), rank 1 gives float64 (3)",
      ["allreduce op on a variable"] = "allreduce: ranks disagree on op: rank 0 gives 'sum', rank 1 gives 'min'",
      ["broadcast root"] = "broadcast: ranks disagree on root: rank 0 gives 0, rank 1 gives 1",
      ["broadcast root out of range on one rank"] = "broadcast: ranks disagree on root: rank 0 gives 0, rank 1 gives 5",
      ["broadcast root out of range on all"] = "broadcast: root must be a rank from 0 to 1, got 5",
      call = {"barrier: ranks disagree on the call: rank 0 calls barrier, rank 1 calls allreduce",
              "allreduce: ranks disagree on the call: rank 0 calls barrier, rank 1 calls allreduce"},
      ["optimizer nil gradient"] = "DistributedOptimizer: ranks disagree on gradient 2: rank 0 gives float32 (3), "
        .. "rank 1 gives nil (every rank must leave out the same ones)",
      ["optimizer other variables (first step)"] =
        "DistributedOptimizer: ranks disagree on the number of variables: rank 0 gives 2, rank 1 gives 1",
      ["optimizer other variables"] =
        "DistributedOptimizer: ranks disagree on the number of gradients: rank 0 gives 2, rank 1 gives 1",
      ["optimizer variables in another order"] =
        "DistributedOptimizer: ranks disagree on gradient 1: rank 0 gives float32 (2,3), rank 1 gives float32 (3)",
      ["optimizer op"] = "DistributedOptimizer: ranks disagree on the scale of the result: rank 0 gives 0.5, rank 1 gives 1",
      ["optimizer fusion_bytes"] = "DistributedOptimizer: ranks disagree on fusion_bytes: rank 0 gives 64, rank 1 gives 1048576",
      ["broadcast_variables order"] =
        "broadcast_variables: ranks disagree on variable 1: rank 0 gives float32 (2,3), rank 1 gives float32 (3)",
      ["in step"] = "2",
    })
  end)

  it("checks a lying rank's header before sizing anything by it (a C peer beside 2 moongrad ranks)", function()
    if not needs_mpirun() then return end
    if os.execute("command -v mpicc >/dev/null 2>&1") ~= true then pending("mpicc not found (libopenmpi-dev)") return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local out, code = helpers.run(("mpicc -std=c11 -Wall -Iinclude -Isrc spec/dist/bad_peer.c -o %s/bad_peer"):format(dir))
    assert.equal(0, code, out)
    out, code = mpirun(2, "spec/dist/bad_header.lua : -np 1 " .. dir .. "/bad_peer", 120)
    os.execute("rm -rf " .. dir)
    assert.equal(0, code, out)
    local bad = "allgather: rank 2 sent an invalid call header: "
    same_on_every_rank(out, 2, {
      ["negative first axis"] = bad .. "dimension 1 is -5",
      ["more than 2^63 bytes"] = bad .. "float32 (1099511627776,1099511627776) is more than 2^63 bytes",
      ["99 dimensions"] = bad .. "99 dimensions (at most 8)",
      bytes = bad .. "it gives 1099511627776 bytes for float32 (2,3), which has 24",
      ["not a header"] = bad .. "it is not a moongrad call header (another program, or another version of moongrad?)",
      ["its own failure"] = "allgather: rank 2 could not prepare its side of the call (its own error says why)",
      ["another second axis"] = "allgather: ranks disagree on the shape after the first axis: rank 0 gives float32 (2,3), "
        .. "rank 2 gives float32 (2,4)",
      ["2^40 rows"] = "allgather: out of memory allocating 12.00 TiB for tensor (1099511627780,3) float32 "
        .. "(every rank's rows together)",
    })
    assert.matches("rank 0 in step with the peer", out)
    assert.matches("rank 1 in step with the peer", out)
  end)

  it("times out, naming the rank, when a rank hangs without dying, and stops the job", function()
    if not needs_mpirun() then return end
    local out, code = mpirun(2, "spec/dist/hang.lua", 60, "-x MOONGRAD_DIST_TIMEOUT=30")
    assert.is_true(code ~= 0 and code ~= 124, out)           -- 124: timeout's, a hang
    assert.is_nil(out:find("was not stopped"), out)
    assert.matches("rank 0: allreduce: timed out after 1.5 s waiting for the other ranks: "
      .. "rank 1 did not arrive %(it hangs, or makes fewer collective calls than rank 0%); the timeout is "
      .. "mg.distributed.init{timeout = seconds} or MOONGRAD_DIST_TIMEOUT %(0: no timeout%)", out)
    assert.matches("rank 0 then: barrier: a collective timed out on this rank before; "
      .. "MPI cannot be used again in this process", out)
    assert.matches("moongrad: rank 0 of 2 had a collective time out; stopping every rank", out)
  end)

  it("trains as one process: 1 x batch 64 and 2 x batch 32 give the same curve and weights", function()
    if not needs_mpirun() then return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    local runs = {{1, 64, "one", 65536}, {2, 32, "two", 65536}, {2, 32, "unfused", 0}}
    local calls = {}
    for _, r in ipairs(runs) do
      local out, code = mpirun(r[1], ("spec/dist/fit_equal.lua %d %s/%s %d"):format(r[2], dir, r[3], r[4]))
      assert.equal(0, code, out)
      calls[r[3]] = tonumber(out:match("steps 15 calls (%d+)"))
      assert.is_number(calls[r[3]], out)
    end
    local function curve (name)
      local list = {}
      for line in io.lines(dir .. "/" .. name .. ".txt") do
        local loss, acc = line:match("^(%S+) (%S+)$")
        list[#list + 1] = {tonumber(loss), tonumber(acc)}
      end
      return list
    end
    local one, two, unfused = curve("one"), curve("two"), curve("unfused")
    assert.equal(15, #one)                             -- 3 epochs of 5 global batches
    helpers.assert_close(two, one, 1e-5)               -- float32 sums in another order
    helpers.assert_close(unfused, one, 1e-5)
    local w1, w2 = mg.load(dir .. "/one.safetensors"), mg.load(dir .. "/two.safetensors")
    for name, t in pairs(w1) do helpers.assert_close(w2[name], t, 1e-4) end
    -- per step (on one machine minimize sends after the backward): the
    -- gradients' agreement and one bucket, the logs' agreement and sum;
    -- without fusion one call per gradient (4 variables)
    assert.equal(calls.two + 15 * 3, calls.unfused)
    -- at the start: the 4 variables (one agreement on the list, 4 broadcasts),
    -- the seed, Adam's iterations and 2 x 4 slots (an agreement and a broadcast each)
    assert.equal(15 * 4 + (1 + 4) + 2 * (1 + 1 + 8), calls.two)
    os.execute("rm -rf " .. dir)
  end)

  it("ShardedOptimizer (ZeRO 1 and 2): the replicated step's weights, losses and state, slots 1/N (mpirun -np 2, 3)", function()
    if not needs_mpirun() then return end
    for _, n in ipairs({2, 3}) do
      local out, code = mpirun(n, "spec/dist/sharded.lua /tmp", 120)
      assert.equal(0, code, out)
      assert.matches(("ok %%d+ checks on %d ranks"):format(n), out)
      assert.matches("stage 2: slots of %d+ bytes on rank 0, 1104 replicated; bit for bit: " .. tostring(n == 2), out)
    end
  end)

  it("minimize sends the gradients while the backward runs: the step after it, bit for bit (mpirun -np 2, 3)", function()
    if not needs_mpirun() then return end
    for _, n in ipairs({2, 3}) do
      local out, code = mpirun(n, "spec/dist/overlap.lua", 120)
      assert.equal(0, code, out)
      assert.matches(("ok %%d+ checks on %d ranks"):format(n), out)
      if n == 2 then assert.matches("stage 2 peak: %d+ bytes overlapped, %d+ after the backward", out) end
    end
  end)

  it("a sharded checkpoint saved on 2 ranks resumes on 3, as the replicated run goes on", function()
    if not needs_mpirun() then return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    for _, r in ipairs({{2, "save"}, {3, "resume"}, {3, "reference"}}) do
      local out, code = mpirun(r[1], ("spec/dist/sharded.lua %s %s"):format(dir, r[2]), 120)
      assert.equal(0, code, out)
    end
    local a, b = mg.load(dir .. "/resumed.safetensors"), mg.load(dir .. "/reference.safetensors")
    local n = 0
    for name, t in pairs(b) do
      helpers.assert_close(a[name], t, 1e-6)                 -- sums over 2 and 3 ranks round apart
      n = n + 1
    end
    assert.equal(8, n)
    os.execute("rm -rf " .. dir)
  end)

  it("fit{distributed = true, shard = 1 | 2} gives the replicated fit's curve and weights (mpirun -np 2)", function()
    if not needs_mpirun() then return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    for _, shard in ipairs({0, 1, 2}) do
      local out, code = mpirun(2, ("spec/dist/fit_equal.lua 32 %s/s%d 65536 %d"):format(dir, shard, shard))
      assert.equal(0, code, out)
    end
    local out, code = mpirun(2, ("spec/dist/fit_equal.lua 32 %s/u2 65536 2 unbuilt"):format(dir))   -- built by fit
    assert.equal(0, code, out)
    local function read (name) local f = assert(io.open(dir .. "/" .. name)); local s = f:read("a"); f:close(); return s end
    for _, shard in ipairs({1, 2}) do
      assert.equal(read("s0.txt"), read(("s%d.txt"):format(shard)))     -- the same losses, to 9 digits
      -- the weights, and the checkpoints (a sharded one gathered on every rank, written by rank 0)
      for _, file in ipairs({"%s.safetensors", "%s.ck.safetensors"}) do
        local w0, w = mg.load(dir .. "/" .. file:format("s0")), mg.load(dir .. "/" .. file:format("s" .. shard))
        local n = 0
        for name, t in pairs(w0) do
          n = n + 1
          assert.equal(0, mg.sum(mg.cast(mg.not_equal(w[name], t), "int64")):item(), name)
        end
        assert.is_true(n >= 4, file)
      end
    end
    os.execute("rm -rf " .. dir)
  end)

  it("checks ShardedOptimizer's arguments and fit's shard", function()
    local S = mg.distributed.ShardedOptimizer
    assert.has_error(function() S(mg.optim.Adam()) end,
      "ShardedOptimizer: mg.distributed is not initialized; call mg.distributed.init() first (and start the program with mpirun)")
    local m = mg.nn.Sequential{mg.nn.Dense(2)}
    m:compile{optimizer = "adam", loss = "mse"}
    assert.has_error(function() m:fit(mg.zeros({4, 3}), mg.zeros({4, 2}), {shard = 1, verbose = 0}) end,
      "fit: shard = 1 needs distributed = true")
    assert.has_error(function() m:fit(mg.zeros({4, 3}), mg.zeros({4, 2}), {shard = 3, verbose = 0}) end,
      "fit: option 'shard' must be 0, 1 or 2 (ZeRO's stage), got 3")
  end)

  it("stops every rank at once, naming the rank, when one raises an error or is killed", function()
    if not needs_mpirun() then return end
    for _, mode in ipairs({"error", "kill"}) do
      local t0 = mg.clock()
      local out, code = mpirun(2, "spec/dist/faults.lua " .. mode, 60)
      local seconds = mg.clock() - t0
      assert.is_true(code ~= 0 and code ~= 124, out)        -- 124: timeout's, a hang
      assert.is_nil(out:find("did not happen"), out)
      if mode == "error" then
        assert.matches("faults.lua:%d+: a failure on purpose", out)
        assert.matches("moongrad: rank 1 of 2 failed %(the error above%); stopping every rank", out)
      else
        assert.matches("process rank 1 with PID %d+ on node %S+ exited on signal 9", out)
      end
      assert.is_true(seconds < 60, "took " .. seconds .. " s")
    end
  end)

  it("resumes from rank 0's checkpoint with the same curve", function()
    if not needs_mpirun() then return end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    for _, mode in ipairs({"full", "first", "resume", "resume0"}) do
      local out, code = mpirun(2, ("spec/dist/resume.lua %s %s"):format(mode, dir))
      assert.equal(0, code, out)
    end
    local function curve (name)
      local list = {}
      for line in io.lines(dir .. "/" .. name .. ".txt") do list[#list + 1] = tonumber(line) end
      return list
    end
    local full = curve("full")
    assert.equal(15, #full)
    assert.same(table.move(full, 6, 15, 1, {}), curve("resumed"))   -- epochs 2 and 3, bit for bit
    assert.same(table.move(full, 6, 15, 1, {}), curve("resumed0"))  -- rank 0 alone read the file
    os.execute("rm -rf " .. dir)
  end)

  it("runs bench/distributed.lua's workers and bench/scaling.lua (smoke)", function()
    if not needs_mpirun() then return end
    local out, code = mpirun(2, "bench/distributed.lua step cnn 4 1 1")
    assert.equal(0, code, out)
    assert.matches("%S+ %S+ 421642 1686568", out)          -- step, allreduce, parameters, bytes
    out, code = helpers.run(helpers.bin .. " bench/scaling.lua bench/SCALING.md 7.6")
    assert.equal(0, code, out)
    assert.matches("Fitted on 2 ranks of shared memory: alpha = [%d.]+ us", out)
    assert.matches("| GPT %(567 ms, 12.84 MB%) | 100 Gbit/s InfiniBand/RoCE |", out)
  end)

  it("stops every rank under stock lua5.4 too when one fails (moongrad.so aborts at a failed exit)", function()
    if not needs_mpirun() then return end
    local so = (os.getenv("MOONGRAD_SO_DIR") or "build") .. "/moongrad.so"
    if not io.open(so) then pending("no " .. so .. " to load from lua5.4") return end
    local prog = os.tmpname()
    local f = assert(io.open(prog, "w"))
    f:write(("package.cpath = '%s;' .. package.cpath\n"):format(so:gsub("moongrad%.so$", "?.so")),
            "local mg = require 'moongrad'\n",
            "local rank = mg.distributed.init()\n",
            "if rank == 1 then error('rank 1 fails on purpose') end\n",
            "mg.distributed.allreduce(mg.ones(4))\n",
            "print('rank 0 was not stopped')\n")
    f:close()
    local out, code = helpers.run(('ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" timeout 60 mpirun --allow-run-as-root '
      .. "--oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo -np 2 lua5.4 %s"):format(prog))
    os.remove(prog)
    assert.is_true(code ~= 0 and code ~= 124, out)
    assert.matches("rank 1 fails on purpose", out)
    assert.matches("moongrad: rank 1 of 2 failed %(the error above%); stopping every rank", out)
    assert.is_nil(out:find("was not stopped"), out)
  end)

  it("runs examples/train_distributed.lua, the bar on rank 0 only", function()
    if not needs_mpirun() then return end
    local out, code = mpirun(2, "examples/train_distributed.lua 2")
    assert.equal(0, code, out)
    assert.matches("2 ranks, 1437 training images, batch 32 per rank", out)
    local _, bars = out:gsub("Epoch 2/2", "")
    assert.equal(1, bars, out)
    local acc = tonumber(out:match("test accuracy ([%d.]+)"))
    assert.is_true(acc > 0.8, out)
    local loss = tonumber(out:match("5 steps of a loop of our own: loss ([%d.]+) on rank 0"))   -- minimize, overlapped
    assert.is_true(loss ~= nil and loss < 1, out)
  end)
end)
