"""Delay requests: how `bridge send` and Kafka records ask for them, and the refusal of a
destination that cannot delay."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bridge.envelope import Envelope, Headers
from bridge.errors import HeadersFormatError, MessageRejected
from bridge.nservicebus.delays import (
    parse_delay,
    parse_deliver_at,
    parse_delivery_request,
    refuse_delays,
)
from bridge.transports.kafka.headers import DELIVER_AT, incoming

NOW = 1_764_151_200.0  # 2025-11-26 10:00:00 UTC


def test_a_delay_is_a_positive_timespan() -> None:
    assert parse_delay("00:00:05") == timedelta(seconds=5)
    assert parse_delay("1.00:00:00.5") == timedelta(days=1, milliseconds=500)
    for text in ("00:00:00", "-00:00:05", "5s", ""):
        with pytest.raises(ValueError, match="greater than zero"):
            parse_delay(text)


def test_a_delivery_time_needs_its_utc_offset() -> None:
    assert parse_deliver_at("2025-11-26T10:00:00Z").timestamp() == NOW
    assert parse_deliver_at("2025-11-26T11:00:00+01:00").timestamp() == NOW
    with pytest.raises(ValueError, match="UTC offset"):
        parse_deliver_at("2025-11-26T10:00:00")


def test_a_header_may_say_it_in_nservicebus_format_or_iso_8601() -> None:
    assert parse_delivery_request("2025-11-26 10:00:00:000000 Z") == NOW
    assert parse_delivery_request("2025-11-26T10:00:00.000Z") == NOW
    with pytest.raises(ValueError):
        parse_delivery_request("tomorrow")


def envelope(deliver_at: float | None) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", "m")]), b"", deliver_at=deliver_at)


def test_a_destination_that_cannot_delay_refuses_only_what_is_still_to_come() -> None:
    refuse_delays([envelope(None), envelope(NOW - 1), envelope(NOW)], NOW, "here")
    with pytest.raises(MessageRejected, match="here: message 1 asks to be delivered in 30 s"):
        refuse_delays([envelope(None), envelope(NOW + 30)], NOW, "here")


def record(*headers: tuple[str, bytes]) -> Envelope:
    return incoming("t", 0, 7, None, b"{}", [("NServiceBus.MessageId", b"m"), *headers])


def test_a_kafka_record_asks_for_a_delay_with_its_header_which_is_removed() -> None:
    read = record((DELIVER_AT, b"2025-11-26T10:00:00Z"), ("other", b"x"))
    assert read.deliver_at == NOW
    assert read.headers.names() == ["NServiceBus.MessageId", "other"]
    assert record().deliver_at is None


def test_nservicebus_deliver_at_is_information_only() -> None:
    """messaging-bridge.md §3: a message NServiceBus delayed arrives when due; delaying it
    again on its DeliverAt would double the delay."""
    read = record(("NServiceBus.DeliverAt", b"2099-01-01 00:00:00:000000 Z"))
    assert read.deliver_at is None
    assert read.headers.get("NServiceBus.DeliverAt") == "2099-01-01 00:00:00:000000 Z"


def test_a_request_that_is_not_a_time_makes_the_record_poison() -> None:
    """Sent on at once it could arrive early: the error queue gets it, with the reason."""
    with pytest.raises(HeadersFormatError, match=r"NServiceBus\.Bridge\.DeliverAt of record t/0/7"):
        record((DELIVER_AT, b"soon"))
