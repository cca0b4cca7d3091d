"""A small MLP on scikit-learn's digits, trained by 3 processes
(torch.multiprocessing) through pserver servers with
pserver.torch.DistributedOptimizer in sync mode, and the same model trained
in one process with torch.optim.SGD: same seed, same batches in the same
order (each trainer takes a third of every batch), same learning rate.

    pserver --port=7000 --index=0 &  pserver --port=7001 --index=1 &
    python3 python/examples/torch_digits.py --servers 127.0.0.1:7000,127.0.0.1:7001

Prints both test accuracies and exits 1 unless they are within --tolerance
(python/tests/test_torch.py runs it against server processes it starts).
"""

import argparse
import sys
from typing import List, Tuple

import numpy as np
import torch
import torch.multiprocessing as mp

import pserver
import pserver.torch

TRAINERS = 3


def digits() -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): sklearn's 1797 8x8 digits, pixels
    scaled to [0, 1], split 80/20 by a fixed permutation."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.from_numpy((data.data / 16.0).astype(np.float32))
    y = torch.from_numpy(data.target.astype(np.int64))
    order = torch.from_numpy(np.random.RandomState(0).permutation(len(y)))
    cut = len(y) * 4 // 5
    return x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]]


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 10))


def batches(n: int, batch: int, epochs: int) -> List[torch.Tensor]:
    """The sample indices of every step: a fixed permutation per epoch, cut
    into whole batches (the remainder dropped)."""
    steps = []
    for epoch in range(epochs):
        order = torch.from_numpy(np.random.RandomState(100 + epoch).permutation(n))
        steps += [order[i:i + batch] for i in range(0, n - batch + 1, batch)]
    return steps


def accuracy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def train_alone(args: argparse.Namespace) -> float:
    x, y, x_test, y_test = digits()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    for idx in batches(len(y), args.batch, args.epochs):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        opt.step()
    return accuracy(net, x_test, y_test)


def trainer(rank: int, args: argparse.Namespace) -> None:
    """One of the TRAINERS processes: rank r trains on samples r, r+3, ...
    of every batch."""
    torch.set_num_threads(1)
    x, y, _, _ = digits()
    net = model()
    with pserver.Client(args.servers, timeout=60) as client, \
            pserver.torch.DistributedOptimizer(client, net, mode="sync", rank=rank,
                                               world_size=TRAINERS, optimizer="sgd",
                                               lr=args.lr, prefix="digits/") as opt:
        for idx in batches(len(y), args.batch, args.epochs):
            mine = idx[rank::TRAINERS]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x[mine]), y[mine]).backward()
            opt.step()


def train_distributed(args: argparse.Namespace) -> float:
    mp.start_processes(trainer, args=(args,), nprocs=TRAINERS, join=True,
                       start_method="spawn")
    # The servers hold the trained weights: read them into a fresh model.
    _, _, x_test, y_test = digits()
    net = model()
    with pserver.Client(args.servers, timeout=60) as client:
        for name, p in net.named_parameters():
            client.get("digits/" + name, out=p.detach())
    return accuracy(net, x_test, y_test)


def arguments(doc: str, argv: List[str], *, epochs: int, batch: int,
              lr: float) -> argparse.Namespace:
    """The examples' flags: --servers, --epochs, --batch, --lr, --tolerance."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--servers", required=True, help="host:port,host:port (index order)")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch", type=int, default=batch, help=f"a multiple of {TRAINERS}")
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args(argv)
    if args.batch % TRAINERS:
        parser.error(f"--batch must be a multiple of {TRAINERS}")
    torch.set_num_threads(1)
    return args


def report(metric: str, alone: float, distributed: float, tolerance: float) -> int:
    """Prints both runs' `metric`; 1 if they differ by more than `tolerance`."""
    print(f"one process, torch.optim.SGD: {metric} {alone:.4f}")
    print(f"{TRAINERS} processes through pserver (sync): {metric} {distributed:.4f}")
    if abs(alone - distributed) > tolerance:
        print(f"FAIL: the {metric}s differ by more than {tolerance}")
        return 1
    print(f"within {tolerance} of the single-process {metric}")
    return 0


def main(argv: List[str]) -> int:
    args = arguments(__doc__, argv, epochs=8, batch=48, lr=0.3)
    alone = train_alone(args)
    distributed = train_distributed(args)
    return report("test accuracy", alone, distributed, args.tolerance)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
