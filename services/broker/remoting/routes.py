"""A topic's readable queues across the cluster, as the name servers route it:
what RocketMQ 5's server-side assignment (QUERY_ASSIGNMENT) divides among a
group's consumers, as Apache's broker divides the route its TopicRouteInfoManager
keeps. Asked over RocketMQ's protocol (GET_ROUTEINFO_BY_TOPIC, 105) of the
first name server of `namesrvAddr` that answers, and kept a few seconds, so a
group's consumers asking one after another are given shares of the same list.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ferry.remoting import bodies, codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command
from ferry.runtime.clock import Clock

log = logging.getLogger(__name__)

PERM_READ = 4
ROUTE_TTL_S = 3.0
ASK_TIMEOUT_S = 3.0


class NameServerRoutes:
    def __init__(
        self, namesrv_addrs: Sequence[str], clock: Clock, ttl_s: float = ROUTE_TTL_S
    ) -> None:
        self.namesrv_addrs = tuple(namesrv_addrs)
        self.clock = clock
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, list[tuple[str, int]] | None]] = {}

    async def queues(self, topic: str) -> list[tuple[str, int]] | None:
        """(broker name, queue id) of every readable queue the route lists, sorted;
        None when no name server routes the topic (or none answers)."""
        now = self.clock.monotonic()
        cached = self._cache.get(topic)
        if cached is not None and now - cached[0] < self.ttl_s:
            return cached[1]
        found = await self._ask(topic)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[topic] = (now, found)
        return found

    async def _ask(self, topic: str) -> list[tuple[str, int]] | None:
        for addr in self.namesrv_addrs:
            client = None
            try:
                client = await RemotingClient.connect(addr, timeout=ASK_TIMEOUT_S)
                answer = await client.request(
                    Command(codes.GET_ROUTEINFO_BY_TOPIC, ext={"topic": topic}), ASK_TIMEOUT_S
                )
            except (OSError, TimeoutError) as e:
                log.debug("name server %s did not answer the route of %s: %s", addr, topic, e)
                continue
            finally:
                if client is not None:
                    client.close()
            if answer.code != codes.SUCCESS:
                return None
            try:
                return readable_queues(bodies.loads(answer.body))
            except (bodies.BodyError, TypeError, ValueError, AttributeError) as e:
                log.warning(
                    "name server %s sent a route of %s ferry cannot read: %s", addr, topic, e
                )
                continue
        return None


def readable_queues(route: object) -> list[tuple[str, int]]:
    """The readable queues of a TopicRouteData: each queue data's broker with
    `readQueueNums` ids, when its `perm` has READ."""
    if not isinstance(route, dict):
        raise ValueError("the route is not a JSON object")
    out = []
    for data in route.get("queueDatas") or []:
        if int(data.get("perm", 0)) & PERM_READ:
            name = str(data["brokerName"])
            out.extend((name, qid) for qid in range(int(data.get("readQueueNums", 0))))
    return sorted(set(out))
