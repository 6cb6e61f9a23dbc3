"""RabbitMQ's delayed delivery: the v2 delay infrastructure NServiceBus RabbitMQ declares and
publishes to, so that NServiceBus endpoints and the bridge share it.

Facts (Particular/NServiceBus.RabbitMQ, src/NServiceBus.Transport.RabbitMQ/, at ec745bf8):

- 28 levels, `nsb.v2.delay-level-NN` for NN = 27 down to 00: a durable topic exchange and a
  durable quorum queue each, the queue with `x-dead-letter-strategy: at-least-once`,
  `x-overflow: reject-publish`, `x-message-ttl` 2^NN s in milliseconds, and dead-lettering to
  the next level below, level 00 to the topic exchange `nsb.v2.delay-delivery`
  (DelayedDelivery/DelayInfrastructure.cs:27-51);
- each level's queue is bound to its exchange with `1.#` preceded by one `*.` per level above
  it; each level's exchange is bound to the next with `0.#` the same way, and level 00's to
  `nsb.v2.delay-delivery` with the 28th key of that series (DelayInfrastructure.cs:53-66);
- a delay is whole seconds, the ceiling of the time span (Sending/BasicPropertiesExtensions.cs:
  75-103), at most 2^28-1 (DelayInfrastructure.cs:12-15); its routing key is the 28 bits of the
  delay, most significant first, each followed by `.`, then the destination queue, published to
  the level of the highest set bit (level 00 for a delay of 0 or 1; DelayInfrastructure.cs:
  81-125) with the header `NServiceBus.Transport.RabbitMQ.DelayInSeconds` (an Int32;
  BasicPropertiesExtensions.cs:25-28), which receivers remove (Receiving/MessageConverter.cs:38);
- before each delayed send the destination is bound to `nsb.v2.delay-delivery` with `#.<queue>`
  (Connection/ConfirmsAwareChannel.cs:34-47): its exchange under the conventional topology
  (Routing/ConventionalRoutingTopology.cs:90-91), the queue itself under the direct one
  (Routing/DirectRoutingTopology.cs:62-63);
- a delay together with a time to be received is refused (BasicPropertiesExtensions.cs:30-36).

`declarations()` is the infrastructure as data, in NServiceBus's order: `bridge install` runs
and prints it (`admin.py`), and a sink runs it once before its first delayed message, so a
delay never waits in a queue that does not exist; the destination's binding it makes before
each send that holds a delayed message, as NServiceBus does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DELIVERY_EXCHANGE",
    "LEVELS",
    "MAX_DELAY_SECONDS",
    "Declaration",
    "binding_key",
    "declarations",
    "delay_seconds",
    "level_name",
    "routing_key",
]

LEVELS = 28
MAX_LEVEL = LEVELS - 1
MAX_DELAY_SECONDS = (1 << LEVELS) - 1
DELIVERY_EXCHANGE = "nsb.v2.delay-delivery"


def level_name(level: int) -> str:
    return f"nsb.v2.delay-level-{level:02d}"


def binding_key(address: str) -> str:
    """How a destination is bound to `DELIVERY_EXCHANGE`."""
    return f"#.{address}"


def delay_seconds(deliver_at: float, now: float) -> int:
    """The delay NServiceBus would publish for delivery at `deliver_at` (epoch seconds), sent
    at `now`: whole seconds, rounded up; 0 when it is due already."""
    return max(0, math.ceil(deliver_at - now))


def routing_key(delay: int, address: str) -> tuple[int, str]:
    """(the level to publish to, the routing key) of a message delayed `delay` seconds."""
    if not 0 <= delay <= MAX_DELAY_SECONDS:
        raise ValueError(f"a delay of {delay} s is outside 0 to {MAX_DELAY_SECONDS} s")
    bits = format(delay, f"0{LEVELS}b")
    level = max(0, delay.bit_length() - 1)
    return level, "".join(f"{bit}." for bit in bits) + address


@dataclass(frozen=True)
class Declaration:
    """One AMQP method of the infrastructure: declare an exchange of `exchange_type`, declare
    a queue with `arguments`, bind a queue to an exchange, or bind (or unbind) an exchange
    (`destination`) to another (`source`), with `routing_key`."""

    kind: Literal["exchange", "queue", "queue_bind", "exchange_bind", "exchange_unbind"]
    name: str
    source: str = ""
    routing_key: str = ""
    arguments: dict[str, object] = field(default_factory=dict)
    exchange_type: Literal["topic", "fanout"] = "topic"

    @property
    def text(self) -> str:
        if self.kind == "exchange":
            kind = self.exchange_type
            return f"exchange.declare exchange={self.name!r} type={kind} durable=true"
        if self.kind == "queue":
            return f"queue.declare queue={self.name!r} durable=true arguments={self.arguments}"
        return (
            f"{self.kind.replace('_', '.')} {self.name!r} to {self.source!r} "
            f"routing_key={self.routing_key!r}"
        )


def declarations() -> Iterator[Declaration]:
    """The delay infrastructure, in the order NServiceBus declares it."""
    key = "1.#"
    for level in range(MAX_LEVEL, -1, -1):
        name = level_name(level)
        yield Declaration("exchange", name)
        yield Declaration(
            "queue",
            name,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                "x-message-ttl": (1 << level) * 1000,
                "x-dead-letter-exchange": level_name(level - 1) if level else DELIVERY_EXCHANGE,
            },
        )
        yield Declaration("queue_bind", name, source=name, routing_key=key)
        key = "*." + key
    key = "0.#"
    for level in range(MAX_LEVEL, 0, -1):
        yield Declaration(
            "exchange_bind", level_name(level - 1), source=level_name(level), routing_key=key
        )
        key = "*." + key
    yield Declaration("exchange", DELIVERY_EXCHANGE)
    yield Declaration("exchange_bind", DELIVERY_EXCHANGE, source=level_name(0), routing_key=key)
