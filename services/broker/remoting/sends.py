"""Sends over RocketMQ's protocol: SEND_MESSAGE (10, long header names),
SEND_MESSAGE_V2 (310, the same fields named a–n) and SEND_BATCH_MESSAGE (320,
a V2 header and a batch body, ferry.remoting.batch).

Each handler parses and checks the header (and the batch body), turns the
request into `OutgoingMessage`s and calls the one send use case
(`SendService.send`), as ferry.v1's SendMessage does: a refused request
stores nothing. Whether a send is a transactional half (sysFlag prepared or
TRAN_MSG) is the use case's to read and route, from the message's sysFlag and
properties as sent; its answer says so (`SendOutcome.half`). What the header carries per message is kept in the record:
flag, sysFlag (the compression bits), bornTimestamp, the producer's address
as born host, reconsumeTimes. The broker strips WAIT (it says whether to wait
for the flush and the slave) and adds CLUSTER (its brokerClusterName), as
Apache's does; sends to `%RETRY%<group>` past their
maxReconsumeTimes go to `%DLQ%<group>` (the use case's rule).

The answer: msgId = the offset message id (store host + commit offset;
a batch's are joined by commas), queueId, queueOffset (of the first message),
and MSG_REGION / TRACE_ON on every answer, errors included, since a Java
producer reads the answer's extFields whatever its code.

Runs (ferry.remoting.server's `Batchable`): the sends of one code that arrived
back to back on a connection are parsed one by one here and staged together by
the use case (`SendService.stage_many`: the plain single messages appended
together, a batch or a send to a retry topic on its own in its place in the
order, the halves together), then one `settle` waits for the flush and the
slave for all of them. A request refused is answered as it would be alone; the
others go on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ferry import record
from ferry.model import check_name
from ferry.native import native as _native
from ferry.remoting import batch, codes
from ferry.remoting.codec import Command
from ferry.remoting.metrics import RemotingMetrics
from ferry.remoting.server import Batchable, Connection, Handler
from ferry.runtime.clock import answer_within
from ferry.runtime.errors import FerryError
from ferry.runtime.turns import TurnRuns
from services.broker.messaging.outgoing import (
    OutgoingMessage,
    SendOutcome,
    SendStatus,
)
from services.broker.remoting.convert import (
    BadRequest,
    boolean,
    code_of,
    error_answer,
    integer,
    text,
)
from services.broker.remoting.deps import Deps

log = logging.getLogger(__name__)

INT32 = (-(2**31), 2**31 - 1)

# The header's fields under SEND_MESSAGE's names, and SEND_MESSAGE_V2's.
LONG_NAMES = {
    "producerGroup": "producerGroup",
    "topic": "topic",
    "defaultTopic": "defaultTopic",
    "defaultTopicQueueNums": "defaultTopicQueueNums",
    "queueId": "queueId",
    "sysFlag": "sysFlag",
    "bornTimestamp": "bornTimestamp",
    "flag": "flag",
    "properties": "properties",
    "reconsumeTimes": "reconsumeTimes",
    "unitMode": "unitMode",
    "maxReconsumeTimes": "maxReconsumeTimes",
    "batch": "batch",
}
SHORT_NAMES = dict(zip(LONG_NAMES, "abcdefghijklm", strict=True))

# Message sysFlag bits (RocketMQ's MessageSysFlag).
COMPRESSED = 0x1
MULTI_TAGS = 0x2
TRANSACTION_TYPE = 0xC
INNER_BATCH = 0x80
COMPRESSION_TYPE = 0x700
# What the use case gets of a producer's sysFlag: the compression bits and the
# multi-tags bit, which a record keeps, and the transaction type, which says
# where a message goes (the send use case reads it; no record keeps it). The
# host bits describe the record's own address fields (ferry's are IPv4).
KEPT_SYS_FLAG = COMPRESSED | MULTI_TAGS | COMPRESSION_TYPE | TRANSACTION_TYPE

PROPERTY_WAIT = "WAIT"
PROPERTY_CLUSTER = "CLUSTER"

# On every answer, as Apache 4.9's broker with its default regionId and traceOn.
ANSWER_EXT = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}

STATUS_CODES = {
    SendStatus.SEND_OK: codes.SUCCESS,
    SendStatus.FLUSH_DISK_TIMEOUT: codes.FLUSH_DISK_TIMEOUT,
    SendStatus.FLUSH_SLAVE_TIMEOUT: codes.FLUSH_SLAVE_TIMEOUT,
    SendStatus.SLAVE_NOT_AVAILABLE: codes.SLAVE_NOT_AVAILABLE,
}


@dataclass(slots=True)  # not frozen: one per send or pull, and frozen __init__ costs ~5x
class SendHeader:
    """A send request's header, checked."""

    producer_group: str
    topic: str
    queue_id: int | None  # None: the broker picks
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: dict[str, str]
    reconsume_times: int
    max_reconsume_times: int | None  # None: the group's retryMaxTimes
    batch: bool


def parse_header(ext: Mapping[str, str], names: Mapping[str, str]) -> SendHeader:
    """A send header from a request's extFields under `names` (LONG_NAMES or
    SHORT_NAMES); errors name the fields by their long names.

    The header every producer sends (every field a plain decimal in range, a producer
    group seen before) takes `_parse_plain`, a third of the time (every send passes
    here), or its native twin `ferry_native.parse_send_header` when built (None: not
    sure, Python decides); anything else, and every refusal, is decided by
    `_parse_checked`.

    Raises:
        BadRequest: a field Apache requires is missing, or any field is malformed.
    """
    fields: _Fields | None = None
    if _native is not None and (names is SHORT_NAMES or names is LONG_NAMES):
        fields = _native.parse_send_header(ext, names is SHORT_NAMES, _GROUPS_CHECKED)
    if fields is None:
        try:
            fields = _parse_plain(ext, names)
        except (_NotPlain, KeyError, ValueError, BadRequest):
            fields = _parse_checked(ext, names)
    (group, topic, queue_id, sys_flag, born_timestamp, flag, properties, reconsume_times,
     max_reconsume, batch) = fields  # fmt: skip
    return SendHeader(  # positional: a third of the keyword call's cost, once per send
        group,
        topic,
        queue_id if queue_id >= 0 else None,
        sys_flag,
        born_timestamp,
        flag,
        properties,
        reconsume_times,
        max_reconsume if max_reconsume >= 0 else None,
        batch,
    )


# The header's fields as sent: (producerGroup, topic, queueId (-1: the broker
# picks), sysFlag, bornTimestamp, flag, properties, reconsumeTimes,
# maxReconsumeTimes (-1: the group's), batch).
_Fields = tuple[str, str, int, int, int, int, dict[str, str], int, int, bool]


class _NotPlain(Exception):
    """Not the common header: `_parse_checked` decides it."""


_GROUPS_CHECKED: set[str] = set()  # producer groups that passed check_name (bounded)
_GROUPS_CHECKED_MAX = 4096


def _number(value: str, low: int, high: int) -> int:
    if len(value) > 24:  # _parse_checked refuses those; int() would not
        raise _NotPlain
    number = int(value)
    if not low <= number <= high:
        raise _NotPlain
    return number


def _parse_plain(ext: Mapping[str, str], names: Mapping[str, str]) -> _Fields:
    """The header's fields when nothing in it needs a word: what `_parse_checked`
    returns for it, or _NotPlain / KeyError / ValueError / BadRequest when it might
    say more."""
    group = ext[names["producerGroup"]]
    topic = ext[names["topic"]]
    if not topic or group not in _GROUPS_CHECKED:
        raise _NotPlain
    get = ext.get
    default_nums = get(names["defaultTopicQueueNums"])
    if default_nums:
        _number(default_nums, 0, INT32[1])
    low, high = INT32
    queue_id = _number(ext[names["queueId"]], low, high)
    sys_flag = _number(ext[names["sysFlag"]], low, high)
    born_timestamp = _number(ext[names["bornTimestamp"]], 0, 2**63 - 1)
    flag = _number(ext[names["flag"]], low, high)
    properties = parse_properties(get(names["properties"], ""))
    value = get(names["reconsumeTimes"])
    reconsume_times = _number(value, 0, high) if value else 0
    value = get(names["maxReconsumeTimes"])
    max_reconsume = _number(value, low, high) if value else -1
    value = get(names["batch"])
    batch = bool(value) and value.lower() == "true"
    return (group, topic, queue_id, sys_flag, born_timestamp, flag, properties,
            reconsume_times, max_reconsume, batch)  # fmt: skip


def _parse_checked(ext: Mapping[str, str], names: Mapping[str, str]) -> _Fields:
    """The header's fields one by one, each refusal naming its field."""
    fields = {name: ext[key] for name, key in names.items() if key in ext}
    producer_group = text(fields, "producerGroup")
    check_name(producer_group, "producerGroup")
    if len(_GROUPS_CHECKED) >= _GROUPS_CHECKED_MAX:
        _GROUPS_CHECKED.clear()
    _GROUPS_CHECKED.add(producer_group)
    topic = text(fields, "topic")
    # defaultTopic and defaultTopicQueueNums only matter for auto-creation
    # (`Sends._auto_create`): checked if sent.
    integer(fields, "defaultTopicQueueNums", required=False, low=0, high=INT32[1])
    queue_id = integer(fields, "queueId", low=INT32[0], high=INT32[1])
    sys_flag = integer(fields, "sysFlag", low=INT32[0], high=INT32[1])
    born_timestamp = integer(fields, "bornTimestamp", low=0)
    flag = integer(fields, "flag", low=INT32[0], high=INT32[1])
    properties = parse_properties(fields.get("properties", ""))
    reconsume_times = integer(fields, "reconsumeTimes", required=False, low=0, high=INT32[1])
    max_reconsume = integer(
        fields, "maxReconsumeTimes", required=False, default=-1, low=INT32[0], high=INT32[1]
    )
    return (producer_group, topic, queue_id, sys_flag, born_timestamp, flag, properties,
            reconsume_times, max_reconsume, boolean(fields, "batch"))  # fmt: skip


def parse_properties(raw: str | bytes, field: str = "properties") -> dict[str, str]:
    """RocketMQ's property string `k\\x01v\\x02k\\x01v` (a trailing separator
    allowed) as a dict.

    Raises:
        BadRequest: an item without a name/value separator, or bytes that are not UTF-8.
    """
    if not raw:
        return {}
    try:
        return record.decode_properties(raw.encode() if isinstance(raw, str) else raw)
    except (record.RecordError, UnicodeEncodeError) as exc:
        raise BadRequest(field, str(exc)) from None


@functools.lru_cache(maxsize=4096)
def born_host(remote: str) -> tuple[str, int] | None:
    """A connection's "ip:port" as a record's born host; None when it is not
    IPv4 (the record then names 127.0.0.1:0)."""
    host, _, port = remote.rpartition(":")
    host = host.strip("[]").removeprefix("::ffff:")
    if not port.isdigit() or host.count(".") != 3:
        return None
    return host, int(port)


def kept_sys_flag(sys_flag: int, properties: Mapping[str, str]) -> int:
    """The sysFlag the send use case gets (KEPT_SYS_FLAG).

    Raises:
        BadRequest: an inner batch (RocketMQ 5's autoBatch), which ferry does not store.
    """
    if sys_flag & INNER_BATCH:
        raise BadRequest(
            "sysFlag", "an inner batch (autoBatch) is not supported; turn autoBatch off"
        )
    return sys_flag & KEPT_SYS_FLAG


def wait_store_msg_ok(properties: dict[str, str]) -> bool:
    """Take WAIT out of `properties`: whether the answer waits for the flush
    and the slave (absent means yes)."""
    value = properties.pop(PROPERTY_WAIT, None)
    return value is None or value.lower() == "true"


def messages_of(
    body: bytes, batch_code: bool, header: SendHeader, remote: str, cluster: str = ""
) -> tuple[list[OutgoingMessage], bool, bool]:
    """The messages a send request carries (its `body`; `batch_code`: it came as
    SEND_BATCH_MESSAGE), whether the answer waits for the
    store, and whether they are a batch. Each gets CLUSTER = `cluster` (the
    broker's brokerClusterName) when given, as Apache's broker stamps every
    message it stores from a send.

    Raises:
        BadRequest: as `kept_sys_flag`, or a batch body that does not parse.
    """
    properties = dict(header.properties)
    wait = wait_store_msg_ok(properties)
    sys_flag = kept_sys_flag(header.sys_flag, properties)
    if cluster:
        properties[PROPERTY_CLUSTER] = cluster
    host = born_host(remote)
    is_batch = header.batch or batch_code
    if not is_batch:
        message = OutgoingMessage(  # positional: once per send (see parse_header)
            body,
            "",
            "",
            properties,
            header.flag,
            header.born_timestamp,
            sys_flag,
            host,
            header.reconsume_times,
            header.max_reconsume_times,
        )
        return [message], wait, False
    try:
        entries = batch.decode(body)
    except batch.BatchError as exc:
        raise BadRequest("body", str(exc)) from None
    messages = []
    for index, entry in enumerate(entries):
        own = parse_properties(entry.properties, f"body[{index}].properties")
        wait_store_msg_ok(own)
        own.update(properties)  # the batch's own properties go on every message, as Apache's
        messages.append(
            OutgoingMessage(
                body=entry.body,
                properties=own,
                flag=entry.flag,
                born_timestamp=header.born_timestamp,
                sys_flag=sys_flag & ~COMPRESSED,  # batches are never compressed
                born_host=host,
                reconsume_times=header.reconsume_times,
            )
        )
    return messages, wait, True


class Sends:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    async def send_message(self, connection: Connection, request: Command) -> Command:
        return await self._send(connection, request, LONG_NAMES)

    async def send_message_v2(self, connection: Connection, request: Command) -> Command:
        return await self._send(connection, request, SHORT_NAMES)

    async def _send(
        self, connection: Connection, request: Command, names: Mapping[str, str]
    ) -> Command:
        try:
            self.deps.gate.check()
            header = parse_header(request.ext, names)
            messages, wait, is_batch = messages_of(
                request.body,
                request.code == codes.SEND_BATCH_MESSAGE,
                header,
                connection.remote,
                self.deps.config.cluster_name,
            )
            await self._auto_create(request, header, names)
            outcome = await self.deps.sends.send(
                header.topic, header.queue_id, messages, wait, is_batch, header.producer_group
            )
        except FerryError as exc:
            return error_answer(request, exc, ANSWER_EXT)
        return answer(request, header, outcome)

    async def _auto_create(
        self, request: Command, header: SendHeader, names: Mapping[str, str]
    ) -> None:
        """A send to a topic this broker does not have, naming a default topic
        (TBW102): the topic is created from it first, when it may be
        (messaging/autocreate.py); otherwise the send is refused as usual."""
        auto_create = self.deps.auto_create
        if auto_create is None:
            return
        default_topic = request.ext.get(names["defaultTopic"], "")
        if not auto_create.needed(header.topic, default_topic):
            return
        raw = request.ext.get(names["defaultTopicQueueNums"], "")
        queue_nums = int(raw) if raw.isdigit() and len(raw) < 10 else 4  # the client's default
        await auto_create.ensure(header.topic, default_topic, queue_nums)

    async def send_many(
        self, connection: Connection, requests: list[Command]
    ) -> list[Command | None]:
        """A run of sends (one code): each checked alone, staged together and
        settled once (`store`). The answers, in the requests' order."""
        names = LONG_NAMES if requests[0].code == codes.SEND_MESSAGE else SHORT_NAMES
        try:
            self.deps.gate.check()
        except FerryError as exc:
            return [error_answer(r, exc, ANSWER_EXT) for r in requests]
        answers: list[Command | None] = [None] * len(requests)
        parsed: list[tuple[int, SendHeader]] = []
        sends: list[Checked] = []
        cluster = self.deps.config.cluster_name
        for i, request in enumerate(requests):
            try:
                header = parse_header(request.ext, names)
                messages, wait, is_batch = messages_of(
                    request.body,
                    request.code == codes.SEND_BATCH_MESSAGE,
                    header,
                    connection.remote,
                    cluster,
                )
            except FerryError as exc:
                answers[i] = error_answer(request, exc, ANSWER_EXT)
                continue
            await self._auto_create(request, header, names)
            parsed.append((i, header))
            sends.append((header, messages, wait, is_batch))
        for (i, header), outcome in zip(parsed, await self.store(sends), strict=True):
            if isinstance(outcome, FerryError):
                answers[i] = error_answer(requests[i], outcome, ANSWER_EXT)
            else:
                answers[i] = answer(requests[i], header, outcome)
        return answers

    async def store(self, sends: Sequence[Checked]) -> list[SendOutcome | FerryError]:
        """Checked sends as they arrived back to back: staged together
        (`SendService.stage_many`, halves included), then settled once for those
        whose producer waits for the store and once for the others. Each one's
        outcome, or the error that refused it, in their order; a storage fault or
        a fence while staging refuses them all."""
        use_case = self.deps.sends
        try:
            results: list = use_case.stage_many(
                [(h.topic, h.queue_id, m, b, h.producer_group) for h, m, _, b in sends]
            )
        except FerryError as exc:
            return [exc] * len(sends)
        for wait in (False, True):
            members = [
                i
                for i, result in enumerate(results)
                if sends[i][2] is wait and not isinstance(result, FerryError)
            ]
            if not members:
                continue
            try:
                status = await use_case.settle([results[i] for i in members], wait)
            except FerryError as exc:
                for i in members:
                    results[i] = exc
                continue
            for i in members:
                results[i] = results[i].outcome(status)
        return results


# A send checked and turned into messages: its header, its messages, whether its
# producer waits for the store, whether it is a batch.
Checked = tuple[SendHeader, list[OutgoingMessage], bool, bool]
# An in-process send's answer: the code and remark the socket would give, the
# outcome when stored.
Answered = tuple[int, str, SendOutcome | None]


class InProcessSends:
    """Sends from a proxy in this process (local mode, enableProxy): the steps of
    this door (`messages_of`, `Sends.store`) without its wire, so no header is
    encoded and parsed and no answer built and read for a message that never
    leaves the process. The sends asked for in one turn of the event loop go
    together as one run, as requests that arrive back to back on a socket do.
    Counted in the RocketMQ-protocol metrics as SEND_MESSAGE_V2s, which is what the
    proxy sends a broker that is not its own."""

    def __init__(
        self, sends: Sends, metrics: RemotingMetrics | None = None, remote: str = "127.0.0.1:0"
    ) -> None:
        """`remote`: the born host the messages get (the proxy's own address)."""
        self._sends = sends
        self._metrics = metrics
        self._remote = remote
        self._runs: TurnRuns[None, tuple[SendHeader, bytes], Answered] = TurnRuns(
            self._run, "the broker is stopping"
        )

    async def send(
        self,
        producer_group: str,
        topic: str,
        properties: dict[str, str],
        body: bytes,
        born_timestamp: int,
        flag: int,
        timeout_s: float,
    ) -> Answered:
        """One message, the broker picking its queue (hashing a message group): the
        code and remark the RocketMQ-protocol door would answer it with, and the
        outcome when stored (SUCCESS, or a flush or slave wait that timed out).
        TimeoutError when the run has not ended after `timeout_s` (it goes on)."""
        header = SendHeader(
            producer_group, topic, None, 0, born_timestamp, flag, properties, 0, None, False
        )
        return await answer_within(self._runs.submit(None, (header, body)), timeout_s)

    async def _run(self, _: None, run: list[tuple[SendHeader, bytes]]) -> list[Answered]:
        try:
            answers = await self._answers(run)
        except Exception as exc:  # a bug fails this run only, as a socket's run_answers does
            log.exception("in-process sends: a run of %d failed", len(run))
            answers = [(codes.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}", None)] * len(run)
        if self._metrics is not None:
            counts: dict[int, int] = {}
            for code, _, _ in answers:
                counts[code] = counts.get(code, 0) + 1
            for code, n in counts.items():
                self._metrics.request(codes.SEND_MESSAGE_V2, code, n)
        return answers

    async def _answers(self, run: list[tuple[SendHeader, bytes]]) -> list[Answered]:
        try:
            self._sends.deps.gate.check()
        except FerryError as exc:
            return [(code_of(exc), exc.message, None)] * len(run)
        answers: list[Answered] = [(codes.SYSTEM_ERROR, "unanswered", None)] * len(run)
        checked: list[int] = []
        sends: list[Checked] = []
        cluster = self._sends.deps.config.cluster_name
        for i, (header, body) in enumerate(run):
            try:
                messages, wait, is_batch = messages_of(body, False, header, self._remote, cluster)
            except FerryError as exc:
                answers[i] = (code_of(exc), exc.message, None)
                continue
            checked.append(i)
            sends.append((header, messages, wait, is_batch))
        for i, outcome in zip(checked, await self._sends.store(sends), strict=True):
            if isinstance(outcome, FerryError):
                answers[i] = (code_of(outcome), outcome.message, None)
            else:
                answers[i] = (STATUS_CODES[outcome.status], "", outcome)
        return answers


def answer(request: Command, header: SendHeader, outcome: SendOutcome) -> Command:
    """The answer to a stored send. transactionId = the message's UNIQ_KEY
    when it has one, as RocketMQ 5's broker answers every send (a half's msgId
    and queueOffset are the half's, what END_TRANSACTION names)."""
    queue_id = header.queue_id if header.queue_id is not None else outcome.queue_id
    ext = {
        "msgId": ",".join(outcome.msg_ids),
        # The queue the producer chose, as Apache answers it, even when
        # the message waits elsewhere (DELAY) or went to the DLQ.
        "queueId": str(queue_id),
        "queueOffset": str(outcome.queue_offset),
        **ANSWER_EXT,
    }
    uniq = header.properties.get("UNIQ_KEY")
    if uniq:
        ext["transactionId"] = uniq
    return request.answer_text(STATUS_CODES[outcome.status], ext)


def handlers(deps: Deps) -> dict[int, Handler]:
    sends = Sends(deps)
    return {
        codes.SEND_MESSAGE: Batchable(sends.send_message, sends.send_many),
        codes.SEND_MESSAGE_V2: Batchable(sends.send_message_v2, sends.send_many),
        codes.SEND_BATCH_MESSAGE: Batchable(sends.send_message_v2, sends.send_many),
    }
