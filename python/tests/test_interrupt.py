"""Ctrl-C during a blocking call raises KeyboardInterrupt at once and cancels
the call (it would otherwise wait for its deadline)."""
import os
import signal
import threading
import time

import numpy as np
import pytest

import pserver
from pserver import capi


def _interrupt_soon():
    """Sends SIGINT to this process, as Ctrl-C does, once the main thread's
    next blocking call is waiting in the library (it has run its check for
    signals; waiting at most 30 s): KeyboardInterrupt then arrives while it
    waits."""
    before = capi.pserver_py_checks()

    def interrupt():
        for _ in range(3000):
            if capi.pserver_py_checks() > before:
                break
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    timer = threading.Thread(target=interrupt)
    timer.start()
    return timer


@pytest.fixture
def grpc_client(cluster):
    with cluster.client(in_process=False, timeout=60.0) as c:
        yield c


def test_ctrl_c_ends_a_blocking_barrier(grpc_client):
    group = grpc_client.group("g", size=2, participant="alone")
    start = time.monotonic()
    timer = _interrupt_soon()
    with pytest.raises(KeyboardInterrupt) as info:
        group.barrier(timeout=60)
    timer.join()
    assert time.monotonic() - start < 10  # not its 60 s deadline
    # The call itself was cancelled (not left running): it ended CANCELLED.
    assert isinstance(info.value.__cause__, pserver.Cancelled), repr(info.value.__cause__)
    # The client still works.
    assert len(grpc_client.stats()) == 2


def test_ctrl_c_ends_an_in_process_barrier(client):
    # The in-process client (a notebook's LocalCluster) waits in the store.
    group = client.group("g", size=2, participant="alone")
    start = time.monotonic()
    timer = _interrupt_soon()
    with pytest.raises(KeyboardInterrupt) as info:
        group.barrier(timeout=60)
    timer.join()
    assert time.monotonic() - start < 10
    assert isinstance(info.value.__cause__, pserver.Cancelled)


def test_ctrl_c_ends_a_call_to_a_server_that_is_down():
    with pserver.LocalCluster(servers=1) as cluster:
        address = cluster.addresses[0]
    # Nothing listens there now: the call waits for the server until its deadline.
    with pserver.Client([address], timeout=60.0) as client:
        start = time.monotonic()
        timer = _interrupt_soon()
        with pytest.raises(KeyboardInterrupt) as info:
            client.finish_init()
        timer.join()
        assert time.monotonic() - start < 10
        assert isinstance(info.value.__cause__, pserver.Cancelled)


def test_errors_and_results_still_come_back(client):
    client.init("w", np.ones(2, np.float32))
    client.finish_init()
    np.testing.assert_array_equal(client.get("w"), np.ones(2, np.float32))
    with pytest.raises(pserver.NotFound):
        client.get("nope")


def test_timeouts_hold_on_the_main_thread(grpc_client):
    group = grpc_client.group("g", size=2, participant="alone")
    start = time.monotonic()
    with pytest.raises(pserver.DeadlineExceeded):
        group.barrier(timeout=0.3)
    assert time.monotonic() - start < 10  # the 0.3 s timeout, not the client's 60 s


def test_calls_from_other_threads_run_there(client):
    client.init("w", np.ones(2, np.float32))
    client.finish_init()
    seen = []
    t = threading.Thread(target=lambda: seen.append(client.get("w")))
    t.start()
    t.join()
    np.testing.assert_array_equal(seen[0], np.ones(2, np.float32))


def test_the_main_thread_calls_in_place(client):
    # No thread hand-off: the call and its signal checks run on the main
    # thread, and no helper thread exists.
    client.init("w", np.ones(2, np.float32))
    client.finish_init()
    for _ in range(20):
        client.get("w")
    assert [t.name for t in threading.enumerate() if t.name.startswith("pserver")] == []


def test_a_handler_that_does_not_raise_leaves_the_call_running(grpc_client):
    # Only a handler that raises ends the call: one that just records the
    # signal lets it go on to its own end (here its 1 s timeout).
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        group = grpc_client.group("g", size=2, participant="alone")
        timer = _interrupt_soon()
        with pytest.raises(pserver.DeadlineExceeded):
            group.barrier(timeout=1.0)
        timer.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]
