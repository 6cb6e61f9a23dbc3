"""The seam `amqp_table` (bridge/transports/rabbitmq/amqp_table.py): the fast properties encode
to the very bytes pika's own `BasicProperties.encode()` writes, are sized alike, and are refused
alike. Both implementations are called directly, whatever `BRIDGE_SPEEDUPS_OFF` says.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any
from unittest import mock

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import MESSAGE_ID, TIME_SENT, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import MessageRejected
from bridge.transports.rabbitmq import amqp_table
from bridge.transports.rabbitmq import headers as amqp_headers
from bridge.transports.rabbitmq.headers import (
    CONFIRMATION_ID,
    CONTENT_TYPE,
    CORRELATION_ID,
    DELAY_IN_SECONDS,
    ENCLOSED_MESSAGE_TYPES,
    FRAME_MAX,
    LAYOUT,
    NON_PERSISTENT,
    REPLY_TO,
    incoming,
    outgoing,
)

NOW = 1_800_000_000.0

Seam = Callable[..., tuple[pika.BasicProperties, int]]

#: The headers an NServiceBus endpoint sends, and those the mapping turns into properties.
NSERVICEBUS_HEADERS = [
    MESSAGE_ID,
    CORRELATION_ID,
    REPLY_TO,
    CONTENT_TYPE,
    ENCLOSED_MESSAGE_TYPES,
    TIME_SENT,
    TIME_TO_BE_RECEIVED,
    NON_PERSISTENT,
    DELAY_IN_SECONDS,
    CONFIRMATION_ID,
    LAYOUT,
    "NServiceBus.ConversationId",
    "NServiceBus.OriginatingEndpoint",
    "NServiceBus.OriginatingMachine",
    "NServiceBus.OriginatingHostId",
    "NServiceBus.MessageIntent",
    "NServiceBus.Version",
    "NServiceBus.RelatedTo",
    "$.diagnostics.originating.hostid",
    "traceparent",
]
UNENCODABLE = "lone \udc80 surrogate"

names = st.one_of(
    st.sampled_from(NSERVICEBUS_HEADERS),
    st.text(min_size=1, max_size=70),
    st.text(min_size=60, max_size=130),  # over 255 bytes in UTF-8 when not ASCII
    st.just("n" * 256),
    st.just(UNENCODABLE),
)
values = st.one_of(
    st.none(),
    st.text(max_size=300),
    st.text(min_size=2_000, max_size=6_000),
    st.sampled_from(
        [
            "",
            "application/json",
            "Ns.OrderPlaced, Sales, Version=1.0.0.0;Ns.IEvent, Sales",
            "Sales@[dbo]@[nservicebus]",
            "2026-04-29 21:56:55:590807 Z",
            "00:10:00",
            "True",
            "q" * 256,
            "café / 東京 / \u2028",
            UNENCODABLE,
        ]
    ),
)
message_ids = st.one_of(
    st.none(),
    st.builds(lambda: str(uuid.uuid4())),
    st.text(max_size=100),
    st.text(min_size=60, max_size=300),
    st.just(UNENCODABLE),
)


def laid_out(envelope: Envelope, seam: Seam, frame_max: int) -> tuple[object, list[int]]:
    """What `outgoing` makes of `envelope` through `seam`: the encoded properties and body, or
    the refusal's text; and the sizes the seam reported."""
    sizes: list[int] = []

    def recording(headers: dict[str, str | None], *fields: Any) -> tuple[Any, int]:
        properties, size = seam(headers, *fields)
        sizes.append(size)
        return properties, size

    with mock.patch.object(amqp_headers, "sized_properties", recording):
        try:
            properties, body = outgoing(envelope, NOW, frame_max=frame_max)
        except MessageRejected as exc:
            return str(exc), sizes
    return (b"".join(properties.encode()), body), sizes


def decoded(encoded: bytes) -> pika.BasicProperties:
    properties = pika.BasicProperties()
    properties.decode(encoded)
    return properties


@given(
    headers=st.lists(st.tuples(names, values), max_size=14),
    message_id=message_ids,
    expires=st.none() | st.floats(NOW - 10, NOW + 1e6),
    frame_max=st.sampled_from([FRAME_MAX, 4_096, 512]),
    body=st.binary(max_size=64),
)
def test_fast_properties_encode_as_pika_does(
    headers: list[tuple[str, str | None]],
    message_id: str | None,
    expires: float | None,
    frame_max: int,
    body: bytes,
) -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, message_id), *headers]), body, expires_at=expires)
    fast, fast_sizes = laid_out(envelope, amqp_table.fast_properties, frame_max)
    plain, plain_sizes = laid_out(envelope, amqp_table.plain_properties, frame_max)
    assert fast == plain
    assert fast_sizes == plain_sizes
    if isinstance(fast, tuple):
        encoded, sent = fast
        assert fast_sizes == [len(encoded) - 2]  # the size is exact (2: the property flags)
        back = incoming(decoded(encoded), sent, NOW)
        assert back == incoming(decoded(plain[0]), sent, NOW)  # type: ignore[index]
        assert back.body == body


def test_a_batch_of_nservicebus_messages_encodes_as_pika_does() -> None:
    for i in range(200):
        envelope = Envelope(
            Headers(
                [
                    (MESSAGE_ID, str(uuid.uuid4())),
                    ("NServiceBus.ConversationId", str(uuid.uuid4())),
                    (CORRELATION_ID, f"corr-{i}"),
                    (REPLY_TO, "Sales"),
                    (CONTENT_TYPE, "application/json"),
                    (ENCLOSED_MESSAGE_TYPES, "Ns.OrderPlaced, Sales;Ns.IEvent, Sales"),
                    (TIME_SENT, "2026-04-29 21:56:55:590807 Z"),
                    ("NServiceBus.MessageIntent", "Publish"),
                    ("null", None),
                    *([(NON_PERSISTENT, "True")] if i % 3 == 0 else []),
                ]
            ),
            b"{}",
            expires_at=NOW + 60 if i % 2 else None,
        )
        fast, _ = laid_out(envelope, amqp_table.fast_properties, FRAME_MAX)
        assert fast == laid_out(envelope, amqp_table.plain_properties, FRAME_MAX)[0]


def pika_encoded(properties: pika.BasicProperties) -> bytes:
    """The content header properties as pika's own encoder writes them."""
    plain = pika.BasicProperties(**vars(properties))
    return b"".join(plain.encode())


def fast(*items: tuple[str, str | None]) -> pika.BasicProperties:
    envelope = Envelope(Headers([(MESSAGE_ID, "id-1"), *items]), b"body")
    with mock.patch.object(amqp_headers, "sized_properties", amqp_table.fast_properties):
        properties, _ = outgoing(envelope, NOW)
    return properties


def test_the_kept_field_names_stay_few_when_every_message_has_names_of_its_own() -> None:
    kept = amqp_table._FIELD_STARTS_KEPT
    for i in range(3 * kept):
        properties = fast((f"trace-{uuid.uuid4()}", None if i % 2 else "v"))
        assert b"".join(properties.encode()) == pika_encoded(properties)
    assert 0 < len(amqp_table._STRING_FIELDS) <= kept
    assert 0 < len(amqp_table._VOID_FIELDS) <= kept
    for name in ("n" * 256, "\ud800"):  # not a short string, not UTF-8: refused, not kept
        with pytest.raises(MessageRejected):
            fast((name, "v"))
        assert name not in amqp_table._STRING_FIELDS


def test_headers_replaced_after_outgoing_are_the_ones_written() -> None:
    properties = fast(("a", "1"))
    properties.headers = {MESSAGE_ID: "id-2"}
    assert b"".join(properties.encode()) == pika_encoded(properties)
    assert decoded(b"".join(properties.encode())).headers == {MESSAGE_ID: "id-2"}
