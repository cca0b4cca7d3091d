"""Checkpoints written by a LocalCluster, read back with read_checkpoint."""
import glob
import os

import numpy as np
import pytest

import pserver
from conftest import ALL_DTYPES


def train_and_save(path, block_bytes=256):
    values = {}
    with pserver.LocalCluster(servers=3, checkpoint_dir=path) as c:
        cl = c.client(block_bytes=block_bytes)
        for i, dt in enumerate(ALL_DTYPES):
            v = (np.arange(200) + i).astype(dt).reshape(20, 10)
            opt = "adam" if np.issubdtype(dt, np.floating) else "add"
            cl.init(f"p_{np.dtype(dt).name}", v, optimizer=opt, lr=0.01)
        cl.finish_init()
        for name in list(cl.get_many([f"p_{np.dtype(d).name}" for d in ALL_DTYPES])):
            dtype, shape = cl.info(name)
            cl.send_grad(name, np.ones(shape, dtype))
        cl.save_checkpoint()
        c.save_checkpoint()
        for name in [f"p_{np.dtype(d).name}" for d in ALL_DTYPES]:
            values[name] = cl.get(name)
    return values


def test_read_checkpoint_returns_what_the_servers_hold(tmp_path):
    path = str(tmp_path / "ckpt")
    values = train_and_save(path)
    got = pserver.read_checkpoint(path)
    assert sorted(got) == sorted(values)
    for name, v in values.items():
        assert got[name].dtype == v.dtype and got[name].shape == v.shape
        assert got[name].tobytes() == v.tobytes(), name
    with pserver.CheckpointReader(path) as r:
        assert len(r.checkpoints) == 3
        assert "p_float32" in r and len(r) == 6
        assert r.info("p_uint64") == (np.dtype(np.uint64), (20, 10))
        assert "6 parameters in 3 checkpoint(s)" in repr(r)
        r.verify()
        with pytest.raises(pserver.NotFound):
            r.read("nope")


def test_a_restarted_cluster_serves_the_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    values = train_and_save(path)
    with pserver.LocalCluster(servers=3, checkpoint_dir=path) as c:
        cl = c.client(block_bytes=256)
        for name, v in values.items():
            assert cl.get(name).tobytes() == v.tobytes()


def test_damaged_checkpoint_is_data_loss(tmp_path):
    path = str(tmp_path / "ckpt")
    train_and_save(path)
    reader = pserver.CheckpointReader(path)
    for ckpt in reader.checkpoints:
        for data in glob.glob(os.path.join(ckpt, "data-*.bin")):
            with open(data, "r+b") as f:
                first = f.read(1)
                if first:
                    f.seek(0)
                    f.write(bytes([first[0] ^ 0xFF]))
    with pytest.raises(pserver.DataLoss, match="checksum validation failed: .*data-"):
        reader.verify()
    with pytest.raises(pserver.DataLoss):
        pserver.read_checkpoint(path)
    reader.close()


def test_missing_checkpoint_is_not_found(tmp_path):
    with pytest.raises(pserver.NotFound, match="does not exist"):
        pserver.read_checkpoint(str(tmp_path / "none"))
    with pytest.raises(pserver.NotFound, match="no checkpoint"):
        pserver.read_checkpoint(str(tmp_path))


def test_server_checkpoint_and_single_checkpoint_directory(tmp_path):
    path = str(tmp_path / "server")
    with pserver.Server(checkpoint_dir=path) as server:
        cl = server.client(timeout=10)
        cl.init("w", np.arange(5, dtype=np.float64))
        cl.finish_init()
        server.save_checkpoint()
        want = cl.get("w")
    shard = os.path.join(path, "shard-0")
    ckpts = sorted(glob.glob(os.path.join(shard, "ckpt-*")))
    assert ckpts, os.listdir(path)
    for p in (path, shard, ckpts[0]):  # shards, one server's directory, one checkpoint
        got = pserver.read_checkpoint(p)
        assert got["w"].tobytes() == want.tobytes(), p


def test_reshard_checkpoint_serves_the_same_values_on_another_server_count(tmp_path):
    src, dst = str(tmp_path / "three"), str(tmp_path / "two")
    values = train_and_save(src)
    log = tmp_path / "progress.txt"
    with open(log, "w") as progress:
        pserver.reshard_checkpoint(src, dst, 2, progress=progress)
    text = log.read_text()
    assert "wrote shard 2/2" in text and "resharded 3 servers' checkpoints to 2" in text
    assert len(glob.glob(os.path.join(dst, "shard-*", "ckpt-*"))) == 2
    with pserver.LocalCluster(servers=2, checkpoint_dir=dst) as c:
        cl = c.client(block_bytes=256)
        for name, v in values.items():
            assert cl.get(name).tobytes() == v.tobytes(), name
    # The same output again: refused, nothing changed; a bad count too.
    with pytest.raises(pserver.FailedPrecondition, match="is not empty"):
        pserver.reshard_checkpoint(src, dst, 4)
    with pytest.raises(pserver.InvalidArgument, match="got 0"):
        pserver.reshard_checkpoint(src, str(tmp_path / "none"), 0)
    assert not os.path.exists(tmp_path / "none")
