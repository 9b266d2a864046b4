"""The broker's Prometheus metrics, named as docs/reference/metrics.md lists them.

Figures owned by the store, the metadata and the HA connections are read at
scrape time by a custom collector (nothing sets gauges on a timer); per-replica
lag comes from `HAMaster.replica_states()`, the same figures GetHAStatus
answers with. Events (sends, sync waits) are counted as they
happen through the small `observe_*` methods the services call.

The store collector runs on the event loop, which owns everything it reads
(`ferry.runtime.metrics_http` hands each scrape's collection to the loop), so it
iterates those tables directly; it must stay quick and never block or await.

Series (labels `cluster`, `broker_name`, `broker_id`, `role` on the store and
HA gauges, to tell brokers apart when one Prometheus scrapes them all):
- store: `ferry_commitlog_{max,min,flushed}_offset_bytes`,
  `ferry_dispatch_behind_bytes`, `ferry_broker_topics`, `ferry_broker_permission`,
  `ferry_index_files`, `ferry_index_size_bytes`, `ferry_index_behind_bytes` (the
  message index), `ferry_index_lookup_duration_seconds` (histogram),
  `ferry_broker_get_messages_total`, `ferry_consumer_lag_messages{group,topic}`;
- retention: `ferry_store_disk_used_ratio` (0..1, the store's file system),
  `ferry_store_disk_full` (1 while sends are refused),
  `ferry_store_deleted_files_total{kind}` (`commitlog`, `consumequeue`);
- sends: `ferry_broker_put_messages_total{topic,status}`,
  `ferry_broker_put_duration_seconds` (histogram);
- HA master, per slave `replica`: `ferry_ha_slave_ack_offset_bytes`,
  `ferry_ha_replication_lag_bytes`, `ferry_ha_last_ack_timestamp_seconds`,
  `ferry_ha_sent_bytes_total`; and `ferry_ha_connected_slaves`,
  `ferry_ha_sync_wait_seconds` (histogram), `ferry_ha_sync_results_total{status}`;
- HA slave: `ferry_ha_slave_max_offset_bytes`, `ferry_ha_master_offset_bytes`
  (last seen), `ferry_ha_last_read_timestamp_seconds`, `ferry_ha_slave_connected`;
- pop consumption (masters), per consumer `group`: `ferry_pop_inflight_messages`
  (handed out, not yet acknowledged or redelivered), `ferry_pop_retries_pending_messages`
  (waiting in the group's retry topics or for their backoff),
  `ferry_pop_dlq_messages` (in `%DLQ%<group>`); and `ferry_pop_redeliveries_total`,
  `ferry_pop_dead_letters_total`;
- timed delivery (masters; TIMER_DELIVER_MS messages and pop's retry copies):
  `ferry_timer_pending_messages`, `ferry_timer_delivered_total`,
  `ferry_timer_delivery_lateness_seconds` (histogram: delivery time minus due time);
- transactional messages (masters): `ferry_transaction_half_messages` (prepared,
  undecided), `ferry_transaction_commits_total`, `ferry_transaction_rollbacks_total`,
  `ferry_transaction_checks_total` (check-backs sent to a producer),
  `ferry_transaction_discarded_total` (given up after transactionCheckMax checks);
- failover's metadata log: `ferry_metadata_log_applied_records{queue}` (`topics`,
  `groups`), `ferry_metadata_log_skipped_records_total`;
- `ferry_build_info{version,service}`.

Slaves run neither pop consumption nor timers: their pop and timer families are
absent (the lateness histogram is present, without series).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import ferry
from services.broker.store import MessageStore

if TYPE_CHECKING:
    from services.broker.metadata.metadata_log import MetadataLog
    from services.broker.pop import PopService
    from services.broker.schedule.timer import TimerService
    from services.broker.transactions import TransactionService

_ID_LABELS = ["cluster", "broker_name", "broker_id", "role"]
# Sends answer in well under a millisecond, or wait for an fsync or a slave (up
# to syncFlushTimeout / slaveTimeout, seconds).
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# A timed message goes out within milliseconds of its time, or late by seconds
# when the timer falls behind (a backlog, a full disk, a SYNC_MASTER's slave).
_LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def _gauge(ids: list[str], name: str, doc: str, value: float) -> GaugeMetricFamily:
    """A gauge with one sample, labelled with the broker's identity."""
    family = GaugeMetricFamily(name, doc, labels=_ID_LABELS)
    family.add_metric(ids, value)
    return family


def _counter(ids: list[str], name: str, doc: str, value: float) -> CounterMetricFamily:
    """A counter with one sample, labelled with the broker's identity."""
    family = CounterMetricFamily(name, doc, labels=_ID_LABELS)
    family.add_metric(ids, value)
    return family


class BrokerStateCollector(Collector):
    """The store, metadata, HA, pop and timer figures, read at scrape time.
    Registered once every part it reads exists (the app's last step)."""

    def __init__(
        self,
        store: MessageStore,
        metadata,
        permission: Callable[[], int],
        config,
        ha: Callable[[], tuple[object | None, object | None]],
        pop: PopService | None = None,
        timer: TimerService | None = None,
        journal: MetadataLog | None = None,
        transactions: TransactionService | None = None,
    ) -> None:
        self.journal = journal  # failover only
        self.transactions = transactions  # None on a slave
        self.store = store
        self.metadata = metadata
        self.permission = permission
        self.ha = ha  # -> (HAMaster or None, HASlave or None)
        self.pop = pop  # None on a slave, as is the timer
        self.timer = timer
        self.ids = [config.cluster_name, config.broker_name, str(config.broker_id)]
        self.role = config.broker_role

    def collect(self) -> Iterable[Metric]:
        ids = [*self.ids, self.role]
        store = self.store

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return _gauge(ids, name, doc, value)

        yield gauge(
            "ferry_commitlog_max_offset_bytes",
            "Commit offset just past the last record written.",
            store.max_offset,
        )
        yield gauge(
            "ferry_commitlog_min_offset_bytes",
            "Commit offset of the oldest commit-log file.",
            store.min_offset,
        )
        yield gauge(
            "ferry_commitlog_flushed_offset_bytes",
            "Commit offset below which the commit log is fsynced.",
            store.flushed_offset,
        )
        yield gauge(
            "ferry_dispatch_behind_bytes",
            "Commit-log bytes not yet in consume queues.",
            store.dispatch_behind_bytes,
        )
        index_files, index_bytes = store.index_files
        yield gauge("ferry_index_files", "Message index files (index/).", index_files)
        yield gauge(
            "ferry_index_size_bytes",
            "Bytes of the message index files (their length; they are sparse).",
            index_bytes,
        )
        yield gauge(
            "ferry_index_behind_bytes",
            "Commit-log bytes not yet in the message index.",
            store.index_behind_bytes,
        )
        gets = CounterMetricFamily(
            "ferry_broker_get_messages", "Messages returned to consumers.", labels=_ID_LABELS
        )
        gets.add_metric(ids, store.get_message_count)
        yield gets
        topics, _ = self.metadata.topics.snapshot()
        yield gauge("ferry_broker_topics", "Topics in the broker's topic table.", len(topics))
        yield gauge(
            "ferry_broker_permission",
            "brokerPermission (6 read-write, 4 read-only, 2 write-only).",
            self.permission(),
        )
        yield self._consumer_lag(ids)
        yield from self._retention(ids)
        yield from self._ha(ids)
        yield from self._pop(ids)
        yield from self._timer(ids)
        yield from self._transactions(ids)
        yield from self._metadata_log(ids)
        build = GaugeMetricFamily(
            "ferry_build_info", "ferry version.", labels=["version", "component"]
        )
        build.add_metric([ferry.__version__, "broker"], 1)
        yield build

    def _consumer_lag(self, ids: list[str]) -> Metric:
        """Messages not yet consumed per group and topic: the queues' max
        offsets minus the group's committed offsets, summed over queues."""
        family = GaugeMetricFamily(
            "ferry_consumer_lag_messages",
            "Messages in a topic's queues past the group's committed offsets.",
            labels=[*_ID_LABELS, "group", "topic"],
        )
        offsets, _ = self.metadata.consumer_offsets.snapshot()
        for key, queues in sorted(offsets.items()):
            topic, _, group = key.partition("@")
            lag = sum(
                max(0, self.store.queue_max_offset(topic, queue_id) - offset)
                for queue_id, offset in queues.items()
            )
            family.add_metric([*ids, group, topic], lag)
        return family

    def _retention(self, ids: list[str]) -> Iterable[Metric]:
        retention = self.store.retention_status()
        yield _gauge(
            ids,
            "ferry_store_disk_used_ratio",
            "Used fraction of the file system holding the store (0..1, as df counts it).",
            retention.disk_used_ratio,
        )
        yield _gauge(
            ids,
            "ferry_store_disk_full",
            "1 while the disk is above diskSpaceWarningLevelRatio and sends are refused.",
            1 if retention.disk_full else 0,
        )
        deleted = CounterMetricFamily(
            "ferry_store_deleted_files",
            "Files deleted by retention since the broker started, by kind.",
            labels=[*_ID_LABELS, "kind"],
        )
        deleted.add_metric([*ids, "commitlog"], retention.deleted_files_total)
        deleted.add_metric([*ids, "consumequeue"], retention.deleted_queue_files_total)
        yield deleted

    def _pop(self, ids: list[str]) -> Iterable[Metric]:
        pop = self.pop
        if pop is None:
            return
        labels = [*_ID_LABELS, "group"]
        inflight = GaugeMetricFamily(
            "ferry_pop_inflight_messages",
            "Messages handed out to the group, not yet acknowledged (nor moved to retry or DLQ).",
            labels=labels,
        )
        retries = GaugeMetricFamily(
            "ferry_pop_retries_pending_messages",
            "Unacknowledged messages of the group waiting for their backoff or a consumer.",
            labels=labels,
        )
        dlq = GaugeMetricFamily(
            "ferry_pop_dlq_messages", "Messages in the group's %DLQ% topic.", labels=labels
        )
        for group, (in_flight, pending, dead) in sorted(pop.snapshot().items()):
            key = [*ids, group]
            inflight.add_metric(key, in_flight)
            retries.add_metric(key, pending)
            dlq.add_metric(key, dead)
        yield from (inflight, retries, dlq)
        yield _counter(
            ids,
            "ferry_pop_redeliveries",
            "Unacknowledged messages redelivered (copied to a retry topic, or re-queued in order).",
            pop.redeliveries,
        )
        yield _counter(
            ids,
            "ferry_pop_dead_letters",
            "Messages moved to a %DLQ% topic after retry_max_times redeliveries.",
            pop.dead_letters,
        )

    def _metadata_log(self, ids: list[str]) -> Iterable[Metric]:
        journal = self.journal
        if journal is None:
            return
        applied = GaugeMetricFamily(
            "ferry_metadata_log_applied_records",
            "Records of the failover metadata log (queue topics or groups) this broker's "
            "tables include: equal on a master and its caught-up slaves.",
            labels=[*_ID_LABELS, "queue"],
        )
        for queue_id, name in ((0, "topics"), (1, "groups")):
            applied.add_metric([*ids, name], journal.position(queue_id))
        yield applied
        yield _counter(
            ids,
            "ferry_metadata_log_skipped_records",
            "Metadata-log records this broker could not read or decode, and skipped.",
            journal.bad_records,
        )

    def _timer(self, ids: list[str]) -> Iterable[Metric]:
        timer = self.timer
        if timer is None:
            return
        yield _gauge(
            ids,
            "ferry_timer_pending_messages",
            "Timed messages (and pop retry copies) waiting for their time.",
            timer.pending,
        )
        delivered = CounterMetricFamily(
            "ferry_timer_delivered",
            "Timed messages (and pop retry copies) delivered since the broker started.",
            labels=_ID_LABELS,
        )
        delivered.add_metric(ids, timer.delivered)
        yield delivered

    def _transactions(self, ids: list[str]) -> Iterable[Metric]:
        service = self.transactions
        if service is None:
            return
        yield _gauge(
            ids,
            "ferry_transaction_half_messages",
            "Transactional half messages prepared and not yet committed, rolled back or discarded.",
            service.pending_count,
        )
        counts = service.counts
        yield _counter(
            ids,
            "ferry_transaction_commits",
            "Transactions committed (delivered to their topic).",
            counts["commit"],
        )
        yield _counter(
            ids,
            "ferry_transaction_rollbacks",
            "Transactions rolled back (never delivered).",
            counts["rollback"],
        )
        yield _counter(
            ids,
            "ferry_transaction_checks",
            "Check-backs (CHECK_TRANSACTION_STATE) sent to a producer.",
            counts["check"],
        )
        yield _counter(
            ids,
            "ferry_transaction_discarded",
            "Transactions discarded after transactionCheckMax check-backs without a decision.",
            counts["discard"],
        )

    def _ha(self, ids: list[str]) -> Iterable[Metric]:
        master, slave = self.ha()
        if master is not None:
            labels = [*_ID_LABELS, "replica"]
            ack = GaugeMetricFamily(
                "ferry_ha_slave_ack_offset_bytes",
                "Highest commit offset the slave reported.",
                labels=labels,
            )
            lag = GaugeMetricFamily(
                "ferry_ha_replication_lag_bytes",
                "Master max offset minus the slave's ack offset (GetHAStatus diff).",
                labels=labels,
            )
            last = GaugeMetricFamily(
                "ferry_ha_last_ack_timestamp_seconds",
                "When the slave last reported (Unix time).",
                labels=labels,
            )
            states = master.replica_states()  # type: ignore[attr-defined]
            for state in states:
                key = [*ids, state.conn.label]
                ack.add_metric(key, state.conn.ack_offset)
                lag.add_metric(key, state.lag)
                last.add_metric(key, state.conn.last_ack_ms / 1000)
            sent = CounterMetricFamily(
                "ferry_ha_sent_bytes",
                "Commit-log bytes streamed to a slave (all its connections).",
                labels=labels,
            )
            for replica, total in sorted(dict(master.sent_bytes).items()):  # type: ignore[attr-defined]
                sent.add_metric([*ids, replica], total)
            connected = _gauge(
                ids, "ferry_ha_connected_slaves", "Slaves connected to this master.", len(states)
            )
            yield from (ack, lag, last, sent, connected)
        if slave is not None:
            yield _gauge(
                ids, "ferry_ha_slave_max_offset_bytes", "This slave's commit-log end.",
                self.store.max_offset,
            )  # fmt: skip
            yield _gauge(
                ids, "ferry_ha_master_offset_bytes",
                "The master's offset as last seen in its stream.", slave.master_max_offset,
            )  # fmt: skip
            yield _gauge(
                ids, "ferry_ha_last_read_timestamp_seconds",
                "When bytes last came from the master (Unix time).", slave.last_read_ms / 1000,
            )  # fmt: skip
            yield _gauge(
                ids, "ferry_ha_slave_connected", "1 while connected to the master.",
                1 if slave.connected else 0,
            )  # fmt: skip


class BrokerMetrics:
    """The events the services report as they happen (`observe_*`), built
    before the services so that each gets its observer through its
    constructor."""

    def __init__(self, registry: CollectorRegistry, config, timed: bool = False) -> None:
        """`timed`: this broker runs timed delivery (a master): its lateness
        histogram has a series from the start (empty on slaves)."""
        self.ids = [config.cluster_name, config.broker_name, str(config.broker_id)]
        self._puts = Counter(
            "ferry_broker_put_messages",
            "Messages sent to this broker, by topic and send status.",
            ["cluster", "broker_name", "broker_id", "topic", "status"],
            registry=registry,
        )
        ids = ["cluster", "broker_name", "broker_id"]

        def latency(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ids, buckets=_LATENCY_BUCKETS, registry=registry)

        self._put_seconds = latency(
            "ferry_broker_put_duration_seconds",
            "Time to answer a send that stored its messages: a SendMessage or SendMessages "
            "call, or a message of a SendStream (from its append).",
        )
        self._put_counts: dict[tuple[str, str], Any] = {}
        self._put_latency: Any = None
        self._sync_seconds = latency(
            "ferry_ha_sync_wait_seconds", "Time a SYNC_MASTER send waited for a slave."
        )
        self._sync_results = Counter(
            "ferry_ha_sync_results",
            "SYNC_MASTER waits by outcome (SEND_OK, FLUSH_SLAVE_TIMEOUT, SLAVE_NOT_AVAILABLE).",
            ["cluster", "broker_name", "broker_id", "status"],
            registry=registry,
        )
        self._lookup_seconds = Histogram(
            "ferry_index_lookup_duration_seconds",
            "Time to find messages by key or unique key (index walk and record checks).",
            ids,
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self._lookup_seconds.labels(*self.ids)
        self._timer_lateness = Histogram(
            "ferry_timer_delivery_lateness_seconds",
            "How long after its due time (TIMER_DELIVER_MS, a retry's backoff) each timed message "
            "was delivered.",
            ids,
            buckets=_LATENESS_BUCKETS,
            registry=registry,
        )
        if timed:  # a series from the start on masters, empty on slaves
            self._timer_lateness.labels(*self.ids)

    def observe_send(
        self, topic: str, status: str, messages: int, seconds: float, sends: int = 1
    ) -> None:
        """`sends` sends of `messages` messages in all, each answered after `seconds`."""
        # Per message on a send stream: labelled children looked up once, not per call.
        puts = self._put_counts.get((topic, status))
        if puts is None:
            puts = self._put_counts[(topic, status)] = self._puts.labels(*self.ids, topic, status)
        puts.inc(messages)
        if self._put_latency is None:
            self._put_latency = self._put_seconds.labels(*self.ids)
        if sends == 1:
            self._put_latency.observe(seconds)
        else:
            observe_many(self._put_latency, seconds, sends)

    def observe_lookup(self, seconds: float) -> None:
        self._lookup_seconds.labels(*self.ids).observe(seconds)

    def observe_sync(self, status: str, seconds: float) -> None:
        self._sync_results.labels(*self.ids, status).inc()
        self._sync_seconds.labels(*self.ids).observe(seconds)

    def observe_timer_delivery(self, lateness_s: float) -> None:
        """the timer's DeliveryObserver: a timed message delivered `lateness_s` after its time."""
        self._timer_lateness.labels(*self.ids).observe(lateness_s)


def observe_many(histogram: Any, amount: float, n: int) -> None:
    """`histogram.observe(amount)` n times, in one step: a run of sends answered
    together observes one latency for each. (prometheus_client has no weighted
    observe; this updates the sum and the one bucket as `observe` does, on the
    pinned version's fields, which tests/unit/test_metrics_observe_many.py holds
    equal.)"""
    histogram._raise_if_not_observable()
    histogram._sum.inc(amount * n)
    for i, bound in enumerate(histogram._upper_bounds):
        if amount <= bound:
            histogram._buckets[i].inc(n)
            break
