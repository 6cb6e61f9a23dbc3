"""routes.yaml, as strict models: unknown keys are errors; every field says what it is for.

Cross-field rules (a route's endpoints against its connections) live in `lint.py`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bridge.nservicebus.deadletter import DEFAULT_ERROR_QUEUE

__all__ = [
    "BridgeConfig",
    "ConnectionConfig",
    "Endpoint",
    "HeaderRules",
    "HttpConfig",
    "KafkaConnection",
    "PostgresConnection",
    "RabbitMQConnection",
    "Route",
    "SqlServerConnection",
    "SqliteConnection",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class HttpConfig(Strict):
    host: str = Field("0.0.0.0", description="Address the health/metrics server binds to.")  # noqa: S104
    port: int = Field(8080, ge=0, le=65535, description="Port of /healthz /readyz /metrics.")


class _Sql(Strict):
    layout: Literal["nservicebus"] = Field(
        "nservicebus", description="Queue table layout (the NServiceBus SQL transport's)."
    )


class SqliteConnection(_Sql):
    type: Literal["sqlite"]
    path: str = Field(min_length=1, description="SQLite database file; created when missing.")
    busy_timeout: float = Field(30.0, gt=0, description="Seconds to wait on a locked database.")


class PostgresConnection(_Sql):
    type: Literal["postgresql"]
    dsn: str = Field(description="libpq connection string or URL; keep secrets in ${VAR}.")
    schema_: str = Field(
        "public", alias="schema", min_length=1, description="Schema of the queue tables."
    )


class SqlServerConnection(_Sql):
    type: Literal["sqlserver"]
    dsn: str = Field(min_length=1, description="ODBC connection string; keep secrets in ${VAR}.")
    schema_: str = Field(
        "dbo", alias="schema", min_length=1, description="Schema of the queue tables."
    )
    catalog: str | None = Field(
        None, min_length=1, description="Database; the DSN's default when omitted."
    )


class KafkaConnection(Strict):
    type: Literal["kafka"]
    bootstrap_servers: str = Field(min_length=1, description="Comma-separated host:port list.")
    idempotence: bool = Field(True, description="Idempotent producer (off for the local broker).")
    client_id: str = Field("bridge", min_length=1, description="Client id reported to the brokers.")
    compression_type: Literal["gzip", "snappy", "lz4", "zstd"] | None = Field(
        None, description="Producer compression."
    )
    max_batch_size: int = Field(
        1_048_576,
        gt=0,
        description="Largest record batch in bytes; a send is split into batches of at most this.",
    )
    max_request_size: int = Field(1_048_576, gt=0, description="Largest record accepted.")
    session_timeout_ms: int = Field(
        10_000,
        ge=1_000,
        description="Consumer group session timeout: how soon a dead bridge's partitions move.",
    )
    partitions: int = Field(
        6,
        gt=0,
        description="Partitions of topics `bridge install` creates (6: an even share for 1, 2, "
        "3 or 6 consumers, i.e. workers x replicas).",
    )
    replication_factor: int = Field(1, gt=0, description="Replication of created topics.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


class RabbitMQConnection(Strict):
    type: Literal["rabbitmq"]
    url: str = Field(
        min_length=1, description="AMQP URL (amqp:// or amqps://); keep secrets in ${VAR}."
    )
    topology: Literal["conventional", "direct"] = Field(
        "conventional", description="Exchange per queue (conventional) or default exchange."
    )
    queue_type: Literal["quorum", "classic"] = Field("quorum", description="Declared type.")
    prefetch: int = Field(500, gt=0, description="Consumer prefetch count.")


ConnectionConfig = Annotated[
    SqliteConnection
    | PostgresConnection
    | SqlServerConnection
    | KafkaConnection
    | RabbitMQConnection,
    Field(discriminator="type"),
]

SQL_TYPES = ("sqlite", "postgresql", "sqlserver")


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
    address_map: dict[str, str] = Field(
        default_factory=dict, description="NServiceBus.ReplyToAddress translations."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
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


class BridgeConfig(Strict):
    http: HttpConfig | None = None
    connections: dict[str, ConnectionConfig] = Field(description="Named connections.")
    routes: list[Route] = Field(default_factory=list, description="What moves where.")

    def route(self, name: str) -> Route:
        for route in self.routes:
            if route.name == name:
                return route
        raise KeyError(name)
