"""Group: worker groups running barriers, all-reduce and broadcast through
the servers."""

from __future__ import annotations

import threading
from typing import Any, Optional, Tuple

import numpy as np

from . import capi as _c
from ._arrays import _dtype_code, _writable_view
from ._calls import _blocking, _deadline
from ._errors import InvalidArgument
from ._handles import _Handle, _HandleOwner
from ._tables import _choice

__all__ = ["Group"]

_SCOPES = {"workers": _c.PSERVER_BARRIER_WORKERS, "servers": _c.PSERVER_BARRIER_SERVERS,
           "all": _c.PSERVER_BARRIER_ALL}
_OPS = {"sum": _c.PSERVER_REDUCE_SUM, "mean": _c.PSERVER_REDUCE_MEAN}


class Group(_HandleOwner):
    """This worker's membership of a group of `size` workers, for barriers,
    all-reduce and broadcast through the servers.

    Every member makes the same sequence of calls: the k-th call of a kind
    meets the others' k-th call. One thread per Group; its calls are
    serialized.

    >>> import threading, numpy as np, pserver
    >>> with pserver.LocalCluster(servers=2) as cluster:
    ...     client = cluster.client()
    ...     results = {}
    ...     def member(rank):
    ...         with client.group("g", size=2, participant=f"w{rank}") as g:
    ...             results[rank] = g.all_reduce(np.full(3, rank + 1, np.float32))
    ...     threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    ...     for t in threads: t.start()
    ...     for t in threads: t.join()
    ...     print(results[0], results[1])
    [3. 3. 3.] [3. 3. 3.]
    """

    def __init__(self, client: Any, ptr: Any, name: str, size: int, participant: str) -> None:
        self._client = client
        self._name = name
        self._size = size
        self._participant = participant
        self._h = _Handle(ptr, _c.pserver_group_delete, "group")
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    @property
    def participant(self) -> str:
        return self._participant

    def _call(self, fn: Any, *args: Any, timeout: Optional[float]) -> None:
        with _deadline(timeout), self._client._h.use(), self._lock, self._h.use() as h:
            _blocking(fn, h, *args)

    def barrier(self, scope: str = "workers", *, timeout: Optional[float] = None) -> None:
        """Waits for every member ("workers"), every server ("servers") or
        both ("all"). DeadlineExceeded says how many members arrived."""
        self._call(_c.pserver_group_barrier, _choice(scope, _SCOPES, "barrier scope"),
                   timeout=timeout)

    @staticmethod
    def _array(array: Any, what: str) -> Tuple[np.ndarray, int]:
        """A view of `array` (a numpy array, a DLPack tensor or a writable
        typed buffer) to reduce or broadcast in place, and its dtype code."""
        array = _writable_view(array, what)
        code = _dtype_code(array.dtype, what)
        if not array.dtype.isnative:
            raise InvalidArgument(f"{what}: array must be in native byte order")
        if not array.flags.c_contiguous or not array.flags.writeable:
            raise InvalidArgument(f"{what}: array must be C-contiguous and writable "
                                  f"(it is reduced in place)")
        return array, code

    def all_reduce(self, array: Any, op: str = "sum", *,
                   timeout: Optional[float] = None) -> Any:
        """Replaces `array` in place by the element-wise "sum" or "mean" over
        every member's array (same dtype and shape) and returns it. `array`
        may be a numpy array, a DLPack tensor (a PyTorch CPU tensor) or a
        writable typed buffer."""
        arr, code = self._array(array, f"all_reduce in group {self._name!r}")
        self._call(_c.pserver_group_all_reduce, code, arr.shape, arr,
                   _choice(op, _OPS, "reduce op"), timeout=timeout)
        return array

    def broadcast(self, array: Any, root: bool, *,
                  timeout: Optional[float] = None) -> Any:
        """The root's `array` is copied into every other member's `array` (of
        the root's dtype and shape), in place; returns it. Exactly one member
        passes root=True."""
        arr, code = self._array(array, f"broadcast in group {self._name!r}")
        self._call(_c.pserver_group_broadcast, code, arr.shape, arr, 1 if root else 0,
                   timeout=timeout)
        return array

    def __repr__(self) -> str:
        return (f"<pserver.Group {self._name!r} member {self._participant!r} of "
                f"{self._size}{' closed' if self.closed else ''}>")


def _group(client: Any, name: str, size: int, participant: str) -> Group:
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise InvalidArgument(f"a group needs a size of at least 1 member, got {size!r}")
    with client._h.use() as h:
        ptr = _c.pserver_group_new(h, str(name), int(size), str(participant))
    group = Group(client, ptr, str(name), int(size), str(participant))
    client._adopt(group)
    return group

