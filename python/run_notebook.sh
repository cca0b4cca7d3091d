#!/usr/bin/env bash
# bazel test //python:notebook_test: runs python/examples/quickstart.ipynb
# headless (nbclient, kernel python3) against the installed package; any
# failing cell fails the test.
set -euo pipefail
site="$TEST_TMPDIR/site"
python/install.sh --target "$site" --quiet
export PYTHONPATH="$site"   # the kernel inherits it
export MPLBACKEND=Agg
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
assert images, "the notebook produced no plot"
print(f"notebook ok: {len(nb.cells)} cells, {len(images)} plot(s)")
PY
