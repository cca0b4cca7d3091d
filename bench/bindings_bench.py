"""The Python driver of bench/e2e's `bindings` group: push, pull and
push+pull of float32 parameters through the `pserver` package, timed as
e2e times the C++ client, one JSON line per (op, size) on stdout.

    bindings_bench.py --servers=127.0.0.1:7000 --params=name:bytes:ops[,...]
                      [--warmup=1] [--repetitions=5]

Each line is {"op": "push", "payload_bytes": N, "values": [GB/s, ...]}: one
value per round of `ops` operations, the warm-up rounds first. The
parameters exist already (e2e initializes them); each round uses the calls a
trainer makes: send_grad, get(out=...) and push_pull(..., out=...).

As e2e and pserver do in main() (cc/rpc/allocator.h), the driver first has
glibc keep freed buffers for reuse instead of returning them to the kernel,
where every large buffer would be page-faulted afresh (--default-malloc: not).
"""

import argparse
import ctypes
import json
import time

import numpy as np

import pserver


def _keep_freed_memory_for_reuse() -> None:
    """pserver::KeepFreedMemoryForReuse() for this process, through mallopt."""
    libc = ctypes.CDLL(None)
    m_trim_threshold, m_mmap_threshold = -1, -3
    if not (libc.mallopt(m_mmap_threshold, 256 << 20) == 1
            and libc.mallopt(m_trim_threshold, 1 << 30) == 1):
        raise SystemExit("bindings_bench.py: mallopt refused the allocator settings")


def _rounds(op, ops: int, payload_bytes: int, rounds: int) -> list:
    values = []
    for _ in range(rounds):
        begin = time.perf_counter()
        for _ in range(ops):
            op()
        values.append(payload_bytes * ops / (time.perf_counter() - begin) / 1e9)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", required=True, help="host:port[,host:port...]")
    parser.add_argument("--params", required=True, help="name:bytes:ops[,...]")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc's allocator settings as they are")
    args = parser.parse_args()
    if not args.default_malloc:
        _keep_freed_memory_for_reuse()
    with pserver.Client(args.servers.split(","), timeout=120.0) as client:
        for spec in args.params.split(","):
            name, size, ops = spec.split(":")
            size, ops = int(size), int(ops)
            grad = np.full(size // 4, 0.5, np.float32)
            out = np.empty_like(grad)
            kinds = {
                "push": lambda: client.send_grad(name, grad),
                "pull": lambda: client.get(name, out=out),
                "pushpull": lambda: client.push_pull({name: grad}, out={name: out}),
            }
            for kind, op in kinds.items():
                values = _rounds(op, ops, size, args.warmup + args.repetitions)
                print(json.dumps({"op": kind, "payload_bytes": size, "values": values}),
                      flush=True)


if __name__ == "__main__":
    main()
