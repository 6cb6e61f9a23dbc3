"""Queue-table layouts apart from SQL dialects: chosen by the connection's `layout` key, built
from the dialect's primitives; a new layout is one module and its line in `LAYOUTS`.

The statement text each layout writes is checked where it runs: golden T-SQL in
test_sql_sqlserver.py, real PostgreSQL and SQLite in tests/integration/test_sql_queues.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlglot
from sqlglot import exp

from bridge.config.models import PostgresConnection, SqliteConnection, SqlServerConnection
from bridge.errors import ConfigError
from bridge.transports.sql.dialects.base import Dialect
from bridge.transports.sql.dialects.postgresql import PostgresDialect
from bridge.transports.sql.dialects.sqlite import SqliteDialect
from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
from bridge.transports.sql.layouts.base import LAYOUTS, Layout, QueueStatements, load_layout
from bridge.transports.sql.layouts.nservicebus_postgresql import PostgresLayout
from bridge.transports.sql.layouts.nservicebus_sqlserver import SqlServerLayout


def sqlserver() -> SqlServerDialect:
    config = {"type": "sqlserver", "dsn": "Driver=FreeTDS;Server=nowhere", "catalog": "shop"}
    return SqlServerDialect("legacy", SqlServerConnection.model_validate(config))


def postgresql() -> PostgresDialect:
    config = {"type": "postgresql", "dsn": "postgresql://nowhere", "schema": "public"}
    return PostgresDialect("shop", PostgresConnection.model_validate(config))


def sqlite() -> SqliteDialect:
    return SqliteDialect("local", SqliteConnection.model_validate({"type": "sqlite", "path": "x"}))


def test_the_layout_key_picks_the_layout_of_that_database() -> None:
    assert type(sqlserver().layout) is SqlServerLayout
    assert type(postgresql().layout) is PostgresLayout
    assert type(sqlite().layout) is PostgresLayout  # §3: the PostgreSQL columns, in SQLite


def test_a_database_without_the_layout_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"no queue-table layout 'kombu' on sqlite.*nginn"):
        load_layout("kombu", sqlite())
    with pytest.raises(ConfigError, match="T-SQL"):
        SqlServerLayout(sqlite())


class Appended(Layout):
    """A layout as a later one would be written: statements from primitives only."""

    def queue_statements(self, name: str) -> QueueStatements:
        d, t, p = self.dialect, self.dialect.table(name), self.dialect.placeholder
        take = f"DELETE FROM {t} WHERE pos IN (SELECT pos FROM {t} ORDER BY pos {d.take(p)})"
        return QueueStatements(
            create=(f"CREATE TABLE {t} (pos INTEGER PRIMARY KEY, due TEXT, msg TEXT)",),
            send=f"INSERT INTO {t} (due, msg) VALUES ({d.expires_after(p)}, {d.write_text(p)})",
            receive=f"{take} RETURNING pos, {d.expired_flag('due')}, {d.read_text('msg')}",
            depth=f"SELECT count(*) FROM {t}",
            oldest=f"SELECT {d.read_text('msg')} FROM {t} ORDER BY pos LIMIT 1",
            expired=f"SELECT count(*) FROM {t} WHERE {d.is_expired('due')}",
            purge_expired=f"DELETE FROM {t} WHERE {d.is_expired('due')}",
            bounds=f"SELECT min(pos), max(pos) FROM {t}",
            receive_range=take,
            count_range=f"SELECT count(*) FROM {t}",
            scan_range=f"SELECT pos FROM {t}",
        )


def test_a_new_layout_is_one_class_and_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(LAYOUTS, ("appended", "sqlite"), f"{__name__}:Appended")
    dialect = sqlite()
    layout = load_layout("appended", dialect)
    assert isinstance(layout, Appended) and layout.dialect is dialect
    statements = layout.queue_statements('my "q"')
    assert statements.send == (
        'INSERT INTO "my ""q""" (due, msg) VALUES '
        "(strftime('%Y-%m-%dT%H:%M:%fZ', 'now', (? / 1000.0) || ' seconds'), CAST(? AS TEXT))"
    )
    assert statements.receive.endswith(
        "ORDER BY pos LIMIT ?) RETURNING pos, "
        "CASE WHEN due IS NOT NULL AND julianday(due) <= julianday('now') THEN 1 ELSE 0 END, "
        "CAST(msg AS BLOB)"
    )


@pytest.mark.parametrize("make", [sqlserver, postgresql, sqlite], ids=lambda m: m.__name__)
def test_every_dialect_has_every_primitive_in_its_own_sql(make: Callable[[], Dialect]) -> None:
    d = make()
    p = "@n" if d.kind == "sqlserver" else "1"
    t = d.quote('Sales]"')
    select = (
        f"SELECT {d.uuid_text('id')}, {d.expired_flag('expires')}, {d.remaining_ms('expires')}, "
        f"{d.read_text('headers')}, {d.read_bytes('body')}, {d.byte_length('body')}, "
        f"{d.expires_after(p)}, {d.write_text(p)}, {d.utc_now} "
        f"FROM {t} WHERE {d.is_expired('expires')} ORDER BY seq {d.take(p)}"
    )
    read = {"sqlserver": "tsql", "postgresql": "postgres", "sqlite": "sqlite"}[d.kind]
    (tree,) = sqlglot.parse(select, read=read, error_level=sqlglot.ErrorLevel.RAISE)
    assert isinstance(tree, exp.Select) and len(tree.expressions) == 9
    assert [table.name for table in tree.find_all(exp.Table)] == ['Sales]"']


def test_only_postgresql_stages_large_sends_and_its_staged_insert_mirrors_the_send() -> None:
    """The staged insert writes the same columns from the same values as `send`, read from the
    session's stage in the order they were copied; the other databases have no stage."""
    assert sqlserver().send_stage == sqlite().send_stage == ""
    assert sqlite().queue_statements("Sales").send_staged == ""
    d = postgresql()
    statements = d.queue_statements('Sales "EU"%')
    (tree,) = sqlglot.parse(
        statements.send_staged, read="postgres", error_level=sqlglot.ErrorLevel.RAISE
    )
    assert isinstance(tree, exp.Insert)
    assert [c.name.lower() for c in tree.this.expressions] == ["id", "expires", "headers", "body"]
    assert tree.this.this.name == 'Sales "EU"%'  # unescaped `%`: it runs without parameters
    select = tree.expression
    assert [t.name for t in select.find_all(exp.Table)] == ["bridge_send"]
    assert select.args["order"].sql(dialect="postgres") == "ORDER BY n"
    assert statements.send_staged.split("SELECT ", 1)[1].startswith(
        f"id::uuid, {d.expires_after('ttl')}, headers, body FROM pg_temp.bridge_send"
    )
