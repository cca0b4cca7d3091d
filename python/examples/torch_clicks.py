"""A recommendation model on generated click data: an embedding bag over a
sparse pserver table (3 categorical fields) and an MLP, trained by 3
processes (torch.multiprocessing) with pserver.torch.EmbeddingBag and
DistributedOptimizer in sync mode, and the same model trained in one
process with torch.nn.EmbeddingBag and torch.optim.SGD from the same start
(the table's initial rows, read before training) on the same batches.

    pserver --port=7000 --index=0 &  pserver --port=7001 --index=1 &
    python3 python/examples/torch_clicks.py --servers 127.0.0.1:7000,127.0.0.1:7001

Prints both held-out AUCs and exits 1 unless they are within --tolerance
(python/tests/test_torch_examples.py runs it against server processes).
"""

import argparse
import sys
from typing import List, Tuple

import numpy as np
import torch
import torch.multiprocessing as mp

import pserver
import pserver.torch
from torch_digits import TRAINERS, arguments, batches, report

FIELDS, CATEGORIES, DIM = 3, 200, 8
KEYS = FIELDS * CATEGORIES  # field f, category c: key f * CATEGORIES + c


def clicks(n: int = 6000) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys_train, y_train, keys_test, y_test): each sample one category per
    field; clicked with probability sigmoid(sum of hidden per-category
    effects + one pairwise interaction), from a fixed seed."""
    rng = np.random.RandomState(0)
    effect = rng.normal(0, 1.0, KEYS)
    cats = rng.randint(0, CATEGORIES, (n, FIELDS))
    keys = cats + np.arange(FIELDS) * CATEGORIES
    logit = effect[keys].sum(1) + 1.5 * ((cats[:, 0] % 2) == (cats[:, 1] % 2)) - 0.75
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    cut = n * 5 // 6
    k, t = torch.from_numpy(keys.astype(np.int64)), torch.from_numpy(y[:, None])
    return k[:cut], t[:cut], k[cut:], t[cut:]


def table(client: pserver.Client, lr: float) -> pserver.Table:
    return client.create_table("clicks/emb", DIM, optimizer="sgd", lr=lr,
                               initializer="normal", stddev=0.1, seed=7)


class Model(torch.nn.Module):
    def __init__(self, bag: torch.nn.Module) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bag = bag
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.ReLU(),
                                       torch.nn.Linear(16, 1))

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(keys))


def auc(model: torch.nn.Module, keys: torch.Tensor, y: torch.Tensor) -> float:
    from sklearn.metrics import roc_auc_score
    model.eval()
    with torch.no_grad():
        return float(roc_auc_score(y.numpy().ravel(), model(keys).numpy().ravel()))


def train_alone(args: argparse.Namespace, start: torch.Tensor) -> float:
    x, y, x_test, y_test = clicks()
    bag = torch.nn.EmbeddingBag(KEYS, DIM, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(start)
    model = Model(bag)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for idx in batches(len(y), args.batch, args.epochs):
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
    return auc(model, x_test, y_test)


def trainer(rank: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    x, y, _, _ = clicks()
    loss_fn = torch.nn.BCEWithLogitsLoss()
    with pserver.Client(args.servers, timeout=60) as client:
        model = Model(pserver.torch.EmbeddingBag(table(client, args.lr), mode="sum"))
        with pserver.torch.DistributedOptimizer(client, model, mode="sync", rank=rank,
                                                world_size=TRAINERS, optimizer="sgd",
                                                lr=args.lr, prefix="clicks/") as opt:
            for idx in batches(len(y), args.batch, args.epochs):
                mine = idx[rank::TRAINERS]
                opt.zero_grad()
                loss_fn(model(x[mine]), y[mine]).backward()
                opt.step()


def main(argv: List[str]) -> int:
    args = arguments(__doc__, argv, epochs=6, batch=96, lr=1.0)
    with pserver.Client(args.servers, timeout=60) as client:
        # Reads create no rows: this is where every row will start.
        start = torch.from_numpy(table(client, args.lr).pull(np.arange(KEYS, dtype=np.uint64)))
    alone = train_alone(args, start)
    mp.start_processes(trainer, args=(args,), nprocs=TRAINERS, join=True,
                       start_method="spawn")
    _, _, x_test, y_test = clicks()
    with pserver.Client(args.servers, timeout=60) as client:
        model = Model(pserver.torch.EmbeddingBag(table(client, args.lr), mode="sum"))
        for name, p in model.mlp.named_parameters():
            client.get("clicks/mlp." + name, out=p.detach())
        distributed = auc(model, x_test, y_test)
    return report("held-out AUC", alone, distributed, args.tolerance)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
