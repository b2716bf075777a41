#!/usr/bin/env python3
"""The memory PyTorch allocates for one rank of a torchtitan-style Llama step, measured on
one GPU, to hold meshplan's torchtitan memory model against.

    tp_mem_probe.py [--out FILE.jsonl] [--only NAME]

One rank (rank 0) of a data-parallel x tensor-parallel mesh on a fake process group
(torch.testing._internal.distributed.fake_pg: every collective returns at once with its
output allocated), so the rank's tensors are those of the real run while the other ranks
do not exist. The model and its parallelization follow torchtitan 9dec370 (the commit of
its December 2024 benchmarks), torchtitan/models/llama/model.py and
torchtitan/parallelisms/parallelize_llama.py: RMSNorm in fp32 cast back, RoPE on complex
pairs, repeat_kv before SDPA (flash), SwiGLU; tensor parallelism with sequence
parallelism (tok_embeddings RowwiseParallel to Shard(1), norms SequenceParallel,
PrepareModuleInput to Replicate before attention and feed-forward, wq/wk/wv/w1/w3
ColwiseParallel, wo/w2 RowwiseParallel to Shard(1), output ColwiseParallel to Shard(-1)
under loss_parallel); full activation checkpointing of every block (checkpoint_wrapper);
FSDP2 over dp_shard with bf16 parameters and fp32 reduction, every block but the last
resharded after forward; the loss F.cross_entropy on the float logits; gradient clipping;
AdamW with foreach. Eager, bf16, no float8 (torchao is not on the machine).

Each case runs with n_layers L and 2L, three steps each; the peak of steps 2 and 3 (the
optimizer states exist from step 1 on) is torch.cuda.max_memory_allocated. The
difference between the two depths is a block's share, the rest the step's fixed part.
"""
import argparse
import contextlib
import gc
import json
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (model dims, dp_shard, tp, micro-batch, seq, layers)
CASES = {
    # torchtitan Table 4's plan (Llama 3.1 70B, FSDP 32 x TP 8, local batch 16, full AC)
    "70b_tp8": (dict(dim=8192, n_heads=64, n_kv_heads=8, ffn=28672, vocab=128256), 32, 8, 16, 8192, 4),
    # the same model without TP on FSDP 8 (the control: the plan the dev set's memory fits)
    "8b_fsdp8": (dict(dim=4096, n_heads=32, n_kv_heads=8, ffn=14336, vocab=128256), 8, 1, 2, 8192, 4),
    # Llama 3.1 8B on FSDP 8 x TP 8 (torchtitan's async-TP benchmark plan), full AC
    "8b_tp8": (dict(dim=4096, n_heads=32, n_kv_heads=8, ffn=14336, vocab=128256), 8, 8, 12, 8192, 4),
}
# --dry: the same plans on the CPU at toy sizes, to check the script runs (no figures)
DRY = dict(dim=512, n_heads=16, n_kv_heads=8, ffn=1024, vocab=1024)
DEV = "cuda"


class Mem:
    """torch.cuda's allocator statistics, zero on the CPU (--dry)."""

    @staticmethod
    def sync():
        if DEV == "cuda":
            torch.cuda.synchronize()

    @staticmethod
    def allocated():
        return torch.cuda.memory_allocated() if DEV == "cuda" else 0

    @staticmethod
    def peak():
        return torch.cuda.max_memory_allocated() if DEV == "cuda" else 0

    @staticmethod
    def reserved():
        return torch.cuda.max_memory_reserved() if DEV == "cuda" else 0

    @staticmethod
    def reset():
        gc.collect()  # the previous case's model and optimizer sit in reference cycles
        if DEV == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(xq, xk, freqs):
    q = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    k = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs.view(1, q.shape[1], 1, q.shape[-1])
    return (torch.view_as_real(q * f).flatten(3).type_as(xq), torch.view_as_real(k * f).flatten(3).type_as(xk))


class Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = d["n_heads"], d["n_kv_heads"], d["dim"] // d["n_heads"]
        self.wq = nn.Linear(d["dim"], self.n_heads * self.hd, bias=False)
        self.wk = nn.Linear(d["dim"], self.n_kv * self.hd, bias=False)
        self.wv = nn.Linear(d["dim"], self.n_kv * self.hd, bias=False)
        self.wo = nn.Linear(self.n_heads * self.hd, d["dim"], bias=False)

    def forward(self, x, freqs):
        bs, seq, _ = x.shape
        xq = self.wq(x).view(bs, seq, -1, self.hd)
        xk = self.wk(x).view(bs, seq, -1, self.hd)
        xv = self.wv(x).view(bs, seq, -1, self.hd)
        xq, xk = rope(xq, xk, freqs)
        rep = self.n_heads // self.n_kv
        keys = xk.unsqueeze(3).expand(bs, seq, xk.shape[2], rep, self.hd).reshape(bs, seq, -1, self.hd)
        values = xv.unsqueeze(3).expand(bs, seq, xv.shape[2], rep, self.hd).reshape(bs, seq, -1, self.hd)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                             is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.w1 = nn.Linear(d["dim"], d["ffn"], bias=False)
        self.w2 = nn.Linear(d["ffn"], d["dim"], bias=False)
        self.w3 = nn.Linear(d["dim"], d["ffn"], bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.attention = Attention(d)
        self.feed_forward = FeedForward(d)
        self.attention_norm = RMSNorm(d["dim"])
        self.ffn_norm = RMSNorm(d["dim"])

    def forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, d, n_layers):
        super().__init__()
        self.tok_embeddings = nn.Embedding(d["vocab"], d["dim"])
        self.layers = nn.ModuleDict({str(i): Block(d) for i in range(n_layers)})
        self.norm = RMSNorm(d["dim"])
        self.output = nn.Linear(d["dim"], d["vocab"], bias=False)
        self.freqs = None

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs)
        return self.output(self.norm(h))


def freqs_cis(hd, seq, theta=500000.0):
    f = 1.0 / (theta ** (torch.arange(0, hd, 2, device=DEV)[: hd // 2].float() / hd))
    t = torch.arange(seq, device=DEV, dtype=torch.float32)
    return torch.polar(torch.ones(seq, hd // 2, device=DEV), torch.outer(t, f))


def build(d, n_layers, dp, tp, seq):
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp * tp)
    mesh = init_device_mesh(DEV, (dp, tp), mesh_dim_names=("dp_shard", "tp"))
    with torch.device("meta"):
        model = Transformer(d, n_layers)
    if tp > 1:
        parallelize_module(model, mesh["tp"], {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        })
        for block in model.layers.values():
            parallelize_module(block, mesh["tp"], {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None),
                                                desired_input_layouts=(Replicate(), None)),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                "feed_forward.w3": ColwiseParallel(),
            })
    for k in list(model.layers.keys()):
        model.layers[k] = checkpoint_wrapper(model.layers[k], preserve_rng_state=False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    dp_mesh = mesh["dp_shard"]
    for i, block in enumerate(model.layers.values()):
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=i < n_layers - 1)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=True)
    model.to_empty(device=DEV)
    model.freqs = freqs_cis(d["dim"] // d["n_heads"], seq)
    return model


def run_case(name, d, dp, tp, mb, seq, n_layers):
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import loss_parallel
    Mem.reset()
    base0 = Mem.allocated()  # nothing of an earlier case: reset collected it
    model = build(d, n_layers, dp, tp, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    tokens = torch.randint(0, d["vocab"], (mb, seq), device=DEV)
    labels = torch.randint(0, d["vocab"], (mb, seq), device=DEV)
    peaks, times, after_fwd = [], [], []
    for step in range(3):
        Mem.sync()
        Mem.reset()
        t0 = time.time()
        marks = {}

        def mark(name):
            Mem.sync()
            marks[name] = Mem.allocated() - base0

        def at_logits_grad(grad):  # the loss's backward is done, the head's not begun
            Mem.sync()
            marks["loss_bwd_peak"] = Mem.peak() - base0
            marks["at_logits_grad"] = Mem.allocated() - base0
            return grad
        with loss_parallel() if tp > 1 else contextlib.nullcontext():
            pred = model(tokens)
            mark("after_model_fwd")
            marks["model_fwd_peak"] = Mem.peak() - base0
            pred.register_hook(at_logits_grad)
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
            mark("after_loss_fwd")
            after_fwd.append(Mem.allocated() - base0)
            del pred
            mark("after_del_pred")
            if DEV == "cuda":
                torch.cuda.reset_peak_memory_stats()
            loss.backward()
            mark("after_bwd")
            marks["bwd_peak"] = Mem.peak() - base0
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad()
        Mem.sync()
        times.append(time.time() - t0)
        peaks.append(Mem.peak() - base0)
    rec = dict(case=name, n_layers=n_layers, dp_shard=dp, tp=tp, micro_batch=mb, seq=seq,
               peak_bytes=max(peaks[1:]), peaks=peaks, after_forward_bytes=after_fwd[1:],
               resting_bytes=Mem.allocated() - base0, reserved_bytes=Mem.reserved(), step_s=times[1:],
               base_bytes=base0, marks=marks, **d)
    del model, opt
    dist.destroy_process_group()
    Mem.reset()
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--only", choices=sorted(CASES))
    ap.add_argument("--dry", action="store_true", help="toy sizes on the CPU: check that the script runs")
    a = ap.parse_args()
    global DEV
    if a.dry:
        DEV = "cpu"
    elif not torch.cuda.is_available():
        print("tp_mem_probe: no CUDA device; nothing measured")
        return 0
    print(torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch", torch.__version__, flush=True)
    out = open(a.out, "w") if a.out else None
    rc = 0
    for name, (d, dp, tp, mb, seq, L) in CASES.items():
        if a.only and name != a.only:
            continue
        if a.dry:
            d, mb, seq, L = DRY, 2, 128, 1
        for n_layers in (L, 2 * L):
            try:
                rec = run_case(name, d, dp, tp, mb, seq, n_layers)
                line = json.dumps(rec)
                print(line, flush=True)
                if out:
                    out.write(line + "\n")
                    out.flush()
            except Exception:
                print("%s L=%d failed:" % (name, n_layers), flush=True)
                traceback.print_exc()
                rc = 1
                import torch.distributed as dist
                if dist.is_initialized():
                    dist.destroy_process_group()
                Mem.reset()
    return rc


if __name__ == "__main__":
    sys.exit(main())
