#!/usr/bin/env python3
"""What scripts/test counts as skipped: reads the test logs of the targets Bazel reported as
passed and finds what did not run.

A test says it skipped in one of two ways:
  - GoogleTest's GTEST_SKIP: "FILE:LINE: Skipped", the reason on the next line, then
    "[  SKIPPED ] Suite.Name (N ms)" (also under mpirun, where every rank may print it);
  - a script (tests/skip_without_mpi.sh, tests/runtime/gpu_parity.py): a line that starts
    with "SKIP" and gives the reason.
A target none of whose cases ran (every GoogleTest case skipped, or a script that skipped)
is skipped, not passed; skipped cases inside a target that ran others are listed too.

Usage: test_skips.py TESTLOGS TARGET... (each //pkg:name). Prints one line per skip, then a
last line "RESULT <skipped targets> <skipped cases in passed targets>", and lists the
skipped targets' names after "TARGETS". Exits 0."""
import os
import re
import sys


def read_log(path):
    """(gtest cases run ok, {case: reason} skipped, script skip reason or None)."""
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return 0, {}, None
    ok = set()
    skipped = {}
    script = None
    reason = ""
    for i, line in enumerate(lines):
        if re.match(r"^\S+:\d+: Skipped$", line):
            reason = lines[i + 1].strip() if i + 1 < len(lines) else ""
            continue
        m = re.match(r"^\[  SKIPPED \] (\S+) \(\d+ ms\)$", line)
        if m:
            skipped.setdefault(m.group(1), reason)
            reason = ""
            continue
        m = re.match(r"^\[       OK \] (\S+) \(\d+ ms\)$", line)
        if m:
            ok.add(m.group(1))
            continue
        if script is None and re.match(r"^SKIP\b", line):
            script = line[4:].lstrip(": ").strip()
    return len(ok), {k: v for k, v in skipped.items() if k not in ok}, script


def main():
    logs, targets = sys.argv[1], sys.argv[2:]
    skipped_targets, inner = [], 0
    for t in targets:
        pkg, name = t[2:].split(":", 1)
        n_ok, cases, script = read_log(os.path.join(logs, pkg, name, "test.log"))
        if script is not None and n_ok == 0:
            print("  %s: skipped: %s" % (t, script))
            skipped_targets.append(t)
            continue
        if cases and n_ok == 0:
            skipped_targets.append(t)
            for c, why in sorted(cases.items()):
                print("  %s: skipped (every case): %s: %s" % (t, c, why))
            continue
        for c, why in sorted(cases.items()):
            print("  %s %s: skipped: %s" % (t, c, why))
            inner += 1
    print("RESULT %d %d" % (len(skipped_targets), inner))
    print("TARGETS " + " ".join(skipped_targets))


if __name__ == "__main__":
    main()
