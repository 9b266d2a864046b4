"""Figures, targets and the Markdown section `make bench` appends to BENCHMARKS.md.

A benchmark module returns `Figure`s; each carries its value, the baseline
measured in the same run, and a target on either the value or the ratio
value / baseline. This module only formats; it measures nothing.
"""

from __future__ import annotations

import datetime
import operator
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


@dataclass(frozen=True)
class Target:
    """`on` is "value" (in the figure's unit) or "ratio" (value / baseline)."""

    on: str
    op: str
    threshold: float

    def met(self, value: float, ratio: float | None) -> bool | None:
        subject = value if self.on == "value" else ratio
        return None if subject is None else _OPS[self.op](subject, self.threshold)


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    baseline: float | None
    baseline_label: str
    target: Target | None  # None: reported, no target
    detail: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value, self.ratio)

    def target_text(self) -> str:
        if self.target is None:
            return "none"
        subject = "ratio" if self.target.on == "ratio" else self.unit
        return f"{self.target.op} {_num(self.target.threshold)} {subject}"


@dataclass
class BenchResult:
    """What one benchmark module reports."""

    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _num(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _cmd(args: Sequence[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_lines() -> list[str]:
    import google.protobuf
    import grpc

    commit = _cmd(["git", "rev-parse", "--short", "HEAD"]) or "unknown"
    if _cmd(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " + uncommitted changes"
    return [
        f"- Machine: `{_cmd(['uname', '-srm']) or platform.platform()}`, "
        f"CPU {cpu_model()}, nproc {_cmd(['nproc']) or '?'}",
        f"- Python {platform.python_version()}, grpcio {grpc.__version__}, "
        f"protobuf {google.protobuf.__version__}",
        f"- Commit: {commit}",
    ]


@dataclass(frozen=True)
class CpuSnapshot:
    """Machine-wide busy and steal CPU-seconds; `own_s`: this process and its reaped children."""

    wall: float
    busy_s: float
    steal_s: float
    own_s: float


def cpu_snapshot() -> CpuSnapshot:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    tick = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return CpuSnapshot(
        wall=time.monotonic(),
        busy_s=(user + nice + system + irq + softirq) / tick,
        steal_s=steal / tick,
        own_s=t.user + t.system + t.children_user + t.children_system,
    )


def interference_line(before: CpuSnapshot, after: CpuSnapshot) -> str:
    """How much CPU the rest of the machine took while the benchmarks ran."""
    wall = max(after.wall - before.wall, 1e-9)
    others = max(after.busy_s - before.busy_s - (after.own_s - before.own_s), 0.0)
    steal = after.steal_s - before.steal_s
    cpus = os.cpu_count() or 1
    share = (others + steal) / (wall * cpus)
    warning = (
        " — **the machine was not quiet; these figures may be skewed**" if share > 0.05 else ""
    )
    return (
        f"- Other load during the run ({wall:.0f} s): {others:.1f} CPU-s by other processes, "
        f"{steal:.1f} s stolen by the hypervisor ({share:.0%} of {cpus} CPUs){warning}"
    )


def render_section(
    results: Sequence[BenchResult],
    command: str,
    quick: bool,
    failures: Sequence[str],
    cpu_before: CpuSnapshot,
) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    names = ", ".join(r.title for r in results) or "no benchmark"
    lines = [f"## {now} — {names}", ""]
    if quick:
        lines += ["**Quick smoke run (`--quick`): short windows, not a measurement.**", ""]
    lines += [
        *machine_lines(),
        interference_line(cpu_before, cpu_snapshot()),
        f"- Command: `{command}`",
        "",
    ]
    for result in results:
        lines += [
            f"### {result.title}",
            "",
            "| Figure | Value | Same-run baseline | Ratio | Target | Met |",
            "|---|---:|---|---:|---|---|",
        ]
        for f in result.figures:
            baseline = (
                f"{_num(f.baseline)} {f.unit} ({f.baseline_label})"
                if f.baseline is not None
                else "—"
            )
            ratio = f"{f.ratio:.2f}" if f.ratio is not None else "—"
            met = "—" if f.target is None else {True: "yes", False: "**no**", None: "?"}[f.met]
            lines.append(
                f"| {f.name} | {_num(f.value)} {f.unit} | {baseline} | {ratio} "
                f"| {f.target_text()} | {met} |"
            )
        details = [f"- {f.name}: {f.detail}" for f in result.figures if f.detail]
        if details or result.notes:
            lines += ["", *details, *(f"- {n}" for n in result.notes)]
        lines.append("")
    for failure in failures:
        lines += [f"**Failed:** {failure}", ""]
    return "\n".join(lines)
