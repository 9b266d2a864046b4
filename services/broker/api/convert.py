"""Mapping between `ferry.v1` messages and the broker's domain types. The only
broker module besides the servicers that knows the generated code."""

from __future__ import annotations

from collections.abc import Mapping

from ferry import record
from ferry.model import DataVersion, SubscriptionGroupConfig, TopicConfig, dlq_topic
from ferry.runtime.errors import FerryError, InvalidArgument
from ferry.runtime.grpc_errors import status_of
from ferry.v1 import broker_admin_pb2, broker_pb2, common_pb2
from services.broker.messaging.outgoing import OutgoingMessage, SendOutcome
from services.broker.pop import AckResult, ChangeResult, GroupStatus, Popped
from services.broker.store import CleanResult, GetResult, KeyLookup

_FILTER_NAMES = {common_pb2.SINGLE_TAG: "SINGLE_TAG", common_pb2.MULTI_TAG: "MULTI_TAG"}
_FILTER_VALUES = {v: k for k, v in _FILTER_NAMES.items()}


def data_version_pb(dv: DataVersion) -> common_pb2.DataVersion:
    return common_pb2.DataVersion(
        timestamp=dv.timestamp, counter=dv.counter, state_version=dv.state_version
    )


def topic_config(msg: common_pb2.TopicConfig) -> TopicConfig:
    if msg.topic_filter_type not in _FILTER_NAMES:
        raise InvalidArgument(
            "topic_config.topic_filter_type", f"{msg.topic_filter_type} is unknown"
        )
    return TopicConfig(
        topic_name=msg.topic_name,
        read_queue_nums=msg.read_queue_nums,
        write_queue_nums=msg.write_queue_nums,
        perm=msg.perm,
        topic_filter_type=_FILTER_NAMES[msg.topic_filter_type],
        topic_sys_flag=msg.topic_sys_flag,
        order=msg.order,
        attributes=tuple(sorted(msg.attributes.items())),
    )


def topic_config_pb(config: TopicConfig) -> common_pb2.TopicConfig:
    return common_pb2.TopicConfig(
        topic_name=config.topic_name,
        read_queue_nums=config.read_queue_nums,
        write_queue_nums=config.write_queue_nums,
        perm=config.perm,
        topic_filter_type=_FILTER_VALUES.get(config.topic_filter_type, common_pb2.SINGLE_TAG),
        topic_sys_flag=config.topic_sys_flag,
        order=config.order,
        attributes=dict(config.attributes),
    )


def topic_wrapper_pb(
    table: Mapping[str, TopicConfig], version: DataVersion
) -> common_pb2.TopicConfigSerializeWrapper:
    wrapper = common_pb2.TopicConfigSerializeWrapper(data_version=data_version_pb(version))
    for name, config in table.items():
        wrapper.topic_config_table[name].CopyFrom(topic_config_pb(config))
    return wrapper


def subscription_group(msg: common_pb2.SubscriptionGroupConfig) -> SubscriptionGroupConfig:
    def opt(name: str) -> bool:
        return getattr(msg, name) if msg.HasField(name) else True

    return SubscriptionGroupConfig(
        group_name=msg.group_name,
        consume_enable=opt("consume_enable"),
        consume_from_min_enable=opt("consume_from_min_enable"),
        consume_broadcast_enable=opt("consume_broadcast_enable"),
        retry_queue_nums=msg.retry_queue_nums or 1,
        retry_max_times=msg.retry_max_times or 16,
        broker_id=msg.broker_id,
        which_broker_when_consume_slowly=msg.which_broker_when_consume_slowly or 1,
        notify_consumer_ids_changed_enable=opt("notify_consumer_ids_changed_enable"),
        group_sys_flag=msg.group_sys_flag,
        consume_message_orderly=msg.consume_message_orderly,
        attributes=tuple(sorted(msg.attributes.items())),
    )


def subscription_group_pb(config: SubscriptionGroupConfig) -> common_pb2.SubscriptionGroupConfig:
    return common_pb2.SubscriptionGroupConfig(
        group_name=config.group_name,
        consume_enable=config.consume_enable,
        consume_from_min_enable=config.consume_from_min_enable,
        consume_broadcast_enable=config.consume_broadcast_enable,
        retry_queue_nums=config.retry_queue_nums,
        retry_max_times=config.retry_max_times,
        broker_id=config.broker_id,
        which_broker_when_consume_slowly=config.which_broker_when_consume_slowly,
        notify_consumer_ids_changed_enable=config.notify_consumer_ids_changed_enable,
        group_sys_flag=config.group_sys_flag,
        consume_message_orderly=config.consume_message_orderly,
        attributes=dict(config.attributes),
    )


def queue_id_of(msg: broker_pb2.SendMessageRequest | broker_pb2.SendMessagesRequest) -> int | None:
    return msg.queue_id if msg.HasField("queue_id") else None


def wait_of(msg: broker_pb2.SendMessageRequest | broker_pb2.SendMessagesRequest) -> bool:
    return msg.wait_store_msg_ok if msg.HasField("wait_store_msg_ok") else True


def outgoing(
    msg: broker_pb2.SendMessageRequest | broker_pb2.SendEntry | broker_pb2.StreamedMessage,
) -> OutgoingMessage:
    """The domain's message of a request's entry: plain values, the protobuf
    left at the door (a map copied only when not empty)."""
    properties = msg.properties
    return OutgoingMessage(  # positional: once per message sent
        msg.body,
        msg.tags,
        msg.keys,
        dict(properties) if properties else {},
        msg.flag,
        msg.born_timestamp,
    )


_SEND_STATUS = {
    "SEND_OK": broker_pb2.SEND_OK,
    "FLUSH_DISK_TIMEOUT": broker_pb2.FLUSH_DISK_TIMEOUT,
    "FLUSH_SLAVE_TIMEOUT": broker_pb2.FLUSH_SLAVE_TIMEOUT,
    "SLAVE_NOT_AVAILABLE": broker_pb2.SLAVE_NOT_AVAILABLE,
}


def send_result_pb(outcome: SendOutcome) -> broker_pb2.SendResult:
    return broker_pb2.SendResult(
        status=_SEND_STATUS[outcome.status.value],
        msg_id=outcome.msg_ids[0],
        queue_id=outcome.queue_id,
        queue_offset=outcome.queue_offset,
        commit_offset=outcome.commit_offset,
        message_count=len(outcome.msg_ids),
        msg_ids=outcome.msg_ids if len(outcome.msg_ids) > 1 else (),
    )


def streamed_result_pb(
    sequence: int, outcome: SendOutcome | FerryError
) -> broker_pb2.StreamedResult:
    """One `SendStream` message's answer: its result, or the refusal's status and text."""
    if isinstance(outcome, FerryError):
        return broker_pb2.StreamedResult(
            sequence=sequence, error_code=status_of(outcome).value[0], error=outcome.message
        )
    return broker_pb2.StreamedResult(sequence=sequence, result=send_result_pb(outcome))


_PULL_STATUS = {
    "FOUND": broker_pb2.FOUND,
    "NO_NEW_MSG": broker_pb2.NO_NEW_MSG,
    "NO_MATCHED_MSG": broker_pb2.NO_MATCHED_MSG,
    "OFFSET_ILLEGAL": broker_pb2.OFFSET_ILLEGAL,
    "OFFSET_MOVED": broker_pb2.OFFSET_MOVED,
}
_HIDDEN = (record.PROPERTY_TAGS, record.PROPERTY_KEYS)


def pull_response_pb(
    result: GetResult, suggest: int, store_host: tuple[str, int]
) -> broker_pb2.PullMessageResponse:
    response = broker_pb2.PullMessageResponse(
        status=_PULL_STATUS[result.status.value],
        next_begin_offset=result.next_begin_offset,
        min_offset=result.min_offset,
        max_offset=result.max_offset,
        suggest_which_broker_id=suggest,
    )
    prefixes: dict[bytes, str] = {}
    add = response.messages.add
    for r in result.records:
        add(**_message_fields(r, prefixes))
    return response


def _message_fields(r: record.StoredMessage, prefixes: dict[bytes, str]) -> dict:
    prefix = prefixes.get(r.store_host_raw)
    if prefix is None:
        prefix = prefixes[r.store_host_raw] = r.store_host_raw.hex().upper()
    props = r.properties
    tags = keys = ""
    tags_key, keys_key = record.PROPERTY_TAGS, record.PROPERTY_KEYS
    if props:
        tags = props.get(tags_key, "")
        keys = props.get(keys_key, "")
        if len(props) > (tags_key in props) + (keys_key in props):
            props = {k: v for k, v in props.items() if k not in _HIDDEN}
        else:
            props = None
    return dict(
        topic=r.topic,
        queue_id=r.queue_id,
        queue_offset=r.queue_offset,
        commit_offset=r.commit_offset,
        body=r.body,
        tags=tags,
        keys=keys,
        properties=props or None,
        born_timestamp=r.born_timestamp,
        store_timestamp=r.store_timestamp,
        msg_id=f"{prefix}{r.commit_offset:016X}",
        flag=r.flag,
        reconsume_times=r.reconsume_times,
        store_size=r.size,
        born_host=r.born_host,
        store_host=r.store_host,
    )


def pop_response_pb(popped: list[Popped]) -> broker_pb2.PopMessageResponse:
    response = broker_pb2.PopMessageResponse(
        status=broker_pb2.POP_FOUND if popped else broker_pb2.POP_NO_MESSAGE
    )
    prefixes: dict[bytes, str] = {}
    add = response.messages.add
    for p in popped:
        fields = _message_fields(p.message, prefixes)
        if p.msg_id is not None:
            fields["msg_id"] = p.msg_id
        fields["topic"] = p.topic
        add(
            **fields,
            receipt_handle=p.receipt_handle,
            delivery_attempt=p.delivery_attempt,
            invisible_until_ms=p.invisible_until_ms,
        )
    return response


_ACK_STATUS = {"OK": broker_pb2.OK, "STALE": broker_pb2.STALE, "FOREIGN": broker_pb2.FOREIGN}


def ack_response_pb(results: list[AckResult]) -> broker_pb2.AckMessageResponse:
    response = broker_pb2.AckMessageResponse()
    add = response.results.add
    for r in results:
        if r.reason:
            add(receipt_handle=r.receipt_handle, status=_ACK_STATUS[r.status], reason=r.reason)
        else:
            add(receipt_handle=r.receipt_handle, status=_ACK_STATUS[r.status])
    return response


def forward_response_pb(
    result: AckResult, group: str
) -> broker_pb2.ForwardToDeadLetterQueueResponse:
    return broker_pb2.ForwardToDeadLetterQueueResponse(
        status=_ACK_STATUS[result.status],
        reason=result.reason,
        dlq_topic=dlq_topic(group) if result.status == "OK" else "",
    )


def change_response_pb(result: ChangeResult) -> broker_pb2.ChangeInvisibleTimeResponse:
    return broker_pb2.ChangeInvisibleTimeResponse(
        receipt_handle=result.receipt_handle,
        status=_ACK_STATUS[result.status],
        reason=result.reason,
        invisible_until_ms=result.invisible_until_ms,
    )


def group_status_pb(status: GroupStatus) -> broker_pb2.GetGroupStatusResponse:
    return broker_pb2.GetGroupStatusResponse(
        queues=[
            broker_pb2.GroupQueueStatus(
                queue_id=q.queue_id,
                committed_offset=q.committed_offset,
                pop_offset=q.pop_offset,
                max_offset=q.max_offset,
                in_flight=q.in_flight,
                redeliveries_pending=q.redeliveries_pending,
            )
            for q in status.queues
        ],
        retries_pending=status.retries_pending,
        dlq_messages=status.dlq_messages,
        orderly=status.orderly,
        retry_max_times=status.retry_max_times,
        retry_topic=status.retry_topic,
        dlq_topic=status.dlq_topic,
        retry_backoff_ms=status.retry_backoff_ms,
    )


def clean_report_pb(report: CleanResult) -> broker_admin_pb2.DeleteExpiredCommitLogResponse:
    return broker_admin_pb2.DeleteExpiredCommitLogResponse(
        deleted_files=report.deleted_files,
        min_offset=report.min_offset,
        consume_queue_files=report.consume_queue_files,
        disk_used_ratio=report.disk_used_ratio,
    )


def message_ext_pb(r: record.StoredMessage) -> broker_pb2.MessageExt:
    """One stored message as ferry.v1 hands it out (a transaction check)."""
    return broker_pb2.MessageExt(**_message_fields(r, {}))


def query_response_pb(found: KeyLookup, max_bytes: int) -> broker_pb2.QueryMessageResponse:
    """Messages found by key, with every property (KEYS, TAGS and UNIQ_KEY included):
    the newest of them whose answer stays within `max_bytes` (the server's gRPC send
    limit; one message always fits, see BrokerConfig.grpc_max_message_size)."""
    messages: list[broker_pb2.MessageExt] = []
    room = max_bytes - _QUERY_ANSWER_SLACK
    for _, m in reversed(found.found):
        pb = _found_message_pb(m)
        size = pb.ByteSize() + _FIELD_OVERHEAD
        if messages and size > room:
            break
        room -= size
        messages.append(pb)
    messages.reverse()
    return broker_pb2.QueryMessageResponse(
        messages=messages,
        index_last_update_timestamp=found.last_update_timestamp,
        index_last_update_commit_offset=found.last_update_commit_offset,
        left_out=len(found.found) - len(messages),
    )


# A repeated message field's tag and length prefix (at most 1 + 5 bytes), and room for
# the answer's other fields and gRPC's own framing.
_FIELD_OVERHEAD = 6
_QUERY_ANSWER_SLACK = 1024


def view_offset_of(request: broker_pb2.ViewMessageRequest) -> int:
    """The commit offset a ViewMessage asks for (from its offset message id, if given)."""
    if request.WhichOneof("where") == "offset_msg_id":
        try:
            return record.parse_message_id(request.offset_msg_id)[1]
        except record.RecordError as exc:
            raise InvalidArgument("offset_msg_id", str(exc)) from None
    return request.commit_offset


def view_response_pb(data: bytes) -> broker_pb2.ViewMessageResponse:
    """A record as stored, decoded for ViewMessage."""
    return broker_pb2.ViewMessageResponse(
        message=_found_message_pb(record.decode_stored(data, 0, len(data)))
    )


def _found_message_pb(r: record.StoredMessage) -> broker_pb2.MessageExt:
    fields = _message_fields(r, {})
    fields["properties"] = r.properties
    return broker_pb2.MessageExt(**fields)
