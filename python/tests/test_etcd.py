"""pserver.Client(etcd=...): a real etcd and two pserver processes on 127.0.0.1.

The servers register in etcd (--etcd, --num_servers=2); the client finds them
there. Every process is started here and stopped by its PID.
"""
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

import pserver
from processes import PSERVER, free_port as _free_port, stop as _stop

ETCD = shutil.which("etcd") or "/usr/bin/etcd"

pytestmark = pytest.mark.skipif(
    not (os.access(ETCD, os.X_OK) and os.access(PSERVER, os.X_OK)),
    reason="needs etcd and the pserver binary ($PSERVER_BINARY)")


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory):
    """(endpoint, cluster): etcd and 2 pserver processes registered in it."""
    tmp_path = tmp_path_factory.mktemp("etcd_cluster")
    procs = []
    try:
        client, peer = _free_port(), _free_port()
        curl, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        with open(tmp_path / "etcd.log", "wb") as log:
            procs.append(subprocess.Popen(
                [ETCD, "--name=pytest", f"--data-dir={tmp_path / 'etcd'}",
                 f"--listen-client-urls={curl}", f"--advertise-client-urls={curl}",
                 f"--listen-peer-urls={purl}", f"--initial-advertise-peer-urls={purl}",
                 f"--initial-cluster=pytest={purl}", "--log-level=error"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        endpoint = f"127.0.0.1:{client}"
        # The servers wait for etcd themselves (--register_timeout).
        for i in range(2):
            with open(tmp_path / f"server{i}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [PSERVER, "--host=127.0.0.1", "--port=0", f"--etcd={endpoint}",
                     "--cluster=py", "--num_servers=2", "--lease_ttl=2",
                     "--register_timeout=30", "--shutdown_grace_seconds=1"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        # Wait (at most 30 s) until both servers have registered, so that the
        # clients meet a serving etcd (a client whose first connection lands
        # while etcd is still starting up can stall for its whole deadline).
        logs = [tmp_path / f"server{i}.log" for i in range(2)]
        deadline = time.monotonic() + 30
        while not all("listening on" in p.read_text() for p in logs):
            exited = [p.args[0] for p in procs if p.poll() is not None]
            assert not exited, f"exited while starting: {exited}"
            assert time.monotonic() < deadline, [p.read_text() for p in logs]
            time.sleep(0.05)
        yield endpoint, "py"
    finally:
        for proc in reversed(procs):  # servers first, etcd last
            _stop(proc)


def test_client_from_etcd(etcd_cluster):
    endpoint, cluster = etcd_cluster
    # Waits for both servers to register (they may still be starting).
    with pserver.Client(etcd=endpoint, cluster=cluster, timeout=10,
                        discovery_timeout=30) as client:
        assert client.num_servers == 2
        assert all(a.startswith("127.0.0.1:") for a in client.servers)
        assert "etcd" in repr(client)
        client.init("w", np.arange(4, dtype=np.float32), optimizer="sgd", lr=1.0)
        client.finish_init()
        client.send_grad("w", np.ones(4, np.float32))
        np.testing.assert_array_equal(client.get("w"), np.arange(4, dtype=np.float32) - 1)
        # A second trainer finds the same servers and sees the same bytes.
        with pserver.Client(etcd=endpoint, cluster=cluster, timeout=10) as other:
            assert sorted(other.servers) == sorted(client.servers)
            assert other.get("w").tobytes() == client.get("w").tobytes()


def test_client_from_etcd_gives_up_in_time(etcd_cluster):
    endpoint, _ = etcd_cluster
    # Nobody registers for cluster "empty": discovery ends at its deadline.
    with pytest.raises((pserver.DeadlineExceeded, pserver.Unavailable)):
        pserver.Client(etcd=endpoint, cluster="empty", discovery_timeout=0.3)
