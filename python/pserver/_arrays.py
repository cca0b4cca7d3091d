"""Arrays as the C ABI takes them: numpy dtypes <-> pserver_dtype_t, the
checks on host arrays (dtype, shape, contiguity) and on device memory
(objects exposing ``__cuda_array_interface__``).

Host inputs may be numpy arrays, anything ``np.asarray`` takes, or any object
exposing ``__dlpack__`` (a PyTorch CPU tensor, a JAX array...), read without
a copy. Outputs (``out=``) may be numpy arrays, DLPack tensors or any
writable buffer (a ``bytearray``, an ``array.array``, a ``memoryview``):
see :func:`_out_array`.

Arrays are never converted to another dtype behind your back: a float64
gradient for a float32 parameter raises :class:`InvalidArgument`.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import capi as _c
from ._errors import InvalidArgument


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


def _dtype_code(dtype: np.dtype, what: str) -> int:
    code = DTYPES.get(np.dtype(dtype).newbyteorder("="))
    if code is None:
        raise InvalidArgument(
            f"{what}: dtype {np.dtype(dtype)} is not supported; use one of "
            f"{', '.join(str(d) for d in DTYPES)}")
    return code


def _from_dlpack(obj: Any, what: str) -> np.ndarray:
    """A read-only numpy view of a DLPack host tensor (no copy)."""
    try:
        return np.from_dlpack(obj)
    except (BufferError, RuntimeError, TypeError, ValueError, AttributeError) as e:
        raise InvalidArgument(
            f"{what}: cannot read {type(obj).__name__} through DLPack: {e}") from None


def _is_dlpack(obj: Any) -> bool:
    """True for a host object to read through DLPack (not a numpy array)."""
    return not isinstance(obj, np.ndarray) and hasattr(obj, "__dlpack__")


def _host(value: ArrayLike, what: str, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """`value` as a numpy array: itself, a view of a DLPack tensor, or
    ``np.asarray(value, dtype)`` for anything else (lists, scalars, buffers)."""
    if isinstance(value, np.ndarray):
        return value
    if _is_dlpack(value):
        return _from_dlpack(value, what)
    return np.asarray(value, dtype=dtype)


def _as_array(value: ArrayLike, what: str, dtype: Optional[np.dtype] = None) -> np.ndarray:
    """A C-contiguous, native-byte-order array of a supported dtype.

    Copies only to make the memory C-contiguous or native-endian; the element
    type is never changed (unless `dtype` asks for it for a non-array input).
    """
    if isinstance(value, np.ndarray) or _is_dlpack(value):
        arr = _host(value, what)
        if dtype is not None and arr.dtype != np.dtype(dtype):
            raise InvalidArgument(
                f"{what}: array has dtype {arr.dtype}, expected {np.dtype(dtype)}")
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


# Buffer formats read as raw bytes: a bytes-like `out` of exactly the right
# size is filled with the values whatever their dtype (pserver stores no
# 8-bit types, so a byte buffer is never a typed one).
_RAW_BYTE_FORMATS = frozenset("Bbc")


def _writable_view(out: Any, what: str) -> np.ndarray:
    """A numpy array over `out`'s own memory, to write into: `out` itself, a
    DLPack tensor's memory, or any writable buffer's. Raises InvalidArgument
    for anything else, read-only or non-contiguous memory."""
    if isinstance(out, np.ndarray):
        return out
    if _is_dlpack(out):
        arr = _from_dlpack(out, what)
        if not arr.flags.c_contiguous:
            raise InvalidArgument(f"{what}: out has strides {arr.strides}, not C-contiguous "
                                  "(pass x.contiguous() and copy back, or a contiguous tensor)")
        if arr.nbytes == 0:
            return np.empty(arr.shape, arr.dtype)
        # numpy marks every DLPack import read-only (DLPack 0.x cannot say);
        # the producer lent us its memory, so write through it in place.
        raw = (ctypes.c_char * arr.nbytes).from_address(arr.ctypes.data)
        raw.dlpack_view = arr  # keeps the producer's export (and memory) alive
        return np.frombuffer(raw, arr.dtype).reshape(arr.shape)
    try:
        view = memoryview(out)
    except TypeError:
        raise InvalidArgument(f"{what}: out must be a numpy array, a DLPack tensor (__dlpack__) "
                              f"or a writable buffer, not {type(out).__name__}") from None
    if view.readonly:
        raise InvalidArgument(f"{what}: out ({type(out).__name__}) is read-only")
    if not view.c_contiguous:
        raise InvalidArgument(f"{what}: out ({type(out).__name__}) is not C-contiguous")
    try:
        return np.asarray(view)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{what}: out's buffer format {view.format!r} is not an array "
                              f"numpy can read: {e}") from None


def _out_array(out: Any, dtype: np.dtype, shape: Shape, what: str) -> np.ndarray:
    """The numpy array to write `out`'s values into: `out` itself if it is a
    numpy array of that dtype and shape, C-contiguous and writable; for a
    DLPack tensor or a buffer, a view of its memory (a flat buffer of the
    right number of elements is reshaped; a byte buffer of the right size is
    read as `dtype`)."""
    arr = _writable_view(out, what)
    if not isinstance(out, np.ndarray):
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if arr.dtype.char in _RAW_BYTE_FORMATS and arr.ndim == 1:
            if arr.nbytes != nbytes:
                raise InvalidArgument(f"{what}: out has {arr.nbytes} bytes, the values "
                                      f"{nbytes} ({np.dtype(dtype)}, shape {tuple(shape)})")
            arr = arr.view(dtype)
        if arr.ndim == 1 and arr.size == int(np.prod(shape, dtype=np.int64)):
            arr = arr.reshape(shape)
    _check_out(arr, dtype, shape, what)
    return arr


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
