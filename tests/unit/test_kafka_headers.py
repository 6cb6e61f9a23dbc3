"""`outgoing` and `incoming` are an inverse pair: these tests say so, case by case."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.envelope import MESSAGE_ID, TIME_TO_BE_RECEIVED, Envelope, Headers
from bridge.errors import ConfigError, HeadersFormatError
from bridge.nservicebus.wireformat import parse_timespan
from bridge.transports.kafka.headers import (
    DEFAULT_KEY,
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
    return incoming(
        "sales", 2, offset, record.key, record.value, record.headers, record.timestamp_ms
    )


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


def test_remaining_lifetime_is_written_and_expiry_read_back() -> None:
    headers = Headers([(MESSAGE_ID, "m"), (TIME_TO_BE_RECEIVED, "1.00:00:00"), ("x", "y")])
    envelope = Envelope(headers, b"", expires_at=NOW + 90.5)
    record = outgoing(envelope, DEFAULT_KEY, NOW)
    assert record.timestamp_ms == int(NOW * 1000)
    ttbr = dict(record.headers)[TIME_TO_BE_RECEIVED]
    assert ttbr == b"00:01:30.5000000"  # what is left of the lifetime, not the original day
    assert [name for name, _ in record.headers] == [MESSAGE_ID, TIME_TO_BE_RECEIVED, "x"]
    assert envelope.headers.get(TIME_TO_BE_RECEIVED) == "1.00:00:00"  # the input is untouched
    back = round_trip(envelope)
    assert back.expires_at == pytest.approx(NOW + 90.5, abs=1e-3)


def test_ttbr_header_is_added_when_only_expires_at_is_known() -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m")]), b"", expires_at=NOW + 10)
    record = outgoing(envelope, DEFAULT_KEY, NOW)
    assert record.headers[-1] == (TIME_TO_BE_RECEIVED, b"00:00:10")
    assert round_trip(envelope).expires_at == pytest.approx(NOW + 10, abs=1e-3)


def test_already_expired_envelope_gets_zero_lifetime() -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m")]), b"", expires_at=NOW - 5)
    assert dict(outgoing(envelope, DEFAULT_KEY, NOW).headers)[TIME_TO_BE_RECEIVED] == b"00:00:00"
    assert round_trip(envelope).is_expired(NOW)


def test_expiry_counts_from_the_record_timestamp() -> None:
    headers = [(MESSAGE_ID, b"m"), (TIME_TO_BE_RECEIVED, b"00:00:01.5000000")]
    envelope = incoming("t", 0, 1, None, b"", headers, 1_000_000)
    assert envelope.expires_at == pytest.approx(1_001.5)


@pytest.mark.parametrize("ttbr", [b"soon", b"", b"25:00:00"])
def test_unparseable_ttbr_means_no_expiry_and_is_kept(ttbr: bytes) -> None:
    envelope = incoming("t", 0, 1, None, b"", [(TIME_TO_BE_RECEIVED, ttbr)], 1_000_000)
    assert envelope.expires_at is None
    assert envelope.headers.get(TIME_TO_BE_RECEIVED) == ttbr.decode()


def test_no_ttbr_means_no_expiry() -> None:
    envelope = Envelope(Headers([(MESSAGE_ID, "m")]), b"")
    assert round_trip(envelope).expires_at is None


def test_record_without_message_id_gets_a_deterministic_one() -> None:
    first = incoming("sales", 1, 42, None, b"x", [("a", b"1")], 0)
    again = incoming("sales", 1, 42, None, b"x", [("a", b"1")], 0)
    other = incoming("sales", 1, 43, None, b"x", [("a", b"1")], 0)
    assert first.message_id == again.message_id == record_message_id("sales", 1, 42)
    assert first.message_id == str(uuid.uuid5(RECORD_ID_NAMESPACE, "sales/1/42"))
    assert other.message_id != first.message_id
    assert first.headers.items() == [("a", "1"), (MESSAGE_ID, first.message_id)]
    assert first.native_id == "sales/1/42"


def test_existing_message_id_is_kept() -> None:
    envelope = incoming("t", 0, 9, b"k", b"", [(MESSAGE_ID, b"mine")], 0)
    assert envelope.message_id == "mine"
    assert envelope.headers.names() == [MESSAGE_ID]


def test_tombstone_reads_as_empty_body() -> None:
    assert incoming("t", 0, 0, b"k", None, [], 0).body == b""


def test_non_utf8_header_is_poison_kept_losslessly() -> None:
    headers = [("good", b"ok"), ("bad", b"\xff\xfe"), ("null", None)]
    with pytest.raises(HeadersFormatError) as caught:
        incoming("t", 0, 5, None, b"body", headers, 0)
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
    lifetime=st.none() | st.floats(min_value=0.001, max_value=86_400 * 30),
    offset=st.integers(min_value=0, max_value=2**62),
)
def test_outgoing_then_incoming_is_identity(
    items: list[tuple[str, str | None]], body: bytes, lifetime: float | None, offset: int
) -> None:
    headers = Headers([(MESSAGE_ID, "id"), *((k, v) for k, v in items if k != MESSAGE_ID)])
    if lifetime is None:
        headers.remove(TIME_TO_BE_RECEIVED)  # a TTBR header alone counts from the record time
    expires_at = None if lifetime is None else NOW + lifetime
    envelope = Envelope(headers, body, expires_at=expires_at)
    back = round_trip(envelope, offset=offset)
    expected = headers.copy()
    if expires_at is not None:
        expected.set(TIME_TO_BE_RECEIVED, back.headers.get(TIME_TO_BE_RECEIVED))
        remaining = parse_timespan(back.headers.get(TIME_TO_BE_RECEIVED) or "")
        assert remaining.total_seconds() == pytest.approx(lifetime, abs=1e-3)
        assert back.expires_at == pytest.approx(expires_at, abs=1e-3)
    else:
        assert back.expires_at is None
    assert back.headers == expected
    assert back.body == body
    assert back.native_id == f"sales/2/{offset}"


@given(items=_headers, offset=st.integers(min_value=0, max_value=2**62))
def test_incoming_then_outgoing_is_identity(
    items: list[tuple[str, str | None]], offset: int
) -> None:
    raw = [(k, None if v is None else v.encode()) for k, v in items if k != TIME_TO_BE_RECEIVED]
    envelope = incoming("t", 0, offset, None, b"v", raw, 5_000)
    record = outgoing(envelope, "none", 5.0)
    assert record.headers[: len(raw)] == raw
    assert record.value == b"v"
    assert record.timestamp_ms == 5_000
    again = incoming("t", 0, offset, None, record.value, record.headers, record.timestamp_ms)
    assert again == envelope  # the synthesized id survives the next hop unchanged


def test_format_of_a_long_lifetime() -> None:
    envelope = Envelope(Headers(), b"", expires_at=NOW + timedelta(days=2).total_seconds())
    record = outgoing(envelope, "none", NOW)
    assert dict(record.headers)[TIME_TO_BE_RECEIVED] == b"2.00:00:00"
