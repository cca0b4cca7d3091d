"""pserver.torch.Embedding and EmbeddingBag: torch.nn modules whose weight
is a sparse table on the servers (docs/pytorch.md).

Forward pulls the batch's unique keys' rows into a leaf tensor; backward
pushes that tensor's gradient (one row per unique key) back to the table,
whose own optimizer, initializer and eviction apply. The push runs on a
background thread, overlapping the rest of backward; the next forward (or a
DistributedOptimizer's step) waits for it first, so a trainer always reads
its own updates.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, List, Optional

import torch
import torch.nn.functional as F

from ._errors import InvalidArgument

__all__ = ["Embedding", "EmbeddingBag"]


class _TableRows(torch.nn.Module):
    """What Embedding and EmbeddingBag share: a table, its pending pushes,
    and the rows of a batch as a leaf tensor whose gradient is pushed."""

    def __init__(self, table: Any, *, timeout: Optional[float] = None) -> None:
        super().__init__()
        self.table = table
        self.embedding_dim = table.dim
        self.timeout = timeout
        # Gradients are multiplied by this before the push (a
        # DistributedOptimizer in sync mode sets 1 / world_size, so the rows
        # get the mean over trainers' batches, as a single process would).
        self.grad_scale = 1.0
        # Set by a DistributedOptimizer in sync mode: backward keeps the row
        # gradients and its step() pushes them once every trainer's forward
        # has pulled (so no trainer's step k reads another's step-k update).
        self.defer_pushes = False
        self._deferred: List[Any] = []
        self._pending: List[concurrent.futures.Future] = []
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _keys(self, input: torch.Tensor) -> Any:
        if not isinstance(input, torch.Tensor) or input.dtype not in (torch.int64, torch.int32):
            raise InvalidArgument(
                f"{type(self).__name__} over table {self.table.name!r}: input must be an int64 "
                f"(or int32) tensor of non-negative keys, got "
                f"{getattr(input, 'dtype', type(input).__name__)}")
        if input.device.type != "cpu":
            raise InvalidArgument(f"{type(self).__name__}: keys must be on the CPU, not "
                                  f"{input.device}")
        flat = input.reshape(-1).to(torch.int64)
        keys, inverse = torch.unique(flat, return_inverse=True)  # sorted
        if keys.numel() and int(keys[0]) < 0:
            at = int((flat == keys[0]).nonzero()[0])
            raise InvalidArgument(
                f"{type(self).__name__} over table {self.table.name!r}: key {int(keys[0])} "
                f"at index {at} (of the flattened input) is negative; keys are non-negative")
        return keys, inverse

    def _rows(self, keys: torch.Tensor) -> torch.Tensor:
        """The rows of `keys` (unique), a leaf tensor; in training with grad
        enabled, its gradient is pushed back to the table in backward."""
        self.wait()
        rows = torch.from_numpy(self.table.pull(keys, timeout=self.timeout))
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_()
            rows.register_hook(lambda grad: self._push(keys, grad))
        return rows

    def _push(self, keys: torch.Tensor, grad: torch.Tensor) -> None:
        grad = grad.detach()
        if self.grad_scale != 1.0:
            grad = grad * self.grad_scale
        self._deferred.append((keys, grad.contiguous()))
        if not self.defer_pushes:
            self.flush()

    def flush(self) -> None:
        """Starts the pushes that backward has left (see defer_pushes)."""
        if not self._deferred:
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix=f"pserver-push-{self.table.name}")
        for keys, grad in self._deferred:
            self._pending.append(self._executor.submit(
                self.table.push, keys, grad, timeout=self.timeout))
        self._deferred = []

    def wait(self) -> None:
        """Pushes what backward has left and waits for every push so far;
        raises the first that failed."""
        self.flush()
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        """Waits for pending pushes and stops the push thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def extra_repr(self) -> str:
        return f"table={self.table.name!r}, embedding_dim={self.embedding_dim}"


class Embedding(_TableRows):
    """``torch.nn.Embedding`` over a sparse table: ``emb(keys)`` has shape
    ``keys.shape + (dim,)``. Keys are non-negative int64 (any value, not
    0 .. num_embeddings-1: the table has no fixed size).

    >>> emb = pserver.torch.Embedding(client.create_table("emb", 8))  # doctest: +SKIP
    >>> emb(torch.tensor([[3, 10**12], [3, 7]])).shape                # doctest: +SKIP
    torch.Size([2, 2, 8])
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        keys, inverse = self._keys(input)
        return F.embedding(inverse.reshape(input.shape), self._rows(keys))


class EmbeddingBag(_TableRows):
    """``torch.nn.EmbeddingBag`` over a sparse table: sums, means or maxes
    (`mode`) of bags of rows; input is 2-d (one bag a row) or 1-d with
    `offsets`, and may take `per_sample_weights` (mode "sum")."""

    def __init__(self, table: Any, mode: str = "mean", *,
                 timeout: Optional[float] = None) -> None:
        if mode not in ("sum", "mean", "max"):
            raise InvalidArgument(f"EmbeddingBag mode must be sum, mean or max, got {mode!r}")
        super().__init__(table, timeout=timeout)
        self.mode = mode

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        keys, inverse = self._keys(input)
        return F.embedding_bag(inverse.reshape(input.shape), self._rows(keys), offsets,
                               mode=self.mode, per_sample_weights=per_sample_weights)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"
