"""`bridge migrate` from a PostgreSQL queue table, in-process on the test run's SparkSession:
into SQLite, into another PostgreSQL table of the same database, with expired and poison rows,
with a task that fails on its first attempt, and with rows another transaction holds.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.migrate.driver import migrate
from bridge.migrate.spec import FAIL_AFTER_ENV, JobSpec
from bridge.migrate.sqltask import move_range
from bridge.nservicebus.deadletter import RAW_HEADERS
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.sql import Transport as SqlTransport
from tests.conftest import unique
from tests.spark.conftest import write_routes
from tests.spark.data import (
    REPLY_TO,
    by_id,
    message,
    pg_insert_raw,
    pg_raw_headers,
    pg_rows,
    sqlite_rows,
    translated,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROWS = 3000
LOCAL_REPLY_TO = '"main"."Replies"'


class Setup:
    """PostgreSQL `shop` (source and error queue), SQLite `local`, routes between them."""

    def __init__(self, tmp_path: Path, pg_dsn: str, schema: str, batch_size: int = 100) -> None:
        self.pg_dsn, self.schema = pg_dsn, schema
        self.sqlite = str(tmp_path / "local.db")
        self.source, self.target, self.copy = unique("Orders"), unique("Orders"), unique("Copy")
        self.config = write_routes(
            tmp_path / "routes.yaml",
            f"""
            shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{schema}"}}
            local: {{type: sqlite, path: "{self.sqlite}"}}
            """,
            f"""
            - name: to-local
              from: {{connection: shop, queue: "{self.source}"}}
              to: {{connection: local, queue: "{self.target}"}}
              batch_size: {batch_size}
              address_map: {{'{REPLY_TO}': '{LOCAL_REPLY_TO}'}}
            - name: same-db
              from: {{connection: shop, queue: "{self.source}"}}
              to: {{connection: shop, queue: "{self.copy}"}}
              batch_size: {batch_size}
            """,
        )

    def transport(self, name: str) -> Transport:
        config = load_config(self.config).config
        return load(name, config.connections[name])

    async def install(self) -> None:
        for name, queues in (
            ("shop", [self.source, self.copy, "bridge.error"]),
            ("local", [self.target]),
        ):
            transport = self.transport(name)
            await transport.install(queues)
            await transport.close()

    async def fill(
        self, count: int, *, expired: int = 0, poison: int = 0, ttl: int = 0
    ) -> list[Any]:
        """`count` live messages (the first `ttl` with a day to live), `expired` already
        expired ones and `poison` rows with unreadable headers, interleaved."""
        transport = self.transport("shop")
        sink = transport.sink(self.source)
        live = [message(n, ttl=86_400 if n < ttl else None) for n in range(count)]
        dead = [message(count + n, ttl=-1) for n in range(expired)]
        step = max(1, count // max(1, poison + 1))
        for start in range(0, count, step):
            await sink.send(live[start : start + step])
            if poison:
                pg_insert_raw(self.pg_dsn, self.schema, self.source, "{not json", b"\x00poison")
                poison -= 1
        await sink.send(dead)
        await transport.close()
        return live


async def test_postgresql_to_sqlite_carries_every_header_and_body(
    spark: Any,
    tmp_path: Path,
    pg_dsn: str,
    pg_schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema)
    await setup.install()
    live = await setup.fill(ROWS, expired=25, poison=4, ttl=10)
    caplog.set_level(logging.INFO, logger="bridge.migrate")

    summary = await migrate(
        JobSpec.from_file(str(setup.config), "to-local"), master=None, progress_every=0.05
    )

    assert (summary.moved.moved, summary.moved.expired, summary.moved.poison) == (ROWS, 25, 4)
    assert summary.planned == ROWS + 25 + 4 and summary.tasks == 8 and not summary.retried_tasks
    assert pg_rows(pg_dsn, pg_schema, setup.source) == []
    delivered = sqlite_rows(setup.sqlite, setup.target)
    assert len(delivered) == ROWS
    got = by_id(delivered)
    for envelope in live:
        headers, body = got[str(envelope.message_id)]
        assert list(headers) == list(translated(envelope, LOCAL_REPLY_TO))
        assert body == envelope.body
    assert sum(1 for _, _, expires in delivered if expires is not None) == 10
    copies = [json.loads(h) for h in pg_raw_headers(pg_dsn, pg_schema, "bridge.error")]
    assert [c[RAW_HEADERS] for c in copies] == ["{not json"] * 4
    assert {c["NServiceBus.FailedQ"] for c in copies} == {f'"{pg_schema}"."{setup.source}"'}
    progress = [r.getMessage() for r in caplog.records if "moved (" in r.getMessage()]
    assert progress, "no progress line while the job ran"
    assert re.fullmatch(
        rf"route to-local: \d+/{ROWS + 29} moved \(\d+%\), \d+ msg/s, tasks \d/8 finished",
        progress[-1],
    )


async def test_same_database_route_moves_inside_one_transaction(
    spark: Any, tmp_path: Path, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema, batch_size=50)
    await setup.install()
    live = await setup.fill(1000)
    monkeypatch.setenv(FAIL_AFTER_ENV, "3")  # the failed batch rolls back with its copy

    summary = await migrate(
        JobSpec.from_file(str(setup.config), "same-db"), master=None, partitions=4
    )

    assert summary.retried_tasks == 1
    copied = pg_rows(pg_dsn, pg_schema, setup.copy)
    assert len(copied) == 1000  # no duplicate: send and receive commit together
    assert by_id(copied).keys() == {str(e.message_id) for e in live}
    assert pg_rows(pg_dsn, pg_schema, setup.source) == []


async def test_a_retried_task_loses_nothing_and_repeats_at_most_its_batch(
    spark: Any, tmp_path: Path, pg_dsn: str, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema, batch_size=50)
    await setup.install()
    live = await setup.fill(1000)
    monkeypatch.setenv(FAIL_AFTER_ENV, "2")  # task 0 fails after its 2nd send, before commit

    summary = await migrate(
        JobSpec.from_file(str(setup.config), "to-local"), master=None, partitions=4
    )

    assert summary.retried_tasks == 1 and summary.tasks == 4
    delivered = sqlite_rows(setup.sqlite, setup.target)
    ids = [str(h.get("NServiceBus.MessageId")) for h, _, _ in delivered]
    assert set(ids) == {str(e.message_id) for e in live}
    assert len(ids) - len(set(ids)) == 50  # exactly the batch in flight came twice
    assert pg_rows(pg_dsn, pg_schema, setup.source) == []
    # The failed attempt's committed batch counts: what left the source, not what the
    # successful attempts alone moved (950).
    assert (summary.planned, summary.moved.moved, summary.left) == (1000, 1000, 0)
    assert summary.rate == 1000 / summary.seconds
    text = summary.describe()
    assert "  moved    1000\n" in text and "  left     0\n" in text
    assert "  tasks    4 (1 retried: " in text and "warning" not in text


async def test_rows_another_transaction_holds_are_reported_as_left(
    spark: Any, tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema, batch_size=50)
    await setup.install()
    await setup.fill(1000)
    table = f'"{pg_schema}"."{setup.source}"'
    with psycopg.connect(pg_dsn) as holder:  # e.g. a receiver in the middle of a batch
        held = holder.execute(  # not OFFSET: the rows it skips would be locked too
            f"SELECT id FROM {table} WHERE id IN "
            f"(SELECT id FROM {table} ORDER BY seq OFFSET 400 LIMIT 100) FOR UPDATE"
        ).fetchall()
        assert len(held) == 100

        summary = await migrate(
            JobSpec.from_file(str(setup.config), "to-local"), master=None, partitions=4
        )

        holder.rollback()
    assert (summary.planned, summary.moved.moved, summary.left) == (1000, 900, 100)
    assert summary.rate == 900 / summary.seconds
    assert len(sqlite_rows(setup.sqlite, setup.target)) == 900
    assert len(pg_rows(pg_dsn, pg_schema, setup.source)) == 100
    text = summary.describe()
    assert text.startswith("migrated route to-local") and "  moved    900\n" in text
    assert "  left     100\n" in text
    assert text.splitlines()[-1].startswith(
        "warning: 100 of the 1000 planned messages are still in the source"
    )


async def test_rows_added_after_planning_are_left_to_the_service(
    tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    setup = Setup(tmp_path, pg_dsn, pg_schema)
    await setup.install()
    await setup.fill(10)
    shop = setup.transport("shop")
    assert isinstance(shop, SqlTransport)
    planned = await shop.bounds(setup.source)
    assert planned is not None
    later = shop.sink(setup.source)
    await later.send([message(n) for n in range(100, 105)])
    await shop.close()

    moved = await move_range(JobSpec.from_file(str(setup.config), "to-local"), *planned)

    assert moved.moved == 10
    left = pg_rows(pg_dsn, pg_schema, setup.source)
    assert [h.get("NServiceBus.MessageId") for h, _, _ in left] == [
        str(message(n).message_id) for n in range(100, 105)
    ]
