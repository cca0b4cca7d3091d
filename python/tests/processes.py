"""etcd and pserver processes for tests, on 127.0.0.1 free ports.

Every process is started with its own log file and stopped by its PID
(`stop`), never by name.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import List

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
PSERVER = os.environ.get("PSERVER_BINARY", "")


def have_etcd_and_pserver() -> bool:
    return os.access(ETCD, os.X_OK) and os.access(PSERVER, os.X_OK)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, up to 10 s, then SIGKILL: by PID, never by name."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def spawn(args: List[str], log: Path, procs: List[subprocess.Popen]) -> subprocess.Popen:
    """Starts `args` with stdout and stderr in `log`; appends it to `procs`."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    procs.append(proc)
    return proc


def start_etcd(tmp_path: Path, procs: List[subprocess.Popen]) -> str:
    """Starts one etcd member; returns its client endpoint host:port."""
    client, peer = free_port(), free_port()
    curl, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    spawn([ETCD, "--name=pytest", f"--data-dir={tmp_path / 'etcd'}",
           f"--listen-client-urls={curl}", f"--advertise-client-urls={curl}",
           f"--listen-peer-urls={purl}", f"--initial-advertise-peer-urls={purl}",
           f"--initial-cluster=pytest={purl}", "--log-level=error"],
          tmp_path / "etcd.log", procs)
    return f"127.0.0.1:{client}"


def start_pservers(tmp_path: Path, procs: List[subprocess.Popen], endpoint: str,
                   cluster: str, count: int, extra: List[str] = ()) -> List[Path]:
    """Starts `count` servers registering in etcd `endpoint` and waits (at most
    30 s) until each printed its "listening on" line; returns their logs."""
    logs = [tmp_path / f"server{i}.log" for i in range(count)]
    for log in logs:
        # The servers wait for etcd themselves (--register_timeout).
        spawn([PSERVER, "--host=127.0.0.1", "--port=0", f"--etcd={endpoint}",
               f"--cluster={cluster}", f"--num_servers={count}", "--lease_ttl=2",
               "--register_timeout=30", "--shutdown_grace_seconds=1", *extra], log, procs)
    # Waiting here means the clients meet a serving etcd (a client whose first
    # connection lands while etcd is still starting up can stall for its whole
    # deadline).
    deadline = time.monotonic() + 30
    while not all("listening on" in p.read_text() for p in logs):
        exited = [p.args[0] for p in procs if p.poll() is not None]
        assert not exited, f"exited while starting: {exited}"
        assert time.monotonic() < deadline, [p.read_text() for p in logs]
        time.sleep(0.05)
    return logs


def metrics_address(log: Path) -> str:
    """host:port from a server's "metrics on http://<host:port>/metrics" line."""
    found = re.search(r"metrics on http://(\S+)/metrics", log.read_text())
    assert found, log.read_text()
    return found.group(1)
