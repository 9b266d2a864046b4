"""`ferry send --transaction commit|rollback|unknown`: one transactional message
by hand (ferry.client.transactions).

commit / rollback: the half is stored, then ended so at once. unknown: the half
is stored and left undecided; the command then waits for the broker's
check-back (after transactionTimeOut, at its next transactionCheckInterval
pass) and answers it with --check-answer, or exits after --check-wait-s
(the broker then checks other producers of the group, and gives the message
up after transactionCheckMax checks).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from ferry.client.broker import NoRoute
from ferry.client.transactions import Check, TransactionProducer, TransactionState
from ferry.runtime.errors import InvalidArgument, NotFound
from services.cli.namesrv_cmds import client as namesrv_client

DEFAULT_GROUP = "ferry-cli-tx"
STATES = {
    "commit": TransactionState.COMMIT,
    "rollback": TransactionState.ROLLBACK,
    "unknown": TransactionState.UNKNOWN,
}


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--transaction",
        choices=sorted(STATES),
        default=None,
        help="send as a transactional message and end the transaction so: commit delivers "
        "it, rollback discards it, unknown leaves it to the broker's check-back (answered "
        "with --check-answer)",
    )
    p.add_argument(
        "--producer-group",
        default=DEFAULT_GROUP,
        metavar="GROUP",
        help=f"with --transaction: the producer group the broker checks back with (default "
        f"{DEFAULT_GROUP})",
    )
    p.add_argument(
        "--check-answer",
        choices=["commit", "rollback", "none"],
        default="commit",
        help="with --transaction unknown: the answer to the broker's check-back (default "
        "commit; none: answer nothing and exit)",
    )
    p.add_argument(
        "--check-wait-s",
        type=float,
        default=120.0,
        metavar="S",
        help="with --transaction unknown: how long to wait for the check-back (default 120 s: "
        "the broker checks after transactionTimeOut, 6 s, at its next pass, every 60 s)",
    )


def send_transaction(args: argparse.Namespace, body: bytes) -> int:
    if args.count != 1 or args.batch != 1:
        raise InvalidArgument("--transaction", "sends one message: drop --count and --batch")
    if args.delay_level or args.delay_ms is not None or args.deliver_at or args.message_group:
        raise InvalidArgument(
            "--transaction", "a transactional message cannot be delayed, timed or grouped"
        )
    state = STATES[args.transaction]
    answered = threading.Event()
    answer = args.check_answer

    def checker(check: Check) -> TransactionState:
        print(
            f"check-back from the broker: msgId={check.msg_id} topic={check.message.topic}; "
            f"answering {answer}",
            file=sys.stderr,
            flush=True,
        )
        answered.set()
        return STATES.get(answer, TransactionState.UNKNOWN)

    waiting = state is TransactionState.UNKNOWN and answer != "none"
    with (
        namesrv_client(args) as ns,
        TransactionProducer(
            ns, args.producer_group, checker=checker if waiting else None
        ) as producer,
    ):
        try:
            out = producer.send(
                args.topic, body, lambda sent: state, tags=args.tags, keys=args.keys
            )
        except NoRoute as exc:
            raise NotFound(str(exc)) from None
        r = out.sent.result
        print(
            f"{args.transaction.upper()} msgId={out.msg_id} offsetMsgId={r.msg_id} "
            f"broker={out.sent.broker_name} ({out.sent.broker_addr}) "
            f"halfQueueOffset={r.queue_offset} producerGroup={args.producer_group}"
        )
        if not waiting:
            return 0
        print(
            f"waiting up to {args.check_wait_s:g} s for the broker's check-back ...",
            file=sys.stderr,
            flush=True,
        )
        started = time.monotonic()
        if not answered.wait(args.check_wait_s):
            print(
                f"no check-back within {args.check_wait_s:g} s; the transaction stays undecided "
                "(the broker checks again at its next pass)",
                file=sys.stderr,
            )
            return 1
        # The answer goes out once the checker returns: give it a moment to be sent.
        deadline = time.monotonic() + 10
        while producer.checks_answered < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        print(f"checked back after {time.monotonic() - started:.1f} s; answered {answer.upper()}")
        return 0 if producer.checks_answered else 1
