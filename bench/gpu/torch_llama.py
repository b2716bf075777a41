#!/usr/bin/env python3
"""PyTorch side of the GPU benchmark (bench/gpu/device.sh): trains the llama-style model of
data/models/<model>.json on one GPU, bf16, and prints one JSON line per mode with tokens/s,
MFU and peak memory, the figures meshplan's rows are compared with.

The model is the one exec/runtime trains (tests/reference/model_ref.py states it):
RMSNorm, RoPE (HF rotate_half), grouped-query causal attention, SwiGLU MLP, untied head,
mean cross-entropy; AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on >= 2-D weights)
with the global gradient norm clipped to 1.0. Precision as torchtitan trains on one GPU:
fp32 master parameters and optimizer state, bf16 compute (torch.autocast), fp32 loss.

Modes:
  eager    PyTorch eager; attention through F.scaled_dot_product_attention (flash backend)
  compile  the same model under torch.compile (default mode), SDPA flash attention

Timing: `--warmup` untimed steps, then `--steps` timed ones, each bracketed by CUDA events
after a synchronize; the figure is the median step. Tokens are random ids from a fixed
seed, the same for every mode (timing does not depend on the values, but zeros are never
used). MFU uses the model FLOPs per token that meshplan's simulator reports
(exec/model.c: 6 x parameters used in matmuls and norms + 12 L T nh hd for attention, as
PaLM and torchtitan count it) over the GPU's dense bf16 peak from data/gpus/<gpu>.json."""
import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


class Cfg:
    def __init__(self, d):
        self.vocab = d["vocab"]
        self.d = d["d_model"]
        self.L = d["n_layers"]
        self.nh = d["n_heads"]
        self.nkv = d["n_kv_heads"]
        self.hd = d.get("head_dim", self.d // self.nh)
        self.ff = d["d_ff"]
        self.eps = d.get("norm_eps", 1e-5)
        self.theta = d.get("rope_theta", 10000.0)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.attn_norm = nn.Parameter(torch.ones(c.d))
        self.q = nn.Linear(c.d, c.nh * c.hd, bias=False)
        self.k = nn.Linear(c.d, c.nkv * c.hd, bias=False)
        self.v = nn.Linear(c.d, c.nkv * c.hd, bias=False)
        self.o = nn.Linear(c.nh * c.hd, c.d, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(c.d))
        self.gate = nn.Linear(c.d, c.ff, bias=False)
        self.up = nn.Linear(c.d, c.ff, bias=False)
        self.down = nn.Linear(c.ff, c.d, bias=False)

    def forward(self, x, cos, sin):
        c = self.c
        B, T, _ = x.shape
        h = F.rms_norm(x, (c.d,), self.attn_norm, c.eps)
        q = self.q(h).view(B, T, c.nh, c.hd)
        k = self.k(h).view(B, T, c.nkv, c.hd)
        v = self.v(h).view(B, T, c.nkv, c.hd)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = c.nh // c.nkv
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rep > 1:  # torchtitan's repeat_kv: the flash backend then sees nh heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, c.nh * c.hd))
        h = F.rms_norm(x, (c.d,), self.ffn_norm, c.eps)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Llama(nn.Module):
    def __init__(self, c, T):
        super().__init__()
        self.c = c
        self.emb = nn.Embedding(c.vocab, c.d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.L))
        self.norm = nn.Parameter(torch.ones(c.d))
        self.head = nn.Linear(c.d, c.vocab, bias=False)
        inv = c.theta ** (-torch.arange(0, c.hd // 2, dtype=torch.float64) * 2 / c.hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin().float()[None, :, None, :], persistent=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tok, tgt):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        x = F.rms_norm(x, (self.c.d,), self.norm, self.c.eps)
        logits = self.head(x)
        return F.cross_entropy(logits.float().reshape(-1, self.c.vocab), tgt.reshape(-1))


def flops_per_token(c, T):
    # exec/model.c mp_model_flops_per_token: 6 x (block parameters + norms + head) plus
    # PaLM's 12 L T nh hd for attention (not halved for the causal mask, as torchtitan).
    n = c.L * (c.d * c.nh * c.hd * 2 + c.d * c.nkv * c.hd * 2 + 3 * c.d * c.ff) + c.d * c.vocab
    n += (2 * c.L + 1) * c.d
    return 6 * n + 12 * c.L * T * c.nh * c.hd


def run(mode, c, args, peak_tflops):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = Llama(c, args.seq).to(dev)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    g = torch.Generator(device="cpu").manual_seed(1)
    data = torch.randint(0, c.vocab, (args.warmup + args.steps, args.batch, args.seq + 1), generator=g).to(dev)

    def step(i):
        tok, tgt = data[i, :, :-1], data[i, :, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(args.warmup, args.warmup + args.steps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        loss = step(i)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
        losses.append(loss.item())
    t = statistics.median(times)
    tok = args.batch * args.seq
    tps = tok / t
    mfu = tps * flops_per_token(c, args.seq) / (peak_tflops * 1e12)
    n_params = sum(p.numel() for p in model.parameters())
    res = {"impl": "pytorch", "mode": mode, "model": args.model, "params": n_params, "batch": args.batch,
           "seq": args.seq, "step_s": t, "tokens_per_s": tps, "mfu": mfu,
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
           "reserved_gib": torch.cuda.max_memory_reserved() / 2**30, "loss_last": losses[-1],
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    del model, opt, fwd, data
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-1b-bench")
    ap.add_argument("--gpu", default="h100-sxm")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--out", default=None, help="append the JSON lines here too")
    args = ap.parse_args()
    with open(os.path.join(ROOT, "data", "models", args.model + ".json")) as f:
        c = Cfg(json.load(f))
    with open(os.path.join(ROOT, "data", "gpus", args.gpu + ".json")) as f:
        peak = json.load(f)["peak_tflops"]["bf16"]
    torch.backends.cuda.matmul.allow_tf32 = True
    for mode in args.modes.split(","):
        r = run(mode, c, args, peak)
        line = json.dumps(r)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
