"""How every blocking library call is made: the per-call deadline
(``timeout=``) and, for the main thread, a cancellation that Ctrl-C
triggers (KeyboardInterrupt) while the call waits.

Every call goes through the SWIG module ``pserver.capi``, which releases
the GIL while the C function runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator, Optional

from . import capi as _c
from ._errors import InvalidArgument



def version() -> str:
    """The version of libpserver.so, e.g. "0.5.0"."""
    return _c.pserver_version()


@contextlib.contextmanager
def _deadline(timeout: Optional[float]) -> Iterator[None]:
    """Every blocking library call this thread makes inside ends within
    `timeout` seconds from now, all together (DeadlineExceeded at the latest).

    None leaves the deadline as it is (the client's own timeout, or an
    enclosing one); an enclosing earlier deadline is kept.
    """
    if timeout is None:
        yield
        return
    if not timeout > 0:
        raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
    deadline = time.monotonic_ns() + max(1, int(timeout * 1e9))
    previous = _c.pserver_py_swap_call_deadline_ns(deadline)
    if previous:
        _c.pserver_py_swap_call_deadline_ns(min(previous, deadline))
    try:
        yield
    finally:
        _c.pserver_py_swap_call_deadline_ns(previous)


# How often a blocking call on the main thread runs Python's signal
# handlers while it waits (pserver_py_cancel_new_interruptible).
_CHECK_EVERY_MS = 50
_cancel: Any = None  # the main thread's next pserver_cancel_t


def _blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs the blocking library call ``fn(*args)``: the one path of every
    blocking method.

    Python runs its SIGINT handler (KeyboardInterrupt) in the main thread
    only, and only between bytecodes: a main thread inside a C call would
    see Ctrl-C when the call ends, at its deadline. So a call from the main
    thread carries a cancellation whose check runs Python's signal handlers
    every 50 ms while the call waits, on the main thread itself (no thread
    hand-off, which would cost two wake-ups per call): at Ctrl-C the handler
    raises KeyboardInterrupt, the call is cancelled (pserver_cancel_t: its
    gRPC requests end at once) and returns pserver.Cancelled, and
    KeyboardInterrupt is raised here, chained to it. Other threads call
    directly: no KeyboardInterrupt is ever raised there.
    """
    global _cancel
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    # One handle serves call after call until one is cancelled (it stays so).
    cancel = _cancel if _cancel is not None else _c.pserver_py_cancel_new_interruptible(
        _CHECK_EVERY_MS)
    _cancel = None
    previous = _c.pserver_py_swap_call_cancel(cancel)
    error: Optional[BaseException] = None
    try:
        return fn(*args)
    except BaseException as e:  # a signal handler's exception is raised in its place
        error = e
        raise
    finally:
        _c.pserver_py_swap_call_cancel(previous)
        if _c.pserver_cancel_cancelled(cancel):
            _c.pserver_cancel_delete(cancel)
        else:
            _cancel = cancel  # the next call's
        interrupt = _c.pserver_py_take_interrupt()
        if interrupt is not None:
            raise interrupt from error  # pylint: disable=raise-missing-from
