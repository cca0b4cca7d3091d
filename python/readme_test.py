"""bazel test //python:readme_test: README.md's Python and PyTorch examples, run as written.

The first ```python block under "## Using it from Python" must be 10 lines,
run with /usr/bin/python3 against the installed package, and print what the
README says after it: its first `...` exactly, then the named exception's
message.

The section "## Using it from PyTorch" must be at most 15 lines, and its
```python block print exactly the `...` after "prints" (run where PyTorch is
installed, as in CI; elsewhere this says it was skipped).

Usage: readme_test.py [README.md]; the examples run with this interpreter
(//python:wheel_venv_test runs it with a venv's).
"""
import importlib.util
import re
import subprocess
import sys


def main() -> None:
    # The README's path: README.md in the working directory unless given.
    readme = open(sys.argv[1] if len(sys.argv) > 1 else "README.md", encoding="utf-8").read()
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
    torch_example(readme)


def torch_example(readme: str) -> None:
    start = readme.index("## Using it from PyTorch")
    end = readme.index("\n## ", start)
    section = readme[start:end].rstrip("\n")
    lines = section.count("\n") + 1
    assert lines <= 15, f"the PyTorch section has {lines} lines, more than 15"
    match = re.search(r"```python\n(.*?)```\n\nprints\s+`([^`]*)`", section, re.S)
    assert match is not None, "no ```python block followed by 'prints `...`' in the section"
    if importlib.util.find_spec("torch") is None:
        print("README.md's PyTorch example SKIPPED: PyTorch is not installed (python3-torch)")
        return
    run = subprocess.run([sys.executable, "-c", match.group(1)], capture_output=True,
                         text=True, timeout=300)
    print(run.stdout + run.stderr)
    assert run.returncode == 0, f"the PyTorch example failed (exit {run.returncode})"
    printed = run.stdout.splitlines()
    assert printed == [match.group(2)], f"printed {printed!r}, README says {match.group(2)!r}"
    print("README.md's PyTorch example runs as written")


if __name__ == "__main__":
    main()
