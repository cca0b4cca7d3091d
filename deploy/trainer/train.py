#!/usr/bin/env python3
"""A trainer for a deployed pserver cluster: linear regression on synthetic data.

Every trainer (container, Kubernetes Job pod, Slurm step) runs this same
script. It finds the servers through etcd, initialises `w` (the first one
wins, the others find it there: exist_ok), pushes gradients and pulls the
new weights for --steps steps, and exits 0 only when the loss fell to under
a tenth of its start (so a deployment test can check that training happened).

Configuration: flags, or the same names as environment variables that the
server reads (PSERVER_ETCD, PSERVER_CLUSTER, PSERVER_TLS_CERT/KEY/CA), so a
pod can share one ConfigMap with the servers; a flag wins.

    python3 train.py --etcd=etcd-0.etcd:2379 --cluster=job-1 --steps=200
"""
import argparse
import os
import sys

import numpy as np

DIM = 16


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--etcd", default=env("PSERVER_ETCD", ""),
                   help="etcd endpoints host:port[,...] (env PSERVER_ETCD)")
    p.add_argument("--cluster", default=env("PSERVER_CLUSTER", "default"),
                   help="cluster name (env PSERVER_CLUSTER)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=int(env("TRAINER_SEED", "0")),
                   help="data seed, e.g. the trainer's rank (env TRAINER_SEED)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds each call, discovery included, may take")
    p.add_argument("--tls_cert", default=env("PSERVER_TLS_CERT", ""))
    p.add_argument("--tls_key", default=env("PSERVER_TLS_KEY", ""))
    p.add_argument("--tls_ca", default=env("PSERVER_TLS_CA", ""))
    args = p.parse_args(argv)
    if not args.etcd:
        p.error("--etcd (or PSERVER_ETCD) is required")
    if args.steps <= 0:
        p.error(f"--steps must be positive, got {args.steps}")
    return args


def main(argv=None):
    args = parse_args(argv)
    import pserver  # after parsing: --help works without the package
    tls = None
    if args.tls_cert or args.tls_key or args.tls_ca:
        tls = pserver.Tls(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)
    rng = np.random.default_rng(args.seed)
    target = np.linspace(-1, 1, DIM).astype(np.float32)  # the same for every trainer
    with pserver.Client(etcd=args.etcd, cluster=args.cluster, timeout=args.timeout,
                        discovery_timeout=args.timeout, tls=tls) as client:
        client.init("w", np.zeros(DIM, np.float32), optimizer="sgd", lr=0.1, exist_ok=True)
        client.finish_init()
        w = client.get("w")
        first = last = None
        for step in range(args.steps):
            x = rng.standard_normal((32, DIM)).astype(np.float32)
            err = x @ w - x @ target
            loss = float(np.mean(err ** 2))
            first = loss if first is None else first
            last = loss
            grad = (2.0 / len(x)) * (x.T @ err)
            w = client.push_pull({"w": grad.astype(np.float32)})["w"]
            if step % 50 == 0:
                print(f"step {step} loss {loss:.6f}", flush=True)
    print(f"trained {args.steps} steps: loss {first:.6f} -> {last:.6f}", flush=True)
    if not last < first / 10:
        print("loss did not fall to a tenth of its start", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
