"""Whatever a broker hands over, decoding gives an envelope or a poison message: never a crash.

The inputs are what a foreign producer could put on the wire: any header bytes (valid UTF-8 or
not), any AMQP table values, any property strings, any timestamps.
"""

from __future__ import annotations

import contextlib
import datetime
import json

import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.envelope import Envelope, Headers, PoisonMessage
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.transports.kafka import headers as kafka_headers
from bridge.transports.kafka.headers import DEFAULT_KEY
from bridge.transports.rabbitmq import headers as amqp_headers
from bridge.transports.sql import headers as sql_headers

names = st.one_of(
    st.sampled_from(
        [
            "NServiceBus.MessageId",
            "NServiceBus.TimeToBeReceived",
            "NServiceBus.TimeSent",
            "NServiceBus.ContentType",
            "x-death",
            "NServiceBus.Bridge.HeaderLayout",
            "NServiceBus.Bridge.ExpiresAt",
            "NServiceBus.FailedQ",
        ]
    ),
    st.text(max_size=30),
)
texts = st.one_of(
    st.sampled_from(["00:00:10", "1.00:00:00", "-00:00:01", "2026-04-29 21:56:55:590807 Z", ""]),
    st.text(max_size=40),
)
table_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        texts,
        st.binary(max_size=20),
        st.decimals(allow_nan=False, allow_infinity=False, places=2),
        st.datetimes(
            min_value=datetime.datetime(1970, 1, 2), max_value=datetime.datetime(2100, 1, 1)
        ),
        st.floats(allow_nan=False),
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(
        st.tuples(names, st.none() | st.binary(max_size=40) | texts.map(str.encode)), max_size=8
    ),
    value=st.none() | st.binary(max_size=64),
    offset=st.integers(0, 2**62),
)
def test_any_kafka_record(
    headers: list[tuple[str, bytes | None]], value: bytes | None, offset: int
) -> None:
    try:
        envelope = kafka_headers.incoming("t", 0, offset, None, value, headers)
    except HeadersFormatError as exc:
        poison = kafka_headers.incoming_poison("t", 0, offset, value, headers, exc)
        assert isinstance(poison, PoisonMessage)
    else:
        assert isinstance(envelope, Envelope)
        if "NServiceBus.MessageId" not in dict(headers):
            assert envelope.message_id is not None  # the deterministic id of the record


@settings(max_examples=400, deadline=None)
@given(
    headers=st.none() | st.dictionaries(names, table_values, max_size=6),
    message_id=st.none() | texts,
    reply_to=st.none() | texts,
    correlation_id=st.none() | texts,
    content_type=st.none() | texts,
    kind=st.none() | texts,
    expiration=st.none() | texts,
    timestamp=st.none() | st.integers(-(2**40), 2**40),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    body=st.binary(max_size=64),
)
def test_any_amqp_message(
    headers: dict[str, object] | None,
    message_id: str | None,
    reply_to: str | None,
    correlation_id: str | None,
    content_type: str | None,
    kind: str | None,
    expiration: str | None,
    timestamp: int | None,
    delivery_mode: int | None,
    body: bytes,
) -> None:
    properties = pika.BasicProperties(
        headers=headers,
        message_id=message_id,
        reply_to=reply_to,
        correlation_id=correlation_id,
        content_type=content_type,
        type=kind,
        expiration=expiration,
        timestamp=timestamp,
        delivery_mode=delivery_mode,
    )
    try:
        envelope = amqp_headers.incoming(properties, body, 0.0)
    except HeadersFormatError as exc:
        assert isinstance(amqp_headers.incoming_poison(properties, body, exc), PoisonMessage)
    else:
        assert isinstance(envelope, Envelope) and envelope.body == body


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=200), st.binary(max_size=200)))
def test_any_sql_headers_column(raw: str | bytes) -> None:
    with contextlib.suppress(HeadersFormatError):
        sql_headers.decode(raw)


#: Text with lone surrogates mixed in: a JSON escape (`\\ud800`) or a header rule can make them.
surrogate_texts = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=12)


def utf8_can_carry(text: str | None) -> bool:
    return text is None or not any("\ud800" <= c <= "\udfff" for c in text)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(surrogate_texts, st.none() | surrogate_texts), max_size=6))
def test_lone_surrogates_are_poison_on_read_and_rejected_on_write(
    items: list[tuple[str, str | None]],
) -> None:
    """Nothing can carry a lone surrogate: a SQL column holding one as an escape is poison, and
    an envelope holding one is refused by every codec with the error that rejects only it."""
    column = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in items) + "}"
    try:
        read = sql_headers.decode(column)
    except HeadersFormatError:
        assert not all(utf8_can_carry(k) and utf8_can_carry(v) for k, v in items)
    else:  # what is read can always be written again (repeated names collapse, as ever)
        assert sql_headers.decode(sql_headers.encode(read)) == Headers(read.to_dict().items())

    headers = Headers([("NServiceBus.MessageId", "s"), *items])
    envelope = Envelope(headers, b"")
    collapsed = headers.to_dict().items()
    sql_ok = all(utf8_can_carry(k) and utf8_can_carry(v) for k, v in collapsed)
    kafka_ok = all(utf8_can_carry(k) and utf8_can_carry(v) for k, v in headers)
    for ok, codec, refusal in (
        (sql_ok, lambda: sql_headers.encode(headers), HeadersFormatError),
        (kafka_ok, lambda: kafka_headers.outgoing(envelope, DEFAULT_KEY, 0.0), HeadersFormatError),
        (sql_ok, lambda: amqp_headers.outgoing(envelope, 0.0), MessageRejected),
    ):
        if ok:
            codec()
        else:
            with pytest.raises(refusal):
                codec()
