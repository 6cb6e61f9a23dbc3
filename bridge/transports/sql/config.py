"""The SQL connections of routes.yaml (`sqlite`, `postgresql`, `sqlserver`) and their rules.

Driver-free: `bridge check` and the config loader import it without psycopg or pyodbc.
PostgreSQL and SQL Server connections size the pool their routes share (`pool_size`,
`pool_timeout`: `bridge.transports.sql.pool`); SQLite has none.
A queue table name a database or the NServiceBus installer would refuse is found here, before
anything connects: PostgreSQL tables of more than 55 bytes (the installer's limit: the `seq`
sequence's name must fit 63-byte identifiers), SQL Server tables over 128 characters (sysname).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import Field

from bridge.config.base import Problem, Strict
from bridge.transports.sql.addresses import address_key, canonical_address

__all__ = [
    "ADDRESS_KEY",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_POOL_TIMEOUT",
    "KINDS",
    "MAX_TABLE_NAME_BYTES",
    "SOURCE_GROUP",
    "SQLSERVER_MAX_NAME",
    "PostgresConnection",
    "SqlServerConnection",
    "SqliteConnection",
    "address_key",
    "address_problem",
    "canonical_address",
    "lint",
]

KINDS = ("sqlite", "postgresql", "sqlserver")
#: What a route end on this connection names, and whether a source reads in a consumer group.
ADDRESS_KEY = "queue"
SOURCE_GROUP = False
#: The NServiceBus PostgreSQL installer's limit on a queue table name, in bytes.
MAX_TABLE_NAME_BYTES = 55
SQLSERVER_MAX_NAME = 128  # sysname
#: Server connections one process's routes share per PostgreSQL or SQL Server connection: a
#: busy loop holds two (its batch and the one received ahead), so ten keep about five loops
#: moving at full speed at once while idle ones only borrow one per poll; ten per process
#: and worker leaves most of PostgreSQL's default `max_connections` (100) to the endpoints.
DEFAULT_POOL_SIZE = 10
#: Seconds a route waits for a free pooled connection before it backs off (and retries).
DEFAULT_POOL_TIMEOUT = 10.0


class _Sql(Strict):
    layout: Literal["nservicebus"] = Field(
        "nservicebus", description="Queue table layout (the NServiceBus SQL transport's)."
    )


class SqliteConnection(_Sql):
    type: Literal["sqlite"]
    path: str = Field(min_length=1, description="SQLite database file; created when missing.")
    busy_timeout: float = Field(30.0, gt=0, description="Seconds to wait on a locked database.")


class _Pooled(_Sql):
    pool_size: int = Field(
        DEFAULT_POOL_SIZE,
        ge=1,
        le=10_000,
        description="Most server connections the routes of one process hold on this connection "
        "at once (plus one for administration); see README, 'Connections and pools'.",
    )
    pool_timeout: float = Field(
        DEFAULT_POOL_TIMEOUT,
        gt=0,
        description="Seconds a route waits for a free pooled connection before it backs off.",
    )


class PostgresConnection(_Pooled):
    type: Literal["postgresql"]
    dsn: str = Field(description="libpq connection string or URL; keep secrets in ${VAR}.")
    schema_: str = Field(
        "public", alias="schema", min_length=1, description="Schema of the queue tables."
    )


class SqlServerConnection(_Pooled):
    type: Literal["sqlserver"]
    dsn: str = Field(min_length=1, description="ODBC connection string; keep secrets in ${VAR}.")
    schema_: str = Field(
        "dbo", alias="schema", min_length=1, description="Schema of the queue tables."
    )
    catalog: str | None = Field(
        None, min_length=1, description="Database; the DSN's default when omitted."
    )


SqlConnection = SqliteConnection | PostgresConnection | SqlServerConnection


def lint(connection: SqlConnection) -> Iterator[Problem]:
    """Cross-field rules of one connection (none yet: every SQL key stands alone)."""
    return iter(())


def address_problem(kind: str, name: str) -> str | None:
    """Why `kind` would refuse a queue table called `name`, or None."""
    if kind == "postgresql":
        size = len(name.encode("utf-8"))
        if size > MAX_TABLE_NAME_BYTES:
            return (
                f"PostgreSQL queue table name {name!r} is {size} bytes long; "
                f"the NServiceBus PostgreSQL transport allows at most {MAX_TABLE_NAME_BYTES}"
            )
    elif kind == "sqlserver" and len(name) > SQLSERVER_MAX_NAME:
        return (
            f"SQL Server table name {name[:40]!r}... is {len(name)} characters long; "
            f"identifiers hold at most {SQLSERVER_MAX_NAME}"
        )
    return None
