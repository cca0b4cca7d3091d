"""The PyTorch examples, run as users run them (bazel test
//python:torch_examples_test) against 2 real pserver processes started here
(and stopped by PID): python/examples/torch_digits.py (an MLP on sklearn's
digits, 3 trainer processes) must end within 0.01 of the single-process test
accuracy, torch_clicks.py (embedding bags + MLP on generated clicks) within
0.01 of the single-process held-out AUC."""
import os
import subprocess
import sys

import pytest

from processes import PSERVER, start_pservers, stop

pytest.importorskip("torch", reason="needs PyTorch (python3-torch)")
pytest.importorskip("sklearn", reason="needs scikit-learn (python3-sklearn) for the digits")
pytestmark = pytest.mark.skipif(not os.access(PSERVER, os.X_OK),
                                reason="needs the pserver binary ($PSERVER_BINARY)")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


@pytest.mark.parametrize("example, floor", [("torch_digits.py", 0.85),
                                            ("torch_clicks.py", 0.65)])
def test_three_trainers_match_one_process(example, floor, tmp_path):
    procs = []
    try:
        servers = start_pservers(2, tmp_path, procs)
        run = subprocess.run(
            [sys.executable, os.path.join(EXAMPLES, example), "--servers", ",".join(servers)],
            capture_output=True, text=True, timeout=240)
        print(run.stdout + run.stderr)
        assert run.returncode == 0, run.stdout + run.stderr
        # "one process, ...: <metric> 0.9417" and "3 processes through pserver ...: ..."
        scores = [float(line.rsplit(" ", 1)[1]) for line in run.stdout.splitlines()
                  if line.startswith(("one process", "3 processes"))]
        assert len(scores) == 2 and min(scores) > floor, run.stdout
        assert abs(scores[0] - scores[1]) <= 0.01, run.stdout
    finally:
        for proc in procs:
            stop(proc)
