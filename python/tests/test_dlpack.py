"""Arrays from other libraries: objects exposing only ``__dlpack__`` are read
without a copy wherever an array is taken, and ``out=`` takes any writable
buffer (a DLPack tensor, a bytearray, an array.array). Needs no torch: the
DLPack objects here wrap numpy arrays."""
import array

import numpy as np
import pytest

import pserver


class DLPackOnly:
    """An object that offers its memory through DLPack and nothing else
    (no __array__, no buffer protocol), like a JAX or PyTorch tensor."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, stream=None):
        return self._arr.__dlpack__()

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_dlpack_only_objects_are_accepted_as_arrays(client):
    with pytest.raises(TypeError):
        np.asarray(DLPackOnly(np.ones(2)), dtype=np.float32) + 0  # numpy alone cannot read it
    client.init("w", DLPackOnly(np.arange(4, dtype=np.float32)), optimizer="sgd", lr=1.0)
    client.finish_init()
    client.send_grad("w", DLPackOnly(np.ones(4, np.float32)))
    client.send_grads({"w": DLPackOnly(np.ones(4, np.float32))})
    got = client.push_pull({"w": DLPackOnly(np.ones(4, np.float32))})["w"]
    np.testing.assert_array_equal(got, np.arange(4) - 3)
    with pytest.raises(pserver.InvalidArgument, match="dtype float64 received"):
        client.send_grad("w", DLPackOnly(np.ones(4, np.float64)))
    np.testing.assert_array_equal(client.get("w"), np.arange(4) - 3)  # nothing applied


def test_dlpack_rows_and_keys_for_tables(client):
    t = client.create_table("emb", 2, optimizer="sgd", lr=1.0)
    t.push(DLPackOnly(np.array([3, 5], np.int64)), DLPackOnly(np.ones((2, 2), np.float32)))
    np.testing.assert_array_equal(t.pull(DLPackOnly(np.array([5, 4], np.uint64))),
                                  [[-1, -1], [0, 0]])


def test_out_takes_a_dlpack_tensor_and_writes_in_place(client):
    client.init("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    client.finish_init()
    backing = np.zeros((2, 3), np.float32)
    out = DLPackOnly(backing)
    assert client.get("w", out=out) is out
    np.testing.assert_array_equal(backing, np.arange(6).reshape(2, 3))
    strided = np.zeros((3, 2), np.float32).T
    with pytest.raises(pserver.InvalidArgument, match="not C-contiguous"):
        client.get("w", out=DLPackOnly(strided))
    with pytest.raises(pserver.InvalidArgument, match="out has dtype float64"):
        client.get("w", out=DLPackOnly(np.zeros((2, 3), np.float64)))


def test_out_takes_any_writable_buffer(client):
    client.init("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    client.finish_init()
    raw = bytearray(24)                                   # bytes: read as float32
    assert client.get("w", out=raw) is raw
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), np.arange(6))
    typed = array.array("f", [0.0] * 6)                  # a flat buffer of 6 floats
    client.get("w", out=typed)
    assert list(typed) == list(range(6))
    mv = memoryview(bytearray(24)).cast("f", (2, 3))
    client.push_pull({"w": np.zeros((2, 3), np.float32)}, out={"w": mv})
    assert mv.tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(pserver.InvalidArgument, match="read-only"):
        client.get("w", out=bytes(24))
    with pytest.raises(pserver.InvalidArgument, match="out has 20 bytes, the values 24"):
        client.get("w", out=bytearray(20))
    with pytest.raises(pserver.InvalidArgument, match="out has dtype float64"):
        client.get("w", out=array.array("d", [0.0] * 6))
    with pytest.raises(pserver.InvalidArgument, match="writable buffer, not object"):
        client.get("w", out=object())


def test_table_pull_and_group_take_buffers(client):
    t = client.create_table("emb", 2)
    out = DLPackOnly(np.full((2, 2), 7, np.float32))
    assert t.pull([1, 2], out=out) is out
    np.testing.assert_array_equal(out._arr, 0)
    g = client.group("g", 1, "only")
    buf = array.array("f", [1.0, 2.0])
    assert g.all_reduce(buf, op="sum") is buf
    assert list(buf) == [1.0, 2.0]


def test_init_exist_ok_accepts_the_same_init_only(client):
    client.init("w", np.zeros(3, np.float32), optimizer="adam", lr=0.1)
    client.finish_init()
    client.send_grad("w", np.ones(3, np.float32))
    before = client.get("w")
    # The same cell run again: kept as it is, values not reset.
    client.init("w", np.zeros(3, np.float32), optimizer="adam", lr=0.1, exist_ok=True)
    np.testing.assert_array_equal(client.get("w"), before)
    with pytest.raises(pserver.AlreadyInitialized, match="same type, shape and config"):
        client.init("w", np.zeros(3, np.float32), optimizer="adam", lr=0.1)
    with pytest.raises(pserver.AlreadyInitialized, match="another config.*learning_rate"):
        client.init("w", np.zeros(3, np.float32), optimizer="adam", lr=0.2, exist_ok=True)
    with pytest.raises(pserver.AlreadyInitialized, match=r"as float32 \[3\], not float32 \[4\]"):
        client.init("w", np.zeros(4, np.float32), optimizer="adam", lr=0.1, exist_ok=True)
    with pytest.raises(pserver.AlreadyInitialized, match="FinishInitParams was called"):
        client.init("new", np.zeros(3, np.float32), exist_ok=True)
    np.testing.assert_array_equal(client.get("w"), before)
