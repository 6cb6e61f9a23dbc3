"""The error-queue copy of a message that can never be forwarded, as NServiceBus makes it.

ServiceControl and ServicePulse read these headers, and their "retry" sends the message back
to `NServiceBus.FailedQ`, the source address in its transport's canonical form, where the
bridge picks it up again. The body is never changed. A poison message whose headers could not
be read at all keeps its raw headers unchanged (wire-format §5) where the error queue's
transport can store them so (SQL), and carries them in `NServiceBus.Bridge.RawHeaders`
elsewhere.
"""

from __future__ import annotations

import socket
import traceback
from datetime import UTC, datetime

from bridge.envelope import Envelope, PoisonMessage
from bridge.wireformat import format_timestamp

__all__ = ["RAW_HEADERS", "error_copy", "failure_headers"]

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
    """The headers NServiceBus's recoverability adds to an error-queue copy."""
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
        ("NServiceBus.ProcessingMachine", socket.gethostname()),
    ]


def error_copy(
    item: Envelope | PoisonMessage, error: BaseException | str, failed_q: str
) -> Envelope:
    """An envelope for the error queue: the original headers plus the failure headers."""
    headers = item.headers.copy()
    if isinstance(item, PoisonMessage):
        raw = item.raw_headers
        if raw is not None:
            headers.set(
                RAW_HEADERS, raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
            )
        added = failure_headers(item.reason, failed_q, exception_type=item.exception_type)
    else:
        added = failure_headers(error, failed_q)
    for name, value in added:
        headers.set(name, value)
    return Envelope(headers, item.body, native_id=item.native_id)
