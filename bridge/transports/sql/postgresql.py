"""PostgreSQL queue tables as the NServiceBus PostgreSQL transport lays them out (§2), psycopg 3.

Features
    `"schema"."table" (id uuid, expires timestamp (UTC), headers text, body bytea, seq serial)`,
    created with the transport's own statement (plus a partial index on `expires`). Send and
    receive are the transport's statements; the receive takes up to n rows at once with
    `FOR UPDATE SKIP LOCKED`, so concurrent receivers skip each other's rows, and returns `seq`
    to restore FIFO order (RETURNING order is unspecified). Expiry uses the database clock,
    `now() AT TIME ZONE 'UTC'`.

Connection
    `{type: postgresql, dsn: "postgresql://...", schema: public}`; a DSN without
    `connect_timeout` gets 10 seconds, one without `application_name` gets
    `bridge <connection name>`. Canonical address: `"public"."Sales"` (§6).

Limits
    Table names longer than 55 bytes are refused, as the real installer does (the `seq`
    sequence name must fit PostgreSQL's 63-byte identifiers).

Errors
    Connection failures and SQLSTATE classes 08, 40 (serialization, deadlock), 53, 57, 58 and
    55P03 are retriable; the rest are not.
"""

from __future__ import annotations

from typing import cast

from bridge.config.models import PostgresConnection
from bridge.errors import ConfigError, TransportError
from bridge.transports.sql.dialect import DbConnection, Dialect, double_quote, scalar
from bridge.transports.sql.errors import postgresql_error
from bridge.transports.sql.layout import CheckpointStatements, QueueStatements
from bridge.transports.sql.queue import SqlTransport

__all__ = ["MAX_TABLE_NAME_BYTES", "PostgresDialect", "Transport"]

MAX_TABLE_NAME_BYTES = 55
_NOW = "(now() AT TIME ZONE 'UTC')"
# rs.id as text: the native id is a string, and a uuid.UUID per row only to format it costs.
_RETURNING = (
    "RETURNING rs.id::text,"
    f" CASE WHEN rs.expires IS NULL THEN 0 WHEN rs.expires > {_NOW} THEN 0 ELSE 1 END,"
    " rs.headers, rs.body,\n"
    f"  CAST(EXTRACT(EPOCH FROM rs.expires - {_NOW}) * 1000 AS bigint), rs.seq"
)


def _placeholder_safe(name: str) -> str:
    """A quoted name for a statement with parameters, where psycopg reads `%` as a placeholder."""
    return name.replace("%", "%%")


class PostgresDialect(Dialect):
    kind = "postgresql"

    def __init__(self, connection_name: str, config: PostgresConnection) -> None:
        super().__init__(connection_name)
        self.config = config
        self.schema = config.schema_

    def connect(self) -> DbConnection:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        given = conninfo_to_dict(self.config.dsn)
        defaults = {
            "connect_timeout": "10",
            "application_name": f"bridge {self.connection_name}"[:63],
        }
        extra = {key: value for key, value in defaults.items() if key not in given}
        dsn = make_conninfo(self.config.dsn, **extra)
        return cast(DbConnection, psycopg.connect(dsn, autocommit=False))

    def translate(self, exc: Exception) -> TransportError | None:
        return postgresql_error(self.describe(), exc)

    def alive(self, db: DbConnection) -> bool:
        return not (getattr(db, "closed", False) or getattr(db, "broken", False))

    def table(self, name: str) -> str:
        size = len(name.encode("utf-8"))
        if size > MAX_TABLE_NAME_BYTES:
            raise ConfigError(
                f"PostgreSQL queue table name {name!r} is {size} bytes long; "
                f"the NServiceBus PostgreSQL transport allows at most {MAX_TABLE_NAME_BYTES}"
            )
        return f"{double_quote(self.schema)}.{double_quote(name)}"

    def canonical_address(self, name: str) -> str:
        return f"{double_quote(self.schema)}.{double_quote(name)}"

    def queue_statements(self, name: str) -> QueueStatements:
        t = self.table(name)
        tp = _placeholder_safe(t)
        expired = f"expires <= {_NOW}"
        return QueueStatements(
            create=(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "  Id uuid NOT NULL PRIMARY KEY, Expires TIMESTAMP, Headers TEXT NOT NULL, "
                "Body BYTEA,\n"
                "  Seq serial NOT NULL UNIQUE)",
                f"CREATE INDEX IF NOT EXISTS {double_quote(name + '_expires')} ON {t} (expires)"
                " WHERE expires IS NOT NULL",
            ),
            send=(
                f"INSERT INTO {tp} (Id, Expires, Headers, Body) VALUES "
                f"(%s, {_NOW} + (%s || ' ms')::INTERVAL, %s, %s)"
            ),
            receive=(
                f"DELETE FROM {tp} rs WHERE rs.id IN "
                f"(SELECT id FROM {tp} ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED)\n"
                f"{_RETURNING}"
            ),
            depth=f"SELECT count(*) FROM {t}",
            oldest=f"SELECT headers FROM {t} ORDER BY seq LIMIT 1",
            expired=f"SELECT count(*) FROM {t} WHERE {expired}",
            purge_expired=(
                f"DELETE FROM {tp} WHERE id IN "
                f"(SELECT id FROM {tp} WHERE {expired} LIMIT %s FOR UPDATE SKIP LOCKED)"
            ),
            bounds=f"SELECT min(seq), max(seq) FROM {t}",
            receive_range=(
                f"DELETE FROM {tp} rs WHERE rs.id IN "
                f"(SELECT id FROM {tp} WHERE seq BETWEEN %s AND %s ORDER BY seq LIMIT %s "
                "FOR UPDATE SKIP LOCKED)\n"
                f"{_RETURNING}"
            ),
            count_range=f"SELECT count(*) FROM {tp} WHERE seq BETWEEN %s AND %s",
            scan_range=(
                f"SELECT id, CASE WHEN {expired} THEN 1 ELSE 0 END, headers, "
                f"octet_length(body), seq FROM {tp}\n"
                "WHERE seq > %s AND seq <= %s ORDER BY seq LIMIT %s"
            ),
        )

    def checkpoint_statements(self) -> CheckpointStatements:
        t = f"{double_quote(self.schema)}.{double_quote('BridgeCheckpoints')}"
        return CheckpointStatements(
            table="BridgeCheckpoints",
            create=(
                f"CREATE TABLE IF NOT EXISTS {t} (\n"
                "  name TEXT NOT NULL PRIMARY KEY,\n"
                "  position BIGINT NOT NULL)",
            ),
            upsert=(
                f"INSERT INTO {_placeholder_safe(t)} (name, position) VALUES (%s, %s)\n"
                "ON CONFLICT (name) DO UPDATE SET position = EXCLUDED.position"
            ),
            load=f"SELECT name, position FROM {t}",
        )

    def table_exists(self, db: DbConnection, name: str) -> bool:
        query = "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s"
        return scalar(db, query, (self.schema, name)) is not None


class Transport(SqlTransport):
    def __init__(self, name: str, config: PostgresConnection) -> None:
        super().__init__(name, PostgresDialect(name, config))
