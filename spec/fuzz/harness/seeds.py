"""Writes the seed corpora of the libFuzzer harnesses (spec/fuzz/harness/corpus/NAME/):
small valid files of each format, and a few near the readers' edges. Checked in;
rerun after changing a harness's input format:

    /usr/bin/python3 spec/fuzz/harness/seeds.py

Standard library only. Each harness's first input byte is its mode (see its file).
"""
import gzip
import hashlib
import hmac
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(name, files):
    d = os.path.join(HERE, "corpus", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for fname, data in files.items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)


def gz(data):
    return gzip.compress(data, compresslevel=9, mtime=0)


# {============================ safetensors ============================

def safetensors(tensors, meta=None, pad=True):
    """tensors: [(name, dtype, shape, raw bytes)], laid out in order"""
    header, at, blob = {}, 0, b""
    if meta is not None:
        header["__metadata__"] = meta
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        blob += raw
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blob


def st_seeds():
    f32 = lambda *v: struct.pack("<%df" % len(v), *v)
    return {
        "empty": safetensors([]),
        "f32": safetensors([("w", "F32", [2, 3], f32(1, 2, 3, 4, 5, 6))]),
        "mixed": safetensors([
            ("a64", "F64", [2], struct.pack("<2d", 1.5, -2)),
            ("i", "I64", [3], struct.pack("<3q", -1, 0, 2**40)),
            ("s", "F32", [], f32(7)),
            ("z", "F32", [0, 3], b""),
            ("h", "F16", [2, 2], struct.pack("<4e", 1, -2, 0.5, 65504)),
            ("b16", "BF16", [1], b"\x80\x3f"),
            ("mask", "BOOL", [4], b"\x00\x01\x01\x00"),
        ], meta={"format": "pt", "step": "3"}),
        "names": safetensors([("é/ß.weight", "F32", [1], f32(1)), ("x" * 64, "I64", [1, 1], struct.pack("<q", 5))],
                             meta={}),
        "unpadded": safetensors([("w", "F32", [1], f32(2))], pad=False),
    }

# }=====================================================================


# {================================ IDX ================================

def idx(code, shape, fmt, values):
    return struct.pack(">BBBB", 0, 0, code, len(shape)) + b"".join(struct.pack(">I", d) for d in shape) + \
        struct.pack(">%d%s" % (len(values), fmt), *values)


def idx_seeds():
    # the mode byte: bit 0 gzip here, bits 1-3 the dtype (0 default, 1 float32,
    # 2 float64, 3 int64, 4 float16, 5 bfloat16, 6 bool and 7 refused)
    m = lambda gzip_here=0, dtype=0: bytes([gzip_here | dtype << 1])
    images = idx(0x08, [2, 3, 3], "B", list(range(18)))
    return {
        "u8-images": m() + images,
        "u8-labels": m() + idx(0x08, [10], "B", list(range(10))),
        "i8-float32": m(dtype=1) + idx(0x09, [4], "b", [-128, -1, 0, 127]),
        "i16": m() + idx(0x0B, [2, 2], "h", [-32768, -1, 1, 32767]),
        "i32-float64": m(dtype=2) + idx(0x0C, [3], "i", [-2**31, 0, 2**31 - 1]),
        "f32-bfloat16": m(dtype=5) + idx(0x0D, [2, 2], "f", [1.5, -0.0, 3e38, 1e-40]),
        "f64-float16": m(dtype=4) + idx(0x0E, [2], "d", [1e300, -2.5]),
        "u8-int64-4d": m(dtype=3) + idx(0x08, [1, 2, 1, 2], "B", [1, 2, 3, 4]),
        "empty-dim": m() + idx(0x08, [0, 28, 28], "B", []),
        "gzip-here": m(gzip_here=1) + images,
        "gzip-raw": m() + gz(images),
        # past the reader's 65536-element chunk: 70000 labels, 100-odd bytes gzipped
        "gzip-70000": m() + gz(idx(0x08, [70000], "B", [i % 10 for i in range(70000)])),
    }

# }=====================================================================


# {================================ CSV ================================

def csv_seeds():
    # the mode byte: bit 0 gzip here, bit 1 a header (else detected), bit 2 float64, bits 3-5
    # the delimiter (0 ',' 1 ';' 2 tab 3 ' ' 4 '|' 5 ':' 6 '0' 7 newline, refused), bit 6
    # padding (the next byte k: a blank line of 65536 - k bytes first), bit 7 a second byte
    # that picks the header, columns and a label (see fuzz_csv.c)
    m = lambda gzip_here=0, header=0, f64=0, delim=0: bytes([gzip_here | header << 1 | f64 << 2 | delim << 3])
    # the second byte: header 0 detected 1 asked 2 refused; label 0 none 1 number k + 1
    # 2 name NAMES[k] ("a" "b" "" "a,b") 3 column 1000000; int64 label; columns
    # {NAMES[(k + 1) & 3], 1}
    def pick(header=0, int64=0, label=0, k=0, columns=0, delim=0):
        return bytes([128 | delim << 3, header | int64 << 2 | label << 3 | k << 5 | columns << 7])
    big = b"1,2.5,-3e-3\n40,5,6\n" * 4500                                     # 90 KB, 300 bytes gzipped
    return {
        "plain": m() + b"1,2,3\n4,5,6\n",
        "header": m(header=1) + b"a,b\n1,2\n3,4\n",
        "semicolon-f64": m(f64=1, delim=1) + b"1.5;2\r\n-3;4e10\r\n",
        "tab": m(delim=2) + b"1\t2\n\n3\t4\n",
        "space": m(delim=3) + b" 1 2 \n 3 4 \n",
        "pipe": m(delim=4) + b"1|2\n",
        "colon": m(delim=5) + b"1:2",
        "quotes-specials": m() + b'"1", nan ,inf\n-inf,"-0.25",1e-3\n',
        "blank-lines": m(header=1) + b"\n\nx,y\n\n1,2\n\n",
        "one-column": m() + b"1\n2\n3\n",
        "empty": m(),
        "gzip-here": m(gzip_here=1) + b"1,2\n3,4\n",
        "gzip-raw": m() + gz(b"1,2\n3,4\n"),
        "gzip-90k": m() + gz(big),
        "pad-boundary": bytes([64]) + b"\x05" + b"12345,6\n7,8\n",
        "pad-crlf": bytes([64]) + b"\x01" + b"\r\n1,2\r\n",
        "detected-header": m() + b"x,y\n1,2\n",
        "bom-crlf": m(delim=1) + b"\xef\xbb\xbfa;b\r\n1;2\r\n",
        "header-only": m(header=1) + b"a,b,c\n",
        "label-name-int64": pick(int64=1, label=2, k=1) + b"a,b\n1,2\n3,9007199254740993\n",
        "label-number": pick(label=1, k=1) + b"1,2.5\n3,4\n",
        "columns-quoted": pick(header=1, k=2, columns=1) + b'"a,b",x\n1,"2"\n',
        "empty-name": pick(label=2, k=2) + b",a\n0,1\n1,2\n",
        "text-column": pick(label=1, k=0, int64=1, columns=1) + b"a,b,note\n1,2,\"free, text\"\n",
        "header-refused": pick(header=2) + b"x,y\n1,2\n",
        "label-beyond": pick(label=3) + b"1,2\n",
        "not-an-integer": pick(int64=1, label=1) + b"2.5,1\n",
        "duplicate-names": pick(label=2) + b"a,a\n1,2\n",
        "open-quote": m() + b'1,"2\n',
    }

# }=====================================================================


# {================================ wire ===============================

KEY = b"fuzz-key"              # fuzz_wire.c's


def frames(header, content, ids=(b"client-1",), parent=None, metadata=None, buffers=(), sign=False):
    parts = [json.dumps(p, separators=(",", ":")).encode() for p in (header, parent or {}, metadata or {}, content)]
    sig = hmac.new(KEY, b"".join(parts), hashlib.sha256).hexdigest().encode() if sign else b"0" * 64
    return b"\n".join(list(ids) + [b"<IDS|MSG>", sig] + parts + list(buffers))


def hdr(t, i=1):
    return {"msg_id": "id-%d" % i, "session": "s", "username": "u", "date": "2026-01-01T00:00:00.000000Z",
            "msg_type": t, "version": "5.3"}


def wire_seeds():
    # the mode byte: bit 0 sign here with the harness's key, bit 1 empty key (signing off)
    ex = {"code": "print(1)", "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
    return {
        "execute": b"\x01" + frames(hdr("execute_request"), ex),
        "kernel-info": b"\x01" + frames(hdr("kernel_info_request", 2), {}, ids=()),
        "history": b"\x01" + frames(hdr("history_request", 3), {"hist_access_type": "tail", "n": 2, "output": False}),
        "history-huge-n": b"\x01" + frames(hdr("history_request", 4), {"hist_access_type": "tail", "n": -1e300}),
        "complete": b"\x01" + frames(hdr("complete_request", 5), {"code": "mg.ma", "cursor_pos": 5}),
        "inspect-unicode": b"\x01" + frames(hdr("inspect_request", 6), {"code": "é = mg.x", "cursor_pos": 1.5}),
        "input-reply-parent": b"\x01" + frames(hdr("input_reply", 7), {"value": "moon"}, parent=hdr("input_request")),
        "buffers-ids": b"\x01" + frames(hdr("comm_msg", 8), {}, ids=(b"a", b"b\x00c"), buffers=(b"\xff\xfe", b"")),
        "signed-by-python": b"\x00" + frames(hdr("execute_request", 9), ex, sign=True),
        "no-key": b"\x02" + frames(hdr("shutdown_request", 10), {"restart": True}),
        "wrong-signature": b"\x00" + frames(hdr("execute_request", 11), ex),
        "no-delimiter": b"\x01" + b"a\nb\nc",
    }

# }=====================================================================


if __name__ == "__main__":
    put("safetensors", st_seeds())
    put("idx", idx_seeds())
    put("csv", csv_seeds())
    put("wire", wire_seeds())
    for name in ("safetensors", "idx", "csv", "wire"):
        d = os.path.join(HERE, "corpus", name)
        print("%s: %d seeds, %d bytes" % (d, len(os.listdir(d)), sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))))
