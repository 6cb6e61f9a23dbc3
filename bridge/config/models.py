"""routes.yaml, as strict models: unknown keys are errors; every field says what it is for.

Each connection type's model and rules live with its transport (`bridge/transports/*/config.py`,
driver-free); this module assembles them into one union. Cross-field rules (a route's endpoints
against its connections, each transport's own rules) are applied by `lint.py`.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from bridge.config.base import Strict
from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE
from bridge.transports.kafka.config import KafkaConnection
from bridge.transports.rabbitmq.config import RabbitMQConnection
from bridge.transports.sql.config import KINDS as SQL_KINDS
from bridge.transports.sql.config import (
    PostgresConnection,
    SqliteConnection,
    SqlServerConnection,
)

if TYPE_CHECKING:
    from bridge.config.registry import Registry

__all__ = [
    "BridgeConfig",
    "ConnectionConfig",
    "Delays",
    "DerivedRoute",
    "Endpoint",
    "EventConfig",
    "EventRoute",
    "EventTableRoute",
    "HeaderRules",
    "HttpConfig",
    "KafkaConnection",
    "PostgresConnection",
    "Proxies",
    "RabbitMQConnection",
    "RegisteredEndpoint",
    "Route",
    "SqlServerConnection",
    "SqliteConnection",
    "Subscription",
]

#: Route names (also those the registry derives from endpoint and connection names).
ROUTE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class HttpConfig(Strict):
    host: str = Field("0.0.0.0", description="Address the health/metrics server binds to.")  # noqa: S104
    port: int = Field(8080, ge=0, le=65535, description="Port of /healthz /readyz /metrics.")


ConnectionConfig = Annotated[
    SqliteConnection
    | PostgresConnection
    | SqlServerConnection
    | KafkaConnection
    | RabbitMQConnection,
    Field(discriminator="type"),
]

SQL_TYPES = SQL_KINDS


class Endpoint(Strict):
    connection: str = Field(description="Name of a connection in `connections`.")
    queue: str | None = Field(None, description="SQL queue table or RabbitMQ queue.")
    topic: str | None = Field(None, description="Kafka topic.")
    group: str | None = Field(None, description="Kafka consumer group (sources only).")

    @property
    def address(self) -> str:
        return self.queue if self.queue is not None else (self.topic or "")


class HeaderRules(Strict):
    rename: dict[str, str] = Field(default_factory=dict, description="Old name -> new name.")
    drop: list[str] = Field(default_factory=list, description="Header names to remove.")
    set: dict[str, str] = Field(default_factory=dict, description="Headers to add/overwrite.")


class Route(Strict):
    name: str = Field(description="Unique route name (letters, digits, . _ -).")
    from_: Endpoint = Field(alias="from", description="Where messages are received.")
    to: Endpoint = Field(description="Where messages are sent.")
    batch_size: int = Field(500, gt=0, le=10_000, description="Messages per transaction.")
    batch_bytes: int = Field(
        1_048_576,
        gt=0,
        le=1 << 30,
        description=(
            "About this many body bytes per batch: after each batch the next one's count is cut "
            "to what fits at that batch's average body size (never below 1)."
        ),
    )
    concurrency: int = Field(1, gt=0, le=64, description="Competing receive loops.")
    error_queue: str | None = Field(
        None, description="Poison messages go here; `bridge.error` on the source connection."
    )
    key: str = Field(
        "header:NServiceBus.MessageId", description="Kafka record key: `header:NAME` or `none`."
    )
    headers: HeaderRules = Field(default_factory=HeaderRules)
    publish: bool = Field(
        False,
        description="Publish each message on the destination's connection as NServiceBus "
        "publishers do (SQL: a copy to each subscriber its subscription table lists; RabbitMQ: "
        "to the event's exchange); `to` names the connection only.",
    )
    address_map: dict[str, str] = Field(
        default_factory=dict,
        description="Address translations of NServiceBus.ReplyToAddress, NServiceBus.FailedQ and "
        "ServiceControl.Retry.AcknowledgementQueue.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not ROUTE_NAME.match(value):
            raise ValueError("route names use letters, digits, '.', '_' and '-'")
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if value != "none" and not (value.startswith("header:") and len(value) > 7):
            raise ValueError("key must be `header:NAME` or `none`")
        return value

    @property
    def error_queue_name(self) -> str:
        return self.error_queue or DEFAULT_ERROR_QUEUE


class DerivedRoute(Route):
    """A route the registry derives: the proxy of `endpoint` on `from.connection` -> the
    endpoint's own queue. Never written in routes.yaml."""

    endpoint: str = Field(description="The registered endpoint this route forwards to.")


class EventRoute(DerivedRoute):
    """A route the registry derives for an event whose publisher is on Kafka: it reads the
    event's topic and publishes each event on `to.connection` as NServiceBus publishers do
    (`endpoint` is the publisher; `to` names the event, not a queue)."""

    event: str = Field(description="The event type (its .NET full name).")
    publish: bool = True


class EventTableRoute(DerivedRoute):
    """A route the registry derives for an event an NGinn endpoint publishes to a subscriber
    on another transport, or one published on SQL queue tables or RabbitMQ to Kafka
    subscribers: it reads the subscription's event table or queue (`config/event_tables.py`),
    where only the publisher writes, and sends each message, as `event` published, to the
    subscriber's queue (`endpoint`'s), or for Kafka subscribers once to the event's topic
    (`endpoint` is then the first of them by name)."""

    event: str = Field(description="The event type subscribed to (its .NET full name).")


class Subscription(Strict):
    event: str = Field(description="The event type's .NET full name (Sales.Messages.OrderPlaced).")
    publisher: str = Field(description="The registered endpoint that publishes it.")


class EventConfig(Strict):
    topic: str | None = Field(
        None, min_length=1, description="Its Kafka topic; derived from the name when omitted."
    )


class RegisteredEndpoint(Strict):
    connection: str = Field(description="The one connection the endpoint lives on.")
    subscribes: list[Subscription] = Field(
        default_factory=list,
        description="Events it subscribes to: the bridge subscribes its proxy on the "
        "publisher's connection natively, at `bridge install` and when `bridge run` starts.",
    )
    queue: str | None = Field(
        None,
        min_length=1,
        description="Its input queue (table, queue or topic) there, when not the endpoint's name.",
    )
    batch_size: int | None = Field(
        None, gt=0, le=10_000, description="Batch size of the routes into it (`proxies`' else)."
    )
    concurrency: int | None = Field(
        None, gt=0, le=64, description="Receive loops of each route into it (`proxies`' else)."
    )


class Proxies(Strict):
    create: bool = Field(
        default=False,
        description="`bridge install` creates the proxies and their error queues (needs the "
        "rights to); otherwise they must exist, and `bridge check --connect` lists those missing.",
    )
    connections: list[str] | None = Field(
        default=None, description="Connections that hold proxies; every connection when omitted."
    )
    batch_size: int = Field(default=500, gt=0, le=10_000, description="Messages per transaction.")
    concurrency: int = Field(
        default=1, gt=0, le=64, description="Competing receive loops per route."
    )
    error_queue: str | None = Field(
        default=None,
        description="Where a derived route puts what it cannot forward, on the proxy's "
        "connection; `bridge.error` when omitted.",
    )
    group: str = Field(
        default="bridge",
        min_length=1,
        description="A proxy on Kafka is read in consumer group `<group>.<endpoint>`.",
    )


class Delays(Strict):
    connection: str = Field(
        min_length=1,
        description="The SQL connection whose `BridgeDelays` table holds delayed messages for "
        "destinations that cannot delay (Kafka) until they are due.",
    )
    error_queue: str = Field(
        DEFAULT_ERROR_QUEUE,
        min_length=1,
        description="The queue table on that connection where a delayed message goes, with the "
        "reason in its headers, when it can never be sent (its destination refuses it for "
        "good, or its stored row cannot be read); `bridge.error` when omitted.",
    )


class BridgeConfig(Strict):
    http: HttpConfig | None = None
    connections: dict[str, ConnectionConfig] = Field(description="Named connections.")
    routes: list[Route] = Field(default_factory=list, description="What moves where.")
    endpoints: dict[str, RegisteredEndpoint] = Field(
        default_factory=dict,
        description="The endpoint registry: each endpoint and the connection it lives on. The "
        "bridge derives a proxy and a route for it on every other connection.",
    )
    proxies: Proxies = Field(Proxies(), description="How proxies are made and read.")
    events: dict[str, EventConfig] = Field(
        default_factory=dict, description="Event types by .NET full name: their Kafka topic."
    )
    delays: Delays | None = Field(
        None, description="Where delays wait for destinations without delayed delivery."
    )

    @cached_property
    def registry(self) -> Registry:
        """The endpoint registry of this config, built once."""
        from bridge.config.registry import Registry

        return Registry(self)

    def error_queue_of(self, route: Route) -> str | None:
        """Where `route`'s source puts what it cannot forward: the route's `error_queue`; else
        `bridge.error` on the source connection, or None where that connection keeps failed
        messages in their own table (`layout: nginn`: the row's `F` subqueue)."""
        if route.error_queue is not None:
            return route.error_queue
        source = self.connections.get(route.from_.connection)
        return None if getattr(source, "keeps_failed", False) else DEFAULT_ERROR_QUEUE

    @cached_property
    def derived_routes(self) -> list[DerivedRoute]:
        """The routes the registry derives, in a stable order (endpoint, then connection)."""
        return self.registry.routes()

    @property
    def all_routes(self) -> list[Route]:
        """The routes written in the file, then those the registry derives."""
        return [*self.routes, *self.derived_routes]

    def route(self, name: str) -> Route:
        for route in self.all_routes:
            if route.name == name:
                return route
        raise KeyError(name)
