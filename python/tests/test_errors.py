"""Every status code arrives as its exception class."""
import socket

import numpy as np
import pytest

import pserver


def test_class_hierarchy():
    assert issubclass(pserver.NotFound, KeyError)
    assert issubclass(pserver.InvalidArgument, ValueError)
    assert issubclass(pserver.Uninitialized, pserver.FailedPrecondition)
    assert issubclass(pserver.Unavailable, ConnectionError)
    assert issubclass(pserver.DeadlineExceeded, TimeoutError)
    for cls in (pserver.NotFound, pserver.InvalidArgument, pserver.AlreadyInitialized,
                pserver.Uninitialized, pserver.Unavailable, pserver.DeadlineExceeded,
                pserver.DataLoss, pserver.Closed, pserver.Unimplemented):
        assert issubclass(cls, pserver.Error)


@pytest.mark.parametrize("code,cls", [
    (1, pserver.Cancelled), (2, pserver.Unknown), (3, pserver.InvalidArgument),
    (4, pserver.DeadlineExceeded), (5, pserver.NotFound), (6, pserver.AlreadyInitialized),
    (7, pserver.PermissionDenied), (8, pserver.ResourceExhausted),
    (9, pserver.FailedPrecondition), (10, pserver.Aborted), (11, pserver.OutOfRange),
    (12, pserver.Unimplemented), (13, pserver.Internal), (14, pserver.Unavailable),
    (15, pserver.DataLoss), (16, pserver.Unauthenticated), (99, pserver.Unknown),
])
def test_error_from_status(code, cls):
    e = pserver.error_from_status(code, "msg")
    assert type(e) is cls and e.code == code and str(e) == "msg"
    assert e.code_name in repr(e)


def test_uninitialized_is_chosen_by_message():
    e = pserver.error_from_status(9, "pserver not fully initialized")
    assert type(e) is pserver.Uninitialized


def test_lifecycle_errors(client):
    client.init("w", np.zeros(2, np.float32))
    with pytest.raises(pserver.AlreadyInitialized, match="pserver already initialized") as e:
        client.init("w", np.zeros(2, np.float32))
    assert e.value.code == 6 and e.value.code_name == "ALREADY_EXISTS"
    with pytest.raises(pserver.Uninitialized, match="not fully initialized"):
        client.get("w")
    with pytest.raises(pserver.Uninitialized):
        client.send_grad("w", np.zeros(2, np.float32))
    client.finish_init()
    with pytest.raises(pserver.NotFound, match="'nope'") as e:
        client.get("nope")
    with pytest.raises(KeyError):
        client.send_grad("nope", np.zeros(2, np.float32))
    assert "nope" in str(e.value)


def test_unavailable_after_the_server_stops():
    server = pserver.Server()
    client = server.client(timeout=1)
    client.init("w", np.zeros(2, np.float32))
    server.stop()
    with pytest.raises((pserver.Unavailable, pserver.DeadlineExceeded)):
        client.finish_init()
    server.close()


def test_unavailable_when_nothing_listens():
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = pserver.Client([f"127.0.0.1:{port}"], timeout=1)
    with pytest.raises((pserver.Unavailable, pserver.DeadlineExceeded)):
        client.finish_init()
    client.close()


def test_deadline_exceeded_against_a_silent_server():
    with socket.socket() as s:  # accepts TCP, never speaks HTTP/2
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        client = pserver.Client([f"127.0.0.1:{s.getsockname()[1]}"], timeout=0.3)
        with pytest.raises(pserver.DeadlineExceeded):
            client.finish_init()
        client.close()


def test_closed_and_unimplemented(cluster):
    c = cluster.client()
    c.close()
    c.close()  # twice is fine
    with pytest.raises(pserver.Closed, match="closed"):
        c.get("w")
    with pytest.raises(pserver.InvalidArgument, match="not both"):
        pserver.Client(["127.0.0.1:1"], etcd="127.0.0.1:2379")
    with pytest.raises(pserver.InvalidArgument, match="endpoints"):
        pserver.Client(etcd=" , ")
    with pytest.raises(pserver.InvalidArgument):
        pserver.Client([])
    with pytest.raises(pserver.InvalidArgument, match="timeout"):
        pserver.Client(["127.0.0.1:1"], timeout=0)
    with pytest.raises(pserver.InvalidArgument, match="at least 1 server"):
        pserver.LocalCluster(servers=0)


def test_failed_precondition_without_checkpoint_dir(client):
    with pytest.raises(pserver.FailedPrecondition, match="checkpoint"):
        client.save_checkpoint()
