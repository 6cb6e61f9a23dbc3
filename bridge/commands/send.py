"""`bridge send`: messages as an NServiceBus endpoint writes them, delayed when asked."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path

from bridge.commands.common import (
    known_connection,
    load_routes,
    transport_for,
)
from bridge.config.models import BridgeConfig
from bridge.envelope import MESSAGE_ID
from bridge.errors import UsageError
from bridge.nservicebus.delays import DELAY_WITH_TTL, parse_delay, parse_deliver_at
from bridge.nservicebus.messages import content_type_of, endpoint_message, parse_ttl
from bridge.service.delaying import delaying_sink, longest_delay

#: Messages `send` hands the sink per call.
SEND_CHUNK = 1000


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
    transport = transport_for(config, connection)
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
            sink = delaying_sink(
                config, connection, queue, None, sink, partial(transport_for, config)
            )
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
    known_connection(config, connection)
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
