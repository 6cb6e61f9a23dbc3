"""A SQL-sourced message the destination refuses for good, through real `bridge run` processes:
it lands in the SQL error queue with `NServiceBus.FailedQ` in the source's canonical form, and a
ServicePulse retry (the copy sent back to FailedQ) is forwarded once the destination takes it.

Kafka refuses the record as larger than the connection's `max_request_size`; raising the limit
is the operator's fix before the retry. The error queue is read and FailedQ written with the
plain database drivers, as ServiceControl would, not through the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.nservicebus.wireformat import timestamp_seconds
from bridge.transports import load
from tests.conftest import unique

pytestmark = pytest.mark.integration

LIMIT = 2_000
#: What ServiceControl's retry removes (its `HeaderFilter`: names starting with these).
FAILURE_HEADERS = (
    "NServiceBus.Retries",
    "NServiceBus.FailedQ",
    "NServiceBus.TimeOfFailure",
    "NServiceBus.ExceptionInfo.",
    "NServiceBus.Timeout.Expire",
    "ServiceControl.EditOf",
)


class Setup:
    def __init__(self, tmp_path: Path, dialect: str, kafka: str, pg_dsn: str, schema: str) -> None:
        self.dialect, self.pg_dsn, self.schema = dialect, pg_dsn, schema
        self.sqlite_path = str(tmp_path / "queues.db")
        self.kafka = kafka
        self.queue, self.errors, self.topic = unique("Sales"), unique("error"), unique("topic")
        self.config = tmp_path / "routes.yaml"
        self.write_config(LIMIT)
        self.db = load("db", load_config(self.config).config.connections["db"])

    def write_config(self, max_request_size: int) -> None:
        if self.dialect == "sqlite":
            db = f'{{type: sqlite, path: "{self.sqlite_path}"}}'
        else:
            db = f'{{type: postgresql, dsn: "{self.pg_dsn}", schema: "{self.schema}"}}'
        self.config.write_text(
            textwrap.dedent(
                f"""\
                connections:
                  db: {db}
                  kafka: {{type: kafka, bootstrap_servers: "{self.kafka}", idempotence: false,
                           partitions: 1, max_request_size: {max_request_size}}}
                routes:
                  - name: to-kafka
                    from: {{connection: db, queue: "{self.queue}"}}
                    to: {{connection: kafka, topic: "{self.topic}"}}
                    error_queue: "{self.errors}"
                """
            )
        )

    def run(self, *args: str) -> None:
        process = subprocess.run(
            [sys.executable, "-m", "bridge", *args, "-c", str(self.config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert process.returncode == 0, process.stderr
        assert "Traceback" not in process.stderr

    def canonical(self, table: str) -> str:
        """wire-format §6, spelled out: `"schema"."table"`; SQLite's schema is `main`."""
        return f'"{"main" if self.dialect == "sqlite" else self.schema}"."{table}"'

    @contextlib.contextmanager
    def cursor(self) -> Iterator[Any]:
        if self.dialect == "sqlite":
            with contextlib.closing(sqlite3.connect(self.sqlite_path)) as lite, lite:
                yield lite.cursor()
        else:
            with psycopg.connect(self.pg_dsn) as pg, pg.cursor() as cursor:
                yield cursor

    def take_all(self, table: str) -> list[tuple[dict[str, str], bytes]]:
        """Delete and return every row of `table` (a canonical address: a valid SQL name)."""
        with self.cursor() as cursor:
            cursor.execute(f"SELECT headers, body FROM {table} ORDER BY seq")
            rows = [(json.loads(h), bytes(b)) for h, b in cursor.fetchall()]
            cursor.execute(f"DELETE FROM {table}")
        return rows

    def insert(self, table: str, headers: dict[str, str], body: bytes) -> None:
        statement = f"INSERT INTO {table} (id, headers, body) VALUES (?, ?, ?)"
        if self.dialect == "postgresql":
            statement = statement.replace("?", "%s")
        with self.cursor() as cursor:
            cursor.execute(statement, (str(uuid.uuid4()), json.dumps(headers), body))

    async def read_topic(self, expected: int) -> list[Envelope]:
        consumer = AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.kafka,
            group_id=unique("reader"),
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        out: list[Envelope] = []
        deadline = time.monotonic() + 30
        try:
            while len(out) < expected and time.monotonic() < deadline:
                records = await consumer.getmany(timeout_ms=500)
                for batch in records.values():
                    out.extend(
                        Envelope(
                            Headers((k, None if v is None else v.decode()) for k, v in r.headers),
                            r.value or b"",
                        )
                        for r in batch
                    )
        finally:
            await consumer.stop()
        return out


@pytest.fixture(params=["sqlite", "postgresql"])
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path, kafka_bootstrap: str
) -> AsyncIterator[Setup]:
    dialect = request.param
    pg_dsn = request.getfixturevalue("pg_dsn") if dialect == "postgresql" else ""
    schema = request.getfixturevalue("pg_schema") if dialect == "postgresql" else ""
    s = Setup(tmp_path, dialect, kafka_bootstrap, pg_dsn, schema)
    s.run("install")
    yield s
    await s.db.close()


def message(i: int, size: int) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", f"m-{i}")]), bytes([65 + i]) * size)


def servicepulse_retry(copy: dict[str, str]) -> dict[str, str]:
    """The headers ServiceControl sends back to FailedQ: the copy's without the failure
    headers, with its retry headers (the staging queue's target address already removed)."""
    headers = {k: v for k, v in copy.items() if not k.startswith(FAILURE_HEADERS)}
    headers["ServiceControl.Retry.UniqueMessageId"] = str(uuid.uuid4())
    headers["ServiceControl.Retry.Attempt.MessageId"] = copy["NServiceBus.MessageId"]
    return headers


async def test_a_refused_message_goes_to_the_error_queue_and_a_retry_forwards_it(
    setup: Setup,
) -> None:
    sink = setup.db.sink(setup.queue)
    await sink.send([message(0, 10), message(1, LIMIT + 500), message(2, 10)])
    await sink.close()
    await asyncio.to_thread(setup.run, "run", "--until-idle", "1")

    assert [e.message_id for e in await setup.read_topic(2)] == ["m-0", "m-2"]
    ((copy, body),) = setup.take_all(setup.canonical(setup.errors))
    assert body == message(1, LIMIT + 500).body
    assert copy["NServiceBus.MessageId"] == "m-1"
    failed_q = copy["NServiceBus.FailedQ"]
    assert failed_q == setup.canonical(setup.queue)
    assert copy["NServiceBus.ExceptionInfo.ExceptionType"] == "bridge.errors.MessageRejected"
    assert "max_request_size" in copy["NServiceBus.ExceptionInfo.Message"]
    assert copy["NServiceBus.ExceptionInfo.StackTrace"]
    assert timestamp_seconds(copy["NServiceBus.TimeOfFailure"]) <= time.time()
    assert copy["NServiceBus.ProcessingEndpoint"] == "bridge"

    setup.write_config(max_request_size=1_048_576)  # the operator's fix
    setup.insert(failed_q, servicepulse_retry(copy), body)  # ServicePulse: retry
    await asyncio.to_thread(setup.run, "run", "--until-idle", "1")

    forwarded = await setup.read_topic(3)
    assert [e.message_id for e in forwarded] == ["m-0", "m-2", "m-1"]
    retried = forwarded[2]
    assert retried.body == body
    assert "NServiceBus.FailedQ" not in retried.headers
    assert retried.headers.get("ServiceControl.Retry.Attempt.MessageId") == "m-1"
    assert setup.take_all(setup.canonical(setup.errors)) == []
    assert setup.take_all(failed_q) == []
