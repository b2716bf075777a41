#!/bin/bash
# The megatron-core profile with Transformer Engine's cuDNN attention priced at cuDNN's own
# measured rate by span (tests/validate/cudnn_attention.json: its attention_by_span and the
# float8 ceiling refitted with it, merged into data/stacks/megatron-core.json), run over the
# dev and check rows (docs/validation.md, the Qwen3-235B long-context table). Holds:
#   - the refit: fp8_gemm_eff_max 0.59 gives the least step-time MAPE on the seven MLPerf
#     H100 dev rows of 0.58, 0.59 and 0.60, every one of them within 5 %;
#   - the four long-context rows (seq 16K to 128K at CP 1 to 8) within 5 % (-9.9 to -30.4 %
#     under attention_eff 0.2823);
#   - the check set's tokens/s and step-time MAPE both below the shipped profile's (step time
#     7.75 -> 7.30 %: the delayed-scaling MLPerf GPT-3 H100 rows of rounds v3.1 to v4.1, 768 to
#     11,616 GPUs, priced 5-12 % short, read closer under the refitted float8 ceiling 0.59,
#     the v5.1 8B float8 rows further off);
#   - the long-context rows' marginal cost of a ring step (per micro-batch, the intercept
#     taken out) within 10 % of the published under cuDNN's rate, 1.5-2x it as shipped;
#   - Meta's Llama 3 rows (stack meta-llama3) unmoved;
#   - the rows past 15 % that check_row_limits.txt does not list: mlp51_8b_b200_256 and
#     qwen235_pp32_h100_step, the rows that keep these keys out of megatron-core.json,
#     dsv3_gb200_mx_tps (+13.7 % shipped, +19.7 % here, its attention at cuDNN's rate) and
#     n4_15b_2304 (-15.0 % shipped, -15.5 % here: Nemotron-4 15B at DP 288, short in both).
# Runs from the runfiles root.
set -u
exec /usr/bin/python3 - <<'PY'
import csv, json, os, subprocess, sys

tmp = os.environ.get("TEST_TMPDIR", "/tmp")
val = os.path.abspath("tests/data/validation")
frag = json.load(open("tests/validate/cudnn_attention.json"))
prof = json.load(open("data/stacks/megatron-core.json"))
prof["attention_by_span"] = frag["attention_by_span"]
if not os.path.exists(os.path.join(tmp, "models")):
    os.symlink(os.path.join(val, "models"), os.path.join(tmp, "models"))

def run(name, fp8=None, shipped=False):
    """validate --json of published_<name>.csv, megatron-core's rows under the merged profile"""
    path = os.path.join(val, f"published_{name}.csv")
    if not shipped:
        p = dict(prof, fp8_gemm_eff_max=fp8 if fp8 is not None else frag["fp8_gemm_eff_max"])
        pj = os.path.join(tmp, f"mc_{fp8}.json")
        json.dump(p, open(pj, "w"))
        path = os.path.join(tmp, f"{name}_{fp8}.csv")
        open(path, "w").write(open(os.path.join(val, f"published_{name}.csv")).read()
                              .replace(",megatron-core,", f",{pj},"))
    out = subprocess.run(["app/meshplan", "validate", "--json", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"FAIL: validate {path}: {out.stderr.strip()}")
    return {r["case"]: r for r in json.loads(out.stdout)["rows"]}

fails = []
mlperf = lambda rows: {k: r for k, r in rows.items() if k.startswith(("mlp50_405b_h100", "mlp41_gpt3_h100"))}
mape = lambda rows: sum(abs(r["error"]) for r in rows.values()) / len(rows)
fit = {v: mlperf(run("dev", v)) for v in (0.58, 0.59, 0.60)}
if len(fit[0.59]) != 7:
    fails.append(f"{len(fit[0.59])} MLPerf H100 dev rows, not 7")
best = min(fit, key=lambda v: mape(fit[v]))
print("dev MLPerf step-time MAPE:", {v: round(100 * mape(r), 2) for v, r in fit.items()})
if best != frag["fp8_gemm_eff_max"]:
    fails.append(f"least dev MAPE at fp8_gemm_eff_max {best}, not {frag['fp8_gemm_eff_max']}")
fails += [f"dev {k} {100 * r['error']:+.1f} %" for k, r in fit[0.59].items() if abs(r["error"]) > 0.05]

check, shipped = run("check"), run("check", shipped=True)
for k in ("qwen235_lc16k_h100_tps", "qwen235_lc32k_h100_tps", "qwen235_lc64k_h100_tps", "qwen235_lc128k_h100_tps"):
    print(f"{k}: {100 * shipped[k]['error']:+.1f} % -> {100 * check[k]['error']:+.1f} %")
    if abs(check[k]["error"]) > 0.05:
        fails.append(f"{k} {100 * check[k]['error']:+.1f} %")
for metric in ("tokens_per_s_per_gpu", "step_time_s"):
    a, b = ({k: r for k, r in rows.items() if r["metric"] == metric} for rows in (shipped, check))
    print(f"check {metric} MAPE {100 * mape(a):.2f} -> {100 * mape(b):.2f} %")
    # tokens/s falls (the long-context rows); step time falls too: the MLPerf v5.1 8B float8
    # rows, whose forwards the result logs' validation steps show faster than priced and whose
    # backwards slower (docs/validation.md), move off, the delayed-scaling GPT-3 H100 rows
    # priced short move closer at fp8_gemm_eff_max 0.59, and they are the more
    if mape(b) >= mape(a):
        fails.append(f"check {metric} MAPE does not fall")
moved = [k for k in shipped if k.startswith("l3_") and shipped[k]["predicted"] != check[k]["predicted"]]
if moved:
    fails.append(f"Llama 3 rows moved: {moved}")
limited = {l.split()[0] for l in open("tests/validate/check_row_limits.txt") if l.strip() and not l.startswith("#")}
past = sorted(k for k, r in check.items() if abs(r["error"]) > 0.15 and k not in limited)
print("past 15 % and not in check_row_limits.txt:", past)
if past != ["dsv3_gb200_mx_tps", "mlp51_8b_b200_256", "n4_15b_2304", "qwen235_pp32_h100_step"]:
    fails.append(f"rows past 15 %: {past} (dsv3_gb200_mx_tps, mlp51_8b_b200_256, n4_15b_2304 and qwen235_pp32_h100_step expected; with none, the keys can join megatron-core.json)")
# The long-context rows' marginal cost of a ring step. Every row holds 16,384 tokens a CP
# rank (seq / cp), so a rank's GEMMs, MoE dispatch and experts, norms and loss are the same
# shapes in all four and only the attention core and the ring's K, V exchange grow, in
# proportion to cp. A pipeline rank's time a micro-batch, step / m = global_batch x seq /
# (tokens/s per GPU x gpus x local_batch / micro_batch), less cp 1's and divided by cp - 1,
# is then that growth alone, whatever the rest is priced at: published 73, 82 and 87 ms a
# unit of cp at cp 2, 4 and 8; the shipped profile (attention_eff 0.2823, FlashAttention-2's
# share) prices 133, 140 and 142, cuDNN's rate by span 78, 87 and 90.
lc = {r["case"]: r for r in csv.DictReader(l for l in open(os.path.join(val, "published_check.csv"))
                                           if not l.startswith("#")) if r["case"] in check}
def per_micro_batch(case, tps):
    r = lc[case]
    m = int(r["local_batch"]) / int(r["micro_batch"])
    return int(r["global_batch"]) * int(r["seq"]) / (tps * int(r["gpus"]) * m)
lc_rows = [("qwen235_lc16k_h100_tps", 1), ("qwen235_lc32k_h100_tps", 2),
           ("qwen235_lc64k_h100_tps", 4), ("qwen235_lc128k_h100_tps", 8)]
for label, rows in (("published", None), ("shipped", shipped), ("cudnn", check)):
    t = [per_micro_batch(k, float(lc[k]["value"]) if rows is None else rows[k]["predicted"])
         for k, _ in lc_rows]
    slope = [(t[i] - t[0]) / (cp - 1) for i, (_, cp) in enumerate(lc_rows) if cp > 1]
    if label == "published":
        pub = slope
    print(f"long-context ms a micro-batch and unit of cp, {label}:", [round(1e3 * s) for s in slope])
    ratio = [s / p for s, p in zip(slope, pub)]
    if label == "shipped" and not all(1.5 < x < 2.0 for x in ratio):
        fails.append(f"shipped slope over published {ratio} (1.5 to 2.0 expected)")
    if label == "cudnn" and not all(abs(x - 1) < 0.1 for x in ratio):
        fails.append(f"cuDNN slope over published {ratio} (within 10 % expected)")
if fails:
    sys.exit("FAIL: " + "; ".join(fails))
print("PASS")
PY
