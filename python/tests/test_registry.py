"""Servers started from Python register in etcd, also etcd over TLS with a
client certificate (Server(etcd=, etcd_tls=)); clients with
require_instance_id=True refuse a /ps/<idx> entry that names no server
instance (docs/security.md, registry fencing)."""
import numpy as np
import pytest

import pserver
from etcd_process import EtcdProcess, have_etcd
from tls_certs import TestCa

pytestmark = pytest.mark.skipif(not have_etcd(), reason="needs etcd")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("etcd_pki")
    ca = TestCa(folder, "etcd-ca")
    etcd_cert, etcd_key = ca.issue("etcd", "etcd", ips=["127.0.0.1"])
    member_cert, member_key = ca.issue("member", "pserver-member")
    other_cert, other_key = TestCa(folder, "other-ca").issue("intruder", "intruder")
    return {"ca": ca.cert, "etcd": (etcd_cert, etcd_key),
            "member": {"ca": ca.cert, "cert": member_cert, "key": member_key},
            "intruder": {"ca": ca.cert, "cert": other_cert, "key": other_key}}


@pytest.fixture(scope="module")
def etcd(tmp_path_factory, pki):
    """The endpoint of an etcd that accepts only certificates from pki's CA."""
    tls = {"ca": pki["ca"], "server_cert": pki["etcd"][0], "server_key": pki["etcd"][1],
           "client": pki["member"]}
    with EtcdProcess(tmp_path_factory.mktemp("etcd_tls"), tls=tls) as process:
        yield process.endpoint


def _train(client):
    client.init("w", np.zeros(4, np.float32), optimizer="sgd", lr=1.0)
    client.finish_init()
    client.send_grad("w", np.ones(4, np.float32))
    np.testing.assert_array_equal(client.get("w"), np.full(4, -1, np.float32))


def test_server_registers_over_tls_etcd(pki, etcd):
    member = pki["member"]
    keys = pserver.EtcdKeys("tls")
    with pserver.Server(etcd=etcd, etcd_tls=member, cluster="tls", num_servers=1) as server:
        with pserver.Etcd(etcd, tls=member) as registry:
            assert registry.get(keys.desired) == b"1"
            value = registry.get(keys.server(0)).decode()
        assert value.startswith(server.address + " instance="), value
        with pserver.Client(etcd=etcd, etcd_tls=member, cluster="tls", require_instance_id=True,
                            timeout=10, discovery_timeout=30) as client:
            assert client.servers == [server.address]
            _train(client)
    # Stopping gives the index up.
    with pserver.Etcd(etcd, tls=member) as registry:
        with pytest.raises(pserver.NotFound):
            registry.get(keys.server(0))


def test_server_etcd_tls_errors_are_clear(pki, etcd, tmp_path):
    missing = dict(pki["member"], key=str(tmp_path / "no-such-key.pem"))
    with pytest.raises(pserver.NotFound, match="no-such-key.pem"):
        pserver.Server(etcd=etcd, etcd_tls=missing, cluster="bad", num_servers=1)
    with pytest.raises(pserver.InvalidArgument, match="unknown keys"):
        pserver.Server(etcd=etcd, etcd_tls={"ca": pki["ca"], "crt": "x"}, cluster="bad")
    with pytest.raises(pserver.InvalidArgument, match="etcd endpoints are empty"):
        pserver.Server(etcd=" , ", cluster="bad")
    with pytest.raises(pserver.InvalidArgument, match="num_servers"):
        pserver.Server(etcd=etcd, etcd_tls=pki["member"], num_servers=-1)


def test_require_instance_id_refuses_a_bare_entry(pki, etcd):
    member = pki["member"]
    keys = pserver.EtcdKeys("bare")
    with pserver.Server() as server, pserver.Etcd(etcd, tls=member) as registry:
        # What `etcdctl put /pserver/bare/ps/0 <host:port>` writes.
        registry.put(keys.desired, "1")
        registry.put(keys.server(0), server.address)
        with pytest.raises(pserver.FailedPrecondition,
                           match=f"{keys.server(0)} is '{server.address}', which names no "
                                 "server instance.*a rogue or hand-written registry entry"):
            pserver.Client(etcd=etcd, etcd_tls=member, cluster="bare", require_instance_id=True,
                           timeout=10, discovery_timeout=30)
        # Without the option the bare address is used as before.
        with pserver.Client(etcd=etcd, etcd_tls=member, cluster="bare", timeout=10,
                            discovery_timeout=30) as client:
            assert client.servers == [server.address]
            _train(client)
