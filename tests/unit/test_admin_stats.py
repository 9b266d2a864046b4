"""The pieces behind RocketMQ's statistics codes: the object-keyed maps mqadmin reads,
the traffic rates, the runtime table's formats and version names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ferry.remoting.bodies import BodyError, dumps_object_keyed, loads_object_keyed
from services.broker.messaging.stats import WINDOWS_S, TrafficStats
from services.broker.remoting.admin import human_bytes, rates, running_for
from services.cli.stats_cmds import version_desc

queues = st.fixed_dictionaries(
    {"brokerName": st.text(max_size=10), "queueId": st.integers(0, 2**31 - 1),
     "topic": st.text(max_size=20)}
)  # fmt: skip
values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3),
)


@given(st.lists(st.tuples(queues, values), max_size=6))
def test_object_keyed_maps_read_back(pairs):
    text = '{"offsetTable":' + dumps_object_keyed(pairs) + "}"
    got, end = loads_object_keyed(text, len('{"offsetTable":'))
    assert got == pairs and text[end:] == "}"


def test_object_keyed_maps_as_apache_writes_them():
    apache = (
        '{"consumeTps":0.0,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:'
        '{"brokerOffset":6,"consumerOffset":5,"lastTimestamp":1795733497051}}}'
    )
    pairs, _ = loads_object_keyed(apache, apache.index("{", 1 + apache.index("offsetTable")))
    assert pairs == [
        ({"brokerName": "broker-a", "queueId": 0, "topic": "T"},
         {"brokerOffset": 6, "consumerOffset": 5, "lastTimestamp": 1795733497051})
    ]  # fmt: skip
    for bad in ("", "[]", "{1}", '{"a":1,}', '{"a" 1}', "{{}:1"):
        try:
            loads_object_keyed(bad)
        except BodyError:
            continue
        raise AssertionError(f"{bad!r} was read")


def test_rates_over_windows_and_per_group():
    now = [0.0]
    totals = [0, 0]
    reads = [0, 0]  # found, missed
    stats = TrafficStats(
        lambda: now[0], lambda: (totals[0], totals[1]), lambda: (reads[0], reads[1])
    )
    assert stats.put_tps() == 0.0 and rates([stats.put_tps(w) for w in WINDOWS_S]) == (
        "0.0000 0.0000 0.0000"
    )
    for second in range(1, 121):
        now[0] = float(second)
        totals[0] += 10 if second <= 60 else 30  # 10/s for a minute, then 30/s
        totals[1] += 5
        reads[0] += 1
        reads[1] += 4 if second <= 60 else 0  # then the consumer caught up
        stats.got("g", "t", 2)
        stats.sample()
    assert stats.put_tps(10) == 30.0
    assert stats.put_tps(60) == 30.0
    assert 10.0 < stats.put_tps(600) < 30.0  # all it has: 119 s
    assert stats.got_tps(10) == 5.0
    assert (stats.found_tps(10), stats.missed_tps(10)) == (1.0, 0.0)
    assert 0.0 < stats.missed_tps(600) < 4.0
    assert stats.group_tps("g", "t") == 2.0 and stats.group_tps("g", "other") == 0.0
    stats.forget_group("g")
    stats.sample()


def test_stats_items_over_the_minute_hour_and_day():
    now = [0.0]
    stats = TrafficStats(lambda: now[0], lambda: (0, 0))
    stats.sample()
    assert stats.stats_item("TOPIC_PUT_NUMS", "t") is None  # nothing counted yet
    for second in range(1, 3601):
        now[0] = float(second)
        if second <= 1800:
            stats.observe_send("t", "SEND_OK", 4, 0.001, 2)  # 4 messages in 2 sends a second
        stats.got("g", "t", 1)
        stats.sample()
    windows = stats.stats_item("TOPIC_PUT_NUMS", "t")
    assert windows is not None
    assert windows["minute"].sum == 0 and windows["minute"].tps == 0.0  # none lately
    assert windows["day"].sum == 7200 and windows["day"].avgpt == 2.0
    assert windows["day"].tps == 2.0  # over the hour it has lived
    # The hour: from the oldest of 7 samples 10 min apart (an hour back), to now.
    assert windows["hour"].sum == 7200
    got = stats.stats_item("GROUP_GET_NUMS", "t@g")
    assert got is not None and got["minute"].sum == 60 and got["minute"].tps == 1.0
    for second in range(3601, 4201):
        now[0] = float(second)
        stats.sample()
    windows = stats.stats_item("TOPIC_PUT_NUMS", "t")
    assert windows is not None
    assert windows["hour"].sum == 7200 - 4 * 600  # the first 10 minutes slid out
    assert windows["day"].sum == 7200
    stats.forget_group("g")
    assert stats.stats_item("GROUP_GET_NUMS", "t@g") is None


def test_runtime_formats_are_rocketmqs():
    assert [human_bytes(n) for n in (0, 946, 1024, 2300, 5 << 30)] == [
        "0 B", "946 B", "1.0 KiB", "2.2 KiB", "5.0 GiB",
    ]  # fmt: skip
    assert running_for(16_000) == "[ 0 days, 0 hours, 0 minutes, 16 seconds ]"
    assert running_for(90_061_000) == "[ 1 days, 1 hours, 1 minutes, 1 seconds ]"


def test_version_names_follow_rocketmqs_table():
    assert version_desc(409) == "V4_9_8"
    assert version_desc(407) == "V4_9_7"
    assert version_desc(408) == "V4_9_8_SNAPSHOT"
    assert version_desc(213) == "V4_0_0"
    assert version_desc(413) == "V5_0_0"
    assert version_desc(611) == "V5_9_9"
    assert version_desc(700) == "HIGHER_VERSION"
