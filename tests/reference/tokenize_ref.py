#!/usr/bin/python3
"""scripts/tokenize on real text, then `meshplan train` on its shards with a validation
loss that falls.

The text is the Debian packages' own documentation every Debian system has: the licence
texts in /usr/share/common-licenses (regular files; the GPL -> GPL-3 style links left out).
  1. scripts/tokenize trains a byte-level BPE of 512 tokens on it: train and val shards
     (uint16) and tokenizer.json; the shards decode back to the text exactly (each
     document behind its <|endoftext|>), and the split is 90/10 by tokens;
  2. scripts/tokenize --tokenizer tokenizer.json encodes the same text to the same tokens
     (the local-tokenizer path);
  3. a small llama (vocab 512) trains 120 steps on the train shards (shuffled) with
     --val-data and --eval-every 30: every eval is lower than the one before, and the last
     is at least 1 nat below ln 512 = 6.24, the loss of the uniform prediction the
     initialization starts near.
Exits 1 on a failure.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from model_ref import find_meshplan  # noqa: E402

MODEL = {"name": "text-512", "family": "llama", "vocab": 512, "d_model": 64, "n_layers": 2, "n_heads": 4,
         "n_kv_heads": 2, "head_dim": 16, "d_ff": 192, "max_seq": 64, "norm_eps": 1e-5, "rope_theta": 10000.0}


def shard_tokens(path):
    b = open(path, "rb").read()
    hdr = np.frombuffer(b, dtype="<i4", count=256)
    assert (hdr[0], hdr[1]) == (20240520, 1), path
    return np.frombuffer(b, dtype="<u2", count=int(hdr[2]), offset=1024).tolist()


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        print("FAILED: %s\n%s%s" % (" ".join(cmd), r.stdout, r.stderr))
        sys.exit(1)
    return r.stdout


def main():
    from tokenizers import Tokenizer
    files = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p) and not os.path.islink(p))
    if not files:
        print("tokenize_ref: /usr/share/common-licenses holds no file (base-files missing?)")
        return 1
    texts = [open(p, "rb").read().decode("utf-8", errors="replace") for p in files]
    meshplan = find_meshplan()
    tok_script = os.path.join(ROOT, "scripts", "tokenize")
    ok = True
    with tempfile.TemporaryDirectory() as d:
        out, out2 = os.path.join(d, "bpe"), os.path.join(d, "again")
        print(run([tok_script, "--input"] + files + ["--out", out, "--vocab-size", "512"]).strip())
        tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
        train, val = shard_tokens(os.path.join(out, "train_000000.bin")), shard_tokens(os.path.join(out, "val_000000.bin"))
        eot = tok.token_to_id("<|endoftext|>")
        stream = train + val
        docs, cur = [], None
        for t in stream:
            if t == eot:
                if cur is not None:
                    docs.append(cur)
                cur = []
            else:
                cur.append(t)
        docs.append(cur)
        decoded = [tok.decode(ids) for ids in docs]
        if decoded != texts:
            print("  the shards do not decode to the input text")
            ok = False
        if abs(len(val) - round(0.1 * len(stream))) > 1:
            print("  val holds %d of %d tokens, not 10%%" % (len(val), len(stream)))
            ok = False
        run([tok_script, "--input"] + files + ["--out", out2, "--tokenizer", os.path.join(out, "tokenizer.json")])
        again = shard_tokens(os.path.join(out2, "train_000000.bin")) + shard_tokens(os.path.join(out2, "val_000000.bin"))
        if again != stream:
            print("  --tokenizer tokenizer.json gives other tokens than the trained tokenizer")
            ok = False
        copied = os.path.join(out2, "tokenizer.json")
        if not os.path.exists(copied) or open(copied, "rb").read() != open(os.path.join(out, "tokenizer.json"), "rb").read():
            print("  --tokenizer: the tokenizer.json is not beside the shards, byte for byte (meshplan export looks there)")
            ok = False
        model = os.path.join(d, "text-512.json")
        json.dump(MODEL, open(model, "w"))
        metrics = os.path.join(d, "m.jsonl")
        run([meshplan, "train", "--model", model, "--data", os.path.join(out, "train_*.bin"), "--val-data",
             os.path.join(out, "val_*.bin"), "--eval-every", "30", "--eval-batches", "4", "--seq", "32",
             "--micro-batch", "8", "--global-batch", "8", "--steps", "120", "--lr", "3e-3", "--lr-schedule", "cosine",
             "--warmup", "5", "--min-lr", "3e-4", "--shuffle", "--metrics", metrics, "--quiet"],
            env=dict(os.environ, OMP_NUM_THREADS="1"))
        evals = [(o["step"], o["eval_loss"]) for o in map(json.loads, open(metrics)) if o["eval_loss"] is not None]
        print("  validation loss by step: %s" % ", ".join("%d: %.4f" % e for e in evals))
        losses = [e[1] for e in evals]
        if len(losses) != 4 or not all(b < a for a, b in zip(losses, losses[1:])) or losses[-1] > np.log(512) - 1:
            print("  the validation loss does not fall at every eval to 1 nat below ln 512")
            ok = False
    print("tokenize_ref: %s" % ("shards decode to the text, validation loss falls" if ok else "MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
