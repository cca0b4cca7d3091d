"""Device memory in and out: objects exposing __cuda_array_interface__.

Without a GPU (CI) a fake device array whose pointer is host memory must
get a clear pserver error, never a crash: Unavailable ("no CUDA device:
...") where there is no device, InvalidArgument ("host memory") where there
is one. The dtype, shape and contiguity checks run before any device call.
With a GPU and CuPy or PyTorch, a real round trip (skipped otherwise).
"""
import numpy as np
import pytest

import pserver


class FakeDeviceArray:
    """Exposes __cuda_array_interface__ (version 3) over a numpy array's
    memory: host memory pretending to be device memory."""

    def __init__(self, arr, typestr=None, strides=None, readonly=False, shape=None):
        self.arr = arr
        self.__cuda_array_interface__ = {
            "shape": tuple(arr.shape if shape is None else shape),
            "typestr": typestr or arr.dtype.str,
            "data": (arr.ctypes.data, readonly),
            "version": 3,
            "strides": strides,
            "stream": None,
        }


def _expect_device_error(excinfo):
    """Unavailable without a GPU; with one, the host pointer is refused."""
    err = excinfo.value
    if isinstance(err, pserver.Unavailable):
        assert "no CUDA device: " in str(err), str(err)
    else:
        assert isinstance(err, pserver.InvalidArgument), repr(err)
        assert "is not device memory of cuda:0: it is host memory" in str(err), str(err)


@pytest.fixture
def w_client(client):
    client.init("w", np.arange(12, dtype=np.float32).reshape(3, 4), optimizer="sgd", lr=1.0)
    client.finish_init()
    return client


def test_fake_device_array_gets_a_clear_error_and_changes_nothing(w_client):
    before = w_client.get("w")
    grad = FakeDeviceArray(np.ones((3, 4), np.float32))
    with pytest.raises((pserver.Unavailable, pserver.InvalidArgument)) as e:
        w_client.send_grad("w", grad)
    _expect_device_error(e)
    out = FakeDeviceArray(np.zeros((3, 4), np.float32))
    with pytest.raises((pserver.Unavailable, pserver.InvalidArgument)) as e:
        w_client.get("w", out=out)
    _expect_device_error(e)
    with pytest.raises((pserver.Unavailable, pserver.InvalidArgument)) as e:
        w_client.push_pull({"w": grad}, out={"w": grad})
    _expect_device_error(e)
    with pytest.raises((pserver.Unavailable, pserver.InvalidArgument)) as e:
        w_client.send_grads({"w": grad}, timeout=1.0)
    _expect_device_error(e)
    np.testing.assert_array_equal(w_client.get("w"), before)


def test_no_device_error_names_the_reason(w_client):
    grad = FakeDeviceArray(np.ones((3, 4), np.float32))
    try:
        w_client.send_grad("w", grad)
    except pserver.Unavailable as err:
        # e.g. "no CUDA device: cudaGetDeviceCount: CUDA driver version is
        # insufficient for CUDA runtime version (cudaErrorInsufficientDriver)"
        reason = str(err).split("no CUDA device: ", 1)[1]
        assert reason.strip(), str(err)
    except pserver.InvalidArgument:
        pytest.skip("a CUDA device is present: the no-device path is not reachable")


@pytest.mark.parametrize("kwargs, message", [
    (dict(arr=np.ones((3, 4), np.float64)), "dtype float64, expected float32"),
    (dict(arr=np.ones((4, 3), np.float32)), "shape (4, 3), expected (3, 4)"),
    (dict(arr=np.ones((3, 4), np.float16)), "float16"),
    (dict(arr=np.ones((3, 4), np.float32), typestr=">f4"), "native byte order"),
    (dict(arr=np.ones((3, 4), np.float32), typestr="<zz"), "is not a dtype"),
    (dict(arr=np.ones((4, 3), np.float32), shape=(3, 4), strides=(4, 12)), "not C-contiguous"),
])
def test_bad_device_arrays_are_refused_before_any_device_call(w_client, kwargs, message):
    fake = FakeDeviceArray(**kwargs)
    with pytest.raises(pserver.InvalidArgument, match=None) as e:
        w_client.send_grad("w", fake)
    assert message in str(e.value), str(e.value)
    with pytest.raises(pserver.InvalidArgument) as e:
        w_client.get("w", out=fake)
    assert message in str(e.value), str(e.value)


def test_c_contiguous_strides_are_accepted(w_client):
    # Explicit C-contiguous strides (and any stride on a dimension of 1) pass
    # the checks and reach the device call.
    fake = FakeDeviceArray(np.ones((3, 4), np.float32), strides=(16, 4))
    with pytest.raises((pserver.Unavailable, pserver.InvalidArgument)) as e:
        w_client.send_grad("w", fake)
    _expect_device_error(e)


def test_read_only_output_and_missing_output_are_refused(w_client):
    ro = FakeDeviceArray(np.ones((3, 4), np.float32), readonly=True)
    with pytest.raises(pserver.InvalidArgument, match="read-only"):
        w_client.get("w", out=ro)
    grad = FakeDeviceArray(np.ones((3, 4), np.float32))
    with pytest.raises(pserver.InvalidArgument, match="needs a device array"):
        w_client.push_pull({"w": grad})
    with pytest.raises(pserver.InvalidArgument, match="needs a device array"):
        w_client.push_pull({"w": grad}, out={"w": np.zeros((3, 4), np.float32)})


def test_unknown_parameter_is_not_found(client):
    client.finish_init()
    with pytest.raises(pserver.NotFound):
        client.send_grad("nope", FakeDeviceArray(np.ones(3, np.float32)))


def _cuda_arrays():
    """(module name, to_device, to_host) for CuPy or PyTorch with a GPU, or skip."""
    try:
        import cupy  # noqa: F401
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy", cupy.asarray, cupy.asnumpy
    except Exception:  # not installed, or no device
        pass
    try:
        import torch
        if torch.cuda.is_available():
            return ("torch", lambda a: torch.from_numpy(a).cuda(),
                    lambda t: t.cpu().numpy())
    except Exception:
        pass
    pytest.skip("no CUDA device with CuPy or PyTorch: the device round trip needs one")


@pytest.mark.parametrize("n", [3, 3 << 20])
def test_device_round_trip_is_exact(cluster, n):
    _, to_device, to_host = _cuda_arrays()
    client = cluster.client(block_bytes=1 << 20)
    w0 = (np.arange(n, dtype=np.float32) % 1000) / 1000
    g = (np.arange(n, dtype=np.float32) % 777) / -4096
    client.init("w", w0, optimizer="sgd", lr=1.0)
    client.finish_init()
    d = to_device(np.zeros(n, np.float32))
    client.get("w", out=d)
    np.testing.assert_array_equal(to_host(d), w0)
    dg = to_device(g)
    client.send_grad("w", dg)
    want = w0 - g
    np.testing.assert_array_equal(client.get("w"), want)
    client.push_pull({"w": dg}, out={"w": d})
    np.testing.assert_array_equal(to_host(d), want - g)
