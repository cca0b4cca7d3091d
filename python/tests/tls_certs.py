"""Test certificates made with the openssl CLI at test time (as
cc/testing/test_certs.h does for C++): a CA and certificates it signs."""
import datetime
import os
import subprocess

_CA_CONFIG = """[ca]
default_ca = ca_default
[ca_default]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = policy_any
unique_subject = no
[policy_any]
commonName = supplied
"""
_EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(args, cwd=None):
    subprocess.run(["openssl"] + args, cwd=cwd, check=True, timeout=60,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _date(t):
    return t.strftime("%Y%m%d%H%M%SZ")


class TestCa:
    """A self-signed CA in `folder`/`name`; issue() signs leaf certificates."""
    __test__ = False  # not a pytest class

    def __init__(self, folder, name):
        self.dir = os.path.join(str(folder), name)
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "ca.cnf"), "w") as f:
            f.write(_CA_CONFIG)
        open(os.path.join(self.dir, "index.txt"), "w").close()
        with open(os.path.join(self.dir, "serial"), "w") as f:
            f.write("01\n")
        self.cert = os.path.join(self.dir, "ca.pem")
        self.key = os.path.join(self.dir, "ca.key")
        _openssl(["req", "-x509"] + _EC_KEY + [
            "-keyout", self.key, "-out", self.cert, "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign"])

    def issue(self, stem, cn, ips=(), dns=(), expired=False):
        """(cert, key) paths of a new certificate for `cn` with those SANs."""
        cert = os.path.join(self.dir, stem + ".pem")
        key = os.path.join(self.dir, stem + ".key")
        csr = os.path.join(self.dir, stem + ".csr")
        ext = os.path.join(self.dir, stem + ".ext")
        _openssl(["req", "-new"] + _EC_KEY + ["-keyout", key, "-out", csr, "-subj", f"/CN={cn}"])
        sans = [f"IP:{ip}" for ip in ips] + [f"DNS:{d}" for d in dns]
        with open(ext, "w") as f:
            f.write("basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n")
            if sans:
                f.write("subjectAltName=" + ",".join(sans) + "\n")
        now = datetime.datetime.now(datetime.timezone.utc)
        start = now - datetime.timedelta(days=2 if expired else 0, hours=1)
        end = start + datetime.timedelta(days=1 if expired else 2)
        _openssl(["ca", "-batch", "-config", "ca.cnf", "-cert", self.cert, "-keyfile", self.key,
                  "-in", csr, "-out", cert, "-notext", "-startdate", _date(start),
                  "-enddate", _date(end), "-extfile", ext], cwd=self.dir)
        return cert, key
