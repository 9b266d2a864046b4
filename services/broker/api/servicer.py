"""The broker's gRPC servicers: `Broker`, `BrokerAdmin` and `SlaveSync`.

They only adapt: convert the request, call one use case, convert the result.
Domain errors become status codes through `ferry.runtime.grpc_errors`. While
the broker is starting or stopping every call is UNAVAILABLE.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from ferry.model import check_name, check_topic
from ferry.runtime.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from ferry.runtime.grpc_errors import grpc_method, grpc_stream_method
from ferry.v1 import (
    broker_admin_pb2,
    broker_admin_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    ha_admin_pb2,
    ha_admin_pb2_grpc,
    slave_sync_pb2,
    slave_sync_pb2_grpc,
)
from services.broker.api import convert
from services.broker.api.sendstream import SendStreamSession
from services.broker.messaging.admin import AdminService
from services.broker.messaging.pull import MAX_QUERY_NUM, UNIQUE_QUERY_NUM, PullService
from services.broker.messaging.replication import ReplicationStatus
from services.broker.messaging.send import SendService
from services.broker.messaging.statistics import StatisticsService
from services.broker.pop import PopService


class Gate:
    """Open while the broker serves; closed while starting and stopping."""

    def __init__(self) -> None:
        self.open = False

    def check(self) -> None:
        if not self.open:
            raise Unavailable("the broker is starting up or shutting down; try again shortly")


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(
        self,
        sends: SendService,
        pulls: PullService,
        offsets,  # services.broker.metadata.ConsumerOffsetTable
        gate: Gate,
        store_host: tuple[str, int],
        pop: PopService | None = None,
        broker_name: str = "",
        send_stream_max_in_flight: int = 1024,
        max_answer_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        """`sends`: every send, a transaction's half (TRAN_MSG=true with
        PGROUP, proto/ferry/v1/transactions.proto) included.
        `max_answer_bytes`: the server's gRPC send limit (grpcMaxMessageSize); a key
        lookup leaves out the oldest messages found rather than pass it."""
        self.max_answer_bytes = max_answer_bytes
        self.send_stream_max_in_flight = send_stream_max_in_flight
        self.pop = pop
        self.broker_name = broker_name
        self.sends = sends
        self.pulls = pulls
        self.offsets = offsets
        self.gate = gate
        self.store_host = store_host

    @grpc_method
    async def SendMessage(
        self, request: broker_pb2.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.SendResult:
        self.gate.check()
        outcome = await self.sends.send(  # a half's result names the half, which ends it later
            request.topic,
            convert.queue_id_of(request),
            (convert.outgoing(request),),
            convert.wait_of(request),
        )
        return convert.send_result_pb(outcome)

    @grpc_method
    async def SendMessages(
        self, request: broker_pb2.SendMessagesRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.SendResult:
        self.gate.check()
        outcome = await self.sends.send(
            request.topic,
            convert.queue_id_of(request),
            [convert.outgoing(m) for m in request.messages],
            convert.wait_of(request),
            batch=True,
        )
        return convert.send_result_pb(outcome)

    @grpc_stream_method
    async def SendStream(
        self,
        request_iterator: AsyncIterator[broker_pb2.SendStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[broker_pb2.SendStreamResponse]:
        self.gate.check()
        session = SendStreamSession(self.sends, self.gate.check, self.send_stream_max_in_flight)
        async for response in session.run(request_iterator):
            yield response

    @grpc_method
    async def PullMessage(
        self, request: broker_pb2.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.PullMessageResponse:
        self.gate.check()
        outcome = await self.pulls.pull(
            request.consumer_group,
            request.topic,
            request.queue_id,
            request.queue_offset,
            request.max_msg_nums,
            request.max_wait_ms,
            request.sub_expression,
            expression_type=request.expression_type,
        )
        return convert.pull_response_pb(
            outcome.result, outcome.suggest_which_broker_id, self.store_host
        )

    @grpc_method
    async def QueryConsumerOffset(
        self, request: broker_pb2.QueryConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.QueryConsumerOffsetResponse:
        self.gate.check()
        self._check_queue(request.consumer_group, request.topic, request.queue_id)
        offset = self.offsets.query(request.consumer_group, request.topic, request.queue_id)
        if offset is None:
            raise NotFound(
                f"consumer group {request.consumer_group!r} has no committed offset for "
                f"{request.topic}/{request.queue_id}"
            )
        return broker_pb2.QueryConsumerOffsetResponse(offset=offset)

    @grpc_method
    async def UpdateConsumerOffset(
        self, request: broker_pb2.UpdateConsumerOffsetRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.UpdateConsumerOffsetResponse:
        self.gate.check()
        self._check_queue(request.consumer_group, request.topic, request.queue_id)
        if request.offset < 0:
            raise InvalidArgument("offset", f"{request.offset} is negative")
        self.offsets.commit(request.consumer_group, request.topic, request.queue_id, request.offset)
        return broker_pb2.UpdateConsumerOffsetResponse()

    @grpc_method
    async def GetMaxOffset(
        self, request: broker_pb2.GetMaxOffsetRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.GetOffsetResponse:
        self.gate.check()
        _, high = self.pulls.queue_offsets(request.topic, request.queue_id)
        return broker_pb2.GetOffsetResponse(offset=high)

    @grpc_method
    async def GetMinOffset(
        self, request: broker_pb2.GetMinOffsetRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.GetOffsetResponse:
        self.gate.check()
        low, _ = self.pulls.queue_offsets(request.topic, request.queue_id)
        return broker_pb2.GetOffsetResponse(offset=low)

    def _check_queue(self, group: str, topic: str, queue_id: int) -> None:
        check_name(group, "consumer_group")
        self.pulls.queue_offsets(topic, queue_id)

    # ------------------------------------------------------------ pop

    def _pop(self) -> PopService:
        if self.pop is None:
            raise PermissionDenied(
                f"broker {self.broker_name} is a SLAVE: pop consumption (PopMessage, AckMessage, "
                "ChangeInvisibleTime) is served by its master"
            )
        return self.pop

    @grpc_method
    async def PopMessage(
        self, request: broker_pb2.PopMessageRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.PopMessageResponse:
        self.gate.check()
        popped = await self._pop().pop(
            request.consumer_group,
            request.topic,
            request.queue_id if request.HasField("queue_id") else None,
            request.max_msg_nums,
            request.invisible_ms,
            request.max_wait_ms,
            request.sub_expression,
            request.expression_type,
        )
        return convert.pop_response_pb(popped)

    @grpc_method
    async def AckMessage(
        self, request: broker_pb2.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.AckMessageResponse:
        self.gate.check()
        results = await self._pop().ack(
            request.consumer_group, request.topic, list(request.receipt_handles)
        )
        return convert.ack_response_pb(results)

    @grpc_method
    async def ChangeInvisibleTime(
        self, request: broker_pb2.ChangeInvisibleTimeRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.ChangeInvisibleTimeResponse:
        self.gate.check()
        result = await self._pop().change_invisible_time(
            request.consumer_group, request.topic, request.receipt_handle, request.invisible_ms
        )
        return convert.change_response_pb(result)

    @grpc_method
    async def ForwardToDeadLetterQueue(
        self, request: broker_pb2.ForwardToDeadLetterQueueRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.ForwardToDeadLetterQueueResponse:
        self.gate.check()
        result = await self._pop().forward_to_dlq(
            request.consumer_group, request.topic, request.receipt_handle
        )
        return convert.forward_response_pb(result, request.consumer_group)

    @grpc_method
    async def GetGroupStatus(
        self, request: broker_pb2.GetGroupStatusRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.GetGroupStatusResponse:
        self.gate.check()
        return convert.group_status_pb(self._pop().status(request.consumer_group, request.topic))

    @grpc_method
    async def QueryMessageByKey(
        self, request: broker_pb2.QueryMessageByKeyRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.QueryMessageResponse:
        self.gate.check()
        found = await self.pulls.find_by_key(
            request.topic,
            request.key,
            request.max_num or MAX_QUERY_NUM,
            request.begin_timestamp,
            request.end_timestamp or 2**63 - 1,
        )
        return convert.query_response_pb(found, self.max_answer_bytes)

    @grpc_method
    async def QueryMessageByUniqueKey(
        self,
        request: broker_pb2.QueryMessageByUniqueKeyRequest,
        context: grpc.aio.ServicerContext,
    ) -> broker_pb2.QueryMessageResponse:
        self.gate.check()
        found = await self.pulls.find_by_key(
            request.topic, request.unique_key, UNIQUE_QUERY_NUM, unique=True
        )
        return convert.query_response_pb(found, self.max_answer_bytes)

    @grpc_method
    async def ViewMessage(
        self, request: broker_pb2.ViewMessageRequest, context: grpc.aio.ServicerContext
    ) -> broker_pb2.ViewMessageResponse:
        self.gate.check()
        data = await self.pulls.stored_record(convert.view_offset_of(request))
        return convert.view_response_pb(data)


class BrokerAdminServicer(broker_admin_pb2_grpc.BrokerAdminServicer):
    def __init__(self, admin: AdminService, statistics: StatisticsService, gate: Gate) -> None:
        self.admin = admin
        self.statistics = statistics
        self.gate = gate

    @grpc_method
    async def UpdateAndCreateTopic(
        self, request: broker_admin_pb2.UpdateAndCreateTopicRequest, context
    ) -> broker_admin_pb2.TableChangeResponse:
        self.gate.check()
        if not request.HasField("topic_config"):
            raise InvalidArgument("topic_config", "is required")
        version = await self.admin.update_topic(convert.topic_config(request.topic_config))
        return broker_admin_pb2.TableChangeResponse(data_version=convert.data_version_pb(version))

    @grpc_method
    async def DeleteTopic(
        self, request: broker_admin_pb2.DeleteTopicRequest, context
    ) -> broker_admin_pb2.TableChangeResponse:
        self.gate.check()
        check_topic(request.topic)
        version = await self.admin.delete_topic(request.topic)
        return broker_admin_pb2.TableChangeResponse(data_version=convert.data_version_pb(version))

    @grpc_method
    async def UpdateAndCreateSubscriptionGroup(
        self, request: broker_admin_pb2.UpdateAndCreateSubscriptionGroupRequest, context
    ) -> broker_admin_pb2.TableChangeResponse:
        self.gate.check()
        if not request.HasField("config"):
            raise InvalidArgument("config", "is required")
        version = await self.admin.update_group(convert.subscription_group(request.config))
        return broker_admin_pb2.TableChangeResponse(data_version=convert.data_version_pb(version))

    @grpc_method
    async def DeleteSubscriptionGroup(
        self, request: broker_admin_pb2.DeleteSubscriptionGroupRequest, context
    ) -> broker_admin_pb2.TableChangeResponse:
        self.gate.check()
        check_name(request.group_name, "group_name")
        version = await self.admin.delete_group(request.group_name)
        return broker_admin_pb2.TableChangeResponse(data_version=convert.data_version_pb(version))

    @grpc_method
    async def GetBrokerRuntimeInfo(
        self, request: broker_admin_pb2.GetBrokerRuntimeInfoRequest, context
    ) -> broker_admin_pb2.BrokerRuntimeInfo:
        info = self.statistics.runtime_info()
        return broker_admin_pb2.BrokerRuntimeInfo(**info.__dict__)

    @grpc_method
    async def UpdateBrokerPermission(
        self, request: broker_admin_pb2.UpdateBrokerPermissionRequest, context
    ) -> broker_admin_pb2.UpdateBrokerPermissionResponse:
        self.gate.check()
        previous, current = await self.admin.update_permission(request.broker_permission)
        return broker_admin_pb2.UpdateBrokerPermissionResponse(
            previous_permission=previous, broker_permission=current
        )

    @grpc_method
    async def DeleteExpiredCommitLog(
        self, request: broker_admin_pb2.DeleteExpiredCommitLogRequest, context
    ) -> broker_admin_pb2.DeleteExpiredCommitLogResponse:
        self.gate.check()
        return convert.clean_report_pb(await self.admin.delete_expired_commit_log())


class SlaveSyncServicer(slave_sync_pb2_grpc.SlaveSyncServicer):
    def __init__(self, metadata, gate: Gate, log_position=None) -> None:
        """`log_position(queue_id)`: how far the metadata log's topics (0) or
        groups (1) queue is applied in the tables answered (failover), or None."""
        self.metadata = metadata
        self.gate = gate
        self.log_position = log_position

    @grpc_method
    async def GetAllTopicConfig(self, request, context) -> common_pb2.TopicConfigSerializeWrapper:
        self.gate.check()
        table, version = self.metadata.topics.snapshot()
        wrapper = convert.topic_wrapper_pb(table, version)
        if self.log_position is not None:
            wrapper.metadata_log_offset = self.log_position(0)
        return wrapper

    @grpc_method
    async def GetAllConsumerOffset(
        self, request, context
    ) -> slave_sync_pb2.ConsumerOffsetSerializeWrapper:
        self.gate.check()
        table, version = self.metadata.consumer_offsets.snapshot()
        wrapper = slave_sync_pb2.ConsumerOffsetSerializeWrapper(
            data_version=convert.data_version_pb(version)
        )
        for key, offsets in table.items():
            wrapper.offset_table[key].offsets.update(offsets)
        return wrapper

    @grpc_method
    async def GetAllDelayOffset(
        self, request, context
    ) -> slave_sync_pb2.DelayOffsetSerializeWrapper:
        self.gate.check()
        table, version = self.metadata.delay_offsets.snapshot()
        return slave_sync_pb2.DelayOffsetSerializeWrapper(
            offset_table=table, data_version=convert.data_version_pb(version)
        )

    @grpc_method
    async def GetAllSubscriptionGroupConfig(
        self, request, context
    ) -> slave_sync_pb2.SubscriptionGroupWrapper:
        self.gate.check()
        table, version = self.metadata.subscription_groups.snapshot()
        wrapper = slave_sync_pb2.SubscriptionGroupWrapper(
            data_version=convert.data_version_pb(version)
        )
        for name, config in table.items():
            wrapper.subscription_group_table[name].CopyFrom(convert.subscription_group_pb(config))
        if self.log_position is not None:
            wrapper.metadata_log_offset = self.log_position(1)
        return wrapper


class HAAdminServicer(ha_admin_pb2_grpc.HAAdminServicer):
    def __init__(self, replication: ReplicationStatus) -> None:
        self.replication = replication

    @grpc_method
    async def GetHAStatus(self, request, context) -> ha_admin_pb2.HAStatus:
        figures = self.replication.figures()
        answer = ha_admin_pb2.HAStatus(
            broker_role=figures.role,
            master_max_offset=figures.max_offset,
            confirm_offset=figures.confirm_offset,
        )
        for r in figures.replicas:
            answer.connections.add(
                addr=r.addr,
                replica_id=r.replica_id,
                ack_offset=r.ack_offset,
                diff=r.lag,
                in_sync=r.in_sync,
                transferred_bytes_per_second=r.bytes_per_second,
                transfer_from=r.transfer_from,
                last_ack_timestamp=r.last_ack_ms,
            )
        if figures.replicas:
            answer.in_sync_slave_nums = figures.in_sync_replicas
        following = figures.following
        if following is not None:
            answer.master_max_offset = following.master_max_offset
            answer.slave.CopyFrom(
                ha_admin_pb2.HASlaveStatus(
                    master_addr=following.master_addr,
                    max_offset=figures.max_offset,
                    last_read_timestamp=following.last_read_ms,
                    last_write_timestamp=following.last_write_ms,
                    connected=following.connected,
                    master_max_offset=following.master_max_offset,
                )
            )
        return answer
