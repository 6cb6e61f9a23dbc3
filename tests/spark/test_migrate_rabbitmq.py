"""`bridge migrate` from a PostgreSQL queue table into a RabbitMQ queue, in-process on the test
run's SparkSession; the queue is read back with a plain pika channel, not the bridge's source.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pytest

from bridge.config.loader import load_config
from bridge.migrate.driver import migrate
from bridge.migrate.spec import JobSpec
from bridge.transports import load
from bridge.transports.rabbitmq.headers import incoming
from tests.conftest import unique
from tests.spark.conftest import write_routes
from tests.spark.data import message, pg_insert_raw, pg_poison_raw_headers, pg_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 1500


@dataclass
class Setup:
    config: Path
    queue: str
    target: str
    url: str


@pytest.fixture
async def setup(
    tmp_path: Path, pg_dsn: str, pg_schema: str, rabbitmq_url: str
) -> AsyncIterator[Setup]:
    queue, target = unique("Orders"), unique("orders")
    config = write_routes(
        tmp_path / "routes.yaml",
        f"""
        shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
        rabbit: {{type: rabbitmq, url: "{rabbitmq_url}", queue_type: quorum}}
        """,
        f"""
        - name: to-rabbit
          from: {{connection: shop, queue: "{queue}"}}
          to: {{connection: rabbit, queue: "{target}"}}
          batch_size: 100
        """,
    )
    connections = load_config(config).config.connections
    for name, addresses in (("shop", [queue, "bridge.error"]), ("rabbit", [target])):
        transport = load(name, connections[name])
        await transport.install(addresses)
        await transport.close()
    yield Setup(config, queue, target, rabbitmq_url)
    channel = pika.BlockingConnection(pika.URLParameters(rabbitmq_url)).channel()
    channel.queue_delete(target)
    channel.exchange_delete(target)
    channel.connection.close()


def read_all(url: str, queue: str) -> list[tuple[Any, bytes]]:
    """(properties, body) of every message in `queue`, taking them."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        got: list[tuple[Any, bytes]] = []
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return got
            got.append((properties, body))
    finally:
        connection.close()


async def test_postgresql_to_rabbitmq_carries_every_header_and_body(
    spark: Any, setup: Setup, pg_dsn: str, pg_schema: str
) -> None:
    shop = load("shop", load_config(setup.config).config.connections["shop"])
    sink = shop.sink(setup.queue)
    sent = [message(n) for n in range(ROWS)]
    await sink.send(sent[:700])
    pg_insert_raw(pg_dsn, pg_schema, setup.queue, "{not json", b"\x00poison")
    await sink.send(sent[700:] + [message(9000 + n, ttl=-1) for n in range(3)])
    await shop.close()

    summary = await migrate(
        JobSpec.from_file(str(setup.config), "to-rabbit"), master=None, partitions=5
    )

    assert (summary.planned, summary.left, summary.tasks) == (ROWS + 4, 0, 5)
    assert (summary.moved.moved, summary.moved.expired, summary.moved.poison) == (ROWS, 3, 1)
    assert pg_rows(pg_dsn, pg_schema, setup.queue) == []
    assert pg_poison_raw_headers(pg_dsn, pg_schema) == ["{not json"]
    delivered = await asyncio.to_thread(read_all, setup.url, setup.target)
    assert len(delivered) == ROWS  # each message once, and nothing else
    got = {str(properties.message_id): (properties, body) for properties, body in delivered}
    for envelope in sent:
        properties, body = got[str(envelope.message_id)]
        assert body == envelope.body
        read = incoming(properties, body, 0.0)  # basic_get from a quorum queue: sorted by name
        assert read.headers.to_dict() == envelope.headers.to_dict()
