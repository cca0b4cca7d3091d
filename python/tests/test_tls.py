"""Mutual TLS from Python: pserver.Server(tls=...) and pserver.Client(tls=...)."""
import numpy as np
import pytest

import pserver
from tls_certs import TestCa


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    ca, other = TestCa(folder, "ca"), TestCa(folder, "other-ca")
    server = ca.issue("server", "pserver-0", ips=["127.0.0.1"], dns=["pserver-0.test"])
    trainer = ca.issue("trainer", "trainer-0")
    intruder = other.issue("intruder", "intruder")
    return {"ca": ca.cert, "other_ca": other.cert, "server": server, "trainer": trainer,
            "intruder": intruder, "expired": ca.issue("expired", "old", expired=True)}


def tls_of(pki, which, ca="ca", **extra):
    cert, key = pki[which]
    return pserver.Tls(cert=cert, key=key, ca=pki[ca], **extra)


@pytest.fixture
def server(pki):
    with pserver.Server(tls=tls_of(pki, "server", reload_seconds=1)) as s:
        yield s


def test_push_and_pull_over_mutual_tls(pki, server):
    with pserver.Client([server.address], tls=tls_of(pki, "trainer")) as client:
        client.init("w", np.ones(4, np.float32), optimizer="sgd", lr=0.5)
        client.finish_init()
        client.send_grad("w", np.ones(4, np.float32))
        np.testing.assert_array_equal(client.get("w"), np.full(4, 0.5, np.float32))


def test_tls_may_be_a_dict_with_a_server_name(pki, server):
    cert, key = pki["trainer"]
    tls = {"cert": cert, "key": key, "ca": pki["ca"], "server_name": "pserver-0.test"}
    with pserver.Client([server.address], tls=tls) as client:
        assert len(client.stats()) == 1


def test_plaintext_client_is_told_the_server_may_require_tls(server):
    with pserver.Client([server.address], timeout=2) as client:
        with pytest.raises(pserver.DeadlineExceeded, match="requires TLS"):
            client.stats()


def test_client_certificate_from_another_ca_is_refused(pki, server):
    with pserver.Client([server.address], timeout=2,
                        tls=tls_of(pki, "intruder")) as client:
        with pytest.raises(pserver.DeadlineExceeded,
                           match="the server refused this client's certificate"):
            client.stats()


def test_expired_client_certificate_is_refused_naming_the_file(pki, server):
    with pytest.raises(pserver.InvalidArgument, match="expired on"):
        pserver.Client([server.address], tls=tls_of(pki, "expired"))


def test_bad_tls_arguments_say_what_is_wrong(pki):
    with pytest.raises(pserver.InvalidArgument, match="missing"):
        pserver.Client(["127.0.0.1:1"], tls={"cert": "a.pem"})
    with pytest.raises(pserver.NotFound, match="no-such.key"):
        pserver.Server(tls=pserver.Tls(cert=pki["server"][0], key="/no-such.key",
                                       ca=pki["ca"]))
    with pytest.raises(pserver.InvalidArgument, match="pserver.Tls or a dict"):
        pserver.Client(["127.0.0.1:1"], tls="ca.pem")


def _cpu_has_aes_ni():
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " aes " in f" {line.split(':', 1)[1]} "
                   for line in f)


@pytest.mark.parametrize("server_on", [True, False], ids=["server_on", "server_off"])
@pytest.mark.parametrize("client_on", [True, False], ids=["client_on", "client_off"])
def test_bulk_aead_option_reaches_the_server(pki, server_on, client_on):
    # Tls(bulk_aead=...) on each end: data exact in every cell; the server
    # counts a connection on the AEAD layer only when both ends want it.
    both = server_on and client_on
    if both and not _cpu_has_aes_ni():
        pytest.skip("this CPU has no AES-NI: the AEAD layer is never used")
    with pserver.Server(tls=tls_of(pki, "server", bulk_aead=server_on)) as s:
        with pserver.Client([s.address], timeout=60,
                            tls=tls_of(pki, "trainer", bulk_aead=client_on)) as client:
            values = (np.arange(1 << 18) % 1000).astype(np.float32)  # 1 MiB
            client.init("big", values, optimizer="sgd", lr=1.0)
            client.finish_init()
            np.testing.assert_array_equal(client.get("big"), values)
            client.send_grad("big", np.ones_like(values))
            np.testing.assert_array_equal(client.get("big"), values - 1)
            aead = client.stats()[0]["bulk_aead_connections"]
    if both:
        assert aead >= 1
    else:
        assert aead == 0


def test_bulk_aead_is_on_by_default_and_checked(pki):
    assert tls_of(pki, "trainer").bulk_aead is True
    cert, key = pki["trainer"]
    with pserver.Client(["127.0.0.1:1"], tls={"cert": cert, "key": key, "ca": pki["ca"],
                                              "bulk_aead": False}) as client:
        assert client.num_servers == 1  # the dict key is accepted
    with pytest.raises(pserver.InvalidArgument, match="bulk_aead must be True or False"):
        pserver.Client(["127.0.0.1:1"], tls={"cert": cert, "key": key, "ca": pki["ca"],
                                             "bulk_aead": "no"})
