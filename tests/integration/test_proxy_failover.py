"""SIGKILL one master while the official RocketMQ 5 SDK produces through the
proxy: sends go on through the other broker group, none fails, and what was
acknowledged after the kill is stored on the survivor."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
from rocketmq import ClientConfiguration, Credentials, Message, Producer

from ferry.v1 import broker_pb2, broker_pb2_grpc
from tests.conftest import LoopThread, broker_options, start_namesrv
from tests.integration import support
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
TOPIC = "SdkFailover"


def _bodies_on(addr: str) -> set[bytes]:
    bodies = set()
    with grpc.insecure_channel(addr) as channel:
        broker = broker_pb2_grpc.BrokerStub(channel)
        for queue_id in range(4):
            offset = 0
            while True:
                answer = broker.PullMessage(
                    broker_pb2.PullMessageRequest(
                        consumer_group="failover-check", topic=TOPIC, queue_id=queue_id,
                        queue_offset=offset, max_msg_nums=32,
                    ),
                    timeout=10,
                )  # fmt: skip
                if not answer.messages:
                    break
                bodies.update(m.body for m in answer.messages)
                offset = answer.next_begin_offset
    return bodies


def test_sigkill_a_master_while_the_sdk_produces(tmp_path):
    loop = LoopThread()
    ns = start_namesrv(loop, tmp_path / "ns")
    brokers = {
        name: support.BrokerServer(
            tmp_path / name, broker_options(tmp_path / name, ns.remoting_addr, brokerName=name)
        ).start()
        for name in ("broker-a", "broker-b")
    }
    proxy = None
    producer = None
    try:
        for b in brokers.values():
            with grpc.insecure_channel(b.addr) as channel:
                support.create_topic(channel, TOPIC, 4)
        wait_for(
            lambda: support.route_queue_datas(ns.stub, TOPIC) == 2,
            30,
            "both brokers in the topic's route",
        )
        proxy = support.ProxyProcess(tmp_path, ns.remoting_addr)
        endpoint = proxy.endpoint
        producer = Producer(ClientConfiguration(endpoint, Credentials()), (TOPIC,))
        producer.startup()

        # (when the send started, body): a send that started after the kill
        # finished cannot have reached the dead broker (one in flight at the kill
        # may have been stored there and acknowledged a moment later).
        acked: list[tuple[float, bytes]] = []
        failures: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.is_set():
                m = Message()
                m.topic = TOPIC
                m.body = f"m{i:06d}".encode()
                started = time.monotonic()
                try:
                    producer.send(m)
                    acked.append((started, m.body))
                except Exception as exc:  # noqa: BLE001 - every failure is reported
                    failures.append(f"{m.body!r}: {exc}")
                i += 1

        sender = threading.Thread(target=produce)
        sender.start()
        try:
            wait_for(lambda: len(acked) >= 100, 60, "100 sends before the kill")
            brokers["broker-a"].kill()
            killed_at = time.monotonic()
            wait_for(
                lambda: sum(1 for t, _ in acked if t > killed_at) >= 200,
                60,
                f"200 sends acknowledged after the kill (failures: {failures[:3]})",
            )
        finally:
            stop.set()
            sender.join(60)
        assert failures == []
        after = {body for t, body in acked if t > killed_at}
        assert after <= _bodies_on(brokers["broker-b"].addr)
    finally:
        if producer is not None:
            producer.shutdown()
        if proxy is not None:
            proxy.stop()
        for b in brokers.values():
            b.kill()
        ns.stop()
        loop.close()
