"""Shared fixtures: a fresh 2-server LocalCluster and its in-process client."""
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
