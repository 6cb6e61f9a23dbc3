"""`RabbitMQConnection` (routes.yaml) to pika's connection parameters, queue arguments and routes.

Connection: the URL is parsed by pika (`amqp://` or `amqps://`, its query options such as
`heartbeat` or `ssl_options` included). Where the URL does not say otherwise the bridge asks for
one connection attempt per call (the runner's backoff does the retrying), closes a connection
the broker has blocked (memory or disk alarm) for `BLOCKED_TIMEOUT` seconds instead of waiting
forever, and names the connection `bridge <connection> <role>` in the management UI. The
password only ever goes to pika; messages and logs name the connection, never the URL.

Topology (wire-format §7): `conventional` publishes to a durable fanout exchange named like the
queue, routing key `""`; `direct` publishes to the default exchange with the queue's name as
routing key. Queues are durable and declared with `x-queue-type` = `queue_type`.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pika

from bridge.config.models import RabbitMQConnection
from bridge.errors import ConfigError

__all__ = [
    "BLOCKED_TIMEOUT",
    "CONFIRM_TIMEOUT",
    "CONNECT_TIMEOUT",
    "DELIVERY_PAUSE",
    "GATHER_LIMIT",
    "OPERATION_TIMEOUT",
    "describe",
    "parameters",
    "publish_route",
    "queue_arguments",
]

#: Seconds to open a connection and its channel.
CONNECT_TIMEOUT = 15.0
#: Seconds for one declare, qos or consume round trip.
OPERATION_TIMEOUT = 30.0
#: Seconds for the broker to confirm every message of one `send`.
CONFIRM_TIMEOUT = 120.0
#: Seconds a connection may stay blocked by a broker alarm before it is closed and retried.
BLOCKED_TIMEOUT = 60.0
#: A receive stops gathering once no delivery has arrived for this many seconds.
DELIVERY_PAUSE = 0.025
#: A receive hands over what it has at most this many seconds after its first delivery arrived
#: (from the broker, not when the receive began), so a steady trickle (1,000 msg/s fills a
#: batch of 100 in 100 ms) does not wait for a full batch.
GATHER_LIMIT = 0.02


def describe(name: str) -> str:
    return f"rabbitmq connection {name!r}"


def parameters(config: RabbitMQConnection, name: str, role: str) -> pika.URLParameters:
    """pika parameters for one connection of `name` used as `role` (source, sink, admin)."""
    split = urlsplit(config.url)
    if split.scheme not in ("amqp", "amqps"):
        raise ConfigError(f"{describe(name)}: url must start with amqp:// or amqps://")
    try:
        params = pika.URLParameters(config.url)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{describe(name)}: invalid url: {exc}") from None
    given = parse_qs(split.query)
    if "connection_attempts" not in given:
        params.connection_attempts = 1
    if "blocked_connection_timeout" not in given:
        params.blocked_connection_timeout = BLOCKED_TIMEOUT
    if "client_properties" not in given:
        params.client_properties = {"connection_name": f"bridge {name} {role}"}
    return params


def queue_arguments(config: RabbitMQConnection) -> dict[str, object]:
    return {"x-queue-type": config.queue_type}


def publish_route(config: RabbitMQConnection, queue: str) -> tuple[str, str]:
    """(exchange, routing key) a message for `queue` is published with."""
    if config.topology == "conventional":
        return queue, ""
    return "", queue
