#!/usr/bin/python3
"""Checks that what README.md and docs/*.md cite exists in the tree.

Every claim in the docs names the test that shows it; this keeps the names
true. It checks, in README.md and docs/*.md:
  * every Bazel label `//pkg:target` (and `//pkg/...`) names a target or file
    that exists (a `name = "target"` in pkg/BUILD.bazel, or a file in pkg);
  * every gtest name `Suite.Test`, `Prefix/Suite.Test` or `Suite.*` names a
    TEST/TEST_F/TEST_P in the C++ sources (a `A.B` that is no test is accepted
    only when A is no test suite and both A and B are identifiers of the code);
  * every Go `TestName` and Python `test_name` in backquotes is a test function
    (or, for Python, a test file) of the tree;
  * every other CamelCase name in backquotes that looks like a test name (at
    least three capitalised words, no `::`) is an identifier of the code, so a
    renamed test is caught;
  * every `--flag` is a flag of pserver (cc/server/main.cc), psctl
    (go/cmd/psctl), another binary of the tree (any ABSL_FLAG), or one of the
    outside tools' flags listed in OUTSIDE_FLAGS;
  * in every table row whose first cell is one `--flag` of pserver and whose
    second cell is its default, that default equals pserver's (`--helpfull`
    of the binary given with --pserver);
  * every flag of pserver is in docs/operations.md;
  * every path of the tree they name (`cc/server/move.h`, `docs/x.md`)
    exists;
  * every table row has as many cells as its header (Markdown hides the
    rest), and every row of docs/limits.md's tables with a Test column names
    a test (or says why it has none); a flag it names exists;
  * psctl's `-flag`s on lines about psctl are psctl's (go/cmd/psctl).

Usage: doccheck.py --root DIR [--pserver PATH]. Exit status 0 when all holds;
else 1, one line per problem: `file:line: what is wrong`.
"""

import argparse
import os
import re
import subprocess
import sys

SOURCE_DIRS = ("cc", "tests", "go", "python", "bench", "bindings", "tools",
               "examples", "packaging", "deploy", "proto")
CODE_EXT = (".cc", ".h", ".go", ".py", ".sh", ".proto", ".bzl", ".i", ".c",
            ".cu", ".ipynb")

# Flags of tools outside the tree that the docs cite (only these: a name here
# passes the check wherever it is written).
OUTSIDE_FLAGS = {
    "config", "define", "runs_per_test", "test_output", "test_filter",
    "test_arg", "jobs", "local_ram_resources", "nocache_test_results",  # bazel
    "endpoints", "name",  # etcd, etcdctl, podman
    "entrypoint", "network", "rm", "runtime", "ulimit",  # podman / docker
    "nodes", "overlap",  # srun
    "cflags", "libs",  # pkg-config
    "decode", "python_out",  # protoc
    "fmad",  # nvcc
    "nofile",  # prlimit
    "user",  # pip
    "flagfile", "help", "helpfull",  # abseil's own, which pserver has too
}

OPERATIONS = "docs/operations.md"  # the table of every pserver flag
LABEL = re.compile(r"(?<![\w:/.])//([A-Za-z0-9_./-]*)(?::([A-Za-z0-9_.+/-]+))?")
BACKQUOTED = re.compile(r"`([^`\n]+)`")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)(?![\w-])")
PSCTL_FLAG = re.compile(r"(?<![\w-])-([a-z][a-z0-9_]*)(?![\w-])")
GTEST = re.compile(
    r"\b(?:TYPED_)?TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)")
INSTANTIATE = re.compile(
    r"INSTANTIATE_(?:TYPED_)?TEST_(?:SUITE|CASE)_P\(\s*(\w+)\s*,\s*(\w+)")
SCRIPT_FLAG = re.compile(
    r"^\s*(?:\|\s*)?--([a-z][a-z0-9_]*)(?:=\*)?\)", re.M)  # sh: `--x) ...`
ARGPARSE_FLAG = re.compile(r"add_argument\(\s*\"--([a-z][a-z0-9_]*)\"")
GO_TEST = re.compile(r"^func (Test\w+)\(", re.M)
PY_TEST = re.compile(r"^\s*(?:async\s+)?def (test_\w+)\(", re.M)
C_TEST = re.compile(r"^(?:static\s+)?(?:void|int)\s+(test_\w+)\(", re.M)
ABSL_FLAG = re.compile(r"ABSL_FLAG\(\s*[\w:<>, ]+?,\s*(\w+)\s*,", re.S)
GO_FLAG = re.compile(
    r"\b(?:fs|flag|flags)\.(?:String|Int|Int64|Uint|Uint64|Bool|Duration|"
    r"Float64|Var|StringVar|IntVar|BoolVar|DurationVar|Float64Var)\(\s*"
    r"(?:&[^,()]+,\s*)?\"([a-z][a-z0-9_]*)\"")
# A path of the tree in the docs: `cc/server/move.h`, `cc/core/optimizer.{h,cc}`
# (a stem stands for its files), `bench/tls_link` (a binary of bench/).
DOC_PATH = re.compile(
    r"(?<![\w/.:-])((?:%s)/[\w./-]*\w)(?![<\w])(\.\{[\w,]+\})?" %
    "|".join(re.escape(d) for d in SOURCE_DIRS + ("docs",)))
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CAMEL_WORD = re.compile(r"[A-Z][a-z0-9]+")


class Tree:
  """What the source tree defines: targets, tests, flags, identifiers."""

  def __init__(self, root):
    self.root = root
    self.packages = {}  # package path -> set of target names
    self.gtests = set()  # "Suite.Name"
    self.suites = set()
    self.instantiations = set()  # "Prefix/Suite"
    self.go_tests = set()
    self.py_tests = set()
    self.py_test_files = set()
    self.c_tests = set()  # C ABI tests: `static void test_x(...)`
    self.idents = set()
    self.absl_flags = {}  # flag -> set of files
    self.go_flags = {}
    self.script_flags = set()  # shell scripts' and Python tools' options
    self.paths = set()  # every file and folder below the source folders
    self._walk()

  def _walk(self):
    for top in [""] + list(SOURCE_DIRS):
      base = os.path.join(self.root, top)
      if not os.path.isdir(base):
        continue
      for dirpath, dirnames, filenames in os.walk(base):
        rel = os.path.relpath(dirpath, self.root)
        dirnames[:] = [d for d in dirnames
                       if not d.startswith((".", "bazel-")) and
                       d not in ("third_party", "node_modules")]
        if top == "":
          dirnames[:] = []  # the root's own files only
        else:
          self.paths.add(rel)
          self.paths.update(os.path.join(rel, f) for f in filenames)
        if "BUILD.bazel" in filenames or "BUILD" in filenames:
          self._read_build(rel if rel != "." else "", dirpath, filenames)
        for f in filenames:
          if f.endswith(CODE_EXT):
            self._read_code(os.path.join(dirpath, f), f)

  def _read_build(self, pkg, dirpath, filenames):
    names = set(filenames)
    for b in ("BUILD.bazel", "BUILD"):
      path = os.path.join(dirpath, b)
      if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
          # Every string literal: targets made by loops over lists of names
          # (for name in ["a_test", ...]) count too.
          names.update(re.findall(r"\"([A-Za-z0-9_.+-]+)\"", fh.read()))
    # Files in subfolders that belong to this package (no BUILD of their own).
    for sub in os.listdir(dirpath):
      subpath = os.path.join(dirpath, sub)
      if os.path.isdir(subpath) and not os.path.exists(
          os.path.join(subpath, "BUILD.bazel")):
        for d, _, fs in os.walk(subpath):
          for f in fs:
            names.add(os.path.relpath(os.path.join(d, f), dirpath))
    self.packages[pkg] = names

  def _read_code(self, path, name):
    try:
      with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    except OSError:
      return
    self.idents.update(IDENT.findall(text))
    if name.endswith((".cc", ".h", ".cu")):
      for suite, test in GTEST.findall(text):
        self.gtests.add(suite + "." + test)
        self.suites.add(suite)
      for prefix, suite in INSTANTIATE.findall(text):
        self.instantiations.add(prefix + "/" + suite)
      for flag in ABSL_FLAG.findall(text):
        self.absl_flags.setdefault(flag, set()).add(path)
    elif name.endswith(".go"):
      if name.endswith("_test.go"):
        self.go_tests.update(GO_TEST.findall(text))
      for flag in GO_FLAG.findall(text):
        self.go_flags.setdefault(flag, set()).add(path)
    elif name.endswith(".c"):
      self.c_tests.update(C_TEST.findall(text))
    elif name.endswith(".sh"):
      self.script_flags.update(SCRIPT_FLAG.findall(text))
    elif name.endswith(".py"):
      self.script_flags.update(ARGPARSE_FLAG.findall(text))
      if name.startswith("test_") or name.endswith("_test.py"):
        self.py_test_files.add(name[:-3])
        self.py_tests.update(PY_TEST.findall(text))


def pserver_defaults(binary):
  """Flag -> default as `pserver --helpfull` prints it."""
  out = subprocess.run([binary, "--helpfull"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, check=False,
                       timeout=60).stdout.decode("utf-8", "replace")
  defaults = {}
  section = False
  # Sections start "  Flags from FILE:"; a flag's entry starts "    --name (",
  # runs over lines, and ends "; default: VALUE;" (the default may start a
  # line of its own).
  for part in re.split(r"\n(?=  Flags from |    --\w+ \()", out):
    m = re.match(r"  Flags from ([^:\n]+):", part)
    if m:
      section = m.group(1).strip().endswith("cc/server/main.cc")
      continue
    entry = part.split("\n\n", 1)[0]  # the last one is followed by a footer
    m = re.match(r"    --(\w+) \(.*;\s+default: (.*?);\s*$", entry, re.S)
    if m and section:
      defaults[m.group(1)] = m.group(2).strip().strip('"')
  return defaults


UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def doc_default_values(cell):
  """The values a doc's default cell may mean: `64 MiB`, `1073741824 (1 GiB)`,
  `0600`, `false`, `-1` (off), `5 per 10 s`. None when it states none."""
  cell = cell.replace("`", "").strip()
  if not cell or cell.startswith("("):
    return None  # (none), (--host), (constant ...)
  m = re.match(r"(-?\d+(?:\.\d+)?)\s*(KiB|MiB|GiB|TiB)\b", cell)
  if m:
    return {str(int(float(m.group(1)) * UNITS[m.group(2)]))}
  m = re.match(r"2\^(\d+)", cell)
  if m:
    return {str(1 << int(m.group(1)))}
  return {cell.split()[0].rstrip(",;")}


def same_default(doc_values, actual):
  for v in doc_values:
    if v == actual:
      return True
    try:
      if float(v) == float(actual):
        return True
    except ValueError:
      pass
  return False


def looks_like_test_name(word):
  """A CamelCase sentence of three or more words: how tests here are named."""
  return (re.fullmatch(r"[A-Z][A-Za-z0-9]+", word) is not None and
          len(CAMEL_WORD.findall(word)) >= 3 and
          not word.isupper() and not word.endswith(("Request", "Reply",
                                                     "Options", "Config",
                                                     "Record", "Info")))


class Checker:

  def __init__(self, tree, pserver_flags):
    self.tree = tree
    self.pserver_flags = pserver_flags  # flag -> default, or None
    self.problems = []
    self.counts = {"labels": 0, "gtests": 0, "go_tests": 0, "py_tests": 0,
                   "names": 0, "flags": 0, "psctl_flags": 0, "paths": 0, "defaults": 0, "limit_rows": 0}
    flags = set(tree.absl_flags) | set(tree.go_flags) | tree.script_flags
    if pserver_flags:
      flags |= set(pserver_flags)
    self.known_flags = flags

  def problem(self, where, what):
    self.problems.append("%s: %s" % (where, what))

  def check_label(self, where, pkg, target):
    self.counts["labels"] += 1
    if pkg.endswith("/...") or pkg == "...":
      path = pkg[:-3].rstrip("/")
      if not os.path.isdir(os.path.join(self.tree.root, path)):
        self.problem(where, "//%s: no folder %s" % (pkg, path or "."))
      return
    if pkg not in self.tree.packages:
      self.problem(where, "//%s%s: no package %s (no BUILD.bazel)" %
                   (pkg, ":" + target if target else "", pkg))
      return
    name = target if target else pkg.rsplit("/", 1)[-1]
    if name == "all" or name == "*":
      return
    if name not in self.tree.packages[pkg]:
      self.problem(where, "//%s:%s: no such target or file" % (pkg, name))

  def check_gtest(self, where, ref):
    self.counts["gtests"] += 1
    prefix = None
    if "/" in ref:
      prefix, ref = ref.split("/", 1)
    suite, test = ref.split(".", 1)
    if prefix and prefix + "/" + suite not in self.tree.instantiations:
      self.problem(where, "`%s/%s`: no INSTANTIATE_TEST_SUITE_P(%s, %s, ...)"
                   % (prefix, ref, prefix, suite))
    if test == "*":
      if suite not in self.tree.suites:
        self.problem(where, "`%s.*`: no test suite %s" % (suite, suite))
      return
    if suite + "." + test in self.tree.gtests:
      return
    if suite in self.tree.suites:
      self.problem(where, "`%s.%s`: suite %s has no test %s" %
                   (suite, test, suite, test))
    elif suite.endswith("Test") or not (
        suite in self.tree.idents and test in self.tree.idents):
      self.problem(where, "`%s.%s`: no such test (TEST/TEST_F/TEST_P)" %
                   (suite, test))

  def check_backquoted(self, where, span, line):
    for m in re.finditer(
        r"(?<![\w:.])((?:[A-Z]\w*/)?[A-Z]\w*)\.([A-Z]\w*|\*)(?![\w(])", span):
      if re.search(r"\.(md|cc|h|go|py|proto|sh|json|bzl)\b", span):
        break
      self.check_gtest(where, m.group(1) + "." + m.group(2))
    for word in re.findall(r"(?<![\w.:/])(Test[A-Z]\w+)(?![\w.(])", span):
      self.counts["go_tests"] += 1
      if word not in self.tree.go_tests:
        if word in self.tree.gtests or word in self.tree.idents:
          continue
        self.problem(where, "`%s`: no Go test func %s" % (word, word))
    for word in re.findall(r"(?<![\w.:/])(test_\w+)(?![\w.(])", span):
      self.counts["py_tests"] += 1
      if word not in (self.tree.py_tests | self.tree.py_test_files |
                      self.tree.c_tests):
        self.problem(where, "`%s`: no Python or C test %s" % (word, word))
    if "psctl" in line and (span.startswith("psctl") or span.startswith("-")):
      for flag in PSCTL_FLAG.findall(span):
        self.counts["psctl_flags"] += 1
        if flag not in self.tree.go_flags and flag not in ("h", "help"):
          self.problem(where, "`%s`: psctl has no flag -%s" % (span, flag))
    if re.fullmatch(r"[A-Z][A-Za-z0-9]+", span.strip()) and \
        looks_like_test_name(span.strip()):
      self.counts["names"] += 1
      if span.strip() not in self.tree.idents:
        self.problem(where, "`%s`: named nowhere in the code (a test renamed?)"
                     % span.strip())

  def check_path(self, where, path):
    self.counts["paths"] += 1
    tree = self.tree
    if path in tree.paths or os.path.exists(os.path.join(tree.root, path)):
      return
    # A stem (`cc/core/checkpoint` for its .h and .cc), or a path relative to
    # a folder named just before it (`bindings/ ... python/pserver.i`).
    if any(p.startswith(path + ".") or p.endswith("/" + path)
           for p in tree.paths):
      return
    self.problem(where, "%s: no such file or folder" % path)

  def check_flag(self, where, flag):
    self.counts["flags"] += 1
    if flag in self.known_flags or flag in OUTSIDE_FLAGS:
      return
    if flag.endswith("_") and any(f.startswith(flag) for f in self.known_flags):
      return  # `--tls_*`
    self.problem(where, "--%s: no such flag (pserver, psctl, any ABSL_FLAG, a "
                 "script's option, OUTSIDE_FLAGS)"
                 % flag)

  def check_server_flags(self, where, cell, what):
    """The --flags of `cell` (a row about the server) are pserver's."""
    flags = self.pserver_flags if self.pserver_flags is not None else \
        self.known_flags
    for flag in FLAG.findall(cell):
      if flag not in flags:
        self.problem(where, "%s names --%s, which pserver has not" %
                     (what, flag))

  def check_default_row(self, where, cells):
    if self.pserver_flags is None or len(cells) < 2:
      return
    m = re.fullmatch(r"`--(\w+)`", cells[0].strip())
    if not m or m.group(1) not in self.pserver_flags:
      return
    values = doc_default_values(cells[1])
    if values is None:
      return
    self.counts["defaults"] += 1
    actual = self.pserver_flags[m.group(1)]
    if not same_default(values, actual):
      self.problem(where, "--%s: the doc says default %s, pserver --helpfull "
                   "says %s" % (m.group(1), cells[1].strip(), actual))

  def check_limit_row(self, where, cells, header):
    if "Test" not in header or len(cells) != len(header):
      return
    self.counts["limit_rows"] += 1
    if "Flag" in header:
      self.check_server_flags(where, cells[header.index("Flag")], "limits row")
    test_cell = cells[header.index("Test")]
    if not test_cell.strip():
      self.problem(where, "limits row names no test")
    # A bare name in the Test column must be a test, not any identifier.
    gtest_names = {t.split(".", 1)[1] for t in self.tree.gtests}
    for span in BACKQUOTED.findall(test_cell):
      if re.fullmatch(r"[A-Z]\w+", span) and span not in gtest_names and \
          span not in self.tree.go_tests and span not in self.tree.suites:
        self.problem(where, "limits row's test `%s` is no test of the tree"
                     % span)

  def check_every_flag_documented(self, root):
    """Every pserver flag has its row in docs/operations.md."""
    if self.pserver_flags is None:
      return
    path = os.path.join(root, OPERATIONS)
    if not os.path.exists(path):
      self.problem(OPERATIONS, "missing: it lists every pserver flag")
      return
    with open(path, encoding="utf-8") as fh:
      cited = set(FLAG.findall(fh.read()))
    for flag in sorted(set(self.pserver_flags) - cited):
      self.problem(OPERATIONS, "pserver's --%s is not in its flag table" % flag)

  def check_doc(self, path, rel):
    with open(path, encoding="utf-8") as fh:
      lines = fh.read().split("\n")
    header = None
    in_code = False
    for i, line in enumerate(lines, 1):
      where = "%s:%d" % (rel, i)
      if line.lstrip().startswith("```"):
        in_code = not in_code
      for m in LABEL.finditer(line):
        pkg, target = m.group(1), (m.group(2) or "").rstrip(".")
        if not pkg.endswith("..."):
          pkg = pkg.rstrip("/.")
        if pkg or target:  # not a `// comment`
          self.check_label(where, pkg, target)
      for m in FLAG.finditer(line):
        self.check_flag(where, m.group(1))
      for m in DOC_PATH.finditer(line):
        self.check_path(where, m.group(1))
      if not in_code:
        for span in BACKQUOTED.findall(line):
          self.check_backquoted(where, span, line)
      elif re.search(r"\bpsctl\b", line):
        # A command line: what follows psctl, up to a comment.
        command = re.split(r"\bpsctl\b", line)[-1].split(" #")[0]
        self.check_backquoted(where, "psctl" + command, line)
      if line.startswith("|"):
        cells = [c for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
          continue
        if header is None:
          header = [c.strip() for c in cells]
          continue
        if len(cells) != len(header):
          # Markdown drops cells past the header's: a claim or its test
          # would not show.
          self.problem(where, "table row of %d cells under a header of %d"
                       % (len(cells), len(header)))
        self.check_default_row(where, cells)
        if rel == OPERATIONS and header[0] == "flag":
          self.check_server_flags(where, cells[0], "server flag row")
        if rel == "docs/limits.md":
          self.check_limit_row(where, cells, header)
      else:
        header = None


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--root", required=True)
  parser.add_argument("--pserver", help="pserver binary, for flag defaults")
  args = parser.parse_args()
  root = os.path.realpath(args.root)
  if not os.path.exists(os.path.join(root, "WORKSPACE")):
    print("doccheck: %s is not the repository root (no WORKSPACE)" % root)
    return 2
  tree = Tree(root)
  flags = pserver_defaults(args.pserver) if args.pserver else None
  if args.pserver and not flags:
    print("doccheck: %s --helpfull listed no flags of cc/server/main.cc" %
          args.pserver)
    return 2
  checker = Checker(tree, flags)
  docs = ["README.md"] + sorted(
      os.path.join("docs", f) for f in os.listdir(os.path.join(root, "docs"))
      if f.endswith(".md"))
  for rel in docs:
    checker.check_doc(os.path.join(root, rel), rel)
  checker.check_every_flag_documented(root)
  for problem in checker.problems:
    print(problem)
  print("doccheck: %d files; checked %s; %d problems" % (
      len(docs), ", ".join("%d %s" % (v, k) for k, v in
                           sorted(checker.counts.items())),
      len(checker.problems)))
  return 1 if checker.problems else 0


if __name__ == "__main__":
  sys.exit(main())
