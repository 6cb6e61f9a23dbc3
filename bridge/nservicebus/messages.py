"""Messages as an NServiceBus endpoint writes them (what `bridge send` and the demo write).

Content type: what the body is, unless a header says: `application/json` when it parses as
JSON, `text/xml` when it is well-formed XML (NServiceBus's two serializers), `text/plain` for
other UTF-8 text, else `application/octet-stream`.

Time to live (`parse_ttl`): from 1 ms to 24.20:31:23.647, in whole milliseconds: what every
transport carries, so the message keeps it wherever it is bridged. SQL Server's send takes it
as an Int32 of milliseconds (the smallest maximum of all), RabbitMQ's `expiration` as whole
milliseconds, and a time span of zero or less is no time to live at all.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from xml.etree import ElementTree

from bridge.envelope import MESSAGE_ID, TIME_SENT, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.nservicebus.wireformat import format_timespan, format_timestamp, parse_timespan
from bridge.transports.sql.dialects.tsql import INT32_MAX

__all__ = ["MAX_TTL", "MIN_TTL", "TTL_RANGE", "content_type_of", "endpoint_message", "parse_ttl"]

CONTENT_TYPE = "NServiceBus.ContentType"
CORRELATION_ID = "NServiceBus.CorrelationId"

MIN_TTL = timedelta(milliseconds=1)
MAX_TTL = timedelta(milliseconds=INT32_MAX)
TTL_RANGE = "from 00:00:00.001 to 24.20:31:23.647, in whole milliseconds"
_MILLISECOND = timedelta(milliseconds=1)


def parse_ttl(text: str) -> timedelta:
    """A time to live every transport carries (module docstring); ValueError saying the range."""
    try:
        span = parse_timespan(text)
    except (ValueError, OverflowError):  # OverflowError: more days than a timedelta holds
        span = None
    if span is None or not MIN_TTL <= span <= MAX_TTL or span % _MILLISECOND:
        raise ValueError(
            f"takes a time span {TTL_RANGE} (the most SQL Server carries: an Int32 of "
            f"milliseconds; RabbitMQ carries whole milliseconds), got {text!r}"
        )
    return span


def content_type_of(body: bytes) -> str:
    """The content type an endpoint would give `body` (module docstring)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return "application/octet-stream"
    try:
        json.loads(text)
        return "application/json"
    except ValueError:
        pass
    if text.lstrip().startswith("<"):
        try:
            ElementTree.fromstring(text)  # noqa: S314 (the user's own body, never parsed for use)
            return "text/xml"
        except ElementTree.ParseError:
            pass
    return "text/plain"


def endpoint_message(
    body: bytes,
    extra: Sequence[tuple[str, str]] = (),
    ttl: timedelta | None = None,
    *,
    content_type: str | None = None,
) -> Envelope:
    """A message with the headers an NServiceBus endpoint writes on a plain Send, then `extra`.

    `content_type`: the body's, when the caller worked it out once for many messages (else
    `content_type_of`); a `NServiceBus.ContentType` in `extra` wins. A `NServiceBus.MessageId`
    in `extra` is also the correlation id, as on any fresh send, unless `extra` gives one.
    """
    message_id = str(uuid.uuid4())
    headers = Headers(
        [
            (MESSAGE_ID, message_id),
            ("NServiceBus.MessageIntent", "Send"),
            ("NServiceBus.ConversationId", str(uuid.uuid4())),
            (CORRELATION_ID, message_id),
            ("NServiceBus.OriginatingEndpoint", "bridge"),
            ("NServiceBus.OriginatingMachine", socket.gethostname()),
            (CONTENT_TYPE, content_type or content_type_of(body)),
            (TIME_SENT, format_timestamp(datetime.now(UTC))),
        ]
    )
    expires_at = ttl_ms = None
    if ttl is not None:
        headers.set(TIME_TO_BE_RECEIVED, format_timespan(ttl))
        ttl_ms = ttl // _MILLISECOND
        expires_at = time.time() + ttl_ms / 1000
    given = {name for name, _ in extra}
    for name, value in extra:
        headers.set(name, value)
    if MESSAGE_ID in given and CORRELATION_ID not in given:
        headers.set(CORRELATION_ID, headers.get(MESSAGE_ID))
    return Envelope(headers, body, expires_at=expires_at, time_to_live_ms=ttl_ms)
