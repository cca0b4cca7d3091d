"""The GIL is released while C calls run: threads make progress together."""
import socket
import threading

import numpy as np

import pserver


def test_two_threads_push_concurrently(client):
    client.init("w", np.zeros(1000, np.int64), optimizer="add")
    client.finish_init()
    steps = 200
    errors = []

    def trainer():
        try:
            for _ in range(steps):
                client.push_pull({"w": np.ones(1000, np.int64)})
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=trainer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert not any(t.is_alive() for t in threads)
    np.testing.assert_array_equal(client.get("w"), np.full(1000, 2 * steps))


def test_a_blocked_call_does_not_hold_the_gil(client):
    """Thread A blocks inside a C call (its server accepts TCP and never
    answers); meanwhile this thread runs Python code and pserver calls. With
    the GIL held by A, accept() could not return here before A's deadline."""
    client.init("w", np.zeros(4, np.float32), lr=1.0)
    client.finish_init()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(5)
    silent = pserver.Client([f"127.0.0.1:{listener.getsockname()[1]}"], timeout=5,
                            channels_per_server=1)
    outcome = []

    def blocked():
        try:
            silent.finish_init()
            outcome.append("returned")
        except pserver.Error as e:
            outcome.append(type(e).__name__)

    a = threading.Thread(target=blocked)
    a.start()
    conn, _ = listener.accept()  # A's gRPC connection: A is inside the C call
    try:
        for _ in range(50):
            client.send_grad("w", np.ones(4, np.float32))
        np.testing.assert_array_equal(client.get("w"), np.full(4, -50, np.float32))
        assert a.is_alive(), "the blocked call returned early"
        assert outcome == []
    finally:
        conn.close()
        listener.close()
    a.join(timeout=30)
    assert not a.is_alive()
    assert outcome and outcome[0] in ("Unavailable", "DeadlineExceeded")
    silent.close()


def test_close_waits_for_calls_in_flight(client):
    client.init("w", np.zeros(1 << 16, np.float32))
    client.finish_init()
    done = []

    def reader():
        for _ in range(20):
            try:
                client.get("w")
            except pserver.Closed:
                break
        done.append(True)

    t = threading.Thread(target=reader)
    t.start()
    client.close()  # must not free the handle under a running call
    t.join(timeout=30)
    assert done == [True]
