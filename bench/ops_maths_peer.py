"""bench/ops_maths_peer.py: the PyTorch side of bench/ops_maths.lua, case
for case, on the same sizes; prints "torch <version>" and then one
"<case>\t<median ms>" line per case.
    /usr/bin/python3 bench/ops_maths_peer.py <threads> <reps>"""
import statistics
import sys
import time

import torch

N, SIDE = 4 * 1024 * 1024, 2048


def cases():
    torch.manual_seed(0)
    x = torch.empty(N).uniform_(-0.9, 0.9)
    m = torch.empty(SIDE, SIDE).uniform_(-1, 1)
    mp = torch.empty(SIDE, SIDE).uniform_(0.999, 1.001)
    out = [(op, x, getattr(torch, op)) for op in
           ["sin", "cos", "log1p", "expm1", "erf", "floor", "ceil", "round"]]
    out.append(("clamp", x, lambda v: torch.clamp(v, -0.5, 0.5)))
    for axis in (2, 1):                  # moongrad's 1-based axes
        tag = "(rows)" if axis == 2 else "(columns)"
        d = axis - 1

        def add(name, inp, fn):
            out.append(("%s axis %d %s" % (name, axis, tag), inp, fn))
        add("prod", mp, lambda v, d=d: torch.prod(v, d))
        add("logsumexp", m, lambda v, d=d: torch.logsumexp(v, d))
        add("var", m, lambda v, d=d: torch.var(v, d, unbiased=False))
        add("std", m, lambda v, d=d: torch.std(v, d, unbiased=False))
        add("norm", m, lambda v, d=d: torch.linalg.vector_norm(v, 2, d))
        add("cumsum", m, lambda v, d=d: torch.cumsum(v, d))
    return out


def timed(fn, x, reps):
    fn(x)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


if __name__ == "__main__":
    threads, reps = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    print("torch", torch.__version__)
    with torch.no_grad():
        for name, inp, fn in cases():
            print("%s\t%.4f" % (name, timed(fn, inp, reps) * 1e3))
