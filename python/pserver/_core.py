"""Client, Server, LocalCluster and the checkpoint reader over the C ABI.

Every call goes through the SWIG module ``pserver.capi`` (which releases the
GIL while the C function runs) after the checks done here: dtype, shape,
contiguity. Arrays are never converted to another dtype behind your back: a
float64 gradient for a float32 parameter raises :class:`InvalidArgument`.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import queue
import threading
import time
import weakref
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import numpy as np

from . import capi as _c
from ._errors import Closed, InvalidArgument

__all__ = ["Client", "Server", "LocalCluster", "CheckpointReader", "read_checkpoint",
           "Etcd", "DTYPES", "version"]

# numpy dtype <-> pserver_dtype_t
DTYPES: Dict[np.dtype, int] = {
    np.dtype(np.int32): _c.PSERVER_INT32,
    np.dtype(np.uint32): _c.PSERVER_UINT32,
    np.dtype(np.int64): _c.PSERVER_INT64,
    np.dtype(np.uint64): _c.PSERVER_UINT64,
    np.dtype(np.float32): _c.PSERVER_FLOAT32,
    np.dtype(np.float64): _c.PSERVER_FLOAT64,
}
_NUMPY: Dict[int, np.dtype] = {code: dt for dt, code in DTYPES.items()}

ArrayLike = Any
Shape = Tuple[int, ...]


def version() -> str:
    """The version of libpserver.so, e.g. "0.2.0"."""
    return _c.pserver_version()


def _dtype_code(dtype: np.dtype, what: str) -> int:
    code = DTYPES.get(np.dtype(dtype).newbyteorder("="))
    if code is None:
        raise InvalidArgument(
            f"{what}: dtype {np.dtype(dtype)} is not supported; use one of "
            f"{', '.join(str(d) for d in DTYPES)}")
    return code


def _as_array(value: ArrayLike, what: str, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """A C-contiguous, native-byte-order array of a supported dtype.

    Copies only to make the memory C-contiguous or native-endian; the element
    type is never changed (unless `dtype` asks for it for a non-array input).
    """
    if isinstance(value, np.ndarray):
        if dtype is not None and value.dtype != np.dtype(dtype):
            raise InvalidArgument(
                f"{what}: array has dtype {value.dtype}, expected {np.dtype(dtype)}")
        arr = value
    else:
        arr = np.asarray(value, dtype=dtype)
    _dtype_code(arr.dtype, what)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    # Not np.ascontiguousarray for every array: it turns a 0-d array (a
    # scalar parameter, shape ()) into shape (1,). A 0-d array is always
    # contiguous, so only n-d arrays are ever copied here.
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


# ---- device memory: objects exposing __cuda_array_interface__ -----------------


class _DeviceArray:
    """What pserver reads of an object's ``__cuda_array_interface__``."""

    __slots__ = ("ptr", "dtype", "shape", "nbytes", "readonly", "device")

    def __init__(self, ptr: int, dtype: np.dtype, shape: Shape, readonly: bool,
                 device: int) -> None:
        self.ptr = ptr
        self.dtype = dtype
        self.shape = shape
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.readonly = readonly
        self.device = device


def _device_ordinal(obj: Any) -> int:
    """The CUDA device of a CuPy array (.device.id) or a PyTorch tensor
    (.device.index); 0 when the object does not say."""
    dev = getattr(obj, "device", None)
    for attr in ("index", "id"):
        value = getattr(dev, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _device_array(obj: Any, what: str) -> Optional[_DeviceArray]:
    """The device memory of `obj` if it exposes ``__cuda_array_interface__``
    (CuPy arrays, PyTorch CUDA tensors, Numba device arrays), else None.

    Raises InvalidArgument for a dtype pserver does not store, memory that
    is not C-contiguous, a masked array or a malformed interface.
    """
    if obj is None or isinstance(obj, np.ndarray):
        return None
    try:
        iface = obj.__cuda_array_interface__
    except AttributeError:
        return None
    try:
        shape = tuple(int(d) for d in iface["shape"])
        typestr = iface["typestr"]
        ptr, readonly = iface["data"]
        ptr = int(ptr) if ptr is not None else 0
        strides = iface.get("strides")
        mask = iface.get("mask")
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidArgument(f"{what}: malformed __cuda_array_interface__: {e!r}") from None
    try:
        dtype = np.dtype(typestr)
    except TypeError:
        raise InvalidArgument(f"{what}: __cuda_array_interface__ typestr {typestr!r} is not "
                              "a dtype") from None
    if not dtype.isnative:
        raise InvalidArgument(f"{what}: typestr {typestr!r} is not in native byte order")
    if DTYPES.get(dtype) is None:
        raise InvalidArgument(
            f"{what}: device array of dtype {dtype} (typestr {typestr!r}) is not supported; "
            f"use one of {', '.join(str(d) for d in DTYPES)}")
    if mask is not None:
        raise InvalidArgument(f"{what}: masked device arrays are not supported")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        expected.reverse()
        for dim, got, want in zip(shape, strides, expected):
            if dim > 1 and int(got) != want:
                raise InvalidArgument(
                    f"{what}: device array strides {tuple(strides)} are not C-contiguous for "
                    f"shape {shape} (expected {tuple(expected)}); make it contiguous first "
                    "(cupy.ascontiguousarray(x), x.contiguous())")
    return _DeviceArray(ptr, dtype, shape, bool(readonly), _device_ordinal(obj))


def _check_device(arr: _DeviceArray, dtype: np.dtype, shape: Shape, what: str,
                  writable: bool) -> None:
    if arr.dtype != dtype:
        raise InvalidArgument(f"{what}: device array has dtype {arr.dtype}, expected {dtype}")
    if arr.shape != tuple(shape):
        raise InvalidArgument(f"{what}: device array has shape {arr.shape}, expected "
                              f"{tuple(shape)}")
    if writable and arr.readonly:
        raise InvalidArgument(f"{what}: device array is read-only")


@contextlib.contextmanager
def _deadline(timeout: Optional[float]) -> Iterator[None]:
    """Every blocking library call this thread makes inside ends within
    `timeout` seconds from now, all together (DeadlineExceeded at the latest).

    None leaves the deadline as it is (the client's own timeout, or an
    enclosing one); an enclosing earlier deadline is kept.
    """
    if timeout is None:
        yield
        return
    if not timeout > 0:
        raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
    deadline = time.monotonic_ns() + max(1, int(timeout * 1e9))
    previous = _c.pserver_py_swap_call_deadline_ns(deadline)
    if previous:
        _c.pserver_py_swap_call_deadline_ns(min(previous, deadline))
    try:
        yield
    finally:
        _c.pserver_py_swap_call_deadline_ns(previous)


# The helper thread that runs the main thread's blocking calls, its queue of
# calls, and how often the main thread, waiting for one, looks for Ctrl-C.
_CALL_THREAD = "pserver-call"
_WAIT_SLICE_S = 0.05
_calls: Optional["queue.SimpleQueue[Callable[[], None]]"] = None
_calls_lock = threading.Lock()
_calls_started = 0  # calls the helper thread has started (tests wait on it)
_cancel: Any = None  # the main thread's next pserver_cancel_t


def _serve_calls(calls: "queue.SimpleQueue[Callable[[], None]]") -> None:
    global _calls_started
    while True:
        run = calls.get()
        _calls_started += 1
        run()


def _call_queue() -> "queue.SimpleQueue[Callable[[], None]]":
    """The helper thread's queue, starting the thread on first use."""
    global _calls
    with _calls_lock:
        if _calls is None:
            _calls = queue.SimpleQueue()
            threading.Thread(target=_serve_calls, args=(_calls,), name=_CALL_THREAD,
                             daemon=True).start()
        return _calls


def _forget_call_thread() -> None:
    """In a forked child the helper thread is gone: start a new one on use."""
    global _calls, _calls_lock
    _calls, _calls_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_call_thread)


def _blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs the blocking library call ``fn(*args)``: the one path of every
    blocking method.

    Python runs its SIGINT handler (KeyboardInterrupt) in the main thread
    only, and only between bytecodes: a main thread inside a C call would
    see Ctrl-C when the call ends, at its deadline. So calls from the main
    thread run on one helper thread while the main thread waits in short
    slices. On KeyboardInterrupt the call is cancelled (pserver_cancel_t: its
    gRPC requests end at once), waited for, and KeyboardInterrupt is raised,
    chained to what the call raised (pserver.Cancelled). The helper runs the
    call under this thread's deadline. Other threads call directly: no
    KeyboardInterrupt is ever raised there.
    """
    global _cancel
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    # One handle serves call after call until one is cancelled (it stays so).
    cancel = _cancel if _cancel is not None else _c.pserver_cancel_new()
    _cancel = None
    deadline = _c.pserver_py_call_deadline_ns()
    outcome: Dict[str, Any] = {}
    done = _thread.allocate_lock()
    done.acquire()

    def run() -> None:
        previous_deadline = _c.pserver_py_swap_call_deadline_ns(deadline)
        previous_cancel = _c.pserver_py_swap_call_cancel(cancel)
        try:
            outcome["value"] = fn(*args)
        except BaseException as e:  # handed to the caller
            outcome["error"] = e
        finally:
            _c.pserver_py_swap_call_cancel(previous_cancel)
            _c.pserver_py_swap_call_deadline_ns(previous_deadline)
            done.release()

    queued = False
    try:
        _call_queue().put(run)
        queued = True
        # Short slices: a SIGINT the kernel hands to another thread wakes no
        # blocked wait; between slices the main thread runs Python's handler.
        while not done.acquire(timeout=_WAIT_SLICE_S):
            pass
    except KeyboardInterrupt as interrupt:
        # Cancelling is sticky: a call that has not started yet ends at once.
        _c.pserver_cancel_cancel(cancel)
        while queued:
            try:  # promptly now; a second Ctrl-C waits for it too
                if done.acquire(timeout=_WAIT_SLICE_S):
                    break
            except KeyboardInterrupt:
                pass
        raise interrupt from outcome.get("error")
    finally:
        if not queued or "value" in outcome or "error" in outcome:  # the helper is done with it
            if _c.pserver_cancel_cancelled(cancel):
                _c.pserver_cancel_delete(cancel)
            else:
                _cancel = cancel  # the next call's
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class _Handle:
    """A C handle shared by threads; close() waits for the calls in flight."""

    def __init__(self, ptr: Any, delete: Callable[[Any], None], what: str) -> None:
        self._ptr = ptr
        self._delete = delete
        self._what = what
        self._busy = 0
        self._cv = threading.Condition()

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        with self._cv:
            if self._ptr is None:
                raise Closed(f"pserver: this {self._what} is closed")
            self._busy += 1
            ptr = self._ptr
        try:
            yield ptr
        finally:
            with self._cv:
                self._busy -= 1
                if self._busy == 0:
                    self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            ptr, self._ptr = self._ptr, None
            while self._busy > 0:  # calls in flight finish (each has a deadline)
                self._cv.wait()
        if ptr is not None:
            self._delete(ptr)


class _Closing:
    """Context manager and finalizer for classes with an idempotent close()."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _setting(what: str, key: str, value: Any) -> float:
    """A config or table setting as the number the C ABI takes (booleans as 0/1)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} setting {key!r} must be a number, got {value!r}") from None


class _Config:
    """A pserver_param_config_t built from keyword arguments, freed on exit."""

    def __init__(self, optimizer: Optional[str], schedule: Optional[str],
                 config: Union[None, str, Mapping[str, Any]], settings: Mapping[str, Any]):
        self.ptr = _c.pserver_param_config_new()
        try:
            merged: Dict[str, Any] = {}
            if isinstance(config, str):
                _c.pserver_param_config_parse_text(self.ptr, config)
            elif config is not None:
                merged.update(config)
            merged.update({k: v for k, v in settings.items() if v is not None})
            optimizer = merged.pop("optimizer", None) if optimizer is None else optimizer
            schedule = merged.pop("schedule", None) if schedule is None else schedule
            merged.pop("optimizer", None)
            merged.pop("schedule", None)
            if optimizer is not None:
                _c.pserver_param_config_set_optimizer(self.ptr, str(optimizer))
            if schedule is not None:
                _c.pserver_param_config_set_schedule(self.ptr, str(schedule))
            for key, value in merged.items():
                _c.pserver_param_config_set(self.ptr, key, _setting("config", key, value))
        except BaseException:
            _c.pserver_param_config_delete(self.ptr)
            raise

    def text(self) -> str:
        return _c.pserver_param_config_text(self.ptr)[1]

    def __enter__(self) -> "_Config":
        return self

    def __exit__(self, *exc: Any) -> None:
        _c.pserver_param_config_delete(self.ptr)
        self.ptr = None


def param_config_text(optimizer: Optional[str] = None, *, schedule: Optional[str] = None,
                      config: Union[None, str, Mapping[str, Any]] = None,
                      **settings: Any) -> str:
    """The ParameterConfig that `Client.init` would send, in protobuf text format.

    >>> import pserver
    >>> pserver.param_config_text("adam", lr=0.01, beta1=0.8, clip_norm=1.0)
    'optimizer { adam { beta1: 0.8 } } learning_rate { learning_rate: 0.01 } clipping { clip_norm: 1 }'
    """
    with _Config(optimizer, schedule, config, settings) as cfg:
        return cfg.text()


class Client(_Closing):
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
    """

    def __init__(self, servers: Union[str, Sequence[str], None] = None, *,
                 etcd: Optional[str] = None, cluster: str = "default",
                 timeout: float = 30.0, discovery_timeout: Optional[float] = None,
                 block_bytes: Optional[int] = None, max_request_bytes: Optional[int] = None,
                 channels_per_server: Optional[int] = None) -> None:
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
            if etcd is not None:
                _c.pserver_client_options_set_etcd(opts, str(etcd), str(cluster))
                if discovery_timeout is not None:
                    _c.pserver_client_options_set_discovery_timeout_ms(
                        opts, max(1, int(discovery_timeout * 1000)))
            ptr = _c.pserver_client_new(opts)
        self._h = _Handle(ptr, _c.pserver_client_delete, "client")
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

    @property
    def closed(self) -> bool:
        return self._h.closed


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
             timeout: Optional[float] = None, **settings: Any) -> None:
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
        `timeout` (seconds; every blocking method takes it) bounds this call:
        it ends by then, raising DeadlineExceeded at the latest (None: the
        client's own timeout).
        """
        arr = _as_array(value, f"parameter {name!r}", dtype)
        code = DTYPES[arr.dtype]  # _as_array checked it
        with _Config(optimizer, schedule, config, settings) as cfg, _deadline(timeout), \
                self._h.use() as h:
            _blocking(_c.pserver_client_init_param, h, name, code, arr.shape, arr, cfg.ptr)

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

    def _out(self, name: str, out: Optional[np.ndarray]) -> Tuple[np.ndarray, int]:
        dtype, shape = self.info(name)
        if out is None:
            return np.empty(shape, dtype), DTYPES[dtype]
        _check_out(out, dtype, shape, f"parameter {name!r}")
        return out, DTYPES[dtype]

    def get(self, name: str, out: Any = None, *,
            timeout: Optional[float] = None) -> Any:
        """Parameter `name` as a new array (or written into `out`, which must
        have its dtype and shape and be C-contiguous and writable).

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
                dtype, shape = self.info(name)
                _check_device(dev, dtype, shape, f"parameter {name!r}", writable=True)
                with self._h.use() as h:
                    _blocking(_c.pserver_client_get_param_device, h, name, DTYPES[dtype],
                              dev.ptr, dev.nbytes, dev.device)
                return out
            out, code = self._out(name, out)
            with self._h.use() as h:
                _blocking(_c.pserver_client_get_param, h, name, code, out)
        return out

    def get_many(self, names: Sequence[str], *,
                 timeout: Optional[float] = None) -> Dict[str, np.ndarray]:
        """Several parameters in one round trip per server, by name."""
        with _deadline(timeout):
            return self._get_many(names)

    def _get_many(self, names: Sequence[str]) -> Dict[str, np.ndarray]:
        outs = {name: self._out(name, None) for name in names}
        batch = _c.pserver_batch_new()
        try:
            for name, (arr, code) in outs.items():
                _c.pserver_batch_add_output(batch, name, code, arr)
            with self._h.use() as h:
                _blocking(_c.pserver_client_get_params, h, batch)
        finally:
            _c.pserver_batch_delete(batch)
        return {name: arr for name, (arr, _) in outs.items()}

    # -- gradients -------------------------------------------------------------

    def _grad(self, name: str, grad: ArrayLike) -> Tuple[np.ndarray, int]:
        dtype, shape = self.info(name)
        what = f"gradient for parameter {name!r}"
        if not isinstance(grad, np.ndarray):
            grad = np.asarray(grad, dtype=dtype)
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
        dtype, shape = self.info(name)
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
        batch = _c.pserver_batch_new()
        try:
            for name, arr, code in arrays:  # `arrays` keeps the buffers alive
                _c.pserver_batch_add_input(batch, name, code, arr)
            with self._h.use() as h:
                _blocking(_c.pserver_client_send_grads, h, batch)
        finally:
            _c.pserver_batch_delete(batch)

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
        results: Dict[str, np.ndarray] = {}
        for name, arr, _ in arrays:
            target = None if out is None else out.get(name)
            if target is None:
                target = np.empty_like(arr)
            else:
                _check_out(target, arr.dtype, arr.shape, f"parameter {name!r}")
            results[name] = target
        gbatch, obatch = _c.pserver_batch_new(), _c.pserver_batch_new()
        try:
            for name, arr, code in arrays:
                _c.pserver_batch_add_input(gbatch, name, code, arr)
                _c.pserver_batch_add_output(obatch, name, code, results[name])
            with self._h.use() as h:
                _blocking(_c.pserver_client_push_pull, h, gbatch, obatch)
        finally:
            _c.pserver_batch_delete(gbatch)
            _c.pserver_batch_delete(obatch)
        return results

    # -- tables and groups ------------------------------------------------------

    def create_table(self, name: str, dim: Optional[int] = None, dtype: Any = None, *,
                     initializer: Optional[str] = None, optimizer: Optional[str] = None,
                     seed: Optional[int] = None, ttl_seconds: Optional[float] = None,
                     capacity: Optional[int] = None, admission_count: Optional[int] = None,
                     partition: Union[str, Tuple[int, int]] = "hash",
                     consistency: Optional[str] = None, staleness: int = 0,
                     chunk_size: Optional[int] = None, config: Optional[str] = None,
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
        `chunk_size`: keys per chunk for KvWorker.get_chunk. `config` may
        give a pserver.v1.TableConfig in text format, which the other
        arguments then amend.

        >>> emb = client.create_table("emb", 16, initializer="normal", stddev=0.01,
        ...                           optimizer="adagrad", lr=0.05)   # doctest: +SKIP

        Raises InvalidArgument for a bad setting and AlreadyExists when the
        table exists with another config.
        """
        from ._tables import _create_table
        settings = dict(settings, seed=seed, ttl_seconds=ttl_seconds, capacity=capacity,
                        admission_count=admission_count, chunk_size=chunk_size)
        return _create_table(self, name, dim, dtype=dtype, initializer=initializer,
                             optimizer=optimizer, partition=partition, consistency=consistency,
                             staleness=staleness, config=config, timeout=timeout,
                             settings=settings)

    def group(self, name: str, size: int, participant: str) -> "Group":
        """This worker's membership `participant` (unique in the group) of
        group `name` of `size` workers: a :class:`pserver.Group` for barrier,
        all_reduce and broadcast. One Group per worker thread."""
        from ._tables import _group
        return _group(self, name, size, participant)

    def save_checkpoint(self, *, timeout: Optional[float] = None) -> None:
        """Asks every server to write a checkpoint of its shard now.

        Raises FailedPrecondition when a server has no checkpoint directory.
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout), self._h.use() as h:
            _blocking(_c.pserver_client_save_checkpoint, h)

    def stats(self, *, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        """One dict per server: index, initialized, parameters, parameter_bytes,
        optimizer_state_bytes, gradients_applied, gets_served, ...
        `timeout`: seconds this call may take (None: the client's timeout)."""
        with _deadline(timeout), self._h.use() as h:
            _, stats = _blocking(_c.pserver_client_stats, h)
        return stats


def _check_out(out: np.ndarray, dtype: np.dtype, shape: Shape, what: str) -> None:
    if not isinstance(out, np.ndarray):
        raise InvalidArgument(f"{what}: out must be a numpy array")
    if out.dtype != dtype:
        raise InvalidArgument(f"{what}: out has dtype {out.dtype}, the parameter {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise InvalidArgument(
            f"{what}: out has shape {tuple(out.shape)}, the parameter {tuple(shape)}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgument(f"{what}: out must be C-contiguous and writable")


@contextlib.contextmanager
def _client_options(timeout: float, block_bytes: Optional[int],
                    max_request_bytes: Optional[int],
                    channels_per_server: Optional[int]) -> Iterator[Any]:
    opts = _c.pserver_client_options_new()
    try:
        if timeout is not None:
            if timeout <= 0:
                raise InvalidArgument(f"timeout must be positive, got {timeout}")
            _c.pserver_client_options_set_timeout_ms(opts, max(1, int(timeout * 1000)))
        if block_bytes is not None:
            _c.pserver_client_options_set_block_bytes(opts, int(block_bytes))
        if max_request_bytes is not None:
            _c.pserver_client_options_set_max_request_bytes(opts, int(max_request_bytes))
        if channels_per_server is not None:
            _c.pserver_client_options_set_channels_per_server(opts, int(channels_per_server))
        yield opts
    finally:
        _c.pserver_client_options_delete(opts)


@contextlib.contextmanager
def _server_options(host: str, port: int, index: int, num_threads: int,
                    checkpoint_dir: Optional[str]) -> Iterator[Any]:
    opts = _c.pserver_server_options_new()
    try:
        _c.pserver_server_options_set_host(opts, host)
        _c.pserver_server_options_set_port(opts, int(port))
        _c.pserver_server_options_set_index(opts, int(index))
        _c.pserver_server_options_set_num_threads(opts, int(num_threads))
        if checkpoint_dir is not None:
            _c.pserver_server_options_set_checkpoint_dir(opts, str(checkpoint_dir))
        yield opts
    finally:
        _c.pserver_server_options_delete(opts)


class Server(_Closing):
    """A gRPC parameter server running in this process (127.0.0.1, a free port).

    >>> import pserver
    >>> with pserver.Server() as server:
    ...     client = server.client()      # a gRPC client of this server
    ...     print(server.address.startswith("127.0.0.1:"))
    True
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, index: int = 0,
                 num_threads: int = 0, checkpoint_dir: Optional[str] = None) -> None:
        with _server_options(host, port, index, num_threads, checkpoint_dir) as opts:
            ptr = _c.pserver_server_new(opts)
        self._address = _c.pserver_server_address(ptr)
        self._port = _c.pserver_server_port(ptr)
        self._h = _Handle(ptr, _c.pserver_server_delete, "server")
        self._clients: "weakref.WeakSet[Client]" = weakref.WeakSet()

    @property
    def address(self) -> str:
        """"127.0.0.1:<port>"."""
        return self._address

    @property
    def port(self) -> int:
        return self._port

    def client(self, **options: Any) -> Client:
        """A gRPC client of this server (closed when the server is)."""
        c = Client([self._address], **options)
        self._clients.add(c)
        return c

    def save_checkpoint(self) -> None:
        """Writes a checkpoint of this server's shard (needs checkpoint_dir)."""
        with self._h.use() as h:
            _c.pserver_server_save_checkpoint(h)

    def stop(self, grace: float = 0.0) -> None:
        """Stops serving (calls in flight get up to `grace` seconds); idempotent."""
        if not self._h.closed:
            with self._h.use() as h:
                _c.pserver_server_stop(h, int(grace * 1000))

    def close(self) -> None:
        """Closes this server's clients, stops it and frees it; safe twice."""
        for c in list(self._clients):
            c.close()
        self._h.close()


    def __repr__(self) -> str:
        state = "stopped" if self._h.closed else "running"
        return f"<pserver.Server {self._address} {state}>"


class LocalCluster(_Closing):
    """`servers` parameter servers in this process, each on 127.0.0.1.

    ``client()`` calls them in process (no sockets, no serialization);
    ``addresses`` lets gRPC clients, also in other processes, reach them.
    With `checkpoint_dir`, server i keeps its shard's checkpoints in
    ``<checkpoint_dir>/shard-<i>`` (loaded on start, written by
    ``save_checkpoint()`` and on stop); ``pserver.read_checkpoint(checkpoint_dir)``
    reads them back.
    Leaving the ``with`` block closes the clients made by ``client()`` and
    stops the servers.

    >>> import numpy as np, pserver
    >>> with pserver.LocalCluster(servers=2) as c:
    ...     cl = c.client()
    ...     cl.init("b", np.array([1, 2], np.int64), optimizer="add")
    ...     cl.finish_init()
    ...     print(cl.push_pull({"b": np.array([10, 10], np.int64)})["b"])
    [11 12]
    """

    def __init__(self, servers: int = 2, *, checkpoint_dir: Optional[str] = None,
                 num_threads: int = 0) -> None:
        with _server_options("127.0.0.1", 0, 0, num_threads, checkpoint_dir) as opts:
            ptr = _c.pserver_local_cluster_new_with_options(int(servers), opts)
        self._addresses = [_c.pserver_local_cluster_address(ptr, i)
                           for i in range(_c.pserver_local_cluster_size(ptr))]
        self._h = _Handle(ptr, _c.pserver_local_cluster_delete, "local cluster")
        self._clients: "weakref.WeakSet[Client]" = weakref.WeakSet()

    @property
    def addresses(self) -> List[str]:
        return list(self._addresses)

    @property
    def size(self) -> int:
        return len(self._addresses)

    def __len__(self) -> int:
        return len(self._addresses)

    def client(self, *, in_process: bool = True, timeout: float = 30.0,
               block_bytes: Optional[int] = None, max_request_bytes: Optional[int] = None,
               channels_per_server: Optional[int] = None) -> Client:
        """A client of this cluster: in process by default, else over gRPC."""
        if not in_process:
            c = Client(self._addresses, timeout=timeout, block_bytes=block_bytes,
                       max_request_bytes=max_request_bytes,
                       channels_per_server=channels_per_server)
        else:
            with _client_options(timeout, block_bytes, max_request_bytes,
                                 channels_per_server) as opts, self._h.use() as h:
                ptr = _c.pserver_local_cluster_client(h, opts)
            c = Client._from_handle(ptr, self.addresses, "in-process")
        self._clients.add(c)
        return c

    def save_checkpoint(self) -> None:
        """Writes a checkpoint of every shard now (needs checkpoint_dir)."""
        with self._h.use() as h:
            _c.pserver_local_cluster_save_checkpoint(h)

    def stop(self) -> None:
        """Closes the clients made by client() and stops every server; idempotent."""
        for c in list(self._clients):
            c.close()
        self._h.close()

    close = stop


    def __repr__(self) -> str:
        state = "stopped" if self._h.closed else "running"
        return f"<pserver.LocalCluster {len(self._addresses)} servers {state}: " \
               f"{' '.join(self._addresses)}>"


class CheckpointReader(_Closing):
    """Reads a checkpoint: a ckpt-* directory, a server's checkpoint directory
    (its newest checkpoint) or a directory of shard directories (the newest
    checkpoint of each, with parameters put back together from their blocks).

    >>> with pserver.CheckpointReader("/ckpt") as r:      # doctest: +SKIP
    ...     for name in r: print(name, r.info(name))
    ...     w = r.read("w")
    ...     r.verify()                                      # every checksum
    """

    def __init__(self, path: str) -> None:
        self._path = str(path)
        ptr = _c.pserver_checkpoint_reader_new(self._path)
        self._names = [_c.pserver_checkpoint_reader_param_name(ptr, i)
                       for i in range(_c.pserver_checkpoint_reader_num_params(ptr))]
        self._paths = [_c.pserver_checkpoint_reader_checkpoint_path(ptr, i)
                       for i in range(_c.pserver_checkpoint_reader_num_checkpoints(ptr))]
        self._h = _Handle(ptr, _c.pserver_checkpoint_reader_delete, "checkpoint reader")

    @property
    def checkpoints(self) -> List[str]:
        """The checkpoint directories opened (one per shard)."""
        return list(self._paths)

    def names(self) -> List[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def info(self, name: str) -> Tuple[np.dtype, Shape]:
        with self._h.use() as h:
            code, shape = _c.pserver_checkpoint_reader_param_info(h, name)
        return _NUMPY[code], tuple(shape)

    def read(self, name: str) -> np.ndarray:
        """Parameter `name`, every checksum of its data verified."""
        dtype, shape = self.info(name)
        out = np.empty(shape, dtype)
        with self._h.use() as h:
            _c.pserver_checkpoint_reader_read(h, name, DTYPES[dtype], out)
        return out

    def read_all(self) -> Dict[str, np.ndarray]:
        return {name: self.read(name) for name in self._names}

    def tables(self) -> List[str]:
        """The tables in the checkpoints (sparse and KV tables), sorted."""
        with self._h.use() as h:
            return [_c.pserver_checkpoint_reader_table_name(h, i)
                    for i in range(_c.pserver_checkpoint_reader_num_tables(h))]

    def read_table(self, name: str) -> Tuple[np.ndarray, np.ndarray]:
        """Table `name`'s rows over every shard, sorted by key: (keys, uint64
        of shape (rows,); values, float32 or float64 of shape (rows, dim)).
        Raises NotFound for an unknown table, DataLoss for damaged data."""
        with self._h.use() as h:
            dim, code, rows = _c.pserver_checkpoint_reader_table_info(h, name)
            keys = np.empty(rows, np.uint64)
            values = np.empty((rows, dim), _NUMPY[code])
            _c.pserver_checkpoint_reader_read_table(h, name, keys, values)
        return keys, values

    def verify(self) -> None:
        """Verifies every data file and chunk; raises DataLoss naming the file."""
        with self._h.use() as h:
            _c.pserver_checkpoint_reader_verify(h)

    def close(self) -> None:
        self._h.close()


    def __repr__(self) -> str:
        return f"<pserver.CheckpointReader {self._path}: {len(self._names)} parameters " \
               f"in {len(self._paths)} checkpoint(s)>"


def read_checkpoint(path: str, *, verify: bool = True) -> Dict[str, np.ndarray]:
    """Every parameter of the checkpoint at `path` as numpy arrays, by name.

    With `verify` (the default) every data file and chunk is checked first;
    damage raises :class:`DataLoss` naming the file.

    >>> params = pserver.read_checkpoint("/ckpt")   # doctest: +SKIP
    >>> params["w"].dtype, params["w"].shape        # doctest: +SKIP
    (dtype('float32'), (2, 3))
    """
    with CheckpointReader(path) as reader:
        if verify:
            reader.verify()
        return reader.read_all()


class Etcd(_Closing):
    """A small etcd v3 client for tools, over the C ABI's ``pserver_etcd_*`` calls.

    Keys are full etcd keys, e.g. ``"/pserver/default/ps_desired"`` (the layout
    is in docs/operations.md); values are bytes (``put`` also takes a str,
    encoded as UTF-8). Every call is bounded by `timeout` seconds; one that
    finds etcd unreachable tries the next endpoint and retries within it, then
    raises Unavailable or DeadlineExceeded. Creating it does not wait for etcd.
    Thread-safe.

    >>> with pserver.Etcd("127.0.0.1:2379") as etcd:          # doctest: +SKIP
    ...     etcd.put("/pserver/demo/ps_desired", "2")
    ...     etcd.get("/pserver/demo/ps_desired")
    ...     etcd.list("/pserver/demo/")
    b'2'
    [('/pserver/demo/ps_desired', b'2')]
    """

    def __init__(self, endpoints: Union[str, Sequence[str]], *, timeout: float = 10.0) -> None:
        if not isinstance(endpoints, str):
            endpoints = ",".join(endpoints)
        if not timeout > 0:
            raise InvalidArgument(f"timeout must be positive, got {timeout!r}")
        self._endpoints = endpoints
        ptr = _c.pserver_etcd_new(endpoints, max(1, int(timeout * 1000)))
        self._h = _Handle(ptr, _c.pserver_etcd_delete, "etcd client")

    def get(self, key: str) -> bytes:
        """The value of `key`; raises NotFound (a KeyError) when it does not exist."""
        with self._h.use() as h:
            return _c.pserver_etcd_get(h, key)

    def list(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        """Every (key, value) whose key starts with `prefix`, sorted by key."""
        with self._h.use() as h:
            return _c.pserver_etcd_get_prefix(h, prefix)

    get_prefix = list

    def put(self, key: str, value: Union[bytes, bytearray, memoryview, str]) -> None:
        """Sets `key` to `value` (no lease)."""
        if isinstance(value, str):
            value = value.encode()
        with self._h.use() as h:
            _c.pserver_etcd_put(h, key, value)

    def delete(self, key: str) -> None:
        """Deletes `key`; a key that does not exist is not an error."""
        with self._h.use() as h:
            _c.pserver_etcd_delete_key(h, key)

    def close(self) -> None:
        """Waits for calls in flight and frees the client; safe to call twice."""
        self._h.close()

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __repr__(self) -> str:
        return f"<pserver.Etcd {self._endpoints}{' closed' if self.closed else ''}>"
