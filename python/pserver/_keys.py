"""The etcd key layout of a pserver cluster, as the servers and trainers write it.

The layout is defined once, in the C ABI (``pserver_etcd_key``); this module
only forwards to it, so Python spells keys exactly as C++ and Go do. Every key
of cluster ``C`` starts with ``/pserver/C/``:

>>> keys = pserver.EtcdKeys("demo")
>>> keys.desired
'/pserver/demo/ps_desired'
>>> keys.server(3)
'/pserver/demo/ps/3'
>>> keys.parse("/pserver/demo/workers/trainer-7")
EtcdKey(kind='worker', index=0, worker_id='trainer-7')
"""

from __future__ import annotations

from typing import NamedTuple

from . import capi as _c
from ._errors import InvalidArgument

_KINDS = {
    _c.PSERVER_ETCD_KEY_DESIRED: "desired",
    _c.PSERVER_ETCD_KEY_SERVER: "server",
    _c.PSERVER_ETCD_KEY_CHECKPOINT: "checkpoint",
    _c.PSERVER_ETCD_KEY_WORKER: "worker",
    _c.PSERVER_ETCD_KEY_SHARD: "shard",
}


class EtcdKey(NamedTuple):
    """A parsed key: its kind ("desired", "server", "checkpoint", "shard" or
    "worker"), the index of a server, checkpoint or shard key, the id of a
    worker key."""

    kind: str
    index: int = 0
    worker_id: str = ""


class EtcdKeys:
    """The etcd keys of one cluster (``cluster``, "default" unless named).

    Raises pserver.InvalidArgument, naming what is wrong, for an index that
    is not a non-negative int below 2**32, an empty worker id, or a key
    :meth:`parse` cannot place.
    """

    def __init__(self, cluster: str = "default") -> None:
        self.cluster = str(cluster)

    def __repr__(self) -> str:
        return f"pserver.EtcdKeys({self.cluster!r})"

    def _key(self, kind: int, arg: str = "") -> str:
        return _c.pserver_etcd_key(kind, self.cluster, arg)[1]

    @property
    def prefix(self) -> str:
        """``/pserver/<cluster>/``: every key of the cluster starts with it."""
        return self._key(_c.PSERVER_ETCD_KEY_CLUSTER)

    @property
    def desired(self) -> str:
        """The key of the desired server count."""
        return self._key(_c.PSERVER_ETCD_KEY_DESIRED)

    @property
    def servers(self) -> str:
        """The prefix of the server keys."""
        return self._key(_c.PSERVER_ETCD_KEY_SERVERS)

    def server(self, index: int) -> str:
        """Server ``index``'s key; its value is the server's "host:port"."""
        return self._key(_c.PSERVER_ETCD_KEY_SERVER, _index_text(index))

    @property
    def checkpoints(self) -> str:
        """The prefix of the checkpoint records."""
        return self._key(_c.PSERVER_ETCD_KEY_CHECKPOINTS)

    def checkpoint(self, shard: int) -> str:
        """The key of shard ``shard``'s newest good checkpoint record (JSON)."""
        return self._key(_c.PSERVER_ETCD_KEY_CHECKPOINT, _index_text(shard))

    @property
    def shards(self) -> str:
        """The prefix of the shard configurations."""
        return self._key(_c.PSERVER_ETCD_KEY_SHARDS)

    def shard(self, shard: int) -> str:
        """The key of shard ``shard``'s epoch and holder (JSON, no lease)."""
        return self._key(_c.PSERVER_ETCD_KEY_SHARD, _index_text(shard))

    @property
    def workers(self) -> str:
        """The prefix of the trainer registrations."""
        return self._key(_c.PSERVER_ETCD_KEY_WORKERS)

    def worker(self, worker_id: str) -> str:
        """Trainer ``worker_id``'s registration key."""
        return self._key(_c.PSERVER_ETCD_KEY_WORKER, str(worker_id))

    def parse(self, key: str) -> EtcdKey:
        """The kind and argument of ``key``, a full key of this cluster."""
        kind, arg = _c.pserver_etcd_key_parse(self.cluster, str(key))
        kind = _KINDS[kind]
        if kind in ("server", "checkpoint", "shard"):
            return EtcdKey(kind, index=int(arg))
        return EtcdKey(kind, worker_id=arg)


def _index_text(index: int) -> str:
    # bool is an int, but True is not an index; the C ABI checks the range.
    if isinstance(index, bool) or not isinstance(index, int):
        raise InvalidArgument(f"an etcd key index must be an int, not {index!r}")
    return str(index)
