"""bench/conv_peer.py: the PyTorch side of bench/conv.lua, case for case.

    /usr/bin/python3 bench/conv_peer.py THREADS REPS [quick]

prints "<case>\t<median ms>\t<layout>" per case: one training step of the
layer alone (forward, then the gradients of the inputs that need one, for a
given dy, through torch.autograd.grad so nothing accumulates), timed in both
of PyTorch's layouts, NCHW (contiguous) and NHWC (channels_last), and the
faster of the two reported (each at its best). Keep the cases in step with
bench/conv.lua. Debian's python3-torch; its CPU convolutions are oneDNN's
(mkldnn_convolution), as moongrad's are.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 9
QUICK = len(sys.argv) > 3 and sys.argv[3] == "quick"
torch.set_num_threads(THREADS)

N = 4 if QUICK else 128
# name, (H, W, Cin), Cout, kernel, padding, whether x needs a gradient
CONVS = [
    ("conv 28x28x1 -> 32, 3x3 same (first layer)", (28, 28, 1), 32, 3, 1, False),
    ("conv 28x28x1 -> 32, 3x3 valid (first layer)", (28, 28, 1), 32, 3, 0, False),
    ("conv 14x14x32 -> 64, 3x3 same", (14, 14, 32), 64, 3, 1, True),
    ("conv 13x13x32 -> 64, 3x3 valid", (13, 13, 32), 64, 3, 0, True),
]
POOLS = [
    ("max_pool 2x2 of 26x26x32", (26, 26, 32)),
]
CNN = "CNN step: conv32-pool-conv64-pool-dense128-dense10, SGD"


def timed(fn):
    fn()
    fn()
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def conv_case(hwc, cout, k, pad, needs_x, layout):
    h, w_, cin = hwc
    torch.manual_seed(0)
    x = torch.randn(N, cin, h, w_)
    w = torch.randn(cout, cin, k, k) * 0.1
    b = torch.zeros(cout)
    oh, ow = h + 2 * pad - k + 1, w_ + 2 * pad - k + 1
    dy = torch.randn(N, cout, oh, ow)
    if layout == "NHWC":
        x, w, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, w, dy))
    x.requires_grad_(needs_x)
    w.requires_grad_(True)
    b.requires_grad_(True)
    srcs = [x, w, b] if needs_x else [w, b]

    def step():
        y = F.conv2d(x, w, b, padding=pad)
        torch.autograd.grad(y, srcs, dy)
    return step


def pool_case(hwc, layout):
    h, w_, c = hwc
    torch.manual_seed(0)
    x = torch.randn(N, c, h, w_)
    dy = torch.randn(N, c, h // 2, w_ // 2)
    if layout == "NHWC":
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    x.requires_grad_(True)

    def step():
        y = F.max_pool2d(x, 2)
        torch.autograd.grad(y, [x], dy)
    return step


def cnn_case(layout):
    """the Fashion-MNIST CNN of PEER-FIGURES.md (valid 3x3 convolutions): one
    SGD step, forward, cross-entropy, backward, update"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(5 * 5 * 64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x = torch.randn(N, 1, 28, 28)
    labels = torch.randint(0, 10, (N,))
    if layout == "NHWC":
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    params = list(model.parameters())

    def step():
        loss = F.cross_entropy(model(x), labels)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(0.01 * g)
    return step


for name, hwc, cout, k, pad, needs_x in CONVS:
    best = min((timed(conv_case(hwc, cout, k, pad, needs_x, lay)), lay) for lay in ("NCHW", "NHWC"))
    print("%s\t%.4f\t%s" % (name, best[0] * 1e3, best[1]), flush=True)
for name, hwc in POOLS:
    best = min((timed(pool_case(hwc, lay)), lay) for lay in ("NCHW", "NHWC"))
    print("%s\t%.4f\t%s" % (name, best[0] * 1e3, best[1]), flush=True)
best = min((timed(cnn_case(lay)), lay) for lay in ("NCHW", "NHWC"))
print("%s\t%.4f\t%s" % (CNN, best[0] * 1e3, best[1]), flush=True)
