"""The Spring starter's RocketMQTemplate (rocketmq-spring-boot 2.3.5, what
rocketmq-spring-boot-starter 2.3.5 gives an application; tests/compat/spring's
SpringDelay), unchanged, against Apache RocketMQ 5.5.0 and ferry in the same test
(tests/compat/backends.py): `syncSendDelayTimeSeconds` sets the 5.x client's
TIMER_DELAY_SEC, and the message is held that long before a consumer sees it.

The starter found this difference: ferry used to deliver such a message at once.
"""

from __future__ import annotations

import itertools
import time

import pytest

from tests.apache import run_java
from tests.compat.backends import BACKENDS, start_backend
from tests.compat.specs import json_lines, parametrize_cluster

pytestmark = [pytest.mark.timeout(240), pytest.mark.apache5]

_ids = itertools.count()


def pytest_generate_tests(metafunc):
    parametrize_cluster(metafunc, BACKENDS)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    backend = start_backend(request.param, tmp_path_factory.mktemp(f"spring-{request.param}"))
    try:
        yield backend
    finally:
        backend.release()


def test_sync_send_delay_time_seconds_holds_the_message(cluster, tmp_path):
    from rocketmq.grpc_protocol import MessageType

    from tests.integration.test_proxy_sdk import _receive_until, _simple

    topic = f"SpringDelayed{next(_ids)}"
    cluster.create_topic(topic, 2, message_type="DELAY")
    consumer = _simple(cluster, f"gSpring{next(_ids)}", topic)
    try:
        seconds = 3
        result = run_java(
            "spring", "ferry.compat.SpringDelay",
            [cluster.namesrv_addr, topic, f"pSpring{next(_ids)}", str(seconds), "spring-later"],
            directory=tmp_path / "spring",
        )  # fmt: skip
        # The client's own logger may print after the answer: take the JSON line.
        [sent] = json_lines(result.stdout)
        assert sent["status"] == "SEND_OK", result.stdout
        got = _receive_until(consumer, 1, 60)
        received_ms = time.time() * 1000
        assert [m.body for m in got] == [b"spring-later"]
        # A lower bound only (one clock, this machine's): a loaded machine delivers later,
        # never earlier.
        assert received_ms - sent["beforeMs"] >= seconds * 1000 * 0.9, "delivered before its time"
        assert got[0].message_type == MessageType.DELAY
    finally:
        consumer.shutdown()
