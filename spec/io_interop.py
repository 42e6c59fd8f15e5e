"""Reads and writes safetensors files with json, struct and torch alone (no
safetensors package), for spec/25-io_spec.lua's interoperability checks.

  io_interop.py predict WEIGHTS INPUT   prints the predictions of the model in
                                        WEIGHTS (Dense layers dense, dense_1, ...:
                                        x @ kernel + bias, tanh between) on the
                                        tensor 'x' of INPUT, one value a line
  io_interop.py write WEIGHTS DATA      writes such a model's weights (seeded)
                                        to WEIGHTS, and to DATA an input 'x', the
                                        model's predictions 'y' and one tensor of
                                        every dtype
"""
import json
import struct
import sys

import torch

DTYPES = {"F32": (torch.float32, "f", 4), "F64": (torch.float64, "d", 8), "I64": (torch.int64, "q", 8),
          "BOOL": (torch.bool, "?", 1), "F16": (torch.float16, "e", 2), "BF16": (torch.bfloat16, "h", 2)}


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, _, _ = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        shape = info["shape"]
        if end == begin:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
    return out, header.get("__metadata__", {})


def tensor_bytes(code, t):
    _, fmt, _ = DTYPES[code]
    flat = t.contiguous().reshape(-1)
    if code == "BF16":
        values = flat.view(torch.int16).tolist()
    else:
        values = flat.tolist()
    return struct.pack("<%d%s" % (len(values), fmt), *values)


def save(path, tensors, metadata=None):
    codes = {v[0]: k for k, v in DTYPES.items()}
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors, key=lambda k: -DTYPES[codes[tensors[k].dtype]][2]):
        t = tensors[name]
        code = codes[t.dtype]
        b = tensor_bytes(code, t)
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        chunks.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def predict(weights, x):
    i = 0
    while ("dense/kernel" if i == 0 else "dense_%d/kernel" % i) in weights:
        prefix = "dense" if i == 0 else "dense_%d" % i
        x = x @ weights[prefix + "/kernel"] + weights[prefix + "/bias"]
        i += 1
        if ("dense_%d/kernel" % i) in weights:
            x = torch.tanh(x)
    return x


def main():
    mode, a, b = sys.argv[1:4]
    if mode == "predict":
        weights, meta = load(a)
        data, _ = load(b)
        assert meta.get("format") == "moongrad.weights", meta
        for v in predict(weights, data["x"]).reshape(-1).tolist():
            print("%.9g" % v)
    elif mode == "write":
        torch.manual_seed(0)
        layers = [torch.nn.Linear(5, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)]
        weights = {}
        for i, layer in enumerate(layers):
            prefix = "dense" if i == 0 else "dense_%d" % i
            weights[prefix + "/kernel"] = layer.weight.detach().t().contiguous()
            weights[prefix + "/bias"] = layer.bias.detach().clone()
        x = torch.randn(4, 5)
        with torch.no_grad():
            y = predict(weights, x)
        save(a, weights, {"format": "moongrad.weights", "written_by": "torch " + torch.__version__})
        save(b, {"x": x, "y": y,
                 "every/f64": torch.tensor([[1.5, -2.25]], dtype=torch.float64),
                 "every/i64": torch.tensor([-(2 ** 62), 7, 0], dtype=torch.int64),
                 "every/bool": torch.tensor([True, False, True]),
                 "every/f16": torch.tensor([0.5, -65504.0], dtype=torch.float16),
                 "every/bf16": torch.tensor([3.140625, -1.0], dtype=torch.bfloat16),
                 "every/scalar": torch.tensor(2.5),
                 "every/empty": torch.zeros(0, 3)})
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
