"""bench/autocast_peer.py: the PyTorch side of bench/autocast.lua.

    /usr/bin/python3 bench/autocast_peer.py MODEL THREADS REPS [quick]   MODEL: mlp | cnn | gpt
    /usr/bin/python3 bench/autocast_peer.py gemm THREADS M N K TA TB

A step: zero the gradients, forward and loss (inside
torch.autocast("cpu", dtype=torch.bfloat16) for the autocast column, as
PyTorch's docs recommend: the backward outside it), backward, the
optimizer's update. Prints "float32\\t<median ms>" and "autocast\\t<median
ms>" (the median over REPS steps after two warm-up steps). gemm prints the
GFLOPS of torch.matmul on bfloat16 operands (transposed views where asked).
Keep the models in step with bench/autocast.lua.
"""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp(quick):
    d = 16 if quick else 1024
    model = nn.Sequential(nn.Linear(784, d), nn.ReLU(), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, 10))
    b = 4 if quick else 128
    return model, torch.randn(b, 784), torch.randint(0, 10, (b,)), lambda out, y: F.cross_entropy(out, y)


def cnn(quick):
    c1, c2 = (2, 4) if quick else (32, 64)
    model = nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(c2 * 49, 128), nn.ReLU(), nn.Linear(128, 10))
    b = 4 if quick else 128
    x = torch.randn(b, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    return model.to(memory_format=torch.channels_last), x, torch.randint(0, 10, (b,)), \
        lambda out, y: F.cross_entropy(out, y)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        a = self.ln1(x)
        q, k, v = (f(a).view(B, T, self.h, D // self.h).transpose(1, 2) for f in (self.q, self.k, self.v))
        s = (q @ k.transpose(-2, -1)) / (D // self.h) ** 0.5
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        y = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(y)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, v, t, d, h, layers):
        super().__init__()
        self.tok, self.pos = nn.Embedding(v, d), nn.Parameter(torch.zeros(t, d))
        self.blocks = nn.Sequential(*[Block(d, h) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, v)

    def forward(self, ids):
        return self.head(self.ln(self.blocks(self.tok(ids) + self.pos)))


def gpt(quick):
    B, T, D, H, L, V = (2, 8, 16, 2, 2, 11) if quick else (32, 64, 256, 4, 4, 64)
    model = GPT(V, T, D, H, L)
    return model, torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T)), \
        lambda out, y: F.cross_entropy(out.reshape(-1, V), y.reshape(-1))


def steps(name, reps, quick):
    torch.manual_seed(0)
    model, x, y, loss_fn = {"mlp": mlp, "cnn": cnn, "gpt": gpt}[name](quick)
    opt = (torch.optim.AdamW if name == "gpt" else torch.optim.Adam)(model.parameters(), lr=1e-4)

    def step(autocast):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for mode, autocast in (("float32", False), ("autocast", True)):
        step(autocast)
        step(autocast)
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            step(autocast)
            ts.append(time.perf_counter() - t0)
        print("%s\t%.3f" % (mode, statistics.median(ts) * 1e3))


def gemm(m, n, k, ta, tb):
    a = torch.randn(k, m) if ta == "T" else torch.randn(m, k)
    b = torch.randn(n, k) if tb == "T" else torch.randn(k, n)
    a, b = a.bfloat16(), b.bfloat16()
    a, b = (a.t() if ta == "T" else a), (b.t() if tb == "T" else b)
    for _ in range(2):
        torch.matmul(a, b)
    t0 = time.perf_counter()
    torch.matmul(a, b)
    one = time.perf_counter() - t0
    reps = max(1, int(0.02 / max(one, 1e-7)))
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b)
        ts.append((time.perf_counter() - t0) / reps)
    print("%.2f" % (2.0 * m * n * k / statistics.median(ts) / 1e9))


def main():
    torch.set_num_threads(int(sys.argv[2]))
    if sys.argv[1] == "gemm":
        gemm(int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])
    else:
        steps(sys.argv[1], int(sys.argv[3]), len(sys.argv) > 4 and sys.argv[4] == "quick")


if __name__ == "__main__":
    main()
