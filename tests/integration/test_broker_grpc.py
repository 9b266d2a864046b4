"""A real broker over gRPC: topics, sends, long-polling pulls, offsets, the
SlaveSync tables, registration with two name servers and drain."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from ferry.v1 import (
    broker_admin_pb2,
    broker_pb2,
    common_pb2,
    namesrv_pb2,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from tests.conftest import start_broker, start_namesrv
from tests.integration import support
from tests.integration.support import has_route, live_addrs
from tests.waiting import wait_for


def create_topic(broker, name: str, queues: int = 4, perm: int = 6) -> common_pb2.DataVersion:
    """`name` on an in-process broker (a RunningBroker)."""
    return support.create_topic(broker.channel, name, queues, perm)


@pytest.fixture
def two_ns(loop_thread, tmp_path):
    servers = [start_namesrv(loop_thread, tmp_path / f"ns{i}", metrics_port=-1) for i in range(2)]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture
def broker(loop_thread, tmp_path, two_ns):
    b = start_broker(
        loop_thread,
        tmp_path / "store",
        ";".join(s.remoting_addr for s in two_ns),
        brokerName="broker-a",
    )
    yield b
    b.stop()


def test_topic_send_pull_and_offsets_end_to_end(broker):
    version = create_topic(broker, "Orders")
    assert version.counter >= 1
    single = broker.broker.SendMessage(
        broker_pb2.SendMessageRequest(topic="Orders", queue_id=0, body=b"one", tags="t1", keys="k1")
    )
    assert single.status == broker_pb2.SEND_OK and single.queue_offset == 0
    assert len(single.msg_id) == 32
    batch = broker.broker.SendMessages(
        broker_pb2.SendMessagesRequest(
            topic="Orders",
            queue_id=0,
            messages=[
                broker_pb2.SendEntry(body=b"b%d" % i, properties={"p": str(i)}) for i in range(5)
            ],
        )
    )
    assert (batch.status, batch.queue_offset, batch.message_count) == (broker_pb2.SEND_OK, 1, 5)
    assert len(set(batch.msg_ids)) == 5

    def pull(offset):
        return broker.broker.PullMessage(
            broker_pb2.PullMessageRequest(
                consumer_group="g", topic="Orders", queue_id=0, queue_offset=offset, max_msg_nums=32
            )
        )

    result = wait_for(
        lambda: (r := pull(0)).status == broker_pb2.FOUND and len(r.messages) == 6 and r,
        what="6 messages",
    )
    first = result.messages[0]
    assert (first.body, first.tags, first.keys, first.msg_id) == (b"one", "t1", "k1", single.msg_id)
    assert [m.body for m in result.messages[1:]] == [b"b%d" % i for i in range(5)]
    assert result.messages[3].properties == {"p": "2"}
    assert result.next_begin_offset == 6 and result.max_offset == 6

    illegal = pull(9)
    assert illegal.status == broker_pb2.OFFSET_ILLEGAL
    assert (illegal.min_offset, illegal.max_offset, illegal.next_begin_offset) == (0, 6, 6)

    broker.broker.UpdateConsumerOffset(
        broker_pb2.UpdateConsumerOffsetRequest(
            consumer_group="g", topic="Orders", queue_id=0, offset=6
        )
    )
    got = broker.broker.QueryConsumerOffset(
        broker_pb2.QueryConsumerOffsetRequest(consumer_group="g", topic="Orders", queue_id=0)
    )
    assert got.offset == 6
    with pytest.raises(grpc.RpcError) as info:
        broker.broker.QueryConsumerOffset(
            broker_pb2.QueryConsumerOffsetRequest(
                consumer_group="other", topic="Orders", queue_id=0
            )
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert (
        broker.broker.GetMaxOffset(
            broker_pb2.GetMaxOffsetRequest(topic="Orders", queue_id=0)
        ).offset
        == 6
    )
    assert (
        broker.broker.GetMinOffset(
            broker_pb2.GetMinOffsetRequest(topic="Orders", queue_id=0)
        ).offset
        == 0
    )


def test_long_poll_returns_as_soon_as_a_message_arrives(broker):
    create_topic(broker, "Waiting", queues=1)
    results = []

    def poll():
        started = time.monotonic()
        r = broker.broker.PullMessage(
            broker_pb2.PullMessageRequest(
                consumer_group="g", topic="Waiting", queue_id=0, queue_offset=0, max_wait_ms=20_000
            ),
            timeout=30,
        )
        results.append((r, time.monotonic() - started))

    long_polls = broker.app.store.long_polls
    t = threading.Thread(target=poll)
    t.start()
    # The pull has found nothing and waits in the store (read on the loop that owns it).
    wait_for(
        lambda: broker.loop.call(lambda: long_polls.waiting_on("Waiting", 0)) == 1,
        10,
        "the pull to wait",
    )
    assert not results
    broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Waiting", body=b"ping"))
    t.join(15)
    response, waited = results[0]
    assert response.status == broker_pb2.FOUND and response.messages[0].body == b"ping"
    assert waited < 10  # answered by the message, not by the 20 s timeout


@pytest.mark.parametrize(
    ("request_", "code", "text"),
    [
        (
            broker_pb2.SendMessageRequest(topic="bad topic", body=b"x"),
            "INVALID_ARGUMENT",
            "characters outside",
        ),
        (broker_pb2.SendMessageRequest(topic="Unknown", body=b"x"), "NOT_FOUND", "does not exist"),
        (
            broker_pb2.SendMessageRequest(topic="E", body=b""),
            "INVALID_ARGUMENT",
            "must not be empty",
        ),
        (
            broker_pb2.SendMessageRequest(topic="E", queue_id=7, body=b"x"),
            "INVALID_ARGUMENT",
            "7 is out of range",
        ),
        (
            broker_pb2.SendMessageRequest(topic="E", body=b"x" * 70_000),
            "RESOURCE_EXHAUSTED",
            "maxMessageSize",
        ),
        (broker_pb2.SendMessageRequest(topic="T" * 128, body=b"x"), "INVALID_ARGUMENT", "127"),
    ],
)
def test_bad_sends_get_clear_errors_and_store_nothing(broker, request_, code, text):
    create_topic(broker, "E", queues=2)
    before = broker.app.store.max_offset
    with pytest.raises(grpc.RpcError) as info:
        broker.broker.SendMessage(request_)
    assert info.value.code().name == code
    assert text in info.value.details()
    assert broker.app.store.max_offset == before


def test_routes_appear_on_both_name_servers_and_drain_makes_them_read_only(broker, two_ns):
    create_topic(broker, "Routed")
    for ns in two_ns:
        assert has_route(ns.stub, "Routed")  # registered before the create returned
        assert broker.addr in live_addrs(ns.stub)
    broker.admin.UpdateBrokerPermission(
        broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=4)
    )
    for ns in two_ns:
        route = ns.stub.GetRouteInfoByTopic(namesrv_pb2.GetRouteInfoByTopicRequest(topic="Routed"))
        assert [q.perm for q in route.queue_datas] == [4]
    with pytest.raises(grpc.RpcError) as info:
        broker.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Routed", body=b"x"))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    broker.admin.UpdateBrokerPermission(
        broker_admin_pb2.UpdateBrokerPermissionRequest(broker_permission=6)
    )
    route = two_ns[0].stub.GetRouteInfoByTopic(
        namesrv_pb2.GetRouteInfoByTopicRequest(topic="Routed")
    )
    assert [q.perm for q in route.queue_datas] == [6]


def test_deleted_topic_leaves_the_routes(broker, two_ns):
    create_topic(broker, "Gone")
    broker.admin.DeleteTopic(broker_admin_pb2.DeleteTopicRequest(topic="Gone"))
    assert not has_route(two_ns[0].stub, "Gone")
    with pytest.raises(grpc.RpcError) as info:
        broker.admin.DeleteTopic(broker_admin_pb2.DeleteTopicRequest(topic="Gone"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_stop_unregisters_from_every_name_server(loop_thread, tmp_path, two_ns):
    b = start_broker(loop_thread, tmp_path / "s2", ";".join(s.remoting_addr for s in two_ns))
    assert all(b.addr in live_addrs(ns.stub) for ns in two_ns)
    b.stop()
    assert all(b.addr not in live_addrs(ns.stub) for ns in two_ns)


def test_unreachable_name_server_is_not_fatal(loop_thread, tmp_path, two_ns):
    from tests.integration.support import free_port

    dead = f"127.0.0.1:{free_port()}"
    b = start_broker(loop_thread, tmp_path / "s3", f"{dead};{two_ns[0].remoting_addr}")
    try:
        assert b.addr in live_addrs(two_ns[0].stub)
    finally:
        b.stop()


def test_slave_sync_tables_carry_their_versions(broker):
    create_topic(broker, "Synced")
    broker.admin.UpdateAndCreateSubscriptionGroup(
        broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest(
            config=common_pb2.SubscriptionGroupConfig(group_name="G1")
        )
    )
    broker.broker.UpdateConsumerOffset(
        broker_pb2.UpdateConsumerOffsetRequest(
            consumer_group="G1", topic="Synced", queue_id=1, offset=3
        )
    )
    stub = slave_sync_pb2_grpc.SlaveSyncStub(broker.channel)
    topics = stub.GetAllTopicConfig(slave_sync_pb2.GetAllTopicConfigRequest())
    assert "Synced" in topics.topic_config_table and topics.data_version.counter >= 1
    offsets = stub.GetAllConsumerOffset(slave_sync_pb2.GetAllConsumerOffsetRequest())
    assert offsets.offset_table["Synced@G1"].offsets[1] == 3
    groups = stub.GetAllSubscriptionGroupConfig(
        slave_sync_pb2.GetAllSubscriptionGroupConfigRequest()
    )
    assert groups.subscription_group_table["G1"].consume_enable is True
    delay = stub.GetAllDelayOffset(slave_sync_pb2.GetAllDelayOffsetRequest())
    assert delay.data_version.counter == 0
    info = broker.admin.GetBrokerRuntimeInfo(broker_admin_pb2.GetBrokerRuntimeInfoRequest())
    assert info.broker_role == "ASYNC_MASTER" and info.topic_count >= 2


def test_a_full_disk_refuses_sends_clearly_and_resumes_when_space_returns(
    loop_thread, tmp_path, monkeypatch
):
    """ENOSPC at the write layer (creating the next commit-log file): the send
    gets RESOURCE_EXHAUSTED saying the disk is full, nothing stored before
    changes, no half-made file stays, and sends succeed once there is room."""
    import errno
    import os

    from services.broker.store import commitlog

    b = start_broker(
        loop_thread, tmp_path / "store", mappedFileSizeCommitLog=64 * 1024, maxMessageSize=8192
    )
    try:
        create_topic(b, "Full", queues=1)
        stored = []
        while len(list((tmp_path / "store" / "commitlog").iterdir())) < 2 or not stored:
            r = b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Full", body=b"x" * 4000))
            assert r.status == broker_pb2.SEND_OK
            stored.append(r.queue_offset)
        commitlog_dir = tmp_path / "store" / "commitlog"

        def segment_files() -> list[str]:
            return sorted(p.name for p in commitlog_dir.iterdir())

        files = segment_files()
        end = b.app.store.max_offset

        def no_space(fd, offset, length):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(commitlog.os, "posix_fallocate", no_space)
        refused = 0
        for _ in range(40):  # enough to need the next file
            try:
                b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Full", body=b"y" * 4000))
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "the broker's disk is full" in exc.details()
                assert "free space under" in exc.details()
                refused += 1
        assert refused
        # At most the file allocated ahead before the disk "filled" joined the
        # log; every file is whole, and no hidden allocation is left over.
        names = segment_files()
        assert names[: len(files)] == files and len(names) <= len(files) + 1
        assert all((commitlog_dir / n).stat().st_size == 64 * 1024 for n in names)
        assert not list((tmp_path / "store").glob(".commitlog-*"))  # no allocation left over
        assert b.app.store.max_offset >= end
        monkeypatch.undo()
        r = b.broker.SendMessage(broker_pb2.SendMessageRequest(topic="Full", body=b"room again"))
        assert r.status == broker_pb2.SEND_OK
        first = b.broker.PullMessage(
            broker_pb2.PullMessageRequest(consumer_group="g", topic="Full", queue_id=0,
                                          queue_offset=0, max_msg_nums=1)
        )  # fmt: skip
        assert first.messages[0].body == b"x" * 4000
    finally:
        b.stop()
