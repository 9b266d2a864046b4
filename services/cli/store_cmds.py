"""`ferry store clean`: a broker's store, on demand."""

from __future__ import annotations

import argparse

from ferry.client.broker import BrokerClient
from ferry.model import check_addr
from services.cli.namesrv_cmds import BROKER_HELP, add_admin_token_option, add_tls_options
from services.cli.output import message_json

_CLEAN_HELP = """\
Run one retention pass on a broker now (RocketMQ's deleteExpiredCommitLog).

It deletes, oldest first, the commit-log files whose last write is older than
the broker's fileReservedTime (hours), and the consume-queue files that
pointed only into them. If the disk is fuller than diskSpaceCleanForciblyRatio
(and cleanFileForciblyEnable is true) it also deletes the oldest files that
have not expired yet, until the disk is back under that ratio. It never
deletes the file being written, nor bytes not yet flushed or dispatched.

Unlike the broker's own passes, it ignores deleteWhen (the hours of the day at
which expired files are deleted): it runs whatever the hour.

Consumers whose offset falls below a queue's new min offset get OFFSET_MOVED
and resume at the new min; the deleted messages are gone. A slave cleans its
own files: run it against each broker. It changes state, so it needs the
broker's admin token (--admin-token or $FERRY_ADMIN_TOKEN) if it has one.
`ferry runtime -b` shows the retention settings and the disk use."""


def add_commands(sub: argparse._SubParsersAction) -> None:
    store = sub.add_parser(
        "store",
        help="a broker's store: delete expired commit-log files now",
        description="Manage a broker's store (its commit log and consume queues).",
    )
    ssub = store.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = ssub.add_parser(
        "clean",
        help="delete expired commit-log files now, ignoring deleteWhen",
        description=_CLEAN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-b", "--broker", required=True, metavar="HOST:PORT", help=BROKER_HELP)
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long to wait for the pass (default 60; deleting many files takes a while)",
    )
    add_admin_token_option(p)
    add_tls_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=clean)


def clean(args: argparse.Namespace) -> int:
    check_addr(args.broker, "--broker")
    with BrokerClient(args.broker, timeout_s=args.timeout, admin_token=args.admin_token) as c:
        result = c.delete_expired_commit_log()
    if args.json:
        print(message_json(result))
        return 0
    if result.deleted_files:
        print(
            f"deleted {result.deleted_files} commit-log files and {result.consume_queue_files} "
            f"consume-queue files on {args.broker}"
        )
    else:
        print(
            f"deleted no file on {args.broker}: no commit-log file before the one being "
            "written is older than fileReservedTime, and the disk is under "
            "diskSpaceCleanForciblyRatio"
        )
    print(f"commit log min offset: {result.min_offset}")
    print(f"disk used: {result.disk_used_ratio:.1%}")
    return 0
