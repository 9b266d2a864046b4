"""`ferry exporter`: the metrics pipeline's collector (ferry/pipeline/exporter.py)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

from ferry.client.namesrv import NoNameServerAnswered
from ferry.pipeline.exporter import ROW_FIELDS, Exporter
from ferry.runtime.errors import FerryError, InvalidArgument
from services.cli.namesrv_cmds import add_namesrv_option, client
from services.cli.output import table

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30}  # fmt: skip
_DURATION = {"ms": 0.001, "s": 1.0, "m": 60.0, "": 1.0}


def parse_duration(text: str, option: str = "--interval") -> float:
    """`5s`, `500ms`, `1m` or plain seconds."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*", text)
    if not found or float(found.group(1)) <= 0:
        raise InvalidArgument(option, f"{text!r} is not a positive duration like 5s or 500ms")
    return float(found.group(1)) * _DURATION[found.group(2) or ""]


def parse_size(text: str, option: str = "--max-spool-bytes") -> int:
    """`256MiB`, `1g`, `1048576`."""
    found = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else None
    if not found or unit not in _UNITS or int(found.group(1)) <= 0:
        raise InvalidArgument(option, f"{text!r} is not a size like 256MiB or 1GiB")
    return int(found.group(1)) * _UNITS[unit]


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def exporter(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    interval = parse_duration(args.interval)
    cap = parse_size(args.max_spool_bytes)
    rounds = 1 if args.once else args.rounds
    # SIGTERM (how `make run` stops its children) ends the loop like Ctrl-C.
    signal.signal(signal.SIGTERM, _interrupt)
    if args.port_file:
        tmp = Path(args.port_file).with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "spool": str(args.spool)}))
        os.replace(tmp, args.port_file)
    with client(args) as namesrv:
        job = Exporter(namesrv, Path(args.spool), max_spool_bytes=cap)
        print(f"exporting to {args.spool} every {interval:g} s (Ctrl-C stops)", file=sys.stderr)
        done = 0
        next_at = time.monotonic()
        try:
            while rounds == 0 or done < rounds:
                try:
                    path, rows, failed = job.round()
                    note = f", {failed} broker(s) not scraped" if failed else ""
                    print(f"round {done + 1}: {rows} rows{note} -> {path.name}", flush=True)
                except NoNameServerAnswered as exc:
                    # Keep going: the name server may come back.
                    print(f"round {done + 1}: skipped: {exc}", file=sys.stderr, flush=True)
                done += 1
                if rounds and done >= rounds:
                    break
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))
        except KeyboardInterrupt:
            pass
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "exporter",
        help="snapshot every broker's metrics into a spool directory (for the Spark job)",
        description="Every --interval: ask a name server for the live brokers, scrape each "
        "broker's /metrics and write one newline-delimited JSON file into --spool (written "
        "as .NAME.tmp, then renamed). Row fields: " + ", ".join(ROW_FIELDS) + ". A broker "
        "that cannot be scraped gets a ferry_exporter_scrape_up row with value 0 and the "
        "reason in labels.error. The oldest files are removed when the spool grows past "
        "--max-spool-bytes.",
    )
    add_namesrv_option(p, json_output=False)
    p.add_argument("--spool", required=True, metavar="DIR", help="where the files go")
    p.add_argument("--interval", default="5s", help="time between rounds (default 5s)")
    p.add_argument("--max-spool-bytes", default="256MiB", help="spool size cap (default 256MiB)")
    p.add_argument("--once", action="store_true", help="one round, then exit")
    p.add_argument("--rounds", type=int, default=0, help="stop after N rounds (default: run on)")
    p.add_argument("--port-file", help=argparse.SUPPRESS)  # for `ferry dev`: {pid} once started
    p.set_defaults(func=exporter)
    add_analytics(sub)


# ---------------------------------------------------------------- analytics


def _analytics():
    """`ferry.pipeline.analytics`, which needs PySpark: an extra of the package."""
    try:
        from ferry.pipeline import analytics
    except ModuleNotFoundError as exc:
        if exc.name != "pyspark" and not (exc.name or "").startswith("pyspark."):
            raise
        raise FerryError(
            "`ferry analytics` needs PySpark, an extra of the package: pip install 'ferry[spark]'"
        ) from None
    return analytics


def analytics_run(args: argparse.Namespace) -> int:
    analytics = _analytics()
    interval = parse_duration(args.interval)
    config = analytics.JobConfig(
        window=f"{parse_duration(args.window, '--window'):g} seconds",
        watermark=f"{parse_duration(args.watermark, '--watermark'):g} seconds",
        lag_threshold=float(parse_size(args.lag_threshold, "--lag-threshold")),
        min_duration_s=parse_duration(args.min_duration, "--min-duration"),
        gap=f"{interval * 1.6:g} seconds",
    )
    spool, out = Path(args.spool), Path(args.out)
    if not spool.is_dir():
        raise InvalidArgument("--spool", f"{spool} is not a directory (run `ferry exporter` first)")
    spark = analytics.spark_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    mode = "what the spool holds, then exit" if args.once else "until Ctrl-C"
    print(f"analytics: {spool} -> {out} ({mode}; windows {config.window}, incidents: lag > "
          f"{config.lag_threshold:,.0f} B for >= {config.min_duration_s:g} s)",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        analytics.run(spark, spool, out, config, once=args.once)
    except KeyboardInterrupt:
        pass
    finally:
        spark.stop()
    if args.once:
        return analytics_report(args)
    return 0


def analytics_report(args: argparse.Namespace) -> int:
    analytics = _analytics()
    from pyspark.sql import functions as F

    out = Path(args.out)
    # A report is a few seconds of work: the short-lived JVM flags start it cheaper.
    spark = analytics.spark_session(
        getattr(args, "master", "local[*]") or "local[*]",
        java_options=analytics.SHORT_LIVED_JVM,
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for name, order, columns in (
            ("lag", "window_start", ["window_start", "broker_name", "replica", "max_lag",
                                     "avg_lag", "p99_lag", "samples"]),
            ("throughput", "window_start", ["window_start", "broker_name", "put_messages",
                                            "put_per_second", "sync_timeouts"]),
            ("incidents", "start", ["broker_name", "replica", "start", "end", "duration_s",
                                    "peak_lag"]),
        ):  # fmt: skip
            frame = analytics.read_table(spark, out, name)
            print(f"== {name}")
            if frame is None:
                print("(nothing yet)")
                continue
            rows = frame.orderBy(F.col(order).desc()).limit(args.limit).collect()
            if not rows:
                print("(none)")
                continue
            headers = [c.upper() for c in columns]
            print(table(headers, [[_cell(r[c]) for c in columns] for r in reversed(rows)]))
    finally:
        spark.stop()
    return 0


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def add_analytics(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analytics",
        help="the Spark job over the exporter's spool, and its report",
        description="`run`: a PySpark structured-streaming job reading the spool and writing "
        "parquet tables lag/, throughput/ and incidents/ under --out (checkpointed: a "
        "restart neither loses nor double-counts a window). `report`: the newest windows "
        "and incidents as tables.",
    )
    cmds = p.add_subparsers(dest="analytics_command", required=True, metavar="run|report")
    r = cmds.add_parser("run", help="run the streaming job")
    r.add_argument("--spool", required=True, metavar="DIR", help="the exporter's spool")
    r.add_argument("--out", required=True, metavar="DIR", help="parquet tables and checkpoints")
    r.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    r.add_argument("--once", action="store_true", help="process what the spool holds, report, exit")
    r.add_argument("--window", default="1m", help="window length (default 1m)")
    r.add_argument("--watermark", default="30s", help="lateness allowed (default 30s)")
    r.add_argument("--lag-threshold", default="64MiB", help="incident threshold (default 64MiB)")
    r.add_argument("--min-duration", default="60s", help="shortest incident (default 60s)")
    r.add_argument("--interval", default="5s", help="the exporter's --interval (default 5s)")
    r.add_argument("--limit", type=int, default=10, help="rows per table in the report")
    r.set_defaults(func=analytics_run)
    q = cmds.add_parser("report", help="print the newest windows and incidents")
    q.add_argument("--out", required=True, metavar="DIR", help="the job's --out")
    q.add_argument("--limit", type=int, default=10, help="rows per table (default 10)")
    q.set_defaults(func=analytics_report, master="local[1]")
