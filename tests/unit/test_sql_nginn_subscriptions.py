"""NGinn's subscription table: its statements against NGinn's own text.

Facts pinned here (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`):
- create_subscribertable.sqlserver.sql: the columns, widths and primary key;
- Impl/SqlQueue/NamedQueries.sqlserver.json:27-30: GetSubscriptions, UpdateSubscription,
  InsertSubscription, DeleteSubscription (whose `:pub` SqlClient does not bind: `@pub` here);
- Impl/SqlSubscriptionService.cs:104-134: Subscribe = the update, then the insert when the
  update changed no row.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from bridge.transports.sql.config import NGinnOptions
from bridge.transports.sql.nginn_subscriptions import statements
from tests.unit.test_sql_nginn import postgresql, sqlite, sqlserver

TABLE = "[shop].[dbo].[NGinnMessageBus_Subscriptions]"
#: NamedQueries.sqlserver.json:27-30 with {0} filled.
NGINN_TEXT = {
    "subscribers": (
        f"select subscriber_endpoint, message_type from {TABLE} where publisher_endpoint=@pub "
        "and (expiration_date is null or expiration_date >= getdate())"
    ),
    "update": (
        f"update {TABLE} set expiration_date=@expiration where publisher_endpoint=@pub and "
        "subscriber_endpoint=@sub and message_type=@mtype"
    ),
    "insert": (
        f"insert into {TABLE} (publisher_endpoint, subscriber_endpoint, message_type, "
        "created_date, expiration_date) values(@pub, @sub, @mtype, getdate(), @expiration)"
    ),
    "delete": (
        f"delete {TABLE} where publisher_endpoint=@pub and subscriber_endpoint=@sub and "
        "message_type=@mtype"
    ),
}


def parse_tsql(statement: str) -> list[Any]:
    parsed = sqlglot.parse(statement, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(e is not None and not isinstance(e, exp.Command) for e in parsed), parsed
    return [e for e in parsed if e is not None]


def declared(statement: str) -> list[str]:
    """The names the statement's DECLARE binds, in the order of its `?` parameters."""
    first, _, _ = statement.partition(";\n")
    assert first.startswith("DECLARE ")
    return [part.strip().split(" ")[0] for part in first[len("DECLARE ") :].split(",")]


def test_sqlserver_statements_are_nginns_text_behind_a_declare() -> None:
    s = statements(sqlserver(), "NGinnMessageBus_Subscriptions")
    for name in ("update", "insert", "delete"):
        text: str = getattr(s, name)
        assert text.split(";\n", 1)[1] == NGINN_TEXT[name], name
        *declare, statement = parse_tsql(text)
        assert declare and statement is not None
    assert (
        declared(s.update)
        == ["@pub", "@sub", "@mtype", "@expiration"]
        == list(map("@{}".format, s.update_order))
    )
    assert declared(s.insert) == ["@pub", "@sub", "@mtype", "@expiration"]
    assert declared(s.delete) == ["@pub", "@sub", "@mtype"]
    # The publisher's lookup: NGinn's where clause, distinct endpoints of the chain's types.
    lookup = s.subscribers(3)
    assert declared(lookup) == ["@pub"]
    assert NGINN_TEXT["subscribers"].split(" where ", 1)[1] in lookup
    assert lookup.endswith("and message_type in (?, ?, ?)")
    *_, select = parse_tsql(lookup)
    assert isinstance(select, exp.Select) and select.args.get("distinct")
    (create,) = parse_tsql(s.create.split("BEGIN\n", 1)[1].rsplit("\nEND", 1)[0])
    assert isinstance(create, exp.Create)
    columns = {c.name: c.args["kind"].sql("tsql") for c in create.find_all(exp.ColumnDef)}
    assert columns == {
        "publisher_endpoint": "VARCHAR(200)",
        "subscriber_endpoint": "VARCHAR(200)",
        "message_type": "VARCHAR(300)",
        "created_date": "DATETIME",
        "expiration_date": "DATETIME",
    }
    key = create.find(exp.ClusteredColumnConstraint)
    assert key is not None and create.find(exp.PrimaryKeyColumnConstraint) is not None
    assert [o.this.name for o in key.this] == [
        "publisher_endpoint",
        "message_type",
        "subscriber_endpoint",
    ]
    assert s.create.startswith("IF  not exists (SELECT * FROM [shop].sys.objects")


@pytest.mark.parametrize("dialect", [postgresql, sqlite])
def test_portable_statements_parse_with_the_local_clock(dialect: Any) -> None:
    d = dialect()
    s = statements(d, "NGinnMessageBus_Subscriptions")
    read = "postgres" if d.kind == "postgresql" else "sqlite"
    for text in (s.create, s.update, s.insert, s.delete, s.rows, s.subscribers(2), s.clock):
        (tree,) = sqlglot.parse(text.replace("%s", "?"), read=read)
        assert tree is not None and not isinstance(tree, exp.Command), text
    clock = "now() AT TIME ZONE 'Europe/Warsaw'" if d.kind == "postgresql" else "nginn_local("
    assert clock in s.insert and clock in s.subscribers(1)
    assert s.update_order == ("expiration", "pub", "sub", "mtype")


def test_an_nginn_message_type_is_the_full_name_of_the_type_map() -> None:
    options = NGinnOptions(alias="db", timezone="UTC", types={"A.B": "Lg.B, Lg.Asm"})
    assert options.message_type("A.B") == "Lg.B"
    assert options.message_type("A.C") == "A.C"
