"""One behaviour suite for every transport: each variant builds a transport and fresh names.

Memory and SQLite always run; PostgreSQL and Kafka need their services and fail (never skip)
when those are missing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from bridge.protocols import Sink, Source, Transport
from tests.conftest import unique


@dataclass
class Place:
    transport: Transport
    address: str
    group: str | None = None

    def source(self) -> Source:
        return self.transport.source(self.address, group=self.group)

    def sink(self) -> Sink:
        return self.transport.sink(self.address)


VARIANTS = ["memory", "sqlite", "postgresql", "kafka", "rabbitmq"]


@pytest.fixture(params=VARIANTS)
async def place(request: pytest.FixtureRequest) -> AsyncIterator[Place]:
    kind = request.param
    transport: Transport
    if kind == "memory":
        from bridge.transports.memory import Broker
        from bridge.transports.memory import Transport as Memory

        transport = Memory(broker=Broker())
    elif kind == "sqlite":
        from bridge.config.models import SqliteConnection
        from bridge.transports.sql.sqlite import Transport as Sqlite

        path = request.getfixturevalue("sqlite_path")
        transport = Sqlite("local", SqliteConnection(type="sqlite", path=path))
    elif kind == "postgresql":
        from bridge.config.models import PostgresConnection
        from bridge.transports.sql.postgresql import Transport as Postgres

        dsn = request.getfixturevalue("pg_dsn")
        schema = request.getfixturevalue("pg_schema")
        transport = Postgres("shop", PostgresConnection(type="postgresql", dsn=dsn, schema=schema))
    elif kind == "rabbitmq":
        import pika

        from bridge.config.models import RabbitMQConnection
        from bridge.transports.rabbitmq import Transport as RabbitMQ

        url = request.getfixturevalue("rabbitmq_url")
        config = RabbitMQConnection.model_validate({"type": "rabbitmq", "url": url})
        transport = RabbitMQ("rabbit", config)

        def delete_queue() -> None:
            connection = pika.BlockingConnection(pika.URLParameters(url))
            channel = connection.channel()
            channel.queue_delete(address)
            channel.exchange_delete(address)
            connection.close()

        request.addfinalizer(delete_queue)
    else:
        from bridge.config.models import KafkaConnection
        from bridge.transports.kafka import Transport as Kafka

        servers = request.getfixturevalue("kafka_bootstrap")
        transport = Kafka(
            "kafka",
            KafkaConnection(
                type="kafka",
                bootstrap_servers=servers,
                idempotence=False,
                partitions=1,
                max_request_size=4 * 1024 * 1024,
                session_timeout_ms=3000,
            ),
        )
    address = unique("q")
    await transport.install([address])
    try:
        yield Place(transport, address, unique("g") if kind == "kafka" else None)
    finally:
        await transport.close()
