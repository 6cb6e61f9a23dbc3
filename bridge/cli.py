"""The `bridge` command. Nothing else imports this module.

Exit codes: 0 success, 1 runtime failure, 2 invalid configuration or usage. A user never sees
a traceback (set BRIDGE_DEBUG=1 to get one); everything printed passes through the redactor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from bridge import __version__
from bridge.config.loader import LoadedConfig, load_config
from bridge.config.models import BridgeConfig
from bridge.errors import BridgeError, ConfigError
from bridge.nservicebus.messages import endpoint_message
from bridge.nservicebus.wireformat import parse_timespan
from bridge.protocols import Transport
from bridge.service.tuning import tune_process
from bridge.telemetry.logs import setup_logging
from bridge.telemetry.redact import redactor
from bridge.transports import load

__all__ = ["main"]

log = logging.getLogger("bridge")


class UsageError(Exception):
    """Bad command-line usage: exit 2."""


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


def _parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "-c", "--config", default="routes.yaml", help="routes file (default: routes.yaml)"
    )
    common.add_argument(
        "--log-level", default=os.environ.get("BRIDGE_LOG_LEVEL", "INFO"), help="log level"
    )
    common.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=os.environ.get("BRIDGE_LOG_FORMAT", "text"),
        help="text for people, json for log collectors (env BRIDGE_LOG_FORMAT)",
    )
    parser = _Parser(prog="bridge", description="Bridge NServiceBus SQL queues, Kafka, RabbitMQ.")
    parser.add_argument("--version", action="version", version=f"bridge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    check = commands.add_parser("check", parents=[common], help="validate the config")
    check.add_argument("--connect", action="store_true", help="also reach every connection")

    install = commands.add_parser("install", parents=[common], help="create queues and topics")
    install.add_argument("--print-sql", action="store_true", help="print the DDL, run nothing")

    run = commands.add_parser("run", parents=[common], help="run the routes")
    run.add_argument("--route", action="append", default=[], help="run only this route")
    run.add_argument(
        "--until-idle", type=float, metavar="SECONDS", help="exit once all sources stay empty"
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

    send = commands.add_parser("send", parents=[common], help="send messages like an endpoint")
    send.add_argument("connection")
    send.add_argument("queue", help="queue table, topic or RabbitMQ queue")
    send.add_argument("--header", action="append", default=[], metavar="K=V")
    send.add_argument("--ttl", metavar="TIMESPAN", help="time to be received, e.g. 00:00:30")
    send.add_argument("--body", default="{}", help="message body, or @FILE")
    send.add_argument("--count", type=int, default=1, help="how many messages")

    peek = commands.add_parser("peek", parents=[common], help="depth, oldest age, expired")
    peek.add_argument("connection")
    peek.add_argument("queue")
    peek.add_argument("--json", action="store_true", help="print JSON")

    migrate = commands.add_parser("migrate", parents=[common], help="bulk-move with PySpark")
    migrate.add_argument("--route", required=True)
    migrate.add_argument("--master", default="local[*]")
    migrate.add_argument("--partitions", type=int)

    report = commands.add_parser(
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


def _load(args: argparse.Namespace) -> LoadedConfig:
    # `install --print-sql` connects to nothing: it needs no credentials, only names.
    loaded = load_config(args.config, offline=getattr(args, "print_sql", False))
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    for connection in loaded.config.connections.values():
        for attr in ("dsn", "url"):
            value = getattr(connection, attr, None)
            if isinstance(value, str):
                redactor.add_from_dsn(value)
        redactor.add([getattr(connection, "sasl_password", None)])
    return loaded


def _addresses(config: BridgeConfig, names: Sequence[str] | None = None) -> dict[str, list[str]]:
    """Every address each connection needs: sources, destinations and error queues."""
    needed: dict[str, list[str]] = {}
    for route in config.routes:
        if names and route.name not in names:
            continue
        for connection, address in (
            (route.from_.connection, route.from_.address),
            (route.to.connection, route.to.address),
            (route.from_.connection, route.error_queue_name),
        ):
            bucket = needed.setdefault(connection, [])
            if address not in bucket:
                bucket.append(address)
    return needed


def _transport(config: BridgeConfig, name: str) -> Transport:
    connection = config.connections.get(name)
    if connection is None:
        known = ", ".join(sorted(config.connections)) or "none"
        raise UsageError(f"no connection named {name!r} in the config (known: {known})")
    return load(name, connection)


async def _check(args: argparse.Namespace) -> int:
    loaded = _load(args)
    config = loaded.config
    print(f"{args.config}: OK ({len(config.connections)} connections, {len(config.routes)} routes)")
    if not args.connect:
        return 0
    failures = 0
    for name, addresses in _addresses(config).items():
        transport = _transport(config, name)
        try:
            warnings = await transport.check(addresses)
        except BridgeError as exc:
            failures += 1
            print(f"{name}: FAILED: {exc}")
            continue
        finally:
            await transport.close()
        print(f"{name}: OK ({', '.join(addresses)})")
        for warning in warnings:
            print(f"{name}: warning: {warning}")
    return 1 if failures else 0


async def _install(args: argparse.Namespace) -> int:
    config = _load(args).config
    for name, addresses in _addresses(config).items():
        transport = _transport(config, name)
        try:
            statements = await transport.install(addresses, print_only=args.print_sql)
        finally:
            await transport.close()
        if args.print_sql:
            print(f"-- connection {name} ({config.connections[name].type})")
            for statement in statements:  # each transport's own runnable form
                print(statement + "\n")
        else:
            print(f"{name}: installed {', '.join(addresses)}")
    return 0


def _parse_headers(pairs: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--header takes NAME=VALUE, got {pair!r}")
        out.append((name, value))
    return out


def _read_body(spec: str) -> bytes:
    if spec.startswith("@"):
        try:
            return Path(spec[1:]).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read body file {spec[1:]!r}: {exc.strerror}") from None
    return spec.encode("utf-8")


async def _send(args: argparse.Namespace) -> int:
    config = _load(args).config
    if args.count < 1:
        raise UsageError("--count must be at least 1")
    if args.ttl is not None:
        try:
            parse_timespan(args.ttl)
        except ValueError:
            raise UsageError(f"--ttl takes a TimeSpan like 00:00:30, got {args.ttl!r}") from None
    extra = _parse_headers(args.header)
    body = _read_body(args.body)
    transport = _transport(config, args.connection)
    try:
        sink = transport.sink(args.queue)
        sent = 0
        while sent < args.count:
            size = min(1000, args.count - sent)
            chunk = [endpoint_message(body, extra, args.ttl) for _ in range(size)]
            await sink.send(chunk)
            sent += len(chunk)
        await sink.close()
    finally:
        await transport.close()
    print(f"sent {sent} message{'s' if sent != 1 else ''} to {args.connection}/{args.queue}")
    return 0


async def _peek(args: argparse.Namespace) -> int:
    config = _load(args).config
    transport = _transport(config, args.connection)
    try:
        stats = await transport.peek(args.queue)
    finally:
        await transport.close()
    data: dict[str, Any] = {
        "connection": args.connection,
        "queue": args.queue,
        "depth": stats.depth,
        "oldest_age_seconds": stats.oldest_age_seconds,
        "expired": stats.expired,
    }
    if args.json:
        print(json.dumps(data))
    else:
        age = stats.oldest_age_seconds
        print(f"{args.connection}/{args.queue}")
        print(f"  depth:   {stats.depth}")
        print(f"  oldest:  {'-' if age is None else f'{age:.1f} s'}")
        print(f"  expired: {stats.expired}")
    return 0


async def _run(args: argparse.Namespace) -> int:
    from bridge.service.supervisor import Supervisor
    from bridge.telemetry.tracing import setup_tracing

    config = _load(args).config
    unknown = [name for name in args.route if name not in {r.name for r in config.routes}]
    if unknown:
        raise UsageError(f"no route named {unknown[0]!r} in {args.config}")
    if args.workers > 1 and args.worker_index is None:
        return await _primary(args, config)
    link = None
    if args.worker_fd is not None:
        from bridge.config.models import HttpConfig
        from bridge.service.workers import WorkerLink

        link = WorkerLink(args.worker_fd)
        if config.http is not None:  # the primary serves the port; this worker, one of its own
            config = config.model_copy(update={"http": HttpConfig(host="127.0.0.1", port=0)})
    if setup_tracing():
        log.info("exporting traces over OTLP")
    supervisor = Supervisor(
        config, routes=args.route or None, until_idle=args.until_idle, link=link
    )
    tune_process()
    return await supervisor.run()


async def _primary(args: argparse.Namespace, config: BridgeConfig) -> int:
    """`bridge run --workers N`: start N workers with this command's own flags, keep them up."""
    from bridge.service.workers import Workers

    worker_args = [
        "-c",
        args.config,
        "--log-level",
        args.log_level,
        "--log-format",
        args.log_format,
    ]
    for name in args.route:
        worker_args += ["--route", name]
    if args.until_idle is not None:
        worker_args += ["--until-idle", str(args.until_idle)]
    names = [r.name for r in config.routes if not args.route or r.name in args.route]
    http = None if config.http is None else (config.http.host, config.http.port)
    workers = Workers(
        args.workers, worker_args, routes=names, http=http, until_idle=args.until_idle is not None
    )
    return await workers.run()


async def _migrate(args: argparse.Namespace) -> int:
    _load(args)
    from bridge.migrate import require_spark

    require_spark("migrate")
    from bridge.migrate.driver import MigrationFailed, migrate
    from bridge.migrate.spec import JobSpec

    spec = JobSpec.from_file(args.config, args.route)
    try:
        summary = await migrate(spec, master=args.master, partitions=args.partitions)
    except MigrationFailed as exc:
        if exc.summary is not None:  # how far it got, before the error line
            print(exc.summary.describe(), flush=True)
        raise
    print(summary.describe())
    return 0


async def _report(args: argparse.Namespace) -> int:
    config = _load(args).config
    if args.connection not in config.connections:
        known = ", ".join(sorted(config.connections)) or "none"
        raise UsageError(f"no connection named {args.connection!r} in the config (known: {known})")
    from bridge.migrate import require_spark

    require_spark("report")
    from bridge.migrate.render import render
    from bridge.migrate.report import build_report
    from bridge.migrate.spec import ShippedConfig

    report = await build_report(
        ShippedConfig.read(args.config),
        args.connection,
        args.queue,
        top=args.top,
        master=args.master,
        partitions=args.partitions,
    )
    print(render(report, "json" if args.json else "csv" if args.csv else "table"), end="")
    return 0


_COMMANDS = {
    "check": _check,
    "install": _install,
    "run": _run,
    "send": _send,
    "peek": _peek,
    "migrate": _migrate,
    "report": _report,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        setup_logging(args.log_level, args.log_format, worker=getattr(args, "worker_index", None))
    except ValueError:
        print(f"bridge: error: unknown --log-level {args.log_level!r}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_COMMANDS[args.command](args))
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
