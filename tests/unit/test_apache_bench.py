"""The apache benchmark's readers of Apache's benchmark tools (rocketmq-example's
Producer and Consumer report lines), its rule for when a tool run has warmed up, and
how runs become topics, groups and figures (ferry over Apache, the issue's targets)."""

from __future__ import annotations

import dataclasses

from benchmarks.apache_bench import (
    APACHE,
    BACKLOG_TOPIC,
    FERRY,
    QUICK,
    TOOLS_TOPICS,
    ConsumerLine,
    DrainRun,
    ProducerLine,
    Singles,
    ToolRun,
    _backlog_figure,
    _singles_figure,
    _tool_role_figures,
    backlog_group,
    consumed_in_window,
    consumer_tps,
    drained,
    parse_consumer,
    parse_producer,
    settled,
    singles_topic,
    steady,
    tool_group,
    tool_topic,
    tools_topics,
)
from benchmarks.load import LoadResult
from benchmarks.report import Target

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


def _run(side: str, role: str, sends: tuple[int, ...], consumed: tuple[int, ...] = ()):
    return ToolRun(
        side, role, _lines(*sends), [ConsumerLine(t, 0, 1.0, 1.0, 1, 1) for t in consumed],
        broker_cpu_s=5.0, seconds=10.0,
    )  # fmt: skip


def test_every_run_gets_its_own_topic_and_group():
    """No run's consumer may start on an earlier run's backlog: topics and groups are
    fresh per round, per role and (groups) per side; the masters hold what their runs use."""
    plan = dataclasses.replace(QUICK, tool_rounds=3)
    topics = tools_topics(plan)
    assert topics["SYNC_MASTER"] == [tool_topic("SYNC_MASTER", r) for r in range(3)]
    assert topics["ASYNC_MASTER"] == [tool_topic("ASYNC_MASTER", r) for r in range(3)] + [
        singles_topic(r) for r in range(3)
    ] + [BACKLOG_TOPIC]
    every = [t for ts in topics.values() for t in ts]
    assert len(set(every)) == len(every) == 10
    groups = {tool_group(s, role, r) for s in (FERRY, APACHE) for role in TOOLS_TOPICS
              for r in range(3)}  # fmt: skip
    groups |= {backlog_group(s, r) for s in (FERRY, APACHE) for r in range(3)}
    assert len(groups) == 18  # the backlog is shared, each drain starts a group of its own


def test_a_run_reports_the_mean_of_its_last_two_lines():
    run = _run(FERRY, "ASYNC_MASTER", (1_000, 9_000, 11_000), (800, 8_000, 10_000))
    assert run.send_tps == 10_000 and run.consume_tps == 9_000
    assert run.failed == 0 and run.broker_share == 0.5
    # 5 CPU-seconds over 21,000 lines' TPS x 10 s each
    assert abs(run.broker_us_per_msg - 5.0 / 210_000 * 1e6) < 1e-6
    assert _run(FERRY, "ASYNC_MASTER", (5,)).consume_tps == 0.0  # the Producer alone


def test_tool_figures_are_ferry_over_apache_with_the_issue_targets():
    pairs = [
        {FERRY: _run(FERRY, "SYNC_MASTER", (7_000, 7_000), (7_000, 7_000)),
         APACHE: _run(APACHE, "SYNC_MASTER", (20_000, 20_000), (10_000, 10_000))},
        {FERRY: _run(FERRY, "SYNC_MASTER", (9_000, 9_000), (9_000, 9_000)),
         APACHE: _run(APACHE, "SYNC_MASTER", (10_000, 10_000), (9_000, 9_000))},
    ]  # fmt: skip
    plan = dataclasses.replace(QUICK, tool_rounds=2, tool_min_lines=2, tool_max_lines=5)
    sends, rt, consumed = _tool_role_figures("SYNC_MASTER", pairs, plan)
    # Of two rounds the one with the lower ratio is shown (the one less kind to ferry).
    assert (sends.value, sends.baseline) == (7_000, 20_000)
    assert sends.target == Target("ratio", ">=", 0.7) and sends.met is False
    assert "Ratios by round: 0.35, 0.90." in sends.detail
    assert "SYNC_MASTER with its SLAVE" in sends.name
    assert rt.target is None and rt.unit == "ms"
    assert (consumed.value, consumed.baseline) == (7_000, 10_000)
    assert consumed.target is None  # the send rate again: the target is on the backlog


# A Consumer draining a backlog, as rocketmq-example 4.7.0 prints it (seen in a run): the
# lines after the backlog ran out have NaN RTs, which parse_consumer does not read.
DRAIN_4_7 = """\
Consumer Started.
TPS: 180206 FAIL: 0 AVG(B2C) RT: 19819.897 AVG(S2C) RT: 19806.861 MAX(B2C) RT: 20818 MAX(S2C) RT: 20806
TPS: 233912 FAIL: 0 AVG(B2C) RT: 17200.746 AVG(S2C) RT: 17188.377 MAX(B2C) RT: 18538 MAX(S2C) RT: 18525
TPS: 241000 FAIL: 2 AVG(B2C) RT: 17200.746 AVG(S2C) RT: 17188.377 MAX(B2C) RT: 18538 MAX(S2C) RT: 18525
TPS: 70001 FAIL: 0 AVG(B2C) RT: 17200.746 AVG(S2C) RT: 17188.377 MAX(B2C) RT: 18538 MAX(S2C) RT: 18525
TPS: 0 FAIL: 0 AVG(B2C) RT:     NaN AVG(S2C) RT:     NaN MAX(B2C) RT: 0 MAX(S2C) RT: 0
"""


def test_a_drain_ends_at_the_first_empty_line_after_a_busy_one():
    lines = consumer_tps(DRAIN_4_7)
    assert lines == [(180206, 0), (233912, 0), (241000, 2), (70001, 0), (0, 0)]
    assert drained(lines) and not drained(lines[:-1])
    assert not drained([(0, 0), (0, 0)])  # nothing consumed yet: not a drain's end
    assert drained([(0, 0), (5, 0), (0, 0)])


# A smoke run's small backlog consumed before the Consumer's first report (seen in a CI
# run): every TPS is 0, and only the first window's MAX(B2C) RT says it consumed.
DRAIN_BEFORE_FIRST_LINE = """\
Consumer Started.
TPS: 0 FAIL: 0 AVG(B2C) RT:     NaN AVG(S2C) RT:     NaN MAX(B2C) RT: 21757 MAX(S2C) RT: 21751
TPS: 0 FAIL: 0 AVG(B2C) RT:     NaN AVG(S2C) RT:     NaN MAX(B2C) RT: 0 MAX(S2C) RT: 0
"""


def test_a_drain_within_the_first_window_ends_at_the_next_line():
    assert consumed_in_window(DRAIN_4_7) == [True, True, True, True, False]
    assert drained(consumed_in_window(DRAIN_4_7))
    assert consumed_in_window(DRAIN_BEFORE_FIRST_LINE) == [True, False]
    assert drained(consumed_in_window(DRAIN_BEFORE_FIRST_LINE))
    assert not drained(consumed_in_window(DRAIN_BEFORE_FIRST_LINE.rsplit("TPS", 1)[0]))
    assert not drained(consumer_tps(DRAIN_BEFORE_FIRST_LINE))  # the TPS alone never says so
    run = DrainRun(APACHE, consumer_tps(DRAIN_BEFORE_FIRST_LINE), 1.0, 1_000)
    assert "before the Consumer's first report line: no rate" in run.text()


def test_a_drain_reports_its_full_lines_only():
    run = DrainRun(FERRY, consumer_tps(DRAIN_4_7), broker_cpu_s=5.0, messages=1_000_000)
    # not the first (the JVM's start) nor the last busy line (the backlog ran out in it)
    assert run.full == [233912, 241000] and run.rate == (233912 + 241000) / 2
    assert run.failed == 2 and "5.0 µs per message" in run.text()
    # A smoke run's backlog is gone within a line: its busiest line, flagged by nothing else.
    assert DrainRun(FERRY, [(900, 0), (0, 0)], 1.0, 1_000).rate == 900


def test_the_backlog_figure_carries_the_consumption_target():
    def drain(side: str, *tps: int) -> DrainRun:
        return DrainRun(side, [(t, 0) for t in tps], 1.0, 1_000)

    pairs = [
        {FERRY: drain(FERRY, 1, 90, 90, 1, 0), APACHE: drain(APACHE, 1, 100, 100, 1, 0)},
        {FERRY: drain(FERRY, 1, 110, 110, 1, 0), APACHE: drain(APACHE, 1, 100, 100, 1, 0)},
        {FERRY: drain(FERRY, 1, 100, 100, 1, 0), APACHE: drain(APACHE, 1, 100, 100, 1, 0)},
    ]
    figure = _backlog_figure(
        pairs, dataclasses.replace(QUICK, tool_rounds=3), {FERRY: 5.0, APACHE: 2.0}
    )
    assert (figure.value, figure.baseline) == (100, 100)  # the median ratio, 1.00
    assert figure.target == Target("ratio", ">=", 1.0) and figure.met is True
    assert "Ratios by round: 0.90, 1.10, 1.00." in figure.detail


def test_the_singles_figure_is_the_producer_over_ferry_v1_unary():
    def unary(rate: float) -> LoadResult:
        return LoadResult(int(rate * 5), 0, 5.0, 20.0, 40.0, 0.9, 0.5)

    singles = [
        Singles(_run(FERRY, "ASYNC_MASTER", (9_000, 9_000)), unary(2_000)),
        Singles(_run(FERRY, "ASYNC_MASTER", (8_000, 8_000)), unary(2_000)),
        Singles(_run(FERRY, "ASYNC_MASTER", (15_000, 15_000)), unary(3_000)),
    ]
    figure = _singles_figure(singles, dataclasses.replace(QUICK, tool_rounds=3))
    assert (figure.value, figure.baseline) == (9_000, 2_000)  # the median ratio, 4.5
    assert figure.target == Target("ratio", ">=", 3.0) and figure.met is True
    assert "ratios by round: 4.50, 4.00, 5.00" in figure.detail
