"""Finding messages on real brokers through ferry.v1 (QueryMessageByKey,
QueryMessageByUniqueKey, ViewMessage) and `ferry message query` (by key, by unique key,
by offset message id, with the groups that consumed past a message)."""

from __future__ import annotations

import json

import grpc
import pytest

from ferry.v1 import broker_pb2
from tests.conftest import start_broker
from tests.integration.support import run_ferry
from tests.integration.test_broker_grpc import create_topic
from tests.integration.test_replication import pair
from tests.waiting import wait_for

UNIQ = "7F00000100002A9F0000000000000001"


def ok(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_grpc_lookups(two_brokers):
    ns, (a, _b) = two_brokers
    ok(run_ferry("topic", "create", "Orders", "-b", a.addr, "-n", ns.remoting_addr))
    sent = [
        a.broker.SendMessage(
            broker_pb2.SendMessageRequest(
                topic="Orders",
                body=b"order %d" % i,
                keys=f"order-{i} cust-1",
                properties={"UNIQ_KEY": f"{UNIQ[:-2]}{i:02X}"},
            ),
            timeout=5,
        )
        for i in range(3)
    ]
    found = wait_for(
        lambda: (
            len(
                (
                    r := a.broker.QueryMessageByKey(
                        broker_pb2.QueryMessageByKeyRequest(topic="Orders", key="cust-1"), timeout=5
                    )
                ).messages
            )
            == 3
            and r
        ),
        what="3 messages indexed under cust-1",
    )
    assert [m.body for m in found.messages] == [b"order 0", b"order 1", b"order 2"]
    assert [m.msg_id for m in found.messages] == [s.msg_id for s in sent]
    assert found.messages[1].properties["KEYS"] == "order-1 cust-1"
    assert found.index_last_update_commit_offset == sent[-1].commit_offset
    unique = a.broker.QueryMessageByUniqueKey(
        broker_pb2.QueryMessageByUniqueKeyRequest(topic="Orders", unique_key=f"{UNIQ[:-2]}01"),
        timeout=5,
    )
    assert [m.body for m in unique.messages] == [b"order 1"]
    view = a.broker.ViewMessage(
        broker_pb2.ViewMessageRequest(offset_msg_id=sent[2].msg_id), timeout=5
    )
    assert view.message.body == b"order 2" and view.message.properties["UNIQ_KEY"].endswith("02")
    by_offset = a.broker.ViewMessage(
        broker_pb2.ViewMessageRequest(commit_offset=sent[0].commit_offset), timeout=5
    )
    assert by_offset.message.queue_offset == sent[0].queue_offset
    with pytest.raises(grpc.RpcError) as missing:
        a.broker.ViewMessage(broker_pb2.ViewMessageRequest(commit_offset=1), timeout=5)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    ids = {"cluster": "DefaultCluster", "broker_name": "broker-a", "broker_id": "0"}
    registry = a.app.registry
    assert registry.get_sample_value("ferry_index_lookup_duration_seconds_count", ids) >= 2
    assert registry.get_sample_value("ferry_index_files", {**ids, "role": "ASYNC_MASTER"}) == 1
    size = registry.get_sample_value("ferry_index_size_bytes", {**ids, "role": "ASYNC_MASTER"})
    assert size == 40 + 4 * 5_000_000 + 20 * 20_000_000
    with pytest.raises(grpc.RpcError) as bad:
        a.broker.QueryMessageByKey(broker_pb2.QueryMessageByKeyRequest(topic="Orders"), timeout=5)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_ferry_message_query(two_brokers):
    ns, (a, b) = two_brokers
    n = ("-n", ns.remoting_addr)
    ok(run_ferry("topic", "create", "Shop", "-c", "DefaultCluster", *n))
    sent = [
        ok(run_ferry("send", "Shop", "--body", f"cart {i}", "--keys", f"cart-{i} user-9", *n))
        for i in range(4)
    ]
    ids = [line.split("msgId=")[1].split()[0] for line in sent]
    b.broker.SendMessage(
        broker_pb2.SendMessageRequest(
            topic="Shop", body=b"unique one", properties={"UNIQ_KEY": UNIQ}
        ),
        timeout=5,
    )

    def by_key():
        r = run_ferry("message", "query", "-k", "user-9", "-t", "Shop", "--json", *n)
        return r.returncode == 0 and len(docs := json.loads(r.stdout)) == 4 and docs

    docs = wait_for(by_key, timeout_s=20, what="4 messages under user-9")
    assert sorted(d["body"] for d in docs) == [f"cart {i}" for i in range(4)]
    assert {d["offsetMsgId"] for d in docs} == set(ids)
    text = ok(run_ferry("message", "query", "-k", "cart-2", "-t", "Shop", *n))
    assert "Body:                cart 2" in text and '"KEYS": "cart-2 user-9"' in text
    assert "Store Timestamp:" in text

    # By offset message id: the broker it names is asked; no group has read it yet.
    one = ok(run_ferry("message", "query", "-i", ids[1], *n))
    assert "cart 1" in one and "no consumer group has offsets" in one
    ok(run_ferry("consume", "Shop", "-g", "readers", "--pull", "--from-beginning",
                 "--max", "5", *n))  # fmt: skip
    tracked = json.loads(ok(run_ferry("message", "query", "-i", ids[1], "--json", *n)))
    assert tracked["body"] == "cart 1"
    assert [(c["group"], c["consumed"]) for c in tracked["consumedBy"]] == [("readers", True)]

    # By unique key (with its topic).
    unique = wait_for(
        lambda: (
            (r := run_ferry("message", "query", "-i", UNIQ, "-t", "Shop", *n)).returncode == 0
            and r.stdout
        ),
        timeout_s=20,
        what="the unique key indexed",
    )
    assert "unique one" in unique and f"Message ID:          {UNIQ}" in unique

    missing = run_ferry("message", "query", "-k", "nobody", "-t", "Shop", *n)
    assert missing.returncode == 1 and "no message" in missing.stderr
    bad = run_ferry("message", "query", "-i", "xyz", *n)
    assert bad.returncode == 2 and "neither a unique key nor an offset message id" in bad.stderr


@pytest.fixture
def master_and_slave(loop_thread, tmp_path, ns):
    master, slave = pair(loop_thread, tmp_path, ns)
    yield master, slave
    slave.stop()
    master.stop()


def test_a_slave_indexes_what_it_replicates(master_and_slave):
    master, slave = master_and_slave
    create_topic(master, "Rep", queues=2)
    sent = master.broker.SendMessages(
        broker_pb2.SendMessagesRequest(
            topic="Rep",
            messages=[broker_pb2.SendEntry(body=b"r%d" % i, keys=f"rk{i} rall") for i in range(50)],
        ),
        timeout=5,
    )
    end = master.app.store.max_offset
    wait_for(lambda: slave.app.store.max_offset == end, 30, "the slave to catch up")

    def on(broker, key):
        request = broker_pb2.QueryMessageByKeyRequest(topic="Rep", key=key)
        return broker.broker.QueryMessageByKey(request, timeout=5).messages

    found = wait_for(lambda: len(on(slave, "rall")) == 50 and on(slave, "rall"), 10, "slave index")
    assert [m.msg_id for m in found] == list(sent.msg_ids)
    assert [m.msg_id for m in on(slave, "rk7")] == [m.msg_id for m in on(master, "rk7")]
    assert slave.app.store.index_files[0] == 1


@pytest.fixture
def small_answers(loop_thread, tmp_path):
    """A broker whose gRPC answers stop at 128 KiB (test brokers take 64 KiB messages)."""
    broker = start_broker(loop_thread, tmp_path / "small", grpcMaxMessageSize=128 * 1024)
    yield broker
    broker.stop()


def test_a_lookup_leaves_out_the_oldest_rather_than_pass_the_grpc_limit(small_answers):
    broker = small_answers
    create_topic(broker, "Big", queues=1)
    bodies = [bytes([65 + i]) * 50_000 for i in range(6)]
    sent = [
        broker.broker.SendMessage(
            broker_pb2.SendMessageRequest(topic="Big", body=b, keys="bulk"), timeout=5
        ).msg_id
        for b in bodies
    ]
    request = broker_pb2.QueryMessageByKeyRequest(topic="Big", key="bulk")
    found = wait_for(
        lambda: (
            (r := broker.broker.QueryMessageByKey(request, timeout=5)).left_out + len(r.messages)
            == 6
            and r
        ),
        what="6 messages indexed under 'bulk'",
    )
    # Two 50 KB messages fit in 128 KiB, three do not: the newest two come back.
    assert [m.msg_id for m in found.messages] == sent[-2:]
    assert [m.body for m in found.messages] == bodies[-2:]
    assert found.left_out == 4
    assert found.ByteSize() <= 128 * 1024
