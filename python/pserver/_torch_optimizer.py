"""pserver.torch.DistributedOptimizer: a model's parameters on the servers,
in the spirit of BytePS's DistributedOptimizer (docs/pytorch.md).

Each parameter is registered on the servers (the first trainer's init wins;
the others must ask for the same dtype, shape and optimizer). A hook on each
parameter's gradient accumulator tells a background thread when backward()
has produced its gradient, and that thread sends it while backward goes on
(every call releases the GIL). ``step()`` waits for the sends, then pulls
every parameter into the model's own memory in one round trip per server.

Modes:

- ``"sync"``: the trainers average each gradient through the servers
  (``Group.all_reduce``, in a fixed parameter order), rank 0 sends the mean,
  and a barrier makes every trainer's pull of step k see exactly the weights
  after k updates: the same as one process training on the union of their
  batches with the servers' optimizer.
- ``"ssp"`` (with `staleness` s): each trainer sends its own gradients; in
  ``step()`` it advances its clock on a KV table with SSP consistency and
  waits until every trainer is at most s steps behind before pulling.
- ``"asp"``: sends and pulls, never waits for the others.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from ._errors import AlreadyInitialized, InvalidArgument
from ._torch_embedding import _TableRows

__all__ = ["DistributedOptimizer"]

_MODES = ("sync", "ssp", "asp")


def _check_parameter(name: str, p: torch.Tensor) -> None:
    if p.device.type != "cpu":
        raise InvalidArgument(f"parameter {name!r} is on {p.device}: DistributedOptimizer "
                              "takes CPU parameters")
    if not p.is_contiguous():
        raise InvalidArgument(f"parameter {name!r} is not contiguous (strides {p.stride()}); "
                              "its weights are pulled into its own memory")


class DistributedOptimizer:
    """Trains `model` through the servers `client` talks to.

    ``zero_grad(); loss.backward(); step()`` as with a torch optimizer; the
    update itself is the servers' `optimizer` (``"sgd"``, ``"adam"``, ...,
    with its settings as keywords: ``lr=0.1``, as ``Client.init`` takes).
    `rank` (0 .. world_size-1) and `world_size` name this trainer among the
    trainers of one job; `prefix` keeps several jobs' parameters apart.
    `timeout` bounds each call (None: the client's timeout).

    >>> opt = pserver.torch.DistributedOptimizer(client, model, mode="sync", rank=r,
    ...                                          world_size=3, optimizer="sgd", lr=0.1)  # doctest: +SKIP
    """

    def __init__(self, client: Any, model: torch.nn.Module, *, mode: str = "sync",
                 rank: int = 0, world_size: int = 1, staleness: int = 0, prefix: str = "",
                 optimizer: str = "sgd", timeout: Optional[float] = None,
                 **settings: Any) -> None:
        if mode not in _MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
        if not isinstance(world_size, int) or world_size < 1:
            raise InvalidArgument(f"world_size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank must be in [0, {world_size}), got {rank!r}")
        if mode == "ssp" and (not isinstance(staleness, int) or staleness < 0):
            raise InvalidArgument(f"staleness must be a non-negative int, got {staleness!r}")
        self._client = client
        self._mode = mode
        self._rank = rank
        self._world_size = world_size
        self._timeout = timeout
        self._params: List[Tuple[str, torch.nn.Parameter]] = [
            (prefix + name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not self._params:
            raise InvalidArgument("the model has no parameters that require grad")
        for name, p in self._params:
            _check_parameter(name, p)
        self._tables = [m for m in model.modules() if isinstance(m, _TableRows)]
        self._register(optimizer, settings)
        self._group = None
        self._worker = None
        if mode == "sync":
            self._group = client.group(f"{prefix}pserver.torch", world_size, f"rank{rank}")
            for m in self._tables:
                m.grad_scale = 1.0 / world_size
                m.defer_pushes = True
        elif mode == "ssp":
            clock = client.create_table(f"{prefix}pserver.torch.clock", 1, optimizer="add",
                                        consistency="ssp", staleness=staleness,
                                        timeout=timeout)
            self._worker = clock.join(f"rank{rank}", timeout=timeout)
        self.steps = 0
        # What the background thread works through, per step, in reverse
        # registration order (about the order backward produces gradients).
        self._order = list(reversed(range(len(self._params))))
        self._cv = threading.Condition()
        self._ready = [False] * len(self._params)
        self._pos = 0
        self._flushing = False
        self._closed = False
        self._error: Optional[BaseException] = None
        self._hooks = []
        with torch.enable_grad():  # the accumulator is reached through a graph
            for i, (_, p) in enumerate(self._params):
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                handle = accumulator.register_hook(lambda *_, i=i: self._on_grad(i))
                self._hooks.append((accumulator, handle))
        self._thread = threading.Thread(target=self._run, name="pserver-torch-optimizer",
                                        daemon=True)
        self._thread.start()
        try:  # every trainer starts from the same (the first trainer's) weights
            if self._group is not None:
                self._group.barrier(timeout=timeout)
            self._pull(timeout)
        except BaseException:
            self.close()
            raise

    # -- registration and pulls ---------------------------------------------

    def _register(self, optimizer: str, settings: Dict[str, Any]) -> None:
        for name, p in self._params:
            try:
                self._client.init(name, p.detach(), optimizer=optimizer, exist_ok=True,
                                  timeout=self._timeout, **settings)
            except AlreadyInitialized as e:
                raise AlreadyInitialized(
                    f"parameter {name!r}: {e} (every trainer of a job registers the same "
                    "parameters with the same optimizer; use another prefix= for another "
                    "model)") from None
        self._client.finish_init(timeout=self._timeout)

    def _pull(self, timeout: Optional[float]) -> None:
        with torch.no_grad():
            self._client.get_many([n for n, _ in self._params],
                                  out={n: p.detach() for n, p in self._params},
                                  timeout=timeout)

    # -- the background thread ------------------------------------------------

    def _on_grad(self, i: int) -> None:
        with self._cv:
            if self._ready[i]:
                name = self._params[i][0]
                self._error = self._error or InvalidArgument(
                    f"parameter {name!r} got a second gradient before step(): call step() "
                    "after each backward()")
            self._ready[i] = True
            self._cv.notify_all()

    def _next(self) -> Optional[int]:
        """The next parameter to send this step, once it is ready (or the
        step is being flushed); None when closed."""
        with self._cv:
            while not self._closed and not (
                    self._pos < len(self._order)
                    and (self._ready[self._order[self._pos]] or self._flushing)):
                self._cv.wait()
            return None if self._closed else self._order[self._pos]

    def _run(self) -> None:
        while True:
            i = self._next()
            if i is None:
                return
            try:
                if self._error is None:
                    self._send(i)
            except BaseException as e:  # raised by step()
                self._error = e
            with self._cv:
                self._pos += 1
                self._cv.notify_all()

    def _send(self, i: int) -> None:
        name, p = self._params[i]
        grad = p.grad
        if grad is not None:
            grad = grad.detach()
            if grad.is_sparse:
                grad = grad.to_dense()
            grad = grad.contiguous()
        if self._mode != "sync":
            if grad is not None:
                self._client.send_grad(name, grad, timeout=self._timeout)
            return
        # Every trainer makes the same calls in the same order: a parameter
        # without a gradient here contributes zeros to the mean.
        if grad is None:
            grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
        self._group.all_reduce(grad, op="mean", timeout=self._timeout)
        if self._rank == 0:
            self._client.send_grad(name, grad, timeout=self._timeout)

    # -- the optimizer's interface ------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self._params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    def step(self, *, timeout: Optional[float] = None) -> None:
        """Waits until every gradient of this step is sent (parameters that got
        none: zeros in sync mode, nothing otherwise) and the embedding tables'
        pushes are done, waits for the other trainers as the mode says, and
        pulls every parameter into the model. `timeout` bounds the wait for
        the others and the pull (None: the optimizer's timeout);
        DeadlineExceeded names the trainers holding it back."""
        with self._cv:
            if self._closed:
                raise InvalidArgument("step() on a closed DistributedOptimizer")
            self._flushing = True
            self._cv.notify_all()
            while self._pos < len(self._order):
                self._cv.wait()
            error, self._error = self._error, None
            self._ready = [False] * len(self._params)
            self._pos = 0
            self._flushing = False
        if error is not None:
            raise error
        # In sync mode the dense all-reduces of this step have completed, so
        # every trainer's forward has pulled its rows: the row pushes go now.
        for m in self._tables:
            m.wait()
        timeout = self._timeout if timeout is None else timeout
        if self._group is not None:
            self._group.barrier(timeout=timeout)
        elif self._worker is not None:
            self._worker.clock(timeout=timeout)
            self._worker.get([0], timeout=timeout)  # waits for trainers > s behind
        self._pull(timeout)
        self.steps += 1

    def close(self) -> None:
        """Stops the background thread, removes the hooks and leaves the
        group or clock table; safe twice."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._thread.join()
        for _, handle in self._hooks:
            handle.remove()
        self._hooks = []
        for m in self._tables:
            m.defer_pushes = False
            m.close()
        for held in (self._worker, self._group):
            if held is not None:
                held.close()

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<pserver.torch.DistributedOptimizer {self._mode} rank {self._rank} of "
                f"{self._world_size}: {len(self._params)} parameters, step {self.steps}>")
