"""PostgreSQL through psycopg 3: connection, names, errors, SQL primitives (wire-format §2).

Features
    Queue tables follow the connection's layout; `nservicebus` is the NServiceBus PostgreSQL
    transport's `"schema"."table" (id uuid, expires timestamp (UTC), headers text, body bytea,
    seq serial)` (`layouts/nservicebus_postgresql`). A receive takes up to n rows at once with
    `FOR UPDATE SKIP LOCKED`, so concurrent receivers skip each other's rows.
    Expiry uses the database clock, `now() AT TIME ZONE 'UTC'`. A send of many rows is
    staged: a binary `COPY` into the session's temporary table `bridge_send` (created by the
    send's transaction unless the session has it, emptied by every commit), then one
    `INSERT ... SELECT` of the same values, in order; psycopg lays a COPY row out in C, where a
    pipelined `executemany` costs Python work per row (see `SqlSink`).

Connection
    `{type: postgresql, dsn: "postgresql://...", schema: public}`; a DSN without
    `connect_timeout` gets 10 seconds, one without `application_name` gets
    `bridge <connection name>`. Canonical address: `"public"."Sales"` (§6).

Silent networks
    libpq waits for an answer without a deadline, and a network that stalls without closing the
    connection (a lost route, a middlebox that drops packets; no RST, no FIN) keeps a read
    blocked for as long as the kernel's TCP retransmissions or keepalives take, which on Linux
    is about 15 minutes, or forever where a proxy still acknowledges. So a route's call that
    has not had its answer after `response_timeout` seconds (default 60) is interrupted: its
    socket is shut down from the watchdog's thread (`Connection`), the blocked read ends with a
    connection error, and the broken connection is discarded; the route backs off and retries.

Limits
    Table names longer than 55 bytes are refused, as the real installer does (the `seq`
    sequence name must fit PostgreSQL's 63-byte identifiers). A time to live that would end
    after 9999-12-31 (the range of .NET's DateTime, which endpoints read `Expires` into; far
    beyond it PostgreSQL's interval overflows) is written as never expiring (NULL), as
    NServiceBus treats `TimeSpan.MaxValue`.

Errors
    Connection failures and SQLSTATE classes 08, 40 (serialization, deadlock), 53, 57, 58 and
    55P03 are retriable; the rest are not. A refused login or access is `AccessRefused`:
    SQLSTATE class 28 (a wrong password, an unknown role, no pg_hba.conf entry), 3D000 (no such
    database) and 42501 (no privilege). A login refused while connecting carries no SQLSTATE
    in psycopg (libpq has no result to take it from), so it is recognised by the server's
    message, as PostgreSQL and PgBouncer write it in English (`REFUSED_AT_CONNECT`); a server
    with another `lc_messages` is recognised for what libpq itself says (no password supplied)
    and otherwise retried as an unreachable server. A connection whose TLS libpq refuses
    (`TLS_REFUSED_AT_CONNECT`: with `sslmode=verify-ca` or `verify-full`, a certificate not signed
    by `sslrootcert`'s CAs, or, with `verify-full`, for another host name; a missing
    `sslrootcert`; a server without TLS where `sslmode` requires it) is `TlsRefused`: libpq
    never falls back to an unverified connection, and neither does retrying.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from bridge.errors import ConfigError
from bridge.protocols import ServerConnections
from bridge.transports.sql.config import PostgresConnection, address_problem
from bridge.transports.sql.dialects.base import (
    DbConnection,
    Dialect,
    double_quote,
    scalar,
)
from bridge.transports.sql.errors import Failure
from bridge.transports.sql.layouts.base import CheckpointStatements

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresDialect", "classify"]

# connection exception, transaction rollback (serialization, deadlock), insufficient resources,
# operator intervention (shutdown, statement timeout), system error
RETRIABLE_CLASSES = {"08", "40", "53", "57", "58"}
RETRIABLE_STATES = {"55P03"}  # lock_not_available
REJECTED_CLASSES = {"22", "54"}  # data exception, program limit exceeded
# invalid authorization specification (28000 unknown role, no pg_hba.conf entry; 28P01 wrong
# password), invalid catalog name (no such database), insufficient privilege
REFUSED_CLASSES = {"28"}
REFUSED_STATES = {"3D000", "42501"}
#: What a login the server (or PgBouncer) refused says while connecting, where psycopg has no
#: SQLSTATE. PostgreSQL's src/backend/libpq/auth.c ("... authentication failed for user",
#: "no pg_hba.conf entry", "pg_hba.conf rejects connection"), src/backend/utils/init/
#: miscinit.c ('role "x" does not exist', "is not permitted to log in") and postinit.c
#: ('database "x" does not exist', "permission denied for database"); libpq's
#: PQnoPasswordSupplied ("fe_sendauth: no password supplied"); PgBouncer ("no such user",
#: "no such database").
REFUSED_AT_CONNECT = re.compile(
    r"authentication failed for user|no pg_hba\.conf entry|pg_hba\.conf rejects connection"
    r'|role ".*" does not exist|database ".*" does not exist|is not permitted to log in'
    r"|permission denied for database|no password supplied|no such user|no such database",
    re.IGNORECASE,
)

#: What libpq itself says when it refuses a connection's TLS (src/interfaces/libpq/
#: fe-secure-openssl.c: "certificate verify failed" from OpenSSL, 'server certificate for "x"
#: does not match host name "y"' (also "(and N other names)"), "could not get server's host
#: name from server certificate", 'root certificate file "x" does not exist'; fe-connect.c:
#: "server does not support SSL, but SSL was required"). libpq's own words are not translated
#: by the server's `lc_messages`.
TLS_REFUSED_AT_CONNECT = re.compile(
    r"certificate verify failed|server certificate for .* does not match host name"
    r"|could not get server's host name from server certificate"
    r'|root certificate file ".*" does not exist|server does not support SSL, but SSL was required',
    re.IGNORECASE,
)

#: max_connections; the connections kept for superusers (and, from PostgreSQL 16, for roles
#: granted pg_use_reserved_connections); the client connections other than this one and those
#: of its application name (the bridge's own, of a service already running this config).
SERVER_CONNECTIONS = """\
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int
         + coalesce(current_setting('reserved_connections', true)::int, 0),
       (SELECT count(*)::int FROM pg_stat_activity
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
           AND application_name IS DISTINCT FROM current_setting('application_name'))"""

#: 9999-12-31 23:59:59 UTC in epoch seconds: the last `Expires` a .NET DateTime can hold.
LAST_EXPIRES = 253_402_300_799


def classify(exc: BaseException) -> Failure | None:
    """psycopg errors by SQLSTATE (see `bridge.transports.sql.errors`)."""
    import psycopg

    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    if state is None:  # raised by the client: connect failed, connection closed or broken
        refused = REFUSED_AT_CONNECT.search(str(exc)) is not None
        tls_refused = TLS_REFUSED_AT_CONNECT.search(str(exc)) is not None
        retriable = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    else:
        refused = state[:2] in REFUSED_CLASSES or state in REFUSED_STATES
        tls_refused = False
        retriable = state[:2] in RETRIABLE_CLASSES or state in RETRIABLE_STATES
    # DataError without a state: refused by psycopg itself (a NUL character in text).
    rejected = isinstance(exc, psycopg.DataError) or (state or "")[:2] in REJECTED_CLASSES
    # The server's DETAIL can quote a failing row (message headers and body): keep it out.
    primary = exc.diag.message_primary if state is not None else None
    text = f"{primary} (SQLSTATE {state})" if primary else None
    return Failure(retriable, rejected, text, refused=refused, tls_refused=tls_refused)


class PostgresDialect(Dialect):
    kind = "postgresql"
    placeholder = "%s"
    utc_now = "(now() AT TIME ZONE 'UTC')"
    summed_rowcount = True

    def __init__(self, connection_name: str, config: PostgresConnection) -> None:
        self.config = config
        self.schema = config.schema_
        self.response_timeout = config.response_timeout
        super().__init__(connection_name, config.layout, config.nginn)
        self.delayed_suffix = config.delayed_suffix

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
        db = cast(DbConnection, psycopg.connect(dsn, autocommit=False))
        self.layout.on_connect(db)
        return db

    classify = staticmethod(classify)

    def receiving_transaction(self, db: DbConnection) -> None:
        # A receive's commit returns before its WAL record is flushed (it is flushed within
        # 3 x wal_writer_delay): a server crash in between can only undo the receive. SET
        # LOCAL ends with the transaction: the pooled connection's next transaction (a sink's,
        # perhaps) waits for the flush again, and so does whatever transaction a pooler in
        # transaction mode (PgBouncer) runs next on the same server session, the endpoints'
        # own included, which a session-level SET would leave asynchronous.
        db.cursor().execute("SET LOCAL synchronous_commit = off")

    def transaction_open(self, db: DbConnection) -> bool:
        from psycopg.pq import TransactionStatus

        return cast("psycopg.Connection[Any]", db).info.transaction_status != TransactionStatus.IDLE

    def server_connections(self, db: DbConnection) -> ServerConnections:
        cursor = db.cursor()
        cursor.execute(SERVER_CONNECTIONS)
        row = cursor.fetchone()
        assert row is not None
        limit, reserved, others = row
        return ServerConnections(int(limit), int(reserved), int(others))

    def alive(self, db: DbConnection) -> bool:
        return not (getattr(db, "closed", False) or getattr(db, "broken", False))

    def interrupt(self, db: DbConnection) -> None:
        # A shutdown through a duplicate of the socket ends the read psycopg waits in (it polls
        # the socket: it becomes readable, at its end) without closing libpq's descriptor,
        # which the blocked thread still uses.
        with contextlib.suppress(Exception):  # closed meanwhile: nothing to interrupt
            fd = cast("psycopg.Connection[Any]", db).pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    def table(self, name: str) -> str:
        problem = address_problem("postgresql", name)
        if problem is not None:
            raise ConfigError(problem)
        return f"{double_quote(self.schema)}.{double_quote(name)}"

    def canonical_address(self, name: str) -> str:
        return f"{double_quote(self.schema)}.{double_quote(name)}"

    def quote(self, identifier: str) -> str:
        return double_quote(identifier)

    def param_safe(self, sql: str) -> str:
        return sql.replace("%", "%%")  # psycopg reads `%` as a placeholder

    send_stage = "pg_temp.bridge_send"

    def stage_rows(self, db: DbConnection, rows: Sequence[Sequence[Any]]) -> None:
        cursor = cast("psycopg.Cursor[Any]", db.cursor())
        # In every staged send's transaction, not once per connection: behind a pooler that
        # gives each transaction whichever server session is free (PgBouncer's transaction
        # mode) the session is not always the one that created it.
        cursor.execute(
            "CREATE TEMPORARY TABLE IF NOT EXISTS bridge_send (n int4 NOT NULL, id text NOT NULL,"
            " ttl int8, headers text NOT NULL, body bytea) ON COMMIT DELETE ROWS"
        )
        with cursor.copy(
            f"COPY {self.send_stage} (n, id, ttl, headers, body) FROM STDIN (FORMAT BINARY)"
        ) as copy:
            copy.set_types(["int4", "text", "int8", "text", "bytea"])
            write = copy.write_row
            for n, (native_id, ttl_ms, headers, body) in enumerate(rows):
                write((n, native_id, ttl_ms, headers, body))

    def expires_after(self, ms: str) -> str:
        return f"{self.utc_now} + ({ms} || ' ms')::INTERVAL"

    def is_expired(self, column: str) -> str:
        return f"{column} <= {self.utc_now}"

    def expired_flag(self, column: str) -> str:
        now = self.utc_now
        return f"CASE WHEN {column} IS NULL THEN 0 WHEN {column} > {now} THEN 0 ELSE 1 END"

    def remaining_ms(self, column: str) -> str:
        return f"CAST(EXTRACT(EPOCH FROM {column} - {self.utc_now}) * 1000 AS bigint)"

    def take(self, n: str) -> str:
        return f"LIMIT {n} FOR UPDATE SKIP LOCKED"

    def byte_length(self, column: str) -> str:
        return f"octet_length({column})"

    def uuid_text(self, column: str) -> str:
        # The native id is a string; a uuid.UUID per row only to format it costs.
        return f"{column}::text"

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
                f"INSERT INTO {self.param_safe(t)} (name, position) VALUES (%s, %s)\n"
                "ON CONFLICT (name) DO UPDATE SET position = EXCLUDED.position"
            ),
            load=f"SELECT name, position FROM {t}",
            insert_new=(
                f"INSERT INTO {self.param_safe(t)} (name, position) VALUES (%s, %s)\n"
                "ON CONFLICT (name) DO NOTHING"
            ),
            advance=(
                f"UPDATE {self.param_safe(t)} SET position = %s WHERE name = %s AND position = %s"
            ),
        )

    def table_exists(self, db: DbConnection, name: str) -> bool:
        query = "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s"
        return scalar(db, query, (self.schema, name)) is not None
