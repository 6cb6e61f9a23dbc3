"""aiokafka failures translated into the bridge's error tree, in this one place.

Retriable (`TransportUnavailable`): every aiokafka error whose class says `retriable`
(connection lost, no leader, request timed out, coordinator moving, ...), plus
`KafkaTimeoutError` (a request or a full send buffer timed out: the broker is slow or away),
`KafkaConnectionError` and plain `OSError`/`TimeoutError`.

One message refused for good (`MessageRejected`, only when the caller names the envelope's
index): the record is too large for the producer or the broker, or the broker refused the
record's timestamp. An invalid topic name is the route's, not a message's: it fails the route
(every message would otherwise be sent to the error queue). A topic that does not exist is
decided by the sink (it lists the cluster's topics first), because
`UnknownTopicOrPartitionError` on its own also means "created a moment ago, not visible yet"
and aiokafka marks it retriable.

Everything else (authorization, unsupported codec, fenced producer, consumer stopped) is a
`TransportError` that retrying will not fix. Errors that already are bridge errors pass through.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka.errors import (
    ConsumerStoppedError,
    IllegalOperation,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from bridge.errors import BridgeError, MessageRejected, TransportError, TransportUnavailable

__all__ = ["DRIVER_ERRORS", "translate", "translated"]

#: What aiokafka and the sockets under it raise; anything else is a bug and propagates as is.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    KafkaError,
    ConsumerStoppedError,
    IllegalOperation,
    OSError,
    TimeoutError,
)

_PER_MESSAGE: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    RecordListTooLargeError,
    InvalidTimestampError,
)

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    KafkaTimeoutError,
    KafkaConnectionError,
    OSError,
    TimeoutError,
)


def translate(exc: BaseException, where: str, *, index: int | None = None) -> BridgeError:
    """The bridge error for `exc`, raised while doing `where` (e.g. "send to topic 'sales'")."""
    if isinstance(exc, BridgeError):
        return exc
    detail = str(exc) or type(exc).__name__
    if type(exc).__name__ not in detail:
        detail = f"{type(exc).__name__}: {detail}"
    message = f"kafka: {where}: {detail}"
    if index is not None and isinstance(exc, _PER_MESSAGE):
        return MessageRejected(message, index=index)
    if isinstance(exc, _UNAVAILABLE) or getattr(exc, "retriable", False):
        return TransportUnavailable(message)
    return TransportError(message)


@contextmanager
def translated(where: str, *, index: int | None = None) -> Iterator[None]:
    """Raise driver errors from the block as bridge errors (see `translate`)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise translate(exc, where, index=index) from exc
