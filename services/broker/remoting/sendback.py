"""CONSUMER_SEND_MSG_BACK (36): a push consumer's failed message, sent back to
the group's retry topic (or its DLQ) by the `SendBack` use case
(messaging/sendback.py).

Header: `offset` (the commit offset of the message as pulled), `group`,
`delayLevel` (0: 3 + reconsume times; negative: straight to the DLQ),
`maxReconsumeTimes` (honoured from clients of V3_4_9 on, as RocketMQ does;
the group's retryMaxTimes otherwise), `originMsgId`, `originTopic`,
`unitMode` (read by RocketMQ for its own bookkeeping; not needed here).

Answers: 0; 26 SUBSCRIPTION_GROUP_NOT_EXIST; 16 NO_PERMISSION (a slave, a
read-only broker); 14 (fenced, full disk, storage fault); 1 with the reason
otherwise — on anything but 0 a Java consumer sends the message to
%RETRY%<group> itself, through its inner producer.
"""

from __future__ import annotations

from ferry.remoting import codes
from ferry.remoting.codec import Command
from ferry.remoting.server import Connection, Handler
from ferry.runtime import errors
from services.broker.messaging.sendback import GroupNotFound
from services.broker.remoting import convert
from services.broker.remoting.deps import Deps

V3_4_9 = 121  # MQVersion.Version.V3_4_9's ordinal: clients that send maxReconsumeTimes


def handlers(deps: Deps) -> dict[int, Handler]:
    async def send_back(connection: Connection, command: Command) -> Command:
        ext = command.ext
        try:
            commit_offset = convert.integer(ext, "offset", low=0)
            group = convert.text(ext, "group")
            delay_level = convert.integer(ext, "delayLevel", low=-(2**31), high=2**31 - 1)
            max_times = None
            if command.version >= V3_4_9:
                max_times = convert.integer(
                    ext, "maxReconsumeTimes", required=False, default=-1, high=2**31 - 1
                )
                if max_times < 0:
                    max_times = None
            deps.gate.check()
            await deps.send_back.send_back(  # type: ignore[union-attr]
                group, commit_offset, delay_level, max_times
            )
        except GroupNotFound as e:
            return command.answer(codes.SUBSCRIPTION_GROUP_NOT_EXIST, e.message)
        except (errors.InvalidArgument, errors.FailedPrecondition) as e:
            return command.answer(codes.SYSTEM_ERROR, e.message)
        except errors.FerryError as e:
            return convert.error_answer(command, e)
        return command.answer(codes.SUCCESS)

    return {codes.CONSUMER_SEND_MSG_BACK: send_back}
