-- mg.distributed (issue 15): collectives, DistributedOptimizer, fit{distributed = true},
-- faults. The multi-process parts run the programs of spec/dist/ under
-- `mpirun -np 2` (as root Open MPI needs --allow-run-as-root; --oversubscribe
-- lets 2 ranks share fewer cores); without mpirun they are pending, with a message.
local mg = require "moongrad"
local helpers = require "helpers"

local has_mpirun = os.execute("command -v mpirun >/dev/null 2>&1") == true

-- mpirun -np n <moongrad> args, with a time limit: a hang fails the spec instead
-- of CI; LSan is told about Open MPI's own allocations (make asan)
local function mpirun (n, args, limit)
  local supp = "LSAN_OPTIONS=suppressions=spec/dist/lsan.supp:print_suppressions=0 "
  return helpers.run(("%stimeout %d mpirun --allow-run-as-root --oversubscribe -np %d %s %s"):format(supp, limit or 180,
                                                                                                  n, helpers.bin, args))
end

local function needs_mpirun ()
  if not has_mpirun then
    pending("mpirun not found: install openmpi-bin (make deps) to run the distributed specs")
    return false
  end
  return true
end

describe("mg.distributed", function()
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

  it("checks DistributedOptimizer's arguments", function()
    local D = mg.distributed.DistributedOptimizer
    assert.has_error(function() D(3) end, "DistributedOptimizer: the optimizer must be an optimizer (mg.optim.Adam{...}), got 3")
    assert.has_error(function() D(mg.optim.SGD(), {fusion_bytes = -1}) end,
      "DistributedOptimizer: option 'fusion_bytes' must be an integer >= 0, got -1")
    local opt = D(mg.optim.Adam{learning_rate = 0.01}, {fusion_bytes = 0})
    assert.equal(0.01, opt.learning_rate)                -- the inner optimizer's fields
    assert.equal(0, opt.iterations)
    assert.equal(opt, D(opt))                           -- wrapping twice is once
  end)

  it("matches a serial reference for every collective, dtype and shape (mpirun -np 2)", function()
    if not needs_mpirun() then return end
    local out, code = mpirun(2, "spec/dist/collectives.lua")
    assert.equal(0, code, out)
    assert.matches("ok %d+ checks on 2 ranks", out)
  end)
end)
