#!/usr/bin/env python3
"""Power, SM clock and bf16 GEMM throughput of a GPU under sustained matrix load.

    power_probe.py [--seconds S] [--out FILE.jsonl]

Runs back-to-back 8192 x 8192 x 8192 bf16 products through torch.matmul (cuBLAS) for S
seconds on random data, then S seconds on zeros (less switching, less power), while
nvidia-smi samples power draw, SM clock, temperature and the active clock-throttle reasons
every 200 ms. Prints the median of each over the second half of each phase (the clocks
settle in the first), and TFLOP/s per phase. Tells whether the part's sustained matrix
throughput is limited by its power cap: a draw at the cap with the SM clock below its
maximum is a part that runs slower under a lower cap (the 500 W H100 of torchtitan's
benchmarks against the 700 W SXM).
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

FIELDS = "power.draw,power.limit,clocks.sm,clocks.max.sm,temperature.gpu,clocks_throttle_reasons.active"


def phase(name, a, b, seconds):
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=" + FIELDS, "--format=csv,noheader,nounits", "-lms", "200"],
                           stdout=subprocess.PIPE, text=True)
    n = 8192
    flops = 2.0 * n * n * n
    torch.cuda.synchronize()
    t0 = time.time()
    done, marks = 0, []
    while time.time() - t0 < seconds:
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(10):
            torch.matmul(a, b)
        e.record()
        e.synchronize()
        marks.append((time.time() - t0, s.elapsed_time(e) / 10))
        done += 10
    smi.terminate()
    out, _ = smi.communicate()
    rows = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 6:
            try:
                rows.append([float(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), float(parts[4]),
                             parts[5]])
            except ValueError:
                pass
    late = rows[len(rows) // 2:] or rows
    ms_late = [ms for t, ms in marks if t > seconds / 2] or [ms for _, ms in marks]
    rec = dict(phase=name, products=done, tflops=flops / statistics.median(ms_late) / 1e9,
               power_w=statistics.median(r[0] for r in late) if late else None,
               power_limit_w=late[0][1] if late else None,
               sm_mhz=statistics.median(r[2] for r in late) if late else None,
               sm_max_mhz=late[0][3] if late else None,
               temp_c=statistics.median(r[4] for r in late) if late else None,
               throttle=sorted(set(r[5] for r in late)), samples=len(rows),
               smi_head=out.strip().splitlines()[:2])
    print(json.dumps(rec), flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("power_probe: no CUDA device; nothing measured")
        return 0
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    recs = [phase("random", a, b, args.seconds)]
    a.zero_()
    b.zero_()
    recs.append(phase("zeros", a, b, args.seconds))
    if args.out:
        with open(args.out, "w") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
