"""The messages the bench writes: NServiceBus-shaped headers, a body of a given size, names."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime

__all__ = [
    "NUMBER",
    "WRITTEN_AT",
    "Message",
    "body_of",
    "headers_json",
    "headers_of",
    "make_messages",
    "time_sent",
    "unique",
]

#: Header the bench writes next to NServiceBus.TimeSent: the write moment as epoch seconds, so
#: a destination consumer computes latency without parsing the wire format.
WRITTEN_AT = "Bench.WrittenAt"
#: Header numbering the messages of one fill or paced run from 0.
NUMBER = "Bench.N"

#: (headers, body) of one bench message; `headers` as a dict in endpoint order.
Message = tuple[dict[str, str], bytes]


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def time_sent(moment: float) -> str:
    """NServiceBus.TimeSent of `moment` (epoch seconds), as endpoints write it."""
    utc = datetime.fromtimestamp(moment, UTC)
    return f"{utc:%Y-%m-%d %H:%M:%S}:{utc.microsecond:06d} Z"


def headers_of(n: int, moment: float) -> dict[str, str]:
    """The headers an NServiceBus endpoint sends a command with (about 500 bytes of JSON)."""
    message_id = str(uuid.uuid4())
    return {
        "NServiceBus.MessageId": message_id,
        "NServiceBus.MessageIntent": "Send",
        "NServiceBus.ConversationId": str(uuid.uuid4()),
        "NServiceBus.CorrelationId": message_id,
        "NServiceBus.OriginatingEndpoint": "Bench.Sender",
        "NServiceBus.OriginatingMachine": "bench",
        "NServiceBus.ReplyToAddress": "Bench.Sender",
        "NServiceBus.ContentType": "application/json",
        "NServiceBus.EnclosedMessageTypes": "Bench.Messages.Ping, Bench.Messages",
        "NServiceBus.Version": "9.2.3",
        "NServiceBus.TimeSent": time_sent(moment),
        WRITTEN_AT: repr(moment),
        NUMBER: str(n),
    }


def headers_json(headers: dict[str, str]) -> str:
    """The SQL Headers column as endpoints write it (compact, `/` escaped)."""
    return json.dumps(headers, separators=(",", ":"), ensure_ascii=False).replace("/", "\\/")


def body_of(size: int) -> bytes:
    return (b'{"payload":"' + b"x" * size)[: size - 2] + b'"}'


def make_messages(count: int, size: int, start: int = 0) -> list[Message]:
    now = time.time()
    body = body_of(size)
    return [(headers_of(start + i, now), body) for i in range(count)]
