"""pserver.Client(etcd=...): a real etcd and two pserver processes on 127.0.0.1.

The servers register in etcd (--etcd, --num_servers=2); the client finds them
there. Every process is started here and stopped by its PID.
"""
import os
import socket

import numpy as np
import pytest

import etcd_process
import pserver
from etcd_process import EtcdProcess, have_etcd, stop_process
from processes import start_registered_pservers

PSERVER = os.environ.get("PSERVER_BINARY", "")

pytestmark = pytest.mark.skipif(
    not (have_etcd() and os.access(PSERVER, os.X_OK)),
    reason="needs etcd and the pserver binary ($PSERVER_BINARY)")


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory):
    """(endpoint, cluster): etcd and 2 pserver processes registered in it."""
    tmp_path = tmp_path_factory.mktemp("etcd_cluster")
    procs = []
    with EtcdProcess(tmp_path) as etcd:
        try:
            start_registered_pservers(2, tmp_path, procs, etcd.endpoint, "py")
            yield etcd.endpoint, "py"
        finally:
            for proc in procs:  # servers first, etcd (leaving the with) last
                stop_process(proc)


def test_client_from_etcd(etcd_cluster):
    endpoint, cluster = etcd_cluster
    # Waits for both servers to register (they may still be starting).
    with pserver.Client(etcd=endpoint, cluster=cluster, timeout=10,
                        discovery_timeout=30) as client:
        assert client.num_servers == 2
        assert all(a.startswith("127.0.0.1:") for a in client.servers)
        assert "etcd" in repr(client)
        # gRPC health over the network: both registered, loaded and serving.
        assert client.health() == ["SERVING", "SERVING"]
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


@pytest.mark.skipif(not etcd_process.have_etcd(), reason="etcd is not installed")
def test_etcd_process_starts_again_when_its_port_was_taken(tmp_path, monkeypatch):
    """The helper's free port can be taken before etcd binds it (tests run in
    parallel): the first port handed out here is held by a listening socket,
    etcd exits "address already in use", and the helper retries on new ports."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    ports = [held.getsockname()[1]]
    real = etcd_process.free_port
    monkeypatch.setattr(etcd_process, "free_port", lambda: ports.pop() if ports else real())
    try:
        with etcd_process.EtcdProcess(tmp_path) as etcd:
            assert etcd.endpoint != f"127.0.0.1:{held.getsockname()[1]}"
            with pserver.Etcd(etcd.endpoint, timeout=10) as client:
                client.put("/k", b"v")
    finally:
        held.close()
