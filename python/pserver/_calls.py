"""How every blocking library call is made: the per-call deadline
(``timeout=``) and, for the main thread, a helper thread so that Ctrl-C
cancels the call at once (KeyboardInterrupt).

Every call goes through the SWIG module ``pserver.capi``, which releases
the GIL while the C function runs.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional

from . import capi as _c
from ._errors import InvalidArgument



def version() -> str:
    """The version of libpserver.so, e.g. "0.2.0"."""
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


# The helper thread that runs the main thread's blocking calls, its queue of
# calls, and how often the main thread, waiting for one, looks for Ctrl-C.
_CALL_THREAD = "pserver-call"
_WAIT_SLICE_S = 0.05
_calls: Optional["queue.SimpleQueue[Callable[[], None]]"] = None
_calls_lock = threading.Lock()
_calls_started = 0  # calls the helper thread has started (tests wait on it)
_cancel: Any = None  # the main thread's next pserver_cancel_t


def _serve_calls(calls: "queue.SimpleQueue[Callable[[], None]]") -> None:
    global _calls_started
    while True:
        run = calls.get()
        _calls_started += 1
        run()


def _call_queue() -> "queue.SimpleQueue[Callable[[], None]]":
    """The helper thread's queue, starting the thread on first use."""
    global _calls
    with _calls_lock:
        if _calls is None:
            _calls = queue.SimpleQueue()
            threading.Thread(target=_serve_calls, args=(_calls,), name=_CALL_THREAD,
                             daemon=True).start()
        return _calls


def _forget_call_thread() -> None:
    """In a forked child the helper thread is gone: start a new one on use."""
    global _calls, _calls_lock
    _calls, _calls_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_call_thread)


def _blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Runs the blocking library call ``fn(*args)``: the one path of every
    blocking method.

    Python runs its SIGINT handler (KeyboardInterrupt) in the main thread
    only, and only between bytecodes: a main thread inside a C call would
    see Ctrl-C when the call ends, at its deadline. So calls from the main
    thread run on one helper thread while the main thread waits in short
    slices. On KeyboardInterrupt the call is cancelled (pserver_cancel_t: its
    gRPC requests end at once), waited for, and KeyboardInterrupt is raised,
    chained to what the call raised (pserver.Cancelled). The helper runs the
    call under this thread's deadline. Other threads call directly: no
    KeyboardInterrupt is ever raised there.
    """
    global _cancel
    if threading.current_thread() is not threading.main_thread():
        return fn(*args)
    # One handle serves call after call until one is cancelled (it stays so).
    cancel = _cancel if _cancel is not None else _c.pserver_cancel_new()
    _cancel = None
    deadline = _c.pserver_py_call_deadline_ns()
    outcome: Dict[str, Any] = {}
    done = _thread.allocate_lock()
    done.acquire()

    def run() -> None:
        previous_deadline = _c.pserver_py_swap_call_deadline_ns(deadline)
        previous_cancel = _c.pserver_py_swap_call_cancel(cancel)
        try:
            outcome["value"] = fn(*args)
        except BaseException as e:  # handed to the caller
            outcome["error"] = e
        finally:
            _c.pserver_py_swap_call_cancel(previous_cancel)
            _c.pserver_py_swap_call_deadline_ns(previous_deadline)
            done.release()

    queued = False
    try:
        _call_queue().put(run)
        queued = True
        # Short slices: a SIGINT the kernel hands to another thread wakes no
        # blocked wait; between slices the main thread runs Python's handler.
        while not done.acquire(timeout=_WAIT_SLICE_S):
            pass
    except KeyboardInterrupt as interrupt:
        # Cancelling is sticky: a call that has not started yet ends at once.
        _c.pserver_cancel_cancel(cancel)
        while queued:
            try:  # promptly now; a second Ctrl-C waits for it too
                if done.acquire(timeout=_WAIT_SLICE_S):
                    break
            except KeyboardInterrupt:
                pass
        raise interrupt from outcome.get("error")
    finally:
        if not queued or "value" in outcome or "error" in outcome:  # the helper is done with it
            if _c.pserver_cancel_cancelled(cancel):
                _c.pserver_cancel_delete(cancel)
            else:
                _cancel = cancel  # the next call's
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
