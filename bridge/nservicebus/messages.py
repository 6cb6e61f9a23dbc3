"""Messages as an NServiceBus endpoint writes them (what `bridge send` and the demo write)."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

from bridge.envelope import MESSAGE_ID, TIME_SENT, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.nservicebus.wireformat import format_timespan, format_timestamp, parse_timespan

__all__ = ["endpoint_message"]


def endpoint_message(
    body: bytes, extra: Sequence[tuple[str, str]] = (), ttl: str | None = None
) -> Envelope:
    """A message with the headers an NServiceBus endpoint writes on a plain Send."""
    message_id = str(uuid.uuid4())
    headers = Headers(
        [
            (MESSAGE_ID, message_id),
            ("NServiceBus.MessageIntent", "Send"),
            ("NServiceBus.ConversationId", str(uuid.uuid4())),
            ("NServiceBus.CorrelationId", message_id),
            ("NServiceBus.OriginatingEndpoint", "bridge"),
            ("NServiceBus.OriginatingMachine", socket.gethostname()),
            ("NServiceBus.ContentType", "application/json"),
            (TIME_SENT, format_timestamp(datetime.now(UTC))),
        ]
    )
    expires_at = None
    if ttl is not None:
        span = parse_timespan(ttl)
        headers.set(TIME_TO_BE_RECEIVED, format_timespan(span))
        expires_at = time.time() + span.total_seconds()
    for name, value in extra:
        headers.set(name, value)
    return Envelope(headers, body, expires_at=expires_at)
