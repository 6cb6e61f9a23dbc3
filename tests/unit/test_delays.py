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


def test_an_error_copy_read_back_from_a_kafka_error_topic_is_not_delayed_again() -> None:
    """A Kafka source's error copies go to a Kafka topic (kafka/deadletter.py) carrying
    `NServiceBus.Bridge.DeliverAt` (deadletter.py, "A delayed message"). A route reading that
    topic (the registry's `error` proxy on its way to ServiceControl) forwards the copy at once,
    the header kept as information, as it reads no deadline on copies (`never_expires`): a
    copy delayed a year would reach ServiceControl a year late, and a copy refused as "delayed
    too long" would be refused again and again."""
    from bridge.nservicebus.deadletter import error_copy
    from bridge.transports.kafka.headers import DEFAULT_KEY, outgoing

    year = 365 * 86_400
    original = Envelope(Headers([("NServiceBus.MessageId", "m")]), b"{}", deliver_at=NOW + year)
    copy = error_copy(original, "refused", "orders")
    written = outgoing(copy, DEFAULT_KEY, NOW)
    again = incoming("bridge.error", 0, 0, written.key, written.value, written.headers)
    assert again.headers.get("NServiceBus.FailedQ") == "orders"
    assert again.deliver_at is None
    assert again.headers.get(DELIVER_AT) == "2026-11-26 10:00:00:000000 Z"
    poison_request = record(("NServiceBus.FailedQ", b"orders"), (DELIVER_AT, b"soon"))
    assert poison_request.deliver_at is None  # information: not read, so never poison


def test_sql_and_rabbitmq_readers_never_read_the_delay_request() -> None:
    """Only a Kafka record asks for a delay with a header: a SQL row or an AMQP message
    carrying `NServiceBus.Bridge.DeliverAt` (an error copy, say) is read without a delay."""
    import pika

    from bridge.transports.rabbitmq.headers import incoming as amqp_incoming
    from bridge.transports.sql.layouts.base import QueueRow
    from bridge.transports.sql.layouts.base import incoming as sql_incoming

    asked = "2099-01-01T00:00:00Z"
    column = f'{{"NServiceBus.MessageId":"m","{DELIVER_AT}":"{asked}"}}'
    row = sql_incoming(QueueRow("1", False, column, b"{}", None), NOW)
    assert isinstance(row, Envelope)
    properties = pika.BasicProperties(message_id="m", headers={DELIVER_AT: asked.encode()})
    message = amqp_incoming(properties, b"{}", NOW)
    for read in (row, message):
        assert read.deliver_at is None
        assert read.headers.get(DELIVER_AT) == asked
