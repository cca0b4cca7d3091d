"""Context managers, close(), __repr__."""
import numpy as np
import pytest

import pserver


def test_local_cluster_context_closes_its_clients():
    with pserver.LocalCluster(servers=3) as c:
        assert len(c) == 3 and c.size == 3
        assert all(a.startswith("127.0.0.1:") for a in c.addresses)
        assert "3 servers running" in repr(c)
        cl = c.client()
        cl.init("w", np.zeros(2, np.float32))
        assert cl.num_servers == 3
    assert "stopped" in repr(c)
    assert cl.closed
    with pytest.raises(pserver.Closed):
        cl.get("w")
    with pytest.raises(pserver.Closed):
        c.client()
    c.stop()  # idempotent


def test_server_context_and_repr():
    with pserver.Server() as s:
        assert repr(s) == f"<pserver.Server {s.address} running>"
        cl = s.client()
    assert "stopped" in repr(s)
    assert cl.closed
    s.close()


def test_client_context_manager(cluster):
    with cluster.client() as cl:
        cl.init("w", np.zeros(1, np.float32))
    assert cl.closed and "closed" in repr(cl)


def test_objects_are_freed_without_close():
    for _ in range(3):  # __del__ frees handles; no leak, no crash
        c = pserver.LocalCluster(servers=1)
        cl = c.client()
        cl.init("w", np.zeros(1, np.float32))
        del cl, c
