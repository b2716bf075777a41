#!/bin/bash
# The megatron-core profile prices Transformer Engine's cuDNN fused attention at cuDNN's own
# measured rate by span (data/stacks/megatron-core.json attention_by_span) with the float8
# ceiling fitted beside it (fp8_gemm_eff_max). Run over the dev and check rows
# (docs/validation.md, the Qwen3-235B long-context table), it holds:
#   - the fit: the shipped fp8_gemm_eff_max gives the least step-time MAPE on the seven
#     MLPerf H100 dev rows it is fitted on among itself and 0.01 either side, every row
#     within 5 %;
#   - the four long-context rows (seq 16K to 128K at CP 1 to 8, 16K tokens a CP rank) within
#     5 %, and their cost a ring step (cp 1's taken out) within 10 % of the published one,
#     where the same profile with attention at attention_eff alone (FlashAttention-2's level)
#     prices it 1.5 to 2.0 times the published;
#   - the check set's tokens/s and step-time MAPE below that FlashAttention-2 variant's, each
#     profile with the float8 ceiling its own fit gives (0.61 at FlashAttention-2's level);
#   - Meta's Llama 3 rows (their own profile, no Transformer Engine) unmoved by the variant.
# Runs from the runfiles root.
set -u
exec /usr/bin/python3 - <<'PY'
import csv, json, os, subprocess, sys

tmp = os.environ.get("TEST_TMPDIR", "/tmp")
val = os.path.abspath("tests/data/validation")
prof = json.load(open("data/stacks/megatron-core.json"))
shipped_fp8 = prof["fp8_gemm_eff_max"]
if not os.path.exists(os.path.join(tmp, "models")):
    os.symlink(os.path.join(val, "models"), os.path.join(tmp, "models"))

def run(name, fp8=None, flash=False):
    """validate --json of published_<name>.csv; megatron-core's rows under the shipped profile,
    or under a copy with fp8_gemm_eff_max fp8, or with attention at attention_eff alone"""
    path = os.path.join(val, f"published_{name}.csv")
    if fp8 is not None or flash:
        p = dict(prof, fp8_gemm_eff_max=fp8 if fp8 is not None else shipped_fp8)
        if flash:
            del p["attention_by_span"]
        pj = os.path.join(tmp, f"mc_{fp8}_{flash}.json")
        json.dump(p, open(pj, "w"))
        path = os.path.join(tmp, f"{name}_{fp8}_{flash}.csv")
        open(path, "w").write(open(os.path.join(val, f"published_{name}.csv")).read()
                              .replace(",megatron-core,", f",{pj},"))
    out = subprocess.run(["app/meshplan", "validate", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAIL: validate {path}: {out.stderr.strip()}")
    return {r["case"]: r for r in json.loads(out.stdout)["rows"]}

fails = []
mlperf = lambda rows: {k: r for k, r in rows.items() if k.startswith(("mlp50_405b_h100", "mlp41_gpt3_h100"))}
mape = lambda rows: sum(abs(r["error"]) for r in rows.values()) / len(rows)
grid = [round(shipped_fp8 + d, 2) for d in (-0.01, 0.0, 0.01)]
fit = {v: mlperf(run("dev", v)) for v in grid}
if len(fit[shipped_fp8]) != 7:
    fails.append(f"{len(fit[shipped_fp8])} MLPerf H100 dev rows, not 7")
best = min(fit, key=lambda v: mape(fit[v]))
print("dev MLPerf step-time MAPE:", {v: round(100 * mape(r), 2) for v, r in fit.items()})
if best != shipped_fp8:
    fails.append(f"least dev MAPE at fp8_gemm_eff_max {best}, not the shipped {shipped_fp8}")
fails += [f"dev {k} {100 * r['error']:+.1f} %" for k, r in fit[shipped_fp8].items() if abs(r["error"]) > 0.05]

# The FlashAttention-2 variant at its own fit: the same procedure over the same rows.
flash_fit = {v: mlperf(run("dev", v, flash=True)) for v in (0.60, 0.61, 0.62)}
flash_fp8 = min(flash_fit, key=lambda v: mape(flash_fit[v]))
print("dev MLPerf step-time MAPE at FlashAttention-2's level:", {v: round(100 * mape(r), 2) for v, r in flash_fit.items()})
if flash_fp8 != 0.61:
    fails.append(f"the FlashAttention-2 variant fits fp8_gemm_eff_max {flash_fp8}, not 0.61 (the profile's reasoning)")
check, flash = run("check"), run("check", flash_fp8, flash=True)
for k in ("qwen235_lc16k_h100_tps", "qwen235_lc32k_h100_tps", "qwen235_lc64k_h100_tps", "qwen235_lc128k_h100_tps"):
    print(f"{k}: {100 * flash[k]['error']:+.1f} % at FlashAttention-2's level, {100 * check[k]['error']:+.1f} % shipped")
    if abs(check[k]["error"]) > 0.05:
        fails.append(f"{k} {100 * check[k]['error']:+.1f} %")
for metric in ("tokens_per_s_per_gpu", "step_time_s"):
    a, b = ({k: r for k, r in rows.items() if r["metric"] == metric} for rows in (flash, check))
    print(f"check {metric} MAPE {100 * mape(a):.2f} at FlashAttention-2's level, {100 * mape(b):.2f} % shipped")
    if mape(b) >= mape(a):
        fails.append(f"check {metric} MAPE not below the FlashAttention-2 variant's")
moved = [k for k in flash if k.startswith("l3_") and flash[k]["predicted"] != check[k]["predicted"]]
if moved:
    fails.append(f"Llama 3 rows moved: {moved}")
# The long-context rows' marginal cost of a ring step. Every row holds 16,384 tokens a CP
# rank (seq / cp), so a rank's GEMMs, MoE dispatch and experts, norms and loss are the same
# shapes in all four and only the attention core and the ring's K, V exchange grow, in
# proportion to cp. A pipeline rank's time a micro-batch, step / m = global_batch x seq /
# (tokens/s per GPU x gpus x local_batch / micro_batch), less cp 1's and divided by cp - 1,
# is then that growth alone, whatever the rest is priced at: published 73, 82 and 87 ms a
# unit of cp at cp 2, 4 and 8; attention_eff 0.2823 (FlashAttention-2's share) prices 133,
# 140 and 142, cuDNN's rate by span 78, 87 and 90.
lc = {r["case"]: r for r in csv.DictReader(l for l in open(os.path.join(val, "published_check.csv"))
                                           if not l.startswith("#")) if r["case"] in check}
def per_micro_batch(case, tps):
    r = lc[case]
    m = int(r["local_batch"]) / int(r["micro_batch"])
    return int(r["global_batch"]) * int(r["seq"]) / (tps * int(r["gpus"]) * m)
lc_rows = [("qwen235_lc16k_h100_tps", 1), ("qwen235_lc32k_h100_tps", 2),
           ("qwen235_lc64k_h100_tps", 4), ("qwen235_lc128k_h100_tps", 8)]
for label, rows in (("published", None), ("flash", flash), ("shipped", check)):
    t = [per_micro_batch(k, float(lc[k]["value"]) if rows is None else rows[k]["predicted"])
         for k, _ in lc_rows]
    slope = [(t[i] - t[0]) / (cp - 1) for i, (_, cp) in enumerate(lc_rows) if cp > 1]
    if label == "published":
        pub = slope
    print(f"long-context ms a micro-batch and unit of cp, {label}:", [round(1e3 * s) for s in slope])
    ratio = [s / p for s, p in zip(slope, pub)]
    if label == "flash" and not all(1.5 < x < 2.0 for x in ratio):
        fails.append(f"FlashAttention-2 slope over published {ratio} (1.5 to 2.0 expected)")
    if label == "shipped" and not all(abs(x - 1) < 0.1 for x in ratio):
        fails.append(f"cuDNN slope over published {ratio} (within 10 % expected)")
if fails:
    sys.exit("FAIL: " + "; ".join(fails))
print("PASS")
PY
