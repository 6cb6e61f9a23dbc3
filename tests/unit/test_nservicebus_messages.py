"""What `bridge send` writes: an endpoint's headers, the body's content type, and a time to live
that every transport carries exactly as given.

Facts from the sources:
- NServiceBus.SqlServer@4fb0a01, src/NServiceBus.Transport.SqlServer/Queuing/MessageRow.cs:33
  and :45: a send's time to be received is `(int?)TotalMilliseconds`, passed as
  `@TimeToBeReceivedMs` of `SqlDbType.Int`: an Int32 of milliseconds, at most 2147483647
  (24.20:31:23.647); the database adds it to its own clock (wire-format §1).
- NServiceBus.RabbitMQ@ec745bf, src/NServiceBus.Transport.RabbitMQ/Sending/
  BasicPropertiesExtensions.cs:30-39: `expiration` = the time to be received's
  TotalMilliseconds, the value the endpoint was given, set as the message is sent.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from bridge.envelope import MESSAGE_ID, TIME_TO_BE_RECEIVED
from bridge.nservicebus.messages import MAX_TTL, content_type_of, endpoint_message, parse_ttl
from bridge.nservicebus.wireformat import parse_timespan, timestamp_seconds
from bridge.transports.kafka.headers import EXPIRES_AT
from bridge.transports.kafka.headers import outgoing as kafka_record
from bridge.transports.rabbitmq.headers import outgoing as amqp_message
from bridge.transports.sql.layouts.base import outgoing as sql_row


def test_the_ttl_range_is_what_sql_server_carries_in_whole_milliseconds() -> None:
    assert MAX_TTL == timedelta(milliseconds=2_147_483_647) == parse_timespan("24.20:31:23.647")
    assert parse_ttl("00:00:30") == timedelta(seconds=30)
    assert parse_ttl("00:00:00.001") == timedelta(milliseconds=1)
    assert parse_ttl("24.20:31:23.647") == MAX_TTL


@pytest.mark.parametrize(
    "text",
    [
        "-00:00:01",  # negative
        "00:00:00",  # zero: no time to live at all
        "24.20:31:23.648",  # one millisecond past SQL Server's Int32
        "10675199.02:48:05.4775808",  # past .NET's TimeSpan.MaxValue
        "9999999999.00:00:00",  # past what a Python timedelta holds
        "00:00:00.0005",  # half a millisecond: no transport carries it
        "soon",
    ],
)
def test_a_ttl_out_of_the_range_says_the_range(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_ttl(text)
    assert "from 00:00:00.001 to 24.20:31:23.647, in whole milliseconds" in str(info.value)
    assert repr(text) in str(info.value)


def test_a_sent_message_carries_exactly_the_ttl_it_was_given_on_every_transport() -> None:
    """Counted down from a deadline made when the message was built, the time to live would
    arrive a moment short (a RabbitMQ `expiration` of 29999 for 00:00:30). However long after
    it was made a sink sends it, it carries the 30000 ms asked for."""
    message = endpoint_message(b"{}", ttl=parse_ttl("00:00:30"))
    assert message.headers.get(TIME_TO_BE_RECEIVED) == "00:00:30"
    assert message.expires_at is not None
    sent = message.expires_at - 30 + 2.0037  # the sink sends 2.0037 s after it was made

    assert sql_row(message, sent).ttl_ms == 30_000
    properties, _ = amqp_message(message, sent)
    assert properties.expiration == "30000"
    record = kafka_record(message, "none", sent)
    deadline = dict(record.headers)[EXPIRES_AT]
    assert deadline is not None
    lived = timestamp_seconds(deadline.decode()) - record.timestamp_ms / 1000
    assert lived == pytest.approx(30.0, abs=1e-6)


def test_a_forwarded_message_still_carries_what_is_left_of_its_lifetime() -> None:
    message = endpoint_message(b"{}", ttl=parse_ttl("00:00:30"))
    message.time_to_live_ms = None  # as it is once read back from a transport
    assert message.expires_at is not None
    later = message.expires_at - 10
    assert sql_row(message, later).ttl_ms == 10_000
    assert amqp_message(message, later)[0].expiration == "10000"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"a": 1}', "application/json"),
        (b"[1, 2]", "application/json"),
        (b"<Order><Id>1</Id></Order>", "text/xml"),
        (b"hello world", "text/plain"),
        (b"<not xml", "text/plain"),
        ("d\u00e9j\u00e0 vu".encode(), "text/plain"),
        (b"\xff\xfe\x00binary", "application/octet-stream"),
    ],
)
def test_the_content_type_is_what_the_body_is(body: bytes, expected: str) -> None:
    assert content_type_of(body) == expected
    assert endpoint_message(body).headers.get("NServiceBus.ContentType") == expected


def test_a_content_type_header_given_wins() -> None:
    given = [("NServiceBus.ContentType", "application/vnd.shop+json")]
    message = endpoint_message(b"hello", given)
    assert message.headers.get_all("NServiceBus.ContentType") == ["application/vnd.shop+json"]


def test_a_given_message_id_is_also_the_correlation_id_unless_one_is_given() -> None:
    message = endpoint_message(b"{}", [(MESSAGE_ID, "order-1")])
    assert message.headers.get("NServiceBus.CorrelationId") == "order-1"
    both = [(MESSAGE_ID, "order-1"), ("NServiceBus.CorrelationId", "conversation-9")]
    assert (
        endpoint_message(b"{}", both).headers.get("NServiceBus.CorrelationId") == "conversation-9"
    )
    fresh = endpoint_message(b"{}")
    assert fresh.headers.get("NServiceBus.CorrelationId") == fresh.headers.get(MESSAGE_ID)
    assert json.loads(fresh.body) == {}
