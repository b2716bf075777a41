#!/usr/bin/env python3
"""Every option a command's --help shows is documented: runs `meshplan --help` for the
command list, then each command's --help, takes every `--option` that opens one of its
option lines (the options the command takes; a framework's flag quoted in a description,
such as Megatron-LM's --fp8-dot-product-attention, is not one) and fails naming each one
docs/usage.md does not mention (as `--option` followed by a character that cannot continue
an option name, so `--fp8` is not found inside `--fp8-dpa`).

Usage: help_docs_test.py MESHPLAN USAGE_MD"""
import re
import subprocess
import sys

BIN, DOC = sys.argv[1], sys.argv[2]
OPT = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
# an option line of --help: two spaces, the option, its argument and description
LINE = re.compile(r"^  (--[a-z0-9][a-z0-9-]*)(?![\w-])")


def help_text(*cmd):
    r = subprocess.run([BIN, *cmd, "--help"], capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


def commands():
    """The command names `meshplan --help` lists under "commands:"."""
    out, names, on = help_text(), [], False
    for ln in out.splitlines():
        if ln.strip() == "commands:":
            on = True
        elif on and re.match(r"^  [a-z]+ ", ln):
            names.append(ln.split()[0])
    return names


def main():
    doc = open(DOC, encoding="utf-8").read()
    documented = set(OPT.findall(doc))
    cmds = commands()
    # the command list is the test's input: too few and the test checks nothing
    if len(cmds) < 8:
        print(f"FAIL: meshplan --help lists {len(cmds)} commands: {cmds}")
        return 1
    missing = {}
    for cmd in cmds:
        opts = {m.group(1) for m in map(LINE.match, help_text(cmd).splitlines()) if m}
        if not opts:
            print(f"FAIL: meshplan {cmd} --help names no option")
            return 1
        for o in sorted(opts - documented - {"--help"}):
            missing.setdefault(o, []).append(cmd)
    for o, cs in sorted(missing.items()):
        print(f"FAIL: {o} (meshplan {', '.join(cs)} --help) is not in docs/usage.md")
    if missing:
        return 1
    print(f"ok: every option of {len(cmds)} commands' --help is in docs/usage.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
