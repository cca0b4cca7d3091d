"""Names cross the C ABI with their length: never cut at a NUL byte."""
import numpy as np
import pytest

import pserver


@pytest.mark.parametrize("name", ["a\x00b", "\udc80", "\ud800", "", "a\x00"])
def test_bad_parameter_names_are_refused(client, name):
    with pytest.raises(pserver.InvalidArgument, match="name"):
        client.init(name, np.zeros(2, np.float32))
    client.finish_init()
    # Nothing was stored under the name cut at its NUL byte.
    with pytest.raises(pserver.NotFound):
        client.get("a")


def test_names_refused_on_every_call(client):
    client.init("a", np.zeros(2, np.float32))
    client.finish_init()
    g = np.ones(2, np.float32)
    with pytest.raises(pserver.InvalidArgument, match="holds a NUL byte"):
        client.send_grad("a\x00b", g)
    with pytest.raises(pserver.InvalidArgument, match="holds a NUL byte"):
        client.send_grads({"a": g, "a\x00b": g})
    with pytest.raises(pserver.InvalidArgument, match="cannot be encoded"):
        client.info("\ud800")
    with pytest.raises(pserver.InvalidArgument, match="not valid UTF-8"):
        client.info("\udc80")
    np.testing.assert_array_equal(client.get("a"), np.zeros(2, np.float32))  # unchanged
    with pytest.raises(pserver.InvalidArgument, match="table name"):
        client.create_table("t\x00x", dim=2)


def test_unicode_and_bytes_names(client):
    client.init("poids_été", np.arange(3, dtype=np.float32))
    client.init(b"raw", np.arange(2, dtype=np.float32))
    client.finish_init()
    np.testing.assert_array_equal(client.get("poids_été"), np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(client.get("raw"), np.arange(2, dtype=np.float32))
    table = client.create_table("tablé", dim=2)
    assert table.name == "tablé"
