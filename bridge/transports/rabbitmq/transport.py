"""The RabbitMQ transport: queues laid out as NServiceBus RabbitMQ 11 does (wire-format §7).

Features
    Each source, each sink and the transport's administration own one AMQP connection, run by
    pika's SelectConnection on a dedicated thread (`connection.py` says why), opened on first
    use and reopened by the next call after a failure. Sinks publish whole batches with
    publisher confirms (`sink.py`); sources consume with prefetch and acknowledge a batch only
    when it is committed (`source.py`); messages are laid out as `headers.py` says.

Connection string
    `url`: `amqp://user:password@host:port/vhost` (`%2F` is the default vhost `/`) or
    `amqps://`; pika's query options (`heartbeat`, `ssl_options`, ...) are honoured.

Options
    `topology`: `conventional` (a durable fanout exchange per queue, named like it and bound to
    it; sends go to the exchange) or `direct` (sends go to the default exchange with the queue
    name as routing key). `queue_type`: `quorum` or `classic`, declared as `x-queue-type`.
    `prefetch`: the consumer's prefetch count (raised to the batch size when smaller).

Addresses
    An address is a queue name, also in NServiceBus headers (`canonical_address` is the
    identity, wire-format §6).

Administration
    `install` declares each queue durable with its type and, for `conventional`, its exchange
    and binding; declaring what exists is a no-op (a queue's other `x-` arguments are kept),
    and a queue that exists with another type raises `TransportError` saying so (RabbitMQ
    cannot change it). `print_only` returns the
    declarations without connecting. `check` declares passively and raises `TransportError`
    naming every missing queue and exchange; a queue of another type is a warning (found by
    re-declaring the existing queue as it is, which changes nothing). `peek`
    reports the ready messages (`depth`); RabbitMQ does not tell their age or how many expired.

Retriable errors
    See `errors.py`: a broker that is down, restarting or blocked is `TransportUnavailable`;
    missing queues, refused logins and conflicting declarations are `TransportError`.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import pika

from bridge.errors import TransportError
from bridge.protocols import CheckpointStore, QueueStats
from bridge.transports.rabbitmq.config import RabbitMQConnection, describe, queue_arguments
from bridge.transports.rabbitmq.connection import Done, Link, Op, parameters
from bridge.transports.rabbitmq.errors import reply_code
from bridge.transports.rabbitmq.sink import RabbitMQSink
from bridge.transports.rabbitmq.source import RabbitMQSource

__all__ = ["RabbitMQSink", "RabbitMQSource", "Transport"]

_CURRENT = re.compile(r"inequivalent arg '([^']+)'.*but current is (?:the value )?'?([\w-]+)")
_CURRENT_VALUE = re.compile(
    r"inequivalent arg '(x-[^']+)' for queue .*but current is the value '(.*)' of type '(\w+)'"
)
#: How many arguments of an existing queue `install` adopts before it gives up.
_MAX_ADOPTED = 20


def _current_argument(error: BaseException) -> tuple[str, object] | None:
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


@dataclass(frozen=True)
class _Step:
    text: str
    kind: str  # "queue", "exchange" or "bind"
    name: str


def _declare_queue(queue: str, arguments: dict[str, object] | None, passive: bool) -> Op:
    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        channel.queue_declare(
            queue,
            passive=passive,
            durable=True,
            arguments=arguments,
            callback=lambda frame: done.ok(frame.method.message_count),
        )

    return op


def _declare_exchange(exchange: str, passive: bool) -> Op:
    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        channel.exchange_declare(
            exchange,
            exchange_type="fanout",
            passive=passive,
            durable=True,
            callback=lambda _: done.ok(),
        )

    return op


def _bind(queue: str, exchange: str) -> Op:
    def op(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
        channel.queue_bind(queue, exchange, routing_key="", callback=lambda _: done.ok())

    return op


class Transport:
    def __init__(self, name: str, config: RabbitMQConnection) -> None:
        self.name = name
        self.config = config
        self._where = describe(name)
        parameters(config, name, "admin")  # a malformed URL fails now, not at first use
        self._admin: Link | None = None
        self._opened: weakref.WeakSet[RabbitMQSource | RabbitMQSink] = weakref.WeakSet()

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> RabbitMQSource:
        source = RabbitMQSource(self.config, self.name, address, error_queue)
        self._opened.add(source)
        return source

    def sink(self, address: str, *, key: str | None = None) -> RabbitMQSink:
        sink = RabbitMQSink(self.config, self.name, address)
        self._opened.add(sink)
        return sink

    def canonical_address(self, address: str) -> str:
        return address

    def _link(self) -> Link:
        if self._admin is None:
            self._admin = Link(parameters(self.config, self.name, "admin"), self._where)
        return self._admin

    def _plan(self, addresses: Sequence[str]) -> list[_Step]:
        steps: list[_Step] = []
        kind = self.config.queue_type
        for queue in dict.fromkeys(addresses):
            steps.append(
                _Step(
                    f"queue.declare queue={queue!r} durable=true "
                    f"arguments={{x-queue-type: {kind}}}",
                    "queue",
                    queue,
                )
            )
            if self.config.topology == "conventional":
                steps.append(
                    _Step(
                        f"exchange.declare exchange={queue!r} type=fanout durable=true",
                        "exchange",
                        queue,
                    )
                )
                steps.append(
                    _Step(
                        f"queue.bind queue={queue!r} exchange={queue!r} routing_key=''",
                        "bind",
                        queue,
                    )
                )
        return steps

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]:
        steps = self._plan(addresses)
        if print_only:
            return [step.text for step in steps]
        link = self._link()
        for step in steps:
            try:
                if step.kind == "queue":
                    await self._declare_queue(link, step)
                elif step.kind == "exchange":
                    await link.run(_declare_exchange(step.name, passive=False), what=step.text)
                else:
                    await link.run(_bind(step.name, step.name), what=step.text)
            except TransportError as exc:
                raise self._conflict(step, exc) from exc
        return [step.text for step in steps]

    async def _declare_queue(self, link: Link, step: _Step) -> None:
        """Declare a queue with its type. A queue that exists with more arguments (a dead-letter
        exchange, a length limit) keeps them: each one the broker names is added to the
        declaration until it matches, or until the broker names `x-queue-type` (RabbitMQ
        compares the type last), which `_conflict` turns into a clear error.
        """
        arguments = queue_arguments(self.config)
        for _ in range(_MAX_ADOPTED):
            try:
                await link.run(_declare_queue(step.name, arguments, passive=False), what=step.text)
                return
            except TransportError as exc:
                current = _current_argument(exc)
                if current is None or current[0] in arguments:
                    raise
                arguments[current[0]] = current[1]
        raise TransportError(f"{self._where}: queue {step.name!r} has too many arguments")

    def _conflict(self, step: _Step, error: TransportError) -> TransportError:
        """A clear error for a declaration RabbitMQ refused because the thing exists otherwise."""
        match = _CURRENT.search(str(error))
        if reply_code(error) != 406 or match is None:
            return error
        argument, current = match.groups()
        if step.kind == "queue" and argument == "x-queue-type":
            current = "classic" if current == "none" else current
            wanted = self.config.queue_type
            return TransportError(
                f"{self._where}: queue {step.name!r} already exists as a {current} queue, but "
                f"queue_type is {wanted}; RabbitMQ cannot change the type of a queue: move its "
                f"messages and delete it, or set queue_type: {current}"
            )
        return TransportError(
            f"{self._where}: {step.kind} {step.name!r} already exists with {argument} "
            f"{current!r}, which differs from what the bridge declares ({step.text})"
        )

    async def check(self, addresses: Sequence[str]) -> list[str]:
        link = self._link()
        missing: list[str] = []
        warnings: list[str] = []
        for queue in dict.fromkeys(addresses):
            try:
                await link.run(_declare_queue(queue, None, passive=True), what="queue check")
            except TransportError as exc:
                if reply_code(exc) != 404:
                    raise
                missing.append(f"queue {queue!r}")
            else:
                step = _Step(f"queue {queue!r}", "queue", queue)
                try:
                    await self._declare_queue(link, step)
                except TransportError as exc:
                    if reply_code(exc) != 406:
                        raise
                    warnings.append(str(self._conflict(step, exc)))
            if self.config.topology == "conventional":
                try:
                    await link.run(_declare_exchange(queue, passive=True), what="exchange check")
                except TransportError as exc:
                    if reply_code(exc) != 404:
                        raise
                    missing.append(f"exchange {queue!r}")
        if missing:
            raise TransportError(
                f"{self._where}: missing {', '.join(missing)}; run `bridge install`"
            )
        return warnings

    async def peek(self, address: str) -> QueueStats:
        try:
            depth: int = await self._link().run(
                _declare_queue(address, None, passive=True), what="queue depth"
            )
        except TransportError as exc:
            if reply_code(exc) == 404:
                raise TransportError(f"{self._where}: queue {address!r} does not exist") from exc
            raise
        return QueueStats(depth=depth)

    async def close(self) -> None:
        for opened in list(self._opened):
            await opened.close()
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
