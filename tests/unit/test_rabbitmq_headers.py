"""The AMQP codec (bridge/transports/rabbitmq/headers.py): `outgoing` is the inverse of
`incoming`, and what it writes is what an NServiceBus RabbitMQ 11 endpoint expects.

Messages cross a real pika encode/decode (`wire`); `sorted_by_quorum` hands the headers table
back sorted by name, as a RabbitMQ quorum queue does when it redelivers a message.

Facts from NServiceBus.RabbitMQ@ec745bf (src/NServiceBus.Transport.RabbitMQ/):
Sending/BasicPropertiesExtensions.cs:10-72 is the whole outgoing mapping (no `timestamp`, a time
to be received only as `expiration`, :30-39); Receiving/MessageConverter.cs strips
`x-dotnet-pub-seq-no` (:44), lets `NServiceBus.RabbitMQ.CallbackQueue` override the reply
address after the `reply_to` property (:54-62), decodes byte arrays as UTF-8 with replacement
characters (:121-124, .NET's `Encoding.UTF8.GetString`) and AMQP timestamps as UTC (:164-166),
and reads no lifetime at all.
"""

from __future__ import annotations

import decimal
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import MESSAGE_ID, TIME_SENT, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.nservicebus.lifetime import FAILED_Q, PROCESSING_ENDED
from bridge.transports.rabbitmq.deadletter import error_properties
from bridge.transports.rabbitmq.headers import (
    CALLBACK_QUEUE,
    CONTENT_TYPE,
    CORRELATION_ID,
    ENCLOSED_MESSAGE_TYPES,
    LAYOUT,
    NON_PERSISTENT,
    PUBLISH_SEQUENCE_NUMBER,
    REPLY_TO,
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
    return incoming(received, body, NOW)


def read(properties: pika.BasicProperties, body: bytes = b"") -> Envelope:
    """What the bridge reads from `properties` as it arrives, at NOW."""
    return incoming(wire(properties), body, NOW)


def same_headers(back: Envelope, original: Envelope, *, quorum: bool) -> bool:
    """A queue keeps the written order; a quorum queue redelivering a message sorts the table
    by name, for every reader alike (order is not information: NServiceBus reads a
    dictionary)."""
    if quorum:
        return back.headers.to_dict() == original.headers.to_dict()
    return back.headers.items() == original.headers.items()


# -- inverse pair ----------------------------------------------------------------------------


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_incoming_inverts_outgoing_keeping_null_and_empty(quorum: bool) -> None:
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
    assert same_headers(back, original, quorum=quorum)
    assert back.headers.get("null") is None and back.headers.get("empty") == ""
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
    assert same_headers(back, original, quorum=quorum)
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
    assert same_headers(round_trip(original, quorum=True), original, quorum=True)
    assert same_headers(round_trip(original), original, quorum=False)


def test_null_mapped_headers_stay_null() -> None:
    original = envelope((CONTENT_TYPE, None), (REPLY_TO, None), (CORRELATION_ID, None))
    assert round_trip(original).headers.items() == original.headers.items()


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_non_persistent_header_comes_back_as_true(quorum: bool) -> None:
    back = round_trip(envelope((NON_PERSISTENT, "True"), ("z", "1")), quorum=quorum)
    assert back.headers.to_dict() == {MESSAGE_ID: "id-1", NON_PERSISTENT: "True", "z": "1"}


# -- what an NServiceBus RabbitMQ endpoint expects -------------------------------------------


def test_properties_an_endpoint_reads_and_no_others() -> None:
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


def test_only_a_null_value_needs_the_layout_header() -> None:
    """Header order and UseNonPersistentDelivery need none: an endpoint's headers are never in
    sorted order, and the layout would be on nearly every message (fidelity gap 10)."""
    for items in [(("Z", "1"),), (("A", "1"), ("B", "")), ((NON_PERSISTENT, "True"), ("A", ""))]:
        properties, _ = outgoing(envelope(*items), NOW)
        assert LAYOUT not in properties.headers
    properties, _ = outgoing(envelope(("A", "1"), ("n", None), (NON_PERSISTENT, "True")), NOW)
    assert json.loads(properties.headers[LAYOUT]) == {"null": ["n"]}


def test_a_layout_written_with_an_order_reads_the_same() -> None:
    """Earlier bridges also listed the order; a message they wrote reads as it was sent."""
    layout = json.dumps({"order": ["b", MESSAGE_ID, "a"], "null": ["a"]})
    properties = pika.BasicProperties(
        message_id="m", headers={MESSAGE_ID: "m", "a": None, "b": "x", LAYOUT: layout}
    )
    assert read(properties).headers.items() == [(MESSAGE_ID, "m"), ("a", None), ("b", "x")]


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
    assert properties.timestamp is None


def test_the_time_to_be_received_header_goes_out_as_the_endpoint_wrote_it() -> None:
    """Fidelity gap 11: the header was rewritten to the remaining lifetime."""
    original = envelope(
        (TIME_TO_BE_RECEIVED, "1.00:00:00"), (TIME_SENT, "2020-01-01 00:00:00:000000 Z")
    )
    original.expires_at = NOW + 42.5
    properties, _ = outgoing(original, NOW)
    assert properties.headers[TIME_TO_BE_RECEIVED] == "1.00:00:00"
    back = round_trip(original, quorum=True)
    assert back.headers.to_dict() == original.headers.to_dict()


def test_remaining_lifetime_comes_back_as_expires_at_counted_from_receipt() -> None:
    original = envelope()
    original.expires_at = NOW + 42.5
    properties, body = outgoing(original, NOW)
    assert incoming(wire(properties), body, NOW).expires_at == pytest.approx(NOW + 42.5)
    later = incoming(wire(properties), body, NOW + 7)  # it waited 7 s in the queue: unknown
    assert later.expires_at == pytest.approx(NOW + 49.5)


def test_an_envelope_that_expired_is_sent_with_one_millisecond() -> None:
    original = envelope()
    original.expires_at = NOW - 5
    properties, _ = outgoing(original, NOW)
    assert properties.expiration == "1"


def test_time_to_be_received_without_expires_at_is_carried_as_is() -> None:
    properties, _ = outgoing(envelope((TIME_TO_BE_RECEIVED, "00:00:10")), NOW)
    assert properties.expiration is None
    assert properties.headers[TIME_TO_BE_RECEIVED] == "00:00:10"


def test_the_time_to_be_received_header_is_never_read() -> None:
    """Fidelity gap 1: TimeSent + TimeToBeReceived dropped live messages, error copies and
    audit copies. Only `expiration` counts, from the moment the bridge received the message."""
    headers = {TIME_SENT: "2020-01-01 00:00:00:000000 Z", TIME_TO_BE_RECEIVED: "00:00:01"}
    assert read(pika.BasicProperties(message_id="m", headers=headers)).expires_at is None
    timestamped = pika.BasicProperties(message_id="m", headers=headers, timestamp=1_000_000)
    assert read(timestamped).expires_at is None
    expiring = pika.BasicProperties(message_id="m", headers=headers, expiration="10000")
    assert read(expiring).expires_at == pytest.approx(NOW + 10)


def test_expiration_alone_counts_from_receipt() -> None:
    properties = pika.BasicProperties(message_id="m", expiration="2500")
    assert read(properties).expires_at == pytest.approx(NOW + 2.5)


@pytest.mark.parametrize("copy", [FAILED_Q, PROCESSING_ENDED])
def test_error_and_audit_copies_never_expire(copy: str) -> None:
    """NServiceBus@1d53488 src/NServiceBus.Core/Recoverability/MoveToError.cs:45-57 sends an
    error copy with the original headers and no time to live; product.md extends this to
    audit copies."""
    original = envelope((copy, "x"), (TIME_TO_BE_RECEIVED, "00:00:01"))
    original.expires_at = NOW + 60
    properties, _ = outgoing(original, NOW)
    assert properties.expiration is None
    assert properties.headers[TIME_TO_BE_RECEIVED] == "00:00:01"
    expiring = pika.BasicProperties(message_id="m", headers={copy: "x"}, expiration="60000")
    assert read(expiring).expires_at is None


def test_an_expiration_past_any_date_never_expires() -> None:
    """Found by the fuzzer: a timedelta of it overflowed, so the message could not be read."""
    properties = pika.BasicProperties(message_id="m", expiration="86400000000000000")
    assert read(properties).expires_at is None


@pytest.mark.parametrize("expiration", ["\u00b2", "\u0661\u0662", "12x", "-5", ""])
def test_an_expiration_that_is_not_ascii_digits_gives_no_expiry(expiration: str) -> None:
    """Found by the fuzzer: '²' passed str.isdigit() and int() refused it, so the message could
    not be read."""
    properties = pika.BasicProperties(message_id="m", expiration=expiration)
    assert read(properties).expires_at is None


# -- reading what other writers sent ---------------------------------------------------------


def test_properties_overwrite_their_headers() -> None:
    properties = pika.BasicProperties(
        message_id="m",
        reply_to="Native",
        correlation_id="c2",
        content_type="text/xml",
        headers={REPLY_TO: "Old", CORRELATION_ID: "c1", CONTENT_TYPE: "application/json"},
    )
    headers = read(properties).headers
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
    headers = read(properties, b"{}").headers.to_dict()
    assert headers == {
        REPLY_TO: "Replies",
        CONTENT_TYPE: "application/json",
        NON_PERSISTENT: "True",
        ENCLOSED_MESSAGE_TYPES: "Ns.OrderPlaced",
        MESSAGE_ID: "native-1",
    }


def test_the_default_content_type_adds_no_header() -> None:
    properties = pika.BasicProperties(message_id="m", content_type="application/octet-stream")
    assert CONTENT_TYPE not in read(properties).headers


def test_the_message_id_header_wins_over_the_property() -> None:
    properties = pika.BasicProperties(message_id="native", headers={MESSAGE_ID: "logical"})
    back = read(properties)
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
        PUBLISH_SEQUENCE_NUMBER: 12,  # the .NET client's, on every publish it tracks
        "kept": "yes",
    }
    properties = pika.BasicProperties(message_id="m", headers=table)
    assert read(properties).headers.items() == [
        ("kept", "yes"),
        (MESSAGE_ID, "m"),
    ]


@pytest.mark.parametrize("reply_to", [None, "Replies"])
def test_a_legacy_callback_queue_header_overrides_the_reply_address(reply_to: str | None) -> None:
    properties = pika.BasicProperties(
        message_id="m",
        reply_to=reply_to,
        headers={REPLY_TO: "Sales", CALLBACK_QUEUE: "Sales.Callbacks"},
    )
    headers = read(properties).headers
    assert headers.get(REPLY_TO) == "Sales.Callbacks"
    assert headers.get(CALLBACK_QUEUE) == "Sales.Callbacks"


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
    headers = read(properties).headers.to_dict()
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
        read(pika.BasicProperties(headers={"a": "b"}))


def test_header_bytes_that_are_not_utf8_read_with_replacement_characters() -> None:
    """Fidelity gap 9: such a message was poison. A long string that is not UTF-8 reaches
    pika as bytes, as a byte array does."""
    table = {"bad": b"ok \xff\xfe", "nested": [b"\xc3"], "table": {"k": b"\xe2\x82"}}
    properties = pika.BasicProperties(message_id="m", headers=table)
    assert read(properties).headers.to_dict() == {
        "bad": "ok \ufffd\ufffd",
        "nested": "\ufffd",
        "table": "k=\ufffd",
        MESSAGE_ID: "m",
    }


@pytest.fixture
def away_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is five hours behind UTC."""
    monkeypatch.setenv("TZ", "EST+05")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("away_from_utc")
def test_a_naive_amqp_timestamp_is_utc() -> None:
    """pika 1.3 decodes an AMQP timestamp as a naive datetime (1.4: UTC); read as local time it
    was off by the local UTC offset (fidelity gap 9)."""
    properties = pika.BasicProperties(
        message_id="m",
        headers={
            "naive": datetime(2026, 4, 29, 21, 56, 55),
            "aware": datetime(2026, 4, 29, 21, 56, 55, tzinfo=UTC),
        },
    )
    headers = incoming(properties, b"", NOW).headers  # as pika 1.3 hands it over
    assert headers.get("naive") == headers.get("aware") == "2026-04-29 21:56:55:000000 Z"


# -- poison and its error-queue copy ---------------------------------------------------------


def test_poison_keeps_what_could_be_read() -> None:
    properties = wire(pika.BasicProperties(message_id="m", headers={"bad": b"\xff", "ok": "1"}))
    properties.reply_to = b"\xff"  # what pika hands over for a short string it cannot decode
    with pytest.raises(HeadersFormatError) as caught:
        incoming(properties, b"raw", NOW)
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
        incoming(properties, b"", NOW)
    properties = wire(pika.BasicProperties())
    properties.message_id = b"\xff"
    with pytest.raises(HeadersFormatError):
        incoming(properties, b"", NOW)
    assert incoming_poison(properties, b"", ValueError("x")).native_id == "\ufffd"
