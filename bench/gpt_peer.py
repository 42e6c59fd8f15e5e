"""bench/gpt_peer.py: the PyTorch side of bench/gpt.lua, the same GPT.

    /usr/bin/python3 bench/gpt_peer.py MODE THREADS REPS   MODE: plain | recompute | recompute_but_last

prints "step\\t<median ms>", "held\\t<MiB>" (plain only) and
"rss\\t<MiB>". The model is nanoGPT's with its manual attention path (Debian's
PyTorch 1.13 has no F.scaled_dot_product_attention): pre-norm blocks,
separate query/key/value projections as moongrad's MultiHeadAttention has,
q @ k^T / sqrt(d) masked causally, softmax, @ v, exact GELU, learned
positions, a final LayerNorm and a linear head; AdamW. recompute wraps each
block in torch.utils.checkpoint (use_reentrant=False), recompute_but_last
every block but the last. "held" is what the
autograd graph saves in one forward (unique storages, counted through
saved_tensors_hooks); "rss" the peak RSS above the model and the optimizer's
state, as bench/gpt.lua measures. Keep in step with bench/gpt.lua.
"""
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

MODE = sys.argv[1] if len(sys.argv) > 1 else "plain"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 5
torch.set_num_threads(THREADS)
B, T, D, H, L, V = 32, 64, 256, 4, 4, 64


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.register_buffer("causal", torch.tril(torch.ones(T, T, dtype=torch.bool)))

    def heads(self, x):
        b, t, _ = x.shape
        return x.view(b, t, H, D // H).transpose(1, 2)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = self.heads(self.q(h)), self.heads(self.k(h)), self.heads(self.v(h))
        a = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D // H))
        a = a.masked_fill(~self.causal[:t, :t], float("-inf")).softmax(dim=-1)
        y = (a @ v).transpose(1, 2).contiguous().view(b, t, D)
        x = x + self.o(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for i, blk in enumerate(self.blocks):
            wrap = MODE == "recompute" or (MODE == "recompute_but_last" and i < L - 1)
            x = checkpoint(blk, x, use_reentrant=False) if wrap else blk(x)
        return self.head(self.ln(x))


def rss_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main():
    torch.manual_seed(0)
    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids, targets = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    # the optimizer's state before the baseline, as opt:build() in moongrad:
    # a step at learning rate 0 on zero gradients changes no weight
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.param_groups[0]["lr"] = 0.0
    opt.step()
    opt.param_groups[0]["lr"] = 1e-4
    opt.zero_grad(set_to_none=True)
    held = {}

    def pack(t):
        held[t.untyped_storage().data_ptr() if hasattr(t, "untyped_storage") else t.storage().data_ptr()] = \
            t.storage().nbytes()
        return t

    def step(count=False):
        opt.zero_grad(set_to_none=True)
        if count:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                logits = model(ids)
                loss = F.cross_entropy(logits.view(-1, V), targets.view(-1))
        else:
            loss = F.cross_entropy(model(ids).view(-1, V), targets.view(-1))
        loss.backward()
        opt.step()

    reset_hwm()
    rss0 = rss_mib("VmRSS")
    step(count=MODE == "plain")
    step()
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    print("step\t%.3f" % (statistics.median(ts) * 1e3))
    if MODE == "plain":
        print("held\t%.2f" % (sum(held.values()) / 2 ** 20))
    print("rss\t%.2f" % (rss_mib("VmHWM") - rss0))


if __name__ == "__main__":
    main()
