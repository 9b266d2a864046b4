"""The name server's /metrics endpoint (in-process server, real HTTP): live brokers,
registrations and unregisters by reason, including a killed KeepAlive broker."""

from __future__ import annotations

from ferry.v1 import namesrv_pb2
from tests.helpers import register_request
from tests.integration.support import has_route, sample, scrape
from tests.waiting import wait_for

KA_ADDR = "127.0.0.1:20911"


def test_metrics_count_registrations_and_removals(namesrv, broker_process):
    text = scrape(namesrv.metrics_url)
    assert sample(text, "ferry_namesrv_live_brokers") == 0
    assert sample(text, "ferry_namesrv_registrations_total", 'changed="true"') == 0
    for reason in ("graceful", "expired", "connection_lost"):
        assert sample(text, "ferry_namesrv_unregisters_total", f'reason="{reason}"') == 0
    assert 'ferry_build_info{component="namesrv"' in text

    namesrv.stub.RegisterBroker(register_request(addr="127.0.0.1:10911"))
    namesrv.stub.RegisterBroker(register_request(addr="127.0.0.1:10911"))  # same version
    namesrv.stub.RegisterBroker(register_request(broker_id=1, addr="127.0.0.1:10921"))
    text = scrape(namesrv.metrics_url)
    assert sample(text, "ferry_namesrv_live_brokers") == 2
    assert sample(text, "ferry_namesrv_registrations_total", 'changed="true"') == 1
    assert sample(text, "ferry_namesrv_registrations_total", 'changed="false"') == 2
    assert sample(text, "ferry_namesrv_topics") == 1
    assert (
        sample(
            text,
            "ferry_namesrv_broker_last_update_timestamp_seconds",
            'addr="127.0.0.1:10921",broker_id="1",broker_name="broker-a",cluster="DefaultCluster"',
        )
        is not None
    )

    namesrv.stub.UnregisterBroker(
        namesrv_pb2.UnregisterBrokerRequest(
            cluster_name="DefaultCluster",
            broker_addr="127.0.0.1:10921",
            broker_name="broker-a",
            broker_id=1,
        )
    )
    text = scrape(namesrv.metrics_url)
    assert sample(text, "ferry_namesrv_live_brokers") == 1
    assert sample(text, "ferry_namesrv_unregisters_total", 'reason="graceful"') == 1

    broker = broker_process(namesrv.addr, KA_ADDR, "run-1", "KeepAliveTopic")
    broker.wait_bound()
    text = scrape(namesrv.metrics_url)
    assert sample(text, "ferry_namesrv_live_brokers") == 2
    assert sample(text, "ferry_namesrv_registrations_total", 'changed="true"') == 2

    broker.kill()
    wait_for(
        lambda: not has_route(namesrv.stub, "KeepAliveTopic"),
        2.0,
        "the killed broker's routes to disappear",
    )
    text = scrape(namesrv.metrics_url)
    assert sample(text, "ferry_namesrv_live_brokers") == 1
    assert sample(text, "ferry_namesrv_unregisters_total", 'reason="graceful"') == 1
    assert sample(text, "ferry_namesrv_unregisters_total", 'reason="connection_lost"') == 1
