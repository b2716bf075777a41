#!/usr/bin/python3
"""Seed inputs for the binary-input fuzz harnesses (scripts/fuzz seed_dirs calls it).

  make_seeds.py dataset OUT
  make_seeds.py safetensors OUT EXPORT_DIR...        (folders written by `meshplan export`)
  make_seeds.py ckpt_manifest OUT STEP_DIR...        (step folders written by `meshplan train`)

Each input is framed as its harness reads it (tests/fuzz/fuzz_*.c states the layout).
Deterministic: the same files on every run.
"""
import json
import os
import random
import struct
import sys


def put(out, name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)


# ---- token shards (fuzz_dataset.c) ---------------------------------------------------------

def shard(tokens, width):
    magic, version = (20240520, 1) if width == 2 else (20240801, 7)
    hdr = struct.pack("<256i", magic, version, len(tokens), *([0] * 253))
    return hdr + struct.pack("<%d%s" % (len(tokens), "H" if width == 2 else "I"), *tokens)


def dataset(out):
    rnd = random.Random(20240520)
    cases = [  # (seq byte, dp|shuffle byte, batch byte, files|vocab byte, position, [(n tokens, vocab, width)])
        (7, 0, 1, 0, 0, [(40, 256, 2)]),
        (3, 0x81, 2, 1 | (2 << 2), 5, [(30, 50257, 2), (17, 128256, 4)]),
        (15, 3, 0, 2 | (1 << 2), 1000, [(64, 200, 2), (100, 200, 4), (33, 200, 2)]),
        (0, 0x80, 3, 3, 7, [(2, 2, 2), (3, 2, 2), (5, 2, 4), (9, 2, 2)]),
        (63, 1, 1, 0, 123456, [(700, 65535, 2)]),
        (31, 2, 2, 1, 3, [(65, 151936, 4), (200, 151936, 4)]),
    ]
    for i, (s, dp, gb, fv, pos, files) in enumerate(cases):
        b = bytes([s, dp, gb, fv]) + struct.pack("<I", pos)
        for k, (n, v, w) in enumerate(files):
            data = shard([rnd.randrange(v) for _ in range(n)], w)
            b += (struct.pack("<I", len(data)) if k < len(files) - 1 else b"") + data
        put(out, "dataset%d" % i, b)


# ---- safetensors (fuzz_safetensors.c) ------------------------------------------------------

def handmade(header, data_bytes):
    """A safetensors file of this header text and data_bytes zero bytes of data."""
    h = header.encode()
    return struct.pack("<Q", len(h)) + h + bytes(data_bytes)


def safetensors(out, exports):
    import torch
    from safetensors.torch import save

    g = torch.Generator().manual_seed(7)
    put(out, "f32", save({"a": torch.randn(3, 4, generator=g), "b": torch.randn(5, generator=g)}))
    put(out, "bf16", save({"w": torch.randn(2, 3, 4, generator=g).to(torch.bfloat16),
                           "v": torch.tensor([1.0, -0.0, float("inf"), float("nan")]).to(torch.bfloat16)}))
    # F16 across its range: subnormals, the largest finite, infinities and NaN
    h = torch.tensor([0.0, -0.0, 6e-8, 6.1e-5, 1.0, -2.5, 65504.0, float("inf"), float("-inf"), float("nan")])
    put(out, "f16", save({"h": h.to(torch.float16), "m": torch.randn(4, 4, generator=g).to(torch.float16)},
                         metadata={"format": "pt"}))
    put(out, "mixed", save({"x": torch.randn(2, 2, generator=g), "y": torch.randn(3, generator=g).to(torch.float16),
                            "z": torch.randn(1, 2, generator=g).to(torch.bfloat16), "e": torch.zeros(0, 3),
                            "s": torch.tensor(2.0)}))
    put(out, "4d", save({"k": torch.randn(1, 2, 2, 2, generator=g)}))
    # a key given twice, refused by the JSON layer: a tensor's name, and a field of its entry
    # (cJSON would read the first dtype, Python's reader the last)
    entry = '{"dtype":"F32","shape":[2],"data_offsets":[%d,%d]}'
    put(out, "name_twice", handmade('{"a":%s,"a":%s}' % (entry % (0, 8), entry % (8, 16)), 16))
    put(out, "dtype_twice", handmade('{"a":{"dtype":"F32","shape":[4],"dtype":"BF16","data_offsets":[0,8]}}', 8))
    for i, d in enumerate(exports):
        st = open(os.path.join(d, "model.safetensors"), "rb").read()
        put(out, "export%d" % i, st)
        # the same tensors as a sharded Hugging Face folder: index text, NUL, a.safetensors
        # (b.safetensors is the harness's own file, holding "fixed.weight")
        n = struct.unpack("<Q", st[:8])[0]
        names = [k for k in json.loads(st[8:8 + n]) if k != "__metadata__"]
        wm = {k: "a.safetensors" for k in names}
        wm["fixed.weight"] = "b.safetensors"
        put(out, "export%d_folder" % i, json.dumps({"metadata": {}, "weight_map": wm}).encode() + b"\0" + st)


# ---- checkpoints (fuzz_ckpt_manifest.c) ----------------------------------------------------

P1, P2, P3, P4, P5 = (11400714785074694791, 14029467366897019727, 1609587929392839161,
                      9650029242287828579, 2870177450012600261)
M64 = (1 << 64) - 1


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M64


def xxh64(b, seed=0):
    """xxHash64 (github.com/Cyan4973/xxHash, doc/xxhash_spec.md), for a chunk size the
    writer does not use: the harness checks what the reader computes with libxxhash."""
    n, i = len(b), 0

    def rnd(acc, lane):
        return (rotl((acc + lane * P2) & M64, 31) * P1) & M64

    if n >= 32:
        v = [(seed + P1 + P2) & M64, (seed + P2) & M64, seed, (seed - P1) & M64]
        while i + 32 <= n:
            for k in range(4):
                v[k] = rnd(v[k], struct.unpack_from("<Q", b, i + 8 * k)[0])
            i += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & M64
        for k in range(4):
            h = ((h ^ rnd(0, v[k])) * P1 + P4) & M64
    else:
        h = (seed + P5) & M64
    h = (h + n) & M64
    while i + 8 <= n:
        h = (rotl(h ^ rnd(0, struct.unpack_from("<Q", b, i)[0]), 27) * P1 + P4) & M64
        i += 8
    if i + 4 <= n:
        h = (rotl(h ^ (struct.unpack_from("<I", b, i)[0] * P1) & M64, 23) * P2 + P3) & M64
        i += 4
    while i < n:
        h = (rotl(h ^ (b[i] * P5) & M64, 11) * P1) & M64
        i += 1
    h = ((h ^ (h >> 33)) * P2) & M64
    h = ((h ^ (h >> 29)) * P3) & M64
    return h ^ (h >> 32)


assert xxh64(b"") == 0xef46db3751d8e999 and xxh64(b"abc") == 0x44bc2cf5ad770999
assert xxh64(b"meshplan") == 0x26b55a202eec5061


def framed(manifest, files):
    b = json.dumps(manifest, indent=1).encode() + b"\0"
    for data in files:
        b += struct.pack("<I", len(data)) + data
    return b


def ckpt_manifest(out, steps):
    for i, d in enumerate(steps):
        man = json.load(open(os.path.join(d, "manifest.json")))
        names = [f["name"] for f in man["files"]]
        data = [open(os.path.join(d, n), "rb").read() for n in names]
        if sum(map(len, data)) > 60000:  # too big for an input: the harness links these files
            put(out, "ckpt%d_manifest_only" % i, json.dumps(man, indent=1).encode())
            continue
        for k, f in enumerate(man["files"]):
            f["name"] = "in_%d.bin" % k
        put(out, "ckpt%d" % i, framed(man, data))
        # "step" given twice (cJSON would read the first, Python the last): refused
        text = json.dumps(man, indent=1)
        at = text.index('"step": ')
        put(out, "ckpt%d_step_twice" % i, (text[:at] + '"step": 0,\n ' + text[at:]).encode() + b"\0" +
            b"".join(struct.pack("<I", len(d)) + d for d in data))
        # the same with 64-byte checksum chunks: a shard spans many chunks
        cb = 64
        man["chunk_bytes"] = cb
        for t in man["tensors"]:
            for s in t["shards"]:
                n = 4
                for x in s["len"]:
                    n *= x
                raw = data[s["file"]][s["byte_offset"]:s["byte_offset"] + n]
                s["xxh64"] = ["%016x" % xxh64(raw[o:o + cb]) for o in range(0, n, cb)]
        put(out, "ckpt%d_chunks64" % i, framed(man, data))


if __name__ == "__main__":
    kind, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    {"dataset": lambda: dataset(out), "safetensors": lambda: safetensors(out, sys.argv[3:]),
     "ckpt_manifest": lambda: ckpt_manifest(out, sys.argv[3:])}[kind]()
