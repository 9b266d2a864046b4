"""What the RocketMQ 4.x failover tests read of a ferry cluster through RocketMQ's
protocol, as a Java client reads it: a topic's route from the name server (105), each
group's brokers by id, and whether a broker holds a topic. (The ferry back end itself is
`tests/compat/remoting_backends.py`'s.)
"""

from __future__ import annotations

import json

from ferry.remoting import codes
from ferry.remoting.client import call
from ferry.remoting.codec import Command


def route(namesrv: str, topic: str) -> dict | None:
    """The name server's route of `topic` as a RocketMQ client reads it (105), None when it
    has none (17)."""
    answer = call(namesrv, Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}))
    if answer.code == codes.TOPIC_NOT_EXIST:
        return None
    if answer.code != codes.SUCCESS:
        raise AssertionError(f"route of {topic} from {namesrv}: {answer.code} {answer.remark}")
    return json.loads(answer.body)


def group_addrs(namesrv: str, topic: str) -> dict[str, dict[int, str]]:
    """brokerName -> {brokerId: RocketMQ-protocol address} in `topic`'s route."""
    found = route(namesrv, topic)
    if found is None:
        return {}
    return {
        b["brokerName"]: {int(i): a for i, a in b["brokerAddrs"].items()}
        for b in found["brokerDatas"]
    }


def has_topic(address: str, topic: str) -> bool:
    """The broker at `address` holds `topic` (its GET_MAX_OFFSET of queue 0 succeeds)."""
    try:
        answer = call(address, Command(codes.GET_MAX_OFFSET, ext={"topic": topic, "queueId": "0"}))
    except OSError:
        return False
    return answer.code == codes.SUCCESS
