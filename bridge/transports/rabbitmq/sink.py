"""The RabbitMQ sink: publish a batch with publisher confirms, return once all are confirmed.

Guarantees
    `send` lays every envelope out as `headers.py` says, publishes the whole batch at once on
    its own connection (a channel in confirm mode, `mandatory=True`, every message in flight
    together rather than one round trip each) and returns only after the broker confirmed every
    message: for quorum queues that means a majority of replicas wrote it. `conventional`
    topology publishes to the exchange named like the queue with routing key "", `direct` to
    the default exchange with the queue as routing key.

Failures
    An envelope AMQP cannot carry (no `NServiceBus.MessageId`, a name over 255 bytes, headers
    over one frame) raises `MessageRejected` with its index before anything is published.
    Messages the broker returned as unroutable (no queue bound to the exchange, no queue of that
    name) raise, after every confirm arrived, one `MessagesRejected` with a `MessageRejected`
    for each returned index, and `rest_accepted` when the broker confirmed every other message
    of the call (none was nacked): those are in the queue and must not be sent again. A body
    over the broker's `max_message_size` raises `MessageRejected` with its index. A nack, a lost
    connection or a confirm that does not come within `confirm_timeout` raises
    `TransportUnavailable`: the messages may or may not be in the queue, so a retry can
    duplicate them (at-least-once). An exchange that does not exist (404) is a `TransportError`.

Delays
    An envelope with a `deliver_at` still to come goes through RabbitMQ's v2 delay
    infrastructure as NServiceBus sends it (`delays.py`): to the level exchange of its delay
    with the delay's routing key, after the sink declared the infrastructure (once per sink)
    and bound the destination to it (before each send holding a delayed message, as
    NServiceBus binds before each delayed send: a binding deleted meanwhile is made again).
    A delay beyond 2^28-1 s, or one with a time to be received, raises `MessageRejected` with
    its index. The confirm of a delayed message means the broker holds it in a delay level.

What is lossy
    See `headers.py`. The `checkpoint` argument is ignored: RabbitMQ cannot store it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from bridge.envelope import Envelope
from bridge.errors import MessageRejected, MessagesRejected, TransportUnavailable
from bridge.nservicebus.delays import too_long
from bridge.protocols import Checkpoint
from bridge.transports.rabbitmq.admin import delay_binding, run_declaration
from bridge.transports.rabbitmq.config import (
    RabbitMQConnection,
    describe,
    publish_route,
)
from bridge.transports.rabbitmq.confirms import Message
from bridge.transports.rabbitmq.connection import link
from bridge.transports.rabbitmq.delays import (
    MAX_DELAY_SECONDS,
    declarations,
    delay_seconds,
    level_name,
    routing_key,
)
from bridge.transports.rabbitmq.headers import outgoing

__all__ = ["RabbitMQSink", "encode_batch"]


def encode_batch(
    envelopes: Sequence[Envelope], now: float, frame_max: int, address: str = ""
) -> tuple[list[Message], list[tuple[str, str] | None]]:
    """Every envelope as an AMQP message, and where each delayed one goes (the level exchange
    and routing key of `delays.py`; None: where the sink publishes); `MessageRejected` names
    the first that cannot be."""
    messages: list[Message] = []
    routes: list[tuple[str, str] | None] = []
    for index, envelope in enumerate(envelopes):
        delay = 0 if envelope.deliver_at is None else delay_seconds(envelope.deliver_at, now)
        longer = too_long(envelope, now, MAX_DELAY_SECONDS, "RabbitMQ's delay levels", index)
        if longer is not None:
            raise longer
        try:
            messages.append(outgoing(envelope, now, frame_max=frame_max, delay=delay))
        except MessageRejected as exc:
            raise MessageRejected(f"message {index}: {exc}", index=index) from exc
        if delay > 0:
            level, key = routing_key(delay, address)
            routes.append((level_name(level), key))
        else:
            routes.append(None)
    return messages, routes


class RabbitMQSink:
    def __init__(self, config: RabbitMQConnection, name: str, address: str) -> None:
        self.address = address
        self._where = f"{describe(name)}, queue {address!r}"
        self._link = link(config, name, "sink", self._where, confirm=True)
        self._exchange, self._routing_key = publish_route(config, address)
        self._one_at_a_time = asyncio.Lock()
        self._delay_binding = delay_binding(config, address)
        self._delays_ready = False

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        messages, routes = encode_batch(envelopes, time.time(), self._link.frame_max, self.address)
        if not messages:
            return
        delayed = any(routes)
        async with self._one_at_a_time:
            if delayed:
                await self._prepare_delays()
            outcome = await self._link.publish(
                self._exchange,
                self._routing_key,
                messages,
                routes=routes if delayed else None,
            )
        if outcome.returned:
            target = (
                f"exchange {self._exchange!r}" if self._exchange else f"queue {self._routing_key!r}"
            )
            rejections = [
                MessageRejected(
                    f"{self._where}: message {index} ({messages[index][0].message_id}) is "
                    f"unroutable: no queue takes messages from {target} {outcome.return_text}",
                    index=index,
                )
                for index in outcome.returned
            ]
            raise MessagesRejected(rejections, rest_accepted=not outcome.nacked)
        if outcome.nacked:
            raise TransportUnavailable(
                f"{self._where}: the broker refused {outcome.nacked} of {len(messages)} messages"
            )

    async def _prepare_delays(self) -> None:
        """Before a send that holds a delayed message: bind the destination to the delay
        infrastructure, as NServiceBus binds before each delayed send (`delays.py`), so a
        binding deleted meanwhile is there again before the message reaches the delivery
        exchange (where, unbound, it would be dropped); before the first such send, declare
        the infrastructure too. All of it idempotent: endpoints and bridges declaring the
        same agree."""
        if not self._delays_ready:
            for declaration in declarations():
                await self._link.run(run_declaration(declaration), what=declaration.text)
            self._delays_ready = True
        binding = self._delay_binding
        await self._link.run(run_declaration(binding), what=binding.text)

    async def close(self) -> None:
        await self._link.close()
