"""SQL Server without a server: statement text against golden strings, T-SQL parsing, parameter
shapes, and the transport's calls through a scripted stand-in for a pyodbc connection.

The golden strings are wire-format §1 and seed 000 with `{0}` written out as a three-part name
whose parts hold `]`, dots and spaces.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from bridge.config.models import SqlServerConnection
from bridge.envelope import Envelope, Headers, PoisonMessage
from bridge.errors import MessageRejected, TransportError, TransportUnavailable
from bridge.nservicebus.deadletter import RAW_HEADERS
from bridge.transports.sql import Transport
from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.base import DbConnection
from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
from bridge.transports.sql.layouts.base import incoming, outgoing, received_rows

CATALOG, SCHEMA, TABLE = "my]db", "d.b o", "Sales.De layed]"
T = "[my]]db].[d.b o].[Sales.De layed]]]"  # {0}
C = "[my]]db]"  # {1}

SEND_PARAMS = (
    "DECLARE @Id uniqueidentifier = ?, @TimeToBeReceivedMs int = ?, "
    "@Headers nvarchar(max) = ?, @Body varbinary(max) = ?;\n"
)

GOLDEN_DML = {
    "send": SEND_PARAMS
    + f"""INSERT INTO {T} (Id, Recoverable, Expires, Headers, Body)
VALUES (@Id, 1, CASE WHEN @TimeToBeReceivedMs IS NOT NULL
                     THEN DATEADD(ms, @TimeToBeReceivedMs, GETUTCDATE()) END, @Headers, @Body);""",
    "send_without_recoverable": SEND_PARAMS
    + f"""INSERT INTO {T} (Id, Expires, Headers, Body)
VALUES (@Id, CASE WHEN @TimeToBeReceivedMs IS NOT NULL
                  THEN DATEADD(ms, @TimeToBeReceivedMs, GETUTCDATE()) END, @Headers, @Body);""",
    "receive": f"""DECLARE @n int = ?;
WITH message AS (SELECT TOP(@n) * FROM {T} WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion)
DELETE FROM message
OUTPUT deleted.Id,
       CASE WHEN deleted.Expires IS NULL THEN 0
            ELSE CASE WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END END,
       deleted.Headers, deleted.Body,
       CAST(ROUND((CAST(deleted.Expires AS float) - CAST(GETUTCDATE() AS float)) * 86400000, 0) AS bigint), deleted.RowVersion;""",  # noqa: E501
    "depth": "SELECT isnull(cast(max([RowVersion]) - min([RowVersion]) + 1 AS int), 0) "
    f"FROM {T} WITH (READPAST, READCOMMITTEDLOCK)",
    "oldest": f"SELECT TOP(1) Headers FROM {T} WITH (READPAST) ORDER BY RowVersion",
    "expired": f"SELECT COUNT(*) FROM {T} WITH (READPAST) WHERE Expires < GETUTCDATE()",
    "purge_expired": f"""DECLARE @BatchSize int = ?;
DELETE FROM {T} WHERE RowVersion IN (SELECT TOP (@BatchSize) RowVersion FROM {T} WITH (READPAST) WHERE Expires < GETUTCDATE())""",  # noqa: E501
    "checkpoint_upsert": f"""MERGE {T} WITH (HOLDLOCK) AS target
USING (SELECT ? AS Name, ? AS Position) AS source
ON target.Name = source.Name
WHEN MATCHED THEN UPDATE SET Position = source.Position
WHEN NOT MATCHED THEN INSERT (Name, Position) VALUES (source.Name, source.Position);""",
    "checkpoint_load": f"SELECT Name, Position FROM {T}",
    "checkpoint_insert_new": f"""MERGE {T} WITH (HOLDLOCK) AS target
USING (SELECT ? AS Name, ? AS Position) AS source
ON target.Name = source.Name
WHEN NOT MATCHED THEN INSERT (Name, Position) VALUES (source.Name, source.Position);""",
    "checkpoint_advance": f"UPDATE {T} SET Position = ? WHERE Name = ? AND Position = ?;",
}

GOLDEN_CHECKS = {
    "index_expires_count": f"""SELECT COUNT(*)
FROM {C}.sys.indexes
WHERE name = 'Index_Expires'
AND object_id = OBJECT_ID(N'{T}')""",
    "headers_type": f"""SELECT t.name
FROM {C}.sys.columns c
INNER JOIN {C}.sys.types t ON c.system_type_id = t.system_type_id
WHERE c.object_id = OBJECT_ID(N'{T}')
AND c.name = 'Headers'""",
}

GUARD_OPEN = """IF EXISTS (
SELECT *
FROM {1}.sys.objects
WHERE object_id = OBJECT_ID(N'{0}')
AND type in (N'U'))
RETURN
EXEC sp_getapplock @Resource = '{0}_lock', @LockMode = 'Exclusive'
IF EXISTS (
SELECT *
FROM {1}.sys.objects
WHERE object_id = OBJECT_ID(N'{0}')
AND type in (N'U'))
BEGIN
EXEC sp_releaseapplock @Resource = '{0}_lock'
RETURN
END
BEGIN TRY
"""
GUARD_CLOSE = """
END TRY
BEGIN CATCH
EXEC sp_releaseapplock @Resource = '{0}_lock';
THROW;
END CATCH;
EXEC sp_releaseapplock @Resource = '{0}_lock'"""

CREATE_QUEUE_TABLE = """CREATE TABLE {0} (
Id uniqueidentifier NOT NULL,
CorrelationId varchar(255),
ReplyToAddress varchar(255),
Recoverable bit NOT NULL,
Expires datetime,
Headers nvarchar(max) NOT NULL,
Body varbinary(max),
RowVersion bigint IDENTITY(1,1) NOT NULL
);"""
CREATE_INDEX_ROWVERSION = """CREATE NONCLUSTERED INDEX Index_RowVersion ON {0}
(
[RowVersion] ASC
)"""
CREATE_INDEX_EXPIRES = """CREATE NONCLUSTERED INDEX Index_Expires ON {0}
(
Expires
)
INCLUDE
(
Id,
RowVersion
)
WHERE
Expires IS NOT NULL"""
CREATE_CHECKPOINTS = """CREATE TABLE {0} (
Name nvarchar(450) NOT NULL PRIMARY KEY,
Position bigint NOT NULL
);"""

#: seed 000 "Installation", as one batch
SEED_CREATE_QUEUE = (
    GUARD_OPEN
    + "\n".join((CREATE_QUEUE_TABLE, CREATE_INDEX_ROWVERSION, CREATE_INDEX_EXPIRES))
    + GUARD_CLOSE
)


def fill(template: str, table: str = T, catalog: str = C) -> str:
    return template.replace("{0}", table).replace("{1}", catalog)


def config(catalog: str | None = CATALOG, schema: str = SCHEMA, **more: Any) -> SqlServerConnection:
    return SqlServerConnection.model_validate(
        {"type": "sqlserver", "dsn": "Driver=FreeTDS;Server=nowhere", "schema": schema}
        | ({"catalog": catalog} if catalog else {})
        | more
    )


@pytest.fixture
def dialect() -> SqlServerDialect:
    return SqlServerDialect("legacy", config())


def parse(statement: str) -> list[Any]:
    parsed = sqlglot.parse(statement, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(e is not None and not isinstance(e, exp.Command) for e in parsed), parsed
    return list(parsed)


def queue_tables(tree: Any) -> list[tuple[str, str, str]]:
    return [(t.catalog, t.db, t.name) for t in tree.find_all(exp.Table) if t.name != "message"]


# -- names -----------------------------------------------------------------------------------


def test_three_part_names_bracket_every_part_and_double_closing_brackets(
    dialect: SqlServerDialect,
) -> None:
    assert dialect.table(TABLE) == T
    no_catalog = SqlServerDialect("legacy", config(catalog=None, schema="dbo"))
    assert no_catalog.table("Sales") == "[dbo].[Sales]"


def test_canonical_address_is_table_at_schema_at_catalog(dialect: SqlServerDialect) -> None:
    assert dialect.canonical_address(TABLE) == "Sales.De layed]@[d.b o]@[my]]db]"
    nsb = SqlServerDialect("legacy", config(catalog="nservicebus", schema="dbo"))
    assert nsb.canonical_address("Sales") == "Sales@[dbo]@[nservicebus]"


def test_without_a_catalog_no_address_is_made_before_the_database_is_known() -> None:
    """An address without its catalog is not the one NServiceBus writes (see below)."""
    with pytest.raises(TransportError, match="database"):
        SqlServerDialect("x", config(None, "dbo")).canonical_address("Sales")


# -- golden text -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN_DML))
def test_statement_text_is_golden(name: str) -> None:
    assert getattr(tsql, name)(T) == GOLDEN_DML[name]


@pytest.mark.parametrize("name", sorted(GOLDEN_CHECKS))
def test_check_statements_are_the_transports_own(name: str) -> None:
    assert getattr(tsql, name)(T, CATALOG) == GOLDEN_CHECKS[name]


def test_dialect_hands_out_the_golden_statements(dialect: SqlServerDialect) -> None:
    statements = dialect.queue_statements(TABLE)
    assert statements.create == (fill(SEED_CREATE_QUEUE),)
    for field in ("send", "receive", "depth", "oldest", "expired", "purge_expired"):
        assert getattr(statements, field) == GOLDEN_DML[field], field
    checkpoints = dialect.checkpoint_statements()
    cp = "[my]]db].[d.b o].[BridgeCheckpoints]"
    assert checkpoints.create == (fill(GUARD_OPEN + CREATE_CHECKPOINTS + GUARD_CLOSE, table=cp),)
    assert checkpoints.upsert == GOLDEN_DML["checkpoint_upsert"].replace(T, cp)
    assert checkpoints.load == f"SELECT Name, Position FROM {cp}"
    assert checkpoints.insert_new == GOLDEN_DML["checkpoint_insert_new"].replace(T, cp)
    assert checkpoints.advance == GOLDEN_DML["checkpoint_advance"].replace(T, cp)


def test_create_script_is_the_seed_script_with_real_names() -> None:
    assert tsql.create_queue(T, CATALOG) == fill(SEED_CREATE_QUEUE)
    assert tsql.create_queue("[dbo].[Sales]", None) == fill(
        SEED_CREATE_QUEUE, table="[dbo].[Sales]", catalog="sys"
    ).replace("FROM sys.sys.objects", "FROM sys.objects")


def test_quotes_in_names_are_doubled_inside_string_literals() -> None:
    script = tsql.create_queue("[dbo].[it's]", None)
    assert "OBJECT_ID(N'[dbo].[it''s]')" in script
    assert "@Resource = '[dbo].[it''s]_lock'" in script
    assert "CREATE TABLE [dbo].[it's] (" in script
    assert "OBJECT_ID(N'[dbo].[it''s]')" in tsql.index_expires_count("[dbo].[it's]", None)
    assert "OBJECT_ID(N'[dbo].[it''s]')" in tsql.headers_type("[dbo].[it's]", None)


def test_install_runs_the_exact_ddl() -> None:
    transport = Transport("legacy", config())
    delayed = "[my]]db].[d.b o].[Sales.De layed]].Delayed]"
    assert transport.install_statements([TABLE, TABLE]) == [
        fill(SEED_CREATE_QUEUE),
        tsql.create_delayed_store(delayed, CATALOG),  # tests/unit/test_sql_delayed.py
        fill(GUARD_OPEN + CREATE_CHECKPOINTS + GUARD_CLOSE, "[my]]db].[d.b o].[BridgeCheckpoints]"),
    ]


#: `bridge install --print-sql` for `BridgeCheckpoints` in [dbo] without a catalog, in full.
PRINTED_CHECKPOINTS = """SET QUOTED_IDENTIFIER ON;
SET ANSI_NULLS ON;
SET XACT_ABORT ON;
BEGIN TRANSACTION;
EXEC sp_executesql N'IF EXISTS (
SELECT *
FROM sys.objects
WHERE object_id = OBJECT_ID(N''[dbo].[BridgeCheckpoints]'')
AND type in (N''U''))
RETURN
EXEC sp_getapplock @Resource = ''[dbo].[BridgeCheckpoints]_lock'', @LockMode = ''Exclusive''
IF EXISTS (
SELECT *
FROM sys.objects
WHERE object_id = OBJECT_ID(N''[dbo].[BridgeCheckpoints]'')
AND type in (N''U''))
BEGIN
EXEC sp_releaseapplock @Resource = ''[dbo].[BridgeCheckpoints]_lock''
RETURN
END
BEGIN TRY
CREATE TABLE [dbo].[BridgeCheckpoints] (
Name nvarchar(450) NOT NULL PRIMARY KEY,
Position bigint NOT NULL
);
END TRY
BEGIN CATCH
EXEC sp_releaseapplock @Resource = ''[dbo].[BridgeCheckpoints]_lock'';
THROW;
END CATCH;
EXEC sp_releaseapplock @Resource = ''[dbo].[BridgeCheckpoints]_lock''';
COMMIT;
GO"""


async def test_print_only_install_is_one_standalone_batch_per_table() -> None:
    """Each printed script runs in sqlcmd or SSMS as is: QUOTED_IDENTIFIER and ANSI_NULLS ON,
    which the filtered Index_Expires needs and classic sqlcmd without `-I` does not set (the
    transport's scripts run through SqlClient, which sets both), its own transaction
    (sp_getapplock's owner), its RETURN inside a dynamic batch so it cannot skip the tables
    after it, GO after."""
    plain = Transport("legacy", config(catalog=None, schema="dbo"))
    odd = Transport("legacy", config())
    try:
        assert await plain.install([], print_only=True) == [PRINTED_CHECKPOINTS]
        printed = await odd.install([TABLE, "it's"], print_only=True)
    finally:
        await plain.close()
        await odd.close()
    executed = odd.install_statements([TABLE, "it's"])
    assert len(printed) == len(executed) == 5  # two tables, their delayed tables, checkpoints
    for script, batch in zip(executed, printed, strict=True):
        literal = script.replace("'", "''")
        assert batch == (
            "SET QUOTED_IDENTIFIER ON;\nSET ANSI_NULLS ON;\nSET XACT_ABORT ON;\n"
            f"BEGIN TRANSACTION;\nEXEC sp_executesql N'{literal}';\nCOMMIT;\nGO"
        )


def go_batches(printed: str) -> list[str]:
    """The batches sqlcmd sends to the server: the text between lines that are `GO`."""
    found, current = [], []
    for line in printed.splitlines():
        if line.strip() == "GO":
            found.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    assert not "\n".join(current).strip(), "text after the last GO"
    return found


@pytest.mark.parametrize("catalog", [CATALOG, None])
def test_printed_batches_parse_as_tsql_around_the_exact_script(catalog: str | None) -> None:
    transport = Transport("legacy", config(catalog=catalog))
    executed = transport.install_statements([TABLE, "it's", "Sales"])
    batches = go_batches("\n\n".join(transport.dialect.printable(executed)) + "\n")
    assert len(batches) == len(executed) == 7  # three tables, their delayed tables, checkpoints
    for script, batch in zip(executed, batches, strict=True):
        trees = parse(batch)
        kinds = [type(tree).__name__ for tree in trees]
        assert kinds == ["Set", "Set", "Set", "Transaction", "ExecuteSql", "Commit"]
        options = [tree.sql(dialect="tsql") for tree in trees[:3]]
        assert options == ["SET QUOTED_IDENTIFIER ON", "SET ANSI_NULLS ON", "SET XACT_ABORT ON"]
        (literal,) = trees[4].expressions
        assert isinstance(literal, exp.National) and literal.this == script


# -- T-SQL parsing -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GOLDEN_DML))
def test_statements_parse_as_tsql_on_the_right_table(name: str) -> None:
    trees = parse(GOLDEN_DML[name])
    kinds = [type(tree).__name__ for tree in trees]
    expected = {
        "send": ["Declare", "Insert"],
        "send_without_recoverable": ["Declare", "Insert"],
        "receive": ["Declare", "Delete"],
        "purge_expired": ["Declare", "Delete"],
        "checkpoint_upsert": ["Merge"],
        "checkpoint_insert_new": ["Merge"],
        "checkpoint_advance": ["Update"],
    }.get(name, ["Select"])
    assert kinds == expected
    tables = {t for tree in trees for t in queue_tables(tree)}
    assert tables == {(CATALOG, SCHEMA, TABLE)}


@pytest.mark.parametrize(
    "statement",
    [
        CREATE_QUEUE_TABLE,
        CREATE_INDEX_ROWVERSION,
        CREATE_INDEX_EXPIRES,
        CREATE_CHECKPOINTS,
    ],
)
def test_ddl_statements_of_the_script_parse_one_by_one(statement: str) -> None:
    (tree,) = parse(fill(statement))
    assert isinstance(tree, exp.Create)
    assert queue_tables(tree) == [(CATALOG, SCHEMA, TABLE)]


def test_ddl_pieces_are_the_ones_in_the_script() -> None:
    script = tsql.create_queue(T, CATALOG)
    for piece in (tsql.create_queue_table, tsql.create_index_rowversion, tsql.create_index_expires):
        assert piece(T) in script
    assert tsql.checkpoint_table(T) in tsql.checkpoint_create(T, CATALOG)
    assert tsql.checkpoint_table(T) == fill(CREATE_CHECKPOINTS)


@pytest.mark.parametrize(
    "statement",
    [
        *GOLDEN_CHECKS.values(),
        tsql.has_recoverable(CATALOG),
        tsql.EXISTS,
        fill(GUARD_OPEN.split("RETURN")[0] + "RETURN"),
    ],
)
def test_check_and_probe_statements_parse(statement: str) -> None:
    parse(statement)


# -- parameter shapes --------------------------------------------------------------------------


def placeholders(statement: str) -> int:
    return statement.count("?")


def test_send_parameters_are_uuid_ms_headers_body(dialect: SqlServerDialect) -> None:
    now = time.time()
    headers = Headers([("NServiceBus.MessageId", "m-1"), ("a/b", "é"), ("n", None)])
    live = Envelope(headers, b"body", expires_at=now + 60)
    forever = Envelope(Headers(), b"")
    params = [dialect.send_params(outgoing(e, now)) for e in (live, forever)]
    for row in params:
        assert len(row) == placeholders(GOLDEN_DML["send"]) == 4
        uuid.UUID(row[0])
        assert isinstance(row[2], str) and isinstance(row[3], bytes)
    assert params[0][1:] == (
        60_000,
        '{"NServiceBus.MessageId":"m-1","a\\/b":"é","n":null}',
        b"body",
    )
    assert params[1][1:] == (None, "{}", b"")
    assert params[0][0] != params[1][0]


def test_ttl_beyond_int32_milliseconds_means_no_expiry(dialect: SqlServerDialect) -> None:
    now = time.time()

    def ttl(seconds: float) -> object:
        envelope = Envelope(Headers(), b"", expires_at=now + seconds)
        return dialect.send_params(outgoing(envelope, now))[1]

    assert ttl(tsql.INT32_MAX / 1000) == tsql.INT32_MAX
    assert ttl(tsql.INT32_MAX / 1000 + 1) is None
    assert ttl(30 * 86_400) is None
    assert ttl(-5) == 0  # already spent: expires at once, the receiver drops it


def every_statement(dialect: SqlServerDialect) -> list[str]:
    statements = dialect.queue_statements(TABLE)
    checkpoints = dialect.checkpoint_statements()
    return [
        *statements.create,
        *(getattr(statements, f) for f in statements.__dataclass_fields__ if f != "create"),
        *checkpoints.create,
        checkpoints.upsert,
        checkpoints.load,
        checkpoints.insert_new,
        checkpoints.advance,
        tsql.send_without_recoverable(T),
        dialect.remaining_ms("Expires"),
    ]


def test_no_statement_needs_sql_server_2016(dialect: SqlServerDialect) -> None:
    """The transport runs on servers older than 2016, where DATEDIFF_BIG does not exist; its
    own receive reads no remaining lifetime at all (NServiceBus.SqlServer@214c4e8,
    src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs:84-107)."""
    found = [s for s in every_statement(dialect) if "DATEDIFF_BIG" in s.upper()]
    assert found == []


def datetime_as_float(value: datetime) -> float:
    """SQL Server's CAST(datetime AS float): days since 1900-01-01, the time of day in 1/300 s
    ticks as the fraction (a datetime holds whole ticks)."""
    since = value - datetime(1900, 1, 1)
    ticks = round((since.seconds + since.microseconds / 1e6) * 300)
    return since.days + ticks / (300 * 86_400)


@pytest.mark.parametrize(
    ("now", "expires", "ms"),
    [
        (datetime(2026, 5, 1, 12), datetime(2026, 5, 1, 12, 0, 0, 3_333), 3),
        (datetime(2026, 5, 1, 12, 0, 0, 996_667), datetime(2026, 5, 1, 12, 0, 1), 3),
        (datetime(2026, 5, 1, 12), datetime(2026, 5, 1, 12, 0, 0, 500_000), 500),
        (datetime(2026, 5, 1, 12), datetime(2026, 5, 26, 12), 25 * 86_400_000),  # past DATEDIFF(ms)
        (datetime(2026, 5, 1, 12), datetime(9999, 12, 31, 23, 59, 59, 996_667), None),
        (datetime(2026, 5, 1, 12), datetime(1753, 1, 1), None),
        (datetime(2026, 5, 1, 12, 0, 0, 3_333), datetime(2026, 5, 1, 12), -3),
    ],
)
def test_remaining_ms_is_the_millisecond_difference_anywhere_in_datetime_range(
    now: datetime, expires: datetime, ms: int | None
) -> None:
    """The receive's remaining lifetime, `tsql.remaining_ms`, modelled in Python: float days
    keep every millisecond across the whole `datetime` range (1753 to 9999)."""
    assert tsql.remaining_ms("x") == (
        "CAST(ROUND((CAST(x AS float) - CAST(GETUTCDATE() AS float)) * 86400000, 0) AS bigint)"
    )
    exact = (expires - now) / timedelta(milliseconds=1)
    got = round((datetime_as_float(expires) - datetime_as_float(now)) * 86_400_000)
    assert abs(got - exact) < 1
    if ms is not None:
        assert got == ms


def test_other_parameter_shapes() -> None:
    assert placeholders(GOLDEN_DML["receive"]) == 1
    assert placeholders(GOLDEN_DML["purge_expired"]) == 1
    assert placeholders(GOLDEN_DML["checkpoint_upsert"]) == 2
    assert placeholders(GOLDEN_DML["checkpoint_insert_new"]) == 2
    assert placeholders(GOLDEN_DML["checkpoint_advance"]) == 3
    assert placeholders(tsql.has_recoverable(None)) == 1
    assert placeholders(tsql.EXISTS) == 1


def test_output_rows_map_to_envelopes_in_rowversion_order() -> None:
    now = time.time()
    rows = received_rows(
        [  # OUTPUT order is not guaranteed: RowVersion (the sixth column) is
            ("C3D4", 0, "not json", b"p", None, 12),
            ("B0C9", 0, '{"NServiceBus.MessageId":"a"}', b"x", 60_000, 7),
            ("A1F2", 1, '{"NServiceBus.MessageId":"b"}', None, -10, 9),
        ]
    )
    assert [r.native_id for r in rows] == ["B0C9", "A1F2", "C3D4"]
    first = incoming(rows[0], now)
    assert isinstance(first, Envelope) and first.expires_at == pytest.approx(now + 60)
    assert rows[1].expired and rows[1].body == b""
    poison = incoming(rows[2], now)
    assert isinstance(poison, PoisonMessage) and poison.raw_headers == "not json"


# -- through the transport, against a scripted connection -------------------------------------


class ScriptedCursor:
    def __init__(self, db: ScriptedConnection) -> None:
        self._db = db
        self._sets: list[list[tuple[Any, ...]] | None] = []
        self.description: Any = None
        self.rowcount = -1
        self._rows: Iterator[tuple[Any, ...]] = iter(())

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> object:
        self._db.log.append(("execute", sql, tuple(params)))
        self._sets = list(self._db.answer(sql))
        self._next()
        return self

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> object:
        for row in params:
            self._db.log.append(("executemany", sql, tuple(row)))
        return self

    def _next(self) -> bool:
        if not self._sets:
            self.description = None
            return False
        result = self._sets.pop(0)
        self.description = None if result is None else [("column",)]
        self._rows = iter(result or ())
        return True

    def nextset(self) -> bool:
        return self._next()

    def fetchone(self) -> tuple[Any, ...] | None:
        return next(self._rows, None)

    def fetchall(self) -> list[tuple[Any, ...]]:
        return list(self._rows)

    def close(self) -> None:
        pass


class ScriptedConnection:
    """Answers like SQL Server would for the statements the transport sends."""

    def __init__(
        self,
        recoverable: bool,
        receive: list[tuple[Any, ...]],
        index_expires: int = 1,
        headers_types: tuple[str, ...] = ("nvarchar", "sysname"),
        database: str = "nservicebus",
    ) -> None:
        self.log: list[tuple[str, str, tuple[Any, ...]]] = []
        self.connects = 0
        self.database = database
        self.recoverable = recoverable
        self.receive = receive
        self.index_expires = index_expires
        self.headers_types = headers_types

    def answer(self, sql: str) -> list[list[tuple[Any, ...]] | None]:
        if sql == tsql.EXISTS:
            return [[(1234,)]]
        if "'Index_Expires'" in sql:
            return [[(self.index_expires,)]]
        if sql.startswith("SELECT t.name"):
            return [[(name,) for name in self.headers_types]]
        if sql.startswith("SELECT COUNT(*) FROM") and "'Recoverable'" in sql:
            return [[(1 if self.recoverable else 0,)]]
        if sql.startswith("DECLARE @n int"):
            rows, self.receive = self.receive, []
            return [None, rows]  # a row count in front of the OUTPUT result set
        if sql == "SELECT DB_NAME()":
            return [[(self.database,)]]
        if sql == "SELECT @@MAX_CONNECTIONS":
            return [[(32767,)]]
        return [None]

    def cursor(self) -> ScriptedCursor:
        return ScriptedCursor(self)

    def commit(self) -> None:
        self.log.append(("commit", "", ()))

    def rollback(self) -> None:
        self.log.append(("rollback", "", ()))

    def close(self) -> None:
        self.log.append(("close", "", ()))


def scripted(
    monkeypatch: pytest.MonkeyPatch,
    db: ScriptedConnection,
    catalog: str | None = CATALOG,
    schema: str = SCHEMA,
    **more: Any,
) -> Transport:
    """A transport whose every `pyodbc.connect` opens `db` (no SQL Server runs here), counted
    in `db.connects`."""
    import pyodbc

    def connect(dsn: str, *, autocommit: bool) -> ScriptedConnection:
        assert autocommit is False
        db.connects += 1
        return db

    monkeypatch.setattr(pyodbc, "connect", connect)
    return Transport("legacy", config(catalog, schema, **more))


async def test_send_writes_recoverable_only_when_the_column_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for recoverable, statement in ((True, "send"), (False, "send_without_recoverable")):
        db = ScriptedConnection(recoverable, [])
        transport = scripted(monkeypatch, db)
        sink = transport.sink(TABLE)
        try:
            live = Envelope(Headers([("k", "v")]), b"x", expires_at=time.time() + 60)
            await sink.send([live, Envelope(Headers(), b"")])
            await sink.send([Envelope(Headers(), b"y")])
        finally:
            await transport.close()
        probes = [entry for entry in db.log if "'Recoverable'" in entry[1]]
        assert probes == [("execute", tsql.has_recoverable(CATALOG), (T,))]  # once per table
        inserts = [entry for entry in db.log if entry[0] == "executemany"]
        assert {sql for _, sql, _ in inserts} == {GOLDEN_DML[statement]}
        assert [len(params) for _, _, params in inserts] == [4, 4, 4]
        assert 59_000 < inserts[0][2][1] <= 60_000
        assert [p[1:] for _, _, p in inserts[1:]] == [(None, "{}", b""), (None, "{}", b"y")]
        assert [kind for kind, _, _ in db.log].count("commit") == 2


async def test_receive_moves_poison_and_drops_expired_in_one_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [
        ("ID-3", 0, "not json", b"p", None, 3),
        ("ID-1", 0, '{"NServiceBus.MessageId":"a"}', b"x", 60_000, 1),
        ("ID-2", 1, '{"NServiceBus.MessageId":"b"}', b"y", -5, 2),
    ]
    db = ScriptedConnection(True, rows)
    transport = scripted(monkeypatch, db)
    source = transport.source(TABLE, error_queue="error")
    try:
        batch = await source.receive_batch(5, 1.0)
        assert [m.message_id for m in batch.messages] == ["a"]
        assert batch.expired == 1 and [p.native_id for p in batch.poison] == ["ID-3"]
        await batch.commit()
    finally:
        await transport.close()
    assert db.log[0] == ("execute", GOLDEN_DML["receive"], (5,))
    moved = [entry for entry in db.log if entry[0] == "executemany"]
    assert len(moved) == 1
    _, sql, params = moved[0]
    assert sql == tsql.send("[my]]db].[d.b o].[error]")
    assert params[0] != "ID-3" and params[1] is None and params[3] == b"p"
    copy = json.loads(params[2])
    assert copy[RAW_HEADERS] == "not json" and copy["NServiceBus.MessageId"] == "ID-3"
    assert copy["NServiceBus.FailedQ"] == "Sales.De layed]@[d.b o]@[my]]db]"
    assert copy["NServiceBus.ExceptionInfo.ExceptionType"] == "HeadersFormatError"
    kinds = [kind for kind, _, _ in db.log]
    assert kinds.index("executemany") < kinds.index("commit")


async def test_without_a_catalog_addresses_carry_the_database_read_at_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NServiceBus's canonical address always carries a catalog (NServiceBus.SqlServer@214c4e8,
    src/NServiceBus.Transport.SqlServer/Addressing/CanonicalQueueAddress.cs:7-11, 29-32: the
    catalog may not be empty, and the form is `table@[schema]@[catalog]`), the connection
    string's database when the endpoint configures none (ConnectionAttributesParser.cs:14-25).
    Without `catalog`, the bridge asks the connection for its database once, and an error copy
    names its queue as an endpoint of that database would."""
    db = ScriptedConnection(True, [("ID-3", 0, "not json", b"p", None, 3)], database="shop]s")
    transport = scripted(monkeypatch, db, catalog=None, schema="dbo")
    source = transport.source("Sales", error_queue="error")
    sink = transport.sink("Audit")
    try:
        await sink.send([Envelope(Headers([("NServiceBus.MessageId", "a")]), b"")])
        batch = await source.receive_batch(5, 1.0)
        await batch.commit()
        assert transport.canonical_address("Sales") == "Sales@[dbo]@[shop]]s]"
    finally:
        await transport.close()
    asked = [entry for entry in db.log if entry[1] == "SELECT DB_NAME()"]
    assert asked == [("execute", tsql.DATABASE_NAME, ())]  # once, on the first connection
    (copy_row,) = [params for kind, sql, params in db.log if "[dbo].[error]" in sql]
    assert json.loads(copy_row[2])["NServiceBus.FailedQ"] == "Sales@[dbo]@[shop]]s]"
    receive = next(sql for kind, sql, _ in db.log if sql.startswith("DECLARE @n int"))
    assert "FROM [dbo].[Sales] WITH" in receive  # names stay those of the connection's database


async def test_check_warns_about_old_tables_with_the_transports_queries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    current = scripted(monkeypatch, ScriptedConnection(True, []))
    try:
        assert await current.check([TABLE]) == []
    finally:
        await current.close()
    db = ScriptedConnection(True, [], index_expires=0, headers_types=("varchar",))
    old = scripted(monkeypatch, db)
    try:
        warnings = await old.check([TABLE])
    finally:
        await old.close()
    assert len(warnings) == 2
    assert "Index_Expires" in warnings[0] and "varchar" in warnings[1]
    executed = [sql for kind, sql, _ in db.log if kind == "execute"]
    assert GOLDEN_CHECKS["index_expires_count"] in executed
    assert GOLDEN_CHECKS["headers_type"] in executed


async def test_an_unreachable_server_is_retriable(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyodbc

    def connect(self: SqlServerDialect) -> DbConnection:
        raise pyodbc.OperationalError("08001", "[08001] TCP Provider: Error code 0x2749 (10057)")

    monkeypatch.setattr(SqlServerDialect, "connect", connect)
    transport = Transport("legacy", config())
    try:
        with pytest.raises(TransportUnavailable, match="sqlserver connection 'legacy'"):
            await transport.check([TABLE])
    finally:
        await transport.close()


def test_driver_errors_are_sorted_by_whether_they_go_away(dialect: SqlServerDialect) -> None:
    import pyodbc

    deadlock = pyodbc.Error("40001", "[40001] Transaction was deadlocked (1205)")
    missing = pyodbc.ProgrammingError("42S02", "[42S02] Invalid object name 'x'. (208)")
    timeout = pyodbc.OperationalError("HYT00", "[HYT00] Query timeout expired (0)")
    truncated = pyodbc.DataError("22001", "[22001] String or binary data would be truncated")
    assert isinstance(dialect.translate(deadlock), TransportUnavailable)
    assert isinstance(dialect.translate(timeout), TransportUnavailable)
    error = dialect.translate(missing)
    assert isinstance(error, TransportError) and not error.retriable
    assert not isinstance(error, MessageRejected)
    refused = dialect.translate(truncated)  # one row the table can never take
    assert isinstance(refused, MessageRejected) and refused.index is None
    assert dialect.translate(ValueError("not a driver error")) is None


# -- RowVersion ranges (bulk jobs: bridge.migrate, bridge report) ------------------------------

OUTPUT_DELETED = """DELETE FROM message
OUTPUT deleted.Id,
       CASE WHEN deleted.Expires IS NULL THEN 0
            ELSE CASE WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END END,
       deleted.Headers, deleted.Body,
       CAST(ROUND((CAST(deleted.Expires AS float) - CAST(GETUTCDATE() AS float)) * 86400000, 0) AS bigint), deleted.RowVersion;"""  # noqa: E501

GOLDEN_RANGE = {
    "receive_range": f"""DECLARE @lo bigint = ?, @hi bigint = ?, @n int = ?;
WITH message AS (SELECT TOP(@n) * FROM {T} WITH (UPDLOCK, READPAST, ROWLOCK) WHERE RowVersion BETWEEN @lo AND @hi ORDER BY RowVersion)
"""  # noqa: E501
    + OUTPUT_DELETED,
    "bounds": f"SELECT min(RowVersion), max(RowVersion) FROM {T} WITH (READPAST)",
    "count_range": f"""DECLARE @lo bigint = ?, @hi bigint = ?;
SELECT COUNT_BIG(*) FROM {T} WITH (READPAST) WHERE RowVersion BETWEEN @lo AND @hi""",
    "scan_range": f"""DECLARE @after bigint = ?, @hi bigint = ?, @n int = ?;
SELECT TOP(@n) Id,
       CASE WHEN Expires IS NULL THEN 0
            ELSE CASE WHEN Expires > GETUTCDATE() THEN 0 ELSE 1 END END,
       Headers, DATALENGTH(Body), RowVersion
FROM {T} WITH (READPAST)
WHERE RowVersion > @after AND RowVersion <= @hi ORDER BY RowVersion""",
}


@pytest.mark.parametrize("name", sorted(GOLDEN_RANGE))
def test_range_statement_text_is_golden(name: str, dialect: SqlServerDialect) -> None:
    assert getattr(tsql, name)(T) == GOLDEN_RANGE[name]
    assert getattr(dialect.queue_statements(TABLE), name) == GOLDEN_RANGE[name]


def test_range_receive_is_the_receive_with_a_rowversion_range() -> None:
    receive, ranged = GOLDEN_DML["receive"], GOLDEN_RANGE["receive_range"]
    assert receive.endswith(OUTPUT_DELETED) and ranged.endswith(OUTPUT_DELETED)
    assert (
        ranged.replace("WHERE RowVersion BETWEEN @lo AND @hi ", "").replace(
            "@lo bigint = ?, @hi bigint = ?, ", ""
        )
        == receive
    )


@pytest.mark.parametrize("name", sorted(GOLDEN_RANGE))
def test_range_statements_parse_as_tsql_on_the_right_table(name: str) -> None:
    trees = parse(GOLDEN_RANGE[name])
    kinds = [type(tree).__name__ for tree in trees]
    expected = {"receive_range": ["Declare", "Delete"], "bounds": ["Select"]}.get(
        name, ["Declare", "Select"]
    )
    assert kinds == expected
    assert {t for tree in trees for t in queue_tables(tree)} == {(CATALOG, SCHEMA, TABLE)}
    if name != "bounds":
        where = trees[-1].find(exp.Where)
        assert where is not None and "RowVersion" in where.sql(dialect="tsql")


def test_range_parameter_shapes() -> None:
    assert placeholders(GOLDEN_RANGE["receive_range"]) == 3  # (lo, hi, n)
    assert placeholders(GOLDEN_RANGE["count_range"]) == 2  # (lo, hi)
    assert placeholders(GOLDEN_RANGE["scan_range"]) == 3  # (after, hi, n)
    assert placeholders(GOLDEN_RANGE["bounds"]) == 0


class RangeConnection(ScriptedConnection):
    """Also answers the range statements, each with the rows it was given."""

    def __init__(self, receive: list[tuple[Any, ...]], scan: list[tuple[Any, ...]]) -> None:
        super().__init__(True, receive)
        self.scan = scan

    def answer(self, sql: str) -> list[list[tuple[Any, ...]] | None]:
        if sql.startswith("DECLARE @lo bigint = ?, @hi bigint = ?, @n int"):
            rows, self.receive = self.receive, []
            return [None, rows]
        if sql.startswith("DECLARE @after"):
            return [None, self.scan]
        if sql.startswith("SELECT min(RowVersion)"):
            return [[(7, 42)]]
        if sql.startswith("DECLARE @lo bigint = ?, @hi bigint = ?;"):
            return [None, [(36,)]]
        return super().answer(sql)


async def test_range_source_and_reads_through_the_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db = RangeConnection(
        receive=[("A1", 0, '{"NServiceBus.MessageId":"a"}', b"x", None)],
        scan=[("B2", 1, "not json", 12, 9), ("C3", 0, "{}", None, 10)],
    )
    transport = scripted(monkeypatch, db)
    try:
        source = transport.source(TABLE, error_queue="error", seq_range=(7, 20))
        batch = await source.receive_batch(50, 1.0)
        assert [m.message_id for m in batch.messages] == ["a"]
        await batch.commit()
        assert await transport.bounds(TABLE) == (7, 42)
        assert await transport.count_range(TABLE, 7, 20) == 36
        scanned = await transport.scan_range(TABLE, 8, 20, 100)
    finally:
        await transport.close()
    assert ("execute", GOLDEN_RANGE["receive_range"], (7, 20, 50)) in db.log
    assert ("execute", GOLDEN_RANGE["count_range"], (7, 20)) in db.log
    assert ("execute", GOLDEN_RANGE["scan_range"], (8, 20, 100)) in db.log
    assert [(r.native_id, r.expired, r.body_size, r.seq) for r in scanned] == [
        ("B2", True, 12, 9),
        ("C3", False, 0, 10),
    ]


# -- the pool ----------------------------------------------------------------------------------


def test_the_connection_limit_is_read_with_max_connections() -> None:
    """`bridge check --connect` compares what the routes could hold with this."""
    assert tsql.MAX_CONNECTIONS == "SELECT @@MAX_CONNECTIONS"
    (tree,) = parse(tsql.MAX_CONNECTIONS)
    assert isinstance(tree, exp.Select)


async def test_routes_lease_a_pooled_connection_per_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ODBC does not say whether a transaction is open: the dialect counts one from the first
    cursor to the commit or rollback, and the connection goes back to the pool then."""
    rows = [("ID-1", 0, '{"NServiceBus.MessageId":"a"}', b"x", None, 1)]
    db = ScriptedConnection(True, rows)
    transport = scripted(monkeypatch, db, pool_size=1, pool_timeout=0.2)
    sink, source = transport.sink(TABLE), transport.source(TABLE)
    try:
        await sink.send([Envelope(Headers(), b"1")])  # leased, committed, given back
        batch = await source.receive_batch(5, 1.0)  # the same connection, held by the batch
        assert [m.message_id for m in batch.messages] == ["a"]
        assert not source.receives_ahead  # the pool has no other
        with pytest.raises(TransportUnavailable, match="no free connection in its pool of 1"):
            await sink.send([Envelope(Headers(), b"2")])
        await batch.commit()
        await sink.send([Envelope(Headers(), b"2")])  # given back with the commit
        assert transport.connections_needed(receiving=3, sending=0, moving=0) == 2
        allowed = await transport.connections_allowed()
        assert allowed is not None and allowed.available == 32767
    finally:
        await transport.close()
    assert db.connects == 2  # the pool's one; the transport's own, for connections_allowed
    assert db.log[-1] == ("close", "", ())
