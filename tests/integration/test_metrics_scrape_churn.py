"""/metrics scraped while registrations churn (in-process name server, real gRPC
clients, real HTTP): every scrape answers 200 with a consistent picture. And,
with a bare registry: collection runs on the event loop's thread, and a scrape
the loop cannot serve answers 503 without stopping the endpoint.

The route collector iterates the live route tables. Collected on the HTTP
server's thread, a scrape that overlaps a RegisterBroker or UnregisterBroker
fails at random (a 500 from a dict changing during iteration) or shows a
torn table; collected on the event loop it sees the tables between two RPCs.
Within one scrape, every live broker has one last-update series and brings
exactly TOPICS_PER_BROKER topics of its own, so the figures must agree.

The scrapers start once the tables are full, so each scrape iterates hundreds
of brokers while RPCs change them. Run with collection on the HTTP thread
(`loop=None`), this test failed 15 runs out of 15, with 1-7 of the 240 scrapes
answering 500 ("dictionary keys changed during iteration").
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import grpc
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ferry.runtime.metrics_http import start_metrics_endpoint
from ferry.v1 import namesrv_pb2, namesrv_pb2_grpc
from tests.conftest import LoopThread
from tests.helpers import register_request
from tests.integration.support import sample, scrape

CHURNERS = 4
BROKERS_PER_CHURNER = 150
TOPICS_PER_BROKER = 2
ROUNDS = 1
SCRAPERS = 4
SCRAPES_PER_SCRAPER = 60
MAX_LIVE = CHURNERS * BROKERS_PER_CHURNER


def _broker(churner: int, i: int) -> tuple[str, str]:
    """(broker_name, addr) of one fake broker; nothing listens on the address."""
    return f"churn-{churner}-{i}", f"127.0.0.1:{30000 + churner * 1000 + i}"


def _churn(addr: str, churner: int, start: threading.Barrier) -> int:
    """Register all of this churner's brokers; once every churner has and the
    scrapers are ready (`start`), ROUNDS times unregister and re-register each
    one (the tables stay large and change all the time), then unregister them
    all. Returns the registrations made."""
    done = 0
    with grpc.insecure_channel(addr) as channel:
        stub = namesrv_pb2_grpc.NameServerStub(channel)

        def register(i: int, counter: int) -> None:
            nonlocal done
            name, broker_addr = _broker(churner, i)
            topics = {f"{name}-t{k}": 4 for k in range(TOPICS_PER_BROKER)}
            request = register_request(
                broker_name=name, addr=broker_addr, topics=topics, counter=counter
            )
            stub.RegisterBroker(request, timeout=10)
            done += 1

        def unregister(i: int) -> None:
            name, broker_addr = _broker(churner, i)
            request = namesrv_pb2.UnregisterBrokerRequest(
                cluster_name="DefaultCluster", broker_addr=broker_addr, broker_name=name
            )
            assert stub.UnregisterBroker(request, timeout=10).removed, broker_addr

        try:
            for i in range(BROKERS_PER_CHURNER):
                register(i, 1)
        except BaseException:
            start.abort()  # the others stop waiting at once
            raise
        start.wait(timeout=60)
        for round_ in range(ROUNDS):
            for i in range(BROKERS_PER_CHURNER):
                unregister(i)
                register(i, round_ + 2)
        for i in range(BROKERS_PER_CHURNER):
            unregister(i)
    return done


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _scrapes(url: str, start: threading.Barrier) -> list[tuple[int, str]]:
    start.wait(timeout=60)
    return [_get(url) for _ in range(SCRAPES_PER_SCRAPER)]


def _figures(text: str) -> tuple[float, float, int]:
    """(live brokers, topics, last-update series) of one exposition; parsing
    raises on anything that is not valid Prometheus text."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (live,) = families["ferry_namesrv_live_brokers"].samples
    (topics,) = families["ferry_namesrv_topics"].samples
    updates = families["ferry_namesrv_broker_last_update_timestamp_seconds"].samples
    return live.value, topics.value, len(updates)


def test_scrapes_during_registration_churn_all_succeed_and_agree(namesrv):
    url = namesrv.metrics_url
    start = threading.Barrier(CHURNERS + SCRAPERS)
    with ThreadPoolExecutor(CHURNERS + SCRAPERS) as pool:
        churns = [pool.submit(_churn, namesrv.addr, c, start) for c in range(CHURNERS)]
        scrapers = [pool.submit(_scrapes, url, start) for _ in range(SCRAPERS)]
        registered = sum(f.result(timeout=120) for f in churns)
        answers = [a for f in scrapers for a in f.result(timeout=120)]

    assert registered == CHURNERS * BROKERS_PER_CHURNER * (ROUNDS + 1)
    assert len(answers) == SCRAPERS * SCRAPES_PER_SCRAPER
    failed = [(status, body[:300]) for status, body in answers if status != 200]
    assert not failed, f"{len(failed)} of {len(answers)} scrapes failed, first: {failed[0]}"

    seen = []
    for _, text in answers:
        live, topics, updates = _figures(text)
        assert 0 <= live <= MAX_LIVE, f"live brokers {live} outside [0, {MAX_LIVE}]"
        assert updates == live, f"{updates} last-update series for {live} live brokers"
        assert topics == live * TOPICS_PER_BROKER, f"{topics} topics for {live} live brokers"
        seen.append(live)
    assert any(0 < v < MAX_LIVE for v in seen), (
        f"no scrape overlapped the churn (live brokers seen: {sorted(set(seen))})"
    )

    final = scrape(url)
    assert sample(final, "ferry_namesrv_live_brokers") == 0
    assert sample(final, "ferry_namesrv_topics") == 0
    assert sample(final, "ferry_namesrv_registrations_total", 'changed="true"') == registered
    assert sample(final, "ferry_namesrv_unregisters_total", 'reason="graceful"') == registered


class _ThreadRecorder(Collector):
    """Notes the thread each collection runs on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def collect(self) -> Iterable[Metric]:
        self.threads.append(threading.current_thread().name)
        yield GaugeMetricFamily("ferry_test_collections", "Collections so far.", len(self.threads))


def test_collection_runs_on_the_loop_and_503_while_it_is_blocked_or_closed():
    registry = CollectorRegistry()
    Counter("ferry_test_events", "Events.", registry=registry).inc(3)
    recorder = _ThreadRecorder()
    registry.register(recorder)
    loop = LoopThread()
    endpoint = start_metrics_endpoint("127.0.0.1", 0, registry, loop.loop, collect_timeout_s=0.2)
    url = f"http://127.0.0.1:{endpoint.port}/metrics"
    release = threading.Event()
    try:
        status, text = _get(url)
        assert status == 200 and sample(text, "ferry_test_events_total") == 3
        status, text = _get(url + "?name[]=ferry_test_events_total")
        assert status == 200 and sample(text, "ferry_test_events_total") == 3
        assert sample(text, "ferry_test_collections") is None
        assert recorder.threads == ["test-loop"]  # the filtered scrape skipped it

        blocked = threading.Event()

        def block() -> None:
            blocked.set()
            release.wait(timeout=30)

        loop.loop.call_soon_threadsafe(block)
        assert blocked.wait(timeout=10)
        status, text = _get(url)
        assert (status, text) == (
            503,
            "metrics unavailable: the event loop did not collect within 0.2s\n",
        )
        release.set()
        status, text = _get(url)
        assert status == 200 and sample(text, "ferry_test_events_total") == 3

        loop.close()
        status, text = _get(url)
        assert (status, text) == (503, "metrics unavailable: the event loop is not running\n")
    finally:
        release.set()
        endpoint.stop()
        if not loop.loop.is_closed():
            loop.close()
