"""Traces (docs/operations.md "Traces"): a Python worker traced through
PSERVER_TRACE (no API of its own), pserver processes through --trace_file,
and `python -m pserver.trace merge` lining their files up. Ordering only,
never timing. Every process is stopped by its PID."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pserver
from pserver import trace
from processes import PSERVER, start_pservers, stop


def _fake(path, pid, start_mono, start_unix, events):
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "otherData": {
            "clock": "CLOCK_MONOTONIC", "pid": pid, "process_name": f"p{pid}",
            "start_monotonic_us": start_mono, "start_unix_us": start_unix,
            "dropped_events": 0}}, f)
    return str(path)


def _span(name, ts, dur, pid, **args):
    return {"ph": "X", "name": name, "cat": "t", "ts": ts, "dur": dur, "pid": pid, "tid": 1,
            "args": args}


def test_merge_keeps_one_hosts_clock_and_shifts_another_hosts(tmp_path):
    # Same host: offsets (unix - monotonic) agree; the other host booted
    # 5000 s later, so its monotonic clock reads 5000 s less for one instant.
    a = _fake(tmp_path / "a.json", 7, 1000, 10_000_000_000 + 1000, [_span("a", 2000, 10, 7)])
    b = _fake(tmp_path / "b.json", 7, 3000, 10_000_000_000 + 3000 + 3, [_span("b", 3500, 10, 7)])
    c = _fake(tmp_path / "c.json", 9, 500, 10_000_000_000 + 500 + 5_000_000_000,
              [_span("c", 600, 10, 9)])
    merged = trace.merge([trace.load(p) for p in (a, b, c)])
    ts = {e["name"]: e["ts"] for e in merged["traceEvents"]}
    assert ts["a"] == 2000
    assert ts["b"] == 3500  # within the tolerance: one host, as written
    assert ts["c"] == 600 + 5_000_000_000  # onto a's time line by the wall clock
    pids = [e["pid"] for e in merged["traceEvents"]]
    assert len(set(pids)) == 3  # the two pid 7s are told apart
    assert trace.merge([trace.load(p) for p in (a, b)], align="wall")["traceEvents"][1]["ts"] == 3503


def test_load_names_a_file_that_is_not_a_trace(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": []}')
    with pytest.raises(ValueError, match="bad.json.*start_monotonic_us"):
        trace.load(str(bad))
    rc = subprocess.run([sys.executable, "-m", "pserver.trace", "merge", str(bad)],
                        capture_output=True, text=True, timeout=60)
    assert rc.returncode == 2 and "bad.json" in rc.stderr


def _spans(path):
    with open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.skipif(not os.access(PSERVER, os.X_OK), reason="needs the pserver binary")
def test_worker_and_server_traces_line_up(tmp_path, monkeypatch):
    procs = []
    server_file = str(tmp_path / "server.json")
    worker_file = str(tmp_path / "worker.json")
    try:
        addresses = start_pservers(1, tmp_path, procs,
                                   extra=lambda i: [f"--trace_file={server_file}"])
        monkeypatch.setenv("PSERVER_TRACE", worker_file)
        with pserver.Client(addresses, timeout=60) as client:
            client.init("w", np.zeros(4, np.float32))
            client.finish_init()
            for _ in range(3):
                client.send_grads({"w": np.ones(4, np.float32)})
            client.get("w")
        monkeypatch.delenv("PSERVER_TRACE")
    finally:
        for p in procs:
            stop(p)  # SIGTERM: the server writes its trace as it shuts down
    assert procs[0].returncode == 0
    merged_file = str(tmp_path / "merged.json")
    subprocess.run([sys.executable, "-m", "pserver.trace", "merge", worker_file, server_file,
                    "-o", merged_file], check=True, timeout=60)
    spans = _spans(merged_file)
    requests = {(e["args"]["client_id"], e["args"]["sequence"]): e for e in spans
                if e["cat"] == "request" and "sequence" in e["args"]}
    calls = [e for e in spans if e["cat"] == "call"]
    assert sum(e["name"] == "SendGrads" for e in calls) == 3
    assert any(e["name"] == "GetParams" for e in calls)
    applied = [e for e in spans if e["name"] == "apply push"]
    assert len(applied) == 3
    for server_span in applied:
        client_span = requests[(server_span["args"]["client_id"], server_span["args"]["sequence"])]
        # One host, one clock: the server's work lies within the request.
        assert client_span["ts"] <= server_span["ts"]
        assert server_span["ts"] + server_span["dur"] <= client_span["ts"] + client_span["dur"]
