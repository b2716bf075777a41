#!/usr/bin/env python3
"""House rule: no function outside kernels/ over 80 lines, no file outside kernels/ over 900.

A function's length counts from the first line of its signature (the return type) to its
closing brace; a file's, its lines. kernels/, third_party/ and tests/ are exempt. The
offenders that others are splitting now stand in size_allowlist.txt, one line each with
its reason; the test fails for any offender not listed there and for any listed line that
no longer offends (delete it: the list only shrinks).

Under `bazel test` the files are the test's data (each package's house_sources filegroup,
tests/house/defs.bzl); the test also follows one of them back to the source tree and fails
if a folder there holds C sources that no filegroup brings. Run by hand it walks a tree:
  tests/house/size_test.py --root .
  tests/house/size_test.py path/to/file.c ...   (those files, exemptions still applied)

The scan is a small C lexer, not a compiler: comments, string and character literals and
preprocessor directives with their continuation lines (so a macro that defines a table or
a function is neither) are blanked first; then at file scope (and inside extern "C", namespaces and class bodies) a
'{' opens a function body when the declaration before it ends in ')' (after C++ qualifiers
and __attribute__) or, K&R style, in parameter declarations after ')'; a '{' after '=' is
an initializer. Static inline functions in headers count like any other.
"""
import os
import re
import subprocess
import sys

MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 900
EXEMPT_DIRS = ("kernels/", "third_party/", "tests/")
SOURCE_EXTS = (".c", ".h", ".cc", ".cu", ".cuh", ".cpp", ".hpp")
ALLOWLIST = "size_allowlist.txt"
FILE_ENTRY = "<file>"  # the allowlist's name column for a file over the limit


def is_exempt(path):
    return path.startswith(EXEMPT_DIRS)


# ---- lexing ------------------------------------------------------------------------------

def blank(text):
    """text with comments, string/char literals and preprocessor lines replaced by spaces
    (newlines kept, so offsets keep their line numbers); a literal keeps its quotes so that
    `extern "C"` still reads as one."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True  # only whitespace since the last newline (outside comments)
    in_directive = False

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            in_directive = False
            i += 1
            continue
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":  # line continuation
            if in_directive:
                out[i] = " "
            i += 2
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            wipe(i, j)
            i = j
            continue
        if text.startswith("//", i):
            j = i
            while j < n and text[j] != "\n":  # a '\' before the newline continues it
                j += 2 if text.startswith("\\\n", j) else 1
            wipe(i, j)
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            wipe(i, j)
            if not in_directive:  # keep the quotes: `extern "C"` must still read as one
                out[i] = out[j - 1] = c
            i = j
            continue
        if c == "#" and line_start:
            in_directive = True
        if in_directive:
            out[i] = " "
        elif not c.isspace():
            line_start = False
        i += 1
    return "".join(out)


# ---- function bodies ---------------------------------------------------------------------

_TAIL_WORD = re.compile(r"(?:\b(?:const|volatile|noexcept|override|final)|&)$")
_TAIL_CALL = re.compile(r"\b(?:__attribute__|throw|noexcept)\s*$")
_TAIL_RETURN = re.compile(r"\)\s*->[\w:<>,\s\*&]+$")
_KR_PARAMS = re.compile(r"\)\s*(?:[^;{}()=]+;\s*)+$", re.S)
_NAME_BEFORE_PARENS = re.compile(r"([~\w:]+|operator\s*\S+)\s*$")


_PAIRS = {"(": (")", 1), "{": ("}", 1), ")": ("(", -1), "}": ("{", -1)}


def _match(text, at):
    """Index of the bracket that pairs with the one at text[at] (forward from an opening
    one, backward from a closing one); -1 where there is none."""
    this = text[at]
    other, step = _PAIRS[this]
    depth = 0
    k = at
    while 0 <= k < len(text):
        if text[k] == this:
            depth += 1
        elif text[k] == other:
            depth -= 1
            if depth == 0:
                return k
        k += step
    return -1


def _function_name(head, close):
    """The declarator name before the parameter list that closes at head[close]."""
    open_ = _match(head, close)
    if open_ < 0:
        return None
    m = _NAME_BEFORE_PARENS.search(head[:open_])
    return m.group(1) if m else None


def _strip_template_params(head):
    """head without a leading C++ `template <...>` (its default arguments hold '=')."""
    m = re.match(r"\s*template\s*<", head)
    if not m:
        return head
    depth = 0
    for k in range(m.end() - 1, len(head)):
        depth += head[k] == "<"
        depth -= head[k] == ">"
        if depth == 0:
            return _strip_template_params(head[k + 1:])
    return head


def _strip_ctor_initializers(head):
    """head up to a C++ constructor's ` : member(x), ...` list."""
    depth = 0
    for k, ch in enumerate(head):
        depth += ch == "("
        depth -= ch == ")"
        if (ch == ":" and depth == 0 and head[:k].rstrip().endswith(")")
                and head[k - 1:k] != ":" and head[k + 1:k + 2] != ":"):
            return head[:k]
    return head


def _strip_qualifiers(h):
    """h without what may follow a parameter list: C++ qualifiers (const, noexcept, &, a
    trailing `-> type`...) and __attribute__((...)), so a function's head ends in ')'."""
    while True:
        h = h.rstrip()
        m = _TAIL_WORD.search(h) or _TAIL_RETURN.search(h)
        if m:
            h = h[: m.start() + (1 if h[m.start()] == ")" else 0)]
            continue
        if h.endswith(")"):
            open_ = _match(h, len(h) - 1)
            call = _TAIL_CALL.search(h[:open_]) if open_ > 0 else None
            if call:
                h = h[: call.start()]
                continue
        return h


def _classify(head):
    """('function', name) | ('init', None) | ('scope', None) for a '{' at declaration scope
    whose declaration so far is head (from the last ';', '{' or '}' there)."""
    head = _strip_ctor_initializers(_strip_template_params(head))
    depth = 0
    for ch in head:  # '=' outside parentheses: an initializer (C++ `operator=` aside)
        depth += ch == "("
        depth -= ch == ")"
        if ch == "=" and depth == 0 and not re.search(r"operator\s*[=!<>+\-*/%&|^]*=", head):
            return ("init", None)
    h = _strip_qualifiers(head)
    if h.endswith(")"):
        return ("function", _function_name(h, len(h) - 1))
    return ("scope", None)


def functions(text):
    """[(name, first_line, last_line)] of the function bodies in text (1-based lines)."""
    code = blank(text)
    line_of = _line_index(code)
    found = []
    n = len(code)
    decl_start = 0  # where the declaration being read at this scope began
    prev_end = 0  # just after the previous ';', '{' or '}' at declaration scope
    i = 0
    while i < n:
        c = code[i]
        if c == ";":
            prev_end = i + 1
        elif c == "}":  # a scope's end (bodies and initializers are skipped whole)
            decl_start = prev_end = i + 1
        elif c == "{":
            head = code[prev_end:i]
            kind, name = _classify(head)
            start = prev_end
            if kind == "scope" and not head.strip() and prev_end > 0 and code[prev_end - 1] == ";":
                kr = code[decl_start:i]  # K&R: `int f(a, b) int a; char *b; {`
                m = _KR_PARAMS.search(kr)
                if m and "(" in kr[: m.start() + 1]:
                    kind, name = "function", _function_name(kr, m.start())
                    start = decl_start
            if kind == "scope":
                decl_start = prev_end = i + 1
            else:
                close = _match(code, i)
                if close < 0:  # unbalanced (a brace inside #if branches): to the end
                    close = len(code) - 1
                if kind == "function":
                    first = start + (len(code[start:i]) - len(code[start:i].lstrip()))
                    found.append((name or "?", line_of(first), line_of(close)))
                i = close
                decl_start = prev_end = i + 1
                if kind == "init":  # the rest of the declaration runs to its ';'
                    decl_start = prev_end = _declaration_end(code, i)
        i += 1
    return found


def _declaration_end(code, after):
    k = code.find(";", after)
    return len(code) if k < 0 else k + 1


def _line_index(code):
    starts = [0] + [m.end() for m in re.finditer("\n", code)]

    def line_of(offset):
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    return line_of


# ---- the rule ----------------------------------------------------------------------------

def offenders(files):
    """files: {relative path: absolute path}. [(path, line, name, length, limit)]; name is
    FILE_ENTRY for a file over its limit."""
    out = []
    for rel in sorted(files):
        if is_exempt(rel) or not rel.endswith(SOURCE_EXTS):
            continue
        with open(files[rel], encoding="utf-8", errors="replace") as f:
            text = f.read()
        n_lines = len(text.splitlines())
        if n_lines > MAX_FILE_LINES:
            out.append((rel, 1, FILE_ENTRY, n_lines, MAX_FILE_LINES))
        for name, first, last in functions(text):
            if last - first + 1 > MAX_FUNCTION_LINES:
                out.append((rel, first, name, last - first + 1, MAX_FUNCTION_LINES))
    return out


def read_allowlist(path):
    """{(path, name): reason} from lines `PATH NAME REASON...` ('#' starts a comment)."""
    allowed = {}
    with open(path, encoding="utf-8") as f:
        for k, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 2)
            if len(parts) < 3:
                raise SystemExit("%s:%d: want PATH NAME REASON, got %r" % (path, k, line))
            allowed[(parts[0], parts[1])] = parts[2]
    return allowed


def check(files, allowed, coverage_gaps=()):
    """Prints every problem; returns how many."""
    problems = 0
    seen = set()
    for rel, line, name, length, limit in offenders(files):
        seen.add((rel, name))
        if (rel, name) in allowed:
            continue
        what = "file" if name == FILE_ENTRY else "function %s" % name
        print("%s:%d: %s is %d lines (limit %d): split it into parts named for what "
              "they do" % (rel, line, what, length, limit))
        problems += 1
    for (rel, name), reason in sorted(allowed.items()):
        if (rel, name) not in seen:
            if rel in files:
                print("%s: %s %s is within its limit now; delete its line from %s"
                      % (rel, "file" if name == FILE_ENTRY else "function", name, ALLOWLIST))
            else:
                print("%s: allowlisted (%s) but not among the files checked; delete or fix "
                      "its line in %s" % (rel, name, ALLOWLIST))
            problems += 1
    for d in coverage_gaps:
        print("%s/: C sources that this test does not see; add `house_sources()` (from "
              "//tests/house:defs.bzl) to %s/BUILD and list it in tests/house/BUILD" % (d, d))
        problems += 1
    return problems


# ---- where the files come from -----------------------------------------------------------

def tree_files(root):
    """Every source file under root (git ls-files where root is a checkout, else a walk)."""
    try:
        names = subprocess.run(["git", "-C", root, "ls-files", "--cached", "--others",
                                "--exclude-standard"], check=True, capture_output=True,
                               text=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        names = []
        for d, subdirs, fs in os.walk(root):
            subdirs[:] = [s for s in subdirs if not s.startswith((".", "bazel-"))]
            names += [os.path.relpath(os.path.join(d, f), root) for f in fs]
    return {p: os.path.join(root, p) for p in names
            if p.endswith(SOURCE_EXTS) and os.path.isfile(os.path.join(root, p))}


def coverage_gaps(files):
    """Folders of the source tree behind the runfiles with non-exempt C sources that are
    not among files (a package whose BUILD lacks house_sources()). Empty where the tree
    cannot be found from here (a remote sandbox): the data are then all there is."""
    some = next((p for p in sorted(files) if os.path.islink(files[p])), None)
    if some is None:
        return []
    real = os.path.realpath(files[some])
    if not real.endswith(os.sep + some):
        return []
    root = real[: -len(some) - 1]
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        return []
    tree = tree_files(root)
    return sorted({os.path.dirname(p) for p in tree if not is_exempt(p) and p not in files})


def tree_files_from_runfiles():
    root = os.getcwd()
    files = {}
    for d, subdirs, fs in os.walk(root):
        subdirs[:] = [s for s in subdirs if s not in ("external", "_solib_k8") and not s.startswith(".")]
        for f in fs:
            rel = os.path.relpath(os.path.join(d, f), root)
            if rel.endswith(SOURCE_EXTS):
                files[rel] = os.path.join(d, f)
    return files


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    allowlist = os.path.join(here, ALLOWLIST)
    gaps = []
    if argv[:1] == ["--root"] and len(argv) == 2:
        files = tree_files(argv[1])
    elif argv:
        files = {os.path.normpath(p): p for p in argv}
    else:  # bazel test: the data, relative to the runfiles root (the working directory)
        files = tree_files_from_runfiles()
        gaps = coverage_gaps(files)
    problems = check(files, read_allowlist(allowlist), gaps)
    checked = sum(1 for p in files if not is_exempt(p))
    print("size_test: %d source files checked (functions <= %d lines, files <= %d), %d problem%s"
          % (checked, MAX_FUNCTION_LINES, MAX_FILE_LINES, problems, "" if problems == 1 else "s"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
