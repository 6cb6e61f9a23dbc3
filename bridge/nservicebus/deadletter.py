"""The error-queue copy of a message that can never be forwarded, as NServiceBus makes it.

ServiceControl and ServicePulse read these headers, and their "retry" sends the message back
to `NServiceBus.FailedQ`, the source address in its transport's canonical form, where the
bridge picks it up again. The body is never changed.

Who failed
    As an NServiceBus endpoint's recoverability writes them: `NServiceBus.ProcessingEndpoint`
    is the bridge (`bridge`), `NServiceBus.ProcessingMachine` and `$.diagnostics.hostdisplayname`
    its host's name, `$.diagnostics.hostid` its host id (`host.py`). ServiceControl files the
    failure under that endpoint and instance, and lists the instance. The endpoint is the
    bridge, not the endpoint that owns the source queue: the failure is the bridge's, and
    ServiceControl would otherwise list a phantom instance of that endpoint on the bridge's host.

An error copy that fails again
    A message that already is an error-queue copy (it carries `NServiceBus.FailedQ`: one on its
    way to ServiceControl through a proxy) keeps its own failure headers, so that its real
    failed queue is not lost; the bridge's go beside them under `NServiceBus.MessagingBridge.`
    (`...FailedQ`, `...ExceptionInfo.*`, `...TimeOfFailure`), as the Messaging Bridge writes
    its own failures (RawEndpointErrorHandlingPolicy.cs:30-31 and BridgeHeaders.cs:1-13 of
    Particular/NServiceBus.MessagingBridge@ef463cf).

A delayed message
    A message the bridge was asked to delay (`Envelope.deliver_at`, from a Kafka record's
    `NServiceBus.Bridge.DeliverAt`, which reading removes) that fails keeps the request: its
    copy carries `NServiceBus.Bridge.DeliverAt` again, the time in NServiceBus's timestamp
    format, so that a retry (back to FailedQ, the Kafka topic it came from) is delayed as the
    message first asked, or refused again for the same reason. The copy itself goes to the
    error queue at once, and is never delayed on its way: a reader takes the header on a
    message carrying `NServiceBus.FailedQ` as information (`bridge.transports.kafka.headers`;
    the SQL and RabbitMQ readers never read it).

Poison messages (headers that cannot be read at all)
    Kafka and RabbitMQ error copies keep the original headers byte for byte and append the
    failure headers (`kafka/headers.py`, `rabbitmq/headers.py`). A SQL Headers column that is
    not a JSON object cannot take headers added to it, so `error_copy` makes a new, valid
    headers object: the failure headers, `NServiceBus.MessageId` (the row's native id when
    nothing readable names one, as NServiceBus does for a message without that header) and the
    raw column text verbatim in `NServiceBus.Bridge.RawHeaders` (text that is not valid UTF-8
    gets replacement characters).

Retrying a poison copy
    ServicePulse's retry sends the copy back to FailedQ with the failure headers removed, so
    its headers are the `NServiceBus.Bridge.RawHeaders` header, the message id and
    ServiceControl's retry headers. Its original headers are still unreadable: forwarding it
    would hand the destination a message with none of them. A SQL source therefore treats a
    row carrying `NServiceBus.Bridge.RawHeaders` as poison again (`returned_poison`): it goes
    back to the error queue with the same raw headers and message id, the ServiceControl retry
    headers (so ServiceControl sees the retry failed) and fresh failure headers. It is
    forwarded once someone repairs it (ServicePulse's "edit and retry": put readable headers in
    place and remove `NServiceBus.Bridge.RawHeaders`).
"""

from __future__ import annotations

import traceback
from datetime import UTC, datetime

from bridge.envelope import MESSAGE_ID, Envelope, PoisonMessage
from bridge.errors import HeadersFormatError
from bridge.nservicebus.delays import DELIVER_AT
from bridge.nservicebus.host import host_id, host_name
from bridge.nservicebus.lifetime import FAILED_Q
from bridge.nservicebus.wireformat import format_timestamp

__all__ = [
    "DEFAULT_ERROR_QUEUE",
    "HOST_DISPLAY_NAME",
    "HOST_ID",
    "RAW_HEADERS",
    "error_copy",
    "failure_headers",
    "returned_poison",
]

HOST_ID = "$.diagnostics.hostid"
#: Where the bridge's own failure headers go on a message that already has failure headers.
BRIDGE_PREFIX = "NServiceBus.MessagingBridge."
_OWN = (FAILED_Q, "NServiceBus.ExceptionInfo.", "NServiceBus.TimeOfFailure")
HOST_DISPLAY_NAME = "$.diagnostics.hostdisplayname"
#: Where a route's poison messages go when it names no `error_queue`: on the source's connection.
DEFAULT_ERROR_QUEUE = "bridge.error"
RAW_HEADERS = "NServiceBus.Bridge.RawHeaders"
MAX_MESSAGE = 16_384
ENDPOINT = "bridge"


def _type_name(error: BaseException) -> str:
    kind = type(error)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def failure_headers(
    error: BaseException | str, failed_q: str, *, exception_type: str | None = None
) -> list[tuple[str, str]]:
    """The headers NServiceBus's recoverability adds to an error-queue copy: the exception's
    and the host's (see "Who failed" in the module docstring)."""
    if isinstance(error, BaseException):
        kind = exception_type or _type_name(error)
        message = str(error)
        stack = "".join(traceback.format_exception(error)).rstrip() or f"{kind}: {message}"
    else:
        kind = exception_type or "bridge.errors.TransportError"
        message = error
        stack = f"{kind}: {message}"
    return [
        ("NServiceBus.FailedQ", failed_q),
        ("NServiceBus.ExceptionInfo.ExceptionType", kind),
        ("NServiceBus.ExceptionInfo.Message", message[:MAX_MESSAGE]),
        ("NServiceBus.ExceptionInfo.Source", ENDPOINT),
        ("NServiceBus.ExceptionInfo.StackTrace", stack),
        ("NServiceBus.TimeOfFailure", format_timestamp(datetime.now(UTC))),
        ("NServiceBus.ProcessingEndpoint", ENDPOINT),
        ("NServiceBus.ProcessingMachine", host_name()),
        (HOST_ID, host_id()),
        (HOST_DISPLAY_NAME, host_name()),
    ]


def error_copy(
    item: Envelope | PoisonMessage, error: BaseException | str, failed_q: str
) -> Envelope:
    """An envelope for the error queue: the original headers plus the failure headers."""
    headers = item.headers.copy()
    if isinstance(item, PoisonMessage):
        if item.raw_headers is not None:
            headers.set(RAW_HEADERS, _text(item.raw_headers))
        if headers.get(MESSAGE_ID) is None and item.native_id:
            headers.set(MESSAGE_ID, item.native_id)
        added = failure_headers(item.reason, failed_q, exception_type=item.exception_type)
    else:
        added = failure_headers(error, failed_q)
        if FAILED_Q in item.headers:  # an error copy already: keep its own failure headers
            added = [
                (BRIDGE_PREFIX + n.removeprefix("NServiceBus."), v)
                for n, v in added
                if n.startswith(_OWN)
            ]
    for name, value in added:
        headers.set(name, value)
    if isinstance(item, Envelope) and item.deliver_at is not None and DELIVER_AT not in headers:
        headers.add(DELIVER_AT, format_timestamp(datetime.fromtimestamp(item.deliver_at, UTC)))
    return Envelope(headers, item.body, native_id=item.native_id)


def returned_poison(envelope: Envelope) -> PoisonMessage | None:
    """The poison message `envelope` still is when it carries `NServiceBus.Bridge.RawHeaders`
    (a poison copy sent back by a retry, see the module docstring); None otherwise."""
    raw = envelope.headers.get(RAW_HEADERS)
    if raw is None:
        return None
    return PoisonMessage(
        raw_headers=raw,
        body=envelope.body,
        reason=(
            f"the message's original headers cannot be read; they are kept in {RAW_HEADERS}: "
            f"repair them and remove {RAW_HEADERS} to forward it"
        ),
        exception_type=HeadersFormatError.__name__,  # as the first copy had it
        native_id=envelope.native_id,
        headers=envelope.headers.copy(),
    )


def _text(raw: str | bytes) -> str:
    """Raw headers as a header value: verbatim when they are valid text."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: no destination can store them
        return raw.encode("utf-8", "replace").decode("utf-8")
    return raw
