"""`python -m benchmarks.compare NEW [--against BENCHMARKS.md]`: which figures got worse.

Reads the figure tables of a run (a file `python -m benchmarks` printed or appended)
and compares each figure with the latest value BENCHMARKS.md holds for it (the same
section and figure name, in the newest section that has it). A rate (msgs/s, MB/s…)
is worse when lower, a time or a size (ms, s, MiB) when higher. Prints one line per
figure found in both, worst first, and exits 1 when any figure is more than
`--tolerance` (default 10 %) worse, so that a refactor's run can be checked in one
command. The machine is noisy: a figure past the tolerance is a reason to rerun that
benchmark (`--only NAME`) before believing it, not a verdict.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

# Units whose larger values are better; every other unit (times, sizes) is better smaller.
_RATES = ("msgs/s", "MB/s", "GB/s", "req/s", "rows/s", "calls/s")
_VALUE = re.compile(r"^\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*(\S+)?\s*$")


@dataclass(frozen=True)
class Figure:
    section: str  # the benchmark's name, e.g. "broker"
    name: str
    value: float
    unit: str

    @property
    def higher_is_better(self) -> bool:
        return self.unit in _RATES


def parse(text: str) -> dict[tuple[str, str], Figure]:
    """Every figure of every table, keyed by (benchmark, figure name); a later
    table's figure replaces an earlier one (BENCHMARKS.md is newest last)."""
    figures: dict[tuple[str, str], Figure] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("### "):
            section = line[4:].split(" — ")[0].strip()
            continue
        if not line.startswith("| ") or not section:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] in ("Figure", "") or set(cells[1]) <= set("-: "):
            continue
        match = _VALUE.match(cells[1].replace("**", ""))
        if match is None:
            continue
        value = float(match.group(1).replace(",", ""))
        figures[(section, cells[0])] = Figure(section, cells[0], value, match.group(2) or "")
    return figures


def worse_by(new: Figure, old: Figure) -> float:
    """How much worse `new` is than `old`, as a fraction (negative: better)."""
    if old.value == 0 or new.value == 0:
        return 0.0 if new.value == old.value else float("inf")
    if new.higher_is_better:
        return old.value / new.value - 1
    return new.value / old.value - 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__)
    parser.add_argument("new", type=Path, help="a run's output (printed or appended Markdown)")
    parser.add_argument(
        "--against", type=Path, default=Path("BENCHMARKS.md"), help="history to compare with"
    )
    parser.add_argument(
        "--tolerance", type=float, default=0.10, help="fraction worse that fails (0.10)"
    )
    args = parser.parse_args(argv)
    new = parse(args.new.read_text())
    old = parse(args.against.read_text())
    both = [(worse_by(new[k], old[k]), new[k], old[k]) for k in new if k in old]
    if not both:
        print(f"no figure of {args.new} is in {args.against}", file=sys.stderr)
        return 2
    failed = 0
    for worse, n, o in sorted(both, key=lambda t: -t[0]):
        mark = "WORSE" if worse > args.tolerance else "ok"
        failed += mark == "WORSE"
        print(
            f"{mark:5} {worse * 100:+7.1f}%  {n.section}: {n.name}: "
            f"{n.value:g} {n.unit} (was {o.value:g} {o.unit})"
        )
    missing = sorted(k for k in new if k not in old)
    for section, name in missing:
        print(f"new          {section}: {name}")
    print(f"{len(both)} figures compared, {failed} more than {args.tolerance:.0%} worse")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
