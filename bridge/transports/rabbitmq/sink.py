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
    connection or a confirm that does not come within `CONFIRM_TIMEOUT` raises
    `TransportUnavailable`: the messages may or may not be in the queue, so a retry can
    duplicate them (at-least-once). An exchange that does not exist (404) is a `TransportError`.

What is lossy
    See `headers.py`. The `checkpoint` argument is ignored: RabbitMQ cannot store it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from bridge.envelope import Envelope
from bridge.errors import MessageRejected, MessagesRejected, TransportUnavailable
from bridge.protocols import Checkpoint
from bridge.transports.rabbitmq.config import (
    CONFIRM_TIMEOUT,
    RabbitMQConnection,
    describe,
    publish_route,
)
from bridge.transports.rabbitmq.confirms import Message
from bridge.transports.rabbitmq.connection import Link, parameters
from bridge.transports.rabbitmq.headers import outgoing

__all__ = ["RabbitMQSink", "encode_batch"]


def encode_batch(envelopes: Sequence[Envelope], now: float, frame_max: int) -> list[Message]:
    """Every envelope as an AMQP message; `MessageRejected` names the first that cannot be."""
    messages: list[Message] = []
    for index, envelope in enumerate(envelopes):
        try:
            messages.append(outgoing(envelope, now, frame_max=frame_max))
        except MessageRejected as exc:
            raise MessageRejected(f"message {index}: {exc}", index=index) from exc
    return messages


class RabbitMQSink:
    def __init__(self, config: RabbitMQConnection, name: str, address: str) -> None:
        self.address = address
        self._where = f"{describe(name)}, queue {address!r}"
        self._link = Link(parameters(config, name, "sink"), self._where, confirm=True)
        self._exchange, self._routing_key = publish_route(config, address)
        self._one_at_a_time = asyncio.Lock()

    async def send(
        self, envelopes: Sequence[Envelope], checkpoint: Checkpoint | None = None
    ) -> None:
        messages = encode_batch(envelopes, time.time(), self._link.frame_max)
        if not messages:
            return
        async with self._one_at_a_time:
            outcome = await self._link.publish(
                self._exchange, self._routing_key, messages, timeout=CONFIRM_TIMEOUT
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

    async def close(self) -> None:
        await self._link.close()
