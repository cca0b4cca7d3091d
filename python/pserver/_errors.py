"""Exceptions: one class per status code of the C ABI (absl::StatusCode numbering).

Every error raised by pserver is a :class:`pserver.Error` with ``code`` (an int,
as in ``pserver.h``), ``code_name`` ("NOT_FOUND", ...) and ``message``. The
classes also derive from the matching Python built-in where one exists, so
``except KeyError`` catches :class:`NotFound` and ``except ValueError`` catches
:class:`InvalidArgument`.

>>> import pserver
>>> try:
...     raise pserver.error_from_status(5, "parameter 'w' not found")
... except KeyError as e:
...     print(type(e).__name__, e.code_name)
NotFound NOT_FOUND
"""

from __future__ import annotations

from typing import Dict, Type

OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
ALREADY_EXISTS = 6
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
ABORTED = 10
OUT_OF_RANGE = 11
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14
DATA_LOSS = 15
UNAUTHENTICATED = 16

CODE_NAMES = {
    OK: "OK", CANCELLED: "CANCELLED", UNKNOWN: "UNKNOWN",
    INVALID_ARGUMENT: "INVALID_ARGUMENT", DEADLINE_EXCEEDED: "DEADLINE_EXCEEDED",
    NOT_FOUND: "NOT_FOUND", ALREADY_EXISTS: "ALREADY_EXISTS",
    PERMISSION_DENIED: "PERMISSION_DENIED", RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION", ABORTED: "ABORTED",
    OUT_OF_RANGE: "OUT_OF_RANGE", UNIMPLEMENTED: "UNIMPLEMENTED", INTERNAL: "INTERNAL",
    UNAVAILABLE: "UNAVAILABLE", DATA_LOSS: "DATA_LOSS", UNAUTHENTICATED: "UNAUTHENTICATED",
}


class Error(Exception):
    """Base of every pserver error: ``code``, ``code_name`` and ``message``."""

    code: int = UNKNOWN

    def __init__(self, message: str = "", code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    @property
    def code_name(self) -> str:
        return CODE_NAMES.get(self.code, "UNKNOWN_CODE")

    def __str__(self) -> str:  # KeyError would otherwise print the repr
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code_name})"


class Cancelled(Error):
    code = CANCELLED


class Unknown(Error):
    code = UNKNOWN


class InvalidArgument(Error, ValueError):
    """A bad input (wrong dtype, shape, size or setting); nothing was changed."""

    code = INVALID_ARGUMENT


class DeadlineExceeded(Error, TimeoutError):
    code = DEADLINE_EXCEEDED


class NotFound(Error, KeyError):
    """An unknown parameter name (or a missing checkpoint)."""

    code = NOT_FOUND


class AlreadyInitialized(Error):
    """ALREADY_EXISTS: the parameter was initialized before (the first init wins)."""

    code = ALREADY_EXISTS


AlreadyExists = AlreadyInitialized


class PermissionDenied(Error, PermissionError):
    code = PERMISSION_DENIED


class ResourceExhausted(Error):
    code = RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = FAILED_PRECONDITION


class Uninitialized(FailedPrecondition):
    """FAILED_PRECONDITION "pserver not fully initialized": call finish_init() first."""


class Closed(FailedPrecondition):
    """The object was closed (or its cluster stopped) in this process."""


class Aborted(Error):
    code = ABORTED


class OutOfRange(Error, IndexError):
    code = OUT_OF_RANGE


class Unimplemented(Error, NotImplementedError):
    code = UNIMPLEMENTED


class Internal(Error):
    code = INTERNAL


class Unavailable(Error, ConnectionError):
    """The server cannot be reached (or was stopped); often worth a retry."""

    code = UNAVAILABLE


class DataLoss(Error):
    """Damaged data, e.g. "checkpoint file checksum validation failed: <file> ..."."""

    code = DATA_LOSS


class Unauthenticated(Error):
    code = UNAUTHENTICATED


_BY_CODE: Dict[int, Type[Error]] = {
    CANCELLED: Cancelled, UNKNOWN: Unknown, INVALID_ARGUMENT: InvalidArgument,
    DEADLINE_EXCEEDED: DeadlineExceeded, NOT_FOUND: NotFound,
    ALREADY_EXISTS: AlreadyInitialized, PERMISSION_DENIED: PermissionDenied,
    RESOURCE_EXHAUSTED: ResourceExhausted, FAILED_PRECONDITION: FailedPrecondition,
    ABORTED: Aborted, OUT_OF_RANGE: OutOfRange, UNIMPLEMENTED: Unimplemented,
    INTERNAL: Internal, UNAVAILABLE: Unavailable, DATA_LOSS: DataLoss,
    UNAUTHENTICATED: Unauthenticated,
}


def error_from_status(code: int, message: str) -> Error:
    """The exception for a status code and message (what the C ABI returned)."""
    if code == FAILED_PRECONDITION and "not fully initialized" in message:
        return Uninitialized(message, code)
    return _BY_CODE.get(code, Unknown)(message, code)
