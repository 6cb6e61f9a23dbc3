"""Declarations: what `install`, `check` and `peek` ask the broker, one AMQP method per step.

`plan` lists the steps `install` runs (queue, then exchange and binding for `conventional`);
`declare_adopting` declares a queue and keeps the `x-` arguments it already has; `conflict`
turns a 406 PRECONDITION_FAILED into an error that says what exists and what was asked for,
and `queue_type_of` reads the type an existing queue has from it. `printed` writes the same
steps as requests to the management HTTP API (`curl` commands), for `install --print-sql`:
AMQP has no client that runs a script of declarations. Each `declare_*`, `bind`,
`server_version` and `look_at_head` returns an `Op` that a `Link` runs on its ioloop thread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pika
from pika import spec

from bridge.errors import TransportError
from bridge.transports.rabbitmq.config import RabbitMQConnection, queue_arguments
from bridge.transports.rabbitmq.connection import Link
from bridge.transports.rabbitmq.delays import DELIVERY_EXCHANGE, Declaration, binding_key
from bridge.transports.rabbitmq.errors import reply_code
from bridge.transports.rabbitmq.handoff import Done, Op
from bridge.transports.rabbitmq.management import curl, endpoint

__all__ = [
    "Step",
    "bind",
    "conflict",
    "current_argument",
    "declare_adopting",
    "declare_exchange",
    "declare_queue",
    "delay_binding",
    "look_at_head",
    "plan",
    "printed",
    "queue_type_of",
    "run_declaration",
    "server_version",
]

_CURRENT = re.compile(r"inequivalent arg '([^']+)'.*but current is (?:the value )?'?([\w-]+)")
_CURRENT_VALUE = re.compile(
    r"inequivalent arg '(x-[^']+)' for queue .*but current is the value '(.*)' of type '(\w+)'"
)
#: How many arguments of an existing queue `install` adopts before it gives up.
_MAX_ADOPTED = 20


@dataclass(frozen=True)
class Step:
    text: str
    kind: str  # "queue", "exchange" or "bind"
    name: str


def declare_queue(queue: str, arguments: dict[str, object] | None, passive: bool) -> Op:
    """Declare `queue` durable; settles with its ready message count."""

    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        channel.queue_declare(
            queue,
            passive=passive,
            durable=True,
            arguments=arguments,
            callback=lambda frame: done.ok(frame.method.message_count),
        )

    return op


def declare_exchange(exchange: str, passive: bool) -> Op:
    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        channel.exchange_declare(
            exchange,
            exchange_type="fanout",
            passive=passive,
            durable=True,
            callback=lambda _: done.ok(),
        )

    return op


def bind(queue: str, exchange: str) -> Op:
    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        channel.queue_bind(queue, exchange, routing_key="", callback=lambda _: done.ok())

    return op


def run_declaration(declaration: Declaration) -> Op:
    """One declaration (`delays.py`: the delay infrastructure, `events.py`: events'
    exchanges and bindings) as an `Op`."""
    d = declaration

    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        if d.kind == "exchange":
            channel.exchange_declare(
                d.name, exchange_type=d.exchange_type, durable=True, callback=lambda _: done.ok()
            )
        elif d.kind == "exchange_unbind":
            channel.exchange_unbind(d.name, d.source, d.routing_key, callback=lambda _: done.ok())
        elif d.kind == "queue":
            channel.queue_declare(
                d.name, durable=True, arguments=d.arguments, callback=lambda _: done.ok()
            )
        elif d.kind == "queue_bind":
            channel.queue_bind(d.name, d.source, d.routing_key, callback=lambda _: done.ok())
        else:
            channel.exchange_bind(d.name, d.source, d.routing_key, callback=lambda _: done.ok())

    return op


def delay_binding(config: RabbitMQConnection, address: str) -> Declaration:
    """How `address` receives from the delay infrastructure: its exchange (conventional) or
    the queue itself (direct) bound to `nsb.v2.delay-delivery` with `#.<address>`."""
    key = binding_key(address)
    if config.topology == "conventional":
        return Declaration("exchange_bind", address, source=DELIVERY_EXCHANGE, routing_key=key)
    return Declaration("queue_bind", address, source=DELIVERY_EXCHANGE, routing_key=key)


def server_version(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
    """Settles with the broker's version, as its Connection.Start said it (`3.13.7`)."""
    properties: dict[str, Any] = channel.connection.server_properties or {}
    version = properties.get("version", b"")
    done.ok(version.decode("utf-8", "replace") if isinstance(version, bytes) else str(version))


def look_at_head(queue: str) -> Op:
    """Take the queue's first ready message and give it straight back (`basic.get`, then
    `basic.nack` with requeue): settles with its (properties, body), or None when none is
    ready. The message returns to its place with its `redelivered` flag set; see
    `Transport.oldest_age` for what else it costs and when it is not done."""

    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        def got(
            channel: pika.channel.Channel,
            method: spec.Basic.GetOk,
            properties: pika.BasicProperties,
            body: bytes,
        ) -> None:
            channel.basic_nack(method.delivery_tag, requeue=True)
            done.ok((properties, body))

        channel.add_callback(lambda _: done.ok(None), [spec.Basic.GetEmpty], one_shot=True)
        channel.basic_get(queue, got, auto_ack=False)

    return op


def plan(config: RabbitMQConnection, addresses: Sequence[str]) -> list[Step]:
    """The declarations `install` makes for `addresses`, in order, each queue once."""
    steps: list[Step] = []
    kind = config.queue_type
    for queue in dict.fromkeys(addresses):
        steps.append(
            Step(
                f"queue.declare queue={queue!r} durable=true arguments={{x-queue-type: {kind}}}",
                "queue",
                queue,
            )
        )
        if config.topology == "conventional":
            steps.append(
                Step(
                    f"exchange.declare exchange={queue!r} type=fanout durable=true",
                    "exchange",
                    queue,
                )
            )
            steps.append(
                Step(
                    f"queue.bind queue={queue!r} exchange={queue!r} routing_key=''",
                    "bind",
                    queue,
                )
            )
    return steps


def printed(config: RabbitMQConnection, steps: Sequence[Step]) -> list[str]:
    """`steps` as the management API's requests declaring the same (durable, not
    auto-deleted, the queue's type, a fanout exchange, its binding with routing key ""), after
    a comment saying where they go and which credentials they need."""
    api = endpoint(config)
    out = [
        f"# RabbitMQ's management HTTP API at {api.base} (vhost {api.vhost!r}): run with sh, "
        "curl 7.76 or later,\n# and RABBITMQ_USER and RABBITMQ_PASSWORD set to a user with the "
        "`management` tag"
    ]
    for step in steps:
        name = quote(step.name, safe="")
        if step.kind == "queue":
            arguments = queue_arguments(config)
            queue = {"durable": True, "auto_delete": False, "arguments": arguments}
            out.append(curl(api, "PUT", f"api/queues/{{vhost}}/{name}", queue))
        elif step.kind == "exchange":
            exchange = {
                "type": "fanout",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
            out.append(curl(api, "PUT", f"api/exchanges/{{vhost}}/{name}", exchange))
        else:
            binding = {"routing_key": "", "arguments": {}}
            out.append(curl(api, "POST", f"api/bindings/{{vhost}}/e/{name}/q/{name}", binding))
    return out


def current_argument(error: BaseException) -> tuple[str, object] | None:
    """The `x-` argument (name, value) an existing queue has and a declaration did not match."""
    match = _CURRENT_VALUE.search(str(error))
    if reply_code(error) != 406 or match is None or match.group(1) == "x-queue-type":
        return None
    name, text, kind = match.groups()
    if kind == "longstr":
        return name, text
    if kind == "bool" and text in ("true", "false"):
        return name, text == "true"
    try:
        return name, (float(text) if kind in ("double", "float") else int(text))
    except ValueError:
        return None


async def declare_adopting(link: Link, config: RabbitMQConnection, where: str, step: Step) -> None:
    """Declare a queue with its type. A queue that exists with more arguments (a dead-letter
    exchange, a length limit) keeps them: each one the broker names is added to the
    declaration until it matches, or until the broker names `x-queue-type` (RabbitMQ
    compares the type last), which `conflict` turns into a clear error.
    """
    arguments = queue_arguments(config)
    for _ in range(_MAX_ADOPTED):
        try:
            await link.run(declare_queue(step.name, arguments, passive=False), what=step.text)
            return
        except TransportError as exc:
            current = current_argument(exc)
            if current is None or current[0] in arguments:
                raise
            arguments[current[0]] = current[1]
    raise TransportError(f"{where}: queue {step.name!r} has too many arguments")


def queue_type_of(error: BaseException) -> str | None:
    """The type of an existing queue a declaration with another `x-queue-type` was refused for
    (`classic`, `quorum`, `stream`), or None when that is not what `error` says."""
    match = _CURRENT.search(str(error))
    if reply_code(error) != 406 or match is None or match.group(1) != "x-queue-type":
        return None
    return "classic" if match.group(2) == "none" else match.group(2)


def conflict(
    config: RabbitMQConnection, where: str, step: Step, error: TransportError
) -> TransportError:
    """A clear error for a declaration RabbitMQ refused because the thing exists otherwise."""
    match = _CURRENT.search(str(error))
    if reply_code(error) != 406 or match is None:
        return error
    argument, current = match.groups()
    if step.kind == "queue" and argument == "x-queue-type":
        current = queue_type_of(error) or current
        wanted = config.queue_type
        return TransportError(
            f"{where}: queue {step.name!r} already exists as a {current} queue, but "
            f"queue_type is {wanted}; RabbitMQ cannot change the type of a queue: move its "
            f"messages and delete it, or set queue_type: {current}"
        )
    return TransportError(
        f"{where}: {step.kind} {step.name!r} already exists with {argument} "
        f"{current!r}, which differs from what the bridge declares ({step.text})"
    )
