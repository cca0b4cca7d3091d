"""bazel test //python:readme_test: README.md's first Python example, run as written.

The first ```python block under "## Using it from Python" must be 10 lines,
run with /usr/bin/python3 against the installed package, and print what the
README says after it: its first `...` exactly, then the named exception's
message.
"""
import re
import subprocess
import sys


def main() -> None:
    readme = open("README.md", encoding="utf-8").read()
    section = readme[readme.index("## Using it from Python"):]
    match = re.search(r"```python\n(.*?)```\n(.*?)\n\n", section, re.S)
    assert match is not None, "no ```python block under '## Using it from Python'"
    code, after = match.group(1), match.group(2)
    lines = code.splitlines()
    assert len(lines) == 10, f"the Python example has {len(lines)} lines, not 10"
    said = re.search(r"prints\s+`([^`]*)`\s+and\s+the\s+`(\w+)`\s+message", after)
    assert said is not None, "no 'prints `...` and the `Error` message' after the example"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    print(run.stdout + run.stderr)
    assert run.returncode == 0, f"the example failed (exit {run.returncode})"
    printed = run.stdout.splitlines()
    assert printed[0] == said.group(1), f"printed {printed[0]!r}, README says {said.group(1)!r}"
    assert printed[1].startswith(said.group(2) + ":"), printed[1]
    print("README.md's Python example runs as written")


if __name__ == "__main__":
    main()
