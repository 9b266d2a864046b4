"""`ferry analytics`: a PySpark structured-streaming job over the exporter's
spool (docs/guides/monitoring.md, "The metrics pipeline: exporter and Spark job").

It reads the spool directory with a fixed schema (`SCHEMA`, the exporter's row
fields), parses the ISO-8601 UTC `ts` into event time, and writes three
parquet tables under `--out`, each with its own checkpoint under
`--out/_checkpoints/`, so a restart neither loses nor double-counts a window:

- `lag/`: per broker group (`cluster`, `broker_name`) and `replica`, event-time
  windows of `ferry_ha_replication_lag_bytes`: `max_lag`, `avg_lag`, `p99_lag`
  (approximate percentile), `samples`.
- `throughput/`: per broker group, windows of messages stored (`put_messages`,
  from the exporter's `ferry_broker_put_messages_total:increase` rows) and
  `put_per_second`, and SYNC_MASTER waits that timed out (`sync_timeouts`, from
  `ferry_ha_sync_results_total:increase{status=FLUSH_SLAVE_TIMEOUT}`).
- `incidents/`: lagging-replica incidents: a replica's lag above
  `lag_threshold` in consecutive samples (session windows: a sample at or below
  the threshold, or a gap over `gap`, ends it) lasting at least `min_duration`:
  `start`, `end`, `duration_s`, `peak_lag`.

Windows are emitted in append mode once the watermark (`watermark`, behind the
newest event) passes their end: the newest windows appear after later data
arrives. Transforms are plain DataFrame functions (`lag_windows`,
`throughput_windows`, `incidents`), the same for static and streaming frames.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

SCHEMA = StructType(
    [
        StructField("ts", StringType()),
        StructField("cluster", StringType()),
        StructField("broker_name", StringType()),
        StructField("broker_id", LongType()),
        StructField("role", StringType()),
        StructField("replica", StringType()),
        StructField("metric", StringType()),
        StructField("labels", MapType(StringType(), StringType())),
        StructField("value", DoubleType()),
    ]
)
LAG = "ferry_ha_replication_lag_bytes"
PUT_INCREASE = "ferry_broker_put_messages_total:increase"
SYNC_INCREASE = "ferry_ha_sync_results_total:increase"
TABLES = ("lag", "throughput", "incidents")


def _window_bounds() -> tuple:
    """A tumbling window's bounds as plain columns (built when used: a Column
    needs a running Spark session)."""
    return F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end")


@dataclass(frozen=True)
class JobConfig:
    window: str = "1 minute"
    watermark: str = "30 seconds"
    lag_threshold: float = 64 * 1024 * 1024
    min_duration_s: float = 60.0
    # Between 1 and 2 exporter intervals (5 s): one sample at or below the
    # threshold (or a missing one) leaves a 10 s hole and ends the incident.
    gap: str = "8 seconds"


# JVM flags for a short-lived Spark driver (a report, a test): the client JIT alone and the
# serial collector. A run of a few seconds spends much of its CPU in the server JIT's
# compiler threads, which pay off only over minutes (the tests' Spark module: 149 CPU-s
# with the defaults, 93 with these).
SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_session(
    master: str = "local[*]", app: str = "ferry-analytics", java_options: str = ""
) -> SparkSession:
    """A local Spark session; `java_options` go to the driver's JVM (it is started here,
    so they take effect only in the first session of this process)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", java_options)
    return (
        builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )


def with_event_time(rows: DataFrame) -> DataFrame:
    """`event_time` from the ISO-8601 UTC `ts` (rows whose ts does not parse are dropped)."""
    parsed = rows.withColumn("event_time", F.to_timestamp("ts", "yyyy-MM-dd'T'HH:mm:ss.SSSX"))
    return parsed.where(F.col("event_time").isNotNull())


def lag_windows(rows: DataFrame, config: JobConfig) -> DataFrame:
    lag = rows.where(F.col("metric") == LAG)
    return (
        lag.groupBy(F.window("event_time", config.window), "cluster", "broker_name", "replica")
        .agg(
            F.max("value").alias("max_lag"),
            F.avg("value").alias("avg_lag"),
            F.percentile_approx("value", 0.99).alias("p99_lag"),
            F.count("value").alias("samples"),
        )
        .select(
            *_window_bounds(),
            "cluster",
            "broker_name",
            "replica",
            "max_lag",
            "avg_lag",
            "p99_lag",
            "samples",
        )  # fmt: skip
    )


def throughput_windows(rows: DataFrame, config: JobConfig) -> DataFrame:
    wanted = rows.where(F.col("metric").isin(PUT_INCREASE, SYNC_INCREASE))
    seconds = F.col("window.end").cast("long") - F.col("window.start").cast("long")
    return (
        wanted.groupBy(F.window("event_time", config.window), "cluster", "broker_name")
        .agg(
            F.sum(F.when(F.col("metric") == PUT_INCREASE, F.col("value")).otherwise(0.0)).alias(
                "put_messages"
            ),
            F.sum(
                F.when(
                    (F.col("metric") == SYNC_INCREASE)
                    & (F.col("labels")["status"] == "FLUSH_SLAVE_TIMEOUT"),
                    F.col("value"),
                ).otherwise(0.0)
            ).alias("sync_timeouts"),
        )
        .select(
            *_window_bounds(),
            "cluster",
            "broker_name",
            "put_messages",
            (F.col("put_messages") / seconds).alias("put_per_second"),
            "sync_timeouts",
        )
    )


def incidents(rows: DataFrame, config: JobConfig) -> DataFrame:
    """Sessions of consecutive above-threshold lag samples per replica that
    last at least `min_duration_s`.

    Every row takes part (flagged `above` or not) and the filter comes after
    the aggregation: filtering first would let Spark push the filter below the
    watermark, which would then follow only the above-threshold rows and never
    pass the end of the last session, so it would never be emitted."""
    above = (F.col("metric") == LAG) & (F.col("value") > config.lag_threshold)
    sessions = (
        rows.withColumn("above", above)
        .groupBy(
            F.session_window("event_time", config.gap),
            "cluster",
            "broker_name",
            "replica",
            "above",
        )  # fmt: skip
        .agg(
            F.min("event_time").alias("start"),
            F.max("event_time").alias("end"),
            F.max("value").alias("peak_lag"),
            F.count("value").alias("samples"),
            # Filtering on an aggregate (not on the `above` key, which Spark
            # would push down below the aggregation and the watermark).
            F.max(F.col("above").cast("int")).alias("is_above"),
        )
    )
    duration = F.col("end").cast("double") - F.col("start").cast("double")
    return (
        sessions.where(F.col("is_above") == 1)
        .select(
            "cluster",
            "broker_name",
            "replica",
            "start",
            "end",
            duration.alias("duration_s"),
            "peak_lag",
            "samples",
        )  # fmt: skip
        .where(F.col("duration_s") >= config.min_duration_s)
    )


def run(
    spark: SparkSession,
    spool: Path,
    out: Path,
    config: JobConfig = JobConfig(),
    once: bool = True,
    trigger_s: float = 10.0,
) -> None:
    """Start the three streams; with `once`, process what the spool holds and
    return, else run until interrupted."""
    stream = with_event_time(
        spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1000).json(str(spool))
    ).withWatermark("event_time", config.watermark)
    frames = {
        "lag": lag_windows(stream, config),
        "throughput": throughput_windows(stream, config),
        "incidents": incidents(stream, config),
    }
    queries = []
    for name, frame in frames.items():
        writer = (
            frame.writeStream.format("parquet")
            .outputMode("append")
            .option("path", str(out / name))
            .option("checkpointLocation", str(out / "_checkpoints" / name))
            .queryName(f"ferry_{name}")
        )
        writer = (
            writer.trigger(availableNow=True)
            if once
            else writer.trigger(processingTime=f"{trigger_s:g} seconds")
        )
        queries.append(writer.start())
    try:
        for query in queries:
            query.awaitTermination()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()


def read_table(spark: SparkSession, out: Path, name: str) -> DataFrame | None:
    path = out / name
    if not path.exists() or not any(p.suffix == ".parquet" for p in path.rglob("*.parquet")):
        return None
    return spark.read.parquet(str(path))
