"""The Python half of //tests:cross_language_test.

  train   --servers A,B --out DIR   init and train parameters, then dump what get returns
  get     --servers A,B --out DIR   dump the parameters (names from the training set)
  ckpt    --path CKPT --out DIR     dump every parameter of a checkpoint (pserver.read_checkpoint)
  compare DIR DIR                   the two dumps hold the same names, types, shapes and bytes

A dump is <name>.bin (the array's bytes) per parameter and meta.json
({name: [dtype, shape]}), the format the Go half writes too.
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import pserver

# name: (dtype, shape, optimizer). "emb" is larger than a block (1 MiB), so
# it is cut over both shards.
PARAMS = {
    "emb": (np.float32, (700, 500), "adam"),
    "w": (np.float64, (3, 4), "sgd"),
    "count": (np.int64, (5,), "add"),
    "ids": (np.uint32, (7,), "add"),
    "bias": (np.int32, (2, 1), "add"),
    "steps": (np.uint64, (1,), "add"),  # not (): pserver.Client.init makes a 0-d array 1-d
}
STEPS = 5


def value(rng, dtype, shape):
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(0, 100, size=shape).astype(dtype)


def dump(arrays, out):
    os.makedirs(out, exist_ok=True)
    meta = {}
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(a.tobytes())
        meta[name] = [str(a.dtype), list(a.shape)]
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, sort_keys=True)


def train(client):
    rng = np.random.default_rng(1234)
    for name, (dtype, shape, optimizer) in PARAMS.items():
        client.init(name, value(rng, dtype, shape), optimizer=optimizer)
    client.finish_init()
    for _ in range(STEPS):
        client.push_pull({name: value(rng, dtype, shape)
                          for name, (dtype, shape, _) in PARAMS.items()})


def compare(a, b):
    with open(os.path.join(a, "meta.json")) as f:
        meta_a = json.load(f)
    with open(os.path.join(b, "meta.json")) as f:
        meta_b = json.load(f)
    if meta_a != meta_b:
        sys.exit(f"FAIL: {a} and {b} differ in names, types or shapes:\n{meta_a}\n{meta_b}")
    if sorted(meta_a) != sorted(PARAMS):
        sys.exit(f"FAIL: {a} holds {sorted(meta_a)}, expected {sorted(PARAMS)}")
    for name in sorted(meta_a):
        with open(os.path.join(a, name + ".bin"), "rb") as f:
            bytes_a = f.read()
        with open(os.path.join(b, name + ".bin"), "rb") as f:
            bytes_b = f.read()
        if bytes_a != bytes_b:
            sys.exit(f"FAIL: {name} differs between {a} and {b}")
        print(f"  {name:6} {meta_a[name][0]:8} {str(meta_a[name][1]):11} "
              f"sha256 {hashlib.sha256(bytes_a).hexdigest()[:16]}")
    print(f"OK: {a} == {b}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["train", "get", "ckpt", "compare"])
    p.add_argument("dirs", nargs="*")
    p.add_argument("--servers")
    p.add_argument("--path")
    p.add_argument("--out")
    args = p.parse_args()
    if args.command == "compare":
        compare(*args.dirs)
    elif args.command == "ckpt":
        dump(pserver.read_checkpoint(args.path), args.out)
    else:
        with pserver.Client(args.servers.split(","), timeout=30) as client:
            if args.command == "train":
                train(client)
            dump(client.get_many(sorted(PARAMS)), args.out)


if __name__ == "__main__":
    main()
