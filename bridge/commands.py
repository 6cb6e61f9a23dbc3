"""What each `bridge` command does, called by `bridge.cli` with the parsed options.

Each command loads the config, does its work, prints for the user and returns the exit code;
a wrong call raises `UsageError`. Every connection's secrets are given to the redactor as the
config is loaded, so nothing printed afterwards shows them.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from bridge.config.loader import LoadedConfig, load_config
from bridge.config.models import BridgeConfig, DerivedRoute, Route
from bridge.envelope import MESSAGE_ID
from bridge.errors import AccessRefused, BridgeError, TransportUnavailable, UsageError
from bridge.nservicebus.delays import DELAY_WITH_TTL, parse_delay, parse_deliver_at
from bridge.nservicebus.messages import content_type_of, endpoint_message, parse_ttl
from bridge.protocols import PreparesSources, QueueStats, ReadsOldestAge, Transport
from bridge.service.capacity import connection_warnings
from bridge.service.delaying import delaying_sink, longest_delay, waiting_delays
from bridge.telemetry.redact import redactor
from bridge.transports import load
from bridge.transports.sql.transport import Transport as SqlTransport

__all__ = [
    "check",
    "endpoints",
    "install",
    "migrate",
    "peek",
    "report",
    "run",
    "send",
    "subscription",
]

#: Messages `send` hands the sink per call.
SEND_CHUNK = 1000


def load_routes(path: str, *, offline: bool = False) -> LoadedConfig:
    """The config at `path`, its warnings printed and its secrets known to the redactor.

    `offline`: nothing will connect, so no credentials are needed, only names.
    """
    loaded = load_config(path, offline=offline)
    for warning in loaded.warnings:
        print(warning, file=sys.stderr)
    for connection in loaded.config.connections.values():
        for attr in ("dsn", "url", "management_url"):
            value = getattr(connection, attr, None)
            if isinstance(value, str):
                redactor.add_from_dsn(value)
        redactor.add([getattr(connection, "sasl_password", None)])
    return loaded


def addresses(config: BridgeConfig, *, installing: bool = False) -> dict[str, list[str]]:
    """Every address each connection needs: sources, destinations and error queues.

    `installing`: what `bridge install` creates. The registry's endpoints own their queues; the
    proxies and their error queues are created only with `proxies: {create: true}`.
    """
    ends = []
    for route in config.all_routes:
        if _proxy_left_alone(config, route, installing):
            continue
        ends.append((route.from_.connection, route.from_.address))
        # An endpoint's own queue is the endpoint's to make; an event route publishes.
        own = installing and isinstance(route, DerivedRoute)
        if not (own or route.publish):
            ends.append((route.to.connection, route.to.address))
        error_queue = config.error_queue_of(route)
        if error_queue is not None:
            ends.append((route.from_.connection, error_queue))
    for connection, topics in config.registry.pubsub.event_topics().items():
        ends += [(connection, topic) for topic in topics]  # where events go to Kafka, once
    return _by_connection(ends)


def describe_counts(config: BridgeConfig) -> str:
    """`2 connections, 1 route, 4 derived from 3 endpoints`."""

    def count(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    out = f"{count(len(config.connections), 'connection')}, {count(len(config.routes), 'route')}"
    if config.endpoints:
        out += f", {len(config.derived_routes)} derived from "
        out += count(len(config.endpoints), "endpoint")
    return out


def sources(config: BridgeConfig, *, installing: bool = False) -> dict[str, list[str]]:
    """The addresses each connection's routes receive from (`installing`: of the routes whose
    sources `bridge install` makes: not proxies unless `proxies: {create: true}`)."""
    return _by_connection(
        (route.from_.connection, route.from_.address)
        for route in config.all_routes
        if not _proxy_left_alone(config, route, installing)
    )


def _proxy_left_alone(config: BridgeConfig, route: Route, installing: bool) -> bool:
    """Whether `bridge install` leaves `route` alone: a derived route's proxy and error queue
    are made only with `proxies: {create: true}`."""
    return installing and isinstance(route, DerivedRoute) and not config.proxies.create


def _by_connection(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """(connection, address) pairs as each connection's addresses, each once, in order."""
    out: dict[str, list[str]] = {}
    for connection, address in pairs:
        bucket = out.setdefault(connection, [])
        if address not in bucket:
            bucket.append(address)
    return out


def _known_connection(config: BridgeConfig, name: str) -> None:
    if name not in config.connections:
        known = ", ".join(sorted(config.connections)) or "none"
        raise UsageError(f"no connection named {name!r} in the config (known: {known})")


def _transport(config: BridgeConfig, name: str) -> Transport:
    _known_connection(config, name)
    return load(name, config.connections[name])


async def _exists(transport: Transport, address: str) -> bool:
    try:
        await transport.check([address])
    except BridgeError:
        return False
    return True


async def check(config_path: str, *, connect: bool) -> int:
    """Validate the config; with `connect`, reach every connection and each address it needs,
    and warn where the routes could need more server connections than are left
    (`bridge.service.capacity`)."""
    config = load_routes(config_path).config
    print(f"{config_path}: OK ({describe_counts(config)})")
    if not connect:
        return 0
    failures = 0
    proxies: dict[str, list[str]] = {}
    for place in config.registry.proxies():
        proxies.setdefault(place.connection, []).append(place.queue)
    for name, needed in addresses(config).items():
        transport = _transport(config, name)
        try:
            warnings = await transport.check(needed)
            warnings += await connection_warnings(config, name, transport)
        except BridgeError as exc:
            failures += 1
            print(f"{name}: FAILED: {exc}")
            reached = not isinstance(exc, AccessRefused | TransportUnavailable)
            if reached and proxies.get(name) and not config.proxies.create:
                missing = [q for q in proxies[name] if not await _exists(transport, q)]
                if missing:
                    what = "is a proxy" if len(missing) == 1 else "are proxies"
                    print(
                        f"{name}: note: {', '.join(missing)} {what}, which `bridge install` "
                        "creates only with `proxies: {create: true}` (it needs the rights to); "
                        "otherwise create them as the endpoints' own installers would"
                    )
            continue
        finally:
            await transport.close()
        print(f"{name}: OK ({', '.join(needed)})")
        for warning in warnings:
            print(f"{name}: warning: {warning}")
    if config.delays is not None and not await _check_delays(config, config.delays.connection):
        failures += 1
    return 1 if failures else 0


async def _check_delays(config: BridgeConfig, name: str) -> bool:
    """Whether the `delays:` connection's `BridgeDelays` is there (printed either way)."""
    transport = _transport(config, name)
    assert isinstance(transport, SqlTransport)  # `bridge check` makes sure
    try:
        await transport.check_delay_table()
    except BridgeError as exc:
        print(f"{name}: FAILED: {exc}")
        return False
    finally:
        await transport.close()
    print(f"{name}: OK (BridgeDelays)")
    return True


async def install(config_path: str, *, print_only: bool) -> int:
    """Create what every route needs, or with `print_only` print each transport's statements."""
    config = load_routes(config_path, offline=print_only).config
    received = sources(config, installing=True)
    for name, needed in addresses(config, installing=True).items():
        transport = _transport(config, name)
        prepared: list[str] = []
        try:
            statements = await transport.install(needed, print_only=print_only)
            if isinstance(transport, PreparesSources) and received.get(name):
                prepared = await transport.prepare_sources(received[name], print_only=print_only)
        finally:
            await transport.close()
        if print_only:
            comment = getattr(transport, "print_comment", "--")  # shell commands: "#"
            print(f"{comment} connection {name} ({config.connections[name].type})")
            for statement in statements + prepared:  # each transport's own runnable form
                print(statement + "\n")
        else:
            print(f"{name}: installed {', '.join(needed)}")
            for done in prepared:
                print(f"{name}: created {done}")
    if config.delays is not None:  # where delays wait for Kafka (`bridge.service.delaying`)
        await _install_delays(config, config.delays.connection, print_only)
    if print_only:
        for statement in subscription_statements(config):
            print(statement + "\n")
        return 0
    from bridge.service.subscriptions import subscribe_all

    transports: dict[str, Transport] = {}
    try:
        for line in await subscribe_all(config, transports):
            print(line)
    finally:
        for transport in transports.values():
            await transport.close()
    return 0


def subscription_statements(config: BridgeConfig) -> list[str]:
    """What `install --print-sql` prints for the registry's subscriptions: a comment naming
    them, then each SQL connection's subscription table (its rows are written when the bridge
    runs), or on RabbitMQ the exchanges and bindings as management API requests."""
    from bridge.transports.sql.config import KINDS as SQL_KINDS

    made = config.registry.pubsub.native()
    out: list[str] = []
    for name in dict.fromkeys(s.connection for s in made):
        connection = config.connections[name]
        comment = "--" if connection.type in SQL_KINDS else "#"
        lines = [
            f"{comment} subscriptions on {name}: "
            + ", ".join(
                f"{s.endpoint} to {s.event} at {s.address or s.queue}"
                for s in made
                if s.connection == name
            )
        ]
        if connection.type in SQL_KINDS:
            transport = _transport(config, name)
            from bridge.transports.sql.subscriptions import statements
            from bridge.transports.sql.transport import Transport as SqlTransport

            assert isinstance(transport, SqlTransport)
            dialect = transport.dialect
            table = statements(dialect, transport.config.subscription_table)
            lines += dialect.printable([table.create])
        else:
            from bridge.transports.rabbitmq.config import RabbitMQConnection
            from bridge.transports.rabbitmq.events import printed, subscribe

            assert isinstance(connection, RabbitMQConnection)
            for s in made:
                if s.connection == name:
                    lines += printed(connection, subscribe(s.event, s.queue))
        out.append("\n".join(lines))
    return out


async def subscription(config_path: str, endpoint: str, event: str, *, subscribe: bool) -> int:
    """`bridge subscribe` / `bridge unsubscribe`: one endpoint's native subscription by hand."""
    from bridge.service.subscriptions import change

    config = load_routes(config_path).config
    print(await change(config, endpoint, event, subscribe=subscribe))
    return 0


async def _install_delays(config: BridgeConfig, name: str, print_only: bool) -> None:
    transport = _transport(config, name)
    assert isinstance(transport, SqlTransport)  # `bridge check` makes sure
    try:
        statements = await transport.install_delay_table(print_only=print_only)
    finally:
        await transport.close()
    if print_only:
        print(f"-- delays on connection {name} ({config.connections[name].type})")
        for statement in statements:
            print(statement + "\n")
    else:
        print(f"{name}: installed BridgeDelays")


def parse_headers(pairs: Sequence[str]) -> list[tuple[str, str]]:
    """`--header NAME=VALUE` options as header pairs, in order."""
    out = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--header takes NAME=VALUE, got {pair!r}")
        out.append((name, value))
    return out


def read_body(spec: str) -> bytes:
    """`--body`: the text itself, or `@FILE` for a file's bytes."""
    if spec.startswith("@"):
        try:
            return Path(spec[1:]).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read body file {spec[1:]!r}: {exc.strerror}") from None
    return spec.encode("utf-8")


async def send(
    config_path: str,
    connection: str,
    queue: str,
    *,
    headers: Sequence[str],
    body: str,
    ttl: str | None,
    count: int,
    delay: str | None = None,
    deliver_at: str | None = None,
) -> int:
    """Send `count` messages as an NServiceBus endpoint would to `connection`/`queue`, delayed
    by `delay` or until `deliver_at` when one is given (`nservicebus/delays.py`).

    Ctrl-C (SIGINT) stops it after the chunk in hand is durably sent: it says how many were
    sent and returns 130; a second Ctrl-C stops it at once.
    """
    config = load_routes(config_path).config
    if count < 1:
        raise UsageError("--count must be at least 1")
    span = None
    if ttl is not None:
        try:
            span = parse_ttl(ttl)
        except ValueError as exc:
            raise UsageError(f"--ttl {exc}") from None
    due = _due(config, connection, delay, deliver_at, ttl=span is not None)
    extra = parse_headers(headers)
    if count > 1 and any(name == MESSAGE_ID for name, _ in extra):
        raise UsageError(
            f"--header {MESSAGE_ID} with --count {count} would send {count} messages with one "
            "id, which receivers take as one message sent again; send one at a time, or leave "
            "the id to be made for each"
        )
    content = read_body(body)
    content_type = content_type_of(content)
    transport = _transport(config, connection)
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        interrupted.set()
        loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C stops at once

    loop.add_signal_handler(signal.SIGINT, interrupt)
    sent = 0
    try:
        sink = transport.sink(queue)
        if due is not None:  # a destination that cannot delay: through `delays:`
            sink = delaying_sink(config, connection, queue, None, sink, partial(_transport, config))
        while sent < count and not interrupted.is_set():
            size = min(SEND_CHUNK, count - sent)
            messages = [
                endpoint_message(content, extra, span, content_type=content_type)
                for _ in range(size)
            ]
            for message in messages:
                message.deliver_at = due
            await sink.send(messages)
            sent += size
        await sink.close()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await transport.close()
    if interrupted.is_set() and sent < count:
        print(f"interrupted: sent {sent} of {count} messages to {connection}/{queue}")
        return 130
    print(f"sent {sent} message{'s' if sent != 1 else ''} to {connection}/{queue}")
    return 0


def _due(
    config: BridgeConfig,
    connection: str,
    delay: str | None,
    deliver_at: str | None,
    *,
    ttl: bool,
) -> float | None:
    """When a delayed send is due (epoch seconds), None when it is not delayed; `UsageError`
    for a delay the destination cannot carry out."""
    if delay is None and deliver_at is None:
        return None
    if delay is not None and deliver_at is not None:
        raise UsageError("give --delay or --deliver-at, not both")
    flag = "--delay" if delay is not None else "--deliver-at"
    try:
        due = (
            time.time() + parse_delay(delay).total_seconds()
            if delay is not None
            else parse_deliver_at(deliver_at or "").timestamp()
        )
    except ValueError as exc:
        raise UsageError(f"{flag} {exc}") from None
    if ttl:
        raise UsageError(f"{flag} with --ttl: {DELAY_WITH_TTL}")
    _known_connection(config, connection)
    kind = config.connections[connection].type
    longest = longest_delay(config, connection)
    if longest is None:
        raise UsageError(
            f"{flag}: connection {connection!r} ({kind}) cannot hold a delayed message, and "
            "the config names no `delays: {connection: <a SQL connection>}` for it to wait in"
        )
    wait = due - time.time()
    if wait > longest:
        raise UsageError(
            f"{flag}: a delay of {wait:.0f} s is longer than the {longest} s "
            f"({timedelta(seconds=longest)}) a {kind} connection holds"
        )
    return due


def describe_stats(connection: str, queue: str, stats: QueueStats, *, as_json: bool) -> str:
    """What `peek` prints: one JSON object, or a few lines for people."""
    if as_json:
        return json.dumps(
            {
                "connection": connection,
                "queue": queue,
                "depth": stats.depth,
                "oldest_age_seconds": stats.oldest_age_seconds,
                "expired": stats.expired,
                "elsewhere": stats.elsewhere,
                "delayed": stats.delayed,
                "next_due_seconds": stats.next_due_seconds,
            }
        )
    age = stats.oldest_age_seconds
    lines = [
        f"{connection}/{queue}",
        f"  depth:   {stats.depth}",
        f"  oldest:  {'-' if age is None else f'{age:.1f} s'}",
        f"  expired: {stats.expired}",
    ]
    if stats.elsewhere:
        lines.append(
            f"  for other endpoints: {stats.elsewhere} (not in depth; no bridge source takes "
            "them: NGinn forwards them, or they are stranded)"
        )
    if stats.delayed is not None:
        due = stats.next_due_seconds
        lines.append(f"  delayed: {stats.delayed}")
        lines.append(f"  next due: {'-' if due is None else f'in {max(due, 0.0):.1f} s'}")
    return "\n".join(lines)


async def peek(config_path: str, connection: str, queue: str, *, as_json: bool) -> int:
    """Print a queue's depth, its oldest message's age and how many expired."""
    config = load_routes(config_path).config
    transport = _transport(config, connection)
    opened = {connection: transport}

    def transport_of(name: str) -> Transport:
        if name not in opened:
            opened[name] = _transport(config, name)
        return opened[name]

    try:
        stats = await transport.peek(queue)
        if (
            stats.depth
            and stats.oldest_age_seconds is None
            and isinstance(transport, ReadsOldestAge)
        ):
            stats = replace(stats, oldest_age_seconds=await transport.oldest_age(queue))
        # A destination that cannot delay: its delayed messages wait in `delays:`.
        waiting = await waiting_delays(config, connection, queue, transport_of)
        if waiting is not None:
            stats = replace(stats, delayed=waiting[0], next_due_seconds=waiting[1])
    finally:
        for opened_transport in opened.values():
            await opened_transport.close()
    print(describe_stats(connection, queue, stats, as_json=as_json))
    return 0


def describe_registry(
    config: BridgeConfig, states: dict[tuple[str, str], str] | None = None
) -> dict[str, Any]:
    """`bridge endpoints --json`: each endpoint's address on every connection, its
    subscriptions (with `states`, what the publisher's side holds), and the routes."""
    registry = config.registry
    routes = {(r.endpoint, r.from_.connection): r.name for r in config.derived_routes}
    listed: dict[str, dict[str, Any]] = {}
    for place in registry.places():
        entry = listed.setdefault(
            place.endpoint,
            {
                "name": place.endpoint,
                "connection": registry.home(place.endpoint),
                "addresses": {},
                "subscriptions": [],
            },
        )
        entry["addresses"][place.connection] = {
            "queue": place.queue,
            "address": place.address,
            "proxy": place.proxy,
            "route": routes.get((place.endpoint, place.connection)),
        }
    pubsub = registry.pubsub
    for s in pubsub.subscriptions():
        subscribed: dict[str, Any] = {
            "event": s.event,
            "publisher": s.publisher,
            "kind": s.kind,
            "connection": s.connection,
            "address": s.address or None,
        }
        if s.kind == "kafka" or s.kind == "home":
            subscribed["topic"] = pubsub.topic(s.event)
        if states is not None and s.native:
            subscribed["state"] = states.get((s.endpoint, s.event), "unknown")
        listed[s.endpoint]["subscriptions"].append(subscribed)
    return {
        "endpoints": list(listed.values()),
        "proxies": {"create": config.proxies.create, "connections": registry.connections()},
        "routes": [
            {
                "name": r.name,
                "endpoint": r.endpoint,
                "from": {"connection": r.from_.connection, "address": r.from_.address}
                | ({"group": r.from_.group} if r.from_.group else {}),
                "to": {"connection": r.to.connection, "address": r.to.address},
                "batch_size": r.batch_size,
                "concurrency": r.concurrency,
            }
            for r in config.derived_routes
        ],
    }


def _how(s: dict[str, Any]) -> str:
    """How the bridge subscribes, in words (`bridge.config.pubsub`)."""
    how = {
        "local": f"on {s['connection']}, by the endpoint itself",
        "proxy": f"its proxy {s['address']} on {s['connection']}",
        "kafka": f"via {s['address']} on {s['connection']}, to topic {s.get('topic')}",
        "home": f"topic {s.get('topic')} published on {s['connection']} to {s['address']}",
    }[s["kind"]]
    return how + (f" [{s['state']}]" if "state" in s else "")


def render_registry(report: dict[str, Any]) -> str:
    """`bridge endpoints`: one block per endpoint, one line per connection."""
    if not report["endpoints"]:
        return "no endpoints registered (add `endpoints:` to the config)"
    lines = []
    for endpoint in report["endpoints"]:
        lines.append(f"{endpoint['name']} (lives on {endpoint['connection']})")
        width = max(len(c) for c in endpoint["addresses"])
        for connection, place in endpoint["addresses"].items():
            role = f"proxy, route {place['route']}" if place["proxy"] else "its own queue"
            lines.append(f"  {connection:<{width}}  {place['address']}  ({role})")
        for s in endpoint["subscriptions"]:
            lines.append(f"  subscribes to {s['event']} from {s['publisher']}: {_how(s)}")
    create = "created by `bridge install`" if report["proxies"]["create"] else "must exist"
    lines.append(f"{len(report['routes'])} derived routes; proxies {create}")
    return "\n".join(lines)


async def endpoints(config_path: str, *, as_json: bool, connect: bool = False) -> int:
    """Print the endpoint registry: endpoints, their addresses everywhere, subscriptions,
    derived routes. Without `connect` it connects to nothing, so it needs no credentials; with
    it, each subscription's state is read where its publisher lives."""
    config = load_routes(config_path, offline=not connect).config
    states = None
    if connect:
        from bridge.service.subscriptions import state

        states = await state(config)
    report = describe_registry(config, states)
    print(json.dumps(report, indent=2) if as_json else render_registry(report))
    return 0


async def run(
    config_path: str,
    *,
    log_level: str,
    log_format: str,
    routes: Sequence[str],
    until_idle: float | None,
    workers: int,
    worker_index: int | None,
    worker_fd: int | None,
) -> int:
    """Run the routes (those named in `routes`, else all) until stopped or idle."""
    from bridge.service.launch import RunOptions
    from bridge.service.launch import run as launch

    config = load_routes(config_path).config
    unknown = [name for name in routes if name not in {r.name for r in config.all_routes}]
    if unknown:
        raise UsageError(f"no route named {unknown[0]!r} in {config_path}")
    options = RunOptions(
        config_path=config_path,
        log_level=log_level,
        log_format=log_format,
        routes=tuple(routes),
        until_idle=until_idle,
        workers=workers,
        worker_index=worker_index,
        worker_fd=worker_fd,
    )
    return await launch(config, options)


async def migrate(config_path: str, route: str, *, master: str, partitions: int | None) -> int:
    """Bulk-move one route's messages with PySpark and print what moved (exit 130 with what
    moved so far on Ctrl-C)."""
    load_routes(config_path)
    from bridge.migrate import require_spark

    require_spark("migrate")
    from bridge.migrate.driver import MigrationFailed, MigrationInterrupted
    from bridge.migrate.driver import migrate as migrate_route
    from bridge.migrate.spec import JobSpec

    spec = JobSpec.from_file(config_path, route)
    try:
        summary = await migrate_route(spec, master=master, partitions=partitions)
    except MigrationFailed as exc:
        if exc.summary is not None:  # how far it got, before the error line
            print(exc.summary.describe(), flush=True)
        raise
    except MigrationInterrupted as exc:
        print(exc.summary.describe(), flush=True)
        print(f"bridge migrate: {exc}", file=sys.stderr)
        return 130
    print(summary.describe())
    return 0


async def report(
    config_path: str,
    connection: str,
    queues: Sequence[str],
    *,
    output: str,
    top: int,
    master: str,
    partitions: int | None,
) -> int:
    """Print what queue tables hold (`output`: table, json or csv), read-only with PySpark;
    on Ctrl-C print nothing but how far it read, and exit 130."""
    config = load_routes(config_path).config
    _known_connection(config, connection)
    from bridge.migrate import require_spark

    require_spark("report")
    from bridge.migrate.progress import Interrupted
    from bridge.migrate.render import render
    from bridge.migrate.report import build_report
    from bridge.migrate.spec import ShippedConfig

    try:
        built = await build_report(
            ShippedConfig.read(config_path),
            connection,
            list(queues),
            top=top,
            master=master,
            partitions=partitions,
        )
    except Interrupted as exc:
        print(f"bridge report: {exc}", file=sys.stderr)
        return 130
    print(render(built, output), end="")
    return 0
