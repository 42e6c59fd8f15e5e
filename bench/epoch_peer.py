"""bench/epoch_peer.py: the PyTorch side of bench/epoch.lua: one epoch of
examples/train_fashion_mnist.lua's CNN (conv 32 same - pool - conv 64 same -
pool - dense 128 - dense 10, ReLU, Adam 1e-3, batch 128, shuffled) on
Fashion-MNIST, read from the same IDX files with Python's gzip, in the
layout PyTorch runs faster (channels_last, as moongrad's NHWC, or NCHW).

    /usr/bin/python3 bench/epoch_peer.py THREADS TRAIN_IMAGES TRAIN_LABELS [STEPS]

prints "<seconds for the epoch>\t<layout>" (STEPS: only that many batches).
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

THREADS, IMAGES, LABELS = int(sys.argv[1]), sys.argv[2], sys.argv[3]
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else None
AUTOCAST = os.environ.get("AUTOCAST") == "1"      # forward and loss under torch.autocast (bfloat16)
torch.set_num_threads(THREADS)


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


x = torch.from_numpy(idx(IMAGES, 16).astype(np.float32).reshape(-1, 1, 28, 28) / 255)
y = torch.from_numpy(idx(LABELS, 8).astype(np.int64))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.d1 = nn.Linear(7 * 7 * 64, 128)
        self.d2 = nn.Linear(128, 10)

    def forward(self, v):
        v = F.max_pool2d(F.relu(self.c1(v)), 2)
        v = F.max_pool2d(F.relu(self.c2(v)), 2)
        return self.d2(F.relu(self.d1(v.flatten(1))))


def epoch(layout):
    torch.manual_seed(0)
    model = CNN()
    xs = x
    if layout == "NHWC":
        model = model.to(memory_format=torch.channels_last)
        xs = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    order = torch.randperm(len(xs))
    n = len(xs) // 128 + (len(xs) % 128 > 0)
    if STEPS:
        n = min(n, STEPS)
    t0 = time.perf_counter()
    for i in range(n):
        idx_ = order[i * 128:(i + 1) * 128]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AUTOCAST):
            loss = F.cross_entropy(model(xs[idx_]), y[idx_])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0


best = min((epoch(layout), layout) for layout in ("NCHW", "NHWC"))
print(f"{best[0]:.3f}\t{best[1]}")
