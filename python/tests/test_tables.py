"""Tables, KV workers with clocks, and worker groups from Python."""
import time

import numpy as np
import pytest

import pserver
from conftest import run_threads


# -- sparse tables ------------------------------------------------------------

def test_pull_push_round_trip(client):
    emb = client.create_table("emb", 4, optimizer="sgd", lr=0.5)
    assert (emb.name, emb.dim, emb.dtype) == ("emb", 4, np.dtype(np.float32))
    keys = np.array([10, 2**63 + 5, 7], np.uint64)
    rows = emb.pull(keys)
    assert rows.shape == (3, 4) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, 0)
    grads = np.arange(12, dtype=np.float32).reshape(3, 4)
    emb.push(keys, grads, timeout=5)
    np.testing.assert_allclose(emb.pull(keys, timeout=5), -0.5 * grads)
    out = np.empty((2, 4), np.float32)
    assert emb.pull([7, 10], out=out) is out
    np.testing.assert_allclose(out, -0.5 * grads[[2, 0]])
    assert "sgd { learning_rate: 0.5 }" in emb.config
    assert repr(emb) == "<pserver.Table 'emb' dim=4 float32>"


def test_duplicate_keys_are_summed(client):
    t = client.create_table("dup", 2, np.float64, optimizer="sgd", lr=1.0)
    keys = np.array([5, 5, 5, 9], np.uint64)
    t.push(keys, np.ones((4, 2)))
    np.testing.assert_array_equal(t.pull([5, 9]), [[-3, -3], [-1, -1]])
    total = {k: 0 for k in ("rows", "keys_pushed", "keys_pulled")}
    stats = t.stats()
    assert [s["server"] for s in stats] == [0, 1]
    for s in stats:
        for k in total:
            total[k] += s[k]
        assert s["workers"] == 0 and s["min_clock"] == -1
    assert total["rows"] == 2 and total["keys_pushed"] >= 4 and total["keys_pulled"] >= 2


def test_initializers_are_deterministic(cluster):
    a, b = cluster.client(), cluster.client()
    kw = dict(initializer="normal", stddev=0.1, seed=7)
    ta = a.create_table("n", 8, **kw)
    tb = b.create_table("n", 8, **kw)   # the same config opens it
    keys = np.arange(50, dtype=np.uint64)
    np.testing.assert_array_equal(ta.pull(keys), tb.pull(keys))
    assert 0.02 < ta.pull(keys).std() < 0.5
    u = a.create_table("u", 3, initializer="uniform", low=-1, high=1)
    rows = u.pull(keys)
    assert rows.min() >= -1 and rows.max() < 1


def test_range_partitioning_and_eviction_settings(client):
    t = client.create_table("r", 1, partition=(0, 100), capacity=10, ttl_seconds=60,
                            admission_count=1)
    assert [t.server_of(k) for k in (0, 49, 50, 99)] == [0, 0, 1, 1]
    with pytest.raises(pserver.InvalidArgument, match="outside"):
        t.pull([100])
    assert "capacity: 10" in t.config and "RANGE" in t.config


def test_bad_arguments_raise(client):
    t = client.create_table("bad", 3)
    keys = np.array([1, 2], np.uint64)
    with pytest.raises(pserver.InvalidArgument, match="expected uint64"):
        t.pull(np.array([1, 2], np.float64))
    with pytest.raises(pserver.InvalidArgument, match="non-negative"):
        t.pull([-1])
    with pytest.raises(pserver.InvalidArgument, match="key -7 at index 1 is negative"):
        t.push(np.array([1, -7, 2], np.int64), np.ones((3, 3), np.float32))
    with pytest.raises(pserver.InvalidArgument, match="1-d"):
        t.pull(np.zeros((2, 2), np.uint64))
    with pytest.raises(pserver.InvalidArgument, match="float32"):
        t.push(keys, np.ones((2, 3), np.float64))          # no silent conversion
    with pytest.raises(pserver.InvalidArgument, match=r"\(2, 3\) expected"):
        t.push(keys, np.ones((3, 2), np.float32))
    with pytest.raises(pserver.InvalidArgument, match="out has dtype"):
        t.pull(keys, out=np.empty((2, 3), np.float64))
    with pytest.raises(pserver.InvalidArgument, match="out has shape"):
        t.pull(keys, out=np.empty((3, 2), np.float32))
    with pytest.raises(pserver.InvalidArgument, match="key 2"):
        t.push(keys, np.array([[0, 0, 0], [0, np.nan, 0]], np.float32))
    np.testing.assert_array_equal(t.pull(keys), 0)          # nothing was applied
    with pytest.raises(pserver.InvalidArgument, match="float32 or float64"):
        client.create_table("ints", 2, np.int32)
    with pytest.raises(pserver.InvalidArgument, match="unknown table optimizer"):
        client.create_table("opt", 2, optimizer="adadelta")
    with pytest.raises(pserver.InvalidArgument, match="valid settings"):
        client.create_table("opt", 2, optimizer="adam", momentum=0.9)
    with pytest.raises(pserver.InvalidArgument, match="dim"):
        client.create_table("nodim")
    with pytest.raises(pserver.InvalidArgument, match="consistency"):
        client.create_table("c", 2, consistency="eventual")
    with pytest.raises(pserver.AlreadyExists, match="another config"):
        client.create_table("bad", 4)


def test_config_text_and_close(cluster):
    client = cluster.client()
    t = client.create_table("txt", None, config="dim: 2 element_type: FLOAT64 "
                                                "optimizer { adam { beta1: 0.8 } }", lr=0.01)
    assert t.dim == 2 and t.dtype == np.float64
    assert "adam { learning_rate: 0.01 beta1: 0.8 }" in t.config
    client.close()
    assert t.closed
    with pytest.raises(pserver.Closed):
        t.pull([1])


# -- KV workers and consistency -------------------------------------------------

def kv_table(client, name, consistency, staleness=0, n=1):
    return client.create_table(name, n, np.float64, optimizer="add", consistency=consistency,
                               staleness=staleness)


def test_ssp_wait_times_out_naming_the_straggler(client):
    kv = kv_table(client, "ssp", "ssp", staleness=1)
    keys = np.arange(3, dtype=np.uint64)
    workers = [kv.join(f"w{i}") for i in range(3)]
    fast = workers[1]
    for _ in range(2):                        # within the staleness: no wait
        fast.get(keys)
        fast.add([1], [[1.0]])
        fast.clock()
    assert fast.current_clock == 2
    start = time.monotonic()
    with pytest.raises(pserver.DeadlineExceeded, match="w0 at clock 0"):
        fast.get(keys, timeout=4)             # the server answers 1 s before
    assert time.monotonic() - start < 60

    # Now all run on their own threads; every read respects the bound.
    clocks = 6
    violations = []

    def body(w):
        worker = workers[w]
        while worker.current_clock < clocks:
            c = worker.current_clock
            read = worker.get(keys, timeout=20).ravel()
            # Worker `other` made one add per clock: a read at clock c sees
            # at least the adds of clocks before c - 1, and its own.
            for other in range(3):
                if read[other] < c - 1:
                    violations.append((w, c, other, read[other]))
            if read[w] != c:
                violations.append((w, c, "own", read[w]))
            worker.add([w], [[1.0]], timeout=20)
            worker.clock(timeout=20)

    run_threads(3, body)
    assert violations == []
    for w in workers:
        w.close()
    assert all(s["workers"] == 0 for s in kv.stats())


def test_bsp_small_run_reads_exactly_the_earlier_clocks(client):
    kv = kv_table(client, "bsp", "bsp")
    n, clocks = 3, 5
    keys = np.arange(n, dtype=np.uint64)
    bad = []

    # Join all first, then run: a late joiner would hold nobody back.
    workers = [kv.join(f"w{w}") for w in range(n)]

    def run(w):
        worker = workers[w]
        for c in range(clocks):
            read = worker.get(keys, timeout=20).ravel()
            if not np.array_equal(read, np.full(n, float(c))):
                bad.append((w, c, read.tolist()))
            worker.add([w], [[1.0]], timeout=20)
            worker.clock(timeout=20)

    run_threads(n, run)
    assert bad == []
    for worker in workers:
        worker.leave()
    with pytest.raises(pserver.FailedPrecondition, match="has left"):
        workers[0].get(keys)
    for worker in workers:
        worker.close()


def test_kv_worker_context_manager_and_chunks(client):
    kv = client.create_table("chunks", 2, optimizer="add", chunk_size=3)
    assert kv.chunk_size == 3
    with kv.join("solo") as worker:
        assert repr(worker) == "<pserver.KvWorker 'solo' of table 'chunks' clock 0>"
        worker.add_chunk([1], np.ones((3, 2), np.float32))
        rows = worker.get_chunk([0, 1])
        assert rows.shape == (6, 2)
        np.testing.assert_array_equal(rows[:3], 0)
        np.testing.assert_array_equal(rows[3:], 1)
        np.testing.assert_array_equal(worker.get([3, 5]), 1)
        with pytest.raises(pserver.InvalidArgument, match=r"\(3, 2\) expected"):
            worker.add_chunk([1], np.ones((2, 2), np.float32))
        assert worker.clock() == 1
        assert kv.stats()[0]["workers"] == 1
    assert worker.closed
    assert all(s["workers"] == 0 for s in kv.stats())


# -- groups -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_all_reduce_across_threads_equals_numpy_sum(client, dtype):
    n = 3
    rng = np.random.default_rng(0)
    inputs = [(rng.random((7, 5)) * 100).astype(dtype) for _ in range(n)]
    expected = np.sum(np.stack(inputs), axis=0, dtype=dtype)
    results = [None] * n

    def body(rank):
        with client.group(f"sum-{np.dtype(dtype)}", n, f"w{rank}") as g:
            arr = inputs[rank].copy()
            out = g.all_reduce(arr, timeout=20)
            assert out is arr
            results[rank] = arr
            mean = g.all_reduce(np.full(4, float(rank), np.float64), op="mean", timeout=20)
            np.testing.assert_allclose(mean, 1.0)

    run_threads(n, body)
    for r in results:
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(r, expected, rtol=1e-6)
        else:
            np.testing.assert_array_equal(r, expected)
        np.testing.assert_array_equal(r, results[0])   # identical bytes everywhere


def test_barrier_and_broadcast(client):
    n = 3
    arrived = []
    early = []
    got = [None] * n

    def body(rank):
        g = client.group("bb", n, f"w{rank}")
        for rnd in range(3):
            arrived.append(rank)
            g.barrier("workers" if rnd % 2 == 0 else "all", timeout=20)
            if len(arrived) < n * (rnd + 1):
                early.append((rank, rnd))
        arr = np.full(5, 7.0 if rank == 1 else 0.0, np.float32)
        got[rank] = g.broadcast(arr, root=rank == 1, timeout=20)
        g.barrier("servers", timeout=20)
        g.close()

    run_threads(n, body)
    assert early == []
    for arr in got:
        np.testing.assert_array_equal(arr, 7.0)


def test_barrier_times_out_naming_who_arrived(client):
    g = client.group("lonely", 2, "w0")
    with pytest.raises(pserver.DeadlineExceeded, match=r"1 of 2 arrived \(w0\)"):
        g.barrier(timeout=0.3)
    assert repr(g) == "<pserver.Group 'lonely' member 'w0' of 2>"


def test_group_bad_arguments(client):
    g = client.group("args", 1, "w0")
    with pytest.raises(pserver.InvalidArgument, match="numpy array"):
        g.all_reduce([1.0, 2.0])
    with pytest.raises(pserver.InvalidArgument, match="C-contiguous"):
        g.all_reduce(np.zeros((4, 4), np.float32)[:, 1])
    with pytest.raises(pserver.InvalidArgument, match="float16"):
        g.all_reduce(np.zeros(3, np.float16))
    with pytest.raises(pserver.InvalidArgument, match="reduce op"):
        g.all_reduce(np.zeros(3, np.float32), op="max")
    with pytest.raises(pserver.InvalidArgument, match="barrier scope"):
        g.barrier("everyone")
    with pytest.raises(pserver.InvalidArgument, match="at least 1"):
        client.group("none", 0, "w0")
    with pytest.raises(pserver.InvalidArgument, match="participant"):
        client.group("anon", 2, "")
    # A group of one reduces to itself.
    np.testing.assert_array_equal(g.all_reduce(np.arange(3, dtype=np.int32)), [0, 1, 2])


def test_tables_in_checkpoints(tmp_path):
    with pserver.LocalCluster(servers=2, checkpoint_dir=str(tmp_path)) as cluster:
        t = cluster.client().create_table("saved", 2, np.float64, optimizer="add")
        keys = np.array([40, 3, 17], np.uint64)
        t.push(keys, np.arange(6, dtype=np.float64).reshape(3, 2))
        cluster.save_checkpoint()
    with pserver.CheckpointReader(str(tmp_path)) as reader:
        assert reader.tables() == ["saved"]
        got_keys, values = reader.read_table("saved")
        np.testing.assert_array_equal(got_keys, [3, 17, 40])
        np.testing.assert_array_equal(values, [[2, 3], [4, 5], [0, 1]])
        with pytest.raises(pserver.NotFound, match="nope"):
            reader.read_table("nope")


def test_int64_keys_are_the_same_rows_as_uint64(client):
    t = client.create_table("int64keys", 2, optimizer="sgd", lr=1.0)
    t.push(np.array([4, 9, 4], np.int64), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(t.pull(np.array([4, 9], np.uint64)),
                                  [[-2, -2], [-1, -1]])
    np.testing.assert_array_equal(t.pull(np.array([9, 2**62], np.int64)),
                                  [[-1, -1], [0, 0]])
    # A rejected push changes nothing.
    with pytest.raises(pserver.InvalidArgument, match="key -1 at index 0"):
        t.push(np.array([-1, 4], np.int64), np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(t.pull([4]), [[-2, -2]])
