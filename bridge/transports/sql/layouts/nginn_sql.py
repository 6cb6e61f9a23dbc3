"""The NGinn.MessageBus queue table's statements on SQL Server, PostgreSQL and SQLite.

SQL Server gets NGinn's own text (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`:
`createmqueue.sqlserver.sql`, `Impl/SqlQueue/NamedQueries.sqlserver.json`) with the dialect's
quoted names, and these changes:

- The receive is NGinn's two steps (`SelectAndLockNext1`: `TOP 1 ... WITH (UPDLOCK, READPAST)
  WHERE subqueue='I' ORDER BY retry_time`; `SelectAndLockNext2`: `SET subqueue='X',
  last_processed=getdate()`) as one statement that takes up to `@n` rows, only those whose
  `to_endpoint` is the table's own, compared ignoring case as NGinn compares endpoints,
  whatever the column's collation (NGinn forwards the others), and outputs them.
- The send is `InsertMessageBatch_InsertSql` for one row, `subqueue` 'I' and `retry_time`
  getdate() (no delivery time, no high priority), `error_info` a parameter (an error-queue
  copy carries its exception message there), without its `with(rowlock)` hint (an insert
  locks only its row anyway).
- A failed row is `MarkMessageFailed` with subqueue 'F', on a row this receive marked 'X'.
- The mover and the cleanup are `MoveScheduledMessagesToInputQueue` and
  `CleanupProcessedMessages` with NGinn's retention (12 h, SqlMessageTransport2.cs:228),
  their `update top (n) ... with(READPAST)` written as the same update of a `TOP (n) ...
  WITH (READPAST)` common table expression (the form the receive has too).
- Parameters are bound by a `DECLARE ... = ?` line, as in `tsql`.

PostgreSQL and SQLite (NGinn has no script for either) get the same columns and index in their
own types: `bigint` identity and `timestamp` (PostgreSQL), `INTEGER PRIMARY KEY AUTOINCREMENT`
and `YYYY-MM-DD HH:MM:SS.fff` text (SQLite), and the same statements, taking rows with
`FOR UPDATE SKIP LOCKED` (PostgreSQL) or under SQLite's one writer. Every time is the local
time of `nginn.timezone`: PostgreSQL's `now() AT TIME ZONE '<zone>'`, SQL Server's `GETDATE()`
(the server's own clock), SQLite's `nginn_local(<SQLite's UTC 'now'>)`, a function the layout
defines on each connection (SQLite's 'now' is one value within a statement, so a row's
`insert_time` and `retry_time` are equal, as they are on the other databases).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.base import Dialect

__all__ = ["SQLITE_LOCAL", "NGinnStatements", "local_delay_ms", "statements"]

#: The SQLite function that turns a UTC time into the local time of `nginn.timezone`
#: (`local_text` format).
SQLITE_LOCAL = "nginn_local"
#: What NGinn's cleanup and mover take per statement (NamedQueries.sqlserver.json:14, 16).
CLEANUP_ROWS, MOVER_ROWS = 10_000, 1_000
RETENTION_HOURS = 12

_COLUMNS = (
    "from_endpoint, to_endpoint, subqueue, insert_time, last_processed, retry_count, "
    "retry_time, error_info, msg_text, correlation_id, label, msg_headers, unique_id"
)
_RETURNED = (
    "id, from_endpoint, to_endpoint, retry_count, insert_time, retry_time, correlation_id, "
    "label, msg_text, msg_headers, unique_id"
)


def local_delay_ms(due_ms: int, now: float, zone: ZoneInfo) -> int:
    """The delay to add to the local clock of `zone` (SQL Server's `getdate()`) so that the
    local time reached is the local time of the moment `due_ms` milliseconds after `now`
    (epoch seconds): the delay plus the change of the zone's UTC offset between the two.

    NGinn's `retry_time` is local time: NGinn writes `DateTime.Now` or a local DeliverAt
    (lafar6502/nginn-messagebus NGinnBPM.MessageBus/Impl/SqlQueue/CommonQueueOps.cs:138) and
    moves `R` rows when `retry_time <= getdate()` (Impl/DbMessageTransport._cs:1015), so a
    delay added to `getdate()` unchanged is an hour off across a daylight-saving change
    (PostgreSQL and SQLite add it to UTC and convert to the zone, `nginn.timezone`, which is
    the same local time as this). Where that local time occurs twice (the hour a clock goes
    back), the mover takes the row at its first occurrence, as NGinn's own rows are taken."""
    start = datetime.fromtimestamp(now, zone)
    due = datetime.fromtimestamp(now + due_ms / 1000, zone)
    start_offset, due_offset = start.utcoffset(), due.utcoffset()
    assert start_offset is not None and due_offset is not None
    return due_ms + round((due_offset - start_offset).total_seconds() * 1000)


@dataclass(frozen=True, slots=True)
class NGinnStatements:
    """One NGinn table's statements (beyond `QueueStatements`' shape).

    create   DDL, idempotent
    receive  params (endpoint, n): marks up to n `I` rows for the endpoint `X`, returns them
             (`_RETURNED`, then the database's local time)
    send     params `OutgoingNGinnRow`
    fail     params (error_info, id): an `X` row this transaction took to `F`
    depth    params (endpoint,) -> `I` rows for the endpoint
    oldest   params (endpoint,) -> seconds since the oldest of them was inserted, or NULL
    expired  params (endpoint,) -> those whose `_NG-TTL` (as NGinn writes it) has passed
    elsewhere  params (endpoint,) -> `I` rows for other endpoints (NGinn's to forward)
    mover    no params: due `R` rows back to `I`
    cleanup  no params: `X` rows older than the retention deleted
    send_delayed  params `OutgoingNGinnRow` with the delay in ms after `to_endpoint`: an `R`
             row whose `retry_time` is the database's local clock + the delay (SQL Server:
             the delay as `local_delay_ms` corrects it, `getdate()` being local time)
    next_due no params -> at most one row: seconds until the earliest `R` row is due (none or
             NULL: none; PostgreSQL: rows other transactions hold skipped)
    scheduled  no params -> one row: `R` rows waiting
    """

    create: tuple[str, ...]
    receive: str
    send: str
    fail: str
    depth: str
    oldest: str
    expired: str
    elsewhere: str
    mover: str
    cleanup: str
    send_delayed: str
    next_due: str
    scheduled: str


def local_now(d: Dialect, zone: str) -> str:
    """The expression of the database clock's local time in `zone` (NGinn's `getdate()`), on
    PostgreSQL and SQLite."""
    if d.kind == "postgresql":
        literal = zone.replace("'", "''")  # an IANA name (checked by the config), quoted anyway
        return f"(now() AT TIME ZONE '{literal}')"
    return f"{SQLITE_LOCAL}(strftime('%Y-%m-%d %H:%M:%f', 'now'))"


def statements(dialect: Dialect, name: str, zone: str) -> NGinnStatements:
    if dialect.kind == "sqlserver":
        return _sqlserver(dialect, name)
    return _portable(dialect, name, zone)


def _portable(d: Dialect, name: str, zone: str) -> NGinnStatements:
    """PostgreSQL and SQLite: one text, each database's types and clock."""
    pg = d.kind == "postgresql"
    t = d.table(name)
    tp = d.param_safe(t)
    p = d.placeholder
    now = local_now(d, zone)
    lock = " FOR UPDATE SKIP LOCKED" if pg else ""
    mine = f"subqueue = 'I' AND lower(to_endpoint) = lower({p})"
    others = f"subqueue = 'I' AND lower(to_endpoint) <> lower({p})"
    if pg:
        create = (
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "  id bigint GENERATED BY DEFAULT AS IDENTITY NOT NULL,\n"
            "  from_endpoint varchar(50) NOT NULL,\n"
            "  to_endpoint varchar(50) NOT NULL,\n"
            "  subqueue char(1) NOT NULL,\n"
            "  insert_time timestamp NOT NULL,\n"
            "  last_processed timestamp NULL,\n"
            "  retry_count int NOT NULL,\n"
            "  retry_time timestamp NOT NULL,\n"
            "  error_info text NULL,\n"
            "  correlation_id varchar(100) NULL,\n"
            "  label varchar(100) NULL,\n"
            "  msg_text text NULL,\n"
            "  msg_headers text NULL,\n"
            "  unique_id varchar(40) NULL,\n"
            f"  CONSTRAINT {d.quote('PK_' + name)} PRIMARY KEY (id))",
            f"CREATE INDEX IF NOT EXISTS {d.quote(f'IDX_{name}_subqueue_retry_time')} "
            f"ON {t} (subqueue, retry_time) INCLUDE (id)",
        )
        # The delay is added to the UTC clock, then made local: across a daylight saving
        # change a local time plus the delay would be up to an hour early or late.
        literal = zone.replace("'", "''")  # an IANA name (checked by the config), quoted anyway
        due = f"((now() + {p} * INTERVAL '1 millisecond') AT TIME ZONE '{literal}')"
        next_due = f"EXTRACT(EPOCH FROM retry_time - {now})"
        age = f"EXTRACT(EPOCH FROM {now} - min(insert_time))"
        ttl_at = "strpos(msg_headers, '_NG-TTL=')"
        now_text = f"to_char({now}, 'YYYY-MM-DD HH24:MI:SS')"
        retention = f"{now} - INTERVAL '{RETENTION_HOURS} hours'"
    else:
        create = (
            f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "  id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,\n"
            "  from_endpoint varchar(50) NOT NULL,\n"
            "  to_endpoint varchar(50) NOT NULL,\n"
            "  subqueue char(1) NOT NULL,\n"
            "  insert_time datetime NOT NULL,\n"
            "  last_processed datetime NULL,\n"
            "  retry_count int NOT NULL,\n"
            "  retry_time datetime NOT NULL,\n"
            "  error_info text NULL,\n"
            "  correlation_id varchar(100) NULL,\n"
            "  label varchar(100) NULL,\n"
            "  msg_text text NULL,\n"
            "  msg_headers text NULL,\n"
            "  unique_id varchar(40) NULL\n"
            ")",
            # SQLite has no INCLUDE: `id` is the rowid, in every index entry anyway.
            f"CREATE INDEX IF NOT EXISTS {d.quote(f'IDX_{name}_subqueue_retry_time')} "
            f"ON {t} (subqueue, retry_time)",
        )
        due = f"{SQLITE_LOCAL}(strftime('%Y-%m-%d %H:%M:%f', 'now', ({p} / 1000.0) || ' seconds'))"
        next_due = f"(julianday(min(retry_time)) - julianday({now})) * 86400.0"
        age = f"(julianday({now}) - julianday(min(insert_time))) * 86400.0"
        ttl_at = "instr(msg_headers, '_NG-TTL=')"
        now_text = f"strftime('%Y-%m-%d %H:%M:%S', {now})"
        retention = f"strftime('%Y-%m-%d %H:%M:%f', {now}, '-{RETENTION_HOURS} hours')"
    a = "q." if pg else ""  # SQLite's RETURNING takes no alias
    q, qt = (f"{tp} AS q", f"{t} AS q") if pg else (tp, t)  # qt: in statements without params
    returned = ", ".join(
        d.read_text(f"{a}{c}") if c in ("msg_text", "msg_headers") else f"{a}{c}"
        for c in _RETURNED.split(", ")
    )
    receive_where = f"{mine}\n  ORDER BY retry_time, id LIMIT {p}{lock}"
    mover_where = f"subqueue = 'R' AND retry_time <= {now} LIMIT {MOVER_ROWS}{lock}"
    cleanup_where = f"retry_time <= {retention} AND subqueue = 'X' LIMIT {CLEANUP_ROWS}{lock}"
    return NGinnStatements(
        create=create,
        receive=(
            f"{_taking(tp, receive_where, pg)}"
            f"UPDATE {q} SET subqueue = 'X', last_processed = {now}\n"
            f"{_taken(tp, receive_where, pg)} AND {a}subqueue = 'I'\n"
            f"RETURNING {returned}, {now}"
        ),
        send=(
            f"INSERT INTO {tp} ({_COLUMNS})\n"
            f"VALUES ({p}, {p}, 'I', {now}, NULL, 0, {now}, {p}, {p}, {p}, {p}, {p}, {p})"
        ),
        fail=(
            f"UPDATE {tp} SET retry_count = retry_count + 1, retry_time = {now}, "
            f"error_info = {p}, last_processed = {now}, subqueue = 'F'\n"
            f"WHERE id = {p} AND subqueue = 'X'"
        ),
        depth=f"SELECT count(*) FROM {tp} WHERE {mine}",
        oldest=f"SELECT {age} FROM {tp} WHERE {mine}",
        expired=(
            f"SELECT count(*) FROM {tp} WHERE {mine} AND {ttl_at} > 0\n"
            f"  AND substr(msg_headers, {ttl_at} + 8, 19) < {now_text}"
        ),
        elsewhere=f"SELECT count(*) FROM {tp} WHERE {others}",
        mover=(
            f"{_taking(t, mover_where, pg)}UPDATE {qt} SET subqueue = 'I'\n"
            f"{_taken(t, mover_where, pg)}"
        ),
        cleanup=(
            f"{_taking(t, cleanup_where, pg)}DELETE FROM {qt}\n"
            + ("USING taken WHERE q.id = taken.id" if pg else _taken(t, cleanup_where, pg))
        ),
        send_delayed=(
            f"INSERT INTO {tp} ({_COLUMNS})\n"
            f"VALUES ({p}, {p}, 'R', {now}, NULL, 0, {due}, {p}, {p}, {p}, {p}, {p}, {p})"
        ),
        # PostgreSQL: `R` rows another transaction holds (a competing mover's) are skipped
        # here as the mover skips them: were they read, a held due row would make the mover
        # look again at once, in a loop.
        next_due=(
            f"SELECT {next_due} FROM {t} WHERE subqueue = 'R' "
            "ORDER BY retry_time LIMIT 1 FOR KEY SHARE SKIP LOCKED"
            if pg
            else f"SELECT {next_due} FROM {t} WHERE subqueue = 'R'"
        ),
        scheduled=f"SELECT count(*) FROM {t} WHERE subqueue = 'R'",
    )


def _taking(table: str, where: str, pg: bool) -> str:
    """PostgreSQL: the rows to take, locked and materialized once. As `id IN (SELECT ...
    LIMIT n FOR UPDATE SKIP LOCKED)` the planner may rescan the subquery for every row (a
    nested-loop semi-join), and each rescan skips the rows the statement already changed, so
    it took every row, not n."""
    return f"WITH taken AS MATERIALIZED (SELECT id FROM {table} WHERE {where})\n" if pg else ""


def _taken(table: str, where: str, pg: bool) -> str:
    if pg:
        return "FROM taken WHERE q.id = taken.id"
    return f"WHERE id IN (SELECT id FROM {table} WHERE {where})"


def create_sqlserver(table: str, name: str, catalog: str | None) -> str:
    """NGinn's `createmqueue.sqlserver.sql` with `[dbo].[{0}]` as the dialect's name."""
    objects = f"{tsql.bracket(catalog)}.sys.objects" if catalog else "sys.objects"
    literal = table.replace("'", "''")
    return (
        f"IF  not exists (SELECT * FROM {objects} WHERE object_id = OBJECT_ID(N'{literal}') "
        "AND type in (N'U'))\n"
        "BEGIN\n"
        f"CREATE TABLE {table}(\n"
        "\t[id] [bigint] IDENTITY(1,1) NOT NULL,\n"
        "\t[from_endpoint] [varchar](50) NOT NULL,\n"
        "\t[to_endpoint] [varchar](50) NOT NULL,\n"
        "\t[subqueue] [char](1) NOT NULL,\n"
        "\t[insert_time] [datetime] NOT NULL,\n"
        "\t[last_processed] [datetime] NULL,\n"
        "\t[retry_count] [int] NOT NULL,\n"
        "\t[retry_time] [datetime] NOT NULL,\n"
        "\t[error_info] [text] NULL,\n"
        "\t[correlation_id] [varchar](100) NULL,\n"
        "\t[label] [varchar](100) NULL,\n"
        "\t[msg_text] varchar(max) NULL,\n"
        "\t[msg_headers] varchar(max) null,\n"
        "\t[unique_id] varchar(40) null\n"
        f" CONSTRAINT {tsql.bracket('PK_' + name)} PRIMARY KEY CLUSTERED \n"
        "(\n"
        "\t[id] ASC\n"
        ")WITH (PAD_INDEX  = OFF, STATISTICS_NORECOMPUTE  = OFF, IGNORE_DUP_KEY = OFF, "
        "ALLOW_ROW_LOCKS  = ON, ALLOW_PAGE_LOCKS  = ON) \n"
        ") \n"
        "\n"
        f"CREATE NONCLUSTERED INDEX {tsql.bracket(f'IDX_{name}_subqueue_retry_time')} "
        f"ON {table} \n"
        "(\n"
        "\t[subqueue] ASC,\n"
        "\t[retry_time] ASC\n"
        ")\n"
        "INCLUDE(id)\n"
        "WITH (PAD_INDEX  = OFF, STATISTICS_NORECOMPUTE  = OFF, SORT_IN_TEMPDB = OFF, "
        "IGNORE_DUP_KEY = OFF, DROP_EXISTING = OFF, ONLINE = OFF, ALLOW_ROW_LOCKS  = ON, "
        "ALLOW_PAGE_LOCKS  = ON) \n"
        "\n"
        "END"
    )


_MINE = "DECLARE @endpoint varchar(50) = ?;\n"
# Endpoints compare ignoring case whatever the column's collation, as NGinn compares them
# (SqlMessageTransport2.cs:1127). `to_endpoint` is in no index (NGinn's is `(subqueue,
# retry_time) INCLUDE (id)`), so LOWER() costs no seek: the index finds the `I` rows either way.
_WHERE_MINE = "WHERE subqueue = 'I' AND LOWER(to_endpoint) = LOWER(@endpoint)"
_WHERE_OTHERS = "WHERE subqueue = 'I' AND LOWER(to_endpoint) <> LOWER(@endpoint)"


def _sqlserver(d: Dialect, name: str) -> NGinnStatements:
    t = d.table(name)
    catalog: str | None = getattr(d, "catalog", None)
    return NGinnStatements(
        create=(create_sqlserver(t, name, catalog),),
        receive=(
            "DECLARE @endpoint varchar(50) = ?, @n int = ?;\n"
            f"WITH message AS (SELECT TOP(@n) * FROM {t} WITH (UPDLOCK, READPAST, ROWLOCK)\n"
            f"  {_WHERE_MINE} ORDER BY retry_time, id)\n"
            "UPDATE message SET subqueue = 'X', last_processed = getdate()\n"
            f"OUTPUT {', '.join('inserted.' + c for c in _RETURNED.split(', '))}, getdate();"
        ),
        send=(
            "DECLARE @from_endpoint varchar(50) = ?, @to_endpoint varchar(50) = ?, "
            "@error_info nvarchar(max) = ?, @msg_body nvarchar(max) = ?, "
            "@correl_id varchar(100) = ?, @label varchar(100) = ?, "
            "@headers nvarchar(max) = ?, @unique_id varchar(40) = ?;\n"
            f"INSERT INTO {t} ([from_endpoint], [to_endpoint],[subqueue],"
            "[insert_time],[last_processed],[retry_count],[retry_time],[error_info],[msg_text],"
            "[correlation_id],[label], [msg_headers], [unique_id]) VALUES (@from_endpoint, "
            "@to_endpoint, 'I', getdate(), null, 0, getdate(), @error_info, @msg_body, "
            "@correl_id, @label, @headers, @unique_id);"
        ),
        fail=(
            "DECLARE @error_info nvarchar(max) = ?, @id bigint = ?;\n"
            f"update {t} with(rowlock) set retry_count = retry_count + 1, "
            "retry_time=getdate(), error_info=@error_info, last_processed=getdate(), "
            "subqueue='F' where id=@id and subqueue='X'"
        ),
        depth=f"{_MINE}select count(*) from {t} with(nolock) {_WHERE_MINE}",
        oldest=(
            f"{_MINE}SELECT DATEDIFF(second, min(insert_time), getdate()) "
            f"FROM {t} with(nolock) {_WHERE_MINE}"
        ),
        expired=(
            f"{_MINE}SELECT count(*) FROM {t} with(nolock) {_WHERE_MINE}\n"
            "  AND CHARINDEX('_NG-TTL=', msg_headers) > 0\n"
            "  AND SUBSTRING(msg_headers, CHARINDEX('_NG-TTL=', msg_headers) + 8, 19) "
            "< CONVERT(varchar(19), getdate(), 120)"
        ),
        elsewhere=f"{_MINE}select count(*) from {t} with(nolock) {_WHERE_OTHERS}",
        mover=(
            f"WITH due AS (SELECT TOP ({MOVER_ROWS}) * FROM {t} WITH (READPAST)\n"
            "  where subqueue='R' and retry_time <= getdate())\n"
            "UPDATE due SET subqueue='I'"
        ),
        cleanup=(
            f"WITH done AS (SELECT TOP ({CLEANUP_ROWS}) * FROM {t} WITH (READPAST)\n"
            f"  where retry_time <= DATEADD(hour, -{RETENTION_HOURS}, getdate()) "
            "and subqueue='X')\n"
            "DELETE FROM done"
        ),
        send_delayed=(
            "DECLARE @from_endpoint varchar(50) = ?, @to_endpoint varchar(50) = ?, "
            "@due_ms bigint = ?, "
            "@error_info nvarchar(max) = ?, @msg_body nvarchar(max) = ?, "
            "@correl_id varchar(100) = ?, @label varchar(100) = ?, "
            "@headers nvarchar(max) = ?, @unique_id varchar(40) = ?;\n"
            f"INSERT INTO {t} ([from_endpoint], [to_endpoint],[subqueue],"
            "[insert_time],[last_processed],[retry_count],[retry_time],[error_info],[msg_text],"
            "[correlation_id],[label], [msg_headers], [unique_id]) VALUES (@from_endpoint, "
            "@to_endpoint, 'R', getdate(), null, 0, "
            "DATEADD(ms, @due_ms % 1000, DATEADD(s, CAST(@due_ms / 1000 AS int), getdate())), "
            "@error_info, @msg_body, @correl_id, @label, @headers, @unique_id);"
        ),
        next_due=(
            "SELECT (CAST(min(retry_time) AS float) - CAST(getdate() AS float)) * 86400 "
            f"FROM {t} with(nolock) where subqueue='R'"
        ),
        scheduled=f"select count(*) from {t} with(nolock) where subqueue='R'",
    )
