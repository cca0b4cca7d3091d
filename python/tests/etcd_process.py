"""A real etcd on free 127.0.0.1 ports for the tests, stopped by its PID;
optionally TLS with client-certificate auth (etcd --client-cert-auth), as
cc/etcd/testing/etcd_process.h does for C++."""
import os
import shutil
import socket
import subprocess
import time

import pserver
from processes import free_port, stop as stop_process  # noqa: F401 (re-exported)

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def have_etcd() -> bool:
    return os.access(ETCD, os.X_OK)


class _PortTaken(Exception):
    """etcd exited because one of its ports was taken meanwhile."""


class EtcdProcess:
    """``with EtcdProcess(folder) as etcd:`` serves at ``etcd.endpoint``
    ("127.0.0.1:port") once entered (a write answered, at most 30 s).

    `tls`: a dict with ``ca`` (the CA client certificates must chain to),
    ``server_cert`` and ``server_key`` (etcd's own, naming 127.0.0.1), and
    ``client`` (the ca/cert/key mapping used to check that etcd serves).
    """
    __test__ = False

    def __init__(self, folder, name="pytest", tls=None):
        self._folder, self._name, self._tls = str(folder), name, tls
        self._proc = None
        self.endpoint = ""

    # A free port can be taken by another process between free_port() and
    # etcd's bind (tests run in parallel): etcd then exits "address already
    # in use", and it is started again on new ports, at most this many times.
    _BIND_TRIES = 5

    def __enter__(self):
        for attempt in range(self._BIND_TRIES):
            try:
                self._start()
                return self
            except _PortTaken:
                if attempt == self._BIND_TRIES - 1:
                    raise AssertionError(open(self._log).read())

    def _start(self):
        client, peer = free_port(), free_port()
        scheme = "https" if self._tls else "http"
        curl, purl = f"{scheme}://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        data_dir = os.path.join(self._folder, "etcd")
        shutil.rmtree(data_dir, ignore_errors=True)  # a failed try's
        args = [ETCD, f"--name={self._name}", f"--data-dir={data_dir}",
                f"--listen-client-urls={curl}", f"--advertise-client-urls={curl}",
                f"--listen-peer-urls={purl}", f"--initial-advertise-peer-urls={purl}",
                f"--initial-cluster={self._name}={purl}", "--log-level=error"]
        if self._tls:
            args += ["--client-cert-auth", f"--trusted-ca-file={self._tls['ca']}",
                     f"--cert-file={self._tls['server_cert']}",
                     f"--key-file={self._tls['server_key']}"]
        self._log = os.path.join(self._folder, "etcd.log")
        with open(self._log, "wb") as log:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        try:
            self.endpoint = f"127.0.0.1:{client}"
            self._wait_serving(client)
        except BaseException:
            self.stop()
            raise

    def _wait_serving(self, port):
        deadline = time.monotonic() + 30
        # Each try is a new client: a gRPC channel whose first connection was
        # refused backs off before trying again.
        while True:
            if self._proc.poll() is not None:
                log = open(self._log).read()
                if "address already in use" in log:
                    raise _PortTaken()
                raise AssertionError(log)
            if time.monotonic() > deadline:
                raise AssertionError("etcd did not serve in 30 s: " + open(self._log).read())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                tls = self._tls["client"] if self._tls else None
                with pserver.Etcd(self.endpoint, timeout=2, tls=tls) as etcd:
                    etcd.put("/ready", b"1")
                return
            except (OSError, pserver.Unavailable, pserver.DeadlineExceeded):
                time.sleep(0.05)

    def stop(self):
        if self._proc is not None:
            stop_process(self._proc)

    def __exit__(self, *exc):
        self.stop()
