"""bench/ops_index_peer.py: the PyTorch side of bench/ops_index.lua, op for
op at the same sizes, printing "<case name>\t<median ms>" per line.
Run with Debian's /usr/bin/python3 (python3-torch); threads from
OMP_NUM_THREADS. torch.sort runs with stable=True, as moongrad's sort is
stable; torch.flip copies (moongrad's flip is a view: compare the
"then a copy" row)."""
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 9

N1, R, C, S = 1 << 20, 1024, 1024, 2048
B, H, Q, D = 8, 8, 256, 64


def timed(fn):
    fn()
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


torch.manual_seed(0)
x1 = torch.rand(N1)
xr = torch.rand(R, C)
xs = torch.rand(S, S)
idx = torch.randint(0, S, (S, S))
mask = torch.rand(S, S) > 0.5
q, k = torch.randn(B, H, Q, D), torch.randn(B, H, Q, D)
vals = torch.rand(S, S)

cases = [
    ("sort 1M float32", lambda: torch.sort(x1, stable=True)),
    ("argsort 1M float32", lambda: torch.argsort(x1, stable=True)),
    ("sort (1024,1024) rows", lambda: torch.sort(xr, stable=True)),
    ("topk k=100 of 1M", lambda: torch.topk(x1, 100)),
    ("topk k=16 of (1024,1024) rows", lambda: torch.topk(xr, 16)),
    ("einsum bhqd,bhkd->bhqk 8,8,256,64", lambda: torch.einsum("bhqd,bhkd->bhqk", q, k)),
    ("tile (2048,2048) by {1,2}", lambda: torch.tile(xs, (1, 2))),
    ("pad (2048,2048) by 1, constant", lambda: torch.nn.functional.pad(xs, (1, 1, 1, 1))),
    ("pad (2048,2048) by 1, reflect",
     lambda: torch.nn.functional.pad(xs[None, None], (1, 1, 1, 1), mode="reflect")),
    ("flip axis 2, then a copy", lambda: torch.flip(xs, (1,))),
    ("repeat_interleave (2048,2048) x2 axis 2", lambda: torch.repeat_interleave(xs, 2, dim=1)),
    ("take_along_axis (2048,2048) axis 2", lambda: torch.take_along_dim(xs, idx, 1)),
    ("put_along_axis add (2048,2048) axis 2", lambda: xs.scatter_add(1, idx, vals)),
    ("tril (2048,2048)", lambda: torch.tril(xs)),
    ("masked_fill (2048,2048)", lambda: xs.masked_fill(mask, 0.0)),
]

with torch.no_grad():
    for name, fn in cases:
        print(f"{name}\t{timed(fn) * 1e3:.3f}", flush=True)
