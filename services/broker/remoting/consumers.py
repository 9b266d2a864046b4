"""Clients and their groups over RocketMQ's protocol: HEART_BEAT (34),
UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38), CHECK_CLIENT_CONFIG
(46), LOCK_BATCH_MQ / UNLOCK_BATCH_MQ (41 / 42), and the broker's own oneway
NOTIFY_CONSUMER_IDS_CHANGED (40) to every member of a group whose members or
subscriptions changed — on a heartbeat, an unregistration, a closed channel
or a member silent for 120 s.

The tables are the domain's (`Deps.clients`, `Deps.locks`: messaging/clients.py
and messaging/locks.py); the connection is this adapter's, handed to them as
an opaque channel. `connection_closed(deps)` is the RemotingServer's
`on_close`, `housekeeping(deps)` the task that expires silent clients (each
heartbeat and member-list request also expires what is due).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ferry.remoting import bodies, codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime import errors
from services.broker.messaging.clients import SQL92, TAG, ConsumerData, Subscription
from services.broker.messaging.filters import PropertyFilterOff, SelectorRefused
from services.broker.messaging.locks import QueueKey
from services.broker.remoting import convert
from services.broker.remoting.deps import Deps

log = logging.getLogger(__name__)

HOUSEKEEPING_INTERVAL_S = 10.0  # RocketMQ's ClientHousekeepingService period
PUSH = "CONSUME_PASSIVELY"  # a heartbeat's consumeType of push consumers
# A heartbeat answer's header (MixAll's names): the broker takes heartbeat v2, and
# whether the client must send its subscriptions in full next time.
IS_SUPPORT_HEART_BEAT_V2 = "IS_SUPPORT_HEART_BEAT_V2"
IS_SUB_CHANGE = "IS_SUB_CHANGE"


def handlers(deps: Deps) -> dict[int, Handler]:
    async def heart_beat(connection: Connection, command: Command) -> Command:
        deps.gate.check()
        client_id, consumers, producer_groups = parse_heartbeat(command.body)
        now = deps.clock.monotonic()
        sub_change = _sub_change(deps, client_id, consumers)
        joining = {
            data.group
            for data in consumers
            if data.consume_type == PUSH and not deps.clients.is_member(data.group, client_id)
        }
        changed = deps.clients.heartbeat(
            client_id,
            connection,
            now,
            consumers,
            producer_groups,
            command.language,
            command.version,
        )
        for data in consumers:
            try:
                await deps.send_back.ensure_retry_topic(data.group)  # type: ignore[union-attr]
            except errors.FerryError as e:
                log.warning("could not create the retry topic of group %s: %s", data.group, e)
        for group in changed:
            if _notify_enabled(deps, group):
                # A push consumer that joins its group is not told of its own arrival:
                # RocketMQ's push consumers (4.x, 5.x, Go) rebalance by themselves once
                # their start has sent a heartbeat to every broker. Told here, as Apache
                # tells it, its rebalance ran while its heartbeats to the other masters
                # were still on their way, looked up its retry topic before those
                # masters had created it, and missed their retry queues until its next
                # route poll, 30 s later (rocketmq-e2e's PushConsumerRetryTest: a first
                # retry due after 10 s came after 40). Apache wins that race by speed
                # mostly; a lite pull consumer, which does not rebalance at its start,
                # is told as before, and so is every other member of the group.
                notify(deps, [group], skip=connection if group in joining else None)
        sweep(deps)
        return command.answer(
            codes.SUCCESS,
            ext={
                IS_SUPPORT_HEART_BEAT_V2: "true",
                IS_SUB_CHANGE: "true" if sub_change else "false",
            },
        )

    async def unregister_client(connection: Connection, command: Command) -> Command:
        ext = command.ext
        changed = deps.clients.unregister(
            convert.text(ext, "clientID"),
            convert.text(ext, "producerGroup", required=False),
            convert.text(ext, "consumerGroup", required=False),
        )
        notify(deps, [g for g in changed if _notify_enabled(deps, g)])
        return command.answer(codes.SUCCESS)

    async def consumer_list(connection: Connection, command: Command) -> Command:
        group = convert.text(command.ext, "consumerGroup")
        sweep(deps)
        ids = deps.clients.consumer_ids(group)
        if not ids:
            return command.answer(codes.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return command.answer(codes.SUCCESS, body=bodies.dumps({"consumerIdList": ids}))

    async def check_client_config(connection: Connection, command: Command) -> Command:
        """What a consumer with an SQL92 subscription asks at start (Apache's
        checkClientConfig): refused with 1 when the broker does not serve SQL92
        (enablePropertyFilter=false), with 23 and the reason when the selector
        does not compile; a tag subscription is always fine."""
        if not command.body:
            return command.answer(codes.SUCCESS)
        doc = _object(bodies.loads(command.body), "body")
        sub = doc.get("subscriptionData")
        if isinstance(sub, dict):
            kind = str(sub.get("expressionType") or TAG)
            if kind.upper() == TAG:
                return command.answer(codes.SUCCESS)
            filters = deps.pulls.filters
            if not filters.property_filter:
                return command.answer(codes.SYSTEM_ERROR, PropertyFilterOff(kind).message)
            try:
                filters.build(str(sub.get("subString") or ""), kind)
            except SelectorRefused as e:
                return command.answer(
                    codes.SUBSCRIPTION_PARSE_FAILED, f"the SQL92 selector does not compile: {e.why}"
                )
        return command.answer(codes.SUCCESS)

    async def lock_batch(connection: Connection, command: Command) -> Command:
        group, client_id, queues = parse_lock_body(command.body)
        held = deps.locks.lock(group, client_id, connection, queues, deps.clock.monotonic())
        body = {"lockOKMQSet": [_queue_json(q) for q in held]}
        return command.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def unlock_batch(connection: Connection, command: Command) -> Command:
        group, client_id, queues = parse_lock_body(command.body)
        deps.locks.unlock(group, client_id, queues)
        return command.answer(codes.SUCCESS)

    table = {
        codes.HEART_BEAT: heart_beat,
        codes.UNREGISTER_CLIENT: unregister_client,
        codes.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
        codes.CHECK_CLIENT_CONFIG: check_client_config,
        codes.LOCK_BATCH_MQ: lock_batch,
        codes.UNLOCK_BATCH_MQ: unlock_batch,
    }
    return {code: convert.answering_errors(fn) for code, fn in table.items()}


def _sub_change(deps: Deps, client_id: str, consumers: list[ConsumerData]) -> bool:
    """Heartbeat v2's IS_SUB_CHANGE: whether the client must send its subscriptions
    in full next time. Always for a v1 heartbeat (as Apache answers); for a v2 one,
    when its group's fingerprint changed (Apache's rule), and — where ferry asks more
    than Apache — when it left its subscriptions out for a group this broker has no
    member of it in (a restarted broker, a closed connection): Apache then keeps the
    member without subscriptions until its fingerprint changes."""
    change = False
    for data in consumers:
        changed = deps.clients.fingerprint_changed(data.group, data.fingerprint)
        unknown = data.without_sub and not deps.clients.is_member(data.group, client_id)
        change = change or changed or unknown or data.fingerprint == 0
    return change


# ---------------------------------------------------------------- membership events


def notify(deps: Deps, groups: Iterable[str], skip: Connection | None = None) -> None:
    """Tell every member of each group, but the one on `skip`, that its
    membership changed (NOTIFY_CONSUMER_IDS_CHANGED, oneway): they rebalance
    at once."""
    for group in groups:
        for channel in deps.clients.channels(group):
            if isinstance(channel, Connection) and channel.is_open and channel is not skip:
                channel.oneway(
                    Command(
                        codes.NOTIFY_CONSUMER_IDS_CHANGED,
                        ext={"consumerGroup": group},
                        language="JAVA",
                    )
                )


def sweep(deps: Deps) -> None:
    """Expire what is due now: silent clients (their groups are told, their
    channels closed, as RocketMQ closes them) and dead locks."""
    now = deps.clock.monotonic()
    expired = deps.clients.expire(now)
    for channel in expired.channels:
        log.info("client channel %s silent for %.0f s: closing it",
                 getattr(channel, "remote", channel), deps.clients.expire_after_s)  # fmt: skip
        deps.locks.channel_closed(channel)
        if isinstance(channel, Connection):
            channel.close()
    deps.locks.expire(now)
    notify(deps, expired.groups)


def connection_closed(deps: Deps) -> Callable[[Connection], None]:
    """The RemotingServer's `on_close`: a closed channel's registrations and
    locks are gone, and its groups' remaining members are told."""

    def closed(connection: Connection) -> None:
        changed = deps.clients.channel_closed(connection)
        deps.locks.channel_closed(connection)
        notify(deps, changed)

    return closed


async def housekeeping(deps: Deps, interval_s: float = HOUSEKEEPING_INTERVAL_S) -> None:
    """Run `sweep` every `interval_s` until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            sweep(deps)
        except Exception:  # keep sweeping; the next round retries
            log.exception("client housekeeping failed")


def _notify_enabled(deps: Deps, group: str) -> bool:
    config = deps.metadata.subscription_groups.get(group)
    return config is None or config.notify_consumer_ids_changed_enable


# ---------------------------------------------------------------- bodies


def parse_heartbeat(body: bytes) -> tuple[str, list[ConsumerData], list[str]]:
    """HeartbeatData: `{"clientID", "consumerDataSet": [...], "producerDataSet":
    [{"groupName"}]}`, 5.x's `heartbeatFingerprint` and `withoutSub` (heartbeat v2,
    carried by each ConsumerData) → (client id, consumer groups, producer groups).

    Raises:
        BodyError: not JSON; BadRequest: a field missing or of the wrong type.
    """
    doc = _object(bodies.loads(body), "heartbeat body")
    client_id = _string(doc, "clientID", "heartbeat")
    fingerprint = doc.get("heartbeatFingerprint", 0)
    if not _is_int(fingerprint):
        raise convert.BadRequest("heartbeatFingerprint", f"{fingerprint!r} is not an integer")
    without_sub = doc.get("withoutSub") is True
    consumers = []
    for i, item in enumerate(_list(doc, "consumerDataSet")):
        where = f"consumerDataSet[{i}]"
        item = _object(item, where)
        subs = []
        for j, sub in enumerate(_list(item, "subscriptionDataSet")):
            subs.append(parse_subscription(_object(sub, f"{where}.subscriptionDataSet[{j}]")))
        consumers.append(
            ConsumerData(
                _string(item, "groupName", where),
                tuple(subs),
                str(item.get("consumeType") or "CONSUME_PASSIVELY"),
                str(item.get("messageModel") or "CLUSTERING"),
                str(item.get("consumeFromWhere") or "CONSUME_FROM_LAST_OFFSET"),
                fingerprint,
                without_sub and fingerprint != 0,
            )
        )
    producers = [
        _string(_object(item, f"producerDataSet[{i}]"), "groupName", f"producerDataSet[{i}]")
        for i, item in enumerate(_list(doc, "producerDataSet"))
    ]
    return client_id, consumers, producers


def parse_subscription(doc: Mapping[str, Any]) -> Subscription:
    """SubscriptionData: topic, subString, expressionType (TAG when absent),
    tagsSet, codeSet, subVersion."""
    topic = _string(doc, "topic", "subscriptionData")
    kind = str(doc.get("expressionType") or TAG).upper()
    if kind not in (TAG, SQL92):
        raise convert.BadRequest("expressionType", f"{kind[:20]!r} is neither TAG nor SQL92")
    tags = doc.get("tagsSet") or []
    code_set = doc.get("codeSet") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise convert.BadRequest("tagsSet", f"of topic {topic} is not a list of strings")
    if not isinstance(code_set, list) or not all(_is_int(c) for c in code_set):
        raise convert.BadRequest("codeSet", f"of topic {topic} is not a list of integers")
    version = doc.get("subVersion", 0)
    if not _is_int(version):
        raise convert.BadRequest("subVersion", f"of topic {topic} is not an integer")
    return Subscription(
        topic,
        str(doc.get("subString") or "*"),
        kind,
        tuple(tags),
        tuple(int(c) for c in code_set),
        int(version),
    )


def parse_lock_body(body: bytes) -> tuple[str, str, list[QueueKey]]:
    """LockBatchRequestBody / UnlockBatchRequestBody: `{"consumerGroup",
    "clientId", "mqSet": [{"topic", "brokerName", "queueId"}]}`."""
    doc = _object(bodies.loads(body), "lock body")
    group = _string(doc, "consumerGroup", "lock body")
    client_id = _string(doc, "clientId", "lock body")
    queues = []
    for i, item in enumerate(_list(doc, "mqSet")):
        where = f"mqSet[{i}]"
        item = _object(item, where)
        queue_id = item.get("queueId")
        if not _is_int(queue_id):
            raise convert.BadRequest(f"{where}.queueId", f"{queue_id!r} is not an integer")
        queues.append(
            QueueKey(_string(item, "topic", where), _string(item, "brokerName", where), queue_id)
        )
    return group, client_id, queues


def _queue_json(queue: QueueKey) -> dict[str, Any]:
    # fastjson's order: keys sorted
    return {"brokerName": queue.broker_name, "queueId": queue.queue_id, "topic": queue.topic}


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise convert.BadRequest(where, f"is a JSON {type(value).__name__}, not an object")
    return value


def _list(doc: Mapping[str, Any], key: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise convert.BadRequest(key, f"is a JSON {type(value).__name__}, not an array")
    return value


def _string(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise convert.BadRequest(f"{where}.{key}", "missing or not a non-empty string")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
