"""pserver: a distributed parameter server, from Python.

Numpy arrays in and out; the servers apply the optimizer. An embedded cluster
needs nothing else running:

>>> import numpy as np, pserver
>>> with pserver.LocalCluster(servers=2) as cluster:
...     client = cluster.client()
...     client.init("w", np.zeros(4, np.float32), optimizer="adam", lr=0.1)
...     client.finish_init()
...     for _ in range(3):
...         w = client.push_pull({"w": np.ones(4, np.float32)})["w"]
...     print(w.round(2))
[-0.3 -0.3 -0.3 -0.3]

Sparse and KV tables (``client.create_table``) and collectives
(``client.group``) are in docs/tables.md. Servers elsewhere: ``pserver.Client(["host:7000", "host:7001"])``. Errors are
:class:`pserver.Error` subclasses, one per status code (``NotFound`` is also a
``KeyError``, ``InvalidArgument`` a ``ValueError``, ...). Every call releases
the GIL while it runs, so trainer threads push and pull in parallel.
"""

from ._errors import (Aborted, AlreadyExists, AlreadyInitialized, Cancelled, Closed,
                      DataLoss, DeadlineExceeded, Error, FailedPrecondition, Internal,
                      InvalidArgument, NotFound, OutOfRange, PermissionDenied,
                      ResourceExhausted, Unauthenticated, Unavailable, Unimplemented,
                      Uninitialized, Unknown, error_from_status)
from ._arrays import DTYPES
from ._calls import version
from ._checkpoint import CheckpointReader, read_checkpoint, reshard_checkpoint
from ._client import Client
from ._config import param_config_text
from ._etcd import Etcd
from ._server import LocalCluster, Server
from ._group import Group
from ._tables import KvWorker, Table
from ._keys import EtcdKey, EtcdKeys
from ._tls import Tls

__version__ = version()

__all__ = [
    "Client", "Server", "Tls", "LocalCluster", "CheckpointReader", "read_checkpoint",
    "reshard_checkpoint",
    "Etcd", "EtcdKeys", "EtcdKey", "Table", "KvWorker", "Group", "param_config_text", "version", "DTYPES", "error_from_status",
    "Error", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
    "AlreadyInitialized", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Uninitialized", "Closed", "Aborted", "OutOfRange",
    "Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated",
]
