"""pserver.torch: PyTorch on a pserver cluster (docs/pytorch.md).

Imported on its own (``import pserver.torch``) and only where PyTorch is
installed; ``import pserver`` never needs it.

- CPU tensors go in and out of every ``pserver.Client`` and ``Table`` call
  without a copy (through DLPack): ``client.send_grad("w", t)``,
  ``client.get("w", out=t)`` writes into `t`'s memory; :func:`get` and
  :func:`pull` return tensors that share the arrays' memory. A tensor that
  requires grad, is not C-contiguous (for ``out=``) or has a dtype pserver
  does not store raises :class:`pserver.InvalidArgument` saying so.
- :class:`DistributedOptimizer`: a model's parameters on the servers, each
  gradient pushed as backward() produces it, the servers' optimizer applied,
  fresh weights pulled in ``step()``; ``mode="sync"`` (every trainer's step k
  sees the same weights), ``"ssp"`` (bounded staleness) or ``"asp"``.
- :class:`Embedding` and :class:`EmbeddingBag`: ``torch.nn`` modules over a
  sparse table, with autograd.
"""

from __future__ import annotations

from typing import Any, Optional

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("pserver.torch needs PyTorch (Debian: apt-get install python3-torch); "
                      "`import pserver` works without it") from e

from ._torch_embedding import Embedding, EmbeddingBag
from ._torch_optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer", "Embedding", "EmbeddingBag", "get", "pull"]


def get(client: Any, name: str, out: Optional["torch.Tensor"] = None, *,
        timeout: Optional[float] = None) -> "torch.Tensor":
    """Parameter `name` as a CPU tensor (sharing the memory the values were
    received into), or written into the CPU tensor `out` in place."""
    if out is not None:
        return client.get(name, out=out, timeout=timeout)
    return torch.from_numpy(client.get(name, timeout=timeout))


def pull(table: Any, keys: Any, out: Optional["torch.Tensor"] = None, *,
         timeout: Optional[float] = None) -> "torch.Tensor":
    """The rows of `keys` (an int64 tensor of non-negative keys, or any keys
    ``Table.pull`` takes) as an ``(n, dim)`` tensor, or written into `out`."""
    if out is not None:
        return table.pull(keys, out=out, timeout=timeout)
    return torch.from_numpy(table.pull(keys, timeout=timeout))
