-- bench/zero_model.lua: the alpha-beta model of bench/SCALING.md extended to
-- ZeRO's stages (mg.distributed.ShardedOptimizer) and to overlap, with the
-- per-rank memory of the bench's GPT and of a 350M-parameter transformer.
--   build/moongrad bench/zero_model.lua
-- Measured inputs (this repository's runs, bench/SCALING.md and bench/zero.lua):
--   gamma 0.132 ns/byte and delta 0.203 ns/byte (the fit of bench/scaling.lua);
--   a TransformerBlock's tape holds 64 bytes per (batch x tokens x width)
--   element, 4 with recompute_grad per block (mg.memory tape counters, any size);
--   the GPT step of 566.6 ms on one thread (4 x 256, batch 32 x 64: 72 GFLOPS).
-- Modelled: everything about the 350M model and every network.
local GAMMA, DELTA = 0.132e-9, 0.203e-9
local NETS = {{"10 Gbit/s", 10, 25e-6}, {"25 Gbit/s", 25, 15e-6}, {"100 Gbit/s RDMA", 100, 3e-6}}
local RANKS = {8, 64, 512}

-- ring reduce-scatter and allgather of n bytes on p ranks (the halves of a ring allreduce)
local function rs (n, p, alpha, beta) return (p - 1) * alpha + (p - 1) / p * n * (beta + GAMMA) end
local function ag (n, p, alpha, beta) return (p - 1) * alpha + (p - 1) / p * n * beta end

-- a step's communication (seconds) by stage, as built: stage 0 allreduces the
-- gradients (RS + AG) through the fusion copies; stage 1 the same, then
-- allgathers the updated weights; stage 2 reduce-scatters, then allgathers
local function comm (stage, n, p, alpha, beta)
  if stage == 0 then return rs(n, p, alpha, beta) + ag(n, p, alpha, beta) + n * DELTA end
  if stage == 1 then return rs(n, p, alpha, beta) + 2 * ag(n, p, alpha, beta) + n * DELTA end
  return rs(n, p, alpha, beta) + ag(n, p, alpha, beta)
end

-- the models: parameters, a rank's activations (plain, recompute per block)
-- and its step's compute at this machine's measured one-thread rate
local RATE = 72e9                                   -- FLOP/s: the measured GPT step
local function transformer (name, L, D, V, T, B)
  local params = 12 * L * D * D + V * D + T * D
  local btd = B * T * D
  local logits = 2 * B * T * V * 4                  -- log_softmax's input and output, float32
  local flops = 6 * params * B * T + 12 * L * B * T * T * D
  return {name = name, params = params, plain = L * 64 * btd + logits, recompute = L * 4 * btd + 64 * btd + logits,
          compute = flops / RATE, tokens = B * T}
end
local MODELS = {transformer("GPT 4 x 256 (bench), batch 32 x 64", 4, 256, 64, 64, 32),
                transformer("GPT-2 medium shape, 24 x 1024, batch 8 x 1024", 24, 1024, 50257, 1024, 8)}

local function gib (b) return b / 2^30 end

print("### Per-rank memory by stage (GiB; float32 weights, AdamW: 2 slots)")
print()
print("Weights W = 4 bytes x parameters, gradients W, slots 2W. Stage 0 (replicated): 4W. Stage 1 and")
print("stage 2 as built: W + W + 3W/N (the slots and the pieces' copy of the weights are 1/N; the")
print("gradients are whole until the step). Stage 2 with the gradients reduce-scattered in")
print("buckets while the backward runs (ZeRO's stage 2; not built): W + 4W/N.")
print()
print("| model (parameters) | stage | 8 ranks | 64 ranks | 512 ranks | + activations, plain | + activations, recompute per block |")
print("|---|---|---:|---:|---:|---:|---:|")
for _, m in ipairs(MODELS) do
  local W = 4 * m.params
  local rows = {{"0", function() return 4 * W end}, {"1, 2 (built)", function(p) return 2 * W + 3 * W / p end},
                {"2 (bucketed, modelled)", function(p) return W + 4 * W / p end}}
  for _, r in ipairs(rows) do
    local line = ("| %s (%.1fM) | %s |"):format(m.name, m.params / 1e6, r[1])
    for _, p in ipairs(RANKS) do line = line .. (" %.3f |"):format(gib(r[2](p))) end
    line = line .. (" %.3f | %.3f |"):format(gib(m.plain), gib(m.recompute))
    print(line)
  end
end
print()
print("### A step's communication by stage, and efficiency without and with overlap")
print()
print("Efficiency = compute / step. Without overlap (as built): step = compute + communication.")
print("With overlap (modelled, not built): the gradients' reduction (stage 0: the allreduce; 1: the")
print("allreduce; 2: the reduce-scatter) hides behind the backward (2/3 of compute) as far as it")
print("lasts; the weights' allgather (stages 1, 2) does not. Compute: this machine's one-thread")
print("rate (72 GFLOPS) for the bench GPT; for the 350M model a rank of 64 such cores.")
print()
print("| model | network | stage | 8 ranks: ms, no overlap, overlap | 64 ranks | 512 ranks |")
print("|---|---|---|---:|---:|---:|")
for mi, m in ipairs(MODELS) do
  local compute = mi == 1 and m.compute or m.compute / 64
  local n = 4 * m.params
  for _, net in ipairs(NETS) do
    local alpha, beta = net[3], 8 / (net[2] * 1e9)
    for _, stage in ipairs({0, 1, 2}) do
      local line = ("| %s (%.0f ms compute) | %s | %d |"):format(m.name, compute * 1e3, net[1], stage)
      for _, p in ipairs(RANKS) do
        local c = comm(stage, n, p, alpha, beta)
        local reduce = stage == 2 and rs(n, p, alpha, beta) or rs(n, p, alpha, beta) + ag(n, p, alpha, beta) + n * DELTA
        local hidden = math.min(reduce, compute * 2 / 3)
        line = line .. (" %.1f, %.0f%%, %.0f%% |"):format(c * 1e3, 100 * compute / (compute + c),
                                                         100 * compute / (compute + c - hidden))
      end
      print(line)
    end
  end
end
