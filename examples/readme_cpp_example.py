#!/usr/bin/python3
"""Writes README.md's C++ example ("Using it from C++") as a test source.

The example is kept as written, inside a function that returns its last
value, `w`; only its server list, 127.0.0.1:7000 and :7001, becomes the
addresses of the in-process cluster the test starts (tests bind free ports).
Usage: readme_cpp_example.py README.md OUT.cc. Fails naming what it did not
find when the README's example no longer has that shape.
"""

import re
import sys

SECTION = "## Using it from C++"
SERVERS = 'options.servers = {"127.0.0.1:7000", "127.0.0.1:7001"};'
INCLUDE = '#include "cc/client/client.h"'


def example(readme):
  section = readme.split(SECTION, 1)
  if len(section) != 2:
    sys.exit("README.md has no section %r" % SECTION)
  block = re.search(r"```cpp\n(.*?)```", section[1], re.S)
  if block is None:
    sys.exit("README.md's %r has no ```cpp block" % SECTION)
  lines = block.group(1).rstrip("\n").split("\n")
  for want in (INCLUDE, SERVERS):
    if want not in lines:
      sys.exit("README.md's C++ example has no line %r" % want)
  if not lines[-1].startswith("pserver::Tensor w = "):
    sys.exit("README.md's C++ example no longer ends with `pserver::Tensor w = ...`")
  return [l for l in lines if l != INCLUDE]


def main():
  readme_path, out_path = sys.argv[1], sys.argv[2]
  with open(readme_path, encoding="utf-8") as fh:
    body = example(fh.read())
  body = ["options.servers = addresses;" if l == SERVERS else l for l in body]
  with open(out_path, "w", encoding="utf-8") as out:
    out.write("// Generated from README.md by examples/readme_cpp_example.py.\n")
    out.write(INCLUDE + "\n#include \"examples/readme_cpp_example.h\"\n\n")
    out.write("pserver::Tensor RunReadmeCppExample(const std::vector<std::string>& "
              "addresses) {\n")
    out.write("".join("  %s\n" % l if l else "\n" for l in body))
    out.write("  return w;\n}\n")


if __name__ == "__main__":
  main()
