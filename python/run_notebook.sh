#!/usr/bin/env bash
# bazel test //python:notebook_test: runs python/examples/quickstart.ipynb
# headless (nbclient, kernel python3) against the installed package; any
# failing cell fails the test. Plots use the kernel's own inline backend (no
# MPLBACKEND set); the notebook's second part starts pserver processes from
# the binary in runfiles ($PSERVER_BINARY), and its PyTorch cell runs where
# python3-torch is installed.
set -euo pipefail
site="$TEST_TMPDIR/site"
python/install.sh --target "$site" --quiet
export PYTHONPATH="$site"   # the kernel inherits it
unset MPLBACKEND
export TMPDIR="$TEST_TMPDIR" MPLCONFIGDIR="$TEST_TMPDIR/matplotlib"
export PSERVER_BINARY="$PWD/cc/server/pserver"
export JUPYTER_RUNTIME_DIR="$TEST_TMPDIR/jupyter-runtime"
export IPYTHONDIR="$TEST_TMPDIR/ipython"
work="$TEST_TMPDIR/notebook"
mkdir -p "$work"
cp python/examples/quickstart.ipynb "$work/"
exec /usr/bin/python3 - "$work/quickstart.ipynb" <<'PY'
import sys
import nbformat
from nbclient import NotebookClient

path = sys.argv[1]
nb = nbformat.read(path, as_version=4)
client = NotebookClient(nb, kernel_name="python3", timeout=300,
                        resources={"metadata": {"path": str(__import__("os").path.dirname(path))}})
client.execute()  # raises CellExecutionError naming the failing cell
outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
images = [o for o in outputs if "image/png" in o.get("data", {})]
print(text)
assert "loss fell" in text, "the notebook did not report a falling loss"
assert "processes: loss fell" in text, "the server processes' training did not report"
assert len(images) >= 2, f"the notebook made {len(images)} inline plot(s), want 2"
# Every server process the notebook started was stopped (by its pid) and
# exited cleanly: the pids it printed are gone.
import ast, importlib.util, os
stopped = [pair for line in text.splitlines() if line.startswith("stopped (pid, exit code):")
           for pair in ast.literal_eval(line.split(":", 1)[1].strip())]
want_stopped = 4 if importlib.util.find_spec("torch") else 2
assert len(stopped) == want_stopped, f"stopped {stopped}, want {want_stopped} processes"
for pid, code in stopped:
    assert code == 0, f"pserver {pid} exited {code}"
    assert not os.path.exists(f"/proc/{pid}/cmdline") or \
        b"pserver" not in open(f"/proc/{pid}/cmdline", "rb").read(), f"pserver {pid} still runs"
if importlib.util.find_spec("torch"):
    assert "torch through pserver processes: weights [[2.0, -1.0, 0.5]]" in text, text
else:
    assert "PyTorch is not installed" in text, text
print(f"notebook ok: {len(nb.cells)} cells, {len(images)} plot(s), {len(stopped)} processes stopped")
PY
