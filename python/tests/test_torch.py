"""pserver.torch: tensors in and out without copies, DistributedOptimizer
(sync, ssp, asp) and the table-backed Embedding / EmbeddingBag. Skipped
where PyTorch is absent (CI installs python3-torch, so they run there)."""
import threading

import numpy as np
import pytest

import pserver
from conftest import run_threads

torch = pytest.importorskip("torch", reason="needs PyTorch (python3-torch)")
import pserver.torch  # noqa: E402  (after the skip)


def test_tensors_in_and_out_without_copies(client):
    client.init("w", torch.arange(6, dtype=torch.float32).reshape(2, 3), optimizer="sgd",
                lr=1.0)
    client.finish_init()
    client.send_grad("w", torch.ones(2, 3))
    out = torch.zeros(2, 3)
    address = out.data_ptr()
    assert client.get("w", out=out) is out and out.data_ptr() == address
    assert torch.equal(out, torch.arange(6.0).reshape(2, 3) - 1)
    got = pserver.torch.get(client, "w")
    assert isinstance(got, torch.Tensor) and torch.equal(got, out)
    assert pserver.torch.get(client, "w", out=out) is out
    results = client.push_pull({"w": torch.zeros(2, 3)}, out={"w": out})
    assert results["w"] is out


def test_tensor_problems_are_clear_errors(client):
    client.init("w", np.zeros((2, 3), np.float32))
    client.finish_init()
    with pytest.raises(pserver.InvalidArgument, match="require gradient"):
        client.send_grad("w", torch.ones(2, 3, requires_grad=True))
    with pytest.raises(pserver.InvalidArgument, match="float64 received, float32 expected"):
        client.send_grad("w", torch.ones(2, 3, dtype=torch.float64))
    with pytest.raises(pserver.InvalidArgument, match="not C-contiguous"):
        client.get("w", out=torch.zeros(3, 2).t())
    with pytest.raises(pserver.InvalidArgument, match="float16 is not supported"):
        client.init("h", torch.zeros(2, dtype=torch.float16))
    np.testing.assert_array_equal(client.get("w"), 0)


def _data(seed=0, n=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def _net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def _reference(steps, lr):
    """The weights after `steps` steps of torch.optim.SGD on the whole batch."""
    x, y = _data()
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in net.parameters()]


def test_sync_trainers_see_the_same_weights_as_one_process(cluster):
    trainers, steps, lr = 3, 4, 0.5
    x, y = _data()
    weights, grads = {}, {}
    nets = [_net() for _ in range(trainers)]  # here: torch's global RNG is not per thread

    def trainer(rank):
        net = nets[rank]
        with cluster.client() as client, pserver.torch.DistributedOptimizer(
                client, net, mode="sync", rank=rank, world_size=trainers,
                optimizer="sgd", lr=lr, timeout=60) as opt:
            seen = []
            for _ in range(steps):
                mine = slice(rank * 8, rank * 8 + 8)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x[mine]), y[mine]).backward()
                opt.step()
                seen.append([p.detach().clone() for p in net.parameters()])
            weights[rank] = seen
            grads[rank] = [p.grad.clone() for p in net.parameters()]

    run_threads(trainers, trainer, timeout=120)
    for k in range(steps):  # step k: the same bytes everywhere
        for r in range(1, trainers):
            assert all(torch.equal(a, b) for a, b in zip(weights[0][k], weights[r][k]))
    for r in range(1, trainers):  # after step(), p.grad holds the mean gradient
        assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[r]))
    for got, want in zip(weights[0][-1], _reference(steps, lr)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_asp_single_trainer_matches_torch_optim(client):
    x, y = _data()
    net = _net()
    with pserver.torch.DistributedOptimizer(client, net, mode="asp", optimizer="sgd",
                                            lr=0.3) as opt:
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        assert opt.steps == 3
    for got, want in zip(net.parameters(), _reference(3, 0.3)):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)
    # The servers hold what the model holds.
    for name, p in net.named_parameters():
        torch.testing.assert_close(pserver.torch.get(client, name), p.detach())


def test_second_trainer_reads_the_first_ones_weights(cluster):
    first, second = _net(), _net()
    with torch.no_grad():
        for p in second.parameters():
            p.fill_(7.0)  # another init: the first trainer's wins
    with cluster.client() as a, cluster.client() as b:
        opt_a = pserver.torch.DistributedOptimizer(a, first, mode="asp", lr=0.1)
        opt_b = pserver.torch.DistributedOptimizer(b, second, mode="asp", lr=0.1)
        for p, q in zip(first.parameters(), second.parameters()):
            assert torch.equal(p, q)
        with pytest.raises(pserver.AlreadyInitialized, match="another config"):
            pserver.torch.DistributedOptimizer(b, _net(), mode="asp", lr=0.2)
        opt_a.close()
        opt_b.close()


def test_ssp_waits_for_trainers_more_than_staleness_behind(cluster):
    with cluster.client() as a, cluster.client() as b:
        fast = pserver.torch.DistributedOptimizer(a, _net(), mode="ssp", staleness=1, rank=0,
                                                  world_size=2, lr=0.1, timeout=60)
        slow = pserver.torch.DistributedOptimizer(b, _net(), mode="ssp", staleness=1, rank=1,
                                                  world_size=2, lr=0.1, timeout=60)
        fast.step()  # clock 1: needs the slow one at clock 0 at least
        with pytest.raises(pserver.DeadlineExceeded, match="rank1"):
            fast.step(timeout=3.0)  # clock 2: the slow one is still at 0
        slow.close()
        fast.close()


def test_a_failed_start_leaves_no_hooks(cluster):
    net = _net()
    with cluster.client() as client:
        # A sync group of 2 whose other member never comes: the start times out.
        with pytest.raises(pserver.DeadlineExceeded, match="1 of 2|arrived"):
            pserver.torch.DistributedOptimizer(client, net, mode="sync", rank=0, world_size=2,
                                               lr=0.1, timeout=2.0)
        # It closed itself: its thread is gone (close() joins it and removes the hooks).
        assert not [t for t in threading.enumerate() if t.name == "pserver-torch-optimizer"]
        with torch.no_grad():  # built under no_grad too; the hooks are this one's only
            opt = pserver.torch.DistributedOptimizer(client, net, mode="asp", lr=0.1)
        x, y = _data()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        opt.close()


def test_bad_settings_and_misuse_are_clear_errors(client):
    with pytest.raises(pserver.InvalidArgument, match="mode must be"):
        pserver.torch.DistributedOptimizer(client, _net(), mode="bsp")
    with pytest.raises(pserver.InvalidArgument, match="rank must be"):
        pserver.torch.DistributedOptimizer(client, _net(), rank=3, world_size=3)
    net = _net()
    x, y = _data()
    with pserver.torch.DistributedOptimizer(client, net, mode="asp", lr=0.1) as opt:
        for _ in range(2):
            torch.nn.functional.cross_entropy(net(x), y).backward()
        with pytest.raises(pserver.InvalidArgument, match="second gradient before step"):
            opt.step()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()  # usable again


def test_embedding_pulls_rows_and_pushes_their_gradients(client):
    table = client.create_table("emb", 2, optimizer="sgd", lr=1.0)
    table.push(np.array([5], np.uint64), np.full((1, 2), -3, np.float32))  # row 5 = 3
    emb = pserver.torch.Embedding(table)
    keys = torch.tensor([[5, 2**40], [5, 9]])
    out = emb(keys)
    assert out.shape == (2, 2, 2)
    assert torch.equal(out[0, 0], torch.tensor([3.0, 3.0]))
    assert torch.equal(out[1, 1], torch.zeros(2))
    out.sum().backward()  # each row's gradient: how often its key appears
    emb.wait()
    np.testing.assert_array_equal(table.pull([5, 2**40, 9]), [[1, 1], [-1, -1], [-1, -1]])
    with torch.no_grad():  # no gradient, no push
        emb(keys).sum()
    emb.eval()
    assert not emb(keys).requires_grad  # in eval mode: no gradient, no push
    emb.train()
    np.testing.assert_array_equal(table.pull([9]), [[-1, -1]])
    with pytest.raises(pserver.InvalidArgument, match="key -4 at index 1 .of the flattened input. is negative"):
        emb(torch.tensor([1, -4]))
    with pytest.raises(pserver.InvalidArgument, match="int64"):
        emb(torch.tensor([1.0]))


def test_embedding_bag_means_and_sums(client):
    table = client.create_table("bags", 3, optimizer="sgd", lr=1.0, initializer="uniform",
                                low=-1, high=1, seed=4)
    before = table.pull([1, 2, 3])
    bag = pserver.torch.EmbeddingBag(table, mode="mean")
    out = bag(torch.tensor([[1, 2], [3, 3]]))
    torch.testing.assert_close(out, torch.from_numpy(
        np.stack([before[:2].mean(0), before[2]])))
    out.sum().backward()
    bag.wait()
    np.testing.assert_allclose(table.pull([1, 2, 3]), before - [[0.5], [0.5], [1.0]], rtol=1e-6)
    summed = pserver.torch.EmbeddingBag(table, mode="sum")
    flat = summed(torch.tensor([1, 2, 3]), offsets=torch.tensor([0, 2]))
    assert flat.shape == (2, 3)
    with pytest.raises(pserver.InvalidArgument, match="mode"):
        pserver.torch.EmbeddingBag(table, mode="median")


def test_optimizer_trains_embeddings_with_dense_layers(client):
    table = client.create_table("ctr", 4, optimizer="adagrad", lr=0.5, initializer="normal",
                                stddev=0.1, seed=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(pserver.torch.EmbeddingBag(table, mode="sum"),
                                torch.nn.Linear(4, 1))
    keys = torch.tensor([[1, 2], [3, 4], [1, 4], [2, 3]])
    target = torch.tensor([[1.0], [0.0], [1.0], [0.0]])
    loss_fn = torch.nn.BCEWithLogitsLoss()
    with pserver.torch.DistributedOptimizer(client, model, mode="asp", lr=0.5) as opt:
        assert [n for n, _ in model.named_parameters()] == ["1.weight", "1.bias"]
        losses = []
        for _ in range(30):
            opt.zero_grad()
            loss = loss_fn(model(keys), target)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses
    assert sum(s["keys_pushed"] for s in table.stats()) >= 30 * 4


def test_sync_mode_averages_row_gradients_over_trainers(cluster):
    """Two trainers with the same batch in sync mode: each pushes half its
    row gradients, so the rows move as one trainer's full step would."""
    keys = torch.tensor([[1, 2], [2, 3]])
    table = cluster.client().create_table("rows", 2, optimizer="sgd", lr=1.0,
                                          initializer="uniform", low=-1, high=1, seed=3)
    before = table.pull([1, 2, 3])
    nets = []
    for _ in range(2):
        torch.manual_seed(0)
        nets.append(torch.nn.Sequential(pserver.torch.EmbeddingBag(table, mode="sum"),
                                        torch.nn.Linear(2, 1)))
    # One process, by hand: the rows' gradient for the same loss.
    rows = torch.from_numpy(before.copy()).requires_grad_()
    torch.manual_seed(0)
    linear = torch.nn.Linear(2, 1)
    linear(torch.nn.functional.embedding_bag(keys - 1, rows, mode="sum")).sum().backward()
    def trainer(rank):
        with cluster.client() as client, pserver.torch.DistributedOptimizer(
                client, nets[rank], mode="sync", rank=rank, world_size=2, lr=0.0,
                prefix="rows/", timeout=60) as opt:
            assert nets[rank][0].grad_scale == 0.5
            nets[rank](keys).sum().backward()
            opt.step()

    run_threads(2, trainer, timeout=120)
    np.testing.assert_allclose(table.pull([1, 2, 3]), before - rows.grad.numpy(), rtol=1e-5,
                               atol=1e-6)
