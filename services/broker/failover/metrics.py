"""The failover node's own series (`ferry_ha_*`), labelled with the member's
cluster, broker name and id, in the node's registry (which outlives the
runs of the app; /metrics serves it with the running app's).

Owns the names, help texts and labels of these series. Must never compute a
value itself: the node sets them, and `ferry_ha_fenced` reads the fence at
scrape time.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class FailoverMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        cluster: str,
        broker_name: str,
        member_id: int,
        fenced: Callable[[], bool],
    ) -> None:
        """`fenced`: whether this member, as master, holds back acknowledgements."""
        labels = (cluster, broker_name, str(member_id))

        def series(kind, name: str, doc: str):
            ids = ("cluster", "broker_name", "member")
            return kind(name, doc, ids, registry=registry).labels(*labels)

        self.epoch = series(
            Gauge,
            "ferry_ha_epoch",
            "The leader epoch this member leads or follows (0: none known yet).",
        )
        self.failovers = series(
            Counter,
            "ferry_ha_failovers_total",
            "Elections this member won after another master (a failover to it).",
        )
        self.leader = series(
            Gauge, "ferry_ha_leader", "1 while this member is its group's elected master."
        )
        self.leader_changes = series(
            Counter,
            "ferry_ha_leader_changes_total",
            "Leaders this member has seen take over its group (its own elections included).",
        )
        self.in_sync_replicas = series(
            Gauge,
            "ferry_ha_in_sync_replicas",
            "Members of the published in-sync set, the master included (as its master sees it).",
        )
        self.fenced = series(
            Gauge,
            "ferry_ha_fenced",
            "1 while this master holds back acknowledgements (its lease may be expiring).",
        )
        self.fenced.set_function(lambda: 1 if fenced() else 0)
