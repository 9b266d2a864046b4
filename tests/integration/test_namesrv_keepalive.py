"""KeepAlive: a broker-like subprocess (keepalive_broker.py) binds its stream; when the
stream breaks (SIGKILL) or ends (the broker closes it) the name server removes the
broker at once, unless the broker has registered again as a newer instance."""

from __future__ import annotations

import grpc
import pytest

from ferry.v1 import namesrv_pb2
from tests.conftest import LoopThread, RunningNamesrv
from tests.helpers import register_request
from tests.integration.support import has_route, live_addrs
from tests.waiting import wait_for

ADDR = "127.0.0.1:20911"
TOPIC = "KeepAliveTopic"


def unregisters(ns: RunningNamesrv, reason: str) -> float:
    return ns.app.registry.get_sample_value("ferry_namesrv_unregisters_total", {"reason": reason})


# A broken stream removes the broker at once; the only other way out, the heartbeat
# timeout (120 s by default, what these brokers register with), is far past this wait, so a
# loaded machine may take its time without the test proving less.
AT_ONCE_S = 30.0


def gone(ns: RunningNamesrv, addr: str = ADDR, topic: str = TOPIC):
    return lambda: not has_route(ns.stub, topic) and addr not in live_addrs(ns.stub)


def live_entry(ns: RunningNamesrv, addr: str = ADDR) -> namesrv_pb2.BrokerLiveInfo:
    info = ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
    return info.broker_live_table[addr]


def test_killed_broker_leaves_the_routes_at_once(ns, broker_process):
    broker = broker_process(ns.addr, ADDR, "run-1", TOPIC)
    broker.wait_bound()
    assert has_route(ns.stub, TOPIC)
    entry = live_entry(ns)
    assert entry.keep_alive is True
    assert entry.instance_id == "run-1"
    broker.command("ping")
    broker.out.wait_line("pong", 5.0, "a ping answered on the stream")

    broker.kill()
    wait_for(gone(ns), AT_ONCE_S, "the killed broker's routes to disappear")
    info = ns.stub.GetBrokerClusterInfo(namesrv_pb2.GetBrokerClusterInfoRequest())
    assert "broker-ka" not in info.broker_addr_table
    assert "KeepAliveCluster" not in info.cluster_addr_table


def test_killed_broker_is_counted_as_connection_lost(ns, broker_process):
    broker = broker_process(ns.addr, ADDR, "run-1", TOPIC)
    broker.wait_bound()
    broker.kill()
    wait_for(gone(ns), AT_ONCE_S, "the killed broker's routes to disappear")
    assert (unregisters(ns, "connection_lost"), unregisters(ns, "graceful")) == (1, 0)


def test_broker_closing_its_stream_is_removed_too(ns, broker_process):
    broker = broker_process(ns.addr, ADDR, "run-1", TOPIC)
    broker.wait_bound()
    assert has_route(ns.stub, TOPIC)

    broker.command("close")
    wait_for(gone(ns), AT_ONCE_S, "the broker that closed its stream to disappear")
    broker.out.wait_line("closed", 5.0, "the server to end the stream cleanly")
    # Counted once (the reason label of a bare stream end is the servicer's choice).
    assert unregisters(ns, "graceful") + unregisters(ns, "connection_lost") == 1
    assert broker.proc.poll() is None  # the broker process itself is still running


def test_old_stream_breaking_after_a_new_registration_removes_nothing(
    ns, loop_thread: LoopThread, broker_process
):
    routes = ns.app.routes
    decisions: list[tuple] = []
    original = routes.remove_if_current

    def spy(addr, generation, reason):
        result = original(addr, generation, reason)
        decisions.append((addr, generation, reason, result))
        return result

    loop_thread.call(setattr, routes, "remove_if_current", spy)

    broker = broker_process(ns.addr, ADDR, "run-1", TOPIC)
    broker.wait_bound()
    old_generation = loop_thread.call(lambda: routes.live[ADDR].generation)

    broker.command("reregister run-2")
    broker.out.wait_line("reregistered", 5.0, "the broker to register as a new instance")
    assert live_entry(ns).instance_id == "run-2"
    assert loop_thread.call(lambda: routes.live[ADDR].generation) != old_generation

    broker.kill()
    decided = wait_for(
        lambda: [d for d in decisions if d[0] == ADDR],
        2.0,
        "the name server to handle the end of the old stream",
    )
    assert [(addr, generation, result) for addr, generation, _, result in decided] == [
        (ADDR, old_generation, None)
    ]
    assert has_route(ns.stub, TOPIC)
    assert live_entry(ns).instance_id == "run-2"
    assert unregisters(ns, "graceful") + unregisters(ns, "connection_lost") == 0


def test_keep_alive_for_an_unknown_broker_is_failed_precondition(ns):
    responses = ns.stub.KeepAlive(
        iter([namesrv_pb2.KeepAliveRequest(cluster_name="DefaultCluster", broker_addr=ADDR)]),
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ADDR in info.value.details()


def test_keep_alive_naming_an_old_instance_is_failed_precondition(ns):
    ns.stub.RegisterBroker(register_request(addr=ADDR, instance_id="run-2"))
    responses = ns.stub.KeepAlive(
        iter(
            [
                namesrv_pb2.KeepAliveRequest(
                    cluster_name="DefaultCluster", broker_addr=ADDR, instance_id="run-1"
                )
            ]
        ),
        timeout=10,
    )
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ADDR in live_addrs(ns.stub)  # the refused stream removes nothing


def test_server_stop_ends_streams_cleanly_without_waiting_out_the_grace(loop_thread, tmp_path):
    """Stopping ends each KeepAlive stream with OK and keeps its broker (not its fault);
    a stop with a long grace period does not hang on open streams."""
    import queue
    import threading

    from tests.conftest import start_namesrv
    from tests.helpers import register_request

    server = start_namesrv(loop_thread, tmp_path / "ns", metrics_port=-1, grace_s=60.0)
    server.stub.RegisterBroker(register_request(addr=ADDR, instance_id="run-1"))
    release = threading.Event()

    def requests():
        yield namesrv_pb2.KeepAliveRequest(
            cluster_name="DefaultCluster", broker_addr=ADDR, instance_id="run-1"
        )
        release.wait(30)

    responses = server.stub.KeepAlive(requests())
    next(responses)
    ended: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: ended.put(list(responses)), daemon=True).start()
    server.loop.run(server.app.stop(), timeout_s=20)  # far less than the 60 s grace
    assert ended.get(timeout=10) == []  # the stream ended with OK, no error
    assert ADDR in loop_thread.call(lambda: set(server.app.routes.live))
    release.set()
    server.channel.close()
