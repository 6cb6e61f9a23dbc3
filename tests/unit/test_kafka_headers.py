"""`outgoing` and `incoming` are an inverse pair: these tests say so, case by case.

Time to live on Kafka is the bridge's own deadline header (product.md, delivery semantics):
`NServiceBus.TimeToBeReceived` travels as the endpoint wrote it and is never read, and
error-queue and audit copies never expire (NServiceBus@1d53488
src/NServiceBus.Core/Recoverability/MoveToError.cs:45-57 sends error copies with the original
headers and no time to live).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import MESSAGE_ID, TIME_SENT, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import ConfigError, HeadersFormatError
from bridge.nservicebus.lifetime import FAILED_Q, PROCESSING_ENDED
from bridge.transports.kafka.headers import (
    DEFAULT_KEY,
    EXPIRES_AT,
    RECORD_ID_NAMESPACE,
    Record,
    incoming,
    incoming_poison,
    key_header,
    outgoing,
    record_message_id,
)

NOW = 1_800_000_000.25


def round_trip(envelope: Envelope, key: str = DEFAULT_KEY, offset: int = 7) -> Envelope:
    record = outgoing(envelope, key, NOW)
    return incoming("sales", 2, offset, record.key, record.value, record.headers)


def test_headers_keep_order_duplicates_and_null_versus_empty() -> None:
    headers = Headers(
        [
            (MESSAGE_ID, "m-1"),
            ("a", "1"),
            ("empty", ""),
            ("null", None),
            ("a", "2"),
            ("unicode", "Zoë ✓ \U0001f600"),
        ]
    )
    record = outgoing(Envelope(headers, b"body"), DEFAULT_KEY, NOW)
    assert record.headers == [
        (MESSAGE_ID, b"m-1"),
        ("a", b"1"),
        ("empty", b""),
        ("null", None),
        ("a", b"2"),
        ("unicode", "Zoë ✓ \U0001f600".encode()),
    ]
    back = round_trip(Envelope(headers, b"body"))
    assert back.headers == headers
    assert back.headers.get("a") == "2"  # the last occurrence wins on lookup, nothing is lost


def test_binary_body_is_kept_byte_for_byte() -> None:
    body = bytes(range(256)) * 4
    envelope = Envelope(Headers([(MESSAGE_ID, "m")]), body)
    assert round_trip(envelope).body == body
    assert round_trip(Envelope(Headers([(MESSAGE_ID, "m")]), b"")).body == b""


def test_key_comes_from_the_named_header_or_is_absent() -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m-1"), ("Conv", "c-9")]), b"")
    assert outgoing(envelope, DEFAULT_KEY, NOW).key == b"m-1"
    assert outgoing(envelope, "header:Conv", NOW).key == b"c-9"
    assert outgoing(envelope, "header:Missing", NOW).key is None
    assert outgoing(envelope, "none", NOW).key is None
    nulled = Envelope(Headers([("Conv", None)]), b"")
    assert outgoing(nulled, "header:Conv", NOW).key is None


@pytest.mark.parametrize("spec", ["", "header:", "headers:x", "None", "key"])
def test_bad_key_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError):
        key_header(spec)


def test_the_deadline_header_is_written_last_and_read_back_as_expires_at() -> None:
    headers = Headers([(MESSAGE_ID, "m"), (TIME_TO_BE_RECEIVED, "1.00:00:00"), ("x", "y")])
    envelope = Envelope(headers, b"", expires_at=NOW + 90.5)
    record = outgoing(envelope, DEFAULT_KEY, NOW)
    assert record.timestamp_ms == int(NOW * 1000)
    assert record.headers == [
        (MESSAGE_ID, b"m"),
        (TIME_TO_BE_RECEIVED, b"1.00:00:00"),  # as the endpoint wrote it (fidelity gap 11)
        ("x", b"y"),
        (EXPIRES_AT, b"2027-01-15 08:01:30:750000 Z"),
    ]
    assert datetime(2027, 1, 15, 8, 1, 30, 750000, tzinfo=UTC).timestamp() == NOW + 90.5
    back = round_trip(envelope)
    assert back.expires_at == pytest.approx(NOW + 90.5, abs=1e-6)
    assert back.headers == headers  # the deadline header is the transport's, not a header


def test_an_already_expired_envelope_gets_a_past_deadline() -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m")]), b"", expires_at=NOW - 5)
    assert round_trip(envelope).is_expired(NOW)


def test_a_time_to_be_received_header_alone_never_expires() -> None:
    """Fidelity gap 1: expiry was record timestamp + TimeToBeReceived, so a record written
    long ago with a short one was dropped."""
    headers = [
        (MESSAGE_ID, b"m"),
        (TIME_SENT, b"2020-01-01 00:00:00:000000 Z"),
        (TIME_TO_BE_RECEIVED, b"00:00:01"),
    ]
    envelope = incoming("t", 0, 1, None, b"", headers)
    assert envelope.expires_at is None
    assert envelope.headers.get(TIME_TO_BE_RECEIVED) == "00:00:01"
    assert outgoing(envelope, DEFAULT_KEY, NOW).headers == headers


@pytest.mark.parametrize("deadline", [b"soon", b"", b"2026-13-01 00:00:00:000000 Z"])
def test_a_deadline_that_does_not_parse_means_no_expiry(deadline: bytes) -> None:
    envelope = incoming("t", 0, 1, None, b"", [(MESSAGE_ID, b"m"), (EXPIRES_AT, deadline)])
    assert envelope.expires_at is None
    assert EXPIRES_AT not in envelope.headers


def test_no_expires_at_means_no_deadline_header() -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m"), (TIME_TO_BE_RECEIVED, "00:00:10")]), b"")
    assert EXPIRES_AT not in dict(outgoing(envelope, DEFAULT_KEY, NOW).headers)
    assert round_trip(envelope).expires_at is None


def test_a_deadline_header_the_envelope_carries_says_what_expires_at_says() -> None:
    stale = Headers([(MESSAGE_ID, "m"), (EXPIRES_AT, "2020-01-01 00:00:00:000000 Z")])
    assert EXPIRES_AT not in dict(outgoing(Envelope(stale, b""), DEFAULT_KEY, NOW).headers)
    record = outgoing(Envelope(stale, b"", expires_at=NOW + 1), DEFAULT_KEY, NOW)
    assert [name for name, _ in record.headers] == [MESSAGE_ID, EXPIRES_AT]
    assert round_trip(Envelope(stale, b"", expires_at=NOW + 1)).expires_at == pytest.approx(NOW + 1)


@pytest.mark.parametrize("copy", [FAILED_Q, PROCESSING_ENDED])
def test_error_and_audit_copies_never_expire(copy: str) -> None:
    headers = Headers([(MESSAGE_ID, "m"), (copy, "x"), (TIME_TO_BE_RECEIVED, "00:00:01")])
    record = outgoing(Envelope(headers, b"", expires_at=NOW + 60), DEFAULT_KEY, NOW)
    assert EXPIRES_AT not in dict(record.headers)
    past = [(MESSAGE_ID, b"m"), (copy, b"x"), (EXPIRES_AT, b"2020-01-01 00:00:00:000000 Z")]
    envelope = incoming("t", 0, 1, None, b"", past)
    assert envelope.expires_at is None
    assert EXPIRES_AT not in envelope.headers


def test_a_deadline_past_the_year_9999_is_never() -> None:
    forever = NOW + timedelta(days=10_675_199).total_seconds()  # TimeSpan.MaxValue from now
    record = outgoing(Envelope(Headers(), b"", expires_at=forever), "none", NOW)
    assert record.headers == []


def test_record_without_message_id_gets_a_deterministic_one() -> None:
    first = incoming("sales", 1, 42, None, b"x", [("a", b"1")])
    again = incoming("sales", 1, 42, None, b"x", [("a", b"1")])
    other = incoming("sales", 1, 43, None, b"x", [("a", b"1")])
    assert first.message_id == again.message_id == record_message_id("sales", 1, 42)
    assert first.message_id == str(uuid.uuid5(RECORD_ID_NAMESPACE, "sales/1/42"))
    assert other.message_id != first.message_id
    assert first.headers.items() == [("a", "1"), (MESSAGE_ID, first.message_id)]
    assert first.native_id == "sales/1/42"


def test_existing_message_id_is_kept() -> None:
    envelope = incoming("t", 0, 9, b"k", b"", [(MESSAGE_ID, b"mine")])
    assert envelope.message_id == "mine"
    assert envelope.headers.names() == [MESSAGE_ID]


def test_tombstone_reads_as_empty_body() -> None:
    assert incoming("t", 0, 0, b"k", None, []).body == b""


def test_non_utf8_header_is_poison_kept_losslessly() -> None:
    headers = [("good", b"ok"), ("bad", b"\xff\xfe"), ("null", None)]
    with pytest.raises(HeadersFormatError) as caught:
        incoming("t", 0, 5, None, b"body", headers)
    poison = incoming_poison("t", 0, 5, b"body", headers, caught.value)
    assert poison.native_id == "t/0/5"
    assert poison.body == b"body"
    assert poison.exception_type == "HeadersFormatError"
    assert "'bad'" in poison.reason
    assert isinstance(poison.raw_headers, str)
    raw = [
        (name, None if value is None else value.encode(errors="surrogateescape"))
        for name, value in json.loads(poison.raw_headers)
    ]
    assert raw == headers
    assert poison.headers.items()[:3] == [("good", "ok"), ("bad", "\ufffd\ufffd"), ("null", None)]
    assert poison.headers.get(MESSAGE_ID) == record_message_id("t", 0, 5)


@pytest.mark.parametrize("item", [("x", "\ud800"), ("\udcff", "v")], ids=["value", "name"])
def test_header_that_cannot_be_utf8_is_a_headers_error(item: tuple[str, str]) -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m"), item]), b"")
    with pytest.raises(HeadersFormatError):
        outgoing(envelope, DEFAULT_KEY, NOW)


def test_record_is_a_plain_tuple() -> None:
    key, value, headers, timestamp_ms = outgoing(Envelope(Headers(), b"v"), "none", NOW)
    assert isinstance(outgoing(Envelope(Headers(), b"v"), "none", NOW), Record)
    assert (key, value, headers, timestamp_ms) == (None, b"v", [], int(NOW * 1000))


# Text that UTF-8 can carry: everything but lone surrogates.
_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=20)
_headers = st.lists(st.tuples(_text, st.none() | _text), max_size=12)


@given(
    items=_headers,
    body=st.binary(max_size=256),
    lifetime=st.none() | st.floats(min_value=-86_400, max_value=86_400 * 30),
    offset=st.integers(min_value=0, max_value=2**62),
)
def test_outgoing_then_incoming_is_identity(
    items: list[tuple[str, str | None]], body: bytes, lifetime: float | None, offset: int
) -> None:
    headers = Headers([(MESSAGE_ID, "id"), *((k, v) for k, v in items if k != MESSAGE_ID)])
    headers.remove(EXPIRES_AT)  # the transport's field, never a header of the envelope
    expires_at = None if lifetime is None else NOW + lifetime
    envelope = Envelope(headers, body, expires_at=expires_at)
    back = round_trip(envelope, offset=offset)
    if expires_at is None or FAILED_Q in headers or PROCESSING_ENDED in headers:
        assert back.expires_at is None
    else:
        assert back.expires_at == pytest.approx(expires_at, abs=1e-6)
    assert back.headers == headers
    assert back.body == body
    assert back.native_id == f"sales/2/{offset}"


@given(items=_headers, offset=st.integers(min_value=0, max_value=2**62))
def test_incoming_then_outgoing_is_identity(
    items: list[tuple[str, str | None]], offset: int
) -> None:
    raw = [(k, None if v is None else v.encode()) for k, v in items if k != EXPIRES_AT]
    envelope = incoming("t", 0, offset, None, b"v", raw)
    record = outgoing(envelope, "none", 5.0)
    assert record.headers[: len(raw)] == raw
    assert record.value == b"v"
    assert record.timestamp_ms == 5_000
    again = incoming("t", 0, offset, None, record.value, record.headers)
    assert again == envelope  # the synthesized id survives the next hop unchanged
