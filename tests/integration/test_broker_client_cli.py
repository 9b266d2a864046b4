"""The client library and the `ferry` commands against real brokers and a
real name server: topics, send (single, generated, batched), consume with
committed offsets, runtime, producer failover, errors."""

from __future__ import annotations

import json

import pytest

from ferry.client.broker import Consumer, NoRoute, Producer
from ferry.client.namesrv import NamesrvClient
from tests.integration.support import run_ferry


def ok(result) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_topic_create_send_consume_round_trip(two_brokers):
    ns, brokers = two_brokers
    n = ("-n", ns.remoting_addr)
    out = ok(
        run_ferry(
            "topic",
            "create",
            "Demo",
            "-c",
            "DefaultCluster",
            "--read-queues",
            "2",
            "--write-queues",
            "2",
            *n,
        )
    )
    assert "created topic Demo on broker-a" in out and "on broker-b" in out
    assert "Demo" in ok(run_ferry("topic", "list", *n)).split()

    single = ok(run_ferry("send", "Demo", "--body", "hello ferry", *n))
    assert single.startswith("SEND_OK msgId=")
    summary = ok(run_ferry("send", "Demo", "--count", "200", "--size", "128", "--batch", "50", *n))
    assert "sent 200 messages (25600 bytes)" in summary and "SEND_OK=200" in summary

    consumed = run_ferry("consume", "Demo", "-g", "g1", "--pull", "--from-beginning",
                         "--max", "201", "--json", *n)  # fmt: skip
    lines = ok(consumed)
    messages = [json.loads(line) for line in lines.splitlines()]
    assert len(messages) == 201
    assert {m["bodyBytes"] for m in messages[1:]} <= {128, 11}
    assert "hello ferry" in {m["body"] for m in messages}
    per_queue: dict[tuple[str, int], list[int]] = {}
    for m in messages:
        per_queue.setdefault((m["broker"], m["queueId"]), []).append(m["queueOffset"])
    assert all(offsets == sorted(offsets) for offsets in per_queue.values())
    # Offsets were committed: the same group gets nothing more.
    again = run_ferry(
        "consume", "Demo", "-g", "g1", "--pull", "--idle-exit-s", "0.5", "--wait-ms", "100", *n
    )
    assert ok(again).strip() == ""


def test_delete_and_runtime(two_brokers):
    ns, brokers = two_brokers
    a = brokers[0].addr
    ok(run_ferry("topic", "create", "Temp", "-b", a, "-n", ns.remoting_addr))
    ok(run_ferry("topic", "delete", "Temp", "-b", a, "-n", ns.remoting_addr))
    table = ok(run_ferry("runtime", "-b", a))
    assert "broker_role" in table and "ASYNC_MASTER" in table
    info = json.loads(ok(run_ferry("runtime", "-b", a, "--json")))
    assert info["brokerName"] == "broker-a"


def test_errors_name_the_problem(two_brokers):
    ns, _ = two_brokers
    missing = run_ferry("send", "Nope", "--body", "x", "-n", ns.remoting_addr)
    assert missing.returncode == 1 and "has no route" in missing.stderr
    bad = run_ferry("send", "bad topic", "--body", "x", "-n", ns.remoting_addr)
    assert bad.returncode == 2 and "characters outside" in bad.stderr


def test_a_broker_named_as_a_name_server_is_skipped(two_brokers):
    # -n naming a broker's RocketMQ-protocol port by mistake: it does not give
    # a name server's gRPC port, so the client says so and moves on to the
    # next address.
    ns, brokers = two_brokers
    both = f"{brokers[0].remoting_addr};{ns.remoting_addr}"
    assert "broker-a" in ok(run_ferry("cluster", "-n", both))
    only = run_ferry("cluster", "-n", brokers[0].remoting_addr, "--timeout", "2")
    assert only.returncode == 3
    assert f"{brokers[0].remoting_addr}: {brokers[0].remoting_addr} speaks RocketMQ's" in (
        only.stderr
    )
    assert "did not give its ferry.v1 gRPC port" in only.stderr
    # Its gRPC port (the address `ferry cluster` lists): not a name server either.
    grpc_port = run_ferry("cluster", "-n", brokers[0].addr, "--timeout", "2")
    assert grpc_port.returncode == 3
    assert "is it a gRPC port" in grpc_port.stderr


def test_producer_fails_over_to_the_other_broker(two_brokers):
    ns, brokers = two_brokers
    with NamesrvClient([ns.addr]) as nsc:
        ok(run_ferry("topic", "create", "Fail", "-c", "DefaultCluster", "-n", ns.remoting_addr))
        with Producer(nsc, retries=2, timeout_s=3) as producer:
            first = {producer.send("Fail", b"x%d" % i).broker_name for i in range(16)}
            assert first == {"broker-a", "broker-b"}
            # broker-b stops answering (its process is gone, the route is still cached).
            brokers[1].channel.close()
            brokers[1].loop.run(brokers[1].app.server.stop(0))
            sent = [producer.send("Fail", b"y%d" % i) for i in range(8)]
            assert {s.broker_name for s in sent} == {"broker-a"}
        with Consumer(nsc, "g2", "Nope") as consumer, pytest.raises(NoRoute):
            consumer.poll()
