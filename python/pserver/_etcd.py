"""Etcd: a small etcd v3 client for tools."""

from __future__ import annotations

from typing import Any, List, Mapping, Sequence, Tuple, Union

from . import capi as _c
from ._errors import InvalidArgument
from ._handles import _Handle, _HandleOwner


class Etcd(_HandleOwner):
    """A small etcd v3 client for tools, over the C ABI's ``pserver_etcd_*`` calls.

    Keys are full etcd keys, e.g. ``"/pserver/default/ps_desired"`` (the layout
    is in docs/operations.md); values are bytes (``put`` also takes a str,
    encoded as UTF-8). Every call is bounded by `timeout` seconds; one that
    finds etcd unreachable tries the next endpoint and retries within it, then
    raises Unavailable or DeadlineExceeded. Creating it does not wait for etcd.
    Thread-safe.

    >>> with pserver.Etcd("127.0.0.1:2379") as etcd:          # doctest: +SKIP
    ...     etcd.put("/pserver/demo/ps_desired", "2")
    ...     etcd.get("/pserver/demo/ps_desired")
    ...     etcd.list("/pserver/demo/")
    b'2'
    [('/pserver/demo/ps_desired', b'2')]
    """

    def __init__(self, endpoints: Union[str, Sequence[str]], *, timeout: float = 10.0,
                 tls: Any = None) -> None:
        """`tls`: etcd over TLS with a client certificate, a mapping (or an
        object) with "ca", "cert" and "key" PEM paths."""
        if not isinstance(endpoints, str):
            endpoints = ",".join(endpoints)
        if not timeout > 0:
            raise InvalidArgument(f"timeout must be positive, got {timeout!r}")
        self._endpoints = endpoints
        if tls is None:
            ptr = _c.pserver_etcd_new(endpoints, max(1, int(timeout * 1000)))
        else:
            ptr = _c.pserver_etcd_new_tls(endpoints, max(1, int(timeout * 1000)),
                                          *_etcd_tls_files(tls))
        self._h = _Handle(ptr, _c.pserver_etcd_delete, "etcd client")

    def get(self, key: str) -> bytes:
        """The value of `key`; raises NotFound (a KeyError) when it does not exist."""
        with self._h.use() as h:
            return _c.pserver_etcd_get(h, key)

    def list(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        """Every (key, value) whose key starts with `prefix`, sorted by key."""
        with self._h.use() as h:
            return _c.pserver_etcd_get_prefix(h, prefix)

    get_prefix = list

    def put(self, key: str, value: Union[bytes, bytearray, memoryview, str]) -> None:
        """Sets `key` to `value` (no lease)."""
        if isinstance(value, str):
            value = value.encode()
        with self._h.use() as h:
            _c.pserver_etcd_put(h, key, value)

    def delete(self, key: str) -> None:
        """Deletes `key`; a key that does not exist is not an error."""
        with self._h.use() as h:
            _c.pserver_etcd_delete_key(h, key)

    def close(self) -> None:
        """Waits for calls in flight and frees the client; safe to call twice."""
        self._h.close()

    def __repr__(self) -> str:
        return f"<pserver.Etcd {self._endpoints}{' closed' if self.closed else ''}>"


def _etcd_tls_files(tls: Any) -> Tuple[str, str, str]:
    """(ca, cert, key) of `tls`: a mapping or an object with those names."""
    if isinstance(tls, Mapping):
        unknown = set(tls) - {"ca", "cert", "key"}
        if unknown:
            raise InvalidArgument(f"etcd_tls: unknown keys {sorted(unknown)} "
                                  "(ca, cert, key)")
        values = [tls.get(k) for k in ("ca", "cert", "key")]
    else:
        values = [getattr(tls, k, None) for k in ("ca", "cert", "key")]
    return (str(values[0] or ""), str(values[1] or ""), str(values[2] or ""))
