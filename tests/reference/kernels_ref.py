#!/usr/bin/python3
"""PyTorch reference for the CPU kernels (kernels/cpu).

Runs tests/kernels/kernel_dump (path in $MP_KERNEL_DUMP, else bazel-bin/...), reads its
"MPKD" file (format documented in kernel_dump.c), recomputes every output and gradient with
torch.autograd in float64 from the same fp32 inputs, and compares.

Tolerances: |got - want| <= atol + rtol * |want|, with rtol = 1e-5 everywhere (the design's
fp32 target). atol absorbs fp32 rounding of sums near zero and is set per op from the
length of the sums involved: ~1e-6 for short reductions (norms, softmax rows, elementwise),
1e-5 for attention (monolithic, and the span ops' chunks merged in turn) and cross-entropy rows, 5e-5 for the 263-long matmul dot products
(fp32 accumulation error ~ sqrt(K) * eps * sum|terms|). Exact ops (embedding lookup,
permutation indices, top-k indices) must match exactly.

Run with Debian's /usr/bin/python3 (torch 1.13); exits 1 on any mismatch.
Float8 casts are not covered here: torch 1.13 has no float8 dtypes; they are checked against
hand-computed values in tests/kernels/kernels_test.cc.
"""
import math
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def read_mpkd(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"MPKD":
        raise ValueError(f"{path}: bad magic {data[:4]!r}")
    version, count = struct.unpack_from("<II", data, 4)
    if version != 1:
        raise ValueError(f"{path}: unsupported version {version}")
    off, out = 12, {}
    for _ in range(count):
        (nlen,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + nlen].decode()
        off += nlen
        dtype, ndim = struct.unpack_from("<II", data, off)
        off += 8
        dims = struct.unpack_from(f"<{ndim}I", data, off)
        off += 4 * ndim
        n = int(np.prod(dims)) if ndim else 1
        arr = np.frombuffer(data, dtype="<f4" if dtype == 0 else "<i4", count=n, offset=off)
        off += 4 * n
        out[name] = arr.reshape(dims).copy()
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return out


class Checker:
    def __init__(self, d):
        self.d, self.passed, self.failed = d, 0, 0

    def t(self, name, grad=False):
        x = torch.tensor(self.d[name].astype(np.float64))
        return x.requires_grad_(grad)

    def s(self, name):
        return float(self.d[name].reshape(-1)[0])

    def close(self, name, want, rtol=1e-5, atol=1e-6):
        self.close_values(name, self.d[name], want, rtol, atol)

    def close_values(self, label, got, want, rtol=1e-5, atol=1e-6):
        got = np.asarray(got).astype(np.float64)
        want = want.detach().numpy() if torch.is_tensor(want) else np.asarray(want)
        err = np.abs(got - want) - (atol + rtol * np.abs(want))
        ok = got.shape == want.shape and bool(np.all(err <= 0))
        worst = float(np.max(np.abs(got - want), initial=0.0)) if got.shape == want.shape else float("nan")
        print(f"{'ok  ' if ok else 'FAIL'} {label:24s} max|diff| {worst:.3e}")
        self.passed += ok
        self.failed += not ok

    def truth(self, label, ok):
        ok = bool(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {label:24s}")
        self.passed += ok
        self.failed += not ok

    def exact(self, name, want):
        got = self.d[name]
        want = np.asarray(want)
        ok = got.shape == want.shape and bool(np.all(got == want))
        print(f"{'ok  ' if ok else 'FAIL'} {name:24s} exact")
        self.passed += ok
        self.failed += not ok


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def main():
    exe = os.environ.get("MP_KERNEL_DUMP",
                         os.path.join(ROOT, "bazel-bin", "tests", "kernels", "kernel_dump"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernels.mpkd")
        subprocess.run([exe, path, "1"], check=True, stdout=subprocess.DEVNULL)
        d = read_mpkd(path)
    c = Checker(d)

    # embedding: exact lookup; vocab-parallel shard [4, 9) zero outside, grads local.
    tok = torch.tensor(d["embedding.tokens"].astype(np.int64))
    wte = c.t("embedding.wte", True)
    out = torch.nn.functional.embedding(tok, wte)
    (out * c.t("embedding.dout")).sum().backward()
    c.close("embedding.out", out, 0, 0)
    c.close("embedding.dwte", wte.grad)
    mask = ((tok >= 4) & (tok < 9)).unsqueeze(1)
    c.close("embedding.shard_out", out * mask, 0, 0)
    c.close("embedding.shard_dwte", wte.grad[4:9])

    # layernorm
    x, w, b = c.t("layernorm.x", True), c.t("layernorm.w", True), c.t("layernorm.b", True)
    out = torch.nn.functional.layer_norm(x, (x.shape[1],), w, b, c.s("layernorm.eps"))
    (out * c.t("layernorm.dout")).sum().backward()
    c.close("layernorm.out", out)
    c.close("layernorm.dx", x.grad)
    c.close("layernorm.dw", w.grad)
    c.close("layernorm.db", b.grad)

    # rmsnorm (HF LlamaRMSNorm)
    x, w = c.t("rmsnorm.x", True), c.t("rmsnorm.w", True)
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.s("rmsnorm.eps")) * w
    (out * c.t("rmsnorm.dout")).sum().backward()
    c.close("rmsnorm.out", out)
    c.close("rmsnorm.dx", x.grad)
    c.close("rmsnorm.dw", w.grad)

    # rope, HF Llama: q*cos + rotate_half(q)*sin, cos = cat(freqs, freqs)
    x = c.t("rope.x", True)
    B, T, nh, hd = x.shape
    inv_freq = 1.0 / (c.s("rope.theta") ** (torch.arange(0, hd, 2) / hd))
    freqs = torch.outer(torch.arange(T), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]
    out = x * cos + rotate_half(x) * sin
    (out * c.t("rope.dout")).sum().backward()
    c.close("rope.out", out)
    c.close("rope.dx", x.grad)

    # attention, GQA: repeat kv heads (HF repeat_kv), causal softmax
    q, k, v = c.t("attention.q", True), c.t("attention.k", True), c.t("attention.v", True)
    B, T, nh, hd = q.shape
    rep = nh // k.shape[2]
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = qh @ kh.transpose(-1, -2) / math.sqrt(hd)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = (torch.softmax(s, dim=-1) @ vh).transpose(1, 2)
    (out * c.t("attention.dout")).sum().backward()
    c.close("attention.out", out, atol=1e-5)
    c.close("attention.lse", lse, atol=1e-5)
    c.close("attention.dq", q.grad, atol=1e-5)
    c.close("attention.dk", k.grad, atol=1e-5)
    c.close("attention.dv", v.grad, atol=1e-5)

    # span attention: the pairs run in the dump (q_row, Tq, q_pos, kv_row, Tk, kv_pos)
    # define which (query row, key row) are visible; the merged result must be attention
    # over exactly those keys. Rows that see no key: output 0, lse -inf, no gradient.
    q, k, v = c.t("span.q", True), c.t("span.k", True), c.t("span.v", True)
    B, Sq, nh, hd = q.shape
    Sk, rep = k.shape[1], nh // k.shape[2]
    vis = torch.zeros(Sq, Sk, dtype=torch.bool)
    for q_row, tq, q_pos, kv_row, tk, kv_pos in d["span.pairs"].tolist():
        i = torch.arange(tq).view(-1, 1)
        j = torch.arange(tk).view(1, -1)
        vis[q_row:q_row + tq, kv_row:kv_row + tk] |= kv_pos + j <= q_pos + i
    seen = vis.any(-1)
    qh = q.transpose(1, 2)
    kh = k.transpose(1, 2).repeat_interleave(rep, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(rep, dim=1)
    s = (qh @ kh.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~vis, float("-inf"))
    s = s.masked_fill(~seen.view(-1, 1), 0.0)  # rows with no key: finite, weighted by 0
    p = torch.softmax(s, dim=-1) * seen.view(-1, 1)
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen, float("-inf"))
    out = (p @ vh).transpose(1, 2)
    dout = c.t("span.dout")
    (out * dout).sum().backward()
    c.close("span.out", out, atol=1e-5)
    fin = seen.numpy()
    c.truth("span.lse -inf iff empty", np.all(np.isneginf(d["span.lse"]) == ~fin))
    c.close_values("span.lse", d["span.lse"][:, :, fin], lse.detach().numpy()[:, :, fin], atol=1e-5)
    c.close("span.D", (out * dout).sum(-1).transpose(1, 2), atol=1e-5)
    c.close("span.dq", q.grad, atol=1e-5)
    c.close("span.dk", k.grad, atol=1e-5)
    c.close("span.dv", v.grad, atol=1e-5)

    # gelu (tanh) and swiglu
    x = c.t("gelu.x", True)
    out = torch.nn.functional.gelu(x, approximate="tanh")
    (out * c.t("gelu.dout")).sum().backward()
    c.close("gelu.out", out)
    c.close("gelu.dx", x.grad)
    g, u = c.t("swiglu.gate", True), c.t("swiglu.up", True)
    out = torch.nn.functional.silu(g) * u
    (out * c.t("swiglu.dout")).sum().backward()
    c.close("swiglu.out", out)
    c.close("swiglu.dgate", g.grad)
    c.close("swiglu.dup", u.grad)

    # matmul = nn.functional.linear
    x, w, b = c.t("matmul.x", True), c.t("matmul.w", True), c.t("matmul.b", True)
    out = torch.nn.functional.linear(x, w, b)
    (out * c.t("matmul.dout")).sum().backward()
    c.close("matmul.out", out, atol=5e-5)
    c.close("matmul.dx", x.grad, atol=5e-5)
    c.close("matmul.dw", w.grad, atol=5e-5)
    c.close("matmul.db", b.grad, atol=5e-5)

    # router: softmax, top-k, renormalise; aux = E * sum f_e P_e (HF Mixtral);
    # L = <topk_w, dtopk_w> + alpha * aux
    logits = c.t("router.logits", True)
    N, E = logits.shape
    kk, norm, alpha = int(c.s("router.k")), c.s("router.norm"), c.s("router.alpha")
    probs = torch.softmax(logits, dim=-1)
    topv, topi = torch.topk(probs, kk, dim=-1)
    w = topv / topv.sum(-1, keepdim=True) if norm else topv
    f = torch.nn.functional.one_hot(topi, E).sum(1).sum(0).double() / N
    aux = E * (f * probs.mean(0)).sum()
    ((w * c.t("router.dtopk_w")).sum() + alpha * aux).backward()
    c.close("router.probs", probs)
    c.exact("router.topk_idx", topi.numpy().astype(np.int32))
    c.close("router.topk_w", w)
    c.close("router.aux", aux.reshape(1))
    c.close("router.dlogits", logits.grad)

    # permute / unpermute: rows grouped by expert (stable), combine weighted by topk_w
    idx = d["router.topk_idx"].reshape(-1)
    order = np.argsort(idx, kind="stable").astype(np.int32)
    c.exact("permute.perm", order)
    c.exact("permute.counts", np.bincount(idx, minlength=E).astype(np.int32))
    x = c.t("permute.x", True)
    xp = x[torch.tensor(order.astype(np.int64)) // kk]
    c.close("permute.xp", xp, 0, 0)
    y, wt = c.t("permute.y", True), c.t("router.topk_w", True)
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order), dtype=np.int32)
    ypairs = y[torch.tensor(inv.astype(np.int64))].reshape(N, kk, -1)
    out = (wt.unsqueeze(-1) * ypairs).sum(1)
    (out * c.t("permute.dout")).sum().backward()
    c.close("permute.out", out)
    c.close("permute.dy", y.grad)
    c.close("permute.dw", wt.grad)
    (xp * y.grad).sum().backward()
    c.close("permute.dx_from_dy", x.grad)

    # cross-entropy, mean over non-ignored rows (ignore_index=-100)
    logits = c.t("ce.logits", True)
    tgt = torch.tensor(d["ce.targets"].astype(np.int64))
    losses = torch.nn.functional.cross_entropy(logits, tgt, reduction="none")
    loss = torch.nn.functional.cross_entropy(logits, tgt)
    loss.backward()
    c.close("ce.losses", losses, atol=1e-5)
    c.close("ce.loss", loss.reshape(1), atol=1e-6)
    c.close("ce.dlogits", logits.grad, atol=1e-6)

    # AdamW: torch.optim.AdamW in float32 (the same arithmetic the kernel mirrors), three
    # steps; the clip scale multiplies the gradient before the step.
    p = torch.tensor(d["adamw.p0"], dtype=torch.float32, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=c.s("adamw.lr"), betas=(c.s("adamw.beta1"), c.s("adamw.beta2")),
                            eps=c.s("adamw.eps"), weight_decay=c.s("adamw.wd"))
    for s_ in (1, 2, 3):
        p.grad = torch.tensor(d[f"adamw.g{s_}"], dtype=torch.float32) * torch.tensor(
            d[f"adamw.scale{s_}"][0], dtype=torch.float32)
        opt.step()
    c.close("adamw.p3", p, rtol=1e-6, atol=1e-7)
    c.close("adamw.p3_sumsq", (p.double() ** 2).sum().reshape(1))

    print(f"kernels_ref: {c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
