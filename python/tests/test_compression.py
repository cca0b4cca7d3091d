"""Compression on the wire (ParameterConfig.wire_compression) from Python: chosen
per parameter by a config string or the topk_fraction/topk_count settings, and
trained exactly as float32 SGD with values every wire type represents."""
import numpy as np
import pytest

import pserver


def _grad(step, n):
    # Multiples of 1/64 in [-1, 1]: exact in float16 and bfloat16.
    return (((np.arange(n) * 29 + step * 7) % 129 - 64) / 64).astype(np.float32)


@pytest.mark.parametrize("in_process", [True, False])
@pytest.mark.parametrize("value_type", ["FLOAT16", "BFLOAT16"])
def test_half_types_train_as_float32(cluster, in_process, value_type):
    client = cluster.client(in_process=in_process, timeout=30)
    n = 300_000  # split over both servers
    client.init("plain", np.zeros(n, np.float32), optimizer="sgd", lr=1.0)
    client.init("half", np.zeros(n, np.float32), optimizer="sgd", lr=1.0,
                config=f"wire_compression {{ value_type: {value_type} }}")
    client.finish_init()
    for step in range(3):
        client.send_grad("plain", _grad(step, n))
        out = client.push_pull({"half": _grad(step, n)})
    np.testing.assert_array_equal(out["half"], client.get("plain"))
    np.testing.assert_array_equal(client.get("half"), client.get("plain"))


def test_topk_setting_sends_part_and_keeps_the_rest(client):
    text = pserver.param_config_text("sgd", lr=1.0, topk_fraction=0.01)
    assert "wire_compression { topk_fraction: 0.01 }" in text
    client.init("t", np.zeros(1000, np.float32), config=text)
    client.finish_init()
    client.send_grad("t", _grad(0, 1000))
    moved = np.count_nonzero(client.get("t"))
    assert 0 < moved <= 10  # 1% of 1000 (ties aside, none here beyond k)


def test_bad_compression_is_invalid_argument(client):
    with pytest.raises(pserver.InvalidArgument,
                       match="wire_compression needs a float32 parameter; this one is float64"):
        client.init("d", np.zeros(3, np.float64), topk_fraction=0.5)
    with pytest.raises(pserver.InvalidArgument, match="topk_fraction must be in"):
        client.init("f", np.zeros(3, np.float32), topk_fraction=2.0)
    with pytest.raises(pserver.InvalidArgument, match="text format"):
        client.init("f", np.zeros(3, np.float32),
                    config="wire_compression { value_type: FLOAT8 }")
    client.init("f", np.zeros(3, np.float32))  # none of the failures initialized it


def _rows(step, rows, dim):
    return _grad(step, rows * dim).reshape(rows, dim)


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_table_half_types_train_as_float32(client, wire):
    client.finish_init()
    keys = np.array([1, 2, 3, 40, 500, 6000, 3], np.uint64)  # a repeat, both servers
    plain = client.create_table("plain", 4, optimizer="sgd", lr=1.0)
    half = client.create_table("half", 4, optimizer="sgd", lr=1.0, wire_compression=wire)
    assert f"value_type: {wire.upper()}" in half.config
    for step in range(3):
        plain.push(keys, _rows(step, len(keys), 4))
        half.push(keys, _rows(step, len(keys), 4))
    np.testing.assert_array_equal(half.pull(keys), plain.pull(keys))


def test_table_topk_sends_k_rows_and_the_residual_later(client):
    client.finish_init()
    keys = np.arange(10, 18, dtype=np.uint64)
    table = client.create_table("t", 4, optimizer="sgd", lr=1.0, topk_fraction=0.25,
                                max_residual_rows=100)
    assert "wire_compression { topk_fraction: 0.25 max_residual_rows: 100 }" in table.config
    grads = _rows(1, len(keys), 4)
    table.push(keys, grads)
    assert np.count_nonzero(np.any(table.pull(keys) != 0, axis=1)) == 2  # 25% of 8 rows
    for _ in range(3):  # zero gradients send what was kept, two rows a push
        table.push(keys, np.zeros_like(grads))
    np.testing.assert_array_equal(table.pull(keys), -grads)


def test_table_bad_compression_is_invalid_argument(client):
    client.finish_init()
    with pytest.raises(pserver.InvalidArgument, match="unknown wire type 'float8'"):
        client.create_table("t", 2, wire_compression="float8")
    with pytest.raises(pserver.InvalidArgument, match="topk_fraction must be in"):
        client.create_table("t", 2, topk_fraction=2.0)
    with pytest.raises(pserver.InvalidArgument,
                       match="wire_compression needs a float32 table; this one is float64"):
        client.create_table("t", 2, np.float64, wire_compression="bfloat16")
    assert client.create_table("t", 3).dim == 3  # none of the failures created it
