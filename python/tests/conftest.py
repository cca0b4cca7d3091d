"""Shared fixtures: a fresh 2-server LocalCluster and its in-process client;
run_threads for tests with several workers."""
import threading

import numpy as np
import pytest

import pserver


@pytest.fixture
def cluster():
    with pserver.LocalCluster(servers=2) as c:
        yield c


@pytest.fixture
def client(cluster):
    return cluster.client()


ALL_DTYPES = [np.float32, np.float64, np.int32, np.uint32, np.int64, np.uint64]


def run_threads(n, body, timeout=60):
    """Runs body(rank) on n threads, waiting up to `timeout` seconds for each;
    re-raises the first failure."""
    errors = []

    def wrap(rank):
        try:
            body(rank)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
        assert not t.is_alive(), "a worker thread did not finish"
    if errors:
        raise errors[0]
