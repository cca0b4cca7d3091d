"""Roles from Python (docs/security.md): bearer tokens, refusals by role and
job, and no token at all."""
import numpy as np
import pytest

import pserver

TRAINER = "trainer-token-py-0123456789"
READER = "reader-token-py-0123456789"


@pytest.fixture
def server(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"trainer job-a {TRAINER}\nreader job-a {READER}\n")
    with pserver.Server(job="job-a", auth_tokens_file=str(tokens)) as s:
        yield s


def test_roles(server):
    trainer = pserver.Client([server.address], token=TRAINER)
    trainer.init("w", np.zeros(2, np.float32), optimizer="sgd", lr=1.0)
    trainer.finish_init()
    trainer.send_grad("w", np.ones(2, np.float32))
    reader = pserver.Client([server.address], token=READER)
    np.testing.assert_array_equal(reader.get("w"), [-1, -1])
    with pytest.raises(pserver.PermissionDenied, match="role reader of job job-a may not SendGrads"):
        reader.send_grad("w", np.ones(2, np.float32))
    anonymous = pserver.Client([server.address])
    with pytest.raises(pserver.Unauthenticated, match="bearer token"):
        anonymous.get("w")
    for c in (trainer, reader, anonymous):
        c.close()


def test_bad_auth_options(tmp_path):
    with pytest.raises(pserver.InvalidArgument, match="--job"):
        pserver.Server(auth_cert_rule="cn:<role>.<job>")
    with pytest.raises(pserver.NotFound, match="no-such-file"):
        pserver.Server(job="a", auth_tokens_file=str(tmp_path / "no-such-file"))


def test_etcd_tls_mapping_is_checked():
    with pytest.raises(pserver.InvalidArgument, match="unknown keys"):
        pserver.Etcd("127.0.0.1:1", tls={"ca": "x", "crt": "y"})
