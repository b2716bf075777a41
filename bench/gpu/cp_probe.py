#!/usr/bin/env python3
"""What one rank of PyTorch's context-parallel ring attention computes and allocates,
measured on one GPU.

    cp_probe.py [--out FILE.jsonl] [--quick]

Two parts, each printing a table and writing JSON lines to --out:

1. sdpa: SDPA forward and forward+backward time at the attention shapes of the
   published torchtitan CP runs (Llama 3.1 8B: 32 heads; 405B at tp 8: 16 heads; head
   dim 128, kv heads repeated to the query heads as torchtitan's repeat_kv does before
   SDPA), per backend (flash, cuDNN, memory-efficient): a causal block as a rank's first
   ring step and the whole sequence see it, and the half-masked steps of the load-balanced
   ring (all local queries against half the keys, half the queries against all keys).
   TFLOP/s count the multiply-adds that run: 4 Sq Skv d h forward (half of it for a causal
   square block), 2.5 times that backward (five matmuls against two).

2. ring: torch's own ring attention (torch.distributed.tensor.experimental
   context_parallel, load balancing on, the rotate method torchtitan names) for cp 1, 2,
   4 and 8 on a fake process group (torch.testing._internal.distributed.fake_pg: every
   collective returns at once with its output allocated, nothing sent): the local tokens
   stay at 32768 as in torchtitan's CP tables, so the time is the rank's compute alone and
   the memory is what the ring allocates beyond q, k, v and the output.

The reply tells whether a rank's compute per ring step stays the same as cp grows (the
step shapes do not change) and how the ring's own buffers grow with cp.
"""
import argparse
import json
import sys
import time
import traceback

import torch
import torch.nn.functional as F

D = 128
LOCAL = 32768


def median_ms(fn, iters, warm):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    marks = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        marks.append((s, e))
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in marks)
    return t[len(t) // 2]


def emit(out, rec):
    print(json.dumps(rec), flush=True)
    if out:
        out.write(json.dumps(rec) + "\n")
        out.flush()


def part_sdpa(out, quick):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
    shapes = [(8192, 8192, True), (32768, 32768, True), (32768, 16384, False), (16384, 32768, False)]
    heads = [32, 16]
    if quick:
        shapes, heads = [(8192, 8192, True), (32768, 16384, False)], [32]
    print("%-9s %5s %6s %6s %6s %9s %9s %9s %9s" % ("backend", "heads", "Sq", "Skv", "causal", "fwd ms", "bwd ms",
                                                  "fwd TF/s", "bwd TF/s"), flush=True)
    for h in heads:
        for sq, skv, causal in shapes:
            q = torch.randn(1, h, sq, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(1, h, skv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(1, h, skv, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(1, h, sq, D, device="cuda", dtype=torch.bfloat16)
            flops = 4.0 * sq * skv * D * h * (0.5 if causal and sq == skv else 1.0)
            for name, be in backends:
                try:
                    with sdpa_kernel([be]):
                        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), 10, 3)

                        def both():
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            o.backward(g)
                        tot = median_ms(both, 10, 3)
                    bwd = tot - fwd
                    rec = dict(part="sdpa", backend=name, heads=h, sq=sq, skv=skv, causal=causal, fwd_ms=fwd,
                               bwd_ms=bwd, fwd_tflops=flops / fwd / 1e9, bwd_tflops=2.5 * flops / bwd / 1e9)
                    print("%-9s %5d %6d %6d %6s %9.2f %9.2f %9.1f %9.1f" % (name, h, sq, skv, causal, fwd, bwd,
                                                                          rec["fwd_tflops"], rec["bwd_tflops"]),
                          flush=True)
                    if out:
                        out.write(json.dumps(rec) + "\n")
                except Exception as e:  # a backend that refuses the shape or the GPU
                    print("%-9s %5d %6d %6d %6s refused: %s" % (name, h, sq, skv, causal,
                                                                str(e).splitlines()[0][:100]), flush=True)
                q.grad = k.grad = v.grad = None
            del q, k, v, g
            torch.cuda.empty_cache()


def cp_api():
    """context_parallel and set_rotate_method wherever this torch keeps them."""
    from torch.distributed.tensor.experimental import context_parallel
    rot = None
    for mod in ("torch.distributed.tensor.experimental._attention",
                "torch.distributed.tensor.experimental._context_parallel._attention"):
        try:
            rot = getattr(__import__(mod, fromlist=["set_rotate_method"]), "set_rotate_method")
            break
        except (ImportError, AttributeError):
            pass
    return context_parallel, rot


def part_ring(out, quick):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    context_parallel, set_rotate = cp_api()
    print("torch", torch.__version__, "context_parallel from", context_parallel.__module__, flush=True)
    cps = [1, 2, 4, 8] if not quick else [1, 2]
    rotates = ["allgather", "alltoall"] if set_rotate else [None]
    for h in ([32, 16] if not quick else [32]):
        for rotate in rotates:
            for cp in cps:
                try:
                    rec = ring_once(dist, init_device_mesh, FakeStore, context_parallel, set_rotate, h, rotate, cp,
                                    quick)
                    emit(out, rec)
                except Exception:
                    print("ring heads=%d rotate=%s cp=%d failed:" % (h, rotate, cp), flush=True)
                    traceback.print_exc()
                finally:
                    if dist.is_initialized():
                        dist.destroy_process_group()
                    torch.cuda.empty_cache()


def ring_once(dist, init_device_mesh, FakeStore, context_parallel, set_rotate, h, rotate, cp, quick):
    """One rank (rank 0) of a cp-rank ring over a causal sequence of LOCAL x cp tokens."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    S = LOCAL * cp
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cp)
    mesh = init_device_mesh("cuda", (cp,), mesh_dim_names=("cp",))
    if set_rotate:
        set_rotate(rotate)
    q = torch.randn(1, h, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, h, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, h, S, D, device="cuda", dtype=torch.bfloat16)
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v}):
        ql = q.detach().requires_grad_()
        kl = k.detach().requires_grad_()
        vl = v.detach().requires_grad_()
        local = ql.shape[2]
        g = torch.randn_like(ql)

        def fwd():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)

        def both():
            fwd().backward(g)
            ql.grad = kl.grad = vl.grad = None
        n = 5 if not quick else 2
        fwd_ms = median_ms(fwd, n, 2)
        both_ms = median_ms(both, n, 2)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        both()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
    # a causal sequence S over cp ranks: S^2 / 2 of the score matrix per head, 1/cp of it
    # on each rank
    flops = 4.0 * S * S * 0.5 * D * h / cp
    return dict(part="ring", heads=h, rotate=rotate, cp=cp, seq=S, local=local, fwd_ms=fwd_ms,
                bwd_ms=both_ms - fwd_ms, fwd_tflops=flops / fwd_ms / 1e9,
                bwd_tflops=2.5 * flops / (both_ms - fwd_ms) / 1e9, fwd_ms_per_step=fwd_ms / cp,
                extra_peak_gib=extra / 2**30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--quick", action="store_true", help="fewer shapes, for a dry run")
    ap.add_argument("--part", choices=["sdpa", "ring", "all"], default="all")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("cp_probe: no CUDA device; nothing measured")
        return 0
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    out = open(a.out, "w") if a.out else None
    t0 = time.time()
    rc = 0
    for name, fn in (("sdpa", part_sdpa), ("ring", part_ring)):
        if a.part not in (name, "all"):
            continue
        try:
            fn(out, a.quick)
        except Exception:
            traceback.print_exc()
            rc = 1
        print("== %s done at %.0f s" % (name, time.time() - t0), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
