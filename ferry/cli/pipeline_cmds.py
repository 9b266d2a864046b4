"""`ferry exporter`: the metrics pipeline's collector (ferry/pipeline/exporter.py)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from pathlib import Path

from ferry.cli.namesrv_cmds import client
from ferry.client.namesrv import NoNameServerAnswered
from ferry.pipeline.exporter import ROW_FIELDS, Exporter
from ferry.runtime.errors import InvalidArgument

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gib": 1 << 30}  # fmt: skip
_DURATION = {"ms": 0.001, "s": 1.0, "m": 60.0, "": 1.0}


def parse_duration(text: str) -> float:
    """`5s`, `500ms`, `1m` or plain seconds."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m)?\s*", text)
    if not found or float(found.group(1)) <= 0:
        raise InvalidArgument("--interval", f"{text!r} is not a positive duration like 5s or 500ms")
    return float(found.group(1)) * _DURATION[found.group(2) or ""]


def parse_size(text: str) -> int:
    """`256MiB`, `1g`, `1048576`."""
    found = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else None
    if not found or unit not in _UNITS or int(found.group(1)) <= 0:
        raise InvalidArgument("--max-spool-bytes", f"{text!r} is not a size like 256MiB or 1GiB")
    return int(found.group(1)) * _UNITS[unit]


def exporter(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    interval = parse_duration(args.interval)
    cap = parse_size(args.max_spool_bytes)
    rounds = 1 if args.once else args.rounds
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
    p.add_argument(
        "-n", "--namesrv", default=None, metavar="'HOST:PORT;HOST:PORT'",
        help="name servers to ask, in order (default $FERRY_NAMESRV_ADDR, else 127.0.0.1:9876)",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS", help=argparse.SUPPRESS)
    p.add_argument("--spool", required=True, metavar="DIR", help="where the files go")
    p.add_argument("--interval", default="5s", help="time between rounds (default 5s)")
    p.add_argument("--max-spool-bytes", default="256MiB", help="spool size cap (default 256MiB)")
    p.add_argument("--once", action="store_true", help="one round, then exit")
    p.add_argument("--rounds", type=int, default=0, help="stop after N rounds (default: run on)")
    p.set_defaults(func=exporter)
