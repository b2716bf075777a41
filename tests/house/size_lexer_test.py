"""size_test.py's scanner on C snippets whose functions are known: what it must count as a
function, where a function starts and ends, and what it must not take for one."""
import os
import tempfile
import unittest

import size_test as st


def body(n):
    """n statement lines."""
    return "".join("  x += %d;\n" % i for i in range(n))


class FunctionsTest(unittest.TestCase):
    def spans(self, text):
        return [(name, first, last) for name, first, last in st.functions(text)]

    def test_plain_and_multiline_signature(self):
        text = ("#include <stdio.h>\n"          # 1
                "/* f: a comment { */\n"        # 2
                "static int\n"                  # 3
                "f(int a,\n"                    # 4
                "  int b) {\n"                  # 5
                "  return a + b;\n"             # 6
                "}\n"                           # 7
                "int g(void) { return 1; }\n")  # 8
        self.assertEqual(self.spans(text), [("f", 3, 7), ("g", 8, 8)])

    def test_knr_signature(self):
        text = ("int\n"           # 1
                "add(a, b)\n"     # 2
                "  int a;\n"      # 3
                "  char *b;\n"    # 4
                "{\n"             # 5
                "  return a;\n"   # 6
                "}\n")            # 7
        self.assertEqual(self.spans(text), [("add", 1, 7)])

    def test_braces_in_strings_chars_and_comments(self):
        text = ("void f(void) {\n"                          # 1
                "  puts(\"}\\\" {\"); char c = '}';\n"      # 2
                "  char d = '\\'';  // }\n"                 # 3
                "  /* } */ if (c) { d = '{'; }\n"           # 4
                "}\n"                                       # 5
                "void g(void) {}\n")                        # 6
        self.assertEqual(self.spans(text), [("f", 1, 5), ("g", 6, 6)])

    def test_macro_tables_and_initializers_are_not_functions(self):
        text = ("#define TABLE(X) \\\n"                    # 1
                "  X(a, { 1, 2 }) \\\n"                     # 2
                "  X(b, { 3 })\n"                           # 3
                "#define F(x) static int x(void) { return 0; }\n"  # 4
                "static const int k[] = {1, 2, 3};\n"       # 5
                "static const struct { int a; } s = {(1)};\n"  # 6
                "struct pair { int a, b; };\n"              # 7
                "typedef enum { A = 1, B } e;\n"            # 8
                "int h(void) { return k[0]; }\n")           # 9
        self.assertEqual(self.spans(text), [("h", 9, 9)])

    def test_static_inline_in_header_and_attributes(self):
        text = ("#ifndef H\n#define H\n"                    # 1-2
                "static inline int sq(int x) {\n"           # 3
                "  return x * x;\n"                         # 4
                "}\n"                                       # 5
                "static void n(void) __attribute__((unused));\n"  # 6
                "__attribute__((noinline)) static void m(void) {\n"  # 7
                "}\n"                                       # 8
                "#endif\n")
        self.assertEqual(self.spans(text), [("sq", 3, 5), ("m", 7, 8)])

    def test_cplusplus_scopes(self):
        text = ("extern \"C\" {\n"                          # 1
                "int c_fn(void) { return 0; }\n"            # 2
                "}\n"                                       # 3
                "namespace {\n"                             # 4
                "struct S {\n"                              # 5
                "  int v = 0;\n"                            # 6
                "  S(int a) : v(a) {}\n"                    # 7
                "  int get() const {\n"                     # 8
                "    return v;\n"                           # 9
                "  }\n"                                     # 10
                "};\n"                                      # 11
                "template <int N = 1>\n"                    # 12
                "int t() { auto l = [](int x) { return x; }; return l(N); }\n"  # 13
                "auto tr(int x) -> int { return x; }\n"      # 14
                "void nx() noexcept(true) {}\n"              # 15
                "}  // namespace\n")
        self.assertEqual(self.spans(text),
                         [("c_fn", 2, 2), ("S", 7, 7), ("get", 8, 10), ("t", 12, 13),
                          ("tr", 14, 14), ("nx", 15, 15)])


class RuleTest(unittest.TestCase):
    def check(self, files, allow_text=""):
        with tempfile.TemporaryDirectory() as d:
            paths = {}
            for rel, text in files.items():
                p = os.path.join(d, rel)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as f:
                    f.write(text)
                paths[rel] = p
            allow = os.path.join(d, "allow.txt")
            with open(allow, "w") as f:
                f.write(allow_text)
            return st.check(paths, st.read_allowlist(allow))

    def test_planted_81_line_function_fails_and_80_passes(self):
        # signature line + 79 (or 78) statements + the closing brace
        at_limit = "int ok(void) {\n" + body(78) + "}\n"
        over = "int planted(void) {\n" + body(79) + "}\n"
        self.assertEqual(len(at_limit.splitlines()), 80)
        self.assertEqual(self.check({"app/a.c": at_limit}), 0)
        self.assertEqual(self.check({"app/a.c": over}), 1)
        self.assertEqual(st.offenders({"app/a.c": self._write(over)}),
                         [("app/a.c", 1, "planted", 81, 80)])

    def _write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".c", delete=False)
        self.addCleanup(os.unlink, f.name)
        f.write(text)
        f.close()
        return f.name

    def test_exempt_folders(self):
        over = "int planted(void) {\n" + body(90) + "}\n"
        for d in ("kernels/cpu", "third_party/x", "tests/plan"):
            self.assertEqual(self.check({d + "/a.c": over}), 0, d)

    def test_file_over_900_lines(self):
        text = "int x;\n" * 901
        self.assertEqual(self.check({"sim/big.c": text}), 1)
        self.assertEqual(self.check({"sim/big.c": text}, "sim/big.c <file> being split\n"), 0)

    def test_allowlist_is_exact(self):
        over = "int planted(void) {\n" + body(90) + "}\n"
        allow = "app/a.c planted being split elsewhere\n"
        self.assertEqual(self.check({"app/a.c": over}, allow), 0)
        # a listed function within its limit again, or gone: delete the line
        self.assertEqual(self.check({"app/a.c": "int planted(void) { return 0; }\n"}, allow), 1)
        self.assertEqual(self.check({"app/b.c": "int y;\n"}, allow), 1)


if __name__ == "__main__":
    unittest.main()
