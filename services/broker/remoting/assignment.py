"""RocketMQ 5's server-side assignment over RocketMQ's protocol, as Apache
5.5.0's broker answers it: QUERY_ASSIGNMENT (400), SET_MESSAGE_REQUEST_MODE
(401) and GET_ALL_MESSAGE_REQUEST_MODE (402).

A 5.x push consumer with `clientRebalance=false` does not divide a topic's
queues itself: it asks one broker of the route (400) which queues are its own
and how to consume them. PULL: a share of the route's queues, divided among
the group's consumers connected to this broker by the client's strategy (AVG
or AVG_BY_CIRCLE, Apache's two); the consumer pulls them (11) as a 4.x one.
POP: one queue id -1 per broker (pop every queue there) for every consumer, or,
with a `popShareQueueNum` n > 0 smaller than the group less one, its own share
and the next n consumers' shares; the consumer pops (200050). The mode of a
(topic, group) is what `mqadmin setConsumeMode` set (401, kept in
messageRequestMode.json), else the broker's `defaultMessageRequestMode`
(PULL); a `%RETRY%` topic is always PULL, as on Apache.

Bodies are fastjson's (keys sorted). A query Apache would answer without an
assignment (an unknown strategy, a group with no consumer here, a topic nobody
routes) is answered 0 with `{}`, as Apache's, and the client keeps what it has.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ferry.model import RETRY_TOPIC_PREFIX, SubscriptionGroupConfig
from ferry.remoting import bodies, codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from services.broker.metadata.tables import REQUEST_MODES, RequestMode
from services.broker.remoting import convert
from services.broker.remoting.deps import Deps

log = logging.getLogger(__name__)

Queue = tuple[str, int]  # (broker name, queue id)
STRATEGIES = ("AVG", "AVG_BY_CIRCLE")
POP_ALL_QUEUES = -1  # a POP assignment's queue id: every queue of that broker


def handlers(deps: Deps) -> dict[int, Handler]:
    async def query(connection: Connection, command: Command) -> Command:
        doc = _object(bodies.loads(command.body), "QueryAssignmentRequestBody")
        topic = _string(doc, "topic")
        group = _string(doc, "consumerGroup")
        client_id = _string(doc, "clientId")
        strategy = str(doc.get("strategyName") or "AVG")
        model = str(doc.get("messageModel") or "CLUSTERING")
        mode = mode_of(deps, topic, group)
        queues = await _route_queues(deps, topic)
        assigned = assign(
            queues,
            deps.clients.consumer_ids(group),
            client_id,
            strategy,
            model,
            mode,
        )
        if assigned is None:
            return command.answer(codes.SUCCESS, body=b"{}")
        body = {
            "messageQueueAssignments": [
                {
                    "messageQueue": {"brokerName": name, "queueId": qid, "topic": topic},
                    "mode": mode.mode,
                }
                for name, qid in assigned
            ]
        }
        return command.answer(codes.SUCCESS, body=bodies.dumps(body))

    async def set_mode(connection: Connection, command: Command) -> Command:
        doc = _object(bodies.loads(command.body), "SetMessageRequestModeRequestBody")
        topic = _string(doc, "topic")
        group = _string(doc, "consumerGroup")
        mode = str(doc.get("mode") or "PULL")
        share = doc.get("popShareQueueNum", 0)
        if mode not in REQUEST_MODES:
            raise convert.BadRequest("mode", f"{mode[:20]!r} is neither PULL nor POP")
        if not isinstance(share, int) or isinstance(share, bool):
            raise convert.BadRequest("popShareQueueNum", f"{share!r} is not an integer")
        if topic.startswith(RETRY_TOPIC_PREFIX):
            return command.answer(codes.NO_PERMISSION, "retry topic is not allowed to set mode")
        if deps.metadata.topics.get(topic) is None:
            return command.answer(codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        if not await _group_exists(deps, group):
            return command.answer(
                codes.SUBSCRIPTION_GROUP_NOT_EXIST, "subscription group does not exist"
            )
        log.info(
            "SET_MESSAGE_REQUEST_MODE %s/%s: %s (popShareQueueNum %d) from %s",
            topic, group, mode, share, connection.remote,
        )  # fmt: skip
        deps.metadata.request_modes.put(RequestMode(topic, group, mode, share))
        return command.answer(codes.SUCCESS)

    async def all_modes(connection: Connection, command: Command) -> Command:
        return command.answer(
            codes.SUCCESS, body=bodies.dumps(deps.metadata.request_modes.as_json())
        )

    table = {
        codes.QUERY_ASSIGNMENT: query,
        codes.SET_MESSAGE_REQUEST_MODE: set_mode,
        codes.GET_ALL_MESSAGE_REQUEST_MODE: all_modes,
    }
    return {code: convert.answering_errors(fn, deps.gate) for code, fn in table.items()}


def mode_of(deps: Deps, topic: str, group: str) -> RequestMode:
    """The mode set for (topic, group), else the broker's default; PULL for a retry topic."""
    if topic.startswith(RETRY_TOPIC_PREFIX):
        return RequestMode(topic, group, "PULL")
    found = deps.metadata.request_modes.get(topic, group)
    if found is not None:
        return found
    config = deps.config
    if config.default_message_request_mode == "POP":
        return RequestMode(topic, group, "POP", config.default_pop_share_queue_num)
    return RequestMode(topic, group, "PULL")


async def _route_queues(deps: Deps, topic: str) -> list[Queue] | None:
    """The route's readable queues (every broker's); this broker's own when no name
    server answers (a broker started without namesrvAddr)."""
    if deps.routes is not None:
        found = await deps.routes.queues(topic)
        if found is not None:
            return found
    config = deps.metadata.topics.get(topic)
    if config is None:
        return None
    return [(deps.config.broker_name, qid) for qid in range(config.read_queue_nums)]


async def _group_exists(deps: Deps, group: str) -> bool:
    """The group exists or, with autoCreateSubscriptionGroup on a master, is created
    with its defaults (Apache's findSubscriptionGroupConfig)."""
    if deps.metadata.subscription_groups.get(group) is not None:
        return True
    if not deps.config.auto_create_subscription_group or deps.pop is None:
        return False
    await deps.admin.update_group(SubscriptionGroupConfig(group_name=group))
    return True


def assign(
    queues: Sequence[Queue] | None,
    consumers: Sequence[str],
    client_id: str,
    strategy: str,
    model: str,
    mode: RequestMode,
) -> list[Queue] | None:
    """The queues `client_id` is given; None where Apache gives no assignment."""
    if queues is None:
        return None
    every = sorted(set(queues))
    if model == "BROADCASTING":
        return every
    cids = sorted(set(consumers))
    if not cids or strategy not in STRATEGIES:
        return None
    if mode.mode == "POP":
        return _allocate_for_pop(every, cids, client_id, strategy, mode.pop_share_queue_num)
    return _allocate(every, cids, client_id, strategy)


def _allocate(queues: Sequence[Queue], cids: Sequence[str], cid: str, strategy: str) -> list[Queue]:
    """RocketMQ's AVG (contiguous blocks, the first `len % n` consumers one more) or
    AVG_BY_CIRCLE (every n-th queue); nothing for a client that is not a member."""
    if cid not in cids or not queues:
        return []
    index, n, total = cids.index(cid), len(cids), len(queues)
    if strategy == "AVG_BY_CIRCLE":
        return [q for i, q in enumerate(queues) if i % n == index]
    extra = total % n
    size = 1 if total <= n else total // n + (1 if index < extra else 0)
    start = index * size if index < extra else index * size + extra
    return [queues[(start + i) % total] for i in range(max(0, min(size, total - start)))]


def _allocate_for_pop(
    queues: Sequence[Queue], cids: Sequence[str], cid: str, strategy: str, share: int
) -> list[Queue]:
    if share <= 0 or share >= len(cids) - 1:
        brokers = sorted({name for name, _ in queues})
        return [(name, POP_ALL_QUEUES) for name in brokers]
    if cid not in cids:
        return []
    if len(cids) > len(queues):
        return [queues[cids.index(cid) % len(queues)]]
    index = cids.index(cid)
    mine: list[Queue] = []
    for step in range(share + 1):
        other = cids[(index + step) % len(cids)]
        for q in _allocate(queues, cids, other, strategy):
            if q not in mine:
                mine.append(q)
    return mine


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise convert.BadRequest(where, f"is a JSON {type(value).__name__}, not an object")
    return value


def _string(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise convert.BadRequest(key, "missing or not a non-empty string")
    return value
