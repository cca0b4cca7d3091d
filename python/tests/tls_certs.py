"""Test certificates made at test time by the C++ tests' own generator
(cc/testing/test_certs.h), through its command-line tool
cc/testing:test_cert_tool ($PSERVER_TEST_CERT_TOOL): one generator for
every language. A CA and the certificates it signs."""
import os
import subprocess

TOOL = os.environ.get("PSERVER_TEST_CERT_TOOL", "")


def _tool(args):
    """The tool's stdout lines; raises with its stderr when it fails."""
    if not TOOL:
        raise RuntimeError("$PSERVER_TEST_CERT_TOOL is not set (bazel test //python:pytest sets "
                           "it to cc/testing:test_cert_tool)")
    done = subprocess.run([TOOL] + args, check=False, timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"test_cert_tool {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.splitlines()


class TestCa:
    """A self-signed CA in `folder`/`name`; issue() signs leaf certificates."""
    __test__ = False  # not a pytest class

    def __init__(self, folder, name):
        self.folder = str(folder)
        self.name = name
        self.dir = os.path.join(self.folder, name)
        (self.cert,) = _tool(["ca", self.folder, name])
        self.key = os.path.join(self.dir, "ca.key")

    def issue(self, stem, cn, ips=(), dns=(), expired=False):
        """(cert, key) paths of a new certificate for `cn` with those SANs."""
        args = ["issue", self.folder, self.name, stem, cn]
        args += [f"--ip={ip}" for ip in ips] + [f"--dns={d}" for d in dns]
        if expired:
            args.append("--expired")
        cert, key = _tool(args)
        return cert, key
