"""Metrics-pipeline benchmarks (issue #5), each next to a same-run baseline.

1. The Spark job (`ferry analytics run --once`, local[2]) over a synthetic
   spool of 1,000,000 exporter rows (200 files; 4 brokers, 62 samples each per
   5 s round, lag, counters with their `:increase` rows): rows/s from the job's
   start to its last table written. Baseline: the same Spark session reading
   and counting the same files with the same schema (parsing only).
2. The exporter's cost per scrape round with 4 real brokers (and a name
   server): median of the rounds' wall time, against fetching the same four
   /metrics pages without parsing or writing anything.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.broker_bench import _broker_args
from benchmarks.procs import ServerProcess, namesrv_process
from benchmarks.report import BenchResult, Figure, Target

TITLE = "pipeline — exporter and Spark job"


@dataclass(frozen=True)
class Plan:
    rows: int
    files: int
    rounds: int


FULL = Plan(1_000_000, 200, 20)
QUICK = Plan(50_000, 20, 5)


def run(quick: bool, workdir: Path) -> BenchResult:
    plan = QUICK if quick else FULL
    result = BenchResult(TITLE)
    result.figures.append(spark_job(workdir, plan))
    result.figures.append(exporter_round(workdir, plan))
    result.notes.append("Not pinned: Spark uses both cores (local[2]).")
    return result


def _synthetic_spool(spool: Path, rows: int, files: int) -> int:
    from ferry.pipeline.exporter import iso_utc

    spool.mkdir(parents=True)
    brokers = [("broker-a", 0, "SYNC_MASTER"), ("broker-a", 1, "SLAVE"),
               ("broker-b", 0, "SYNC_MASTER"), ("broker-b", 1, "SLAVE")]  # fmt: skip
    per_round = 62
    t0 = 1_795_000_000.0
    written = 0
    per_file = rows // files
    round_no = 0
    for index in range(files):
        lines = []
        while len(lines) < per_file:
            ts = iso_utc(t0 + 5 * round_no)
            for name, broker_id, role in brokers:
                for k in range(per_round // len(brokers) + 1):
                    if k == 0 and broker_id == 0:
                        metric, replica, value = (
                            "ferry_ha_replication_lag_bytes",
                            "1",
                            (200_000_000.0 if 400 <= round_no % 1000 < 430 else 1000.0),
                        )
                    elif k == 1:
                        metric, replica, value = (
                            "ferry_broker_put_messages_total:increase",
                            "",
                            500.0,
                        )
                    else:
                        metric, replica, value = f"ferry_other_{k}", "", float(k)
                    lines.append(json.dumps({
                        "ts": ts, "cluster": "c", "broker_name": name, "broker_id": broker_id,
                        "role": role, "replica": replica, "metric": metric,
                        "labels": {"topic": "T", "status": "SEND_OK"} if k == 1 else {},
                        "value": value,
                    }, separators=(",", ":")))  # fmt: skip
            round_no += 1
        lines = lines[:per_file]
        (spool / f"metrics-{index:06d}.json").write_text("\n".join(lines) + "\n")
        written += len(lines)
    return written


def spark_job(workdir: Path, plan: Plan) -> Figure:
    from ferry.pipeline import analytics

    spool, out = workdir / "spool", workdir / "analytics"
    start = time.perf_counter()
    rows = _synthetic_spool(spool, plan.rows, plan.files)
    prepare_s = time.perf_counter() - start
    spark = analytics.spark_session("local[2]", "ferry-bench")
    spark.sparkContext.setLogLevel("ERROR")
    try:
        start = time.perf_counter()
        counted = spark.read.schema(analytics.SCHEMA).json(str(spool)).count()
        read_s = time.perf_counter() - start
        if counted != rows:
            raise RuntimeError(f"Spark read {counted} rows of {rows}")
        start = time.perf_counter()
        analytics.run(spark, spool, out, analytics.JobConfig(), once=True)
        job_s = time.perf_counter() - start
        windows = spark.read.parquet(str(out / "lag")).count()
        found = spark.read.parquet(str(out / "incidents")).count()
    finally:
        spark.stop()
    return Figure(
        name=f"Spark job over {rows:,} spool rows (local[2], availableNow)",
        value=rows / job_s,
        unit="rows/s",
        baseline=rows / read_s,
        baseline_label="the same files read and counted with the same schema",
        target=Target("value", ">=", 20_000),
        detail=f"job {job_s:.1f} s for 3 streaming queries (lag windows, throughput windows, "
        f"incidents) into parquet with checkpoints; {windows} lag windows and {found} "
        f"incidents written. Reading alone: {read_s:.1f} s. Writing the spool: "
        f"{prepare_s:.1f} s.",
    )


def exporter_round(workdir: Path, plan: Plan) -> Figure:
    from ferry.client.namesrv import NamesrvClient
    from ferry.pipeline.exporter import Exporter

    namesrv = namesrv_process(workdir)
    brokers: list[ServerProcess] = []
    with namesrv:
        addr = namesrv.target
        try:
            for i in range(4):
                name = f"broker-{'ab'[i // 2]}"
                role = ("brokerRole=SYNC_MASTER", "brokerRole=SLAVE")[i % 2]
                opts = [f"namesrvAddr={namesrv.remoting_target}", f"brokerName={name}", role,
                        f"brokerId={i % 2}", "metricsPort=0", "haListenPort=0"]  # fmt: skip
                if i % 2:
                    opts.append(f"haMasterAddress=127.0.0.1:{brokers[-1].info['ha_port']}")
                proc = ServerProcess(
                    "services.broker", _broker_args(workdir / f"b{i}", *opts, file_size=1 << 26),
                    workdir, f"broker-{i}",
                )  # fmt: skip
                brokers.append(proc.start())
            pages = [f"http://127.0.0.1:{b.info['metrics_port']}/metrics" for b in brokers]
            with NamesrvClient([addr]) as nsc:
                deadline = time.monotonic() + 30
                while len(nsc.cluster_info().broker_live_table) < 4:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the 4 brokers did not register")
                    time.sleep(0.2)
                exporter = Exporter(nsc, workdir / "exporter-spool")
                exporter.round()  # warm-up
                rounds, fetches = [], []
                rows = 0
                for _ in range(plan.rounds):
                    start = time.perf_counter()
                    _, rows, failed = exporter.round()
                    rounds.append(time.perf_counter() - start)
                    if failed:
                        raise RuntimeError(f"{failed} brokers not scraped")
                    start = time.perf_counter()
                    for page in pages:
                        with urllib.request.urlopen(page, timeout=5) as answer:
                            answer.read()
                    fetches.append(time.perf_counter() - start)
        finally:
            for proc in reversed(brokers):
                proc.stop()
    return Figure(
        name="Exporter round, 4 brokers",
        value=statistics.median(rounds) * 1000,
        unit="ms",
        baseline=statistics.median(fetches) * 1000,
        baseline_label="fetching the 4 /metrics pages only",
        target=None,
        detail=f"median of {plan.rounds} rounds of {rows} rows each: name-server lookup, 4 "
        "scrapes, parsing, counter increases, one fsynced file. Reported, no target.",
    )
