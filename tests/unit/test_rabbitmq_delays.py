"""RabbitMQ's v2 delay infrastructure as NServiceBus RabbitMQ declares and addresses it
(Particular/NServiceBus.RabbitMQ at ec745bf8, src/NServiceBus.Transport.RabbitMQ/)."""

from __future__ import annotations

import pytest

from bridge.envelope import Envelope, Headers
from bridge.errors import MessageRejected
from bridge.transports.rabbitmq.delays import (
    DELIVERY_EXCHANGE,
    MAX_DELAY_SECONDS,
    declarations,
    delay_seconds,
    level_name,
    routing_key,
)
from bridge.transports.rabbitmq.sink import encode_batch

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("delay", "address", "key", "level"),
    [
        # The cases of NServiceBus.Transport.RabbitMQ.Tests/DelayedDelivery/
        # When_calculating_a_routing_key.cs:8-18.
        (0, "some-address", "0." * 28 + "some-address", 0),
        (0, "", "0." * 28, 0),
        (0, "exotic-😊-address", "0." * 28 + "exotic-😊-address", 0),
        (1, "some-address", "0." * 27 + "1.some-address", 0),
        (2, "some-address", "0." * 26 + "1.0.some-address", 1),
        (3, "🔥-unicode", "0." * 26 + "1.1.🔥-unicode", 1),
        (10, "some-address", "0." * 24 + "1.0.1.0.some-address", 3),
        (MAX_DELAY_SECONDS - 1, "almost-max", "1." * 27 + "0.almost-max", 27),
        (MAX_DELAY_SECONDS, "some-address", "1." * 28 + "some-address", 27),
        (28, "short-delay", "0." * 23 + "1.1.1.0.0.short-delay", 4),
        (15, "small-delay", "0." * 24 + "1.1.1.1.small-delay", 3),
    ],
)
def test_routing_keys_and_levels_are_those_nservicebus_computes(
    delay: int, address: str, key: str, level: int
) -> None:
    assert routing_key(delay, address) == (level, key)


def test_the_longest_delay_is_28_bits_of_seconds() -> None:
    """DelayInfrastructure.cs:12-15."""
    assert MAX_DELAY_SECONDS == 2**28 - 1
    with pytest.raises(ValueError):
        routing_key(MAX_DELAY_SECONDS + 1, "q")


def test_a_delay_is_whole_seconds_rounded_up() -> None:
    """BasicPropertiesExtensions.cs:83,94: Math.Ceiling of the seconds."""
    assert delay_seconds(NOW + 4.001, NOW) == 5
    assert delay_seconds(NOW + 5, NOW) == 5
    assert delay_seconds(NOW - 3, NOW) == 0


def test_the_infrastructure_is_declared_as_nservicebus_declares_it() -> None:
    """DelayInfrastructure.cs:27-67: 28 levels from 27 down, each a topic exchange and a
    quorum queue dead-lettering to the level below, then the exchange-to-exchange bindings
    for a 0 bit and the delivery exchange."""
    steps = list(declarations())
    assert len(steps) == 28 * 3 + 27 + 2
    top_exchange, top_queue, top_bind = steps[:3]
    assert (top_exchange.kind, top_exchange.name) == ("exchange", "nsb.v2.delay-level-27")
    assert top_queue.arguments == {
        "x-queue-type": "quorum",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-message-ttl": 2**27 * 1000,
        "x-dead-letter-exchange": "nsb.v2.delay-level-26",
    }
    assert (top_bind.kind, top_bind.name, top_bind.source, top_bind.routing_key) == (
        "queue_bind",
        "nsb.v2.delay-level-27",
        "nsb.v2.delay-level-27",
        "1.#",
    )
    level0 = steps[27 * 3 : 28 * 3]
    assert level0[1].arguments["x-message-ttl"] == 1000
    assert level0[1].arguments["x-dead-letter-exchange"] == DELIVERY_EXCHANGE
    assert level0[2].routing_key == "*." * 27 + "1.#"
    first_hop = steps[28 * 3]
    assert (first_hop.kind, first_hop.name, first_hop.source, first_hop.routing_key) == (
        "exchange_bind",
        "nsb.v2.delay-level-26",
        "nsb.v2.delay-level-27",
        "0.#",
    )
    assert steps[-2].kind == "exchange" and steps[-2].name == DELIVERY_EXCHANGE
    last = steps[-1]
    assert (last.name, last.source, last.routing_key) == (
        DELIVERY_EXCHANGE,
        level_name(0),
        "*." * 27 + "0.#",
    )


def envelope(**fields: float) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", "m1")]), b"{}", **fields)


def test_a_delayed_message_goes_to_its_level_with_the_delay_header() -> None:
    messages, routes = encode_batch([envelope(deliver_at=NOW + 4.2), envelope()], NOW, 131072, "Q")
    (delayed, _), (plain, _) = messages
    assert delayed.headers["NServiceBus.Transport.RabbitMQ.DelayInSeconds"] == 5
    assert "NServiceBus.Transport.RabbitMQ.DelayInSeconds" not in plain.headers
    assert routes == [(level_name(2), "0." * 25 + "1.0.1.Q"), None]


def test_a_due_request_is_sent_at_once() -> None:
    _, routes = encode_batch([envelope(deliver_at=NOW - 1)], NOW, 131072, "Q")
    assert routes == [None]


def test_a_delay_with_a_time_to_be_received_is_refused() -> None:
    """BasicPropertiesExtensions.cs:30-36."""
    with pytest.raises(MessageRejected, match="TimeToBeReceived") as refused:
        encode_batch(
            [envelope(), envelope(deliver_at=NOW + 5, expires_at=NOW + 60)], NOW, 131072, "Q"
        )
    assert refused.value.index == 1


def test_a_delay_beyond_28_bits_is_refused() -> None:
    with pytest.raises(MessageRejected, match="268435455 s"):
        encode_batch([envelope(deliver_at=NOW + 2**28)], NOW, 131072, "Q")
