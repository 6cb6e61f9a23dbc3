"""Routes between two queue tables of one database: one atomic move per batch."""

from __future__ import annotations

import contextlib
import sqlite3
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from tests.conftest import unique
from tests.support.cli import run_bridge

pytestmark = pytest.mark.integration


def write_routes(tmp_path: Path, connection: str) -> tuple[Path, str, str]:
    src, dst = unique("In"), unique("Out")
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              db: {connection}
            routes:
              - name: move
                from: {{connection: db, queue: "{src}"}}
                to: {{connection: db, queue: "{dst}"}}
                batch_size: 64
                concurrency: 2
            """
        )
    )
    return path, src, dst


def bridge(config: Path, *args: str) -> None:
    run_bridge(*args, config=config, timeout=120)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_same_database_route_moves_everything_once(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if dialect == "sqlite":
        connection = f'{{type: sqlite, path: "{tmp_path / "one.db"}"}}'
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        connection = f'{{type: postgresql, dsn: "{dsn}", schema: "{schema}"}}'
    config, src, dst = write_routes(tmp_path, connection)
    bridge(config, "install")
    transport = load("db", load_config(config).config.connections["db"])
    try:
        sink = transport.sink(src)
        await sink.send(
            [Envelope(Headers([("NServiceBus.MessageId", f"m{i}")]), b"x" * i) for i in range(500)]
        )
        bridge(config, "run", "--until-idle", "1")
        assert (await transport.peek(src)).depth == 0
        source = transport.source(dst)
        batch = await source.receive_batch(1000, 1.0)
        await batch.abort()
        await source.close()
        ids = [e.message_id for e in batch.messages]
        assert sorted(ids) == sorted(f"m{i}" for i in range(500))
        assert len(set(ids)) == 500
    finally:
        await transport.close()


@dataclass
class Database:
    """One database of a route, its connection in routes.yaml and raw access to its tables."""

    connection: str
    sqlite_path: str = ""
    pg_dsn: str = ""
    schema: str = ""

    @contextlib.contextmanager
    def cursor(self) -> Iterator[Any]:
        if self.sqlite_path:
            with contextlib.closing(sqlite3.connect(self.sqlite_path)) as lite, lite:
                yield lite.cursor()
        else:
            with psycopg.connect(self.pg_dsn) as pg, pg.cursor() as cursor:
                yield cursor

    def table(self, name: str) -> str:
        return f'"{name}"' if self.sqlite_path else f'"{self.schema}"."{name}"'

    def insert(self, name: str, headers: str) -> str:
        """A row as a foreign writer leaves it, with these exact Headers; its Id."""
        row_id = str(uuid.uuid4())
        marks = ", ".join(["?" if self.sqlite_path else "%s"] * 3)
        with self.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {self.table(name)} (id, headers, body) VALUES ({marks})",
                (row_id, headers, b"body"),
            )
        return row_id

    def headers(self, name: str) -> list[str]:
        with self.cursor() as cursor:
            cursor.execute(f"SELECT headers FROM {self.table(name)} ORDER BY seq")
            return [row[0] for row in cursor.fetchall()]


def database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Database:
    if kind == "sqlite":
        path = str(tmp_path / f"{unique('db')}.db")
        return Database(f'{{type: sqlite, path: "{path}"}}', sqlite_path=path)
    dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
    return Database(
        f'{{type: postgresql, dsn: "{dsn}", schema: "{schema}"}}', pg_dsn=dsn, schema=schema
    )


#: Headers text no encoder writes: spaces and line breaks between tokens, lower- and upper-case
#: escapes of one emoji, an escaped and a raw `/`, an escaped `é`, an empty value, a null, a
#: repeated name.
HAND_WRITTEN = (
    ' {"NServiceBus.MessageId" : "hand-1",\n\t"lower":"\\ud83d\\ude80", "upper":"\\uD83D\\uDE80",'
    ' "raw":"a/b🚀", "escaped":"a\\/b\\u00e9", "empty":"" , "nothing":null,'
    ' "twice":"1", "twice":"2" }\r\n'
)


@pytest.mark.parametrize(
    ("source", "destination"),
    [("sqlite", None), ("postgresql", None), ("sqlite", "postgresql"), ("postgresql", "sqlite")],
    ids=["sqlite", "postgresql", "sqlite-to-postgresql", "postgresql-to-sqlite"],
)
async def test_a_route_without_header_rules_keeps_the_headers_text_byte_for_byte(
    source: str, destination: str | None, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A row's Headers column crosses SQL to SQL as it was written (wire-format §5), unless the
    bridge changed the headers: a row without a message id takes its row Id, so it is written
    afresh, as NServiceBus writes it."""
    src_db = database(source, tmp_path, request)
    dst_db = database(destination, tmp_path, request) if destination else src_db
    src, dst = unique("In"), unique("Out")
    to = "b" if destination else "a"
    connections = {"a": src_db.connection, to: dst_db.connection}
    config = tmp_path / "routes.yaml"
    config.write_text(
        "connections:\n"
        + "".join(f"  {name}: {connection}\n" for name, connection in connections.items())
        + "routes:\n"
        + f'  - {{name: move, from: {{connection: a, queue: "{src}"}}, '
        + f'to: {{connection: {to}, queue: "{dst}"}}}}\n'
    )
    bridge(config, "install")
    src_db.insert(src, HAND_WRITTEN)
    native = src_db.insert(src, '{ "Shop.Kind" : "native\\u0021" }')
    bridge(config, "run", "--until-idle", "1")
    assert dst_db.headers(dst) == [
        HAND_WRITTEN,
        f'{{"Shop.Kind":"native!","NServiceBus.MessageId":"{native}"}}',
    ]
