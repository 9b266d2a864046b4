"""The chaos suite: faults injected into real broker processes under load, in
rounds, each scenario bounded in time; every message acknowledged SEND_OK must
survive, byte-identical. `make chaos` runs FERRY_CHAOS_ROUNDS=20 and writes
chaos-report.jsonl; `make test` runs 2 rounds of each."""

from __future__ import annotations

import re
import time

from tests.chaos.harness import (
    ROUNDS,
    Pair,
    Producers,
    Report,
    check_acked_on,
    read_log,
)
from tests.conftest import wait_for

RECOVERED = r"store recovered .* commit_log=\[(\d+),(\d+)\)"


def reports_in(log: str) -> list[str]:
    """The offsets the slave reported on each HA connection, in order."""
    return re.findall(r"HA connected to master \S+; reporting (\d+)", log)


def first_start(store) -> int:
    return min(int(p.name) for p in (store / "commitlog").iterdir())


def assert_logs_identical(pair: Pair, end: int, report: Report) -> None:
    lo = max(first_start(pair.master.store), first_start(pair.slave.store))
    master, slave = read_log(pair.master.store, lo, end), read_log(pair.slave.store, lo, end)
    if master != slave:
        at = next(i for i, (a, b) in enumerate(zip(master, slave, strict=True)) if a != b)
        report.notes.append(f"logs differ at {lo + at}")
        report.write()
        raise AssertionError(f"the commit logs differ at offset {lo + at} (end {end})")


def test_sigkill_sync_master_under_load_loses_no_acknowledged_message(tmp_path):
    """Each round: producers send to the SYNC_MASTER, it is SIGKILLed mid-load;
    every SEND_OK so far must be on the slave, byte-identical; the master
    restarts, recovers, the slave re-joins and the two logs are identical."""
    report = Report("sigkill-sync-master")
    pair = Pair(tmp_path).start()
    producers = Producers(pair.master.addr)
    try:
        for _ in range(ROUNDS):
            producers.start()
            producers.wait_acked(100)
            time.sleep(0.3)  # keep sending up to the kill
            pair.master.kill()
            report.faults += 1
            producers.stop()
            lost, differing = check_acked_on(pair.slave.store, producers.acked)
            report.lost, report.differing = lost, differing
            report.acknowledged = len(producers.acked)
            assert (lost, differing) == (0, 0), (
                f"round {report.rounds + 1}: {lost} acknowledged messages lost and "
                f"{differing} different on the slave, of {len(producers.acked)}"
            )
            pair.master.start()
            assert "crashed=True" in pair.master.log().rsplit("store recovered", 1)[1][:40]
            end = pair.wait_in_sync()
            assert_logs_identical(pair, end, report)
            report.rounds += 1
        # And on the master too, after all its recoveries.
        assert check_acked_on(pair.master.store, producers.acked) == (0, 0)
    finally:
        producers.stop()
        report.notes.append(f"statuses {producers.statuses}")
        report.write()
        pair.stop()


def test_sigkill_slave_under_load_resumes_from_its_own_end(tmp_path):
    """Each round: the slave is SIGKILLed while producers send, restarted, and
    resumes from the end of its own log; after the load the logs converge
    byte-identical and every SEND_OK is on both."""
    report = Report("sigkill-slave")
    pair = Pair(tmp_path).start()
    producers = Producers(pair.master.addr).start()
    try:
        for _ in range(ROUNDS):
            producers.wait_acked(100)
            pair.slave.kill()
            report.faults += 1
            before = len(reports_in(pair.slave.log()))
            time.sleep(0.3)  # sends meanwhile: SLAVE_NOT_AVAILABLE, not SEND_OK
            pair.slave.start()
            recovered = re.findall(RECOVERED, pair.slave.log())[-1]
            end_on_disk = int(recovered[1])
            starts = wait_for(
                lambda before=before: reports_in(pair.slave.log())[before:],
                15,
                "the slave to reconnect",
            )
            # It resumed from its own end, not from zero or the master's end.
            assert int(starts[0]) == end_on_disk > 0, (starts[0], end_on_disk)
            report.rounds += 1
        producers.stop()
        end = pair.wait_in_sync()
        report.acknowledged = len(producers.acked)
        lost, differing = check_acked_on(pair.slave.store, producers.acked)
        report.lost, report.differing = lost, differing
        assert (lost, differing) == (0, 0), f"{lost} lost, {differing} different"
        assert_logs_identical(pair, end, report)
    finally:
        producers.stop()
        report.notes.append(f"statuses {producers.statuses}")
        report.write()
        pair.stop()
