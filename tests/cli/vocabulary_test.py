#!/usr/bin/env python3
"""One option vocabulary across the meshplan commands, through the binary: every shared
option is accepted by every command that takes it with the same help line; plan and
simulate predict the same figures for the same mesh under their defaults (GPU, GPUs per
node, headroom, global batch); --hf-config works beyond plan; --seq past max_seq is
refused the same way everywhere and accepted with --allow-long-seq.

Usage: vocabulary_test.py MESHPLAN HF_CONFIG_JSON"""
import json
import subprocess
import sys

BIN, HF = sys.argv[1], sys.argv[2]
fails = []


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def check(cond, what):
    if not cond:
        fails.append(what)


def help_lines(cmd):
    out = run(cmd, "--help").stdout
    lines = {}
    for ln in out.splitlines():
        parts = ln.split()
        if ln.startswith("  --") and parts:
            lines[parts[0]] = ln.strip()
    return lines


# option -> (a value or None for a switch, the commands that take it, same help text everywhere)
SHARED = {
    "--model": ("llama3.1-8b", ["plan", "simulate", "explain", "train"], False),
    "--hf-config": (HF, ["plan", "simulate", "explain", "train"], True),
    "--cluster": ("h100-8", ["plan", "simulate"], True),
    # plan's --gpus also takes a sweep, A..B, which its help line says
    "--gpus": ("8", ["plan", "simulate"], False),
    "--gpu": ("h100-sxm", ["plan", "simulate", "train", "calibrate"], False),
    "--gpus-per-node": ("8", ["plan", "simulate"], True),
    "--inter-gbps": ("400", ["plan", "simulate"], True),
    "--headroom": ("0.05", ["plan", "simulate"], True),
    "--stack": ("torchtitan-compile", ["plan", "simulate"], False),
    "--seq": ("4096", ["plan", "simulate", "explain", "train"], False),
    "--allow-long-seq": (None, ["plan", "simulate", "explain", "train"], True),
    "--global-batch": ("64", ["plan", "simulate", "explain", "train"], False),
    "--global-batch-tokens": ("524288", ["plan", "simulate", "explain", "train"], True),
    "--micro-batch": ("1", ["plan", "simulate", "explain", "train"], False),
    "--mesh": ("dp_shard=8", ["plan", "simulate", "explain", "train"], False),
    "--ep": ("1", ["plan", "simulate", "explain", "train"], False),
    "--ac": ("full", ["plan", "simulate", "explain", "train"], False),
    "--fp8": (None, ["plan", "simulate", "explain", "train"], False),
    "--sp": (None, ["plan", "simulate", "explain"], True),
    "--no-sp": (None, ["plan", "simulate", "explain"], False),
    "--db": ("x.db", ["plan", "train", "calibrate", "report"], False),
    "--json": (None, ["plan", "simulate", "explain", "calibrate", "report"], False),
    "--top": ("3", ["plan", "report"], False),
}
helps = {c: help_lines(c) for c in ("plan", "simulate", "explain", "train", "calibrate", "report")}
for opt, (val, cmds, same_text) in SHARED.items():
    texts = set()
    for c in cmds:
        check(opt in helps[c], f"meshplan {c} --help does not list {opt}")
        # accepted by the parser (--help after it: nothing runs)
        p = run(c, opt, *([val] if val else []), "--help")
        check(p.returncode == 0, f"meshplan {c} {opt}: refused: {p.stderr.strip()}")
        if opt in helps[c]:
            texts.add(helps[c][opt])
    check(not same_text or len(texts) <= 1, f"{opt}: different help lines: {texts}")
# The flag's name and metavar are the same in every command (the rows of options.h); plan's
# --fp8 also takes auto (float8 searched where the GPU has it), a word of its search.
for opt, (val, cmds, _) in SHARED.items():
    if opt == "--fp8":
        cmds = [c for c in cmds if c != "plan"]
    heads = {helps[c][opt].split("  ")[0] for c in cmds if opt in helps[c]}
    check(len(heads) <= 1, f"{opt}: different forms {heads}")

# plan and simulate agree on one mesh under their defaults: --gpus without --gpu (h100-sxm),
# GPUs per node, headroom 0.05 and the default batch rule (512 sequences for 8B).
pj = run("plan", "--no-db", "--json", "--gpus", "16", "--mesh", "dp_shard=16", "--ac", "none", "--micro-batch", "1",
         "--fix", "reshard=1")
sj = run("simulate", "--json", "--gpus", "16", "--mesh", "dp_shard=16", "--ac", "none", "--micro-batch", "1")
check(pj.returncode == 0 and sj.returncode == 0, f"plan/simulate failed: {pj.stderr} {sj.stderr}")
if pj.returncode == 0 and sj.returncode == 0:
    p, s = json.loads(pj.stdout)["plans"][0], json.loads(sj.stdout)
    check(p["global_batch"] == s["global_batch"] == 512, f"global batches {p['global_batch']} vs {s['global_batch']}")
    check(p["step_time_s"] == s["step_time_s"], f"step times {p['step_time_s']} vs {s['step_time_s']}")
    check(p["peak_mem_bytes"] == s["peak_mem_bytes"], "peak memory differs")
    check(p["capacity_bytes"] == s["capacity_bytes"], "capacity (headroom) differs")

# --hf-config beyond plan: the config's model is the one simulated and explained.
for cmd in (["simulate", "--json"], ["explain", "--json"]):
    p = run(*cmd, "--hf-config", HF, "--mesh", "dp_shard=8")
    check(p.returncode == 0, f"meshplan {cmd[0]} --hf-config: {p.stderr.strip()}")
p = run("simulate", "--hf-config", HF, "--model", "llama3.1-8b")
check(p.returncode == 2 and "not both" in p.stderr, "--hf-config with --model not refused")
p = run("simulate", "--gpu", "h100-sxm")
check(p.returncode == 2 and "--gpus N" in p.stderr, "simulate --gpu without --gpus not refused: " + p.stderr)

# --seq past max_seq (tiny-dense: 64): refused by every command, accepted with --allow-long-seq.
for cmd in (["plan", "--no-db"], ["simulate"], ["explain"], ["train", "--steps", "0"]):
    p = run(*cmd, "--model", "tiny-dense", "--seq", "128")
    check(p.returncode == 2 and "longer than tiny-dense's max_seq 64" in p.stderr and "--allow-long-seq" in p.stderr,
          f"meshplan {cmd[0]} --seq 128: {p.returncode} {p.stderr.strip()}")
for cmd in (["plan", "--no-db"], ["simulate"], ["explain"]):
    p = run(*cmd, "--model", "tiny-dense", "--seq", "128", "--allow-long-seq")
    check(p.returncode == 0, f"meshplan {cmd[0]} --allow-long-seq: {p.stderr.strip()}")

# explain --schedule and --summary predict with the same simulator on the same cluster: the
# expanded schedule's step equals simulate's (compact) step for the mesh, every timed op has
# a duration, and the summary names the step and its classes.
ej = run("explain", "--json", "--schedule", "--mesh", "dp_shard=8,tp=2", "--gpus", "16")
sj = run("simulate", "--json", "--mesh", "dp_shard=8,tp=2", "--gpus", "16")
check(ej.returncode == 0 and sj.returncode == 0, f"explain/simulate: {ej.stderr} {sj.stderr}")
if ej.returncode == 0 and sj.returncode == 0:
    sch = json.loads(ej.stdout)["schedule"]
    step = json.loads(sj.stdout)["step_time_s"]
    check(abs(sch["predicted_step_s"] - step) <= 1e-9 * step, f"explain's step {sch['predicted_step_s']} != simulate's {step}")
    timed = [o for o in sch["ops"] if o.get("type") in ("compute", "comm")]
    check(len(timed) > 100 and all(o.get("predicted_s", -1) > 0 for o in timed if o["phase"] in ("forward", "backward")),
          "a forward or backward op without a predicted duration")
p = run("explain", "--summary", "--mesh", "dp_shard=8,tp=2", "--gpus", "16")
check(p.returncode == 0 and "predicted step of rank 0 on 16 x h100-sxm" in p.stdout and "gemm" in p.stdout
      and "step schedule" not in p.stdout, "explain --summary: " + p.stdout[-600:] + p.stderr)
p = run("explain", "--summary", "--mesh", "dp_shard=64", "--cluster", "h100-8")
check(p.returncode == 2 and "--gpus 64" in p.stderr, "explain on a cluster smaller than the mesh: " + p.stderr)

if fails:
    print("\n".join("FAIL: " + f for f in fails))
    sys.exit(1)
print("vocabulary: all checks passed")
