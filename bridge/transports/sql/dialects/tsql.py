"""Every T-SQL statement the SQL Server transport runs, as text (wire-format §1, seed 000).

The statements are the NServiceBus SQL Server transport's own, verbatim, with these additions:

- Parameters are bound by a `DECLARE ... = ?` line in front of the statement (pyodbc's
  paramstyle is `?`), so the statement itself keeps its `@Name` parameters unchanged.
  Parameter order is the order of that line:
      send           (@Id uniqueidentifier, @TimeToBeReceivedMs int, @Headers nvarchar(max),
                      @Body varbinary(max)) as (str, int | None, str, bytes)
      receive        (@n int,)
      purge_expired  (@BatchSize int,)
      receive_range  (@lo bigint, @hi bigint, @n int)
      count_range    (@lo bigint, @hi bigint)
      scan_range     (@after bigint, @hi bigint, @n int)
- The receive takes `TOP(@n)` rows instead of `TOP(1)`, and its OUTPUT has two extra columns
  after the spec's four: `remaining_ms(deleted.Expires)`, the remaining lifetime by the
  database clock (NULL when the row never expires), and `deleted.RowVersion`, by which a batch
  is put in FIFO order: OUTPUT order is not guaranteed. The transport reads only the expired
  flag (NServiceBus.SqlServer@214c4e8, src/NServiceBus.Transport.SqlServer/Queuing/
  SqlServerConstants.cs:84-107); the bridge hands the rest of the lifetime on.
- `send_without_recoverable` is the send for tables without the legacy `Recoverable` column.
- The RowVersion-range statements of bulk jobs are this project's: `receive_range` is the
  receive with `WHERE RowVersion BETWEEN @lo AND @hi` in its CTE (same hints, same OUTPUT);
  `bounds`, `count_range` and `scan_range` read with `READPAST`, like the transport's peek, so
  they never wait on rows a receiver holds; `scan_range` outputs `DATALENGTH(Body)`, not Body.
- The checks, the `Recoverable` probe, `DATABASE_NAME`, `MAX_CONNECTIONS` and
  `BridgeCheckpoints` are this project's statements; the two table checks are the
  transport's, prefixed with the catalog where one is configured so they look at the right
  database, and with the name as an `N'...'` literal so names outside the database code page
  are found. Existence checks take the quoted name as a parameter.

`{0}` in the spec is `table_name(...)`: `[catalog].[schema].[table]`, each part bracket-quoted
with `]` doubled. Where the spec puts that name inside a string literal (`N'{0}'`,
`'{0}_lock'`) its `'` are doubled as well.
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_TABLE",
    "DATABASE_NAME",
    "EXISTS",
    "INT32_MAX",
    "MAX_CONNECTIONS",
    "bounds",
    "bracket",
    "checkpoint_advance",
    "checkpoint_create",
    "checkpoint_insert_new",
    "checkpoint_load",
    "checkpoint_table",
    "checkpoint_upsert",
    "count_range",
    "create_delayed_store",
    "create_index_expires",
    "create_index_rowversion",
    "create_queue",
    "create_queue_table",
    "depth",
    "expired",
    "has_recoverable",
    "headers_type",
    "index_expires_count",
    "move_due_delayed",
    "oldest",
    "purge_expired",
    "receive",
    "receive_range",
    "remaining_ms",
    "scan_range",
    "send",
    "send_without_recoverable",
    "standalone_batch",
    "store_delayed",
    "table_name",
]

#: The largest @TimeToBeReceivedMs (Int32): about 24.8 days.
INT32_MAX = 2_147_483_647

CHECKPOINT_TABLE = "BridgeCheckpoints"

#: params (quoted table name,) -> one row: the object id, NULL when there is no such table.
EXISTS = "SELECT OBJECT_ID(?, N'U')"

#: -> one row: the connection's database, the catalog of addresses when none is configured.
DATABASE_NAME = "SELECT DB_NAME()"

#: -> one row: the most simultaneous user connections the server allows (the `user
#: connections` option; 0 there means the maximum, 32,767, which this reports).
MAX_CONNECTIONS = "SELECT @@MAX_CONNECTIONS"

_SEND_PARAMS = (
    "DECLARE @Id uniqueidentifier = ?, @TimeToBeReceivedMs int = ?, "
    "@Headers nvarchar(max) = ?, @Body varbinary(max) = ?;\n"
)


def bracket(part: str) -> str:
    return "[" + part.replace("]", "]]") + "]"


def table_name(table: str, schema: str, catalog: str | None) -> str:
    parts = (catalog, schema, table) if catalog else (schema, table)
    return ".".join(bracket(part) for part in parts)


def _in_literal(text: str) -> str:
    return text.replace("'", "''")


def _sys(catalog: str | None) -> str:
    return f"{bracket(catalog)}.sys" if catalog else "sys"


def _guarded_create(table: str, catalog: str | None, body: str) -> str:
    """The transport's creation guard: exists -> applock -> re-check -> create -> release."""
    name = _in_literal(table)
    exists = (
        "IF EXISTS (\n"
        "SELECT *\n"
        f"FROM {_sys(catalog)}.objects\n"
        f"WHERE object_id = OBJECT_ID(N'{name}')\n"
        "AND type in (N'U'))\n"
    )
    return (
        f"{exists}"
        "RETURN\n"
        f"EXEC sp_getapplock @Resource = '{name}_lock', @LockMode = 'Exclusive'\n"
        f"{exists}"
        "BEGIN\n"
        f"EXEC sp_releaseapplock @Resource = '{name}_lock'\n"
        "RETURN\n"
        "END\n"
        "BEGIN TRY\n"
        f"{body}\n"
        "END TRY\n"
        "BEGIN CATCH\n"
        f"EXEC sp_releaseapplock @Resource = '{name}_lock';\n"
        "THROW;\n"
        "END CATCH;\n"
        f"EXEC sp_releaseapplock @Resource = '{name}_lock'"
    )


def guarded_create(table: str, catalog: str | None, body: str) -> str:
    """`body` behind the transport's creation guard (other tables: SubscriptionRouting)."""
    return _guarded_create(table, catalog, body)


def standalone_batch(script: str) -> str:
    """`script` as a batch sqlcmd or SSMS run as printed, ended by `GO`.

    The transport runs each script on a connection without autocommit, so the script's first
    query opens the transaction `sp_getapplock` (owner Transaction) needs, and a `RETURN` ends
    only that script. Printed back to back they would share one batch: the first `RETURN` would
    skip every later table. So each runs as its own dynamic batch (`RETURN` ends only that),
    verbatim but for doubled quotes, in its own transaction; `XACT_ABORT` rolls a failed one
    back, so the batches after it start without a transaction left open.

    The filtered `Index_Expires` can only be created with QUOTED_IDENTIFIER and ANSI_NULLS ON
    (SET QUOTED_IDENTIFIER, Transact-SQL reference). The transport's SqlClient connection and
    the ODBC driver set both at connect; classic sqlcmd without `-I` leaves QUOTED_IDENTIFIER
    OFF, and the script would fail and roll back. So each batch sets both first.
    """
    return (
        "SET QUOTED_IDENTIFIER ON;\n"
        "SET ANSI_NULLS ON;\n"
        "SET XACT_ABORT ON;\n"
        "BEGIN TRANSACTION;\n"
        f"EXEC sp_executesql N'{_in_literal(script)}';\n"
        "COMMIT;\n"
        "GO"
    )


def create_queue_table(table: str) -> str:
    return (
        f"CREATE TABLE {table} (\n"
        "Id uniqueidentifier NOT NULL,\n"
        "CorrelationId varchar(255),\n"
        "ReplyToAddress varchar(255),\n"
        "Recoverable bit NOT NULL,\n"
        "Expires datetime,\n"
        "Headers nvarchar(max) NOT NULL,\n"
        "Body varbinary(max),\n"
        "RowVersion bigint IDENTITY(1,1) NOT NULL\n"
        ");"
    )


def create_index_rowversion(table: str) -> str:
    return f"CREATE NONCLUSTERED INDEX Index_RowVersion ON {table}\n(\n[RowVersion] ASC\n)"


def create_index_expires(table: str) -> str:
    return (
        f"CREATE NONCLUSTERED INDEX Index_Expires ON {table}\n"
        "(\nExpires\n)\n"
        "INCLUDE\n(\nId,\nRowVersion\n)\n"
        "WHERE\nExpires IS NOT NULL"
    )


def create_queue(table: str, catalog: str | None) -> str:
    """The guarded queue-creation script of seed 000, as one batch."""
    body = "\n".join(
        (create_queue_table(table), create_index_rowversion(table), create_index_expires(table))
    )
    return _guarded_create(table, catalog, body)


def create_delayed_store(table: str, catalog: str | None) -> str:
    """`CreateDelayedMessageStoreText` (SqlServerConstants.cs:222-258), as one batch."""
    body = (
        f"CREATE TABLE {table} (\n"
        "Headers nvarchar(max) NOT NULL,\n"
        "Body varbinary(max),\n"
        "Due datetime NOT NULL,\n"
        "RowVersion bigint IDENTITY(1,1) NOT NULL\n"
        ");\n"
        f"CREATE NONCLUSTERED INDEX [Index_Due] ON {table}\n(\n[Due]\n)"
    )
    return _guarded_create(table, catalog, body)


def store_delayed(table: str) -> str:
    """`StoreDelayedMessageText` (SqlServerConstants.cs:59-82); params (@Headers, @Body,
    @DueAfterDays, @DueAfterHours, @DueAfterMinutes, @DueAfterSeconds,
    @DueAfterMilliseconds), a TimeSpan's parts (StoreDelayedMessageCommand.cs:26-35)."""
    return (
        "DECLARE @Headers nvarchar(max) = ?, @Body varbinary(max) = ?, @DueAfterDays int = ?, "
        "@DueAfterHours int = ?, @DueAfterMinutes int = ?, @DueAfterSeconds int = ?, "
        "@DueAfterMilliseconds int = ?;\n"
        "DECLARE @NOCOUNT VARCHAR(3) = 'OFF';\n"
        "IF ( (512 & @@OPTIONS) = 512 ) SET @NOCOUNT = 'ON'\n"
        "SET NOCOUNT ON;\n"
        "DECLARE @DueAfter DATETIME = GETUTCDATE();\n"
        "SET @DueAfter = DATEADD(ms, @DueAfterMilliseconds, @DueAfter);\n"
        "SET @DueAfter = DATEADD(s, @DueAfterSeconds, @DueAfter);\n"
        "SET @DueAfter = DATEADD(n, @DueAfterMinutes, @DueAfter);\n"
        "SET @DueAfter = DATEADD(hh, @DueAfterHours, @DueAfter);\n"
        "SET @DueAfter = DATEADD(d, @DueAfterDays, @DueAfter);\n"
        f"INSERT INTO {table} (\n"
        "    Headers,\n"
        "    Body,\n"
        "    Due)\n"
        "VALUES (\n"
        "    @Headers,\n"
        "    @Body,\n"
        "    @DueAfter);\n"
        "IF(@NOCOUNT = 'ON') SET NOCOUNT ON;\n"
        "IF(@NOCOUNT = 'OFF') SET NOCOUNT OFF;"
    )


def move_due_delayed(delayed: str, table: str) -> str:
    """`MoveDueDelayedMessageText` (SqlServerConstants.cs:109-125); params (@BatchSize,). Its
    last result set is (UtcNow, NextDue); the bridge reads the next due time with its own
    query instead, in seconds by the database clock."""
    return (
        "DECLARE @BatchSize int = ?;\n"
        ";WITH message AS (\n"
        "    SELECT TOP(@BatchSize) *\n"
        f"    FROM {delayed} WITH (UPDLOCK, READPAST, ROWLOCK)\n"
        "    WHERE Due < GETUTCDATE())\n"
        "DELETE FROM message\n"
        "OUTPUT\n"
        "    NEWID(),\n"
        "    NULL,\n"
        "    NULL,\n"
        "    1,\n"
        "    NULL,\n"
        "    deleted.Headers,\n"
        "    deleted.Body\n"
        f"INTO {table} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body);"
    )


def send(table: str) -> str:
    return (
        f"{_SEND_PARAMS}"
        f"INSERT INTO {table} (Id, Recoverable, Expires, Headers, Body)\n"
        "VALUES (@Id, 1, CASE WHEN @TimeToBeReceivedMs IS NOT NULL\n"
        "                     THEN DATEADD(ms, @TimeToBeReceivedMs, GETUTCDATE()) END, "
        "@Headers, @Body);"
    )


def send_without_recoverable(table: str) -> str:
    return (
        f"{_SEND_PARAMS}"
        f"INSERT INTO {table} (Id, Expires, Headers, Body)\n"
        "VALUES (@Id, CASE WHEN @TimeToBeReceivedMs IS NOT NULL\n"
        "                  THEN DATEADD(ms, @TimeToBeReceivedMs, GETUTCDATE()) END, "
        "@Headers, @Body);"
    )


def remaining_ms(expires: str) -> str:
    """Milliseconds from the database clock to `expires` (a `datetime`), NULL for NULL.

    A `datetime` cast to `float` is its days since 1900-01-01, exact to about a microsecond, so
    the difference of two is exact to the millisecond and cannot overflow, however far off the
    row's Expires: `DATEDIFF(ms, ...)` overflows its int past ~24.8 days (an expired row that
    waited that long would fail every receive), `DATEDIFF(s, ...)` drops the milliseconds (a
    row with less than a second left could read as expired), and `DATEDIFF_BIG` needs SQL
    Server 2016. This works on every version the transport supports.
    """
    return (
        f"CAST(ROUND((CAST({expires} AS float) - CAST(GETUTCDATE() AS float)) * 86400000, 0) "
        "AS bigint)"
    )


_RECEIVED = (
    "DELETE FROM message\n"
    "OUTPUT deleted.Id,\n"
    "       CASE WHEN deleted.Expires IS NULL THEN 0\n"
    "            ELSE CASE WHEN deleted.Expires > GETUTCDATE() THEN 0 ELSE 1 END END,\n"
    "       deleted.Headers, deleted.Body,\n"
    f"       {remaining_ms('deleted.Expires')}, deleted.RowVersion;"
)


def receive(table: str) -> str:
    return (
        "DECLARE @n int = ?;\n"
        f"WITH message AS (SELECT TOP(@n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "ORDER BY RowVersion)\n"
        f"{_RECEIVED}"
    )


def receive_range(table: str) -> str:
    return (
        "DECLARE @lo bigint = ?, @hi bigint = ?, @n int = ?;\n"
        f"WITH message AS (SELECT TOP(@n) * FROM {table} WITH (UPDLOCK, READPAST, ROWLOCK) "
        "WHERE RowVersion BETWEEN @lo AND @hi ORDER BY RowVersion)\n"
        f"{_RECEIVED}"
    )


def bounds(table: str) -> str:
    return f"SELECT min(RowVersion), max(RowVersion) FROM {table} WITH (READPAST)"


def count_range(table: str) -> str:
    return (
        "DECLARE @lo bigint = ?, @hi bigint = ?;\n"
        f"SELECT COUNT_BIG(*) FROM {table} WITH (READPAST) "
        "WHERE RowVersion BETWEEN @lo AND @hi"
    )


def scan_range(table: str) -> str:
    return (
        "DECLARE @after bigint = ?, @hi bigint = ?, @n int = ?;\n"
        "SELECT TOP(@n) Id,\n"
        "       CASE WHEN Expires IS NULL THEN 0\n"
        "            ELSE CASE WHEN Expires > GETUTCDATE() THEN 0 ELSE 1 END END,\n"
        "       Headers, DATALENGTH(Body), RowVersion\n"
        f"FROM {table} WITH (READPAST)\n"
        "WHERE RowVersion > @after AND RowVersion <= @hi ORDER BY RowVersion"
    )


def depth(table: str) -> str:
    return (
        "SELECT isnull(cast(max([RowVersion]) - min([RowVersion]) + 1 AS int), 0) "
        f"FROM {table} WITH (READPAST, READCOMMITTEDLOCK)"
    )


def oldest(table: str) -> str:
    return f"SELECT TOP(1) Headers FROM {table} WITH (READPAST) ORDER BY RowVersion"


def expired(table: str) -> str:
    return f"SELECT COUNT(*) FROM {table} WITH (READPAST) WHERE Expires < GETUTCDATE()"


def purge_expired(table: str) -> str:
    return (
        "DECLARE @BatchSize int = ?;\n"
        f"DELETE FROM {table} WHERE RowVersion IN (SELECT TOP (@BatchSize) RowVersion "
        f"FROM {table} WITH (READPAST) WHERE Expires < GETUTCDATE())"
    )


def index_expires_count(table: str, catalog: str | None) -> str:
    return (
        "SELECT COUNT(*)\n"
        f"FROM {_sys(catalog)}.indexes\n"
        "WHERE name = 'Index_Expires'\n"
        f"AND object_id = OBJECT_ID(N'{_in_literal(table)}')"
    )


def headers_type(table: str, catalog: str | None) -> str:
    return (
        "SELECT t.name\n"
        f"FROM {_sys(catalog)}.columns c\n"
        f"INNER JOIN {_sys(catalog)}.types t ON c.system_type_id = t.system_type_id\n"
        f"WHERE c.object_id = OBJECT_ID(N'{_in_literal(table)}')\n"
        "AND c.name = 'Headers'"
    )


def has_recoverable(catalog: str | None) -> str:
    """params (quoted table name,) -> one row: 1 when the table has a Recoverable column."""
    return (
        f"SELECT COUNT(*) FROM {_sys(catalog)}.columns "
        "WHERE object_id = OBJECT_ID(?) AND name = 'Recoverable'"
    )


def checkpoint_table(table: str) -> str:
    return (
        f"CREATE TABLE {table} (\n"
        "Name nvarchar(450) NOT NULL PRIMARY KEY,\n"
        "Position bigint NOT NULL\n"
        ");"
    )


def checkpoint_create(table: str, catalog: str | None) -> str:
    """`checkpoint_table` behind the same creation guard as the queue tables."""
    return _guarded_create(table, catalog, checkpoint_table(table))


def checkpoint_upsert(table: str) -> str:
    """params (name, position)."""
    return (
        f"MERGE {table} WITH (HOLDLOCK) AS target\n"
        "USING (SELECT ? AS Name, ? AS Position) AS source\n"
        "ON target.Name = source.Name\n"
        "WHEN MATCHED THEN UPDATE SET Position = source.Position\n"
        "WHEN NOT MATCHED THEN INSERT (Name, Position) VALUES (source.Name, source.Position);"
    )


def checkpoint_insert_new(table: str) -> str:
    """params (name, position); affects no row when the name is stored already."""
    return (
        f"MERGE {table} WITH (HOLDLOCK) AS target\n"
        "USING (SELECT ? AS Name, ? AS Position) AS source\n"
        "ON target.Name = source.Name\n"
        "WHEN NOT MATCHED THEN INSERT (Name, Position) VALUES (source.Name, source.Position);"
    )


def checkpoint_advance(table: str) -> str:
    """params (position, name, expected); affects no row unless the stored one is `expected`."""
    return f"UPDATE {table} SET Position = ? WHERE Name = ? AND Position = ?;"


def checkpoint_load(table: str) -> str:
    return f"SELECT Name, Position FROM {table}"
