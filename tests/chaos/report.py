"""Print `make chaos`'s report (chaos-report.jsonl) as a table, and exit 1 if
any acknowledged message was lost or differs.

    python -m tests.chaos.report chaos-report.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from services.cli.output import table


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.exists():
        print(f"{path}: no report (did the chaos tests run?)", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(
        table(
            ["SCENARIO", "ROUNDS", "FAULTS", "ACKNOWLEDGED", "LOST", "DIFFERENT", "SECONDS"],
            [
                [
                    r["scenario"],
                    r["rounds"],
                    r["faults"],
                    r["acknowledged"],
                    r["lost"],
                    r["differing"],
                    r["seconds"],
                ]
                for r in rows
            ],  # fmt: skip
        )
    )
    for r in rows:
        for note in r["notes"]:
            print(f"  {r['scenario']}: {note}")
    lost = sum(r["lost"] + r["differing"] for r in rows)
    print(f"acknowledged messages lost or changed: {lost}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
