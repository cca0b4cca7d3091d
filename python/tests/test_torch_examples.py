"""The PyTorch examples, run as users run them (bazel test
//python:torch_examples_test): python/examples/torch_digits.py trains an MLP
with 3 processes against 2 real pserver processes started here (and stopped
by PID) and must end within 0.01 of the single-process test accuracy."""
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


def test_digits_three_trainers_match_one_process(tmp_path):
    procs = []
    try:
        servers = start_pservers(2, tmp_path, procs)
        run = subprocess.run(
            [sys.executable, os.path.join(EXAMPLES, "torch_digits.py"),
             "--servers", ",".join(servers)],
            capture_output=True, text=True, timeout=240)
        print(run.stdout + run.stderr)
        assert run.returncode == 0, run.stdout + run.stderr
        accuracies = [float(line.rsplit(" ", 1)[1]) for line in run.stdout.splitlines()
                      if "test accuracy" in line]
        assert len(accuracies) == 2 and min(accuracies) > 0.85, run.stdout
        assert abs(accuracies[0] - accuracies[1]) <= 0.01, run.stdout
    finally:
        for proc in procs:
            stop(proc)
