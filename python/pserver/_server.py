"""Parameter servers in this process: one gRPC Server, or a LocalCluster
whose in-process clients skip sockets and serialization."""

from __future__ import annotations

import weakref
from typing import Any, List, Mapping, Optional, Union

from . import capi as _c
from ._client import Client
from ._config import _client_options, _server_options
from ._errors import InvalidArgument
from ._etcd import _etcd_tls_files
from ._handles import _Closing, _Handle
from ._tls import Tls, _set_server_tls


class Server(_Closing):
    """A gRPC parameter server running in this process (127.0.0.1, a free port).

    >>> import pserver
    >>> with pserver.Server() as server:
    ...     client = server.client()      # a gRPC client of this server
    ...     print(server.address.startswith("127.0.0.1:"))
    True

    With ``tls=pserver.Tls(cert=, key=, ca=)`` it speaks mutual TLS only:
    clients must present a certificate from `ca`.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, index: int = 0,
                 num_threads: int = 0, checkpoint_dir: Optional[str] = None,
                 advertise_host: Optional[str] = None,
                 tls: Union[None, Tls, Mapping[str, Any]] = None,
                 job: Optional[str] = None, auth_tokens_file: Optional[str] = None,
                 auth_cert_rule: Optional[str] = None, etcd: Optional[str] = None,
                 cluster: str = "default", num_servers: int = 0,
                 etcd_tls: Any = None) -> None:
        """`advertise_host`: the address others reach it at (needed with host
        "0.0.0.0" or "::"); `address` is then advertise_host:port. `tls`: a
        pserver.Tls (or a dict of its fields) for mutual TLS. Roles
        (docs/security.md): `job` with `auth_tokens_file` (lines "role job
        token") and/or `auth_cert_rule` ("cn:<role>.<job>").
        `etcd` ("host:port[,...]"): register in etcd as pserver --etcd does,
        under /pserver/<cluster>, claiming an index below `num_servers`
        (written to /ps_desired if absent; 0: what etcd holds); `etcd_tls`
        as for Client (etcd over TLS with this server's certificate)."""
        with _server_options(host, port, index, num_threads, checkpoint_dir,
                             advertise_host) as opts:
            _set_server_tls(opts, tls)
            if etcd_tls is not None:
                _c.pserver_server_options_set_etcd_tls(opts, *_etcd_tls_files(etcd_tls))
            if etcd is not None:
                if isinstance(num_servers, bool) or not isinstance(num_servers, int) \
                        or not 0 <= num_servers < 2**32:
                    raise InvalidArgument(
                        f"num_servers must be an int in [0, 2**32), got {num_servers!r}")
                _c.pserver_server_options_set_etcd(opts, str(etcd), str(cluster),
                                                   int(num_servers))
            if job or auth_tokens_file or auth_cert_rule:
                _c.pserver_server_options_set_auth(opts, job or "", auth_tokens_file or "",
                                                   auth_cert_rule or "")
            ptr = _c.pserver_server_new(opts)
        self._address = _c.pserver_server_address(ptr)
        self._port = _c.pserver_server_port(ptr)
        self._h = _Handle(ptr, _c.pserver_server_delete, "server")
        self._clients: "weakref.WeakSet[Client]" = weakref.WeakSet()

    @property
    def address(self) -> str:
        """"127.0.0.1:<port>"."""
        return self._address

    @property
    def port(self) -> int:
        return self._port

    def client(self, **options: Any) -> Client:
        """A gRPC client of this server (closed when the server is)."""
        c = Client([self._address], **options)
        self._clients.add(c)
        return c

    def save_checkpoint(self) -> None:
        """Writes a checkpoint of this server's shard (needs checkpoint_dir)."""
        with self._h.use() as h:
            _c.pserver_server_save_checkpoint(h)

    def stop(self, grace: float = 0.0) -> None:
        """Stops serving (calls in flight get up to `grace` seconds); idempotent."""
        if not self._h.closed:
            with self._h.use() as h:
                _c.pserver_server_stop(h, int(grace * 1000))

    def close(self) -> None:
        """Closes this server's clients, stops it and frees it; safe twice."""
        for c in list(self._clients):
            c.close()
        self._h.close()


    def __repr__(self) -> str:
        state = "stopped" if self._h.closed else "running"
        return f"<pserver.Server {self._address} {state}>"


class LocalCluster(_Closing):
    """`servers` parameter servers in this process, each on 127.0.0.1.

    ``client()`` calls them in process (no sockets, no serialization);
    ``addresses`` lets gRPC clients, also in other processes, reach them.
    With `checkpoint_dir`, server i keeps its shard's checkpoints in
    ``<checkpoint_dir>/shard-<i>`` (loaded on start, written by
    ``save_checkpoint()`` and on stop); ``pserver.read_checkpoint(checkpoint_dir)``
    reads them back.
    Leaving the ``with`` block closes the clients made by ``client()`` and
    stops the servers.

    >>> import numpy as np, pserver
    >>> with pserver.LocalCluster(servers=2) as c:
    ...     cl = c.client()
    ...     cl.init("b", np.array([1, 2], np.int64), optimizer="add")
    ...     cl.finish_init()
    ...     print(cl.push_pull({"b": np.array([10, 10], np.int64)})["b"])
    [11 12]
    """

    def __init__(self, servers: int = 2, *, checkpoint_dir: Optional[str] = None,
                 num_threads: int = 0) -> None:
        with _server_options("127.0.0.1", 0, 0, num_threads, checkpoint_dir) as opts:
            ptr = _c.pserver_local_cluster_new_with_options(int(servers), opts)
        self._addresses = [_c.pserver_local_cluster_address(ptr, i)
                           for i in range(_c.pserver_local_cluster_size(ptr))]
        self._h = _Handle(ptr, _c.pserver_local_cluster_delete, "local cluster")
        self._clients: "weakref.WeakSet[Client]" = weakref.WeakSet()

    @property
    def addresses(self) -> List[str]:
        return list(self._addresses)

    @property
    def size(self) -> int:
        return len(self._addresses)

    def __len__(self) -> int:
        return len(self._addresses)

    def client(self, *, in_process: bool = True, timeout: float = 30.0,
               block_bytes: Optional[int] = None, max_request_bytes: Optional[int] = None,
               channels_per_server: Optional[int] = None) -> Client:
        """A client of this cluster: in process by default, else over gRPC."""
        if not in_process:
            c = Client(self._addresses, timeout=timeout, block_bytes=block_bytes,
                       max_request_bytes=max_request_bytes,
                       channels_per_server=channels_per_server)
        else:
            with _client_options(timeout, block_bytes, max_request_bytes,
                                 channels_per_server) as opts, self._h.use() as h:
                ptr = _c.pserver_local_cluster_client(h, opts)
            c = Client._from_handle(ptr, self.addresses, "in-process")
        self._clients.add(c)
        return c

    def save_checkpoint(self) -> None:
        """Writes a checkpoint of every shard now (needs checkpoint_dir)."""
        with self._h.use() as h:
            _c.pserver_local_cluster_save_checkpoint(h)

    def stop(self) -> None:
        """Closes the clients made by client() and stops every server; idempotent."""
        for c in list(self._clients):
            c.close()
        self._h.close()

    close = stop


    def __repr__(self) -> str:
        state = "stopped" if self._h.closed else "running"
        return f"<pserver.LocalCluster {len(self._addresses)} servers {state}: " \
               f"{' '.join(self._addresses)}>"
