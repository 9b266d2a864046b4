"""RocketMQ 5's pop queries over RocketMQ's protocol, as Apache 5.5.0's broker
answers them: PEEK_MESSAGE (200052), NOTIFICATION (200054) and POLLING_INFO
(200055). None of them takes a message or moves an offset.

- PEEK reads up to `maxMsgNums` records of a queue (or, with queue id -1, of
  the group's pop retry topic and then every queue) from the group's committed
  offset (the queue's first message when it has none) and answers them as a
  pop answers, back to back: 0 "FOUND", or 19 PULL_NOT_FOUND when there is
  nothing to see.
- NOTIFICATION says whether a pop would find a message (`hasMsg`), waiting
  up to `pollTime` for one to arrive, bounded by `bornTime + pollTime`: what
  Apache's proxy asks before it pops for a long-polling client.
- POLLING_INFO says how many pops of (group, topic, queue id) wait for a
  message now (`pollingNum`).

Refusals, as Apache's: 16 on a broker or topic that may not be read, 17 for an
unknown topic, 1 SYSTEM_ERROR for a queue id out of range, 26 for a group that
does not exist where groups are not auto-created.
"""

from __future__ import annotations

from ferry.model import retry_topic
from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from services.broker.pop import PopService
from services.broker.remoting import convert
from services.broker.remoting.deps import Deps
from services.broker.remoting.pops import guarded

MAX_PEEK_NUMS = 32
# NOTIFICATION requests that may wait at once on one broker; more are answered
# at once with pollingFull (Apache's maxPopPollingSize, per broker here).
MAX_NOTIFICATIONS = 10_000
_I32 = {"low": -(2**31), "high": 2**31 - 1}


def handlers(deps: Deps) -> dict[int, Handler]:
    waiting = [0]  # NOTIFICATION requests waiting now

    async def peek(connection: Connection, command: Command) -> Command:
        return await guarded(deps, command, _peek)

    async def notification(connection: Connection, command: Command) -> Command:
        async def handle(deps: Deps, pops: PopService, command: Command) -> Command:
            return await _notification(deps, pops, command, waiting)

        return await guarded(deps, command, handle)

    async def polling_info(connection: Connection, command: Command) -> Command:
        return await guarded(deps, command, _polling_info)

    return {
        codes.PEEK_MESSAGE: peek,
        codes.NOTIFICATION: notification,
        codes.POLLING_INFO: polling_info,
    }


def _checked(deps: Deps, command: Command, group: str, topic: str, queue_id: int):
    """Apache's checks, in its order: the answer refusing the request, or None."""
    config = deps.metadata.topics.get(topic)
    if config is None:
        return command.answer(
            codes.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
        )
    deps.pulls.access.readable_topic(topic)  # 16 when the broker or topic may not be read
    if queue_id >= config.read_queue_nums:
        return command.answer(
            codes.SYSTEM_ERROR,
            f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
            f"[{config.read_queue_nums}] consumer:[{command.ext.get('consumerGroup', '')}]",
        )
    if (
        deps.metadata.subscription_groups.get(group) is None
        and not deps.config.auto_create_subscription_group
    ):
        return command.answer(
            codes.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
        )
    return None


# ---------------------------------------------------------------- peek


async def _peek(deps: Deps, pops: PopService, command: Command) -> Command:
    ext = command.ext
    group = convert.text(ext, "consumerGroup")
    topic = convert.text(ext, "topic")
    queue_id = convert.integer(ext, "queueId", **_I32)
    max_nums = convert.integer(ext, "maxMsgNums", **_I32)
    refused = _checked(deps, command, group, topic, queue_id)
    if refused is not None:
        return refused
    config = deps.metadata.topics.get(topic)
    if queue_id < 0:
        keys = [(topic, q) for q in range(config.read_queue_nums)]
        retry = retry_topic(group, topic)
        if deps.metadata.topics.get(retry) is not None:
            keys.insert(0, (retry, 0))
    else:
        keys = [(topic, queue_id)]
    want = min(max(max_nums, 0), MAX_PEEK_NUMS)
    parts: list[bytes] = []
    rest = 0
    for key_topic, key_queue in keys:
        low, high = deps.pulls.queue_offsets(key_topic, key_queue)
        committed = deps.metadata.consumer_offsets.query(group, key_topic, key_queue)
        start = max(low, committed if committed is not None else low)
        if want <= 0:
            rest += max(high - start, 0)
            continue
        outcome = await deps.pulls.pull(
            group, key_topic, key_queue, start, want, 0, raw=True, max_count=want
        )
        result = outcome.result
        if result.raw_count:
            parts.append(result.raw)
            want -= result.raw_count
        rest += max(high - result.next_begin_offset, 0)
    header = {"restNum": rest}
    if not parts:
        return command.answer(codes.PULL_NOT_FOUND, "NO_MESSAGE_IN_QUEUE", ext=header)
    return command.answer(codes.SUCCESS, "FOUND", ext=header, body=b"".join(parts))


# ---------------------------------------------------------------- notification


async def _notification(
    deps: Deps, pops: PopService, command: Command, waiting: list[int]
) -> Command:
    ext = command.ext
    group = convert.text(ext, "consumerGroup")
    topic = convert.text(ext, "topic")
    queue_id = convert.integer(ext, "queueId", **_I32)
    poll_ms = convert.integer(ext, "pollTime", required=False, low=0)
    born_ms = convert.integer(ext, "bornTime", required=False, low=0)
    refused = _checked(deps, command, group, topic, queue_id)
    if refused is not None:
        return refused
    wait_ms = poll_ms
    if born_ms:
        # The client's own deadline: what is left of pollTime since it asked.
        wait_ms = min(poll_ms, max(born_ms + poll_ms - deps.clock.wall_ms(), 0))
    if waiting[0] >= MAX_NOTIFICATIONS:
        return command.answer(codes.SUCCESS, ext={"hasMsg": "false", "pollingFull": "true"})
    waiting[0] += 1
    try:
        has = await pops.wait_message(group, topic, -1 if queue_id < 0 else queue_id, wait_ms)
    finally:
        waiting[0] -= 1
    return command.answer(codes.SUCCESS, ext={"hasMsg": "true" if has else "false"})


# ---------------------------------------------------------------- polling info


async def _polling_info(deps: Deps, pops: PopService, command: Command) -> Command:
    ext = command.ext
    group = convert.text(ext, "consumerGroup")
    topic = convert.text(ext, "topic")
    queue_id = convert.integer(ext, "queueId", **_I32)
    refused = _checked(deps, command, group, topic, queue_id)
    if refused is not None:
        return refused
    count = pops.polling(group, topic, -1 if queue_id < 0 else queue_id)
    return command.answer(codes.SUCCESS, ext={"pollingNum": count})
