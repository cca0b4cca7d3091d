"""Happy paths, dtype rules and optimizer settings through pserver.Client."""
import numpy as np
import pytest

import pserver
from conftest import ALL_DTYPES


def test_init_get_send_roundtrip(client):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    client.init("w", w, optimizer="sgd", lr=0.5)
    client.finish_init()
    assert client.info("w") == (np.dtype(np.float32), (2, 3))
    got = client.get("w")
    assert got.dtype == np.float32 and got.shape == (2, 3)
    np.testing.assert_array_equal(got, w)
    client.send_grad("w", np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(client.get("w"), w - 0.5)


def test_scalar_parameters_keep_shape_empty_tuple(client, tmp_path):
    # A 0-d array (and a numpy or Python scalar) is a parameter of shape (),
    # not (1,): init, get, send_grad, push_pull and get_many keep ().
    client.init("s", np.array(3.0, np.float32), optimizer="sgd", lr=0.5)
    client.init("n", np.int64(7), optimizer="add")
    client.init("f", 2.5, dtype=np.float64, optimizer="sgd", lr=1.0)
    client.finish_init()
    assert client.info("s") == (np.dtype(np.float32), ())
    assert client.info("n") == (np.dtype(np.int64), ())
    assert client.info("f") == (np.dtype(np.float64), ())
    got = client.get("s")
    assert got.shape == () and got.dtype == np.float32 and got == 3.0
    client.send_grad("s", np.array(1.0, np.float32))
    assert client.get("s") == 2.5
    client.send_grad("n", np.int64(2))
    assert client.get("n").shape == () and client.get("n") == 9
    out = client.push_pull({"f": np.float64(0.5)})
    assert out["f"].shape == () and out["f"] == 2.0
    many = client.get_many(["s", "n"])
    assert many["s"].shape == () and many["n"].shape == ()
    with pytest.raises(pserver.InvalidArgument):
        client.send_grad("s", np.ones(1, np.float32))  # shape (1,) is not ()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_roundtrips_exactly(client, dtype):
    value = (np.arange(12) * 3 + 1).astype(dtype).reshape(3, 4)
    optimizer = "sgd" if np.issubdtype(dtype, np.floating) else "add"
    client.init("p", value, optimizer=optimizer, lr=1.0)
    client.finish_init()
    got = client.get("p")
    assert got.dtype == dtype and got.shape == (3, 4)
    assert got.tobytes() == value.tobytes()
    client.send_grad("p", np.ones((3, 4), dtype))
    expect = value - 1 if optimizer == "sgd" else value + 1
    np.testing.assert_array_equal(client.get("p"), expect.astype(dtype))


def test_float64_gradient_for_float32_parameter_is_rejected(client):
    client.init("w", np.zeros(4, np.float32), lr=1.0)
    client.finish_init()
    with pytest.raises(pserver.InvalidArgument, match="float64 received, float32 expected"):
        client.send_grad("w", np.ones(4, np.float64))
    with pytest.raises(pserver.InvalidArgument, match="shape"):
        client.send_grad("w", np.ones((2, 2), np.float32))
    with pytest.raises(pserver.InvalidArgument):
        client.push_pull({"w": np.ones(4, np.int32)})
    # Nothing was applied.
    np.testing.assert_array_equal(client.get("w"), np.zeros(4, np.float32))


def test_unsupported_dtypes_are_rejected(client):
    with pytest.raises(pserver.InvalidArgument, match="float16 is not supported"):
        client.init("h", np.zeros(3, np.float16))
    with pytest.raises(pserver.InvalidArgument, match="bool is not supported"):
        client.init("b", np.zeros(3, bool))
    with pytest.raises(pserver.InvalidArgument, match="expected float32"):
        client.init("x", np.zeros(3, np.float64), dtype=np.float32)


def test_non_contiguous_and_big_endian_inputs(client):
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    client.init("t", base.T, lr=1.0)          # a transposed view: copied, same values
    client.init("be", np.arange(3, dtype=">f8"))  # big-endian float64 is float64
    client.finish_init()
    np.testing.assert_array_equal(client.get("t"), base.T)
    assert client.info("be")[0] == np.float64
    np.testing.assert_array_equal(client.get("be"), [0, 1, 2])
    client.send_grad("t", np.ones((4, 3))[:, :])
    grad = np.ones((8, 3))[::2]  # strided
    client.send_grad("t", grad)
    np.testing.assert_array_equal(client.get("t"), base.T - 2)


def test_lists_take_the_parameter_dtype_for_gradients(client):
    client.init("v", [1.0, 2.0], dtype=np.float32, lr=1.0)
    client.finish_init()
    client.send_grad("v", [1.0, 1.0])  # a list: made with the parameter's dtype
    np.testing.assert_array_equal(client.get("v"), np.array([0, 1], np.float32))


def test_get_into_out(client):
    client.init("w", np.full((2, 2), 3.0, np.float64))
    client.finish_init()
    out = np.empty((2, 2), np.float64)
    assert client.get("w", out=out) is out
    np.testing.assert_array_equal(out, 3.0)
    with pytest.raises(pserver.InvalidArgument, match="dtype"):
        client.get("w", out=np.empty((2, 2), np.float32))
    with pytest.raises(pserver.InvalidArgument, match="shape"):
        client.get("w", out=np.empty(4, np.float64))
    with pytest.raises(pserver.InvalidArgument, match="C-contiguous"):
        client.get("w", out=np.empty((2, 2), np.float64, order="F"))


def test_batched_calls(client):
    client.init("a", np.zeros(3, np.float32), lr=1.0)
    client.init("b", np.array([1, 2], np.int64), optimizer="add")
    client.finish_init()
    client.send_grads({"a": np.ones(3, np.float32), "b": np.array([5, 5], np.int64)})
    got = client.get_many(["a", "b"])
    np.testing.assert_array_equal(got["a"], [-1, -1, -1])
    np.testing.assert_array_equal(got["b"], [6, 7])
    out = {"a": np.empty(3, np.float32)}
    res = client.push_pull({"a": np.ones(3, np.float32), "b": np.array([1, 1], np.int64)},
                           out=out)
    assert res["a"] is out["a"]
    np.testing.assert_array_equal(res["a"], [-2, -2, -2])
    np.testing.assert_array_equal(res["b"], [7, 8])
    # One bad part: nothing of the batch is applied.
    with pytest.raises(pserver.InvalidArgument):
        client.send_grads({"b": np.array([1, 1], np.int64), "a": np.ones(3, np.float64)})
    np.testing.assert_array_equal(client.get("b"), [7, 8])


def test_large_parameter_split_into_blocks(cluster):
    client = cluster.client(block_bytes=1024)
    w = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    client.init("big", w, lr=0.1)
    client.finish_init()
    client.send_grad("big", np.ones_like(w))
    np.testing.assert_allclose(client.get("big"), w - 0.1, rtol=1e-6)
    stats = client.stats()
    assert [s["index"] for s in stats] == [0, 1]
    assert all(s["parameters"] > 1 for s in stats)  # blocks on both servers
    assert sum(s["gradients_applied"] for s in stats) >= 2


def test_health_of_a_local_cluster(cluster):
    # In process: each server's serving state (started: SERVING).
    assert cluster.client().health() == ["SERVING", "SERVING"]


def test_adam_from_keyword_arguments(client):
    client.init("w", np.zeros(3, np.float64), optimizer="adam", lr=0.1, beta1=0.5,
                beta2=0.9, epsilon=1e-12)
    client.finish_init()
    client.send_grad("w", np.array([2.0, -3.0, 0.5]))
    # Adam's first bias-corrected step moves each weight by lr * sign(g).
    np.testing.assert_allclose(client.get("w"), [-0.1, 0.1, -0.1], rtol=1e-6)


def test_clipping_and_dict_config(client):
    client.init("w", np.zeros(2, np.float64), config={"optimizer": "sgd", "lr": 1.0,
                                                      "clip_norm": 1.0})
    client.finish_init()
    client.send_grad("w", np.array([3.0, 4.0]))  # norm 5, clipped to 1
    np.testing.assert_allclose(client.get("w"), [-0.6, -0.8])


def test_text_config_and_schedule(client):
    text = pserver.param_config_text("sgd", schedule="step", lr=1.0, step_size=1,
                                     gamma=0.5, momentum=0.0)
    assert "step { step_size: 1 gamma: 0.5 }" in text
    client.init("w", np.zeros(1, np.float64), config=text)
    client.finish_init()
    for _ in range(3):
        client.send_grad("w", np.ones(1))
    np.testing.assert_allclose(client.get("w"), [-(1 + 0.5 + 0.25)])


def test_bad_config_is_invalid_argument(client):
    with pytest.raises(pserver.InvalidArgument, match="unknown optimizer 'lbfgs'"):
        client.init("w", np.zeros(1, np.float32), optimizer="lbfgs")
    with pytest.raises(pserver.InvalidArgument, match="unknown config setting 'beta1'"):
        client.init("w", np.zeros(1, np.float32), optimizer="sgd", beta1=0.9)
    with pytest.raises(pserver.InvalidArgument, match="must be a number"):
        client.init("w", np.zeros(1, np.float32), lr="fast")
    with pytest.raises(pserver.InvalidArgument, match="text format"):
        client.init("w", np.zeros(1, np.float32), config="optimizer { nope {} }")
    client.init("w", np.zeros(1, np.float32))  # none of the failures initialized it


def test_grpc_client_of_a_local_cluster(cluster):
    inproc = cluster.client()
    remote = cluster.client(in_process=False, timeout=10)
    inproc.init("w", np.arange(4, dtype=np.float32), lr=1.0)
    remote.finish_init()
    remote.send_grad("w", np.ones(4, np.float32))
    assert remote.get("w").tobytes() == inproc.get("w").tobytes()
    assert "grpc" in repr(remote) and "in-process" in repr(inproc)


def test_server_and_client_over_grpc():
    with pserver.Server() as server:
        assert server.address == f"127.0.0.1:{server.port}"
        with pserver.Client([server.address], timeout=10) as client:
            client.init("w", np.ones(2, np.float32))
            client.finish_init()
            np.testing.assert_array_equal(client.get("w"), [1, 1])
            assert client.num_servers == 1
        client2 = pserver.Client(server.address)  # "a,b" strings work too
        assert client2.servers == [server.address]
        client2.close()


def test_server_advertise_host():
    # Bound to every address, a server must be told which one to publish.
    with pytest.raises(pserver.InvalidArgument, match="advertise_host"):
        pserver.Server(host="0.0.0.0")
    with pserver.Server(host="0.0.0.0", advertise_host="127.0.0.1") as server:
        assert server.address == f"127.0.0.1:{server.port}"
        with server.client(timeout=10) as client:
            client.init("w", np.ones(2, np.float32))
            client.finish_init()
            np.testing.assert_array_equal(client.get("w"), [1, 1])


def test_version():
    assert pserver.version() == pserver.__version__ == "0.7.0"
