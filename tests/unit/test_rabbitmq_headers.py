"""The AMQP codec (bridge/transports/rabbitmq/headers.py): `outgoing` is the inverse of
`incoming`, and what it writes is what an NServiceBus RabbitMQ 11 endpoint expects.

Messages cross a real pika encode/decode (`wire`); `sorted_by_quorum` hands the headers table
back sorted by name, as RabbitMQ quorum queues do.
"""

from __future__ import annotations

import decimal
import json
import uuid
from datetime import UTC, datetime

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import MESSAGE_ID, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.transports.rabbitmq.deadletter import error_properties
from bridge.transports.rabbitmq.headers import (
    CONTENT_TYPE,
    CORRELATION_ID,
    ENCLOSED_MESSAGE_TYPES,
    LAYOUT,
    NON_PERSISTENT,
    REPLY_TO,
    TIME_SENT,
    incoming,
    incoming_poison,
    outgoing,
)

NOW = 1_800_000_000.0


def wire(properties: pika.BasicProperties) -> pika.BasicProperties:
    """The properties as a receiver decodes them from the bytes pika writes."""
    decoded = pika.BasicProperties()
    decoded.decode(b"".join(properties.encode()))
    return decoded


def sorted_by_quorum(properties: pika.BasicProperties) -> pika.BasicProperties:
    decoded = wire(properties)
    table = decoded.headers or {}
    decoded.headers = {name: table[name] for name in sorted(table, key=str.encode)}
    return decoded


def envelope(*items: tuple[str, str | None], body: bytes = b"body") -> Envelope:
    return Envelope(Headers([(MESSAGE_ID, "id-1"), *items]), body)


def round_trip(original: Envelope, *, quorum: bool = False) -> Envelope:
    properties, body = outgoing(original, NOW)
    received = sorted_by_quorum(properties) if quorum else wire(properties)
    return incoming(received, body)


# -- inverse pair ----------------------------------------------------------------------------


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_incoming_inverts_outgoing_keeping_order_null_and_empty(quorum: bool) -> None:
    original = envelope(
        ("zeta", "last letter first"),
        ("NServiceBus.ReplyToAddress", "Sales"),
        ("empty", ""),
        ("null", None),
        ("unicode", 'café / 東京 / \u2028 "quoted" \\ back'),
        ("alpha", "a"),
        body=bytes(range(256)) * 4,
    )
    back = round_trip(original, quorum=quorum)
    assert back.headers.items() == original.headers.items()
    assert back.body == original.body
    assert back.expires_at is None


@given(
    headers=st.dictionaries(
        st.text(min_size=1, max_size=40).filter(
            lambda n: not n.startswith(("x-", "NServiceBus.")) and n != LAYOUT
        ),
        st.none() | st.text(max_size=60),
        max_size=12,
    ),
    body=st.binary(max_size=300),
    quorum=st.booleans(),
)
def test_inverse_pair_for_any_headers(
    headers: dict[str, str | None], body: bytes, quorum: bool
) -> None:
    original = Envelope(Headers([(MESSAGE_ID, "m"), *headers.items()]), body)
    back = round_trip(original, quorum=quorum)
    assert back.headers.items() == original.headers.items()
    assert back.body == body


def test_repeated_names_collapse_to_the_last_value_at_the_first_position() -> None:
    back = round_trip(envelope(("a", "1"), ("b", "2"), ("a", "3")))
    assert back.headers.items() == [(MESSAGE_ID, "id-1"), ("a", "3"), ("b", "2")]


def test_mapped_headers_come_back_unchanged() -> None:
    original = envelope(
        (CORRELATION_ID, "corr-1"),
        (REPLY_TO, "Billing"),
        (CONTENT_TYPE, "application/json"),
        (ENCLOSED_MESSAGE_TYPES, "Ns.OrderPlaced, Sales, Version=1.0.0.0;Ns.IEvent, Sales"),
        ("NServiceBus.MessageIntent", "Publish"),
    )
    assert round_trip(original, quorum=True).headers.items() == original.headers.items()


def test_null_mapped_headers_stay_null() -> None:
    original = envelope((CONTENT_TYPE, None), (REPLY_TO, None), (CORRELATION_ID, None))
    assert round_trip(original).headers.items() == original.headers.items()


def test_non_persistent_header_comes_back_as_true_in_its_place() -> None:
    back = round_trip(envelope((NON_PERSISTENT, "True"), ("z", "1")), quorum=True)
    assert back.headers.items() == [(MESSAGE_ID, "id-1"), (NON_PERSISTENT, "True"), ("z", "1")]


# -- what an NServiceBus RabbitMQ endpoint expects -------------------------------------------


def test_properties_an_endpoint_reads() -> None:
    properties, body = outgoing(
        envelope(
            (CORRELATION_ID, "corr-1"),
            (REPLY_TO, "Sales"),
            (CONTENT_TYPE, "application/json"),
            (ENCLOSED_MESSAGE_TYPES, "Ns.OrderPlaced, Sales, Version=1.0.0.0;Ns.IEvent, Sales"),
            body=b"{}",
        ),
        NOW,
    )
    assert properties.message_id == "id-1"
    assert properties.delivery_mode == 2
    assert properties.correlation_id == "corr-1"
    assert properties.reply_to == "Sales"
    assert properties.content_type == "application/json"
    assert properties.type == "Ns.OrderPlaced"
    assert properties.expiration is None
    assert properties.timestamp is None
    assert body == b"{}"


def test_every_header_is_in_the_table_as_a_string() -> None:
    properties, _ = outgoing(
        envelope((CORRELATION_ID, "c"), (REPLY_TO, "Sales"), ("custom", "")), NOW
    )
    table = wire(properties).headers
    assert table is not None
    assert table[MESSAGE_ID] == "id-1"
    assert table[CORRELATION_ID] == "c"
    assert table[REPLY_TO] == "Sales"
    assert table["custom"] == ""
    assert all(isinstance(value, str) for value in table.values())


def test_sorted_headers_without_nulls_need_no_layout_header() -> None:
    properties, _ = outgoing(envelope(("Z", "1")), NOW)
    assert LAYOUT not in properties.headers
    properties, _ = outgoing(envelope(("A", "1")), NOW)
    assert json.loads(properties.headers[LAYOUT]) == {"order": [MESSAGE_ID, "A"]}


def test_null_is_void_in_the_table_and_listed_in_the_layout() -> None:
    properties, _ = outgoing(envelope(("null", None)), NOW)
    table = wire(properties).headers
    assert table["null"] is None
    assert json.loads(table[LAYOUT])["null"] == ["null"]


def test_content_type_defaults_to_octet_stream() -> None:
    properties, _ = outgoing(envelope(), NOW)
    assert properties.content_type == "application/octet-stream"
    assert CONTENT_TYPE not in properties.headers


def test_type_is_cut_at_the_first_comma_only() -> None:
    properties, _ = outgoing(envelope((ENCLOSED_MESSAGE_TYPES, "Ns.A;Ns.B")), NOW)
    assert properties.type == "Ns.A;Ns.B"
    properties, _ = outgoing(envelope((ENCLOSED_MESSAGE_TYPES, "Ns.A, Asm;Ns.B, Asm")), NOW)
    assert properties.type == "Ns.A"


def test_non_persistent_delivery_header_is_stripped_and_sets_mode_1() -> None:
    properties, _ = outgoing(envelope((NON_PERSISTENT, "True")), NOW)
    assert properties.delivery_mode == 1
    assert NON_PERSISTENT not in properties.headers


@pytest.mark.parametrize("message_id", [None, "", "   "])
def test_an_envelope_without_message_id_is_rejected(message_id: str | None) -> None:
    headers = Headers([("other", "x")] if message_id is None else [(MESSAGE_ID, message_id)])
    with pytest.raises(MessageRejected, match="MessageId"):
        outgoing(Envelope(headers, b""), NOW)


@pytest.mark.parametrize(
    "item",
    [
        ("n" * 256, "value"),
        (REPLY_TO, "q" * 256),
        ("big", "v" * 200_000),
        ("bad", "lone \udc80 surrogate"),
        ("lone \udc80 name", "v"),
    ],
    ids=["long-name", "long-reply-to", "over-one-frame", "not-utf8", "name-not-utf8"],
)
def test_what_amqp_cannot_carry_is_rejected(item: tuple[str, str]) -> None:
    with pytest.raises(MessageRejected):
        outgoing(envelope(item), NOW)


# -- time to live ----------------------------------------------------------------------------


def test_expiration_is_the_remaining_lifetime_in_whole_milliseconds() -> None:
    original = envelope((TIME_TO_BE_RECEIVED, "00:10:00"))
    original.expires_at = NOW + 59.9996
    properties, _ = outgoing(original, NOW)
    assert properties.expiration == "59999"
    assert properties.headers[TIME_TO_BE_RECEIVED] == "00:00:59.9990000"
    assert properties.timestamp == round(NOW)


def test_remaining_lifetime_comes_back_as_expires_at() -> None:
    original = envelope((TIME_TO_BE_RECEIVED, "00:01:00"))
    original.expires_at = NOW + 42.5
    back = round_trip(original, quorum=True)
    assert back.expires_at is not None
    assert abs(back.expires_at - original.expires_at) <= 0.5
    assert back.headers.get(TIME_TO_BE_RECEIVED) == "00:00:42.5000000"


def test_an_envelope_that_expired_is_sent_with_one_millisecond() -> None:
    original = envelope()
    original.expires_at = NOW - 5
    properties, _ = outgoing(original, NOW)
    assert properties.expiration == "1"
    assert properties.headers[TIME_TO_BE_RECEIVED] == "00:00:00.0010000"


def test_time_to_be_received_without_expires_at_is_carried_as_is() -> None:
    properties, _ = outgoing(envelope((TIME_TO_BE_RECEIVED, "00:00:10")), NOW)
    assert properties.expiration is None
    assert properties.headers[TIME_TO_BE_RECEIVED] == "00:00:10"


def test_an_endpoint_message_expires_at_time_sent_plus_time_to_be_received() -> None:
    properties = pika.BasicProperties(
        message_id="m",
        expiration="10000",
        headers={TIME_SENT: "2026-04-29 21:56:55:590807 Z", TIME_TO_BE_RECEIVED: "00:00:10"},
    )
    sent = datetime(2026, 4, 29, 21, 56, 55, 590807, tzinfo=UTC).timestamp()
    assert incoming(wire(properties), b"").expires_at == pytest.approx(sent + 10)


def test_expiration_alone_gives_no_expiry() -> None:
    properties = pika.BasicProperties(message_id="m", expiration="10000")
    assert incoming(wire(properties), b"").expires_at is None


def test_expiration_counts_from_time_sent_without_time_to_be_received() -> None:
    properties = pika.BasicProperties(
        message_id="m", expiration="2500", headers={TIME_SENT: "2026-04-29 21:56:55:000000 Z"}
    )
    sent = datetime(2026, 4, 29, 21, 56, 55, tzinfo=UTC).timestamp()
    assert incoming(wire(properties), b"").expires_at == pytest.approx(sent + 2.5)


def test_an_expiration_past_any_date_never_expires() -> None:
    """Found by the fuzzer: a timedelta of it overflowed, so the message could not be read."""
    properties = pika.BasicProperties(
        message_id="m",
        expiration="86400000000000000",
        headers={TIME_SENT: "2026-04-29 21:56:55:000000 Z"},
    )
    assert incoming(wire(properties), b"").expires_at is None


@pytest.mark.parametrize("expiration", ["\u00b2", "\u0661\u0662", "12x", "-5", ""])
def test_an_expiration_that_is_not_ascii_digits_gives_no_expiry(expiration: str) -> None:
    """Found by the fuzzer: '²' passed str.isdigit() and int() refused it, so the message could
    not be read."""
    properties = pika.BasicProperties(
        message_id="m", expiration=expiration, headers={TIME_SENT: "2026-04-29 21:56:55:000000 Z"}
    )
    assert incoming(wire(properties), b"").expires_at is None


# -- reading what other writers sent ---------------------------------------------------------


def test_properties_overwrite_their_headers() -> None:
    properties = pika.BasicProperties(
        message_id="m",
        reply_to="Native",
        correlation_id="c2",
        content_type="text/xml",
        headers={REPLY_TO: "Old", CORRELATION_ID: "c1", CONTENT_TYPE: "application/json"},
    )
    headers = incoming(wire(properties), b"").headers
    assert headers.get(REPLY_TO) == "Native"
    assert headers.get(CORRELATION_ID) == "c2"
    assert headers.get(CONTENT_TYPE) == "text/xml"


def test_a_native_message_gets_its_headers_from_properties() -> None:
    properties = pika.BasicProperties(
        message_id="native-1",
        reply_to="Replies",
        content_type="application/json",
        type="Ns.OrderPlaced",
        delivery_mode=1,
    )
    headers = incoming(wire(properties), b"{}").headers.to_dict()
    assert headers == {
        REPLY_TO: "Replies",
        CONTENT_TYPE: "application/json",
        NON_PERSISTENT: "True",
        ENCLOSED_MESSAGE_TYPES: "Ns.OrderPlaced",
        MESSAGE_ID: "native-1",
    }


def test_the_default_content_type_adds_no_header() -> None:
    properties = pika.BasicProperties(message_id="m", content_type="application/octet-stream")
    assert CONTENT_TYPE not in incoming(wire(properties), b"").headers


def test_the_message_id_header_wins_over_the_property() -> None:
    properties = pika.BasicProperties(message_id="native", headers={MESSAGE_ID: "logical"})
    back = incoming(wire(properties), b"")
    assert back.message_id == "logical"
    assert back.native_id == "native"


def test_broker_and_delay_headers_are_stripped() -> None:
    table = {
        "x-death": [{"count": 1, "queue": "q"}],
        "x-delivery-count": 3,
        "x-first-death-exchange": "e",
        "x-first-death-queue": "q",
        "x-first-death-reason": "expired",
        "x-last-death-queue": "q",
        "NServiceBus.Transport.RabbitMQ.DelayInSeconds": 10,
        "NServiceBus.Transport.RabbitMQ.ConfirmationId": "7",
        "kept": "yes",
    }
    properties = pika.BasicProperties(message_id="m", headers=table)
    assert incoming(wire(properties), b"").headers.items() == [
        ("kept", "yes"),
        (MESSAGE_ID, "m"),
    ]


def test_values_of_other_types_read_as_nservicebus_renders_them() -> None:
    table = {
        "bytes": "ünï".encode(),
        "int": 42,
        "negative": -7,
        "bool": True,
        "decimal": decimal.Decimal("1.50"),
        "time": datetime(2026, 4, 29, 21, 56, 55, tzinfo=UTC),
        "table": {"a": 1, "b": "x"},
        "list": ["a", 2, b"c"],
        "void": None,
    }
    properties = pika.BasicProperties(message_id="m", headers=table)
    headers = incoming(wire(properties), b"").headers.to_dict()
    assert headers == {
        "bytes": "ünï",
        "int": "42",
        "negative": "-7",
        "bool": "True",
        "decimal": "1.5",  # pika normalizes decimals when it writes them
        "time": "2026-04-29 21:56:55:000000 Z",
        "table": "a=1,b=x",
        "list": "a;2;c",
        "void": "",
        MESSAGE_ID: "m",
    }


def test_a_message_without_any_id_is_poison() -> None:
    with pytest.raises(HeadersFormatError, match="message_id"):
        incoming(wire(pika.BasicProperties(headers={"a": "b"})), b"")


def test_a_header_that_is_not_utf8_is_poison() -> None:
    properties = pika.BasicProperties(message_id="m", headers={"bad": b"\xff\xfe"})
    with pytest.raises(HeadersFormatError, match="UTF-8"):
        incoming(wire(properties), b"")


# -- poison and its error-queue copy ---------------------------------------------------------


def test_poison_keeps_what_could_be_read() -> None:
    properties = wire(pika.BasicProperties(message_id="m", headers={"bad": b"\xff", "ok": "1"}))
    with pytest.raises(HeadersFormatError) as caught:
        incoming(properties, b"raw")
    poison = incoming_poison(properties, b"raw", caught.value)
    assert poison.body == b"raw"
    assert poison.exception_type == "HeadersFormatError"
    assert poison.native_id == "m"
    assert poison.headers.to_dict() == {"bad": "\ufffd", "ok": "1", MESSAGE_ID: "m"}
    assert json.loads(poison.raw_headers or "") == poison.headers.to_dict()


def test_error_copy_keeps_every_property_and_adds_failure_headers() -> None:
    original = wire(
        pika.BasicProperties(
            message_id="m",
            app_id="native-app",
            priority=3,
            content_type="text/plain",
            headers={"bad": b"\xff", "NServiceBus.FailedQ": "old"},
        )
    )
    copy = error_properties(original, b"raw", [("NServiceBus.FailedQ", "Sales")])
    assert (copy.message_id, copy.app_id, copy.priority, copy.content_type) == (
        "m",
        "native-app",
        3,
        "text/plain",
    )
    assert copy.headers == {"bad": b"\xff", "NServiceBus.FailedQ": "Sales"}
    assert original.headers["NServiceBus.FailedQ"] == "old"


def test_error_copy_never_expires() -> None:
    """An error-queue copy with the original `expiration` would expire out of the error queue."""
    original = wire(
        pika.BasicProperties(
            expiration="60000",
            timestamp=1_800_000_000,
            headers={TIME_TO_BE_RECEIVED: "00:01:00", "bad": b"\xff"},
        )
    )
    copy = error_properties(original, b"raw", [("NServiceBus.FailedQ", "Sales")])
    assert copy.expiration is None
    assert wire(copy).expiration is None
    assert copy.timestamp == 1_800_000_000
    assert (
        copy.headers[TIME_TO_BE_RECEIVED] == "00:01:00"
    )  # kept as information, as NServiceBus does
    assert original.expiration == "60000"


def test_error_copy_of_a_message_without_id_gets_a_deterministic_one() -> None:
    original = wire(pika.BasicProperties(headers={"a": "b"}))
    first = error_properties(original, b"raw", [("NServiceBus.FailedQ", "Sales")])
    again = error_properties(original, b"raw", [("NServiceBus.FailedQ", "Sales")])
    other = error_properties(original, b"other", [("NServiceBus.FailedQ", "Sales")])
    assert first.message_id == again.message_id != other.message_id
    assert first.headers[MESSAGE_ID] == first.message_id
    assert uuid.UUID(first.message_id).version == 5


def test_a_property_that_is_not_utf8_is_poison() -> None:
    properties = wire(pika.BasicProperties(message_id="m", reply_to="x"))
    properties.reply_to = b"\xff"  # what pika hands over for a short string it cannot decode
    with pytest.raises(HeadersFormatError, match="reply_to"):
        incoming(properties, b"")
    properties = wire(pika.BasicProperties())
    properties.message_id = b"\xff"
    with pytest.raises(HeadersFormatError):
        incoming(properties, b"")
    assert incoming_poison(properties, b"", ValueError("x")).native_id == "\ufffd"
