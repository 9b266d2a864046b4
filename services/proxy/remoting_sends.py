"""Sends to a broker in RocketMQ's protocol, as Apache's proxy sends them.

A broker's RocketMQ-protocol port takes a send for a fraction of what a
`ferry.v1` unary call costs it (~25 µs of CPU against ~230 µs here), and it
stages the SEND_MESSAGE_V2 requests that arrive back to back on a connection
together (`services.broker.remoting.sends`). So the proxy keeps one connection
per broker and writes each SDK message to it as its own SEND_MESSAGE_V2 as
soon as it arrives: under load the requests pipeline on the connection and the
broker appends them in runs, with no batching or waiting in the proxy.

The queue is left to the broker (queueId -1), as a `ferry.v1` send leaves it:
the broker round-robins plain messages and hashes a message group
(`__SHARDINGKEY`) to its queue, the same rule whichever door a message comes
through.

A broker's answer comes back as a `broker_pb2.SendResult`, or raises
`SendRefused`, which reads like the `ferry.v1` error the broker would have
given for the same refusal (`code()`, `details()`), so the servicer decides
what the SDK gets from one table (`convert.error_code`) whichever way a
message went. A connection that cannot be made, drops, or does not answer in
time raises `SendRefused` with UNAVAILABLE or DEADLINE_EXCEEDED: a link error
(`sends.LINK_ERRORS`), after which the servicer tries another broker.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import grpc

from ferry import acl, record
from ferry.remoting import codes
from ferry.remoting.client import RemotingClient
from ferry.remoting.codec import Command
from ferry.v1 import broker_pb2
from services.proxy.sends import SendStats

log = logging.getLogger(__name__)

# RocketMQ's default producer group (MixAll.DEFAULT_PRODUCER_GROUP): the SDKs'
# SendMessage names none.
DEFAULT_PRODUCER_GROUP = "DEFAULT_PRODUCER"
CONNECT_TIMEOUT_S = 3.0

_STATUS_BY_CODE = {
    codes.SUCCESS: broker_pb2.SEND_OK,
    codes.FLUSH_DISK_TIMEOUT: broker_pb2.FLUSH_DISK_TIMEOUT,
    codes.FLUSH_SLAVE_TIMEOUT: broker_pb2.FLUSH_SLAVE_TIMEOUT,
    codes.SLAVE_NOT_AVAILABLE: broker_pb2.SLAVE_NOT_AVAILABLE,
}

# A refusal's RocketMQ code as the gRPC status the broker's ferry.v1 port gives
# for the same error (services/broker/remoting/convert.py maps them the other way).
_STATUS_OF_REFUSAL = {
    codes.MESSAGE_ILLEGAL: grpc.StatusCode.INVALID_ARGUMENT,
    codes.TOPIC_NOT_EXIST: grpc.StatusCode.NOT_FOUND,
    codes.NO_PERMISSION: grpc.StatusCode.PERMISSION_DENIED,
    # Starting, stopping, fenced, failed-stop or a full disk: send it elsewhere,
    # as a RocketMQ producer does on 14.
    codes.SERVICE_NOT_AVAILABLE: grpc.StatusCode.UNAVAILABLE,
    codes.SYSTEM_BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    codes.SYSTEM_ERROR: grpc.StatusCode.INTERNAL,
}


class SendRefused(Exception):
    """A request (a send, a pop, an ack...) the broker refused, or that the link
    lost; read as the ferry.v1 error."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def refusal_status(code: int, remark: str) -> grpc.StatusCode:
    if code == codes.MESSAGE_ILLEGAL and "maxMessageSize" in remark:
        return grpc.StatusCode.RESOURCE_EXHAUSTED  # too large: MessageTooLarge's status
    return _STATUS_OF_REFUSAL.get(code, grpc.StatusCode.INTERNAL)


def properties_of(request: broker_pb2.SendMessageRequest) -> dict[str, str]:
    """A ferry send's properties as a RocketMQ send carries them: tags and keys among them."""
    properties = dict(request.properties)
    if request.tags:
        properties[record.PROPERTY_TAGS] = request.tags
    if request.keys:
        properties[record.PROPERTY_KEYS] = request.keys
    return properties


def header(request: broker_pb2.SendMessageRequest, producer_group: str) -> dict[str, str]:
    """SEND_MESSAGE_V2's header (its one-letter names) for one ferry send."""
    properties = properties_of(request)
    return {
        "a": producer_group,
        "b": request.topic,
        "c": "",  # no default topic: a topic the broker lacks is refused, never made
        "d": "4",
        "e": "-1",  # the broker picks, hashing a message group
        "f": "0",
        "g": str(request.born_timestamp),
        "h": str(request.flag),
        "i": record.encode_properties(properties).decode(),
        "j": "0",
        "k": "false",
        "m": "false",
    }


def offset_of(msg_id: str) -> int:
    """The commit-log offset in an offset message id (store host, port, offset in hex)."""
    try:
        return int(msg_id[-16:], 16) if len(msg_id) in (32, 56) else 0
    except ValueError:
        return 0


def _link_refusal(
    addr: str, exc: ConnectionError | TimeoutError, what: str, timeout_s: float
) -> SendRefused:
    """A request the link lost (UNAVAILABLE) or the broker did not answer in time
    (DEADLINE_EXCEEDED): a link error, retried on another broker."""
    if isinstance(exc, ConnectionError):
        return SendRefused(grpc.StatusCode.UNAVAILABLE, f"{addr}: {exc}")
    return SendRefused(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        f"{addr} did not answer the {what} within {timeout_s:g} s",
    )


def _result(
    code: int, remark: str, msg_id: str, queue_id: int, queue_offset: int
) -> broker_pb2.SendResult:
    """A broker's answer to one send as its SendResult; raises SendRefused for a
    refusal."""
    status = _STATUS_BY_CODE.get(code)
    if status is None:
        remark = remark or f"refused with code {code}"
        raise SendRefused(refusal_status(code, remark), remark)
    return broker_pb2.SendResult(
        status=status,
        msg_id=msg_id,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_offset=offset_of(msg_id),
        message_count=1,
    )


class InProcess(Protocol):
    """A broker's send door in this process (local mode: services.broker.remoting.
    sends.InProcessSends): a send's (code, remark, outcome) as its RocketMQ-protocol
    port would answer them, without the wire."""

    async def send(
        self,
        producer_group: str,
        topic: str,
        properties: dict[str, str],
        body: bytes,
        born_timestamp: int,
        flag: int,
        timeout_s: float,
    ) -> tuple[int, str, Any]: ...


class RemotingSends:
    """One pipelined RocketMQ-protocol connection per broker, made on first use
    and again after it drops; sends to a broker in this process go to its
    in-process door (`attach_local`)."""

    def __init__(self, timeout_s: float, access_key: str = "", secret_key: str = "") -> None:
        self._timeout_s = timeout_s
        # Brokers with RocketMQ's ACL on their RocketMQ port (aclEnable) check every
        # request: sends are signed with this account, as a Java client's AclClientRPCHook
        # signs them, when it is given.
        self._access_key = access_key
        self._secret_key = secret_key
        # RocketMQ-protocol addresses whose broker refused an unsigned send that its
        # ferry.v1 port took: its ACL is on and this proxy has no account for it.
        self.unsigned_refused: set[str] = set()
        self._clients: dict[str, RemotingClient] = {}
        self._local: dict[str, InProcess] = {}
        self._connecting: dict[str, asyncio.Future[RemotingClient]] = {}
        self.stats = SendStats()

    async def call(
        self,
        addr: str,
        code: int,
        ext: dict[str, str],
        body: bytes = b"",
        timeout_s: float | None = None,
        what: str = "request",
    ) -> Command:
        """One request on the broker's connection, signed when the proxy has an
        account; the answer whatever its code. Raises SendRefused (UNAVAILABLE,
        DEADLINE_EXCEEDED) when the link fails or the broker does not answer."""
        client = await self._client(addr)
        if self._access_key:
            ext[acl.ACCESS_KEY] = self._access_key
            ext[acl.SIGNATURE] = acl.sign(self._secret_key, ext, body)
        timeout_s = self._timeout_s if timeout_s is None else timeout_s
        try:
            return await client.request(Command(code, ext=ext, body=body), timeout_s)
        except (ConnectionError, TimeoutError) as exc:
            if isinstance(exc, ConnectionError):
                self._forget(addr, client)
            raise _link_refusal(addr, exc, what, timeout_s) from None

    async def send(
        self, addr: str, request: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendResult:
        """The broker's result for one message; raises SendRefused."""
        group = request.producer_group or DEFAULT_PRODUCER_GROUP
        self.stats.calls += 1
        self.stats.messages += 1
        local = self._local.get(addr)
        if local is not None:
            self.stats.in_process += 1
            return await self._send_in_process(addr, local, group, request)
        answer = await self.call(
            addr, codes.SEND_MESSAGE_V2, header(request, group), request.body, what="send"
        )
        ext = answer.ext
        msg_id = ext.get("msgId", "")
        try:
            queue_id, queue_offset = (
                int(ext.get("queueId", "-1")),
                int(ext.get("queueOffset", "-1")),
            )
        except ValueError:
            if answer.code in _STATUS_BY_CODE:
                raise SendRefused(
                    grpc.StatusCode.INTERNAL,
                    f"{addr} answered a send with a header it cannot mean",
                ) from None
            queue_id = queue_offset = -1
        return _result(answer.code, answer.remark, msg_id, queue_id, queue_offset)

    async def _send_in_process(
        self, addr: str, local: InProcess, group: str, request: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendResult:
        timeout_s = self._timeout_s
        try:
            code, remark, outcome = await local.send(
                group,
                request.topic,
                properties_of(request),
                request.body,
                request.born_timestamp,
                request.flag,
                timeout_s,
            )
        except (ConnectionError, TimeoutError) as exc:
            raise _link_refusal(addr, exc, "send", timeout_s) from None
        if outcome is None:
            return _result(code, remark, "", -1, -1)
        return _result(
            code, remark, ",".join(outcome.msg_ids), outcome.queue_id, outcome.queue_offset
        )

    def attach_local(self, addr: str, door: InProcess) -> None:
        """Send to `addr` through `door`, a broker's send door in this process
        (local mode), its other requests going as `attach` says."""
        self._local[addr] = door

    def attach(self, addr: str, client: RemotingClient) -> None:
        """Call `addr` through `client` from now on, never dialling it: a broker's
        local-mode proxy hands its own broker an in-process link
        (`ferry.remoting.local.LocalLink`) under the broker's own address."""
        self._clients[addr] = client

    async def _client(self, addr: str) -> RemotingClient:
        client = self._clients.get(addr)
        if client is not None and not client.closed.is_set():
            return client
        pending = self._connecting.get(addr)
        if pending is None:  # one connection attempt per broker at a time
            pending = self._connecting[addr] = asyncio.ensure_future(self._connect(addr))
            pending.add_done_callback(lambda _: self._connecting.pop(addr, None))
        return await asyncio.shield(pending)

    async def _connect(self, addr: str) -> RemotingClient:
        try:
            client = await RemotingClient.connect(addr, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise SendRefused(
                grpc.StatusCode.UNAVAILABLE, f"cannot connect to {addr}: {exc or 'timed out'}"
            ) from None
        self._clients[addr] = client
        return client

    def _forget(self, addr: str, client: RemotingClient) -> None:
        if self._clients.get(addr) is client:
            del self._clients[addr]
        client.close()

    async def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for pending in list(self._connecting.values()):
            pending.cancel()
