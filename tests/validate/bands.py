#!/usr/bin/env python3
"""Holds `meshplan validate` to published figures with its statistics recomputed here.

The tool's own per-row errors, MAPE and Kendall tau are not trusted: this script reads the
predicted and published figure of every row from `validate --json` (full precision) and
recomputes, independently of common/stats.c,
  - each row's error, (predicted - published) / published;
  - per metric the mean absolute percentage error over that metric's simulated rows;
  - per metric Kendall's tau-b with ties (Kendall 1945: (C - D) / sqrt((C + D + Tx)(C + D + Ty)),
    a pair tied in both samples counted in neither);
then checks that the tool printed the same (JSON to 1e-9; the table to its rounding: the
error and MAPE to 0.05 points, tau to 0.0005) and holds the figures to the bands:
  --expected FILE   "case predicted" lines: each prediction within 1 % of the recorded one
                    (a change that moves a prediction updates the file on purpose); every
                    recorded row present
  --row-limit PCT   every row within PCT % of its published figure, except
  --row-limits FILE "case PCT reason..." lines: a row's own limit, with the reason written
  --limits M:MAPE:TAU,...  per metric the MAPE ceiling (%) and the tau-b floor
  --min-rows N      at least N rows simulated
Prints one FAIL line per failure and a summary; exits 1 on any failure.

Usage: bands.py MESHPLAN CSV --label L [options]"""
import argparse
import itertools
import json
import math
import re
import subprocess
import sys


def tau_b(x, y):
    c = d = tx = ty = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        a, b = x[i] - x[j], y[i] - y[j]
        if a == 0 and b == 0:
            continue
        if a == 0:
            tx += 1
        elif b == 0:
            ty += 1
        elif (a > 0) == (b > 0):
            c += 1
        else:
            d += 1
    den = math.sqrt((c + d + tx) * (c + d + ty))
    return (c - d) / den if den > 0 else None


def recompute(rows):
    """Per metric: (rows, MAPE as a fraction, tau-b or None), from the rows' figures."""
    out = {}
    for metric in sorted({r["metric"] for r in rows if "refused" not in r}):
        ok = [r for r in rows if r["metric"] == metric and "refused" not in r]
        pred, pub = [r["predicted"] for r in ok], [r["published"] for r in ok]
        mape = sum(abs(p - m) / abs(m) for p, m in zip(pred, pub)) / len(ok)
        out[metric] = (len(ok), mape, tau_b(pred, pub))
    return out


def read_pairs(path):
    """Non-comment lines 'name value [rest...]' -> {name: (float value, rest)}."""
    out = {}
    for line in open(path):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        f = line.split(None, 2)
        out[f[0]] = (float(f[1]), f[2] if len(f) > 2 else "")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin")
    ap.add_argument("csv")
    ap.add_argument("--label", required=True)
    ap.add_argument("--expected")
    ap.add_argument("--row-limit", type=float, default=0)
    ap.add_argument("--row-limits")
    ap.add_argument("--limits", default="")
    ap.add_argument("--min-rows", type=int, default=1)
    ap.add_argument("--allow-refused", action="store_true")
    a = ap.parse_args()

    fails = []
    js = subprocess.run([a.bin, "validate", "--json", a.csv], capture_output=True, text=True)
    tab = subprocess.run([a.bin, "validate", a.csv], capture_output=True, text=True)
    if not a.allow_refused and (js.returncode != 0 or tab.returncode != 0):
        print("FAIL: meshplan validate exited %d / %d: %s" % (js.returncode, tab.returncode, js.stderr.strip()))
        sys.exit(1)
    print(tab.stdout, end="")
    doc = json.loads(js.stdout)
    rows, summary = doc["rows"], doc["summary"]
    ran = [r for r in rows if "refused" not in r]

    # each row's error, in the JSON and in the table
    table = {}
    for line in tab.stdout.splitlines():
        f = line.split()
        if len(f) == 6 and f[5].endswith("%") and f[0] != "case":
            table[f[0]] = float(f[5][:-1])
    for r in ran:
        err = (r["predicted"] - r["published"]) / r["published"]
        if abs(r["error"] - err) > 1e-9 * max(1.0, abs(err)):
            fails.append("%s: error %.6g in --json, %.6g from its figures" % (r["case"], r["error"], err))
        if r["case"] not in table or abs(table[r["case"]] - 100 * err) > 0.05 + 1e-9:
            fails.append("%s: table error %s, %.2f%% from its figures" % (r["case"], table.get(r["case"]), 100 * err))

    # per metric MAPE and tau-b, recomputed, against the JSON and the table's summary lines
    mine = recompute(rows)
    printed = {}
    for line in tab.stdout.splitlines():
        m = re.match(r"^(\w+) +(\d+) +([0-9.]+)% +(\S+)$", line)
        if m:
            printed[m.group(1)] = (int(m.group(2)), float(m.group(3)), m.group(4))
    for metric, (n, mape, tau) in mine.items():
        s = summary.get(metric)
        if s is None or s["rows"] != n or abs(s["mape"] - mape) > 1e-9 or \
                (tau is None) != (s["kendall_tau_b"] is None) or \
                (tau is not None and abs(s["kendall_tau_b"] - tau) > 1e-9):
            fails.append("%s: --json summary %s, recomputed rows %d MAPE %.6f tau-b %s" % (metric, s, n, mape, tau))
        p = printed.get(metric)
        if p is None or p[0] != n or abs(p[1] - 100 * mape) > 0.05 + 1e-9 or \
                (tau is None and p[2] != "n/a") or (tau is not None and (p[2] == "n/a" or abs(float(p[2]) - tau) > 5e-4 + 1e-12)):
            fails.append("%s: table summary %s, recomputed rows %d MAPE %.2f%% tau-b %s" % (metric, p, n, 100 * mape, tau))
    for metric in summary:
        if metric not in mine:
            fails.append("%s: summarized by the tool with no row" % metric)

    # bands
    if a.expected:
        want = read_pairs(a.expected)
        got = {r["case"]: r["predicted"] for r in ran}
        for case, (v, _) in want.items():
            if case not in got:
                fails.append("expected row %s not simulated" % case)
            elif abs(got[case] - v) > 0.01 * abs(v):
                fails.append("%s predicted %.6g, recorded %g (%+.2f%%)" % (case, got[case], v, 100 * (got[case] - v) / v))
        for case in got:
            if case not in want:
                fails.append("row %s has no expected prediction" % case)
    own = read_pairs(a.row_limits) if a.row_limits else {}
    for case in own:
        if case not in {r["case"] for r in ran}:
            fails.append("row limit for %s, which is not a row" % case)
    if a.row_limit > 0:
        for r in ran:
            lim, why = own.get(r["case"], (a.row_limit, ""))
            err = 100 * (r["predicted"] - r["published"]) / r["published"]
            if abs(err) > lim:
                fails.append("%s is %+.1f%% off its published figure (limit %.0f%%%s)" % (r["case"], err, lim,
                             ": " + why if why else ""))
    for spec in filter(None, a.limits.split(",")):
        metric, mape_max, tau_min = spec.split(":")
        if metric not in mine:
            fails.append("no row of %s" % metric)
            continue
        n, mape, tau = mine[metric]
        if 100 * mape > float(mape_max):
            fails.append("%s MAPE %.2f%% over %s%%" % (metric, 100 * mape, mape_max))
        if tau is None or tau < float(tau_min):
            fails.append("%s Kendall tau-b %s under %s" % (metric, tau, tau_min))
    if len(ran) < a.min_rows:
        fails.append("only %d rows simulated" % len(ran))

    for f in fails:
        print("FAIL: " + f)
    print("%s: %d rows, %d failures" % (a.label, len(ran), len(fails)))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
