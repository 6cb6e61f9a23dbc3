"""The `bridge` command: its options and which command they call (`bridge.commands`).
Nothing but the entry points (`bridge`, `python -m bridge`) imports this module.

`-c/--config`, `--log-level` and `--log-format` are accepted before the command as well as
after it; given in both places, the one after the command wins.

Exit codes: 0 success, 1 runtime failure, 2 invalid configuration or usage, 130 stopped by
Ctrl-C. A user never sees a traceback (set BRIDGE_DEBUG=1 to get one); everything printed
passes through the redactor.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from bridge import __version__, commands
from bridge.errors import BridgeError, ConfigError, UsageError
from bridge.telemetry.logs import setup_logging
from bridge.telemetry.redact import redactor

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _worker_count(text: str) -> int:
    """`--workers` (or BRIDGE_WORKERS, its default): a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of at least 1 (from --workers or BRIDGE_WORKERS), got {text!r}"
        )
    return value


def _idle_seconds(text: str) -> float:
    """`--until-idle`: seconds, 0 or more (0: drain, then stop)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"takes seconds, 0 or more (0: stop as soon as every source is drained), got {text!r}"
        )
    return value


def _common_options(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """The options every command takes. Only the top-level parser sets their defaults: a
    command's parser leaves an option it was not given unset, so one given before the
    command stands."""

    def default(value: str) -> str:
        return value if with_defaults else argparse.SUPPRESS

    parser.add_argument(
        "-c", "--config", default=default("routes.yaml"), help="routes file (default: routes.yaml)"
    )
    parser.add_argument(
        "--log-level",
        default=default(os.environ.get("BRIDGE_LOG_LEVEL", "INFO")),
        help="log level (env BRIDGE_LOG_LEVEL; default INFO)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=default(os.environ.get("BRIDGE_LOG_FORMAT", "text")),
        help="text for people, json for log collectors (env BRIDGE_LOG_FORMAT)",
    )


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    _common_options(common, with_defaults=False)
    parser = _Parser(prog="bridge", description="Bridge NServiceBus SQL queues, Kafka, RabbitMQ.")
    parser.add_argument("--version", action="version", version=f"bridge {__version__}")
    _common_options(parser, with_defaults=True)
    subcommands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = subcommands.add_parser("check", parents=[common], help="validate the config")
    check.add_argument("--connect", action="store_true", help="also reach every connection")

    install = subcommands.add_parser("install", parents=[common], help="create queues and topics")
    install.add_argument("--print-sql", action="store_true", help="print the DDL, run nothing")

    run = subcommands.add_parser("run", parents=[common], help="run the routes")
    run.add_argument("--route", action="append", default=[], help="run only this route")
    run.add_argument(
        "--until-idle",
        type=_idle_seconds,
        metavar="SECONDS",
        help="exit once every source has been found empty and stayed so for SECONDS "
        "(0: drain, then stop); prints what each route did",
    )
    run.add_argument(
        "--workers",
        type=_worker_count,
        default=os.environ.get("BRIDGE_WORKERS", "1"),
        help="worker processes that run the routes side by side, one per core "
        "(env BRIDGE_WORKERS; default 1: this process runs them)",
    )
    run.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    run.add_argument("--worker-fd", type=int, help=argparse.SUPPRESS)

    send = subcommands.add_parser("send", parents=[common], help="send messages like an endpoint")
    send.add_argument("connection", help="a connection of the config")
    send.add_argument("queue", help="queue table, topic or RabbitMQ queue")
    send.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="K=V",
        help="a header to add or replace, e.g. NServiceBus.EnclosedMessageTypes=Shop.Order "
        "(repeatable; NServiceBus.ContentType replaces the one the body gives)",
    )
    send.add_argument(
        "--ttl",
        metavar="TIMESPAN",
        help="time to be received, e.g. 00:00:30: from 00:00:00.001 to 24.20:31:23.647, in "
        "whole milliseconds (what every transport carries)",
    )
    when = send.add_mutually_exclusive_group()
    when.add_argument(
        "--delay",
        metavar="TIMESPAN",
        help="deliver no earlier than this long from now, e.g. 00:00:05, by the destination's "
        "own delayed delivery (RabbitMQ: NServiceBus's delay infrastructure)",
    )
    when.add_argument(
        "--deliver-at",
        metavar="TIME",
        help="deliver no earlier than this ISO 8601 time with its UTC offset, e.g. "
        "2026-11-26T10:00:00Z",
    )
    send.add_argument(
        "--body",
        default="{}",
        help="message body, or @FILE (default {}); labelled JSON, XML, text or binary by "
        "what it is",
    )
    send.add_argument(
        "--count", type=int, default=1, help="how many messages, each with its own id (default 1)"
    )

    peek = subcommands.add_parser("peek", parents=[common], help="depth, oldest age, expired")
    peek.add_argument("connection", help="a connection of the config")
    peek.add_argument("queue", help="queue table, topic or RabbitMQ queue")
    peek.add_argument("--json", action="store_true", help="print JSON")

    endpoints = subcommands.add_parser(
        "endpoints", parents=[common], help="the endpoint registry: addresses and derived routes"
    )
    endpoints.add_argument("--json", action="store_true", help="print JSON")
    endpoints.add_argument(
        "--connect",
        action="store_true",
        help="also read each subscription's state where its publisher lives",
    )
    for verb in ("subscribe", "unsubscribe"):
        change = subcommands.add_parser(
            verb, parents=[common], help=f"{verb} an endpoint's proxy by hand"
        )
        change.add_argument("--endpoint", required=True, help="a registered endpoint")
        change.add_argument("--event", required=True, help="an event it subscribes to")

    migrate = subcommands.add_parser("migrate", parents=[common], help="bulk-move with PySpark")
    migrate.add_argument("--route", required=True, help="the route whose backlog to move")
    migrate.add_argument(
        "--master",
        default="local[*]",
        help="Spark master URL: local[N], local[N,F] (F tries per task), spark://HOST:PORT, "
        "yarn, k8s://URL (default local[*]: every core, no retries)",
    )
    migrate.add_argument(
        "--partitions",
        type=int,
        help="Spark tasks the backlog is split into (default 4 per core Spark has)",
    )

    report = subcommands.add_parser(
        "report", parents=[common], help="what queue tables hold (read-only, with PySpark)"
    )
    report.add_argument("connection", help="a SQL connection")
    report.add_argument("queue", nargs="+", help="queue tables to read")
    output = report.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON")
    output.add_argument("--csv", action="store_true", help="print CSV")
    report.add_argument("--top", type=int, default=10, help="largest messages listed")
    report.add_argument("--master", default="local[*]", help="Spark master URL")
    report.add_argument("--partitions", type=int, help="ranges per queue")
    return parser


async def _dispatch(args: argparse.Namespace) -> int:
    config = args.config
    match args.command:
        case "check":
            return await commands.check(config, connect=args.connect)
        case "install":
            return await commands.install(config, print_only=args.print_sql)
        case "run":
            return await commands.run(
                config,
                log_level=args.log_level,
                log_format=args.log_format,
                routes=args.route,
                until_idle=args.until_idle,
                workers=args.workers,
                worker_index=args.worker_index,
                worker_fd=args.worker_fd,
            )
        case "send":
            return await commands.send(
                config,
                args.connection,
                args.queue,
                headers=args.header,
                body=args.body,
                ttl=args.ttl,
                count=args.count,
                delay=args.delay,
                deliver_at=args.deliver_at,
            )
        case "endpoints":
            return await commands.endpoints(config, as_json=args.json, connect=args.connect)
        case "subscribe" | "unsubscribe":
            return await commands.subscription(
                config, args.endpoint, args.event, subscribe=args.command == "subscribe"
            )
        case "peek":
            return await commands.peek(config, args.connection, args.queue, as_json=args.json)
        case "migrate":
            return await commands.migrate(
                config, args.route, master=args.master, partitions=args.partitions
            )
        case "report":
            return await commands.report(
                config,
                args.connection,
                args.queue,
                output="json" if args.json else "csv" if args.csv else "table",
                top=args.top,
                master=args.master,
                partitions=args.partitions,
            )
    raise AssertionError(f"no command {args.command!r}")  # argparse allows only the above


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        setup_logging(args.log_level, args.log_format, worker=getattr(args, "worker_index", None))
    except ValueError:
        print(f"bridge: error: unknown --log-level {args.log_level!r}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_dispatch(args))
    except ConfigError as exc:
        print(redactor(str(exc)), file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"bridge {args.command}: error: {redactor(str(exc))}", file=sys.stderr)
        return 2
    except BridgeError as exc:
        print(f"bridge {args.command}: {redactor(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if os.environ.get("BRIDGE_DEBUG"):
            raise
        print(
            f"bridge {args.command}: unexpected {type(exc).__name__}: {redactor(str(exc))}",
            file=sys.stderr,
        )
        return 1
