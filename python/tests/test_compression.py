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
