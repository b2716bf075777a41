"""Multi-rank parity matrix for the CPU runtime (issue: "wrong order gives wrong gradients
silently").

For tiny-dense and tiny-moe, every plan of the matrix is trained with
`mpirun -np N meshplan train --mesh ...` and compared with the single-rank run of the same
model, AC mode and float8 setting (same seed, global batch, micro-batch and data):
  - per-step losses over STEPS steps equal within 1e-5 relative;
  - the full gradients after step 1 (gathered from the shards by --dump-grads) equal
    within 1e-5 relative (L2 norm of the difference over the L2 norm, per parameter,
    plus a max-abs check against the tensor's scale).
Meshes: 1 rank (the reference), dp_shard=4, dp_replicate=2 x dp_shard=2, tp=2, tp=4,
dp_shard=2 x tp=2; for the MoE model also ep=2 (dp_shard=2) and ep=4 (dp_shard=4); each
with AC none, selective and full; float8 on for dp_shard=2 x tp=2 (dense) against the
single-rank float8 run. Every run is under `timeout`: a hang fails the test.

Usage: parity_matrix.py MESHPLAN [--quick]
"""
import itertools
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

STEPS = 20
TOL = 1e-5
# Float8 plans: step-1 gradients at TOL, losses over the 20 steps at FP8_LOSS_TOL. E4M3 has
# 3 mantissa bits, so quantization is discontinuous: the ~1e-8 differences that reduction
# order leaves in the weights (reduce-scatter sums ranks in another order than one rank
# accumulates micro-batches; tp splits every GEMM's sum) flip individual E4M3 codes after
# a few steps, and each flip moves a value by up to 1/16 of it. The losses then wander
# apart at 1e-4 to 1e-3 over 20 steps: bounded, not a wrong gradient (a wrong gradient shows at
# step 1, which is held to 1e-5).
FP8_LOSS_TOL = 5e-3


def read_wfile(path):
    b = open(path, "rb").read()
    assert b[:4] == b"MPWT", "bad magic in %s" % path
    ver, count = struct.unpack_from("<II", b, 4)
    pos, out = 12, {}
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", b, pos); pos += 4
        name = b[pos:pos + nl].decode(); pos += nl
        (nd,) = struct.unpack_from("<I", b, pos); pos += 4
        shape = struct.unpack_from("<%dq" % nd, b, pos); pos += 8 * nd
        n = int(np.prod(shape))
        out[name] = np.frombuffer(b, dtype="<f4", count=n, offset=pos).reshape(shape).astype(np.float64)
        pos += 4 * n
    return out


def main():
    meshplan = os.path.abspath(sys.argv[1])
    quick = "--quick" in sys.argv
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl="self,vader", TMPDIR=tmp)
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    for k in ("TEST_PREMATURE_EXIT_FILE", "XML_OUTPUT_FILE", "GTEST_OUTPUT"):
        env.pop(k, None)
    mpirun = ["timeout", "-k", "10", "180", "mpirun", "-np", None, "--oversubscribe", "--bind-to", "none",
              "--mca", "btl", "self,vader", "--mca", "btl_vader_backing_directory", tmp]
    if os.getuid() == 0:
        mpirun.insert(5, "--allow-run-as-root")
    common = ["train", "--steps", str(STEPS), "--seq", "32", "--micro-batch", "2", "--global-batch", "8",
              "--lr", "3e-3", "--quiet"]

    def run(model, mesh, ac, fp8, tag):
        losses, grads = os.path.join(tmp, tag + ".losses.json"), os.path.join(tmp, tag + ".grads.bin")
        args = common + ["--model", model, "--ac", ac, "--dump-losses", losses, "--dump-grads", grads]
        if fp8:
            args.append("--fp8")
        np_ = 1
        if mesh:
            args += ["--mesh", mesh]
            np_ = 1
            for kv in mesh.split(","):
                k, v = kv.split("=")
                if k != "ep":
                    np_ *= int(v)
        if np_ == 1:
            cmd = ["timeout", "-k", "10", "180", meshplan] + args
        else:
            cmd = [c if c is not None else str(np_) for c in mpirun] + [meshplan] + args
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            return None, "exit %d: %s" % (p.returncode, (p.stderr or p.stdout).strip().splitlines()[-1:])
        return (json.load(open(losses))["losses"], read_wfile(grads)), None

    dense_meshes = ["dp_shard=4", "dp_replicate=2,dp_shard=2", "tp=2", "tp=4", "dp_shard=2,tp=2"]
    moe_meshes = dense_meshes + ["dp_shard=2,ep=2", "dp_shard=4,ep=4"]
    cases = []
    for model, meshes in (("tiny-dense", dense_meshes), ("tiny-moe", moe_meshes)):
        for ac in ("none", "selective", "full"):
            for mesh in meshes:
                cases.append((model, mesh, ac, False))
    cases.append(("tiny-dense", "dp_shard=2,tp=2", "selective", True))
    cases.append(("tiny-dense", "dp_shard=4", "none", True))
    if quick:
        cases = [c for c in cases if c[2] == "selective"]
    if "--fp8-only" in sys.argv:
        cases = [c for c in cases if c[3]]

    refs, fails, n_ok = {}, 0, 0
    for model, mesh, ac, fp8 in cases:
        key = (model, ac, fp8)
        if key not in refs:
            refs[key], err = run(model, None, ac, fp8, "%s-%s-%d-ref" % key)
            if err:
                print("FAIL reference %s ac=%s fp8=%d: %s" % (model, ac, fp8, err))
                fails += 1
                continue
        ref = refs[key]
        if ref is None:
            continue
        tag = "%s-%s-%s-%d" % (model, mesh.replace(",", "_").replace("=", ""), ac, fp8)
        got, err = run(model, mesh, ac, fp8, tag)
        name = "%-10s %-26s ac=%-9s fp8=%d" % (model, mesh, ac, fp8)
        if err:
            print("FAIL %s: %s" % (name, err))
            fails += 1
            continue
        (la, ga), (lb, gb) = ref, got
        ltol = FP8_LOSS_TOL if fp8 else TOL
        worst_l = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
        bad = [(i + 1, x, y) for i, (x, y) in enumerate(zip(la, lb)) if abs(x - y) > ltol * abs(x)]
        worst_g, worst_name = 0.0, ""
        for pname, g in ga.items():
            h = gb.get(pname)
            if h is None or h.shape != g.shape:
                bad.append(("grad", pname, "missing or wrong shape"))
                continue
            den = np.linalg.norm(g)
            rel = np.linalg.norm(g - h) / den if den > 0 else np.linalg.norm(h)
            if rel > worst_g:
                worst_g, worst_name = rel, pname
        if worst_g > TOL:
            bad.append(("grad", worst_name, worst_g))
        if bad or len(la) != len(lb):
            print("FAIL %s: %s" % (name, bad[:3]))
            fails += 1
        else:
            n_ok += 1
            print("ok   %s: %d losses within %.0e (worst %.1e; %.6f..%.6f), step-1 gradients worst rel %.1e (%s)"
                  % (name, len(lb), ltol, worst_l, lb[0], lb[-1], worst_g, worst_name))
    print("%d plans match, %d fail" % (n_ok, fails))
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
