"""What the CLI test scripts share: run the meshplan binary (cli_check.BIN) and record a
failure when its exit status is not the one wanted, or when a check does not hold; each
script prints `fails` at its end and exits 1 when there are any."""
import os
import subprocess
import tempfile

BIN = None
fails = []


def run(*args, want_rc=0):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)
    if p.returncode != want_rc:
        fails.append(f"meshplan {' '.join(args)}: exit {p.returncode}, want {want_rc}: {p.stderr.strip()}")
    return p


def check(cond, what):
    if not cond:
        fails.append(what)


def validate_csv(text, want_rc=0):
    """validate --json over a scratch CSV holding `text` (a header and its rows)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rows.csv")
        with open(path, "w") as fh:
            fh.write(text)
        return run("validate", path, "--json", want_rc=want_rc)
