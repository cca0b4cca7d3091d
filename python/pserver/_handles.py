"""C handles shared by threads, and the close()/context-manager protocol
of every pserver object that owns one."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from ._errors import Closed


class _Handle:
    """A C handle shared by threads; close() waits for the calls in flight."""

    def __init__(self, ptr: Any, delete: Callable[[Any], None], what: str) -> None:
        self._ptr = ptr
        self._delete = delete
        self._what = what
        self._busy = 0
        self._cv = threading.Condition()

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @contextlib.contextmanager
    def use(self) -> Iterator[Any]:
        with self._cv:
            if self._ptr is None:
                raise Closed(f"pserver: this {self._what} is closed")
            self._busy += 1
            ptr = self._ptr
        try:
            yield ptr
        finally:
            with self._cv:
                self._busy -= 1
                if self._busy == 0:
                    self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            ptr, self._ptr = self._ptr, None
            while self._busy > 0:  # calls in flight finish (each has a deadline)
                self._cv.wait()
        if ptr is not None:
            self._delete(ptr)


class _Closing:
    """Context manager and finalizer for classes with an idempotent close()."""

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _HandleOwner(_Closing):
    """A _Closing over one _Handle, ``self._h``: close() frees it (waiting
    for the calls in flight) and ``closed`` says whether it was."""

    _h: _Handle

    def close(self) -> None:
        self._h.close()

    @property
    def closed(self) -> bool:
        return self._h.closed
