"""bench/torch_peer.py: the PyTorch side of bench/cases.lua, case for case,
printing the same units. Run with Debian's /usr/bin/python3 (python3-torch).
Threads come from OMP_NUM_THREADS (torch.set_num_threads follows it)."""
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


def timed(reps, fn):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def rss_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024


def case_op(size, tape):
    n = 100000
    a = torch.ones(int(size), requires_grad=tape == "1")
    b = torch.ones(int(size))

    def run():
        for _ in range(n):
            a + b
    return timed(5, run) / n * 1e6


def case_seed():
    y = torch.tensor(1.0, requires_grad=True)
    n = 10000

    def run():
        for _ in range(n):
            r = torch.tensor(1.0)
            for _ in range(4):
                r = r * y
            torch.autograd.grad(r, [y])
    return timed(5, run) / n * 1e6


def case_mlp(batch):
    batch = int(batch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 784)
    labels = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
    return timed(20, step) * 1e3


def case_ckpt(mode, width, batch, layers):
    width, batch, layers = int(width), int(batch), int(layers)
    torch.manual_seed(0)
    ws = [(torch.randn(width, width) / width ** 0.5).requires_grad_() for _ in range(layers)]
    x = torch.randn(batch, width)

    def layer(i):
        return lambda h: torch.tanh(h @ ws[i])

    def step():
        h = x
        for i in range(layers):
            if mode == "every" and i > 0:
                h = checkpoint(layer(i), h, use_reentrant=False)
            else:
                h = layer(i)(h)
        loss = h.mean()
        gs = torch.autograd.grad(loss, ws)
        with torch.no_grad():
            for w, g in zip(ws, gs):
                w -= 0.01 * g
    rss0 = rss_mib("VmRSS")
    s = timed(3, step)
    return "%.3f %.1f" % (s * 1e3, rss_mib("VmHWM") - rss0)


def case_matmul(n):
    n = int(n)
    a, b = torch.randn(n, n), torch.randn(n, n)
    reps = 200 if n <= 256 else (20 if n <= 1024 else 5)

    def run():
        for _ in range(reps):
            a @ b
    return 2 * n ** 3 / (timed(5, run) / reps) / 1e9


if __name__ == "__main__":
    result = globals()["case_" + sys.argv[1]](*sys.argv[2:])
    print(result if isinstance(result, str) else "%.4f" % result)
