"""The RabbitMQ transport: queues laid out as NServiceBus RabbitMQ 11 does (wire-format §7).

Features
    Each source, each sink and the transport's administration own one AMQP connection, run by
    pika's SelectConnection on a dedicated thread (`connection.py` says why), opened on first
    use and reopened by the next call after a failure. Sinks publish whole batches with
    publisher confirms (`sink.py`); sources consume with prefetch and acknowledge a batch only
    when it is committed (`source.py`); poison and rejected messages are copied to the error
    queue before that (`deadletter.py`); messages are laid out as `headers.py` says.

Connection
    `url`: `amqp://user:password@host:port/vhost` (`%2F` is the default vhost `/`) or
    `amqps://`; pika's query options (`heartbeat`, `ssl_options`, ...) are honoured.

Options
    `topology`: `conventional` (a durable fanout exchange per queue, named like it and bound to
    it; sends go to the exchange) or `direct` (sends go to the default exchange with the queue
    name as routing key). `queue_type`: `quorum` or `classic`, declared as `x-queue-type`.
    `prefetch`: the consumer's prefetch count (raised to the batch size when smaller).
    `management_url` (default: the URL's host, port 15672, or 15671 for `amqps`, with the
    URL's credentials) and `validate_delivery_limits` (default true): see `delivery_limit.py`.

Addresses
    An address is a queue name, also in NServiceBus headers (`canonical_address` is the
    identity, wire-format §6).

Administration
    `install` declares each queue durable with its type and, for `conventional`, its exchange
    and binding (`admin.py`); declaring what exists is a no-op (a queue's other `x-` arguments
    are kept), and a queue that exists with another type raises `TransportError` saying so
    (RabbitMQ cannot change it). `print_only` returns, without connecting, the same
    declarations as `curl` commands for the management HTTP API (AMQP has no client that runs
    a script); a PUT of a queue that exists with other arguments is refused there, where
    `install` keeps them.
    `prepare_sources` (after `install`, for the queues routes receive from) keeps quorum
    queues' delivery limit unlimited through the management API, as NServiceBus does, or
    refuses a queue whose limit could drop messages (`delivery_limit.py`); a source does the
    same before it consumes on a new channel.
    `check` declares passively and raises `TransportError` naming every missing queue and
    exchange; a queue of another type is a warning (found by re-declaring the existing queue as
    it is, which changes nothing). `peek` reports the ready messages (`depth`); `oldest_age`
    (for `bridge peek`, never for the service's depth gauge) reads the age of the first ready
    message by taking it and giving it back (see there).

Limits
    Names, property values and header names are AMQP short strings (255 bytes); properties and
    headers must fit in one frame (`frame_max`, 128 KiB by default); a body over the broker's
    `max_message_size` is refused. `peek` cannot tell how many messages expired: RabbitMQ drops
    them itself and does not say.

Errors
    See `errors.py`: a broker that is down, restarting or blocked is `TransportUnavailable`
    (retriable); a refused login, vhost or permission is `AccessRefused`; missing queues and
    conflicting declarations are `TransportError` (neither retriable); a message AMQP cannot
    carry is `MessageRejected`.

What is lossy
    See `headers.py`: AMQP properties the mapping does not name, and repeated header names.
    Expired messages are dropped by RabbitMQ itself.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence

from bridge.envelope import TIME_SENT
from bridge.errors import HeadersFormatError, TransportError
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.protocols import CheckpointStore, QueueStats
from bridge.transports.rabbitmq.admin import (
    Step,
    bind,
    conflict,
    declare_adopting,
    declare_exchange,
    declare_queue,
    look_at_head,
    plan,
    printed,
    queue_type_of,
    server_version,
)
from bridge.transports.rabbitmq.config import RabbitMQConnection, describe
from bridge.transports.rabbitmq.connection import Link, link, parameters
from bridge.transports.rabbitmq.delays import LEVELS, level_name
from bridge.transports.rabbitmq.delivery_limit import DeliveryLimits, broker_version
from bridge.transports.rabbitmq.errors import reply_code
from bridge.transports.rabbitmq.headers import incoming
from bridge.transports.rabbitmq.sink import RabbitMQSink
from bridge.transports.rabbitmq.source import RabbitMQSource

__all__ = ["NACK_UNCOUNTED", "RabbitMQSink", "RabbitMQSource", "Transport"]

log = logging.getLogger("bridge.rabbitmq")

#: The first RabbitMQ whose quorum queues do not count a message given back with `basic.nack`
#: as a delivery (https://www.rabbitmq.com/docs/4.3/nack: basic.reject increments the
#: delivery-count header, basic.nack does not; before 4.3 every return counted,
#: https://github.com/rabbitmq/rabbitmq-server/discussions/18226).
NACK_UNCOUNTED = (4, 3)


class Transport:
    def __init__(self, name: str, config: RabbitMQConnection) -> None:
        self.name = name
        self.config = config
        self._where = describe(name)
        parameters(config, name, "admin")  # a malformed URL fails now, not at first use
        self._admin: Link | None = None
        self._limits = DeliveryLimits(config, self._where)
        self._opened: weakref.WeakSet[RabbitMQSource | RabbitMQSink] = weakref.WeakSet()

    def source(
        self,
        address: str,
        *,
        group: str | None = None,
        error_queue: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> RabbitMQSource:
        source = RabbitMQSource(self.config, self.name, address, error_queue, self._limits)
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
            self._admin = link(self.config, self.name, "admin", self._where)
        return self._admin

    #: `install --print-sql` prints shell commands (`admin.printed`): `#` starts a comment.
    print_comment = "#"

    async def install(self, addresses: Sequence[str], *, print_only: bool = False) -> list[str]:
        steps = plan(self.config, addresses)
        if print_only:
            return printed(self.config, steps)
        link = self._link()
        for step in steps:
            try:
                if step.kind == "queue":
                    await declare_adopting(link, self.config, self._where, step)
                elif step.kind == "exchange":
                    await link.run(declare_exchange(step.name, passive=False), what=step.text)
                else:
                    await link.run(bind(step.name, step.name), what=step.text)
            except TransportError as exc:
                raise conflict(self.config, self._where, step, exc) from exc
        return [step.text for step in steps]

    async def prepare_sources(
        self, addresses: Sequence[str], *, print_only: bool = False
    ) -> list[str]:
        """Give each quorum queue routes receive from an unlimited delivery limit where
        NServiceBus would, or refuse it (`delivery_limit.py`); what was (or would be) done."""
        done: list[str] = []
        if not self._limits.wanted:
            return done
        for queue in dict.fromkeys(addresses):
            if print_only:
                done.append(self._limits.describe(queue))
            elif (action := await self._limits.ensure(queue)) is not None:
                done.append(action)
        return done

    async def check(self, addresses: Sequence[str]) -> list[str]:
        link = self._link()
        missing: list[str] = []
        warnings: list[str] = []
        for queue in dict.fromkeys(addresses):
            try:
                await link.run(declare_queue(queue, None, passive=True), what="queue check")
            except TransportError as exc:
                if reply_code(exc) != 404:
                    raise
                missing.append(f"queue {queue!r}")
            else:
                step = Step(f"queue {queue!r}", "queue", queue)
                try:
                    await declare_adopting(link, self.config, self._where, step)
                except TransportError as exc:
                    if reply_code(exc) != 406:
                        raise
                    warnings.append(str(conflict(self.config, self._where, step, exc)))
            if self.config.topology == "conventional":
                try:
                    await link.run(declare_exchange(queue, passive=True), what="exchange check")
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
                declare_queue(address, None, passive=True), what="queue depth"
            )
        except TransportError as exc:
            if reply_code(exc) == 404:
                raise TransportError(f"{self._where}: queue {address!r} does not exist") from exc
            raise
        return QueueStats(depth=depth)

    async def delayed_all_destinations(self) -> int:
        """The messages waiting in the v2 delay levels (`delays.py`), for every destination,
        for `bridge peek`: a message's destination is in its routing key, which only taking it
        would show, and a level is a quorum queue whose delivery limit counts each look; 0
        where none are declared yet. On a link of its own: a level not declared answers 404,
        which closes the channel, and must not close one that others use."""
        own = link(self.config, self.name, "peek", self._where)
        total = 0
        try:
            for level in range(LEVELS):
                try:
                    total += await own.run(
                        declare_queue(level_name(level), None, passive=True),
                        what="delay level depth",
                    )
                except TransportError as exc:
                    if reply_code(exc) != 404:
                        raise
        finally:
            await own.close()
        return total

    async def oldest_age(self, address: str) -> float | None:
        """Seconds since the first ready message of `address` was sent (its
        `NServiceBus.TimeSent`), for `bridge peek`; None when none is ready or it has no
        readable TimeSent, or when looking would cost more than it tells (below).

        RabbitMQ does not tell a message's age: the management API's `head_message_timestamp`
        is the AMQP `timestamp` property, which NServiceBus does not set. So the message is
        taken (`basic.get`) and given back at once (`basic.nack`, requeue): it returns to its
        place, marked redelivered. A message a consumer holds is not ready and not looked at:
        this is the oldest that waits. On a quorum queue before RabbitMQ 4.3 (`NACK_UNCOUNTED`)
        the return would count as a delivery, and a message the queue's delivery limit (20 by
        default on 4.0-4.2) had counted out would be dropped or dead-lettered, so there the age
        is not read. A stream cannot be read this way. The queue's type is the one `check`
        finds (the queue is declared as it is, which changes nothing)."""
        link = self._link()
        kind = await self._queue_type(address)
        version = broker_version(await link.run(server_version, what="broker version"))
        reason = None
        if kind == "stream":
            reason = "it is a stream, which basic.get cannot read"
        elif kind == "quorum" and version < NACK_UNCOUNTED:
            reason = (
                f"it is a quorum queue, and RabbitMQ {version[0]}.{version[1]} would count "
                "giving the message back as a delivery (4.3 and later do not)"
            )
        if reason is not None:
            log.info(
                "%s: the age of the oldest message in %r is not read: %s",
                self._where,
                address,
                reason,
            )
            return None
        head = await link.run(look_at_head(address), what="look at the oldest message")
        if head is None:
            return None
        properties, body = head
        try:
            sent = incoming(properties, body, time.time()).headers.get(TIME_SENT)
            return None if sent is None else max(0.0, time.time() - timestamp_seconds(sent))
        except (HeadersFormatError, ValueError):
            return None

    async def _queue_type(self, address: str) -> str:
        """The type of the existing queue `address` (declared as it is: nothing changes)."""
        step = Step(f"queue {address!r}", "queue", address)
        try:
            await declare_adopting(self._link(), self.config, self._where, step)
        except TransportError as exc:
            found = queue_type_of(exc)
            if found is None:
                raise
            return found
        return self.config.queue_type

    async def close(self) -> None:
        for opened in list(self._opened):
            await opened.close()
        if self._admin is not None:
            await self._admin.close()
            self._admin = None
