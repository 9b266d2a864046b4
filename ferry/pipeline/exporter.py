"""`ferry exporter`: brokers' metrics, snapshotted into a spool directory for
the Spark job (docs/guides/monitoring.md, "The metrics pipeline: exporter and
Spark job").

Every round the exporter asks a name server for the live brokers
(`GetBrokerClusterInfo`; each broker registers the address of its /metrics),
scrapes each one, and writes ONE newline-delimited JSON file for the round:
`.NAME.tmp` first, then renamed to `NAME` (`metrics-<UTC time>-<seq>.json`),
so a reader never sees a partial file (Spark skips names starting with `.`).

Row schema (one JSON object per line; `ROW_FIELDS`, stable):

| field | type | meaning |
|---|---|---|
| ts | string | ISO-8601 UTC time of the round, e.g. `2026-11-22T23:40:05.120Z` |
| cluster, broker_name | string | the broker's group |
| broker_id | int | 0 for a master |
| role | string | `SYNC_MASTER`, `ASYNC_MASTER` or `SLAVE` |
| replica | string | the `replica` label (HA series on a master), else `""` |
| metric | string | the sample name (`ferry_ha_replication_lag_bytes`, `..._total`, `..._bucket`) |
| labels | object of strings | the sample's other labels (`topic`, `status`, `le`, ...) |
| value | float | the sample's value |

For every counter sample (`*_total`) the exporter also writes a
`<name>:increase` row: how much it grew since the previous round (a counter
that went down was reset by a restart, and counts from zero). Summing those
rows over a window gives the exact count in it, with nothing lost at window
edges; the first round after the exporter starts has none.

Each broker also gets a `ferry_exporter_scrape_up` row: 1 when scraped, 0 when
not, with the reason in `labels.error`, so a broker that is down is visible in
the data rather than silently missing. The spool is capped
(`max_spool_bytes`): the oldest files go first, with a warning.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ferry.client.namesrv import NamesrvClient
from ferry.v1 import namesrv_pb2

log = logging.getLogger(__name__)

ROW_FIELDS = ("ts", "cluster", "broker_name", "broker_id", "role", "replica", "metric", "labels",
              "value")  # fmt: skip
IDENTITY_LABELS = {"cluster", "broker_name", "broker_id", "role", "replica"}
SCRAPE_UP = "ferry_exporter_scrape_up"


@dataclass(frozen=True)
class Broker:
    addr: str
    cluster: str
    broker_name: str
    broker_id: int
    role: str
    metrics_addr: str


def iso_utc(t: float) -> str:
    moment = datetime.datetime.fromtimestamp(t, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def live_brokers(info: namesrv_pb2.ClusterInfo) -> list[Broker]:
    return sorted(
        (
            Broker(
                addr,
                live.cluster_name,
                live.broker_name,
                live.broker_id,
                live.broker_role,
                live.metrics_addr,
            )  # fmt: skip
            for addr, live in info.broker_live_table.items()
        ),
        key=lambda b: (b.cluster, b.broker_name, b.broker_id, b.addr),
    )


def scrape_rows(
    broker: Broker, text: str, ts: str, previous: dict[tuple, float] | None = None
) -> Iterator[dict]:
    """Rows for every sample of a /metrics page (broker identity from the
    registration, not from the page). `previous` (counter series -> last
    value) is updated, and yields the `:increase` rows."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in IDENTITY_LABELS}
            replica = sample.labels.get("replica", "")
            value = float(sample.value)
            yield _row(broker, ts, sample.name, replica, labels, value)
            if previous is None or not sample.name.endswith("_total"):
                continue
            key = (broker.addr, sample.name, tuple(sorted(sample.labels.items())))
            before = previous.get(key)
            previous[key] = value
            if before is not None:
                increase = value - before if value >= before else value
                yield _row(broker, ts, sample.name + ":increase", replica, labels, increase)


def _row(broker: Broker, ts: str, metric: str, replica: str, labels: dict, value: float) -> dict:
    return {
        "ts": ts,
        "cluster": broker.cluster,
        "broker_name": broker.broker_name,
        "broker_id": broker.broker_id,
        "role": broker.role,
        "replica": replica,
        "metric": metric,
        "labels": labels,
        "value": value,
    }


class Exporter:
    def __init__(
        self,
        namesrv: NamesrvClient,
        spool: Path,
        scrape_timeout_s: float = 2.0,
        max_spool_bytes: int = 256 << 20,
    ) -> None:
        self.namesrv = namesrv
        self.spool = spool
        self.scrape_timeout_s = scrape_timeout_s
        self.max_spool_bytes = max_spool_bytes
        self.seq = 0
        self.previous: dict[tuple, float] = {}  # counter series -> value last round
        spool.mkdir(parents=True, exist_ok=True)

    def round(self, now: float | None = None) -> tuple[Path, int, int]:
        """One scrape round: returns (file written, rows, brokers not scraped)."""
        now = time.time() if now is None else now
        ts = iso_utc(now)
        info = self.namesrv.cluster_info()
        rows: list[dict] = []
        failed = 0
        for broker in live_brokers(info):
            error = ""
            if not broker.metrics_addr:
                error = "the broker registered no metrics address (metricsPort=-1?)"
            else:
                try:
                    with urllib.request.urlopen(
                        f"http://{broker.metrics_addr}/metrics", timeout=self.scrape_timeout_s
                    ) as answer:
                        text = answer.read().decode()
                    rows.extend(scrape_rows(broker, text, ts, self.previous))
                except (OSError, urllib.error.URLError, ValueError) as exc:
                    error = f"{type(exc).__name__}: {exc}"
            if error:
                failed += 1
                log.warning("broker %s (%s): not scraped: %s", broker.broker_name, broker.addr,
                            error)  # fmt: skip
            rows.append(
                _row(
                    broker,
                    ts,
                    SCRAPE_UP,
                    "",
                    {"error": error} if error else {},
                    0.0 if error else 1.0,
                )  # fmt: skip
            )
        path = self._write(now, rows)
        self._cap()
        return path, len(rows), failed

    def _write(self, now: float, rows: list[dict]) -> Path:
        self.seq += 1
        stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y%m%dT%H%M%S%f")
        name = f"metrics-{stamp}-{self.seq:06d}.json"
        tmp = self.spool / f".{name}.tmp"
        with open(tmp, "w") as out:
            for row in rows:
                out.write(json.dumps(row, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        final = self.spool / name
        os.replace(tmp, final)
        return final

    def _cap(self) -> None:
        files = sorted(p for p in self.spool.glob("metrics-*.json"))
        sizes = {p: p.stat().st_size for p in files}
        total = sum(sizes.values())
        dropped = 0
        for path in files[:-1]:  # never the file just written
            if total <= self.max_spool_bytes:
                break
            total -= sizes[path]
            path.unlink(missing_ok=True)
            dropped += 1
        if dropped:
            log.warning(
                "spool over %d bytes: removed the %d oldest files (is the Spark job keeping up?)",
                self.max_spool_bytes,
                dropped,
            )
