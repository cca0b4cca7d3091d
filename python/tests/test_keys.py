"""pserver.EtcdKeys: the etcd key layout through the C ABI; needs no etcd."""
import doctest

import pytest

import pserver
import pserver._keys


def test_docstring_examples():
    result = doctest.testmod(pserver._keys, extraglobs={"pserver": pserver})
    assert result.failed == 0 and result.attempted > 0


def test_layout():
    keys = pserver.EtcdKeys("job")
    assert repr(keys) == "pserver.EtcdKeys('job')"
    assert keys.prefix == "/pserver/job/"
    assert keys.desired == "/pserver/job/ps_desired"
    assert keys.servers == "/pserver/job/ps/"
    assert keys.server(3) == "/pserver/job/ps/3"
    assert keys.checkpoints == "/pserver/job/checkpoints/"
    assert keys.checkpoint(0) == "/pserver/job/checkpoints/0"
    assert keys.shards == "/pserver/job/shards/"
    assert keys.shard(2) == "/pserver/job/shards/2"
    assert keys.workers == "/pserver/job/workers/"
    assert keys.worker("trainer-7") == "/pserver/job/workers/trainer-7"
    assert pserver.EtcdKeys().desired == "/pserver/default/ps_desired"


def test_parse_gives_back_what_the_layout_wrote():
    keys = pserver.EtcdKeys("job")
    assert keys.parse(keys.desired) == pserver.EtcdKey("desired")
    assert keys.parse(keys.server(12)) == pserver.EtcdKey("server", index=12)
    assert keys.parse(keys.checkpoint(4294967295)) == pserver.EtcdKey("checkpoint",
                                                                     index=4294967295)
    assert keys.parse(keys.shard(5)) == pserver.EtcdKey("shard", index=5)
    assert keys.parse(keys.worker("w/1")) == pserver.EtcdKey("worker", worker_id="w/1")


@pytest.mark.parametrize("call, part", [
    (lambda k: k.server(-1), "'-1'"),
    (lambda k: k.server(2**32), "'4294967296'"),
    (lambda k: k.server(True), "must be an int"),
    (lambda k: k.checkpoint("1"), "must be an int"),
    (lambda k: k.worker(""), "worker id"),
    (lambda k: k.parse("/pserver/other/ps/1"), "not under cluster prefix /pserver/job/"),
    (lambda k: k.parse("/pserver/job/ps/01"), "'01'"),
    (lambda k: k.parse("/pserver/job/nothing"), "not a pserver key"),
])
def test_bad_input_raises_invalid_argument_naming_it(call, part):
    with pytest.raises(pserver.InvalidArgument, match=part):
        call(pserver.EtcdKeys("job"))
