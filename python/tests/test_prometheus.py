"""Debian's Prometheus scrapes a 2-server cluster's --metrics_port.

etcd, two pserver processes (--metrics_port=0) and prometheus run on
127.0.0.1 free ports; prometheus gets a generated config (scraping both
servers every second) and a temporary storage directory. The test pushes a
known number of gradients and waits (bounded, 120 s) until Prometheus's HTTP
query API reports exactly those pushes. Every process is stopped by its PID.
"""
import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

import pserver
from etcd_process import EtcdProcess, have_etcd
from processes import PSERVER, free_port, metrics_address, start_registered_pservers, stop

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

pytestmark = pytest.mark.skipif(
    not (have_etcd() and os.access(PSERVER, os.X_OK) and shutil.which("prometheus")),
    reason="needs etcd, the pserver binary and prometheus (./setup.sh installs it)")

PUSHES = 7


def _query(port: int, expression: str):
    """The instant vector of `expression` as [(labels, value)]."""
    url = (f"http://127.0.0.1:{port}/api/v1/query?"
           + urllib.parse.urlencode({"query": expression}))
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]


def _wait_for(port: int, expression: str, expected: float, deadline: float):
    """Polls until `expression` is one sample equal to `expected`; returns the
    last answer otherwise (the assertion then shows it)."""
    last = None
    while time.monotonic() < deadline:
        try:
            last = _query(port, expression)
        except OSError as e:  # prometheus still starting
            last = repr(e)
        if isinstance(last, list) and len(last) == 1 and last[0][1] == expected:
            return last
        time.sleep(0.2)
    return last


def test_prometheus_scrapes_the_cluster(tmp_path):
    procs = []
    with EtcdProcess(tmp_path) as etcd:
        try:
            logs = start_registered_pservers(2, tmp_path, procs, etcd.endpoint, "prom",
                                             ["--metrics_port=0"])
            targets = [metrics_address(log) for log in logs]
            assert all(t.startswith("127.0.0.1:") for t in targets), targets

            with pserver.Client(etcd=etcd.endpoint, cluster="prom", timeout=20,
                                discovery_timeout=30) as client:
                client.init("w", np.zeros(8, np.float32), optimizer="sgd", lr=1.0)
                client.finish_init()
                for _ in range(PUSHES):
                    client.send_grad("w", np.ones(8, np.float32))
                np.testing.assert_array_equal(client.get("w"), np.full(8, -PUSHES, np.float32))

            config = tmp_path / "prometheus.yml"
            config.write_text(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                "scrape_configs:\n  - job_name: pserver\n    static_configs:\n"
                f"      - targets: {json.dumps(targets)}\n")
            port = free_port()
            with open(tmp_path / "prometheus.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [PROMETHEUS, f"--config.file={config}",
                     f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))

            deadline = time.monotonic() + 120
            up = _wait_for(port, 'sum(up{job="pserver"})', 2, deadline)
            assert up and up[0][1] == 2, (up, (tmp_path / "prometheus.log").read_text())
            pushes = _wait_for(port, 'sum(pserver_requests_total{method="Push"})', PUSHES,
                               deadline)
            assert pushes and pushes[0][1] == PUSHES, pushes
            applied = _wait_for(port, "sum(pserver_gradients_applied_total)", PUSHES, deadline)
            assert applied and applied[0][1] == PUSHES, applied
            # Both servers are registered in etcd and serving, and say which index they are.
            assert _wait_for(port, "sum(pserver_etcd_registered)", 2, deadline)[0][1] == 2
            assert _wait_for(port, "sum(pserver_serving)", 2, deadline)[0][1] == 2
            indices = _query(port, 'pserver_server_info{cluster="prom"}')
            assert sorted(m["index"] for m, _ in indices) == ["0", "1"], indices
            # The latency histogram arrived whole: one observation per push.
            count = _query(port, 'sum(pserver_request_duration_seconds_count{method="Push"})')
            assert count[0][1] == PUSHES, count
        finally:
            for proc in reversed(procs):  # prometheus, then the servers; etcd leaving the with
                stop(proc)
