"""ferry.runtime.late_answers' filter on records made by hand: grpc's late-answer
ERROR is dropped and summarised at INFO (the first, then one line a minute),
anything else passes; installing it twice puts it on grpc's logger once."""

from __future__ import annotations

import logging

from ferry.runtime import late_answers
from ferry.runtime.late_answers import GRPC_LOGGER, LATE_ANSWERS, LateAnswerFilter


def test_the_filter_logs_the_first_late_answer_then_one_line_a_minute(caplog):
    caplog.set_level(logging.INFO)
    now = [100.0]
    quiet = LateAnswerFilter(clock=lambda: now[0])

    def late(method: str) -> logging.LogRecord:
        try:
            raise type("ExecuteBatchError", (Exception,), {})("Failed execute_batch")
        except Exception as exc:
            return logging.LogRecord(
                GRPC_LOGGER,
                logging.ERROR,
                __file__,
                1,
                f"ExecuteBatchError raised in core by servicer method [{method}]",
                None,
                (type(exc), exc, exc.__traceback__),
            )

    other = logging.LogRecord(GRPC_LOGGER, logging.ERROR, __file__, 1, "Unexpected", None, None)
    assert quiet.filter(other)  # anything else passes
    mine = "ferry.runtime.late_answers"
    assert not quiet.filter(late("/ferry.v1.Broker/SendMessage"))
    assert [r.getMessage() for r in caplog.records if r.name == mine][0].startswith(
        "late answer: /ferry.v1.Broker/SendMessage answered after"
    )
    for _ in range(5):
        now[0] += 10
        assert not quiet.filter(late("/ferry.v1.Broker/SendMessage"))
    assert len([r for r in caplog.records if r.name == mine]) == 1  # within the minute
    now[0] += 20
    assert not quiet.filter(late("/ferry.v1.Broker/PullMessage"))
    lines = [r for r in caplog.records if r.name == mine]
    assert len(lines) == 2 and all(r.levelno == logging.INFO and not r.exc_info for r in lines)
    assert "(6 since the last such line, 7 in all" in lines[1].getMessage()
    assert quiet.count == 7
    late_answers.install()
    late_answers.install()
    assert logging.getLogger(GRPC_LOGGER).filters.count(LATE_ANSWERS) == 1
