"""pserver.Etcd: the C ABI's raw etcd calls against a real etcd on 127.0.0.1.

etcd is started here on free ports and stopped by its PID.
"""
import threading
import time

import pytest

import pserver
from etcd_process import EtcdProcess, free_port, have_etcd

pytestmark = pytest.mark.skipif(not have_etcd(), reason="needs etcd")


@pytest.fixture(scope="module")
def etcd_endpoint(tmp_path_factory):
    """host:port of a fresh etcd, serving (waited for, at most 30 s)."""
    with EtcdProcess(tmp_path_factory.mktemp("etcd_client"), name="pytest-raw") as etcd:
        yield etcd.endpoint


def test_put_get_list_delete(etcd_endpoint):
    with pserver.Etcd([etcd_endpoint], timeout=5) as etcd:
        assert "pserver.Etcd" in repr(etcd)
        etcd.put("/t/a", b"\x00binary\xff")  # bytes, NULs included
        etcd.put("/t/b", "text")              # str: UTF-8
        etcd.put("/t/c", b"")
        etcd.put("/u/x", b"other prefix")
        assert etcd.get("/t/a") == b"\x00binary\xff"
        assert etcd.get("/t/b") == b"text"
        assert etcd.get("/t/c") == b""
        assert etcd.list("/t/") == [("/t/a", b"\x00binary\xff"), ("/t/b", b"text"),
                                    ("/t/c", b"")]
        assert etcd.get_prefix("/u/") == [("/u/x", b"other prefix")]
        assert etcd.list("/none/") == []
        etcd.delete("/t/b")
        etcd.delete("/t/b")  # absent: not an error
        with pytest.raises(pserver.NotFound) as info:
            etcd.get("/t/b")
        assert isinstance(info.value, KeyError)
        assert [k for k, _ in etcd.list("/t/")] == ["/t/a", "/t/c"]
    assert etcd.closed
    etcd.close()  # twice is fine
    with pytest.raises(pserver.Closed):
        etcd.get("/t/a")


def test_threads_share_one_client(etcd_endpoint):
    errors = []

    def work(i: int) -> None:
        try:
            for j in range(10):
                etcd.put(f"/threads/{i}/{j}", str(j))
        except Exception as e:  # reported below
            errors.append(e)

    with pserver.Etcd(etcd_endpoint) as etcd:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors and not any(t.is_alive() for t in threads)
        assert len(etcd.list("/threads/")) == 40


def test_unreachable_and_bad_arguments():
    with pytest.raises(pserver.InvalidArgument):
        pserver.Etcd("")
    with pytest.raises(pserver.InvalidArgument):
        pserver.Etcd("127.0.0.1:1", timeout=0)
    # Nothing listens on a freshly freed port: the call ends within its timeout.
    with pserver.Etcd(f"127.0.0.1:{free_port()}", timeout=0.3) as etcd:
        start = time.monotonic()
        with pytest.raises((pserver.Unavailable, pserver.DeadlineExceeded)):
            etcd.get("/x")
        assert time.monotonic() - start < 10
