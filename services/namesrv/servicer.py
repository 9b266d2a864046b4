"""`ferry.v1.NameServer`: converts requests, calls the route table or the KV
store, converts the answer back. Errors map to gRPC codes through
`ferry.runtime.grpc_errors`."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator

import grpc

from ferry.runtime import errors
from ferry.runtime.clock import Clock
from ferry.runtime.grpc_errors import grpc_method, status_of
from ferry.v1 import common_pb2, namesrv_pb2, namesrv_pb2_grpc
from services.namesrv import convert
from services.namesrv.kvconfig import ORDER_TOPIC_CONFIG, KVConfigStore
from services.namesrv.metrics import NamesrvMetrics
from services.namesrv.routes import CONNECTION_LOST, REMOTING, RouteTable, StaleMaster

log = logging.getLogger(__name__)


class NameServerServicer(namesrv_pb2_grpc.NameServerServicer):
    def __init__(
        self, routes: RouteTable, kv: KVConfigStore, metrics: NamesrvMetrics, clock: Clock
    ) -> None:
        self._routes = routes
        self._kv = kv
        self._metrics = metrics
        self._clock = clock
        self._stopping = asyncio.Event()
        # topic -> answer, valid for one route-table version (cleared when it changes).
        self._route_cache: dict[str, common_pb2.TopicRouteData] = {}
        self._route_cache_version = -1

    def begin_shutdown(self) -> None:
        """End the KeepAlive streams without removing their brokers (our shutdown is
        not the brokers' fault), so a graceful stop need not wait out its grace period."""
        self._stopping.set()

    @grpc_method
    async def RegisterBroker(self, request, context):
        # A registration can carry 100,000 topics: allocating that many objects
        # would trigger full GC passes mid-apply. Nothing awaits in between.
        gc.disable()
        try:
            reg = convert.registration(request)
            result = self._routes.register(reg)
        except StaleMaster as exc:
            log.warning(
                "refused stale master addr=%s group=%s epoch=%d group_epoch=%d (registered by %s)",
                exc.broker_addr,
                exc.broker_name,
                exc.epoch,
                exc.group_epoch,
                exc.group_addr,
            )
            raise
        finally:
            gc.enable()
        if result.replaced_master:
            log.info(
                "new master addr=%s group=%s epoch=%d replaces addr=%s",
                reg.broker_addr,
                reg.broker_name,
                reg.epoch,
                result.replaced_master,
            )
        if result.behind_epoch:
            log.info(
                "follower behind its group's epoch addr=%s group=%s id=%d epoch=%d "
                "group_epoch=%d; accepted, it will catch up",
                reg.broker_addr,
                reg.broker_name,
                reg.broker_id,
                reg.epoch,
                result.behind_epoch,
            )
        self._metrics.registered(result.topic_config_applied)
        kv_table = self._kv.namespace(ORDER_TOPIC_CONFIG) or {}
        return convert.register_response(result, kv_table)

    @grpc_method
    async def UnregisterBroker(self, request, context):
        removal = self._routes.unregister(
            request.cluster_name,
            request.broker_addr,
            request.broker_name,
            request.broker_id,
            request.instance_id,
        )
        self._metrics.removed([removal])
        if removal is not None:
            log.info(
                "unregistered broker addr=%s group=%s id=%d",
                removal.broker_addr,
                removal.broker_name,
                removal.broker_id,
            )
        return namesrv_pb2.UnregisterBrokerResponse(removed=removal is not None)

    @grpc_method
    async def QueryDataVersion(self, request, context):
        changed, stored = self._routes.query_data_version(
            request.cluster_name,
            request.broker_addr,
            request.broker_name,
            request.broker_id,
            convert.data_version(request.data_version),
        )
        response = namesrv_pb2.QueryDataVersionResponse(changed=changed)
        if stored is not None:
            response.data_version.CopyFrom(convert.data_version_pb(stored))
        return response

    @grpc_method
    async def BrokerHeartbeat(self, request, context):
        return namesrv_pb2.BrokerHeartbeatResponse(
            registered=self._routes.heartbeat(request.cluster_name, request.broker_addr)
        )

    async def KeepAlive(
        self,
        request_iterator: AsyncIterator[namesrv_pb2.KeepAliveRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        # grpc.aio ends a stream the same way whether the broker closed its side or
        # its process died, so any end of the stream is "connection_lost". A broker
        # stopping cleanly calls UnregisterBroker first (counted "graceful"), after
        # which this removal finds nothing.
        addr = ""
        generation = None
        try:
            while (request := await self._next_request(context)) is not None:
                if generation is None:
                    addr = request.broker_addr
                    generation = self._routes.bind_keep_alive(
                        request.cluster_name, addr, request.instance_id
                    )
                    log.info(
                        "keep-alive stream open for broker addr=%s generation=%d", addr, generation
                    )
                else:
                    self._routes.touch_generation(addr, generation)
                await context.write(
                    namesrv_pb2.KeepAliveResponse(server_timestamp=self._clock.wall_ms())
                )
        except errors.FerryError as exc:
            await context.abort(status_of(exc), exc.message)
        finally:
            if generation is not None and not self._stopping.is_set():
                removal = self._routes.remove_if_current(addr, generation, CONNECTION_LOST)
                self._metrics.removed([removal])
                if removal is not None:
                    log.warning(
                        "keep-alive stream of broker addr=%s ended; removed it from the routes",
                        addr,
                    )

    async def _next_request(
        self, context: grpc.aio.ServicerContext
    ) -> namesrv_pb2.KeepAliveRequest | None:
        """The next message of a stream; None at its end or when the server is stopping."""
        read = asyncio.ensure_future(context.read())
        stopping = asyncio.ensure_future(self._stopping.wait())
        done, pending = await asyncio.wait({read, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for future in pending:
            future.cancel()
        if read not in done:
            return None
        request = read.result()
        return None if request is grpc.aio.EOF else request

    @grpc_method
    async def GetRouteInfoByTopic(self, request, context):
        routes = self._routes
        if self._route_cache_version != routes.version:
            self._route_cache.clear()
            self._route_cache_version = routes.version
        cached = self._route_cache.get(request.topic)
        if cached is None:
            cached = convert.route_pb(
                routes.route(request.topic), lambda addr: routes.address(addr, REMOTING)
            )
            if len(self._route_cache) < 100_000:
                self._route_cache[request.topic] = cached
        return cached

    @grpc_method
    async def GetBrokerClusterInfo(self, request, context):
        return convert.cluster_info_pb(self._routes)

    @grpc_method
    async def GetAllTopicList(self, request, context):
        return namesrv_pb2.TopicList(topic_list=self._routes.topics())

    @grpc_method
    async def PutKVConfig(self, request, context):
        await self._kv.put(request.namespace, request.key, request.value)
        return namesrv_pb2.PutKVConfigResponse()

    @grpc_method
    async def GetKVConfig(self, request, context):
        value = self._kv.get(request.namespace, request.key)
        if value is None:
            raise errors.NotFound(
                f"No config item, Namespace: {request.namespace} Key: {request.key}"
            )
        return namesrv_pb2.GetKVConfigResponse(value=value)

    @grpc_method
    async def DeleteKVConfig(self, request, context):
        return namesrv_pb2.DeleteKVConfigResponse(
            deleted=await self._kv.delete(request.namespace, request.key)
        )

    @grpc_method
    async def GetKVListByNamespace(self, request, context):
        table = self._kv.namespace(request.namespace)
        if table is None:
            raise errors.NotFound(f"No config item, Namespace: {request.namespace}")
        return namesrv_pb2.KVTable(table=table)

    @grpc_method
    async def WipeWritePermOfBroker(self, request, context):
        count = self._routes.wipe_write_perm(request.broker_name)
        return namesrv_pb2.WipeWritePermOfBrokerResponse(wipe_topic_count=count)

    @grpc_method
    async def AddWritePermOfBroker(self, request, context):
        count = self._routes.add_write_perm(request.broker_name)
        return namesrv_pb2.AddWritePermOfBrokerResponse(add_topic_count=count)
