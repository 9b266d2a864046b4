"""The broker's registration loop against real name servers: QueryDataVersion
with forceRegister=false, re-registration after a name server restart, the
master address handed to a slave, and KeepAlive loss when a broker dies."""

from __future__ import annotations

from ferry.model import TopicConfig
from tests.conftest import start_broker, start_namesrv
from tests.integration.support import has_route, live_addrs
from tests.waiting import wait_for


def test_force_register_false_asks_for_the_version_first(loop_thread, tmp_path, ns):
    b = start_broker(loop_thread, tmp_path / "s", ns.remoting_addr, forceRegister="false")
    try:
        registrar = b.app.registrar
        before = registrar.registrations
        loop_thread.run(registrar.register_all(force=False))
        loop_thread.run(registrar.register_all(force=False))
        assert registrar.registrations == before  # unchanged version: no re-registration
        loop_thread.call(b.app.metadata.topics.put, TopicConfig("NewOne", 2, 2, 6))
        loop_thread.run(registrar.register_all(force=False))
        assert registrar.registrations == before + 1
        assert has_route(ns.stub, "NewOne")
    finally:
        b.stop()


def test_a_restarted_name_server_gets_the_broker_back_at_once(loop_thread, tmp_path):
    first = start_namesrv(loop_thread, tmp_path / "ns", metrics_port=-1)
    port = first.app.remoting_port
    b = start_broker(loop_thread, tmp_path / "s", first.remoting_addr)
    try:
        assert b.addr in live_addrs(first.stub)
        first.stop()
        # Same RocketMQ-protocol port, another gRPC port: the broker finds it again.
        second = start_namesrv(
            loop_thread, tmp_path / "ns", port=port, grpc_port=0, metrics_port=-1
        )
        try:
            # Not the 30 s period: the broken KeepAlive stream triggers it.
            wait_for(lambda: b.addr in live_addrs(second.stub), 10, "the broker to re-register")
        finally:
            second.stop()
    finally:
        b.stop()


def test_slave_learns_its_masters_address(loop_thread, tmp_path, ns):
    master = start_broker(loop_thread, tmp_path / "m", ns.remoting_addr, brokerName="broker-x")
    slave = start_broker(
        loop_thread,
        tmp_path / "s",
        ns.remoting_addr,
        brokerName="broker-x",
        brokerRole="SLAVE",
        brokerId=1,
        haListenPort=10999,
    )
    try:
        assert slave.app.admin.master_addr == master.addr
    finally:
        slave.stop()
        master.stop()


def test_a_stopping_broker_unregisters_before_closing_its_keep_alive(loop_thread, tmp_path, ns):
    """The name server counts a clean stop as graceful, not as a lost connection
    (the KeepAlive stream used to be closed first, and removed the broker)."""
    b = start_broker(loop_thread, tmp_path / "s", ns.remoting_addr)
    wait_for(lambda: b.addr in live_addrs(ns.stub), 10, "the broker to register")
    wait_for(lambda: ns.app.routes.live_count() == 1, 10, "the broker to be live")
    b.stop()
    samples = {
        reason: ns.app.registry.get_sample_value(
            "ferry_namesrv_unregisters_total", {"reason": reason}
        )
        for reason in ("graceful", "connection_lost")
    }
    assert samples == {"graceful": 1.0, "connection_lost": 0.0}
    assert b.addr not in live_addrs(ns.stub)
