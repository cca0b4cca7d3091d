"""Tables: sparse embeddings and KV tables with clocks.

A table maps uint64 keys to rows of ``dim`` float32 or float64 values, spread
over every server (docs/tables.md). Pulls and pushes take numpy arrays of
keys; rows come back as an ``(n, dim)`` array in key order. With the ``add``
optimizer and a consistency model (``"bsp"``, ``"ssp"`` with a staleness),
a table is a KV table whose workers (:class:`KvWorker`) read at their clock.

Arrays are never converted to another dtype behind your back: float64 rows
for a float32 table raise :class:`InvalidArgument`. Keys are uint64, or
int64 (a PyTorch index tensor) and lists when non-negative: a negative key
raises InvalidArgument naming it.

>>> import numpy as np, pserver
>>> with pserver.LocalCluster(servers=2) as cluster:
...     client = cluster.client()
...     emb = client.create_table("emb", dim=2, optimizer="sgd", lr=1.0)
...     keys = np.array([3, 3, 8], np.uint64)
...     emb.push(keys, np.ones((3, 2), np.float32))   # duplicate keys summed
...     print(emb.pull(keys))
[[-2. -2.]
 [-2. -2.]
 [-1. -1.]]
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import capi as _c
from ._arrays import _host, _is_dlpack, _out_array
from ._calls import _blocking, _deadline
from ._config import _setting
from ._handles import _Handle, _HandleOwner
from ._errors import InvalidArgument

__all__ = ["Table", "KvWorker"]

_CONSISTENCY = {"asp": _c.PSERVER_ASP, "bsp": _c.PSERVER_BSP, "ssp": _c.PSERVER_SSP}
_TABLE_DTYPES = {np.dtype(np.float32): _c.PSERVER_FLOAT32,
                 np.dtype(np.float64): _c.PSERVER_FLOAT64}
_TABLE_NUMPY = {code: dt for dt, code in _TABLE_DTYPES.items()}


def _choice(value: str, choices: Dict[str, int], what: str) -> int:
    code = choices.get(str(value).lower())
    if code is None:
        raise InvalidArgument(f"unknown {what} {value!r}; want one of {', '.join(choices)}")
    return code


def _keys(keys: Any, what: str) -> np.ndarray:
    """A 1-d, C-contiguous uint64 array of keys. uint64 arrays are used as
    they are; signed integer arrays (int64, a PyTorch index tensor through
    DLPack) and lists are converted when every key is non-negative, and a
    negative key raises InvalidArgument naming it. Other dtypes raise."""
    if isinstance(keys, np.ndarray) or _is_dlpack(keys):
        raw = _host(keys, what)
        if raw.dtype.kind not in "iu":
            raise InvalidArgument(f"{what}: keys have dtype {raw.dtype}, expected uint64 or "
                                  "int64 (non-negative integers)")
    else:
        try:
            raw = np.asarray(keys)
        except (OverflowError, TypeError, ValueError) as e:
            raise InvalidArgument(f"{what}: keys must be non-negative integers: {e}") from None
        if raw.size == 0:
            raw = raw.astype(np.uint64)
        if raw.dtype.kind not in "iu":
            raise InvalidArgument(f"{what}: keys must be non-negative integers, got {keys!r}")
    if raw.ndim != 1:
        raise InvalidArgument(f"{what}: keys must be 1-d, got shape {raw.shape}")
    if raw.dtype.kind == "i":
        negative = np.flatnonzero(raw < 0)
        if negative.size:
            i = int(negative[0])
            raise InvalidArgument(f"{what}: key {int(raw[i])} at index {i} is negative "
                                  f"({negative.size} negative keys); keys are non-negative "
                                  "integers")
    if raw.dtype.itemsize == 8 and raw.dtype.isnative and raw.flags.c_contiguous:
        return raw.view(np.uint64)  # int64 or uint64: same bytes, no copy
    return np.ascontiguousarray(raw, dtype=np.uint64)


class _TableConfig:
    """A pserver_table_config_t built from keyword arguments, freed on exit."""

    def __init__(self, dim: Optional[int], dtype: Any, initializer: Optional[str],
                 optimizer: Optional[str], partition: Union[str, Tuple[int, int]],
                 consistency: Optional[str], staleness: int, config: Optional[str],
                 settings: Dict[str, Any], wire_compression: Optional[str] = None) -> None:
        self.ptr = _c.pserver_table_config_new()
        try:
            if config is not None:
                _c.pserver_table_config_parse_text(self.ptr, str(config))
            elif dim is None:
                raise InvalidArgument("create_table needs dim (or a config in text format)")
            if dim is not None:
                if not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 1 << 20:
                    raise InvalidArgument(f"dim must be an int in [1, 2^20], got {dim!r}")
                _c.pserver_table_config_set_dim(self.ptr, int(dim))
            if dtype is not None:
                code = _TABLE_DTYPES.get(np.dtype(dtype))
                if code is None:
                    raise InvalidArgument(
                        f"a table holds float32 or float64 values, not {np.dtype(dtype)}")
                _c.pserver_table_config_set_dtype(self.ptr, code)
            if initializer is not None:
                _c.pserver_table_config_set_initializer(self.ptr, str(initializer))
            if optimizer is not None:
                _c.pserver_table_config_set_optimizer(self.ptr, str(optimizer))
            if isinstance(partition, tuple):
                begin, end = partition
                _c.pserver_table_config_set_partitioning(
                    self.ptr, _c.PSERVER_PARTITION_RANGE, int(begin), int(end))
            elif str(partition).lower() != "hash":
                raise InvalidArgument(
                    f"partition must be \"hash\" or a key range (begin, end), got {partition!r}")
            if consistency is not None:
                _c.pserver_table_config_set_consistency(
                    self.ptr, _choice(consistency, _CONSISTENCY, "consistency"), int(staleness))
            if wire_compression is not None:
                _c.pserver_table_config_set_wire_type(self.ptr, str(wire_compression).lower())
            for key, value in settings.items():
                if value is not None:
                    _c.pserver_table_config_set(self.ptr, key, _setting("table", key, value))
        except BaseException:
            _c.pserver_table_config_delete(self.ptr)
            raise

    def __enter__(self) -> "_TableConfig":
        return self

    def __exit__(self, *exc: Any) -> None:
        _c.pserver_table_config_delete(self.ptr)
        self.ptr = None


def _create_table(client: Any, name: str, dim: Optional[int], *, dtype: Any,
                  initializer: Optional[str], optimizer: Optional[str],
                  partition: Union[str, Tuple[int, int]], consistency: Optional[str],
                  staleness: int, config: Optional[str], timeout: Optional[float],
                  settings: Dict[str, Any], wire_compression: Optional[str] = None) -> "Table":
    with _TableConfig(dim, dtype, initializer, optimizer, partition, consistency, staleness,
                      config, settings, wire_compression) as cfg, _deadline(timeout), client._h.use() as h:
        ptr = _blocking(_c.pserver_client_create_table, h, str(name), cfg.ptr)
    table = Table(client, ptr)
    client._adopt(table)
    return table


class Table(_HandleOwner):
    """A client's handle on one table on every server. Thread-safe.

    Made by :meth:`pserver.Client.create_table`; closed with its client.
    Every method takes ``timeout=`` (seconds; None: the client's timeout),
    raising DeadlineExceeded when it runs out.
    """

    def __init__(self, client: Any, ptr: Any) -> None:
        self._client = client
        self._name = _c.pserver_table_name(ptr)
        self._dim = int(_c.pserver_table_dim(ptr))
        self._dtype = _TABLE_NUMPY[_c.pserver_table_dtype(ptr)]
        self._chunk_size = int(_c.pserver_table_chunk_size(ptr))
        self._h = _Handle(ptr, _c.pserver_table_delete, "table")

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        """Values per row."""
        return self._dim

    @property
    def dtype(self) -> np.dtype:
        """np.float32 or np.float64."""
        return self._dtype

    @property
    def chunk_size(self) -> int:
        """Keys per chunk of KvWorker.get_chunk / add_chunk."""
        return self._chunk_size

    @property
    def config(self) -> str:
        """The table's pserver.v1.TableConfig in protobuf text format."""
        with self._h.use() as h:
            return _c.pserver_table_config_text_of(h)[1]

    def server_of(self, key: int) -> int:
        """The index of the server holding `key`."""
        with self._h.use() as h:
            return int(_c.pserver_table_server_of(h, int(key)))

    def _out(self, out: Any, rows: int, what: str) -> np.ndarray:
        """The array to write `rows` rows into: new, or a view of `out` (a
        numpy array, DLPack tensor or writable buffer; see _arrays._out_array)."""
        shape = (rows, self._dim)
        if out is None:
            return np.empty(shape, self._dtype)
        return _out_array(out, self._dtype, shape, what)

    def _rows(self, values: Any, rows: int, what: str) -> np.ndarray:
        values = _host(values, what, self._dtype)
        if values.dtype.newbyteorder("=") != self._dtype:
            raise InvalidArgument(f"{what}: dtype {values.dtype} received, the table holds "
                                  f"{self._dtype} (convert it yourself: "
                                  f"values.astype(np.{self._dtype}))")
        shape = (rows, self._dim)
        if tuple(values.shape) != shape and not (self._dim == 1 and values.shape == (rows,)):
            raise InvalidArgument(
                f"{what}: shape {tuple(values.shape)} received, {shape} expected")
        if not values.dtype.isnative:
            values = values.astype(self._dtype)
        return np.ascontiguousarray(values)

    def pull(self, keys: Any, out: Optional[np.ndarray] = None, *,
             timeout: Optional[float] = None) -> np.ndarray:
        """The rows of `keys` as an ``(n, dim)`` array in key order (or written
        into `out`, of that shape and the table's dtype). Rows are created on
        first touch from the table's initializer."""
        what = f"pull from table {self._name!r}"
        k = _keys(keys, what)
        arr = self._out(out, len(k), what)
        with _deadline(timeout), self._client._h.use(), self._h.use() as h:
            _blocking(_c.pserver_table_pull, h, k, arr)
        return arr if out is None else out

    def push(self, keys: Any, grads: Any, *, timeout: Optional[float] = None) -> None:
        """Applies `grads` (``(n, dim)``, the table's dtype) to the rows of
        `keys` with the table's optimizer; duplicate keys are summed."""
        what = f"push to table {self._name!r}"
        k = _keys(keys, what)
        g = self._rows(grads, len(k), what)
        with _deadline(timeout), self._client._h.use(), self._h.use() as h:
            _blocking(_c.pserver_table_push, h, k, g)

    def stats(self, *, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """One dict per server: server, rows, bytes, evictions, pending_keys,
        keys_pulled, keys_pushed, min_clock (-1: no worker) and workers."""
        with _deadline(timeout), self._client._h.use(), self._h.use() as h:
            _, stats = _blocking(_c.pserver_table_stats, h)
        return stats

    def join(self, worker_id: str, *, timeout: Optional[float] = None) -> "KvWorker":
        """Registers worker `worker_id` (unique per table) at the slowest
        worker's clock; use the result as a context manager to leave."""
        with _deadline(timeout), self._client._h.use(), self._h.use() as h:
            ptr = _blocking(_c.pserver_kv_worker_join, h, str(worker_id))
        worker = KvWorker(self, ptr)
        self._client._adopt(worker)
        return worker

    def close(self) -> None:
        """Frees the handle (the table stays on the servers); safe twice."""
        self._h.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<pserver.Table {self._name!r} dim={self._dim} {self._dtype}{state}>"


class KvWorker(_HandleOwner):
    """One worker of a table with clocks: reads at its clock (waiting for
    slower workers as the table's consistency says), adds, advances its clock.

    One worker per thread; calls on one worker are serialized. Leaving the
    ``with`` block (or close()) leaves the table, so the worker no longer
    holds the others back.

    >>> import numpy as np, pserver
    >>> with pserver.LocalCluster(servers=2) as cluster:
    ...     kv = cluster.client().create_table("kv", dim=1, optimizer="add",
    ...                                        consistency="ssp", staleness=1)
    ...     with kv.join("w0") as worker:
    ...         worker.add([1, 2], np.array([[5], [7]], np.float32))
    ...         print(worker.clock(), worker.get([1, 2]).ravel())
    1 [5. 7.]
    """

    def __init__(self, table: Table, ptr: Any) -> None:
        self._table = table
        self._id = _c.pserver_kv_worker_id(ptr)
        self._h = _Handle(ptr, _c.pserver_kv_worker_delete, "KV worker")
        self._lock = threading.Lock()

    @property
    def id(self) -> str:
        return self._id

    @property
    def table(self) -> Table:
        return self._table

    @property
    def current_clock(self) -> int:
        """The worker's clock (advanced by clock())."""
        with self._h.use() as h:
            return int(_c.pserver_kv_worker_current_clock(h))

    def _call(self, fn: Any, *args: Any, timeout: Optional[float]) -> Any:
        with _deadline(timeout), self._table._client._h.use(), self._lock, \
                self._h.use() as h:
            return _blocking(fn, h, *args)

    def get(self, keys: Any, out: Optional[np.ndarray] = None, *,
            timeout: Optional[float] = None) -> np.ndarray:
        """The rows of `keys` at this worker's clock, ``(n, dim)``. Under SSP
        (BSP) it waits until every worker has reached clock - staleness (0);
        DeadlineExceeded names the workers holding it back."""
        what = f"get from table {self._table.name!r}"
        k = _keys(keys, what)
        arr = self._table._out(out, len(k), what)
        self._call(_c.pserver_kv_worker_get, k, arr, timeout=timeout)
        return arr if out is None else out

    def add(self, keys: Any, values: Any, *, timeout: Optional[float] = None) -> None:
        """Adds `values` (``(n, dim)``) to the rows of `keys`, at this clock."""
        what = f"add to table {self._table.name!r}"
        k = _keys(keys, what)
        v = self._table._rows(values, len(k), what)
        self._call(_c.pserver_kv_worker_add, k, v, timeout=timeout)

    def get_chunk(self, chunk_ids: Any, out: Optional[np.ndarray] = None, *,
                  timeout: Optional[float] = None) -> np.ndarray:
        """Whole chunks: chunk c is keys [c * chunk_size, (c + 1) * chunk_size);
        ``(len(chunk_ids) * chunk_size, dim)`` rows."""
        what = f"get chunks from table {self._table.name!r}"
        ids = _keys(chunk_ids, what)
        arr = self._table._out(out, len(ids) * self._table.chunk_size, what)
        self._call(_c.pserver_kv_worker_get_chunk, ids, arr, timeout=timeout)
        return arr if out is None else out

    def add_chunk(self, chunk_ids: Any, values: Any, *, timeout: Optional[float] = None) -> None:
        what = f"add chunks to table {self._table.name!r}"
        ids = _keys(chunk_ids, what)
        v = self._table._rows(values, len(ids) * self._table.chunk_size, what)
        self._call(_c.pserver_kv_worker_add_chunk, ids, v, timeout=timeout)

    def clock(self, *, timeout: Optional[float] = None) -> int:
        """Advances this worker's clock by one on every server; the new clock."""
        self._call(_c.pserver_kv_worker_clock, timeout=timeout)
        return self.current_clock

    def leave(self, *, timeout: Optional[float] = None) -> None:
        """Unregisters the worker; later calls raise FailedPrecondition."""
        self._call(_c.pserver_kv_worker_leave, timeout=timeout)

    def close(self) -> None:
        """Leaves the table (best effort, at most 5 s) unless it left, and
        frees the handle; safe twice."""
        self._h.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"clock {self.current_clock}"
        return f"<pserver.KvWorker {self._id!r} of table {self._table.name!r} {state}>"
