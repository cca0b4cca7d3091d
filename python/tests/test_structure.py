"""What docs/architecture.md says of the package's shape: imports run one
way, and a push, a pull or a push+pull is one call into libpserver."""
import ast
import os
import subprocess
import sys

import numpy as np

import pserver
from pserver import _client


def _package_imports():
    """module -> the package modules it imports (`from .x import ...`)."""
    folder = os.path.dirname(pserver.__file__)
    graph = {}
    for file in os.listdir(folder):
        if not file.endswith(".py") or file == "__init__.py":
            continue
        module = file[:-3]
        with open(os.path.join(folder, file)) as f:
            tree = ast.parse(f.read())
        graph[module] = {
            node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }
    return graph


def test_package_imports_have_no_cycle():
    graph = _package_imports()
    assert "_core" not in graph
    state = {}  # module -> "open" while on the path, "done" after

    def visit(module, path):
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", " -> ".join(path + [module])
        state[module] = "open"
        for dep in graph.get(module, ()):
            visit(dep, path + [module])
        state[module] = "done"

    for module in graph:
        visit(module, [])


class _CountingCapi:
    """The capi module, counting calls to its pserver_client_* functions."""

    def __init__(self, capi):
        self._capi = capi
        self.calls = []

    def __getattr__(self, name):
        fn = getattr(self._capi, name)
        if not name.startswith("pserver_client_") or not callable(fn):
            return fn

        def counted(*args):
            self.calls.append(name)
            return fn(*args)
        return counted


def test_push_pull_and_push_pull_are_one_library_call_each(client, monkeypatch):
    client.init("w", np.zeros(4, np.float32))
    client.finish_init()
    out = np.empty(4, np.float32)
    client.get("w", out=out)  # the layout is known from here on
    counting = _CountingCapi(_client._c)
    monkeypatch.setattr(_client, "_c", counting)
    for op in (lambda: client.send_grad("w", np.ones(4, np.float32)),
               lambda: client.get("w", out=out),
               lambda: client.push_pull({"w": np.ones(4, np.float32)}, out={"w": out}),
               lambda: client.send_grads({"w": np.ones(4, np.float32)}),
               lambda: client.get_many(["w"])):
        counting.calls.clear()
        op()
        assert len(counting.calls) == 1, counting.calls


def _python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_import_pserver_needs_no_torch():
    # torch made unimportable: `import pserver` works, pserver.torch says why not.
    run = _python("import sys; sys.modules['torch'] = None\n"
                  "import pserver; print(pserver.version() != '')\n"
                  "try:\n    import pserver.torch\n"
                  "except ImportError as e:\n    print(e)")
    assert run.returncode == 0, run.stderr
    printed = run.stdout.splitlines()
    assert printed[0] == "True"
    assert "pserver.torch needs PyTorch (Debian: apt-get install python3-torch)" in printed[1]
    # And where torch is installed, `import pserver` still does not load it.
    run = _python("import sys, pserver; print([m for m in sys.modules "
                  "if m == 'torch' or m.startswith(('pserver.torch', 'pserver._torch'))])")
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr
