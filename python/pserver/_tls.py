"""Tls: the certificate files of mutual TLS, for Client(tls=...) and Server(tls=...)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from . import capi as _c
from ._errors import InvalidArgument


@dataclass(frozen=True)
class Tls:
    """This side's PEM certificate and key, and the PEM CA(s) the peer's
    certificate must chain to (docs/security.md).

    A client also checks that each server's certificate names the host it
    dials, or `server_name` when given. A server requires every client to
    present a certificate from `ca`, and re-reads its files every
    `reload_seconds` (rotation without restart).

    `bulk_aead` (default True): after the TLS handshake the bulk channel
    seals its bytes with an AES-128-GCM layer keyed from the TLS session
    (docs/security.md) when both ends want it and the CPU has AES-NI; False
    keeps TLS records (on a server: for every client). The data is the same
    either way; ``Client.stats()`` counts a server's ``bulk_aead_connections``.

    >>> import pserver
    >>> tls = pserver.Tls(cert="trainer.pem", key="trainer.key", ca="ca.pem")
    >>> tls.server_name is None, tls.bulk_aead
    (True, True)
    """

    cert: Union[str, os.PathLike]
    key: Union[str, os.PathLike]
    ca: Union[str, os.PathLike]
    server_name: Optional[str] = None
    reload_seconds: Optional[int] = None  # servers only; default 60
    bulk_aead: bool = True  # the bulk channel's AEAD layer after TLS

    def __post_init__(self) -> None:
        if not isinstance(self.bulk_aead, bool):
            raise InvalidArgument(f"tls: bulk_aead must be True or False, got {self.bulk_aead!r}")

    def __repr__(self) -> str:
        return f"pserver.Tls(cert={str(self.cert)!r}, ca={str(self.ca)!r})"


def _as_tls(tls: Union[None, Tls, Mapping[str, Any]]) -> Optional[Tls]:
    """`tls` as a Tls: None, a Tls, or a dict of its fields."""
    if tls is None or isinstance(tls, Tls):
        return tls
    if isinstance(tls, Mapping):
        unknown = set(tls) - {"cert", "key", "ca", "server_name", "reload_seconds", "bulk_aead"}
        if unknown:
            raise InvalidArgument(f"tls: unknown key(s) {sorted(unknown)}; "
                                  "want cert, key, ca, server_name, reload_seconds, bulk_aead")
        missing = {"cert", "key", "ca"} - set(tls)
        if missing:
            raise InvalidArgument(f"tls needs cert, key and ca; missing {sorted(missing)}")
        return Tls(**tls)
    raise InvalidArgument(f"tls must be pserver.Tls or a dict, got {type(tls).__name__}")


def _set_client_tls(opts: Any, tls: Union[None, Tls, Mapping[str, Any]]) -> None:
    tls = _as_tls(tls)
    if tls is None:
        return
    _c.pserver_client_options_set_tls(opts, os.fspath(tls.cert), os.fspath(tls.key),
                                      os.fspath(tls.ca))
    if tls.server_name:
        _c.pserver_client_options_set_tls_server_name(opts, str(tls.server_name))
    _c.pserver_client_options_set_tls_bulk_aead(opts, 1 if tls.bulk_aead else 0)


def _set_server_tls(opts: Any, tls: Union[None, Tls, Mapping[str, Any]]) -> None:
    tls = _as_tls(tls)
    if tls is None:
        return
    _c.pserver_server_options_set_tls(opts, os.fspath(tls.cert), os.fspath(tls.key),
                                      os.fspath(tls.ca), int(tls.reload_seconds or 0))
    _c.pserver_server_options_set_tls_bulk_aead(opts, 1 if tls.bulk_aead else 0)
