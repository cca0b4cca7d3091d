#!/usr/bin/python3
"""doccheck.py on small made-up trees: a tree whose docs cite only what exists
passes; each kind of stale citation is reported naming the file, the line and
what is wrong, and fails the check."""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

DOCCHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "doccheck.py")

# A pserver stand-in: prints --helpfull as abseil does.
FAKE_PSERVER = textwrap.dedent("""\
    #!/bin/sh
    cat <<'HELP'
    pserver: A pserver parameter server.

      Flags from ./absl/flags/parse.cc:
        --flagfile (comma-separated list of files to load flags from); default: ;

      Flags from cc/server/main.cc:
        --host (Address to listen on; see --port.); default: "127.0.0.1";
        --max_things (The most things at once, a long description that
          runs over; two lines.); default: 67108864;
        --port (Port; 0 picks one.); default: 0;
        --cluster (Cluster name: etcd keys live under /pserver/<cluster>.);
          default: "default";

    Try --helpfull to get a list of all flags.
    HELP
    """)

FILES = {
    "WORKSPACE": "",
    "BUILD.bazel": 'filegroup(name = "docs", srcs = ["README.md"])\n',
    "cc/server/BUILD.bazel": textwrap.dedent("""\
        cc_binary(name = "pserver", srcs = ["main.cc"])
        cc_test(name = "things_test", srcs = ["things_test.cc"])
        [cc_test(name = n, srcs = [n + ".cc"]) for n in ["loop_test"]]
        """),
    "cc/server/main.cc": textwrap.dedent("""\
        ABSL_FLAG(std::string, host, "127.0.0.1", "Address.");
        ABSL_FLAG(uint64_t, max_things,
                  uint64_t{64} << 20, "The most things.");
        ABSL_FLAG(int, port, 0, "Port.");
        ABSL_FLAG(std::string, cluster, "default", "Cluster name.");
        """),
    "cc/server/things_test.cc": textwrap.dedent("""\
        TEST(ThingsTest, TooManyThingsAreRefusedNamingTheFlag) {}
        TEST_P(ThingsTransportTest, EveryTransportCountsThings) {}
        INSTANTIATE_TEST_SUITE_P(Transports, ThingsTransportTest, Values(1));
        """),
    "cc/server/loop_test.cc": "TEST(LoopTest, Loops) {}\n",
    "go/cmd/psctl/main.go": textwrap.dedent("""\
        func run(fs *flag.FlagSet) {
          yes := fs.Bool("yes_please", false, "set it without asking")
        }
        """),
    "go/pserver/client_test.go":
        "func TestClientRefusesThings(t *testing.T) {}\n",
    "python/tests/test_things.py": "def test_too_many_things():\n  pass\n",
    "cc/capi/capi_test.c": "static void test_cancel(void) {}\n",
}

GOOD_DOC = textwrap.dedent("""\
    # Things

    `bazel test //cc/server:things_test //cc/server:loop_test //cc/server/...`
    shows `ThingsTest.TooManyThingsAreRefusedNamingTheFlag`,
    `Transports/ThingsTransportTest.EveryTransportCountsThings`, `LoopTest.*`,
    Go `TestClientRefusesThings`, Python `test_too_many_things` and C
    `test_cancel`; psctl `-yes_please` (`--yes_please`), pserver `--host`;
    the code: `cc/server/main.cc`, `cc/server/things_test.{cc}`,
    `python/tests/test_<name>.py`, `docs/limits.md`.

    | flag | default | meaning |
    |---|---|---|
    | `--host` | `127.0.0.1` | where |
    | `--max_things` | 64 MiB | the most things |
    | `--port` | `0` | port |
    | `--cluster` | `default` | keys under /pserver/<cluster> |
    """)

GOOD_OPERATIONS = textwrap.dedent("""\
    # Operations

    Flags: `--host`, `--port`, `--max_things` (`docs/limits.md`), `--cluster`.
    """)

GOOD_LIMITS = textwrap.dedent("""\
    # Limits

    | What | Flag | Default | Past the limit | Test |
    |---|---|---|---|---|
    | Things | `--max_things` | 64 MiB | refused | `TooManyThingsAreRefusedNamingTheFlag` |
    """)


# README.md texts, the line of the problem, and what its report must say.
STALE_CITATIONS = [
    ("`//cc/server:gone_test`\n", 1,
     ("//cc/server:gone_test", "no such target")),
    ("x\n`bazel test //cc/gone:a_test`\n", 2, ("no package cc/gone",)),
    ("`ThingsTest.TooManyThingsAreRefused`\n", 1,
     ("suite ThingsTest has no test",)),
    ("`GoneTest.*`\n", 1, ("no test suite GoneTest",)),
    ("`Gone/ThingsTransportTest.EveryTransportCountsThings`\n", 1,
     ("no INSTANTIATE_TEST_SUITE_P(Gone, ThingsTransportTest",)),
    ("`TooManyThingsAreRefusedNamingTheLimit`\n", 1,
     ("named nowhere in the code",)),
    ("Go `TestClientRefusesNothing`\n", 1,
     ("no Go test func TestClientRefusesNothing",)),
    ("`test_too_few_things`\n", 1,
     ("no Python or C test test_too_few_things",)),
    ("start it with `--max_thing=3`\n", 1, ("--max_thing: no such flag",)),
    ("run `psctl desired 3 -yes_pleese`\n", 1,
     ("psctl has no flag -yes_pleese",)),
    ("```sh\nbazel run //go/cmd/psctl -- desired 3 -yes_pleese   # -x\n```\n",
     2, ("psctl has no flag -yes_pleese",)),
    ("| a | b |\n|---|---|\n| 1 | 2 | 3 |\n", 3,
     ("table row of 3 cells under a header of 2",)),
    ("see `cc/server/gone.h`\n", 1, ("cc/server/gone.h: no such file",)),
]


class DoccheckTest(unittest.TestCase):

  def setUp(self):
    self.root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.root)
    for path, text in FILES.items():
      self.write(path, text)
    self.write("README.md", GOOD_DOC)
    self.write("docs/limits.md", GOOD_LIMITS)
    self.write("docs/operations.md", GOOD_OPERATIONS)
    self.pserver = os.path.join(self.root, "fake_pserver")
    self.write("fake_pserver", FAKE_PSERVER)
    os.chmod(self.pserver, 0o755)

  def write(self, path, text):
    full = os.path.join(self.root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as fh:
      fh.write(text)

  def check(self):
    run = subprocess.run(
        [sys.executable, DOCCHECK, "--root", self.root, "--pserver",
         self.pserver], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        check=False, timeout=120)
    return run.returncode, run.stdout.decode()

  def assert_reported(self, doc, line, *fragments):
    """`doc` as README.md fails the check with a line naming README.md:line
    and every fragment."""
    self.write("README.md", doc)
    code, out = self.check()
    self.assertEqual(code, 1, out)
    lines = [l for l in out.splitlines() if l.startswith("README.md:%d:" % line)]
    self.assertTrue(
        any(all(f in l for f in fragments) for l in lines),
        "no line README.md:%d naming %s in:\n%s" % (line, fragments, out))

  def test_docs_that_cite_what_exists_pass(self):
    code, out = self.check()
    self.assertEqual(code, 0, out)
    self.assertIn("0 problems", out)

  def test_each_kind_of_stale_citation_is_reported(self):
    for doc, line, fragments in STALE_CITATIONS:
      with self.subTest(doc=doc):
        self.assert_reported(doc, line, *fragments)

  def test_a_wrong_default_is_reported(self):
    doc = GOOD_DOC.replace("| `--max_things` | 64 MiB |",
                           "| `--max_things` | 32 MiB |")
    line = doc.split("\n").index("| `--max_things` | 32 MiB | the most things |")
    self.assert_reported(doc, line + 1, "--max_things", "32 MiB",
                         "says 67108864")
    # A default --helpfull writes on a line of its own, after the last flag.
    doc = GOOD_DOC.replace("| `--cluster` | `default` |", "| `--cluster` | `job` |")
    self.assert_reported(doc, doc.split("\n").index(
        "| `--cluster` | `job` | keys under /pserver/<cluster> |") + 1,
                         "--cluster", "says default")

  def assert_file_fails(self, path, text, *lines):
    """`text` as `path` fails the check with every one of `lines` in its
    report."""
    self.write(path, text)
    code, out = self.check()
    self.assertEqual(code, 1, out)
    for line in lines:
      self.assertIn(line, out)

  def limits_with_test(self, test_cell):
    return GOOD_LIMITS.replace("`TooManyThingsAreRefusedNamingTheFlag`",
                               test_cell)

  def test_a_limits_row_without_a_test_is_reported(self):
    self.assert_file_fails("docs/limits.md", self.limits_with_test(""),
                           "docs/limits.md:5: limits row names no test")

  def test_a_limits_row_naming_no_test_but_an_identifier_is_reported(self):
    self.write("docs/limits.md", self.limits_with_test("`ThingsTransportTest`"))
    code, out = self.check()
    self.assertEqual(code, 0, out)  # a suite is a test
    self.assert_file_fails(
        "docs/limits.md", self.limits_with_test("`Transports`, `ABSL_FLAG`"),
        "limits row's test `Transports` is no test",
        "limits row's test `ABSL_FLAG` is no test")

  def test_a_limits_row_naming_a_missing_flag_is_reported(self):
    self.assert_file_fails(
        "docs/limits.md", GOOD_LIMITS.replace("`--max_things`", "`--max_thinks`"),
        "limits row names --max_thinks, which pserver has not")
    # A flag of psctl is a flag, but not the server's.
    self.assert_file_fails(
        "docs/limits.md", GOOD_LIMITS.replace("`--max_things`", "`--yes_please`"),
        "limits row names --yes_please, which pserver has not")

  def test_a_server_flag_row_naming_another_binarys_flag_is_reported(self):
    self.assert_file_fails(
        "docs/operations.md", GOOD_OPERATIONS + "\n| flag | default |\n|---|---|\n"
        "| `--host`, `--yes_please` | (none) |\n",
        "docs/operations.md:7: server flag row names --yes_please, which "
        "pserver has not")

  def test_a_pserver_flag_missing_from_operations_is_reported(self):
    self.assert_file_fails(
        "docs/operations.md", GOOD_OPERATIONS.replace(", `--port`", ""),
        "docs/operations.md: pserver's --port is not in its flag table")

  def test_a_tree_without_workspace_is_refused(self):
    os.remove(os.path.join(self.root, "WORKSPACE"))
    code, out = self.check()
    self.assertEqual(code, 2, out)
    self.assertIn("no WORKSPACE", out)


if __name__ == "__main__":
  unittest.main()
