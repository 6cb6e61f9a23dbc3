"""Delayed-message statements without a database: the SQL Server text against NServiceBus's
own (SqlServerConstants.cs), parsed as T-SQL; the PostgreSQL store and move against
PostgreSqlConstants.cs; the TimeSpan parts of a store; the forwarding header's address.

NServiceBus.SqlServer: src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs:59-82
(StoreDelayedMessageText), :109-125 (MoveDueDelayedMessageText), :222-258
(CreateDelayedMessageStoreText); src/NServiceBus.Transport.PostgreSql/PostgreSqlConstants.cs:21-30,
46-53, 111-119; Sql.Shared/DelayedDelivery/StoreDelayedMessageCommand.cs:18, 26-35.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from bridge.config.loader import parse_config
from bridge.envelope import Envelope, Headers
from bridge.errors import ConfigError
from bridge.transports.sql import headers as headers_codec
from bridge.transports.sql.config import PostgresConnection, SqlServerConnection
from bridge.transports.sql.delayed import FORWARD_DESTINATION, store_params
from bridge.transports.sql.dialects import tsql
from bridge.transports.sql.dialects.postgresql import PostgresDialect
from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
from bridge.transports.sql.transport import Transport

T = "[nservicebus].[dbo].[Sales.Delayed]"  # {0}
Q = "[nservicebus].[dbo].[Sales]"  # {1} of the move

# SqlServerConstants.cs:222-258, {0} and {1} filled in.
CREATE_DELAYED = f"""
IF EXISTS (
    SELECT *
    FROM [nservicebus].sys.objects
    WHERE object_id = OBJECT_ID(N'{T}')
        AND type in (N'U'))
RETURN

EXEC sp_getapplock @Resource = '{T}_lock', @LockMode = 'Exclusive'

IF EXISTS (
    SELECT *
    FROM [nservicebus].sys.objects
    WHERE object_id = OBJECT_ID(N'{T}')
        AND type in (N'U'))
BEGIN
    EXEC sp_releaseapplock @Resource = '{T}_lock'
    RETURN
END

BEGIN TRY
    CREATE TABLE {T} (
        Headers nvarchar(max) NOT NULL,
        Body varbinary(max),
        Due datetime NOT NULL,
        RowVersion bigint IDENTITY(1,1) NOT NULL
    );

    CREATE NONCLUSTERED INDEX [Index_Due] ON {T}
    (
        [Due]
    )
END TRY
BEGIN CATCH
    EXEC sp_releaseapplock @Resource = '{T}_lock';
    THROW;
END CATCH;

EXEC sp_releaseapplock @Resource = '{T}_lock'"""

# SqlServerConstants.cs:59-82
STORE = f"""
DECLARE @NOCOUNT VARCHAR(3) = 'OFF';
IF ( (512 & @@OPTIONS) = 512 ) SET @NOCOUNT = 'ON'
SET NOCOUNT ON;

DECLARE @DueAfter DATETIME = GETUTCDATE();
SET @DueAfter = DATEADD(ms, @DueAfterMilliseconds, @DueAfter);
SET @DueAfter = DATEADD(s, @DueAfterSeconds, @DueAfter);
SET @DueAfter = DATEADD(n, @DueAfterMinutes, @DueAfter);
SET @DueAfter = DATEADD(hh, @DueAfterHours, @DueAfter);
SET @DueAfter = DATEADD(d, @DueAfterDays, @DueAfter);

INSERT INTO {T} (
    Headers,
    Body,
    Due)
VALUES (
    @Headers,
    @Body,
    @DueAfter);

IF(@NOCOUNT = 'ON') SET NOCOUNT ON;
IF(@NOCOUNT = 'OFF') SET NOCOUNT OFF;"""

# SqlServerConstants.cs:109-121 (the move; the bridge reads the next due time by itself)
MOVE = f"""
;WITH message AS (
    SELECT TOP(@BatchSize) *
    FROM {T} WITH (UPDLOCK, READPAST, ROWLOCK)
    WHERE Due < GETUTCDATE())
DELETE FROM message
OUTPUT
    NEWID(),
    NULL,
    NULL,
    1,
    NULL,
    deleted.Headers,
    deleted.Body
INTO {Q} (Id, CorrelationId, ReplyToAddress, Recoverable, Expires, Headers, Body);"""


def words(text: str) -> str:
    return " ".join(text.split())


def sqlserver(**more: Any) -> SqlServerDialect:
    config = SqlServerConnection.model_validate(
        {"type": "sqlserver", "dsn": "Driver=x", "catalog": "nservicebus"} | more
    )
    return SqlServerDialect("legacy", config)


def postgres() -> PostgresDialect:
    config = PostgresConnection.model_validate({"type": "postgresql", "dsn": "host=x"})
    return PostgresDialect("pg", config)


def parse(statement: str) -> list[Any]:
    parsed = sqlglot.parse(statement, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(e is not None and not isinstance(e, exp.Command) for e in parsed), parsed
    return list(parsed)


def test_sqlserver_delayed_statements_are_nservicebus_text_word_for_word() -> None:
    statements = sqlserver().delayed_statements("Sales")
    assert statements.table == "Sales.Delayed"
    (create,) = statements.create
    assert words(create) == words(CREATE_DELAYED)
    declare, _, store = statements.store.partition(";\n")
    assert words(store) == words(STORE)
    assert declare.startswith("DECLARE @Headers nvarchar(max) = ?, @Body varbinary(max) = ?")
    (move,) = statements.move
    assert words(move.partition(";\n")[2]) == words(MOVE)


def test_sqlserver_delayed_statements_parse_as_tsql_on_the_right_tables() -> None:
    statements = sqlserver().delayed_statements("Sales")
    pieces = [tsql.create_delayed_store(T, "nservicebus").split("BEGIN TRY\n")[1]]
    pieces = pieces[0].split("\nEND TRY")[0].split(";\n")
    for ddl in pieces:
        (tree,) = parse(ddl)
        assert isinstance(tree, exp.Create)
        assert {t.name for t in tree.find_all(exp.Table)} == {"Sales.Delayed"}
    # sqlglot reads no `IF ... SET NOCOUNT`: the parameters, and the insert on its own.
    declare, _, rest = statements.store.partition(";\n")
    assert [type(t).__name__ for t in parse(declare)] == ["Declare"]
    insert_text = "INSERT INTO" + rest.split("INSERT INTO")[1].split(";")[0]
    (insert,) = parse(insert_text)
    assert isinstance(insert, exp.Insert)
    assert insert.this.this.name == "Sales.Delayed"
    # sqlglot reads only a one-part name after OUTPUT ... INTO (T-SQL takes three), and
    # NServiceBus's `;WITH` (a guard for a statement before it) as an empty statement first.
    move = statements.move[0]
    assert f"INTO {Q} (Id," in move and ";\n;WITH message AS (" in move
    declare, delete = parse(move.replace(f"INTO {Q}", "INTO [Sales]").replace(";\n;", ";\n"))
    assert isinstance(declare, exp.Declare) and isinstance(delete, exp.Delete)
    tables = {(t.catalog, t.db, t.name) for t in delete.find_all(exp.Table)}
    assert tables == {("nservicebus", "dbo", "Sales.Delayed"), ("", "", "message")}
    into = delete.args["returning"].args["into"]
    assert into.this.this == "Sales" and len(into.expressions) == 7
    for query in (statements.next_due, statements.waiting):
        (tree,) = parse(query)
        assert isinstance(tree, exp.Select)


def test_the_delayed_suffix_is_the_connections() -> None:
    """`TableSuffix`: SqlServer/DelayedDelivery/DelayedDeliveryOptions.cs:15-24."""
    assert sqlserver(delayed_suffix="Later").delayed_statements("Sales").table == "Sales.Later"
    assert postgres().delayed_statements("Sales").table == "Sales.Delayed"


def test_postgresql_store_and_move_are_the_transports() -> None:
    statements = postgres().delayed_statements("Sales")
    assert words(statements.create[0]) == words(
        'CREATE TABLE IF NOT EXISTS "public"."Sales.Delayed" ( Id uuid NOT NULL DEFAULT '
        "gen_random_uuid() PRIMARY KEY, Headers text NOT NULL, Body bytea, Due timestamptz "
        "NOT NULL ) WITH (fillfactor=100)"
    )
    assert words(statements.create[1]) == words(
        'CREATE INDEX IF NOT EXISTS "Sales.Delayed_Due" on "public"."Sales.Delayed"(Due)'
    )
    assert "timestamptz (now() AT TIME ZONE 'UTC') + (%s || ' days ')::INTERVAL" in (
        statements.store
    )
    assert words(statements.move[0]) == words(
        'WITH message as (DELETE FROM "public"."Sales.Delayed" WHERE id in (SELECT id from '
        '"public"."Sales.Delayed" WHERE "public"."Sales.Delayed".Due < now() AT TIME ZONE '
        '\'UTC\' LIMIT %s) RETURNING id, headers, body) INSERT into "public"."Sales" (id, '
        "expires, headers, body) SELECT id, NULL, headers, body FROM message"
    )


def test_a_store_carries_the_destination_and_the_delay_as_timespan_parts() -> None:
    envelope = Envelope(Headers([("NServiceBus.MessageId", "m")]), b"{}")
    ms = ((2 * 24 + 3) * 3600 + 4 * 60 + 5) * 1000 + 678
    params = store_params(sqlserver(), envelope, ms, "Sales", 0.0)
    headers = headers_codec.decode(params[0])
    assert headers.get(FORWARD_DESTINATION) == "Sales@[dbo]@[nservicebus]"
    assert params[1:] == (b"{}", 2, 3, 4, 5, 678)
    assert FORWARD_DESTINATION not in envelope.headers
    pg = store_params(postgres(), envelope, ms, "Sales", 0.0)
    assert pg[:5] == (2, 3, 4, 5, 678)
    assert headers_codec.decode(pg[5]).get(FORWARD_DESTINATION) == '"public"."Sales"'


def test_a_sql_server_queue_takes_its_own_forward_destination_without_catalog() -> None:
    """Without `catalog:` (the database from the DSN) the bridge stores a delay for `D` with
    ForwardDestination `D@[dbo]@[<database>]` (the canonical address, sqlserver.py), as an
    NServiceBus endpoint does (StoreDelayedMessageCommand.cs:18). A source reading `D` takes
    it as its own (header stripped, forwarded over the route), not as a row for another queue
    to insert into `D` again (an extra hop behind the rows queued meanwhile); `D` in another
    catalog of the server is still another queue."""
    from bridge.transports.sql.addresses import address_key
    from bridge.transports.sql.forward import Forwards

    dialect = sqlserver(catalog=None)
    dialect.database = "nservicebus"  # as after its first connection (DB_NAME())
    envelope = Envelope(Headers([("NServiceBus.MessageId", "m")]), b"{}")
    stored = headers_codec.decode(store_params(dialect, envelope, 1000, "D", 0.0)[0])
    assert stored.get(FORWARD_DESTINATION) == "D@[dbo]@[nservicebus]"
    moved = Envelope(stored, b"{}")
    no_database: Any = None  # its own row is taken without a statement
    assert Forwards(dialect, "D").take(moved, no_database) is moved
    assert FORWARD_DESTINATION not in moved.headers
    config = dialect.config
    own = address_key(config, "D", "nservicebus")
    assert address_key(config, "D@[DBO]@[NServiceBus]", "nservicebus") == own
    assert address_key(config, "D@[dbo]@[other]", "nservicebus") != own


def test_install_creates_each_tables_delayed_table_after_it() -> None:
    config = SqlServerConnection.model_validate(
        {"type": "sqlserver", "dsn": "Driver=x", "catalog": "nservicebus"}
    )
    statements = Transport("legacy", config).install_statements(["Sales"])
    assert len(statements) == 3
    assert "CREATE TABLE [nservicebus].[dbo].[Sales] (" in statements[0]
    assert "CREATE TABLE [nservicebus].[dbo].[Sales.Delayed] (" in statements[1]


@pytest.mark.parametrize("kind", ["postgresql", "sqlserver"])
def test_nginn_delays_are_r_rows_due_by_the_database_clock(kind: str) -> None:
    """nginn.md: a delayed message becomes an `R` row with `retry_time` computed by the
    database clock."""
    common = {"layout": "nginn", "nginn": {"alias": "db", "timezone": "Europe/Warsaw"}}
    if kind == "postgresql":
        dialect: Any = PostgresDialect(
            "ng", PostgresConnection.model_validate({"type": kind, "dsn": "host=x"} | common)
        )
    else:
        dialect = SqlServerDialect(
            "ng",
            SqlServerConnection.model_validate(
                {"type": kind, "dsn": "Driver=x", "catalog": "c"} | common
            ),
        )
    statements = dialect.delayed_statements("Orders")
    assert statements.table == "" and statements.create == ()
    assert "'R'" in statements.store
    if kind == "sqlserver":
        assert [type(t).__name__ for t in parse(statements.store)] == ["Declare", "Insert"]
        assert [type(t).__name__ for t in parse(statements.next_due)] == ["Select"]


WARSAW = "Europe/Warsaw"
#: 2026-03-29 02:00 local: clocks go forward to 03:00; 2026-10-25 03:00: back to 02:00.
SPRING = datetime(2026, 3, 28, 23, 30, tzinfo=UTC).timestamp()  # 00:30 CET
AUTUMN = datetime(2026, 10, 25, 0, 0, tzinfo=UTC).timestamp()  # 02:00 CEST
HOUR = 3_600_000


@pytest.mark.parametrize(
    ("now", "delay", "local_delay", "local_due"),
    [
        # 00:30 CET + 2 h is 01:30 UTC, 03:30 CEST: getdate() must move 3 h, not 2 (02:30,
        # a local time that day never has, which the mover reaches an hour early).
        (SPRING, 2 * HOUR, 3 * HOUR, "2026-03-29 03:30"),
        # 02:00 CEST + 2 h is 02:00 UTC, 03:00 CET: 1 h on the local clock, not 2 (an hour late).
        (AUTUMN, 2 * HOUR, HOUR, "2026-10-25 03:00"),
        (SPRING, 30 * 60_000, 30 * 60_000, "2026-03-29 01:00"),  # no change within the delay
        (AUTUMN + 7 * 86400, 1500, 1500, "2026-11-01 01:00"),
    ],
)
def test_an_nginn_delay_on_sql_server_follows_the_zones_offset_change(
    now: float, delay: int, local_delay: int, local_due: str
) -> None:
    """SQL Server's NGinn `R` row is due at local `getdate()` + the delay (NGinn's
    retry_time is local time); the delay passed is corrected by the change of the zone's
    offset, so the local time reached is the due moment's local time, as PostgreSQL's and
    SQLite's (UTC + delay, converted to the zone) is."""
    from zoneinfo import ZoneInfo

    from bridge.transports.sql.layouts.nginn_sql import local_delay_ms

    zone = ZoneInfo(WARSAW)
    assert local_delay_ms(delay, now, zone) == local_delay
    local_now = datetime.fromtimestamp(now, zone).replace(tzinfo=None)
    reached = local_now + timedelta(milliseconds=local_delay)
    assert reached.strftime("%Y-%m-%d %H:%M") == local_due
    due = datetime.fromtimestamp(now + delay / 1000, UTC)
    assert reached.replace(tzinfo=zone).astimezone(UTC) == due


def test_an_nginn_delayed_row_on_sql_server_passes_the_corrected_delay_to_getdate() -> None:
    """The statement adds the parameter to `getdate()`; the parameter is the delay as
    `local_delay_ms` corrects it for `nginn.timezone`."""
    dialect = SqlServerDialect(
        "ng",
        SqlServerConnection.model_validate(
            {
                "type": "sqlserver",
                "dsn": "Driver=x",
                "catalog": "c",
                "layout": "nginn",
                "nginn": {"alias": "db", "timezone": WARSAW},
            }
        ),
    )
    statements = dialect.delayed_statements("Orders")
    assert (
        "DATEADD(ms, @due_ms % 1000, DATEADD(s, CAST(@due_ms / 1000 AS int), getdate()))"
        in statements.store
    )
    envelope = Envelope(Headers([("NServiceBus.MessageId", "m")]), b'{"$type": "Orders.Place"}')
    params = store_params(dialect, envelope, 2 * HOUR, "Orders", SPRING)
    assert params[2] == 3 * HOUR  # @due_ms, after @from_endpoint and @to_endpoint
    assert params[:2] == ("sql://db/bridge", "sql://db/Orders")


# -- `delays:` (messaging-bridge.md §4) ---------------------------------------------------------

DELAYS_CONFIG = """\
connections:
  local: {type: sqlite, path: ./bridge.db}
  kafka: {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
routes: []
delays: {connection: NAME}
"""


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("nowhere", "routes.yaml:5:22: delays.connection: no connection 'nowhere' (known: kafka"),
        ("kafka", "routes.yaml:5:22: delays.connection: 'kafka' is a kafka connection; delays"),
    ],
)
def test_delays_names_a_sql_connection_where_it_is_written(name: str, said: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(DELAYS_CONFIG.replace("NAME", name), "routes.yaml", {})
    assert str(info.value).startswith(said)


DELAYS_ERROR_QUEUE = """\
connections:
  local: {type: sqlite, path: ./bridge.db}
  kafka: {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
endpoints:
  Sales: {connection: local}
  Billing: {connection: kafka}
delays: {connection: local, error_queue: QUEUE}
"""

#: No endpoints: `again` reaches the file `local` does (two names for one place).
DELAYS_ERROR_QUEUE_READ = """\
connections:
  local: {type: sqlite, path: ./bridge.db}
  again: {type: sqlite, path: ./bridge.db}
  kafka: {type: kafka, bootstrap_servers: "127.0.0.1:9092"}
routes:
  - {name: errors, from: {connection: again, queue: poison}, to: {connection: kafka, topic: p}}
delays: {connection: local, error_queue: QUEUE}
"""


@pytest.mark.parametrize(
    ("config", "queue", "said"),
    [
        (
            DELAYS_ERROR_QUEUE,
            "Sales",
            "routes.yaml:7:42: delays.error_queue: error queue 'Sales' is named like endpoint "
            "'Sales': delayed messages that can never be sent would be delivered to the "
            "endpoint; name another error queue",
        ),
        (
            DELAYS_ERROR_QUEUE,
            "billing",  # the proxy of Billing on `local` (which a derived route reads) too
            "routes.yaml:7:42: delays.error_queue: error queue 'billing' is named like "
            "endpoint 'Billing'",
        ),
        (
            DELAYS_ERROR_QUEUE_READ,
            "poison",
            "routes.yaml:7:42: delays.error_queue: 'poison' on connection 'local' is where "
            "route 'errors' receives from: the error copies of delayed messages that can never "
            "be sent would be forwarded again; name a queue no route reads",
        ),
        (
            DELAYS_ERROR_QUEUE,
            '"a\\0b"',
            "routes.yaml:7:42: delays.error_queue: invalid name 'a\\x00b'",
        ),
        (DELAYS_ERROR_QUEUE, '" "', "routes.yaml:7:42: delays.error_queue: invalid name ' '"),
    ],
)
def test_check_refuses_a_delays_error_queue_an_endpoint_or_a_route_would_read(
    config: str, queue: str, said: str
) -> None:
    """messaging-bridge.md §4: `bridge check` refuses an error queue named like an endpoint
    (the endpoint would receive the poison); `delays.error_queue` is an error queue too, and
    one a route receives from (here through another connection name for the same file) would
    forward the copies on again."""
    with pytest.raises(ConfigError) as info:
        parse_config(config.replace("QUEUE", queue), "routes.yaml", {})
    assert str(info.value).startswith(said), str(info.value)


def test_delays_on_a_sql_connection_is_fine() -> None:
    config = parse_config(DELAYS_CONFIG.replace("NAME", "local"), "routes.yaml", {}).config
    assert config.delays is not None and config.delays.connection == "local"


def test_bridgedelays_statements_parse_as_tsql_on_the_right_table() -> None:
    """`BridgeDelays` (this project's: bridge.transports.sql.delay_table) on SQL Server."""
    from bridge.transports.sql.delay_table import DelayTable

    table = DelayTable(sqlserver())
    (create,) = table.create
    guard, _, ddl = create.partition("\n")
    assert guard == "IF OBJECT_ID(N'[nservicebus].[dbo].[BridgeDelays]', N'U') IS NULL"
    skipping = table.take_statement(2)
    assert skipping.count("AND NOT (Connection = ? AND Address = ?)") == 2
    next_skipping = table._next_due.replace("{skip}", table._skip)
    statements = (ddl, table.store, table.take, table.next_due, table.delete, table.put_off)
    for statement in (*statements, skipping, next_skipping):
        (tree,) = parse(statement)
        names = {(t.catalog, t.db, t.name) for t in tree.find_all(exp.Table)}
        assert names == {("nservicebus", "dbo", "BridgeDelays")}, statement


def test_sql_server_bridgedelays_next_due_skips_the_rows_other_producers_take() -> None:
    """A take holds its rows with update locks (UPDLOCK, READPAST); READPAST alone skips only
    rows under exclusive locks, so a next-due read with it alone would see a row another
    producer holds, due, and the producer would look again at once, in a loop. The read skips
    them as the take does."""
    from bridge.transports.sql.delay_table import DelayTable

    def hints(statement: str) -> set[str]:
        (tree,) = parse(statement)
        table = tree.find(exp.Table)
        assert table is not None
        return {v.name.upper() for h in table.args.get("hints") or [] for v in h.expressions}

    table = DelayTable(sqlserver())
    assert hints(table.take) == {"UPDLOCK", "READPAST", "ROWLOCK"}
    assert hints(table.next_due) == hints(table.take)


def test_a_message_waiting_in_bridgedelays_keeps_its_duplicate_headers(tmp_path: Path) -> None:
    """Kafka headers are a multimap, and a record sent on at once keeps duplicates and nulls
    (kafka/sink.py, "What is lossy"); delayed through `BridgeDelays` it keeps them too: the
    Headers column is a list of pairs, not a JSON object (whose names would collapse)."""
    from bridge.transports.sql.config import SqliteConnection
    from bridge.transports.sql.delay_table import DelayTable
    from bridge.transports.sql.dialects.sqlite import SqliteDialect

    config = SqliteConnection.model_validate({"type": "sqlite", "path": str(tmp_path / "d.db")})
    dialect = SqliteDialect("lite", config)
    table = DelayTable(dialect)
    headers = Headers(
        [("NServiceBus.MessageId", "m"), ("trace", "a"), ("trace", "b"), ("none", None)]
    )
    db = dialect.connect()
    try:
        for statement in table.create:
            db.cursor().execute(statement)
        stored = table.store_params(Envelope(headers, b"{}"), -1000, "kafka", "topic", None)
        old_form = (
            *table.store_params(Envelope(headers, b"{}"), -500, "kafka", "topic", None)[:4],
            '{"NServiceBus.MessageId":"old","trace":"x"}',
            b"{}",
            -500,
        )
        dialect.begin(db)
        db.cursor().executemany(table.store, [stored, old_form])
        db.commit()
        taken = table.take_due(10, db)
    finally:
        db.close()
    assert [list(row.envelope.headers) for row in taken] == [
        list(headers),
        [("NServiceBus.MessageId", "old"), ("trace", "x")],
    ]


def test_bridgedelays_refuses_headers_utf8_cannot_carry() -> None:
    from bridge.errors import HeadersFormatError
    from bridge.transports.sql.delay_table import read_headers, write_headers

    with pytest.raises(HeadersFormatError, match="UTF-8"):
        write_headers(Headers([("a", "\ud800")]))
    for text in ('[["a","\\ud800"]]', '[["a",1]]', '{"a":1}', "[["):
        with pytest.raises(HeadersFormatError):
            read_headers(text)
    assert list(read_headers('[["a","\\u00e9"],["a",null]]')) == [("a", "\u00e9"), ("a", None)]


def test_bridge_run_moves_the_delayed_table_of_an_endpoint_before_and_after_it_moves() -> None:
    """README, "Moving an endpoint from SQL Server to RabbitMQ", step 3: Billing's delayed
    table is moved by `bridge run` while Billing lives on SQL Server (the derived route into
    its table writes it) and after it moved to RabbitMQ (its table is the proxy a derived route
    reads), so nothing waits for an endpoint that is stopped."""
    from bridge.config.models import BridgeConfig
    from bridge.service.movers import movers
    from bridge.transports import load

    def moved(billing: str) -> set[tuple[str, str]]:
        config = BridgeConfig.model_validate(
            {
                "connections": {
                    "legacy": {"type": "sqlserver", "dsn": "Driver=x"},
                    "rabbit": {"type": "rabbitmq", "url": "amqp://guest:guest@127.0.0.1/"},
                },
                "endpoints": {
                    "Sales": {"connection": "legacy"},
                    "Billing": {"connection": billing},
                },
            }
        )
        found = movers(config, config.all_routes, lambda name: load(name, config.connections[name]))
        return {(m.transport.name, m.address) for m in found}

    assert ("legacy", "Billing") in moved("legacy")
    assert ("legacy", "Billing") in moved("rabbit")
