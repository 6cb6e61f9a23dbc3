"""The RabbitMQ source: a consumer with prefetch; a batch is acknowledged only when committed.

Guarantees
    One consumer per source on its own connection (`connection.py`), manual acknowledgements,
    `basic.qos` prefetch = max(`prefetch`, the first `max_messages`), at most AMQP's 65535.
    `receive_batch` waits up to `timeout` for the first delivery, then keeps gathering until
    it has `max_messages`, no delivery arrived for `DELIVERY_PAUSE` seconds, or `GATHER_LIMIT`
    seconds passed since the first of them arrived (deliveries already prefetched are taken at
    once; those that arrived while the batch before was being sent have waited already, so at
    a steady rate a batch goes every `GATHER_LIMIT` or every send, whichever is longer, not
    every send plus `GATHER_LIMIT`). `commit()`
    acknowledges the batch (`basic.ack` of its last delivery tag, `multiple=True`); the runner
    calls it only after the destination made the messages durable. `abort()` (or leaving the
    block) cancels the consumer and, once the broker confirmed the cancel (no delivery is on
    the way any more), returns every unacknowledged delivery with `basic.nack(0, multiple=True,
    requeue=True)`: the batch and the deliveries prefetched behind it, so the queue keeps its
    order; the next receive starts a new consumer. The order after a requeue is RabbitMQ's
    (classic and quorum queues put returned messages back at the head). When batches of one
    source overlap, each is acknowledged or returned by its own tags instead. A lost connection
    or channel returns every unacknowledged delivery to the queue; settling a batch received on
    a channel that is gone raises `TransportUnavailable` (its messages come again). A lost
    connection (an idle one too: the heartbeat notices a silent network) ends the receive
    waiting on it, or else the next one, with `TransportUnavailable`, so the route backs off
    at once instead of waiting out `connect_timeout` on a reconnect.
    Because of these returns, a quorum queue must not drop a message returned often: before it
    consumes on a new channel the source checks the queue's delivery limit and, on RabbitMQ 4,
    lifts the default one as NServiceBus does, or raises `TransportError` (`delivery_limit.py`).

Poison
    A message `headers.incoming` cannot read (no message id at all, a header or property that
    is not UTF-8) is a `PoisonMessage` in `batch.poison`. At commit, each poison message is
    published to `error_queue` (default `bridge.error`) byte for byte: body, properties and
    headers unchanged, plus the failure headers ServiceControl reads
    (`bridge.nservicebus.deadletter`) and, when it has no id at all, a deterministic one; only
    `expiration` is dropped (an error-queue copy never expires). Messages the runner rejected
    with `batch.reject` go there as `bridge.nservicebus.deadletter.error_copy` makes them
    (without a time to live either). `deadletter.py` publishes them, with publisher confirms,
    on a connection of its own. Only then is the batch acknowledged: a crash in between leaves
    a duplicate in the error queue, never a loss.
    An error queue that does not take the copies (missing: `TransportError`; the broker nacks
    them, e.g. a full queue with `x-overflow: reject-publish`: `TransportUnavailable`) fails
    the commit, and the batch's deliveries go back to the queue before it raises, as `abort()`
    returns them: left unacknowledged on the channel, the next batch's
    `basic.ack(multiple=True)` would take them.

What is lossy
    Nothing at the source: a message leaves the queue only by an acknowledgement. Expired
    messages are dropped by RabbitMQ itself (`expiration`), so `batch.expired` is always 0. A
    message's `expiration` counts from the moment it arrived in the inbox (`headers.incoming`);
    one whose lifetime runs out in the bridge is dropped by the runner.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

import pika

from bridge.batch import Batch, Rejected
from bridge.envelope import Envelope, PoisonMessage
from bridge.errors import BridgeError, HeadersFormatError, TransportUnavailable
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.transports.rabbitmq.config import (
    DELIVERY_PAUSE,
    GATHER_LIMIT,
    RabbitMQConnection,
    describe,
)
from bridge.transports.rabbitmq.connection import link
from bridge.transports.rabbitmq.deadletter import ErrorQueue
from bridge.transports.rabbitmq.delivery_limit import DeliveryLimits
from bridge.transports.rabbitmq.handoff import Done
from bridge.transports.rabbitmq.headers import incoming, incoming_poison
from bridge.transports.rabbitmq.inbox import Delivery, Inbox

__all__ = ["RabbitMQSource"]

log = logging.getLogger("bridge.rabbitmq")

_MAX_PREFETCH = 65_535  # basic.qos prefetch-count is a short
_CONSUMERS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class _Consumer:
    number: int  # unique per basic.consume, process-wide
    epoch: int  # the channel it consumes on
    tag: str


@dataclass(eq=False)
class _Held:
    """The consumer and delivery tags of one unsettled batch."""

    consumer: _Consumer
    tags: list[int]


class RabbitMQSource:
    def __init__(
        self,
        config: RabbitMQConnection,
        name: str,
        address: str,
        error_queue: str | None,
        limits: DeliveryLimits | None = None,
    ) -> None:
        self.address = address
        self.error_queue = error_queue or DEFAULT_ERROR_QUEUE
        self._config = config
        self._name = name
        self._where = f"{describe(name)}, queue {address!r}"
        self._link = link(config, name, "source", self._where, on_lost=self._lost)
        self._errors = ErrorQueue(
            config, name, address, self.error_queue, frame_max=self._link.frame_max
        )
        self._inbox: Inbox | None = None
        self._consumer: _Consumer | None = None
        self._prefetch = 0
        self._held: list[_Held] = []
        self._cancel_hooked = 0  # the ioloop thread's: epoch of the channel hooked for cancels
        self._limits = limits or DeliveryLimits(config, self._where)
        self._limits_epoch: int | None = None  # the channel the delivery limit was checked for

    # -- receiving ---------------------------------------------------------------------------

    async def receive_batch(self, max_messages: int, timeout: float) -> Batch:
        if self._inbox is None:
            self._inbox = Inbox(asyncio.get_running_loop())
        inbox = self._inbox
        self._raise_if_lost(inbox)
        consumer = await self._consume(inbox, max_messages)
        number = consumer.number
        if not await inbox.wait_for(number, 1, timeout):
            self._raise_if_lost(inbox)
            return Batch()
        # Counted from the oldest delivery's arrival, not from this call: deliveries that came
        # in while the batch before was being sent have waited already.
        handover = inbox.first_arrived(number) + GATHER_LIMIT
        while inbox.count(number) < max_messages:
            gather = min(inbox.last_arrived() + DELIVERY_PAUSE, handover) - time.monotonic()
            if gather <= 0:
                break
            await inbox.wait_for(number, max_messages, gather)
            self._raise_if_lost(inbox)
        # From here to the return nothing awaits: a cancelled receive never holds deliveries.
        deliveries = inbox.take(number, max_messages)
        messages: list[Envelope] = []
        poison: list[tuple[PoisonMessage, pika.BasicProperties, bytes]] = []
        wall_clock = time.time() - time.monotonic()  # `arrived` is monotonic
        for delivery in deliveries:
            try:
                received = wall_clock + delivery.arrived
                messages.append(incoming(delivery.properties, delivery.body, received))
            except HeadersFormatError as exc:
                item = incoming_poison(delivery.properties, delivery.body, exc)
                poison.append((item, delivery.properties, delivery.body))
        held = _Held(consumer, [d.tag for d in deliveries])
        self._held.append(held)
        rejected: list[Rejected] = []

        async def commit() -> None:
            try:
                await self._errors.copy(poison, rejected)
            except BaseException:
                # Not acknowledged, so not committed: the deliveries go back now. Left unsettled
                # on the channel, the next batch's multiple-ack would acknowledge them too.
                try:
                    await self._return(held)
                except Exception as exc:  # the error-queue failure is the one to report
                    log.warning("%s: returning a failed batch: %s", self._where, exc)
                raise
            try:
                await self._settle(held, self._ack_pairs(held), ack=True)
            finally:
                self._release(held)

        async def abort() -> None:
            await self._return(held)

        return Batch(
            messages,
            poison=[item for item, _, _ in poison],
            on_commit=commit,
            on_abort=abort,
            rejected=rejected,
        )

    def _lost(self, error: BridgeError) -> None:
        """On the ioloop thread: the connection is gone (see `_raise_if_lost`)."""
        inbox = self._inbox
        if inbox is not None:
            inbox.lose(error)

    def _raise_if_lost(self, inbox: Inbox) -> None:
        """Raise why the consumer's connection was lost, once: an idle consumer has no call in
        progress to fail, and a receive that went on would reconnect into the outage and wait
        out `connect_timeout` (its route still `running`) before it could tell. A loss reported
        for an earlier connection, whose consumer is already gone, is dropped."""
        error, inbox.lost = inbox.lost, None
        consumer = self._consumer
        if error is None or consumer is None or consumer.epoch == self._link.epoch:
            return
        self._consumer = None  # its deliveries are back in the queue; the next receive consumes
        raise error

    async def _consume(self, inbox: Inbox, max_messages: int) -> _Consumer:
        """The consumer this source receives from, started when there is none (any more)."""
        consumer = self._consumer
        if consumer is not None and consumer.epoch == self._link.epoch:
            if consumer.tag not in inbox.cancelled:
                return consumer
            await self._reset_channel(consumer)
        self._consumer = None
        await self._check_delivery_limit()
        wanted = max(self._prefetch, self._config.prefetch, max_messages)
        self._prefetch = min(wanted, _MAX_PREFETCH)
        prefetch, queue, number = self._prefetch, self.address, next(_CONSUMERS)

        def start(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            def on_message(
                _: object, method: pika.spec.Basic.Deliver, props: object, body: bytes
            ) -> None:
                inbox.put(Delivery(number, epoch, method.delivery_tag, props, body))

            def on_cancel(frame: pika.frame.Method) -> None:
                inbox.cancelled.add(frame.method.consumer_tag)

            def on_qos(_: object) -> None:
                consumer = _Consumer(number, epoch, f"bridge.{number}")
                channel.basic_consume(
                    queue,
                    on_message,
                    consumer_tag=consumer.tag,
                    callback=lambda _: done.ok(consumer),
                )

            if self._cancel_hooked != epoch:  # one hook per channel, however many consumers
                self._cancel_hooked = epoch
                channel.add_on_cancel_callback(on_cancel)
            channel.basic_qos(prefetch_count=prefetch, callback=on_qos)

        self._consumer = await self._link.run(start, what=f"consume from {queue!r}")
        return self._consumer

    async def _check_delivery_limit(self) -> None:
        """Before consuming on a channel the queue's delivery limit was not checked for (the
        first, or one of a new connection: the broker may have been upgraded in between), make
        sure a return cannot drop messages (`delivery_limit.py`); raises `TransportError` if it
        could. The broker is reached first, so an unreachable one fails as it always does."""

        def channel_epoch(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            done.ok(epoch)

        epoch: int = await self._link.run(channel_epoch, what="connect")
        if epoch != self._limits_epoch:
            await self._limits.ensure(self.address)
            self._limits_epoch = epoch

    async def _reset_channel(self, consumer: _Consumer) -> None:
        """The broker cancelled the consumer (its queue was deleted or moved): close the channel,
        so the broker takes back every delivery it still holds for us, and start afresh."""

        def close(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            if epoch == consumer.epoch and channel.is_open:
                channel.close()
            done.ok()

        await self._link.run(close, what="channel reset")

    # -- settling ----------------------------------------------------------------------------

    def _others(self, held: _Held) -> list[_Held]:
        return [h for h in self._held if h is not held and h.consumer.epoch == held.consumer.epoch]

    def _ack_pairs(self, held: _Held) -> list[tuple[int, bool]]:
        if not held.tags:
            return []
        last = max(held.tags)
        if any(min(h.tags, default=last) < last for h in self._others(held)):
            return [(tag, False) for tag in held.tags]  # another open batch holds older tags
        return [(last, True)]

    def _gone(self) -> TransportUnavailable:
        return TransportUnavailable(
            f"{self._where}: the channel that delivered this batch is gone; "
            "the broker returned its messages to the queue"
        )

    async def _settle(self, held: _Held, pairs: list[tuple[int, bool]], *, ack: bool) -> None:
        if not pairs:
            return
        gone = self._gone()

        def settle(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            if epoch != held.consumer.epoch:  # never settle a tag on a channel it is not from
                done.fail(gone)
                return
            for tag, multiple in pairs:
                if ack:
                    channel.basic_ack(tag, multiple=multiple)
                else:
                    channel.basic_nack(tag, multiple=multiple, requeue=True)
            done.ok()

        await self._link.run(settle, what="ack" if ack else "nack")

    async def _requeue_everything(self, consumer: _Consumer) -> None:
        """Stop the consumer, then return every unacknowledged delivery, so the queue keeps
        its order: after `basic.cancel-ok` no delivery of it is still on the way, and
        `basic.nack(0, multiple=True)` returns all of them, prefetched ones included.
        The next receive starts a new consumer."""
        self._consumer = None
        gone = self._gone()

        def requeue(channel: pika.channel.Channel, epoch: int, done: Done) -> None:
            if epoch != consumer.epoch:
                done.fail(gone)
                return

            def nack_all(_: object = None) -> None:
                channel.basic_nack(0, multiple=True, requeue=True)
                done.ok()

            if consumer.tag in channel.consumer_tags:
                channel.basic_cancel(consumer.tag, callback=nack_all)
            else:
                nack_all()

        await self._link.run(requeue, what="requeue")

    async def _return(self, held: _Held) -> None:
        """Give the batch's deliveries back to the queue (abort, or a commit that failed).

        The batch stays held until its deliveries are back or its channel is gone, so no
        multiple-ack of a later batch can cover them.
        """
        try:
            if self._others(held):
                await self._settle(held, [(t, False) for t in held.tags], ack=False)
            else:
                await self._requeue_everything(held.consumer)
        except TransportUnavailable as exc:
            # The channel or connection is gone (or was closed after a timeout): the broker
            # returns every unacknowledged delivery by itself, which is what abort wants.
            log.info("%s: abort: %s", self._where, exc)
        self._release(held)

    def _release(self, held: _Held) -> None:
        # Batches of a channel that is gone were returned by the broker: forget them too.
        epoch = self._link.epoch
        self._held = [h for h in self._held if h is not held and h.consumer.epoch == epoch]

    async def close(self) -> None:
        await self._link.close()
        await self._errors.close()
