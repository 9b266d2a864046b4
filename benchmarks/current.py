"""The "Current figures" section of BENCHMARKS.md, written from the log below it.

BENCHMARKS.md is a short head (title, how the file is kept), the current figures
between two markers, and the log: every run's section, oldest first, as
`python -m benchmarks --out` appends them. The current figures are the table of
the latest full run (not `--quick`) of each benchmark in the log, with the run's
date, commit and command; `refresh` rewrites them from the log, so they are never
edited by hand (`python -m benchmarks.current` rewrites them after a run was
appended by hand). Text only: nothing here measures or runs anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BEGIN = "<!-- current figures: written by benchmarks/current.py from the log below -->"
END = "<!-- end of the current figures -->"
RUN_HEADING = re.compile(r"^## (\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC) — ", flags=re.M)
QUICK = "**Quick smoke run"


@dataclass(frozen=True)
class Latest:
    """One benchmark's table as its latest full run printed it."""

    title: str
    when: str
    commit: str
    command: str
    table: tuple[str, ...]


def log_start(text: str) -> int:
    """Where the log (the first run's `## <date> UTC — ...` heading) begins."""
    first = RUN_HEADING.search(text)
    return len(text) if first is None else first.start()


def _runs(log: str) -> list[tuple[str, str]]:
    """(date, body) of each run, oldest first."""
    starts = [m.start() for m in RUN_HEADING.finditer(log)] + [len(log)]
    return [
        (RUN_HEADING.match(log, a).group(1), log[a:b])  # type: ignore[union-attr]
        for a, b in zip(starts, starts[1:], strict=False)
    ]


def _field(body: str, name: str) -> str:
    found = re.search(rf"^- {name}: (.*)$", body, flags=re.M)
    return found.group(1).strip() if found else "unknown"


def latest(log: str) -> list[Latest]:
    """The latest full run of each benchmark (`### title`), in the order the
    log first shows them."""
    found: dict[str, Latest] = {}
    for when, body in _runs(log):
        if QUICK in body:
            continue
        commit, command = _field(body, "Commit"), _field(body, "Command")
        parts = re.split(r"^### (.+)$", body, flags=re.M)
        for title, section in zip(parts[1::2], parts[2::2], strict=True):
            table = tuple(line for line in section.splitlines() if line.startswith("|"))
            if table:
                found[title.strip()] = Latest(title.strip(), when, commit, command, table)
    return list(found.values())


def render(log: str) -> str:
    """The current-figures block, markers included."""
    lines = [
        BEGIN,
        "",
        "## Current figures",
        "",
        "The latest full run of each benchmark in the log below: its table as the run",
        "printed it, with the run's date, commit and command. `python -m benchmarks --out",
        "BENCHMARKS.md` rewrites this section after appending a run (`benchmarks/current.py`);",
        "do not edit it by hand. The notes on each figure are in the run's section of the log.",
        "",
    ]
    for entry in latest(log):
        lines += [
            f"### {entry.title}",
            "",
            f"Run of {entry.when}, commit {entry.commit}; {entry.command}.",
            "",
            *entry.table,
            "",
        ]
    lines += ["## The log", "", "Every run, oldest first, as the runner appended it.", "", END, ""]
    return "\n".join(lines)


def refresh(text: str) -> str:
    """`text` with its current figures rewritten from its log: between the
    markers when they are there, else inserted just before the log."""
    start = log_start(text)
    block = render(text[start:])
    if BEGIN in text and END in text:
        a, b = text.index(BEGIN), text.index(END) + len(END)
        rest = text[b:].lstrip("\n")
        return text[:a] + block + "\n" + rest
    head = text[:start].rstrip("\n") + "\n\n"
    return head + block + "\n" + text[start:]


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.current [FILE]`: rewrite FILE's current figures
    (default BENCHMARKS.md), e.g. after appending a run by hand."""
    import sys
    from pathlib import Path

    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "BENCHMARKS.md")
    path.write_text(refresh(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
