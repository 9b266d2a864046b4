"""BENCHMARKS.md's "Current figures" are its log's latest full runs, written by
the runner (benchmarks/current.py), and the README's figures come from them."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import current
from benchmarks.__main__ import HEADER, _append

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"


def _run(when: str, title: str, value: str, *, quick: bool = False, commit: str = "abc1234") -> str:
    return "\n".join(
        [
            f"## {when} — {title}",
            "",
            *(
                ["**Quick smoke run (`--quick`): short windows, not a measurement.**", ""]
                if quick
                else []
            ),
            "- Machine: `Linux x86_64`, CPU AMD EPYC, nproc 2",
            f"- Commit: {commit}",
            f"- Command: `python -m benchmarks --only {title.split()[0]} --out BENCHMARKS.md`",
            "",
            f"### {title}",
            "",
            "| Figure | Value | Same-run baseline | Ratio | Target | Met |",
            "|---|---:|---|---:|---|---|",
            f"| sends | {value} msgs/s | — | — | none | — |",
            "",
            "- sends: how it was measured",
            "",
        ]
    )


def test_the_committed_current_figures_are_what_the_log_gives():
    text = BENCHMARKS_MD.read_text()
    assert current.BEGIN in text and current.END in text
    assert text.index(current.END) < current.log_start(text) < len(text)
    assert current.refresh(text) == text, "rewrite them: python -m benchmarks.current"


def test_the_latest_full_run_of_each_benchmark_is_current():
    log = "".join(
        [
            _run("2026-11-01 10:00 UTC", "broker — store", "100"),
            _run("2026-11-02 10:00 UTC", "ha — replication", "7"),
            _run("2026-11-03 10:00 UTC", "broker — store", "200", commit="def5678"),
            _run("2026-11-04 10:00 UTC", "broker — store", "999", quick=True),
        ]
    )
    entries = current.latest(log)
    assert [(e.title, e.when, e.commit) for e in entries] == [
        ("broker — store", "2026-11-03 10:00 UTC", "def5678"),
        ("ha — replication", "2026-11-02 10:00 UTC", "abc1234"),
    ]
    assert entries[0].table[-1] == "| sends | 200 msgs/s | — | — | none | — |"
    block = current.render(log)
    assert "how it was measured" not in block  # the notes stay in the log
    assert "Run of 2026-11-03 10:00 UTC, commit def5678;" in block


def test_the_runner_appends_to_the_log_and_rewrites_the_current_figures(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    _append(out, _run("2026-11-01 10:00 UTC", "broker — store", "100"))
    first = out.read_text()
    assert first.startswith(HEADER)
    assert "| sends | 100 msgs/s |" in first.split(current.END)[0]
    _append(out, _run("2026-11-02 10:00 UTC", "broker — store", "250"))
    text = out.read_text()
    head, log = text.split(current.END)
    assert "| sends | 250 msgs/s |" in head and "| sends | 100 msgs/s |" not in head
    assert log.index("2026-11-01 10:00 UTC") < log.index("2026-11-02 10:00 UTC")  # newest last
    assert text.count(current.BEGIN) == 1
    assert not list(tmp_path.glob("*.partial"))


def test_a_file_without_the_section_gets_it_before_its_log():
    old = "# Benchmarks\n\nAppended, newest last.\n\n" + _run("2026-11-01 10:00 UTC", "tx — t", "5")
    text = current.refresh(old)
    assert text.startswith("# Benchmarks\n\nAppended, newest last.\n\n" + current.BEGIN)
    assert text.endswith(old.split("\n\n", 2)[2])
    assert current.refresh(text) == text


NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def readme_figures(readme: str) -> list[tuple[str, str]]:
    """(figure, value) rows of the README's "Current figures" table."""
    section = readme.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|") and not line.startswith("|---")
    ]
    return [(r[0], r[1]) for r in rows[1:]]


def readme_figure_problems(readme: str, benchmarks: str) -> list[str]:
    """Numbers of the README's Value column that BENCHMARKS.md's current
    figures do not hold."""
    figures = benchmarks[benchmarks.index(current.BEGIN) : benchmarks.index(current.END)]
    numbers = set(NUMBER.findall(figures))
    return [
        f"{name}: {number}"
        for name, value in readme_figures(readme)
        for number in NUMBER.findall(value.replace("×", " "))
        if number not in numbers
    ]


def test_the_readme_figures_come_from_the_current_figures():
    """A few headline rows, every value from BENCHMARKS.md's current figures,
    and a link to BENCHMARKS.md."""
    readme = (ROOT / "README.md").read_text()
    assert 5 <= len(readme_figures(readme)) <= 18
    assert readme_figure_problems(readme, BENCHMARKS_MD.read_text()) == []
    assert "](BENCHMARKS.md)" in readme


def test_a_readme_figure_not_in_the_current_figures_is_caught():
    readme = (ROOT / "README.md").read_text()
    row = re.search(
        r"^\| `SendMessages`, 64 × 128 B from 4 callers \| ([\d,]+) msgs/s \|", readme, re.M
    )
    assert row, "the README's figures table lost its SendMessages row"
    value = int(row.group(1).replace(",", ""))
    changed = f"{value + 1:,}"
    stale = readme.replace(f"| {row.group(1)} msgs/s |", f"| {changed} msgs/s |")
    assert stale != readme
    assert readme_figure_problems(stale, BENCHMARKS_MD.read_text()) == [
        f"`SendMessages`, 64 × 128 B from 4 callers: {changed}"
    ]


def test_the_readme_dates_its_figures_as_the_current_runs():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    dates = set(re.findall(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC", section))
    runs = {entry.when for entry in current.latest(BENCHMARKS_MD.read_text())}
    assert dates and dates <= runs
