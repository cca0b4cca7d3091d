"""Client: a trainer's handle on a set of parameter servers.

Every blocking method checks dtype, shape and contiguity here, then makes
one library call through ``_calls._blocking`` (see pserver._arrays for the
checks and pserver._calls for deadlines and Ctrl-C).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import capi as _c
from ._arrays import (DTYPES, _NUMPY, ArrayLike, Shape, _as_array, _check_device,
                      _device_array, _DeviceArray, _host, _out_array)
from ._calls import _blocking, _deadline
from ._config import _client_options, _Config
from ._errors import AlreadyInitialized, InvalidArgument
from ._etcd import _etcd_tls_files
from ._handles import _Handle, _HandleOwner
from ._group import Group, _group
from ._tables import Table, _create_table
from ._tls import Tls, _set_client_tls

# PSERVER_HEALTH_* (grpc.health.v1 HealthCheckResponse.ServingStatus) by value.
_HEALTH_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


# How the servers end the AlreadyInitialized of an init that repeats an
# earlier one exactly (type, shape and config).
_SAME_INIT = "with the same type, shape and config"


class Client(_HandleOwner):
    """A trainer's handle on a set of parameter servers. Thread-safe.

    Parameters are numpy arrays of float32, float64, int32, uint32, int64 or
    uint64. The first ``init`` of a name wins (later ones raise
    :class:`AlreadyInitialized`); ``finish_init`` opens the servers, before
    which ``get`` and ``send_grad`` raise :class:`Uninitialized`.

    >>> import numpy as np, pserver
    >>> with pserver.LocalCluster(servers=2) as cluster:
    ...     client = cluster.client()
    ...     client.init("w", np.zeros(3, np.float32), optimizer="sgd", lr=0.5)
    ...     client.finish_init()
    ...     client.send_grad("w", np.ones(3, np.float32))
    ...     print(client.get("w"))
    [-0.5 -0.5 -0.5]

    Over gRPC: ``pserver.Client(["127.0.0.1:7000", "127.0.0.1:7001"])``; or
    found in etcd: ``pserver.Client(etcd="127.0.0.1:2379", cluster="default")``
    waits (up to `discovery_timeout` seconds, default 60) for the cluster's
    desired number of servers to register, follows restarted servers and
    registers this trainer under /pserver/<cluster>/workers/.

    Mutual TLS: ``tls=pserver.Tls(cert="trainer.pem", key="trainer.key",
    ca="ca.pem")`` (or a dict of the same keys, plus ``server_name``).

    Roles (docs/security.md): ``token="..."`` is sent as the bearer token to
    servers started with ``--auth_tokens_file``; etcd over TLS with a client
    certificate: ``etcd_tls={"ca": ..., "cert": ..., "key": ...}`` (or an
    object with those attributes). ``require_instance_id=True`` refuses a
    /ps/<idx> entry that names no server instance (a bare "host:port", as
    etcdctl writes it): the constructor raises FailedPrecondition naming the
    key, and such an entry seen later is ignored.
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None, *,
                 etcd: Optional[str] = None, cluster: str = "default",
                 timeout: float = 30.0, discovery_timeout: Optional[float] = None,
                 block_bytes: Optional[int] = None, max_request_bytes: Optional[int] = None,
                 channels_per_server: Optional[int] = None,
                 tls: Union[None, Tls, Mapping[str, Any]] = None,
                 token: Optional[str] = None, etcd_tls: Any = None,
                 require_instance_id: bool = False) -> None:
        if etcd is not None and servers is not None:
            raise InvalidArgument("pserver.Client: pass servers=[...] or etcd=..., not both")
        if etcd is None and servers is None:
            raise InvalidArgument("pserver.Client needs servers=[\"host:port\", ...] "
                                  "or etcd=\"host:port\"")
        if discovery_timeout is not None and discovery_timeout <= 0:
            raise InvalidArgument(
                f"discovery_timeout must be positive, got {discovery_timeout}")
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s]
        self._servers = list(servers) if servers is not None else []
        with _client_options(timeout, block_bytes, max_request_bytes,
                             channels_per_server) as opts:
            for address in self._servers:
                _c.pserver_client_options_add_server(opts, str(address))
            _set_client_tls(opts, tls)
            if token is not None:
                _c.pserver_client_options_set_token(opts, str(token))
            if etcd_tls is not None:
                _c.pserver_client_options_set_etcd_tls(opts, *_etcd_tls_files(etcd_tls))
            _c.pserver_client_options_set_require_instance_id(
                opts, 1 if require_instance_id else 0)
            if etcd is not None:
                _c.pserver_client_options_set_etcd(opts, str(etcd), str(cluster))
                if discovery_timeout is not None:
                    _c.pserver_client_options_set_discovery_timeout_ms(
                        opts, max(1, int(discovery_timeout * 1000)))
            ptr = _c.pserver_client_new(opts)
        self._h = _Handle(ptr, _c.pserver_client_delete, "client")
        self._layouts: Dict[str, Tuple[np.dtype, Shape]] = {}
        self._kind = "grpc"
        if etcd is not None:
            self._kind = f"etcd {etcd} cluster {cluster!r}"
            self._servers = [
                _c.pserver_client_server_address(ptr, i)[1]
                for i in range(_c.pserver_client_num_servers(ptr))]

    @classmethod
    def _from_handle(cls, ptr: Any, servers: List[str], kind: str) -> "Client":
        self = cls.__new__(cls)
        self._servers = servers
        self._h = _Handle(ptr, _c.pserver_client_delete, "client")
        self._layouts = {}
        self._kind = kind
        return self

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Closes the tables, KV workers (which leave) and groups made from
        this client, waits for calls in flight and frees the client; safe to
        call twice."""
        for child in list(self.__dict__.get("_children", ())):
            child.close()
        self._h.close()

    def _adopt(self, child: Any) -> None:
        """Closes `child` (a Table, KvWorker or Group) when the client closes."""
        self.__dict__.setdefault("_children", weakref.WeakSet()).add(child)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._servers)} servers"
        return f"<pserver.Client {self._kind} {state}: {', '.join(self._servers)}>"

    @property
    def num_servers(self) -> int:
        return len(self._servers)

    @property
    def servers(self) -> List[str]:
        return list(self._servers)

    # -- init ----------------------------------------------------------------

    def init(self, name: str, value: ArrayLike, *, dtype: Any = None,
             optimizer: Optional[str] = None, schedule: Optional[str] = None,
             config: Union[None, str, Mapping[str, Any]] = None,
             timeout: Optional[float] = None, exist_ok: bool = False,
             **settings: Any) -> None:
        """Initializes parameter `name` with `value` and how the server updates it.

        `optimizer`: "sgd" (default), "adagrad", "adadelta", "rmsprop", "adam",
        "adamw" or "add" (p += g, for integer parameters). `schedule`:
        "constant", "linear", "step" or "cosine". Every other keyword is a
        setting named as in proto/pserver/v1/config.proto: ``lr`` (or
        ``learning_rate``), ``momentum``, ``nesterov``, ``weight_decay``,
        ``beta1``, ``beta2``, ``epsilon``, ``rho``, ``alpha``, ``centered``,
        ``warmup_steps``, ``decay_steps``, ``gamma``, ``clip_norm``,
        ``clip_value``, ... `config` may also be a dict of the same keys or a
        ParameterConfig in protobuf text format.

        >>> client.init("emb", np.zeros((10, 4), np.float32), optimizer="adam",
        ...             lr=0.01, beta1=0.8, clip_norm=1.0)   # doctest: +SKIP

        Raises AlreadyInitialized if `name` was initialized before, and
        InvalidArgument for an unsupported dtype or an unknown setting.
        `exist_ok=True` (a notebook cell run again against a live cluster,
        before or after finish_init): a parameter initialized before with the
        same dtype, shape and config is kept as it is (its values are not
        reset) and no error is raised; one with another dtype, shape or config
        still raises AlreadyInitialized saying what differs.
        `timeout` (seconds; every blocking method takes it) bounds this call:
        it ends by then, raising DeadlineExceeded at the latest (None: the
        client's own timeout).
        """
        arr = _as_array(value, f"parameter {name!r}", dtype)
        code = DTYPES[arr.dtype]  # _as_array checked it
        try:
            with _Config(optimizer, schedule, config, settings) as cfg, _deadline(timeout), \
                    self._h.use() as h:
                _blocking(_c.pserver_client_init_param, h, name, code, arr.shape, arr, cfg.ptr)
        except AlreadyInitialized as e:
            # The servers say whether the earlier init was this one exactly
            # (cc/core/parameter_store.cc, kSameInit).
            if not (exist_ok and _SAME_INIT in str(e)):
                raise
        self._layouts[name] = (arr.dtype, tuple(arr.shape))

    init_param = init

    def finish_init(self, *, timeout: Optional[float] = None) -> None:
        """Opens every server for reads and gradients (idempotent).

        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout), self._h.use() as h:
            _blocking(_c.pserver_client_finish_init, h)

    # -- reads ---------------------------------------------------------------

    def info(self, name: str, *, timeout: Optional[float] = None) -> Tuple[np.dtype, Shape]:
        """(dtype, shape) of parameter `name`; raises NotFound if unknown."""
        with _deadline(timeout), self._h.use() as h:
            code, shape = _blocking(_c.pserver_client_param_info, h, name)
        return _NUMPY[code], tuple(shape)

    def _layout(self, name: str) -> Tuple[np.dtype, Shape]:
        """info(name), asked of the library once per name: a parameter's
        dtype and shape never change (the first init wins), so every later
        push and pull is a single library call."""
        layout = self._layouts.get(name)
        if layout is None:
            layout = self._layouts[name] = self.info(name)
        return layout

    def _out(self, name: str, out: Any) -> Tuple[np.ndarray, int]:
        dtype, shape = self._layout(name)
        if out is None:
            return np.empty(shape, dtype), DTYPES[dtype]
        return _out_array(out, dtype, shape, f"parameter {name!r}"), DTYPES[dtype]

    def get(self, name: str, out: Any = None, *,
            timeout: Optional[float] = None) -> Any:
        """Parameter `name` as a new array (or written into `out`, which must
        have its dtype and shape and be C-contiguous and writable, and is
        returned). `out` may be a numpy array, a DLPack tensor (a PyTorch CPU
        tensor: written in place) or any writable buffer (a ``bytearray`` of
        the parameter's size in bytes, an ``array.array`` of its elements).

        `out` may also be device memory: any object exposing
        ``__cuda_array_interface__`` (a CuPy array, a PyTorch CUDA tensor),
        filled straight from the servers through pinned host memory. Without
        a GPU that raises Unavailable ("no CUDA device: ...").

        `timeout`: seconds this call may take (None: the client's timeout);
        DeadlineExceeded when it runs out.

        >>> client.get("w", timeout=0.5)   # doctest: +SKIP
        >>> client.get("w", out=cupy.empty(4, cupy.float32))   # doctest: +SKIP
        """
        with _deadline(timeout):
            dev = _device_array(out, f"parameter {name!r}")
            if dev is not None:
                dtype, shape = self._layout(name)
                _check_device(dev, dtype, shape, f"parameter {name!r}", writable=True)
                with self._h.use() as h:
                    _blocking(_c.pserver_client_get_param_device, h, name, DTYPES[dtype],
                              dev.ptr, dev.nbytes, dev.device)
                return out
            arr, code = self._out(name, out)
            with self._h.use() as h:
                _blocking(_c.pserver_client_get_param, h, name, code, arr)
        return arr if out is None else out

    def get_many(self, names: Sequence[str], out: Optional[Mapping[str, Any]] = None, *,
                 timeout: Optional[float] = None) -> Dict[str, Any]:
        """Several parameters in one round trip per server, by name. `out`
        may give what to write each into, by name (numpy arrays, DLPack
        tensors such as PyTorch CPU tensors, writable buffers; see get)."""
        with _deadline(timeout):
            return self._get_many(names, out)

    def _get_many(self, names: Sequence[str],
                  out: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        given = {} if out is None else out
        outs = {name: self._out(name, given.get(name)) for name in names}
        with self._h.use() as h:
            _blocking(_c.pserver_client_get_params_n, h,
                      [(name, code, arr) for name, (arr, code) in outs.items()])
        return {name: given[name] if given.get(name) is not None else arr
                for name, (arr, _) in outs.items()}

    # -- gradients -------------------------------------------------------------

    def _grad(self, name: str, grad: ArrayLike) -> Tuple[np.ndarray, int]:
        dtype, shape = self._layout(name)
        what = f"gradient for parameter {name!r}"
        grad = _host(grad, what, dtype)
        if grad.dtype.newbyteorder("=") != dtype:
            raise InvalidArgument(f"{what}: dtype {grad.dtype} received, {dtype} expected "
                                  f"(convert it yourself: grad.astype(np.{dtype}))")
        if tuple(grad.shape) != shape:
            raise InvalidArgument(f"{what}: shape {tuple(grad.shape)} received, {shape} "
                                  "expected")
        return _as_array(grad, what), DTYPES[dtype]

    def _device_grad(self, name: str, grad: Any) -> Optional[Tuple[_DeviceArray, int]]:
        """The device memory of `grad` checked against the parameter, or None
        for a gradient in host memory."""
        what = f"gradient for parameter {name!r}"
        dev = _device_array(grad, what)
        if dev is None:
            return None
        dtype, shape = self._layout(name)
        _check_device(dev, dtype, shape, what, writable=False)
        return dev, DTYPES[dtype]

    def send_grad(self, name: str, grad: ArrayLike, *,
                  timeout: Optional[float] = None) -> None:
        """Sends a gradient of the parameter's dtype and shape; the server applies
        the optimizer. Raises InvalidArgument for any other dtype or shape.

        `grad` may be device memory: any object exposing
        ``__cuda_array_interface__`` (a CuPy array, a PyTorch CUDA tensor),
        C-contiguous; it is sent straight from the device through pinned
        host memory, the copies overlapping the network. Without a GPU that
        raises Unavailable ("no CUDA device: ...").
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout):
            device = self._device_grad(name, grad)
            if device is not None:
                dev, dcode = device
                with self._h.use() as h:
                    _blocking(_c.pserver_client_send_grad_device, h, name, dcode, dev.ptr,
                              dev.nbytes, dev.device)
                return
            arr, code = self._grad(name, grad)
            with self._h.use() as h:
                _blocking(_c.pserver_client_send_grad, h, name, code, arr)

    def send_grads(self, grads: Mapping[str, ArrayLike], *,
                   timeout: Optional[float] = None) -> None:
        """Sends several gradients in one round trip per server; a batch with
        any bad part is applied not at all. Device arrays among them (see
        send_grad) are checked with the rest, then sent one by one after the
        host ones."""
        with _deadline(timeout):
            device = {name: self._device_grad(name, g) for name, g in grads.items()}
            self._send_grads({name: g for name, g in grads.items() if device[name] is None})
            for name, d in device.items():
                if d is not None:
                    with self._h.use() as h:
                        _blocking(_c.pserver_client_send_grad_device, h, name, d[1],
                                  d[0].ptr, d[0].nbytes, d[0].device)

    def _send_grads(self, grads: Mapping[str, ArrayLike]) -> None:
        if not grads:
            return
        arrays = [(name, *self._grad(name, g)) for name, g in grads.items()]
        with self._h.use() as h:
            _blocking(_c.pserver_client_send_grads_n, h,
                      [(name, code, arr) for name, arr, code in arrays])

    def push_pull(self, grads: Mapping[str, ArrayLike],
                  out: Optional[Mapping[str, np.ndarray]] = None, *,
                  timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """Sends gradients and returns the parameters after their update, in
        one round trip per server. `out` may give arrays to fill, by name.

        A gradient in device memory (see send_grad) needs a device array in
        `out` for its parameter (it may be the gradient itself, overwritten);
        each is a device push-pull of its own, after the host ones.
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout):
            device = {name: self._device_grad(name, g) for name, g in grads.items()}
            targets: Dict[str, Tuple[Any, _DeviceArray]] = {}
            for name, d in device.items():
                if d is None:
                    continue
                what = f"parameter {name!r}"
                target = None if out is None else out.get(name)
                dev_out = _device_array(target, what)
                if dev_out is None:
                    raise InvalidArgument(
                        f"{what}: a device gradient needs a device array to receive the "
                        "parameter in `out` (it may be the gradient itself)")
                _check_device(dev_out, d[0].dtype, d[0].shape, what, writable=True)
                if dev_out.device != d[0].device:
                    raise InvalidArgument(f"{what}: gradient on cuda:{d[0].device}, output on "
                                          f"cuda:{dev_out.device}")
                targets[name] = (target, dev_out)
            host = {name: g for name, g in grads.items() if device[name] is None}
            results = self._push_pull(host, out) if host else {}
            for name, (target, dev_out) in targets.items():
                dev, code = device[name]
                with self._h.use() as h:
                    _blocking(_c.pserver_client_push_pull_device, h, name, code, dev.ptr,
                              dev_out.ptr, dev.nbytes, dev.device)
                results[name] = target
            return results

    def _push_pull(self, grads: Mapping[str, ArrayLike],
                   out: Optional[Mapping[str, np.ndarray]]) -> Dict[str, np.ndarray]:
        arrays = [(name, *self._grad(name, g)) for name, g in grads.items()]
        results: Dict[str, Any] = {}
        views: Dict[str, np.ndarray] = {}
        for name, arr, _ in arrays:
            target = None if out is None else out.get(name)
            if target is None:
                target = views[name] = np.empty_like(arr)
            else:
                views[name] = _out_array(target, arr.dtype, arr.shape, f"parameter {name!r}")
            results[name] = target
        with self._h.use() as h:
            _blocking(_c.pserver_client_push_pull_n, h,
                      [(name, code, arr, views[name]) for name, arr, code in arrays])
        return results

    # -- tables and groups ------------------------------------------------------

    def create_table(self, name: str, dim: Optional[int] = None, dtype: Any = None, *,
                     initializer: Optional[str] = None, optimizer: Optional[str] = None,
                     seed: Optional[int] = None, ttl_seconds: Optional[float] = None,
                     capacity: Optional[int] = None, admission_count: Optional[int] = None,
                     partition: Union[str, Tuple[int, int]] = "hash",
                     consistency: Optional[str] = None, staleness: int = 0,
                     chunk_size: Optional[int] = None, config: Optional[str] = None,
                     wire_compression: Optional[str] = None,
                     timeout: Optional[float] = None, **settings: Any) -> "Table":
        """Creates table `name` on every server (or opens it, given the same
        config) and returns a :class:`pserver.Table` of `dim` values per row.

        `dtype`: np.float32 (the default) or np.float64. `initializer`: "zeros" (default),
        "uniform" (settings ``low``, ``high``) or "normal" (``mean``,
        ``stddev``), with `seed`. `optimizer`: "sgd" (default), "adagrad",
        "adam", "ftrl" or "add" (a KV table), with its settings as keywords
        (``lr``, ``beta1``, ``epsilon``, ``initial_accumulator``, ``alpha``,
        ``l1``, ...). Eviction: `ttl_seconds`, `capacity` (rows per server),
        `admission_count`. `partition`: "hash" or a key range ``(begin, end)``.
        `consistency`: "asp" (default), "bsp" or "ssp" with `staleness`.
        `chunk_size`: keys per chunk for KvWorker.get_chunk.
        `wire_compression`: "float16" or "bfloat16" to push gradient rows and
        pull rows of a float32 table in half precision; the settings
        ``topk_fraction`` or ``topk_count`` send only the top-k rows of each
        push (by L2 norm) and keep the rest in a per-row residual on this
        client (error feedback; at most ``max_residual_rows`` rows, default
        1,048,576, least recently pushed dropped first). `config` may
        give a pserver.v1.TableConfig in text format, which the other
        arguments then amend.

        >>> emb = client.create_table("emb", 16, initializer="normal", stddev=0.01,
        ...                           optimizer="adagrad", lr=0.05)   # doctest: +SKIP

        Raises InvalidArgument for a bad setting and AlreadyExists when the
        table exists with another config.
        """
        settings = dict(settings, seed=seed, ttl_seconds=ttl_seconds, capacity=capacity,
                        admission_count=admission_count, chunk_size=chunk_size)
        return _create_table(self, name, dim, dtype=dtype, initializer=initializer,
                             optimizer=optimizer, partition=partition, consistency=consistency,
                             staleness=staleness, config=config, timeout=timeout,
                             settings=settings, wire_compression=wire_compression)

    def group(self, name: str, size: int, participant: str) -> "Group":
        """This worker's membership `participant` (unique in the group) of
        group `name` of `size` workers: a :class:`pserver.Group` for barrier,
        all_reduce and broadcast. One Group per worker thread."""
        return _group(self, name, size, participant)

    def save_checkpoint(self, *, timeout: Optional[float] = None) -> None:
        """Asks every server to write a checkpoint of its shard now.

        Raises FailedPrecondition when a server has no checkpoint directory.
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout), self._h.use() as h:
            _blocking(_c.pserver_client_save_checkpoint, h)

    def health(self, *, timeout: Optional[float] = None) -> List[str]:
        """Every server's gRPC health (grpc.health.v1), in index order: "SERVING"
        once registered, loaded and serving; "NOT_SERVING" while starting or
        draining. An unreachable server raises (Unavailable, DeadlineExceeded).
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout), self._h.use() as h:
            _, health = _blocking(_c.pserver_client_health, h)
        return [_HEALTH_NAMES.get(code, "UNKNOWN") for code in health]

    def stats(self, *, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """One dict per server: index, initialized, parameters, parameter_bytes,
        optimizer_state_bytes, gradients_applied, gets_served, ...
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout), self._h.use() as h:
            _, stats = _blocking(_c.pserver_client_stats, h)
        return stats

