#!/usr/bin/env python3
"""The GPU benchmark, in one run on one GPU: meshplan's runtime and PyTorch on
the same llama-style model (data/models/llama-1b-bench.json: d_model 2048, 16 layers, 16
heads, 8 KV heads, d_ff 8192, vocab 32000), seq 2048, micro-batch 4 (8192 tokens a step),
bf16, one GPU. Rows:

  meshplan bf16      meshplan train --device cuda
  meshplan float8    the same with --fp8 (float8 Linears, tensorwise scales)
  pytorch eager      bench/gpu/torch_llama.py, eager, SDPA flash attention
  pytorch compile    the same under torch.compile

Beside each meshplan row: the prediction for the same run (meshplan-cuda stack on the
GPU's profile, with the newest `meshplan calibrate --device cuda` in --db if there is one),
which train prints as "predicted vs measured", and its error. Figures: median step time
over the timed steps (meshplan: CUDA events per step, steps 2..K; PyTorch: CUDA events,
after warm-up), tokens/s, MFU (model FLOPs per token as exec/model.c counts them, over
the GPU profile's dense bf16 peak), peak memory (meshplan: its tracked allocator's peak,
i.e. every byte the runtime allocates; PyTorch: torch.cuda.max_memory_allocated).

  bench/gpu/bench.py --meshplan PATH [--db DB] [--out FILE.md] [--steps K] [--skip-torch]

Prints one table and writes it (with the GPU name and date) to --out."""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)


def flops_per_token(cfg, T):
    L, d, nh, nkv, hd, ff, V = (cfg["n_layers"], cfg["d_model"], cfg["n_heads"], cfg["n_kv_heads"],
                                cfg.get("head_dim", cfg["d_model"] // cfg["n_heads"]), cfg["d_ff"], cfg["vocab"])
    n = L * (d * nh * hd * 2 + d * nkv * hd * 2 + 3 * d * ff) + d * V + (2 * L + 1) * d
    return 6 * n + 12 * L * T * nh * hd


def run_meshplan(args, fp8, cfg, peak):
    cmd = [args.meshplan, "train", "--model", args.model, "--device", "cuda", "--seq", str(args.seq),
           "--micro-batch", str(args.batch), "--global-batch", str(args.batch), "--steps", str(args.steps),
           "--data", "synthetic", "--quiet"]
    if args.db:
        cmd += ["--db", args.db]
    if fp8:
        cmd += ["--fp8"]
    env = dict(os.environ)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = p.stdout + p.stderr
    print(out, flush=True)
    row = {"impl": "meshplan", "mode": "float8" if fp8 else "bf16", "ok": p.returncode == 0, "log": out[-2000:]}
    if p.returncode != 0:
        return row
    m = re.search(r"done: \d+ steps(?: \([0-9.]+\))?, final loss ([0-9.eE+-]+|nan), ([0-9.]+) tokens/s "
                  r".*peak memory (\d+) bytes", out)
    pv = re.search(r"predicted vs measured: step time ([0-9.]+) ms vs ([0-9.]+) ms \(median, ([+-]?[0-9.]+)%\), "
                   r"peak memory ([0-9.]+) MiB vs ([0-9.]+) MiB \(([+-]?[0-9.]+)%", out)
    if not m:
        row["ok"] = False
        return row
    row["loss_last"] = float(m.group(1))
    row["peak_gib"] = int(m.group(3)) / 2**30
    if pv:
        row["pred_step_s"] = float(pv.group(1)) / 1e3
        row["step_s"] = float(pv.group(2)) / 1e3
        row["pred_peak_gib"] = float(pv.group(4)) / 1024
    else:
        row["step_s"] = args.batch * args.seq / float(m.group(2))
    row["tokens_per_s"] = args.batch * args.seq / row["step_s"]
    row["mfu"] = row["tokens_per_s"] * flops_per_token(cfg, args.seq) / (peak * 1e12)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--meshplan", required=True)
    ap.add_argument("--model", default="llama-1b-bench")
    ap.add_argument("--gpu", default="h100-sxm", help="GPU profile for MFU (data/gpus)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--db", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--torch-json", default=None, help="reuse PyTorch rows from this JSON-lines file")
    args = ap.parse_args()
    cfg = json.load(open(os.path.join(ROOT, "data", "models", args.model + ".json")))
    peak = json.load(open(os.path.join(ROOT, "data", "gpus", args.gpu + ".json")))["peak_tflops"]["bf16"]

    rows = [run_meshplan(args, False, cfg, peak), run_meshplan(args, True, cfg, peak)]
    gpu_name = "?"
    if args.torch_json and os.path.exists(args.torch_json):
        for line in open(args.torch_json):
            r = json.loads(line)
            r["ok"] = True
            gpu_name = r.get("gpu", gpu_name)
            rows.append(r)
    elif not args.skip_torch:
        # PyTorch in a child without our LD_LIBRARY_PATH (it brings its own cuDNN/NCCL)
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        tj = "/tmp/mp_torch_rows.jsonl"
        if os.path.exists(tj):
            os.remove(tj)
        p = subprocess.run([sys.executable, os.path.join(HERE, "torch_llama.py"), "--model", args.model, "--gpu",
                            args.gpu, "--seq", str(args.seq), "--batch", str(args.batch), "--out", tj],
                           capture_output=True, text=True, env=env)
        print(p.stdout[-3000:], p.stderr[-3000:], flush=True)
        if os.path.exists(tj):
            for line in open(tj):
                r = json.loads(line)
                r["ok"] = True
                gpu_name = r.get("gpu", gpu_name)
                rows.append(r)
    if gpu_name == "?":  # no PyTorch rows name it: ask the driver
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True)
            gpu_name = (smi.stdout.splitlines() or ["?"])[0].strip() or "?"
        except OSError:
            pass

    def f(v, fmt):
        return fmt % v if v is not None else "-"

    hdr = ("| run | step ms | tokens/s | MFU | peak GiB | predicted step ms (err) | predicted peak GiB (err) |\n"
           "|---|---|---|---|---|---|---|")
    lines = [hdr]
    for r in rows:
        name = "%s %s" % (r["impl"], r["mode"])
        if not r.get("ok") or "step_s" not in r:
            lines.append("| %s | failed | | | | | |" % name)
            continue
        pred_t = pred_m = "-"
        if r.get("pred_step_s"):
            pred_t = "%.1f (%+.1f%%)" % (r["pred_step_s"] * 1e3, 100 * (r["pred_step_s"] - r["step_s"]) / r["step_s"])
        if r.get("pred_peak_gib"):
            pred_m = "%.2f (%+.1f%%)" % (r["pred_peak_gib"], 100 * (r["pred_peak_gib"] - r["peak_gib"]) / r["peak_gib"])
        lines.append("| %s | %.1f | %.0f | %.1f%% | %.2f | %s | %s |" % (
            name, r["step_s"] * 1e3, r["tokens_per_s"], 100 * r["mfu"], r["peak_gib"], pred_t, pred_m))
    ok = {("%s %s" % (r["impl"], r["mode"])): r for r in rows if r.get("ok") and "step_s" in r}
    ratios = []
    bf = ok.get("meshplan bf16")
    for other in ("pytorch eager", "pytorch compile", "meshplan float8"):
        if bf and other in ok:
            ratios.append("%s / meshplan bf16 step time: %.3f" % (other, ok[other]["step_s"] / bf["step_s"]))
    table = "\n".join(lines)
    head = ("%s, %s, model %s (seq %d, micro-batch %d), %s UTC\n" % (
        gpu_name, args.gpu, args.model, args.seq, args.batch,
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")))
    text = head + "\n" + table + "\n\n" + "\n".join(ratios) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fo:
            fo.write(text)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
