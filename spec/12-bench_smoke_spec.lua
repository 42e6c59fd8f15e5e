-- The benchmark scripts run (tiny sizes, no timing asserted: benchmarks are
-- not tests, but they should not rot).
local h = require "helpers"

describe("bench scripts", function()
  it("cases.lua runs every case and prints numbers", function()
    for _, args in ipairs({"op 1 0", "op 4 1", "seed", "mlp 2", "ckpt plain 32 8 3", "ckpt every 32 8 3", "matmul 32"}) do
      local out, code = h.run(h.bin .. " bench/cases.lua " .. args)
      assert.equal(0, code, args .. ": " .. out)
      assert.truthy(out:match("^[%d.]+"), args .. ": " .. out)
    end
  end)

  it("cases.lua times the seed chain on bench/lua_floor.c, Lua's own share of it", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute(("mkdir -p %s && cc -O2 -shared -fPIC -I/usr/include/lua5.4 bench/lua_floor.c -o %s/lua_floor.so")
                              :format(dir, dir)))
    local out, code = h.run(("%s bench/cases.lua seed_floor %s"):format(h.bin, dir))
    assert.equal(0, code, out)
    assert.truthy(out:match("^[%d.]+\n$"), out)
    os.execute("rm -rf " .. dir)
  end)

  it("recompute.lua reports every method as ratios to plain", function()
    local out, code = h.run(h.bin .. " bench/recompute.lua 16 8 4 1")
    assert.equal(0, code, out)
    for _, method in ipairs({"plain", "recompute every layer", "checkpoint_sequential%(2%)", "RevBlock"}) do
      assert.truthy(out:find(method), method)
    end
  end)

  it("timeliness.lua prints each case's peak against the ideal and the collector's cost", function()
    local out, code = h.run(h.bin .. " bench/timeliness.lua 32 8 2 1")
    assert.equal(0, code, out)
    for _, case in ipairs({"dense%+tanh, plain", "dense%+tanh, RevBlock", "MLP block, recompute every layer",
                           "CNN %(fashion_mnist%), recompute", "GPT %(char_gpt%), recompute"}) do
      assert.truthy(out:find(case .. "%s+[%d.]+%s+[%d.]+%s+[%d.]+x"), case .. ":\n" .. out)
    end
  end)

  it("estimate.lua prints the estimate beside the measured peaks (quick)", function()
    local out, code = h.run(h.bin .. " bench/estimate.lua quick")
    assert.equal(0, code, out)
    for _, way in ipairs{"plain", "recompute", "dots policy", "bfloat16 hooks"} do
      assert.truthy(out:find("| GPT 4 x 256, batch 32 x 64 | " .. way .. " | [%d.]+ | [%d.]+ | [%d.]+ | [%d.]+ | [%d.]+ | 1.000 |"),
                    way .. ":\n" .. out)               -- exact against the ideal pacing
    end
  end)

  it("autocast.lua prints the bfloat16 GEMM table and the steps (quick: no peer)", function()
    local out, code = h.run(h.bin .. " bench/autocast.lua quick")
    assert.equal(0, code, out)
    assert.truthy(out:find("| GPT 2048 tok 1024%->256 | 16x16x16 x%^T @ dout | [%d.]+ |"), out)
    for _, step in ipairs{"MLP", "CNN", "GPT"} do
      assert.truthy(out:find("| " .. step .. " | [%d.]+ | [%d.]+ |"), step .. ":\n" .. out)
    end
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute(("mkdir -p %s && cc -O2 bench/gemm_bf16_ceiling.c -ldnnl -fopenmp -o %s/ceiling")
                              :format(dir, dir)))
    out, code = h.run(dir .. "/ceiling 1 8 8 8 N T")
    if code == 3 then                                  -- an AVX2-only CPU: oneDNN 2.6 has no bfloat16 matmul
      assert.truthy(out:find("^n/a: oneDNN has no bfloat16 matmul primitive descriptor on this CPU"), out)
      assert.is_nil(require("moongrad").autocast_isa("bfloat16"))
    else
      assert.equal(0, code, out)
      assert.truthy(out:match("^[%d.]+ [%d.]+\n$"), out)
    end
    os.execute("rm -rf " .. dir)
  end)

  it("names the OpenBLAS core type that fits this CPU's ISA", function()
    local util = dofile("bench/util.lua")
    local _, isa = util.machine()
    assert.equal(isa == "AVX-512" and "SkylakeX" or "Haswell", util.openblas_core())
  end)

  it("gemm.lua and epoch.lua workers print a figure; assemble.lua joins the machine sections", function()
    local out, code = h.run(h.bin .. " bench/gemm.lua worker 1 8 8 8 N T")
    assert.equal(0, code, out)
    assert.truthy(out:match("^[%d.]+\n$"), out)
    out, code = h.run(h.bin .. " bench/epoch.lua worker 1 2")
    if code ~= 0 and out:find("dataset-fashion-mnist is not installed", 1, true) then
      pending("no dataset-fashion-mnist")
    else
      assert.equal(0, code, out)
      assert.truthy(out:match("^[%d.]+\n$"), out)
    end
    local dir = os.tmpname()
    os.remove(dir)
    assert.is_true(os.execute(("mkdir -p %s/bench/results && cp bench/assemble.lua bench/NOTES.md %s/bench/ && "
      .. "printf '## A, AVX2\\n\\n| x |\\n' > %s/bench/results/a-avx2.md && "
      .. "printf '## B, AVX-512\\n' > %s/bench/results/b-avx-512.md"):format(dir, dir, dir, dir)))
    out, code = h.run(("cd %s && lua5.4 bench/assemble.lua"):format(dir))
    assert.equal(0, code, out)
    local f = io.open(dir .. "/bench/RESULTS.md")
    local text = f:read("a")
    f:close()
    os.execute("rm -rf " .. dir)
    local a, b, notes = text:find("## A, AVX2", 1, true), text:find("## B, AVX-512", 1, true),
                        text:find("Reading the figures", 1, true)
    assert.is_true(a ~= nil and b ~= nil and notes ~= nil and a < b and b < notes, text)
  end)
end)
