#!/usr/bin/env python3
"""The routed experts' loads through the binary: train measures them each step (--metrics,
--db), --moe-capacity-factor drops what is over an expert's capacity, and report summarizes
them per MoE layer; the option's refusals.

tiny-moe (data/models/tiny-moe.json): 2 MoE layers of 8 experts, top_k 2. A step of
global batch 4 x seq 32 routes 4 x 32 x 2 = 256 assignments per layer (every token takes
top_k experts), in 2 micro-batches of 2 sequences: 64 tokens, 128 assignments each. With
capacity factor 1.0 an expert keeps at most ceil(64 x 2 / 8 x 1.0) = 16 of a micro-batch's
assignments (Megatron-Core's get_capacity), so at most 32 of a step's: routed - dropped
<= 32 per expert, and an expert routed r > 32 in a step dropped at least r - 32.
report's figures are derived here again from the metrics lines: per step the imbalance
max_e routed / (sum_e routed / 8), its min, median and max over the steps; the hottest
expert, the most routed over the run, with its share; dropped / routed over the run.

Usage: expert_loads_test.py MESHPLAN"""
import json
import os
import statistics
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
E, STEPS = 8, 4
TRAIN = ["train", "--model", "tiny-moe", "--steps", str(STEPS), "--seq", "32", "--micro-batch", "2",
         "--global-batch", "4", "--quiet"]


def layers_of(metrics):
    """layer -> list over steps of (routed, dropped) per expert."""
    out = {}
    for line in open(metrics):
        for lo in json.loads(line).get("expert_loads", []):
            out.setdefault(lo["layer"], []).append((lo["routed"], lo["dropped"]))
    return out


def summary(steps):
    imb = [max(r) * E / sum(r) for r, _ in steps]
    tot = [sum(r[e] for r, _ in steps) for e in range(E)]
    routed, dropped = sum(tot), sum(sum(d) for _, d in steps)
    hot = max(range(E), key=lambda e: (tot[e], -e))
    return dict(steps=len(steps), imbalance_min=min(imb), imbalance_median=statistics.median(imb),
                imbalance_max=max(imb), hottest_expert=hot, hottest_share=tot[hot] / routed,
                dropped_fraction=dropped / routed)


for cf, db in (("1.0", "cap.db"), (None, "dropless.db")):
    db, metrics = os.path.join(tmp, db), os.path.join(tmp, db + ".jsonl")
    extra = ["--moe-capacity-factor", cf] if cf else []
    run(*TRAIN, *extra, "--db", db, "--metrics", metrics)
    layers = layers_of(metrics)
    check(sorted(layers) == [0, 1], f"expert_loads layers {sorted(layers)}, want the MoE layers [0, 1]")
    for l, steps in layers.items():
        check(len(steps) == STEPS, f"layer {l}: {len(steps)} steps of loads, want {STEPS}")
        for s, (r, d) in enumerate(steps):
            check(sum(r) == 256, f"layer {l} step {s + 1}: {sum(r)} assignments routed, want 4 x 32 x 2 = 256")
            if cf:
                check(all(r[e] - d[e] <= 32 and d[e] >= max(0, r[e] - 32) for e in range(E)),
                      f"layer {l} step {s + 1}: routed {r} dropped {d}: over the capacity 2 x 16")
            else:
                check(not any(d), f"layer {l} step {s + 1}: dropless run dropped {d}")
    if cf:
        check(sum(sum(d) for steps in layers.values() for _, d in steps) > 0,
              "capacity factor 1.0 dropped nothing: the case would not test the drop")
    p = run("report", "--db", db, "--run", "1", "--json")
    got = {x["layer"]: x for x in json.loads(p.stdout).get("expert_loads", [])} if p.returncode == 0 else {}
    check(sorted(got) == sorted(layers), f"report --json expert_loads layers {sorted(got)}")
    for l, steps in layers.items():
        want = summary(steps)
        for k, v in want.items():
            check(l in got and abs(got[l][k] - v) <= 1e-12 * max(1, abs(v)),
                  f"report layer {l} {k}: {got.get(l, {}).get(k)}, from the metrics {v}")
    p = run("report", "--db", db, "--run", "1")
    check("routed experts" in p.stdout and "hottest expert" in p.stdout, "report --run shows no expert loads")

# an eval's forward between a step and its record leaves the step's loads as they were: the
# same run with an eval after every step records the same loads
cap = os.path.join(tmp, "cap.db.jsonl")
data, evald = os.path.join(tmp, "data.bin"), os.path.join(tmp, "eval.jsonl")
run(*TRAIN, "--steps", "1", "--dump-data", data)
run(*TRAIN, "--moe-capacity-factor", "1.0", "--val-data", data, "--eval-every", "1", "--metrics", evald)
got = [json.loads(l).get("expert_loads") for l in open(evald)] if os.path.exists(evald) else []
want = [json.loads(l).get("expert_loads") for l in open(cap)]
check(got == want, "the loads recorded with an eval after each step differ from the run's without")

# a dense model records none, and report shows none
db = os.path.join(tmp, "dense.db")
run("train", "--model", "tiny-dense", "--steps", "2", "--seq", "16", "--quiet", "--db", db)
p = run("report", "--db", db, "--run", "1", "--json")
check(p.returncode == 0 and "expert_loads" not in json.loads(p.stdout), "a dense run reports expert loads")

# refusals: one line each, exit 2
for args, words in ((["--moe-capacity-factor", "0"], "expected a number in (0"),
                    (["--moe-capacity-factor", "-1"], "expected a number in (0"),
                    (["--moe-capacity-factor", "nan"], "expected a number in (0"),
                    # simulate's bound (MP_LIM_MOE_LOAD): one limit for every command
                    (["--moe-capacity-factor", "16385"], "expected a number in (0, 16384]"),
                    (["--moe-capacity-factor", "1.0", "--model", "tiny-dense"], "has no routed experts")):
    p = run(*TRAIN, *args, want_rc=2)
    check(words in p.stderr and len(p.stderr.strip().splitlines()) == 1, f"{args}: {p.stderr.strip()}")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
