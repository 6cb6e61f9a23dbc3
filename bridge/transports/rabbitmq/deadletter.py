"""Error-queue copies: poison and rejected messages, published with confirms before an ack.

`ErrorQueue.copy` publishes a batch's poison messages byte for byte (body, properties and
headers unchanged but `expiration`, plus the failure headers ServiceControl reads, see
`error_properties`) and its rejected envelopes as `bridge.nservicebus.deadletter.error_copy`
makes them, all in one publish on a connection of its own (opened when first needed), and
returns once the broker confirmed every copy. The source acknowledges the batch only after
that: a crash in between leaves a duplicate in the error queue, never a loss.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Sequence

import pika

from bridge.batch import Rejected
from bridge.envelope import MESSAGE_ID, PoisonMessage
from bridge.errors import MessageRejected, TransportError, TransportUnavailable
from bridge.nservicebus.deadletter import error_copy, failure_headers
from bridge.transports.rabbitmq.config import (
    RabbitMQConnection,
    describe,
    publish_route,
)
from bridge.transports.rabbitmq.confirms import Message
from bridge.transports.rabbitmq.connection import Link, link
from bridge.transports.rabbitmq.headers import outgoing, readable_text

__all__ = ["POISON_ID_NAMESPACE", "ErrorQueue", "error_properties"]

#: Fixed forever: the id an error-queue copy of a message without any id gets.
POISON_ID_NAMESPACE = uuid.UUID("3c1f7e52-9a4d-5b8e-a2f6-7d0c4e9b1a38")

_STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"

_PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


def error_properties(
    properties: pika.BasicProperties, body: bytes, failure: Sequence[tuple[str, str]]
) -> pika.BasicProperties:
    """The properties of a poison message's error-queue copy: every original property and header
    unchanged but `expiration`, the failure headers ServiceControl reads added (replacing older
    ones), and, when the message has no id at all, a deterministic one (uuid5 of its body and
    headers) as both `message_id` and `NServiceBus.MessageId`, so ServicePulse can show and
    retry it. An error-queue copy never expires (NServiceBus sends it without a time to be
    received): with the original `expiration` it would vanish from the error queue unseen.
    """
    table: dict[str | bytes, object] = dict(properties.headers or {})
    message_id = properties.message_id
    if not message_id and not readable_text(table.get(MESSAGE_ID)):
        digest = hashlib.sha256(body)
        digest.update(repr(sorted((repr(k), repr(v)) for k, v in table.items())).encode())
        message_id = str(uuid.uuid5(POISON_ID_NAMESPACE, digest.hexdigest()))
        table[MESSAGE_ID] = message_id
    table.update(failure)
    copy = pika.BasicProperties(
        **{name: getattr(properties, name) for name in _PROPERTY_NAMES},
    )
    copy.headers = table
    copy.message_id = message_id
    copy.expiration = None
    return copy


class ErrorQueue:
    """The error queue of one source queue (`failed_q`), on the same broker."""

    def __init__(
        self,
        config: RabbitMQConnection,
        name: str,
        failed_q: str,
        error_queue: str,
        *,
        frame_max: int,
    ) -> None:
        self._config = config
        self._name = name
        self._failed_q = failed_q
        self._queue = error_queue
        self._frame_max = frame_max
        self._link: Link | None = None

    async def copy(
        self,
        poison: Sequence[tuple[PoisonMessage, pika.BasicProperties, bytes]],
        rejected: Sequence[Rejected],
    ) -> None:
        """Publish the copies and wait for every confirm. An error queue that does not take
        them raises `TransportError` (missing) or `TransportUnavailable` (the broker nacked)."""
        copies: list[Message] = []
        for item, properties, body in poison:
            failure = failure_headers(
                item.reason, self._failed_q, exception_type=item.exception_type
            )
            copies.append((error_properties(properties, body, failure), body))
        copies.extend(self._rejected_copy(r) for r in rejected)
        if not copies:
            return
        if self._link is None:
            where = f"{describe(self._name)}, error queue {self._queue!r}"
            self._link = link(self._config, self._name, "errors", where, confirm=True)
        exchange, routing_key = publish_route(self._config, self._queue)
        outcome = await self._link.publish(exchange, routing_key, copies)
        if outcome.returned:
            raise TransportError(
                f"{self._link.where}: no queue takes its messages {outcome.return_text}; "
                "run `bridge install`"
            )
        if outcome.nacked:
            raise TransportUnavailable(
                f"{self._link.where}: the broker refused {outcome.nacked} error-queue copies"
            )

    def _rejected_copy(self, rejected: Rejected) -> Message:
        copy = error_copy(rejected.envelope, rejected.error, self._failed_q)
        try:
            return outgoing(copy, time.time(), frame_max=self._frame_max)
        except MessageRejected:
            copy.headers.remove(_STACK_TRACE)  # a long stack trace must not block the queue
        try:
            return outgoing(copy, time.time(), frame_max=self._frame_max)
        except MessageRejected as exc:
            where = f"{describe(self._name)}, queue {self._failed_q!r}"
            raise TransportError(f"{where}: cannot write an error-queue copy: {exc}") from exc

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
