"""Per-call timeouts: `timeout=` on a blocking Client method bounds the
library call itself, far below the client's own timeout."""
import socket
import time

import numpy as np
import pytest

import pserver


@pytest.fixture
def silent_server():
    """A 127.0.0.1 address that accepts TCP connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("call", [
    lambda c, t: c.finish_init(timeout=t),
    lambda c, t: c.get("w", timeout=t),
    lambda c, t: c.info("w", timeout=t),
    lambda c, t: c.get_many(["w", "v"], timeout=t),
    lambda c, t: c.stats(timeout=t),
    lambda c, t: c.init("w", np.zeros(2, np.float32), timeout=t),
], ids=["finish_init", "get", "info", "get_many", "stats", "init"])
def test_call_timeout_beats_client_timeout(silent_server, call):
    with pserver.Client([silent_server], timeout=30) as client:
        start = time.monotonic()
        with pytest.raises(pserver.DeadlineExceeded):
            call(client, 0.2)
        assert time.monotonic() - start < 5
        # close() waits for calls in flight: none is left.
        start = time.monotonic()
    assert time.monotonic() - start < 5


def test_timeout_is_per_call(cluster, silent_server):
    client = cluster.client()
    client.init("w", np.zeros(2, np.float32), timeout=5)
    client.finish_init(timeout=5)
    np.testing.assert_array_equal(client.get("w", timeout=5), np.zeros(2, np.float32))
    client.send_grad("w", np.ones(2, np.float32), timeout=5)
    client.send_grads({"w": np.ones(2, np.float32)}, timeout=5)
    out = client.push_pull({"w": np.ones(2, np.float32)}, timeout=5)
    assert out["w"].shape == (2,)
    assert len(client.stats(timeout=5)) == 2
    with pytest.raises(pserver.InvalidArgument):
        client.get("w", timeout=0)
    # A call without timeout= afterwards is not bounded by an earlier one.
    with pserver.Client([silent_server], timeout=1) as slow:
        with pytest.raises(pserver.DeadlineExceeded):
            slow.finish_init(timeout=0.1)
        start = time.monotonic()
        with pytest.raises((pserver.DeadlineExceeded, pserver.Unavailable)):
            slow.finish_init()
        assert time.monotonic() - start > 0.5  # the client's 1 s, not 0.1 s
