"""Server processes for tests: free ports on 127.0.0.1, pserver processes
started and stopped by PID (never by name)."""
import os
import re
import signal
import socket
import subprocess
import time
from typing import List, Sequence

PSERVER = os.environ.get("PSERVER_BINARY", "")


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


def start_pservers(n: int, folder, procs: List[subprocess.Popen],
                   timeout: float = 60, extra=lambda i: ()) -> List[str]:
    """Starts `n` pserver processes (indices 0 .. n-1, free ports picked by
    the servers, with the flags `extra(i)`) appending each to `procs` (the
    caller stops them, also when this raises), and returns their addresses
    in index order once every one says it is listening (at most `timeout`
    seconds)."""
    logs = [os.path.join(str(folder), f"pserver{i}.log") for i in range(n)]
    for i, path in enumerate(logs):
        with open(path, "wb") as log:
            procs.append(subprocess.Popen(
                [PSERVER, "--host=127.0.0.1", "--port=0", f"--index={i}",
                 "--shutdown_grace_seconds=1", *extra(i)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    addresses: List[str] = []
    while len(addresses) < n:
        addresses = []
        for path in logs:
            with open(path) as f:
                words = f.read().split()
            if "listening" in words and words.index("listening") + 2 < len(words):
                addresses.append(words[words.index("listening") + 2])
        exited = [p.pid for p in procs[-n:] if p.poll() is not None]
        assert not exited, f"pserver exited while starting: {exited}"
        assert time.monotonic() < deadline, "pservers did not start in time"
        if len(addresses) < n:
            time.sleep(0.05)
    return addresses


def start_registered_pservers(n: int, folder, procs: List[subprocess.Popen], endpoint: str,
                              cluster: str, extra: Sequence[str] = (),
                              timeout: float = 30) -> List[str]:
    """Starts `n` pserver processes that register in etcd `endpoint` under
    `cluster` (--num_servers=n), appending each to `procs` (the caller stops
    them), and waits (at most `timeout` seconds) until each printed its
    "listening on" line; returns the paths of their logs."""
    logs = [os.path.join(str(folder), f"server{i}.log") for i in range(n)]
    for path in logs:
        # The servers wait for etcd themselves (--register_timeout).
        with open(path, "wb") as log:
            procs.append(subprocess.Popen(
                [PSERVER, "--host=127.0.0.1", "--port=0", f"--etcd={endpoint}",
                 f"--cluster={cluster}", f"--num_servers={n}", "--lease_ttl=2",
                 "--register_timeout=30", "--shutdown_grace_seconds=1", *extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    while not all("listening on" in open(p).read() for p in logs):
        exited = [p.args[0] for p in procs[-n:] if p.poll() is not None]
        assert not exited, f"exited while starting: {exited}"
        assert time.monotonic() < deadline, [open(p).read() for p in logs]
        time.sleep(0.05)
    return logs


def metrics_address(log_path) -> str:
    """host:port from a server's "metrics on http://<host:port>/metrics" line."""
    with open(log_path) as f:
        text = f.read()
    found = re.search(r"metrics on http://(\S+)/metrics", text)
    assert found, text
    return found.group(1)
