"""`python -m benchmarks`: run the named benchmarks and append their figures to a Markdown file.

Each entry of `BENCHMARKS` names a module with `TITLE` and
`run(quick: bool, workdir: Path) -> BenchResult`. Modules are imported only
when they run. Without --out the section is printed, not written; with it, the
section goes at the end of the file's log and the file's "Current figures" are
rewritten from that log (benchmarks/current.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

from benchmarks import current
from benchmarks.procs import settle_disk
from benchmarks.report import BenchResult, cpu_snapshot, render_section

BENCHMARKS: dict[str, str] = {
    "admin": "benchmarks.admin_bench",
    "apache": "benchmarks.apache_bench",
    "namesrv": "benchmarks.namesrv_bench",
    "broker": "benchmarks.broker_bench",
    "failover": "benchmarks.failover_bench",
    "ha": "benchmarks.ha_bench",
    "pipeline": "benchmarks.pipeline_bench",
    "pop": "benchmarks.pop_bench",
    "proxy": "benchmarks.proxy_bench",
    "store": "benchmarks.store_bench",
    "tx": "benchmarks.tx_bench",
}

HEADER = """# Benchmarks

`make bench` (`python -m benchmarks --out BENCHMARKS.md`) appends each run to the log
at the end of this file, newest last, then rewrites the current figures below from that
log. Each run records the machine and compares every figure with a baseline measured in
the same run; ratios are value / baseline. A run written to a file of its own first
(`--out FILE`) was appended here afterwards, as its Command line says.
"""


def _append(path: Path, section: str) -> None:
    """Append `section` to the log after a blank line (a new file starts with
    `HEADER`), then rewrite the file's current figures from its log."""
    text = path.read_text() if path.exists() else HEADER + "\n"
    prefix = "" if not text or text.endswith("\n\n") else "\n" if text.endswith("\n") else "\n\n"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(current.refresh(text + prefix + section))
    os.replace(partial, path)


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


# The quick ha and failover benchmarks ran out of space with 4.8 GiB free (2026-11-26).
MIN_FREE_BYTES = 8 << 30


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run ferry's benchmarks."
    )
    parser.add_argument("--out", type=Path, help="append the section to this Markdown file")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(sorted(BENCHMARKS))}",
    )
    parser.add_argument("--quick", action="store_true", help="short smoke run, not a measurement")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(sorted(BENCHMARKS)))
        return 0
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C: each benchmark's `with`
    # blocks stop the servers it started instead of leaving them running.
    signal.signal(signal.SIGTERM, _terminated)

    cpu_before = cpu_snapshot()
    results: list[BenchResult] = []
    failures: list[str] = []
    for name in args.only or list(BENCHMARKS):
        found, waited = settle_disk()
        temp = tempfile.gettempdir()
        disk = shutil.disk_usage(temp)
        if disk.free < MIN_FREE_BYTES:
            print(
                f"warning: {disk.free / 2**30:.1f} GiB free under {temp}; "
                f"the benchmarks' brokers preallocate commit-log files of up to 1 GiB each "
                f"and need ~{MIN_FREE_BYTES >> 30} GiB (set TMPDIR to a roomier disk)",
                file=sys.stderr,
                flush=True,
            )
        print(
            f"running {name} ... (first wrote back {found >> 20} MiB of dirty pages "
            f"in {waited:.1f} s; {disk.free / 2**30:.1f} GiB free under {temp})",
            file=sys.stderr,
            flush=True,
        )
        module = importlib.import_module(BENCHMARKS[name])
        try:
            with tempfile.TemporaryDirectory(prefix=f"ferry-bench-{name}-") as workdir:
                results.append(module.run(args.quick, Path(workdir)))
        except Exception as exc:
            traceback.print_exc()
            failures.append(f"{name}: {type(exc).__name__}: {exc}")

    command = shlex.join(
        ["python", "-m", "benchmarks", *(argv if argv is not None else sys.argv[1:])]
    )
    section = render_section(results, command, args.quick, failures, cpu_before)
    print(section)
    if args.out is not None:
        _append(args.out, section)
        print(f"appended to {args.out}", file=sys.stderr)
    for result in results:
        for figure in result.figures:
            if figure.met is False:
                print(
                    f"target missed: {figure.name}: {figure.value:.2f} {figure.unit} "
                    f"(target {figure.target_text()})",
                    file=sys.stderr,
                )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
