"""The apache benchmark's readers of Apache's benchmark tools (rocketmq-example's
Producer and Consumer report lines) and its rule for when a tool run has warmed up."""

from __future__ import annotations

from benchmarks.apache_bench import (
    ConsumerLine,
    ProducerLine,
    parse_consumer,
    parse_producer,
    settled,
    steady,
)

# As rocketmq-example 4.7.0 prints them (seen in a run), with the lines around them.
PRODUCER_4_7 = """\
topic BenchmarkAsync threadCount 64 messageSize 128 keyEnable false
Send TPS: 812 Max RT: 2990 Average RT:  61.921 Send Failed: 9 Response Failed: 7
java.lang.Exception: Send TPS: is not a report line
Send TPS: 30685 Max RT: 1647 Average RT:   2.085 Send Failed: 0 Response Failed: 0
"""
CONSUMER_4_7 = """\
topic: BenchmarkAsync, group: benchmark_consumer_async_master, suffix: false, filterType: null
Consumer Started.
TPS: 491 FAIL: 0 AVG(B2C) RT: 116.114 AVG(S2C) RT:  84.585 MAX(B2C) RT: 1712 MAX(S2C) RT: 1545
TPS: 33242 FAIL: 2 AVG(B2C) RT:   2.270 AVG(S2C) RT:   1.320 MAX(B2C) RT: 1712 MAX(S2C) RT: 1545
"""
# Later rocketmq-example versions start with the time and put "(ms)" after RT.
PRODUCER_LATER = (
    "Current Time: 1700000000000 Send TPS: 41000 Max RT(ms): 120 Average RT(ms):   1.500 "
    "Send Failed: 0 Response Failed: 1\n"
)
CONSUMER_LATER = (
    "Current Time: 1700000000000 TPS: 40000 FAIL: 0 AVG(B2C) RT(ms):   3.250 "
    "AVG(S2C) RT(ms):   2.125 MAX(B2C) RT(ms): 90 MAX(S2C) RT(ms): 80\n"
)


def test_producer_lines_are_read_with_every_figure():
    assert parse_producer(PRODUCER_4_7) == [
        ProducerLine(tps=812, max_rt_ms=2990, avg_rt_ms=61.921, send_failed=9, response_failed=7),
        ProducerLine(tps=30685, max_rt_ms=1647, avg_rt_ms=2.085, send_failed=0, response_failed=0),
    ]
    assert parse_producer(PRODUCER_LATER) == [ProducerLine(41000, 120, 1.5, 0, 1)]


def test_consumer_lines_are_read_with_every_figure():
    assert parse_consumer(CONSUMER_4_7) == [
        ConsumerLine(491, 0, 116.114, 84.585, 1712, 1545),
        ConsumerLine(33242, 2, 2.27, 1.32, 1712, 1545),
    ]
    assert parse_consumer(CONSUMER_LATER) == [ConsumerLine(40000, 0, 3.25, 2.125, 90, 80)]


def test_neither_reader_takes_the_other_tools_lines_or_noise():
    assert parse_consumer(PRODUCER_4_7 + PRODUCER_LATER) == []
    assert parse_producer(CONSUMER_4_7 + CONSUMER_LATER) == []
    assert parse_producer("") == [] and parse_consumer("TPS: x FAIL: 0\n") == []


def _lines(*tps: int) -> list[ProducerLine]:
    return [ProducerLine(t, 1, 1.0, 0, 0) for t in tps]


def test_a_run_settles_when_two_lines_agree_and_never_past_its_bound():
    assert not settled(_lines(4_465, 12_357), 3, 6)  # too few lines
    assert not settled(_lines(4_465, 12_357, 19_291), 3, 6)  # still climbing
    assert settled(_lines(4_465, 12_357, 26_092, 24_403), 3, 6)  # within 10 %
    assert settled(_lines(4_465, 12_357, 19_291, 26_677, 30_685, 33_612), 3, 6)  # the bound
    assert settled(_lines(100), 1, 1)  # a smoke run: one line
    assert not settled(_lines(), 1, 1)  # nothing printed yet


def test_the_last_two_lines_are_reported():
    lines = _lines(1, 2, 3)
    assert steady(lines) == lines[1:]
    assert steady(lines[:1]) == lines[:1]
