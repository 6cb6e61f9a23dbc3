"""The SubscriptionRouting table's statements, golden against NServiceBus's own text.

Facts pinned here (Particular/NServiceBus.SqlServer@214c4e8f):
- SQL Server: src/NServiceBus.Transport.SqlServer/Queuing/SqlServerConstants.cs:291-331 (the
  table, behind the creation guard), :333-352 (subscribe: MERGE WITH (HOLDLOCK, TABLOCK)),
  :354-358 (the publisher's lookup), :360-364 (unsubscribe); the table's name is quoted and
  three-part (PubSub/QualifiedSubscriptionTableName.cs:27-28).
- PostgreSQL: src/NServiceBus.Transport.PostgreSql/PostgreSqlConstants.cs:122-133 (the table),
  :134-148 (subscribe: ON CONFLICT (Endpoint, Topic) DO UPDATE), :149-153 (lookup), :154-158
  (unsubscribe); the name is "schema"."table" (QualifiedSubscriptionTableName.cs:22).
- The lookup has one parameter per topic (src/NServiceBus.Transport.Sql.Shared/PubSub/
  SubscriptionTable.cs:65-66).
"""

from __future__ import annotations

from typing import Any

import sqlglot
from sqlglot import exp

from bridge.config.models import PostgresConnection, SqliteConnection, SqlServerConnection
from bridge.transports.sql.dialects.postgresql import PostgresDialect
from bridge.transports.sql.dialects.sqlite import SqliteDialect
from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
from bridge.transports.sql.subscriptions import statements

TABLE = "[nsb].[dbo].[SubscriptionRouting]"

#: SqlServerConstants.cs:333-352 with {0} filled, behind one DECLARE binding its names.
SQLSERVER_SUBSCRIBE = f"""\
DECLARE @Endpoint nvarchar(200) = ?, @QueueAddress nvarchar(200) = ?, @Topic nvarchar(200) = ?;
MERGE {TABLE} WITH (HOLDLOCK, TABLOCK) AS target
USING(SELECT @Endpoint AS Endpoint, @QueueAddress AS QueueAddress, @Topic AS Topic) AS source
ON target.Endpoint = source.Endpoint
AND target.Topic = source.Topic
WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN
UPDATE SET QueueAddress = @QueueAddress
WHEN NOT MATCHED THEN
INSERT
(
    QueueAddress,
    Topic,
    Endpoint
)
VALUES
(
    @QueueAddress,
    @Topic,
    @Endpoint
);"""

SQLSERVER_UNSUBSCRIBE = f"""\
DECLARE @Endpoint nvarchar(200) = ?, @Topic nvarchar(200) = ?;
DELETE FROM {TABLE}
WHERE
    Endpoint = @Endpoint and
    Topic = @Topic"""

SQLSERVER_CREATE_TABLE = f"""\
CREATE TABLE {TABLE} (
    QueueAddress NVARCHAR(200) NOT NULL,
    Endpoint NVARCHAR(200) NOT NULL,
    Topic NVARCHAR(200) NOT NULL,
    PRIMARY KEY CLUSTERED
    (
        Endpoint,
        Topic
    )
)"""

#: PostgreSqlConstants.cs:134-148, @names as psycopg's placeholders.
POSTGRESQL_SUBSCRIBE = """\
INSERT INTO "shop"."SubscriptionRouting"
(
    QueueAddress,
    Topic,
    Endpoint
)
VALUES
(
    %s,
    %s,
    %s
)
ON CONFLICT (Endpoint, Topic) DO UPDATE SET QueueAddress = %s"""

POSTGRESQL_CREATE = """\
CREATE TABLE IF NOT EXISTS "shop"."SubscriptionRouting" (
    QueueAddress VARCHAR(200) NOT NULL,
    Endpoint VARCHAR(200) NOT NULL,
    Topic VARCHAR(200) NOT NULL,
    PRIMARY KEY
    (
        Endpoint,
        Topic
    )
) WITH (fillfactor=100)"""


def sqlserver() -> SqlServerDialect:
    return SqlServerDialect(
        "legacy",
        SqlServerConnection.model_validate(
            {"type": "sqlserver", "dsn": "Driver=x", "schema": "dbo", "catalog": "nsb"}
        ),
    )


def parse(statement: str) -> list[Any]:
    parsed = sqlglot.parse(statement, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(e is not None and not isinstance(e, exp.Command) for e in parsed), parsed
    return list(parsed)


def tables(trees: list[Any]) -> set[tuple[str, str, str]]:
    return {(t.catalog, t.db, t.name) for tree in trees for t in tree.find_all(exp.Table)} - {
        ("", "", "source")
    }


def test_sqlserver_statements_are_the_transports_own() -> None:
    made = statements(sqlserver(), "SubscriptionRouting")
    assert made.subscribe == SQLSERVER_SUBSCRIBE
    assert made.subscribe_order == ("endpoint", "address", "topic")  # the DECLARE's order
    assert made.unsubscribe == SQLSERVER_UNSUBSCRIBE
    assert made.subscribers(3) == (
        f"SELECT DISTINCT QueueAddress\nFROM {TABLE}\nWHERE Topic IN (?, ?, ?)"
    )
    # Behind the guard every SQL Server table of the transport is created behind.
    assert SQLSERVER_CREATE_TABLE in made.create
    assert made.create.startswith(
        "IF EXISTS (\nSELECT *\nFROM [nsb].sys.objects\n"
        "WHERE object_id = OBJECT_ID(N'[nsb].[dbo].[SubscriptionRouting]')"
    )
    assert "EXEC sp_getapplock @Resource = '[nsb].[dbo].[SubscriptionRouting]_lock'" in made.create


def test_sqlserver_statements_parse_as_tsql_on_the_subscription_table() -> None:
    made = statements(sqlserver(), "SubscriptionRouting")
    expected = {("nsb", "dbo", "SubscriptionRouting")}
    subscribe = parse(made.subscribe)
    assert [type(t).__name__ for t in subscribe] == ["Declare", "Merge"]
    merge = subscribe[1]
    assert merge.sql(dialect="tsql").startswith(
        "MERGE INTO [nsb].[dbo].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target"
    )
    assert tables(subscribe) == expected
    unsubscribe = parse(made.unsubscribe)
    assert [type(t).__name__ for t in unsubscribe] == ["Declare", "Delete"]
    assert tables(unsubscribe) == expected
    (lookup,) = parse(made.subscribers(2))
    assert isinstance(lookup, exp.Select) and tables([lookup]) == expected
    # sqlglot's T-SQL does not read `PRIMARY KEY CLUSTERED`: the CREATE is held golden above.


def test_postgresql_statements_are_the_transports_own() -> None:
    dialect = PostgresDialect(
        "shop",
        PostgresConnection.model_validate(
            {"type": "postgresql", "dsn": "host=x", "schema": "shop"}
        ),
    )
    made = statements(dialect, "SubscriptionRouting")
    assert made.create == POSTGRESQL_CREATE
    assert made.subscribe == POSTGRESQL_SUBSCRIBE
    assert made.subscribe_order == ("address", "topic", "endpoint", "address")
    assert made.unsubscribe == (
        'DELETE FROM "shop"."SubscriptionRouting"\nWHERE\n    Endpoint = %s and\n    Topic = %s'
    )
    assert made.subscribers(2) == (
        'SELECT DISTINCT QueueAddress\nFROM "shop"."SubscriptionRouting"\nWHERE Topic IN (%s, %s)'
    )
    for statement in (made.create, made.subscribe.replace("%s", "'x'")):
        sqlglot.parse_one(statement, read="postgres", error_level=sqlglot.ErrorLevel.RAISE)


def test_sqlite_upserts_as_postgresql_does() -> None:
    dialect = SqliteDialect(
        "local", SqliteConnection.model_validate({"type": "sqlite", "path": "x.db"})
    )
    made = statements(dialect, "Subs")
    assert made.subscribe == POSTGRESQL_SUBSCRIBE.replace(
        '"shop"."SubscriptionRouting"', '"Subs"'
    ).replace("%s", "?")
    assert "QueueAddress TEXT NOT NULL" in made.create


def test_a_publisher_names_each_subscribers_table_in_its_schema_and_catalog() -> None:
    """SQL Server addresses `table@[schema]@[catalog]`, parts left out being the connection's
    (Particular/NServiceBus.SqlServer@214c4e8f src/NServiceBus.Transport.SqlServer/Addressing/
    QueueAddress.cs:23-58); schemas and catalogs compare without case."""
    from bridge.transports.sql.publish import SqlPublisher

    config = SqlServerConnection(type="sqlserver", dsn="Driver=x", schema="dbo", catalog="nsb")
    sink = SqlPublisher(SqlServerDialect("legacy", config), config)

    def table(address: str) -> str:
        found = sink._tables.find(address)
        assert found is not None
        dialect, name = found
        return dialect.table(name)

    assert table("Billing") == "[nsb].[dbo].[Billing]"
    assert table("Billing@[DBO]@[NSB]") == "[nsb].[dbo].[Billing]"
    assert table("Billing@[sales]") == "[nsb].[sales].[Billing]"
    assert table("Billing@[sales]@[other]") == "[other].[sales].[Billing]"
    lite = SqliteConnection(type="sqlite", path=":memory:")
    sqlite = SqlPublisher(SqliteDialect("lite", lite), lite)
    assert sqlite._tables.find('"main"."Billing"') is not None
    assert sqlite._tables.find('"other"."Billing"') is None  # an attached database: not reached
