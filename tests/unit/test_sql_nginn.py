"""The NGinn.MessageBus layout without a database: SQL Server's statements against golden text
and the T-SQL parser, the `k=v|k=v` headers, the row <-> envelope mapping and its settings.

Facts come from lafar6502/nginn-messagebus @1fa4baf (paths under `NGinnBPM.MessageBus/`); the
statements run against real PostgreSQL and SQLite in tests/integration/test_sql_nginn.py.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from bridge.commands import addresses
from bridge.config.loader import parse_config
from bridge.envelope import Envelope, Headers, PoisonMessage
from bridge.errors import ConfigError, HeadersFormatError
from bridge.nservicebus.deadletter import error_copy
from bridge.nservicebus.wireformat import parse_timestamp
from bridge.transports.sql.config import (
    NGinnOptions,
    PostgresConnection,
    SqliteConnection,
    SqlServerConnection,
)
from bridge.transports.sql.dialects.postgresql import PostgresDialect
from bridge.transports.sql.dialects.sqlite import SqliteDialect
from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
from bridge.transports.sql.layouts.nginn import NGinnLayout
from bridge.transports.sql.layouts.nginn_formats import format_headers, parse_headers
from bridge.transports.sql.layouts.nginn_incoming import NGinnRow
from bridge.transports.sql.layouts.nginn_outgoing import LEFT_OUT, OutgoingNGinnRow
from bridge.transports.sql.layouts.nginn_rows import RowMapping
from bridge.transports.sql.layouts.nginn_sql import create_sqlserver
from tests.support.nginn import NGINN_QUERIES

NGINN: dict[str, Any] = {
    "timezone": "Europe/Warsaw",
    "alias": "db",
    "types": {"Sales.OrderPlaced": "Sales.Messages.OrderPlaced, Sales.Messages"},
}

#: createmqueue.sqlserver.sql:1-32, verbatim (the table NGinn creates at start,
#: SqlMessageTransport2.cs:392-402).
NGINN_SCRIPT = (
    "IF  not exists (SELECT * FROM sys.objects WHERE object_id = OBJECT_ID(N'[dbo].[{0}]') "
    "AND type in (N'U'))\n"
    "BEGIN\n"
    "CREATE TABLE [dbo].[{0}](\n"
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
    " CONSTRAINT [PK_{0}] PRIMARY KEY CLUSTERED \n"
    "(\n"
    "\t[id] ASC\n"
    ")WITH (PAD_INDEX  = OFF, STATISTICS_NORECOMPUTE  = OFF, IGNORE_DUP_KEY = OFF, "
    "ALLOW_ROW_LOCKS  = ON, ALLOW_PAGE_LOCKS  = ON) \n"
    ") \n"
    "\n"
    "CREATE NONCLUSTERED INDEX [IDX_{0}_subqueue_retry_time] ON [dbo].[{0}] \n"
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

T = "[shop].[dbo].[Orders]"
GOLDEN = {
    "receive": (
        "DECLARE @endpoint varchar(50) = ?, @n int = ?;\n"
        f"WITH message AS (SELECT TOP(@n) * FROM {T} WITH (UPDLOCK, READPAST, ROWLOCK)\n"
        "  WHERE subqueue = 'I' AND LOWER(to_endpoint) = LOWER(@endpoint) "
        "ORDER BY retry_time, id)\n"
        "UPDATE message SET subqueue = 'X', last_processed = getdate()\n"
        "OUTPUT inserted.id, inserted.from_endpoint, inserted.to_endpoint, "
        "inserted.retry_count, inserted.insert_time, inserted.retry_time, "
        "inserted.correlation_id, inserted.label, inserted.msg_text, inserted.msg_headers, "
        "inserted.unique_id, getdate();"
    ),
    "send": (
        "DECLARE @from_endpoint varchar(50) = ?, @to_endpoint varchar(50) = ?, "
        "@error_info nvarchar(max) = ?, @msg_body nvarchar(max) = ?, "
        "@correl_id varchar(100) = ?, @label varchar(100) = ?, "
        "@headers nvarchar(max) = ?, @unique_id varchar(40) = ?;\n"
        f"INSERT INTO {T} ([from_endpoint], [to_endpoint],[subqueue],[insert_time],"
        "[last_processed],[retry_count],[retry_time],[error_info],[msg_text],[correlation_id],"
        "[label], [msg_headers], [unique_id]) VALUES (@from_endpoint, @to_endpoint, 'I', "
        "getdate(), null, 0, getdate(), @error_info, @msg_body, @correl_id, @label, @headers, "
        "@unique_id);"
    ),
    "fail": (
        "DECLARE @error_info nvarchar(max) = ?, @id bigint = ?;\n"
        f"update {T} with(rowlock) set retry_count = retry_count + 1, retry_time=getdate(), "
        "error_info=@error_info, last_processed=getdate(), subqueue='F' "
        "where id=@id and subqueue='X'"
    ),
    "mover": (
        f"WITH due AS (SELECT TOP (1000) * FROM {T} WITH (READPAST)\n"
        "  where subqueue='R' and retry_time <= getdate())\n"
        "UPDATE due SET subqueue='I'"
    ),
    "cleanup": (
        f"WITH done AS (SELECT TOP (10000) * FROM {T} WITH (READPAST)\n"
        "  where retry_time <= DATEADD(hour, -12, getdate()) and subqueue='X')\n"
        "DELETE FROM done"
    ),
    "depth": (
        "DECLARE @endpoint varchar(50) = ?;\n"
        f"select count(*) from {T} with(nolock) "
        "WHERE subqueue = 'I' AND LOWER(to_endpoint) = LOWER(@endpoint)"
    ),
    "elsewhere": (
        "DECLARE @endpoint varchar(50) = ?;\n"
        f"select count(*) from {T} with(nolock) "
        "WHERE subqueue = 'I' AND LOWER(to_endpoint) <> LOWER(@endpoint)"
    ),
}


def sqlserver(**nginn: Any) -> SqlServerDialect:
    config: dict[str, Any] = {"type": "sqlserver", "dsn": "Driver=FreeTDS;Server=nowhere"}
    config |= {"catalog": "shop", "layout": "nginn", "nginn": NGINN | nginn}
    return SqlServerDialect("legacy", SqlServerConnection.model_validate(config))


def postgresql() -> PostgresDialect:
    config = {"type": "postgresql", "dsn": "postgresql://nowhere", "layout": "nginn"}
    return PostgresDialect("shop", PostgresConnection.model_validate(config | {"nginn": NGINN}))


def sqlite() -> SqliteDialect:
    config = {"type": "sqlite", "path": "x", "layout": "nginn", "nginn": NGINN}
    return SqliteDialect("local", SqliteConnection.model_validate(config))


def layout_of(dialect: SqlServerDialect | PostgresDialect | SqliteDialect) -> NGinnLayout:
    assert isinstance(dialect.layout, NGinnLayout)
    return dialect.layout


# -- SQL Server --------------------------------------------------------------------------------


def test_install_runs_nginns_own_table_script_with_the_dialects_names() -> None:
    assert create_sqlserver("[dbo].[{0}]", "{0}", None) == NGINN_SCRIPT
    (script,) = sqlserver().queue_statements("Orders").create
    assert script == NGINN_SCRIPT.replace("[dbo].[{0}]", T).replace("{0}", "Orders").replace(
        "FROM sys.objects", "FROM [shop].sys.objects"
    )


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_sqlserver_statements_are_golden(name: str) -> None:
    assert getattr(layout_of(sqlserver()).nginn_statements("Orders"), name) == GOLDEN[name]


def test_the_receive_is_nginns_two_step_receive_for_many_rows() -> None:
    """The layout's receive, parsed, against NGinn's SelectAndLockNext1/2 (NamedQueries.sqlserver
    .json:2, 4, verbatim in tests.support.nginn), parsed: the same locking hints, the same
    `subqueue='I'` predicate and `retry_time` order when selecting, the same SET when marking
    the rows taken; `TOP(@n)` rather than `top 1`, and only the table's own endpoint's rows."""
    table = "[shop].[dbo].[Orders]"
    select_one = sqlglot.parse_one(NGINN_QUERIES["SelectAndLockNext1"].format(table), read="tsql")
    mark_one = sqlglot.parse_one(NGINN_QUERIES["SelectAndLockNext2"].format(table), read="tsql")
    *_, receive = parse_tsql(layout_of(sqlserver()).nginn_statements("Orders").receive)
    assert isinstance(receive, exp.Update)
    (cte,) = receive.args["with_"].expressions
    select = cte.this
    assert isinstance(select, exp.Select) and isinstance(select_one, exp.Select)

    def hints(tree: exp.Expression) -> set[str]:
        return {v.name.upper() for h in tree.find_all(exp.WithTableHint) for v in h.expressions}

    assert hints(select_one) == {"UPDLOCK", "READPAST"} <= hints(select)
    assert select.args["from_"].this.name == select_one.args["from_"].this.name == "Orders"
    assert select_one.args["where"].this in list(select.args["where"].this.flatten())
    assert [o.this for o in select.args["order"].expressions][:1] == [
        o.this for o in select_one.args["order"].expressions
    ]
    assert select_one.args["limit"].expression.this == "1"
    assert select.args["limit"].expression == exp.Parameter(this=exp.Var(this="n"))
    assert receive.expressions == mark_one.expressions  # SET subqueue='X', last_processed=...
    mine = [
        c
        for c in select.args["where"].this.flatten()
        if "to_endpoint" in c.sql("tsql") and "@endpoint" in c.sql("tsql")
    ]
    assert len(mine) == 1


@pytest.mark.parametrize("name", ["receive", "depth", "oldest", "expired", "elsewhere"])
def test_sqlserver_compares_endpoints_ignoring_case_whatever_the_collation(name: str) -> None:
    """NGinn compares endpoints ignoring case (SqlMessageTransport2.cs:1127, IsLocalEndpoint);
    a case-sensitive collation on `to_endpoint` must not strand `sql://DB/Orders` rows."""
    statement = getattr(layout_of(sqlserver()).nginn_statements("Orders"), name)
    assert "LOWER(to_endpoint)" in statement and "LOWER(@endpoint)" in statement
    assert "to_endpoint =" not in statement and "to_endpoint <>" not in statement


def parse_tsql(statement: str) -> list[Any]:
    parsed = sqlglot.parse(statement, read="tsql", error_level=sqlglot.ErrorLevel.RAISE)
    assert all(e is not None and not isinstance(e, exp.Command) for e in parsed), parsed
    return [e for e in parsed if e is not None]


@pytest.mark.parametrize(
    "name",
    ["receive", "send", "fail", "depth", "oldest", "expired", "elsewhere", "mover", "cleanup"],
)
def test_sqlserver_statements_parse_as_tsql_on_the_queue_table(name: str) -> None:
    statement = getattr(layout_of(sqlserver()).nginn_statements("Orders"), name)
    trees = parse_tsql(statement)
    tables = {
        (t.catalog, t.db, t.name)
        for tree in trees
        for t in tree.find_all(exp.Table)
        if t.name not in ("message", "due", "done")
    }
    assert tables == {("shop", "dbo", "Orders")}


def test_the_script_parses_as_tsql_one_statement_at_a_time() -> None:
    (script,) = sqlserver().queue_statements("Orders").create
    body = script.split("BEGIN\n", 1)[1].rsplit("\nEND", 1)[0]
    table, index = body.split("\n\nCREATE NONCLUSTERED")
    assert [type(e) for e in parse_tsql(table)] == [exp.Create]
    assert [type(e) for e in parse_tsql("CREATE NONCLUSTERED" + index)] == [exp.Create]


def test_print_sql_is_one_standalone_batch() -> None:
    (printed,) = sqlserver().printable(sqlserver().queue_statements("Orders").create)
    assert printed.endswith("COMMIT;\nGO") and "IDX_Orders_subqueue_retry_time" in printed


@pytest.mark.parametrize("make", [postgresql, sqlite], ids=["postgresql", "sqlite"])
def test_postgresql_and_sqlite_statements_parse_in_their_own_sql(make: Any) -> None:
    dialect = make()
    read = {"postgresql": "postgres", "sqlite": "sqlite"}[dialect.kind]
    statements = layout_of(dialect).nginn_statements("Orders")
    for name in (
        "receive",
        "send",
        "fail",
        "depth",
        "oldest",
        "expired",
        "elsewhere",
        "mover",
        "cleanup",
    ):
        text = getattr(statements, name).replace("%s", "?")
        (tree,) = sqlglot.parse(text, read=read, error_level=sqlglot.ErrorLevel.RAISE)
        assert tree is not None and not isinstance(tree, exp.Command), name
    for ddl in statements.create:
        (tree,) = sqlglot.parse(ddl, read=read, error_level=sqlglot.ErrorLevel.RAISE)
        assert isinstance(tree, exp.Create)
    assert "FOR UPDATE SKIP LOCKED" in statements.receive if dialect.kind == "postgresql" else True


def test_ranges_are_not_offered() -> None:
    statements = sqlite().queue_statements("Orders")
    assert statements.receive_range == statements.scan_range == statements.bounds == ""


# -- headers -------------------------------------------------------------------------------------


def test_headers_are_read_as_nginns_reader_reads_them() -> None:
    """IMessageTransport.cs:122-136: split on `|`, empty pairs skipped, each pair split on `=`
    into exactly two parts (else it throws), names and values trimmed, the last name wins."""
    assert parse_headers("a=1| b = 2 ||c=|a=3") == [("a", "3"), ("b", "2"), ("c", "")]
    assert parse_headers(None) == parse_headers("") == []
    for broken in ("a=1|b", "a=1=2", "=|x"):
        with pytest.raises(HeadersFormatError, match="invalid NGinn header string"):
            parse_headers(broken)


def test_what_nginn_cannot_carry_is_left_out_never_written_broken() -> None:
    """IMessageTransport.cs:95-100: a name or value with `|` or `=` is refused by NGinn's
    writer; a null has no form; padding would be trimmed away on reading."""
    text, left_out = format_headers(
        [
            ("Id", "1"),
            ("Types", "A.B, A, Version=1.0.0.0"),
            ("a|b", "x"),
            ("Empty", ""),
            ("Null", None),
            ("Padded", " x "),
            ("Id", "2"),
        ]
    )
    assert text == "Empty=|Id=2"
    assert left_out == ["Types", "a|b", "Null", "Padded"]


@pytest.mark.parametrize(
    "pairs",
    [[], [("a", "1")], [("NServiceBus.MessageId", "x-1"), ("k", ""), ("T", "2026-01-02 03:04:05")]],
)
def test_the_header_writer_is_the_readers_inverse(pairs: list[tuple[str, str]]) -> None:
    text, left_out = format_headers(list(pairs))
    assert left_out == [] and parse_headers(text) == pairs


# -- rows <-> envelopes --------------------------------------------------------------------------


def mapping() -> RowMapping:
    return RowMapping("db", "Europe/Warsaw", NGINN["types"])


def outgoing(headers: Sequence[tuple[str, str | None]], body: bytes = b'{"OrderId": 7}') -> Any:
    return mapping().outgoing(Envelope(Headers(headers), body), 1_800_000_000.0, "Orders")


SENT = [
    ("NServiceBus.MessageId", "6b1e0cbe-0b4a-4fd1-b1a4-1f7c0f9f6f01"),
    ("NServiceBus.EnclosedMessageTypes", "Sales.OrderPlaced, Sales, Version=1.0.0.0"),
    ("NServiceBus.ReplyToAddress", "Billing@[dbo]@[shop]"),
    ("NServiceBus.CorrelationId", "c-1"),
    ("_NG-CorrelationId", "dropped: kept in a column by NGinn"),
]


def test_a_row_nginn_takes_as_its_own() -> None:
    row = outgoing(SENT)
    assert row.to_endpoint == "sql://db/Orders"
    assert row.from_endpoint == "sql://db/Billing"
    assert row.unique_id == SENT[0][1] and row.correlation_id == "c-1"
    assert row.label == "Sales.OrderPlaced"
    assert row.msg_text == '{"$type":"Sales.Messages.OrderPlaced, Sales.Messages","OrderId": 7}'
    assert next(iter(json.loads(row.msg_text))) == "$type"
    assert dict(parse_headers(row.headers)) == {
        "NServiceBus.MessageId": SENT[0][1],
        "NServiceBus.ReplyToAddress": "Billing@[dbo]@[shop]",
        "NServiceBus.CorrelationId": "c-1",
        LEFT_OUT: "1",
    }


def test_the_body_gets_the_mapped_type_first_and_keeps_its_own_where_none_is_mapped() -> None:
    # NGinn's serializer leaves MetadataPropertyHandling at Json.NET's default
    # (Impl/JsonMessageSerializer.cs:48-67), which reads `$type` only as the first property.
    mapped = '{"$type":"Sales.Messages.OrderPlaced, Sales.Messages"'
    assert outgoing(SENT, b" {}").msg_text == " " + mapped + "}"
    # NServiceBus's own assembly-qualified $type, which NGinn's process cannot load, is replaced
    nservicebus = b'{"$type":"Sales.OrderPlaced, Sales, Version=1.0.0.0","OrderId": 7.10}'
    assert outgoing(SENT, nservicebus).msg_text == mapped + ',"OrderId":7.10}'
    unmapped = [("NServiceBus.EnclosedMessageTypes", "X.Y, X")]
    assert outgoing(unmapped, b'{"$type": "X.Y, X", "a": 1}').msg_text == (
        '{"$type": "X.Y, X", "a": 1}'
    )
    # not first: moved first, the other members (nested `$type` too) as they were written
    late = b'{"a": [1, {"$type": "In, X"}], "$type": "X.Y, X" , "b" : "\\u00e9"}'
    assert outgoing(unmapped, late).msg_text == (
        '{"$type":"X.Y, X","a":[1, {"$type": "In, X"}],"b":"\\u00e9"}'
    )
    first = next(iter(json.loads(outgoing(SENT, late).msg_text).items()))
    assert first == ("$type", "Sales.Messages.OrderPlaced, Sales.Messages")


def test_a_derived_type_goes_as_its_first_mapped_base_where_it_is_not_mapped() -> None:
    """`NServiceBus.EnclosedMessageTypes` lists the most derived type first; where only a base
    is in `nginn.types`, the row is typed as that base (NServiceBus bodies carry no `$type`),
    the class an NGinn subscriber of the base loads; refused only where none is mapped."""
    derived = [
        ("NServiceBus.EnclosedMessageTypes", "Sales.Express, Sales;Sales.OrderPlaced, Sales"),
    ]
    row = outgoing(derived, b'{"OrderId": 7}')
    assert row.msg_text == '{"$type":"Sales.Messages.OrderPlaced, Sales.Messages","OrderId": 7}'
    assert row.label == "Sales.Express"  # the label stays the message's own type
    # a body's own $type (a row NGinn wrote names its exact class) outranks a base's entry
    own = b'{"$type": "Lg.Express, Lg", "OrderId": 7}'
    assert json.loads(outgoing(derived, own).msg_text)["$type"] == "Lg.Express, Lg"
    # and the message's own type's entry outranks both
    mapped = [("NServiceBus.EnclosedMessageTypes", "Sales.OrderPlaced, Sales;Other.Base, X")]
    assert json.loads(outgoing(mapped, own).msg_text)["$type"] == (
        "Sales.Messages.OrderPlaced, Sales.Messages"
    )
    unmapped = [("NServiceBus.EnclosedMessageTypes", "Sales.Express, Sales;Other.Base, X")]
    with pytest.raises(HeadersFormatError, match=re.escape("'Sales.Express', 'Other.Base'")):
        outgoing(unmapped)


def test_the_left_out_count_is_right_when_every_header_is_left_out() -> None:
    headers = [
        ("NServiceBus.EnclosedMessageTypes", "Sales.OrderPlaced, Sales, Version=1.0.0.0"),
        ("X", "a=b"),
        ("Y", "c|d"),
    ]
    assert parse_headers(outgoing(headers).headers) == [(LEFT_OUT, "3")]


def test_a_body_with_a_byte_order_mark_is_written_without_it() -> None:
    # NServiceBus.Newtonsoft.Json writes through `new StreamWriter(stream, Encoding.UTF8)`, which
    # starts with a byte order mark (Particular/NServiceBus.Newtonsoft.Json@0328c7b,
    # src/NServiceBus.Newtonsoft.Json/JsonMessageSerializer.cs:47); NGinn's msg_text is text.
    row = outgoing(SENT, b'\xef\xbb\xbf{"OrderId": 7}')
    assert row.msg_text == '{"$type":"Sales.Messages.OrderPlaced, Sales.Messages","OrderId": 7}'
    copy = [("NServiceBus.FailedQ", "Orders"), ("NServiceBus.ExceptionInfo.Message", "x")]
    assert outgoing(copy, b"\xef\xbb\xbfnot json").msg_text == "not json"


@pytest.mark.parametrize(
    ("headers", "body", "why"),
    [
        (SENT, b"<xml/>", "not UTF-8 JSON"),
        (SENT, b"\xff{}", "not UTF-8 JSON"),
        (SENT, b"[1]", "not a JSON object"),
        ([("NServiceBus.EnclosedMessageTypes", "Other.Type, Other")], b"{}", "no `nginn.types`"),
        ([("NServiceBus.MessageId", "x" * 41)], b"{}", "longer than NGinn's unique_id"),
        ([("NServiceBus.CorrelationId", "x" * 101)], b"{}", "correlation_id"),
    ],
)
def test_what_nginn_could_not_take_is_rejected(
    headers: Sequence[tuple[str, str | None]], body: bytes, why: str
) -> None:
    with pytest.raises(HeadersFormatError, match=why):
        outgoing(headers, body)


def test_an_error_queue_copy_is_written_as_it_is_with_its_exception_in_error_info() -> None:
    row = outgoing(
        [
            ("NServiceBus.FailedQ", "Orders"),
            ("NServiceBus.ExceptionInfo.Message", "headers cannot be read"),
            ("NServiceBus.Bridge.RawHeaders", "a=b=c"),
        ],
        b"not json",
    )
    assert row.msg_text == "not json" and row.error_info == (
        'headers cannot be read\n\nNGinn.HeadersLeftOut: {"NServiceBus.Bridge.RawHeaders": "a=b=c"}'
    )
    assert "_NG-TTL" not in row.headers
    assert dict(parse_headers(row.headers))[LEFT_OUT] == "1"


def test_the_time_to_live_is_local_time_in_the_configured_zone() -> None:
    """`_NG-TTL` is "yyyy-MM-dd HH:mm:ss" in local time (MessageBus.cs:666)."""
    envelope = Envelope(Headers(SENT), b"{}", expires_at=1_800_000_000.0 + 90)
    row = mapping().outgoing(envelope, 1_800_000_000.0, "Orders")
    # 2027-01-15 08:01:30 UTC is 09:01:30 in Warsaw (CET, UTC+1)
    assert dict(parse_headers(row.headers))["_NG-TTL"] == "2027-01-15 09:01:30"


def nginn_row(**given: Any) -> NGinnRow:
    fields: dict[str, Any] = {
        "native_id": "42",
        "expired": False,
        "from_endpoint": "sql://db/Shipping",
        "to_endpoint": "sql://db/Orders",
        "retry_count": 2,
        "insert_time": datetime(2026, 7, 1, 14, 0, 0, 123000),  # CEST, UTC+2
        "retry_time": datetime(2026, 7, 1, 14, 0, 0),
        "correlation_id": "corr",
        "label": "Sales.Messages.OrderPlaced",
        "body": '{"$type":"Sales.Messages.OrderPlaced, Sales.Messages","OrderId":1}',
        "headers": "Custom=1|_NG-ReplyTo=sql://db/Replies",
        "unique_id": "u-1",
        "db_now": datetime(2026, 7, 1, 14, 0, 5),
    }
    return NGinnRow(**(fields | given))


def test_a_row_becomes_the_envelope_the_spec_maps() -> None:
    envelope = mapping().incoming(nginn_row(), 0.0, "Orders")
    assert isinstance(envelope, Envelope)
    h = envelope.headers
    assert h.get("NServiceBus.MessageId") == "u-1"
    assert h.get("NServiceBus.CorrelationId") == "corr"
    assert h.get("NServiceBus.ReplyToAddress") == "sql://db/Replies"
    assert h.get("NServiceBus.OriginatingEndpoint") == "sql://db/Shipping"
    assert h.get("NServiceBus.EnclosedMessageTypes") == "Sales.OrderPlaced"  # the map, reversed
    assert h.get("NServiceBus.ContentType") == "application/json"
    assert h.get("NServiceBus.MessageIntent") == "Send"
    sent = parse_timestamp(h.get("NServiceBus.TimeSent") or "")
    assert sent == datetime(2026, 7, 1, 12, 0, 0, 123000, tzinfo=UTC)
    assert h.get("Custom") == "1" and "_NG-ReplyTo" not in h
    assert (h.get("NGinn.Id"), h.get("NGinn.To"), h.get("NGinn.RetryCount")) == (
        "42",
        "sql://db/Orders",
        "2",
    )
    assert envelope.expires_at is None and envelope.native_id == "42"


def test_without_unique_id_the_message_id_is_made_from_table_and_id() -> None:
    first = mapping().incoming(nginn_row(unique_id=None), 0.0, "Orders")
    again = mapping().incoming(nginn_row(unique_id=None), 0.0, "Orders")
    other = mapping().incoming(nginn_row(unique_id=None, native_id="43"), 0.0, "Orders")
    assert isinstance(first, Envelope) and isinstance(again, Envelope)
    assert isinstance(other, Envelope)
    ids = [e.headers.get("NServiceBus.MessageId") for e in (first, again, other)]
    assert ids[0] == ids[1] != ids[2] and len(ids[0] or "") == 36


def test_the_ttl_header_is_the_lifetime_left_by_the_database_clock() -> None:
    row = nginn_row(headers="_NG-TTL=2026-07-01 14:01:05")
    envelope = mapping().incoming(row, 1000.0, "Orders")
    assert isinstance(envelope, Envelope) and envelope.expires_at == 1060.0
    assert "_NG-TTL" not in envelope.headers


@pytest.mark.parametrize(
    ("headers", "body"),
    [("a=b=c", "{}"), ("x", "{}"), ("a=1", "not json"), ("_NG-TTL=soon", "{}"), (b"\xff=1", "{}")],
)
def test_a_row_nginn_could_not_read_is_poison(headers: str | bytes, body: str) -> None:
    poison = mapping().incoming(nginn_row(headers=headers, body=body), 0.0, "Orders")
    assert isinstance(poison, PoisonMessage)
    assert poison.native_id == "42" and "NGinn row 42 cannot be read" in poison.reason
    assert poison.raw_headers == headers


def test_a_row_nginn_could_not_read_keeps_its_identity_from_its_columns() -> None:
    poison = mapping().incoming(nginn_row(headers="a=b=c"), 0.0, "Orders")
    assert isinstance(poison, PoisonMessage)
    assert dict(poison.headers) == {
        "NServiceBus.MessageId": "u-1",
        "NServiceBus.CorrelationId": "corr",
        "NServiceBus.ReplyToAddress": "sql://db/Shipping",
        "NServiceBus.OriginatingEndpoint": "sql://db/Shipping",
        "NServiceBus.TimeSent": "2026-07-01 12:00:00:123000 Z",
        "NGinn.Id": "42",
        "NGinn.To": "sql://db/Orders",
        "NGinn.RetryCount": "2",
        "NGinn.Label": "Sales.Messages.OrderPlaced",
    }
    # its copy into an NGinn error table: the same row identity, the raw headers in error_info
    copy = mapping().outgoing(error_copy(poison, poison.reason, "Orders"), 0.0, "errors")
    assert (copy.unique_id, copy.correlation_id) == ("u-1", "corr")
    assert copy.from_endpoint == "sql://db/Shipping"
    assert dict(parse_headers(copy.headers))["NGinn.Id"] == "42"
    assert '"NServiceBus.Bridge.RawHeaders": "a=b=c"' in (copy.error_info or "")


# -- settings ------------------------------------------------------------------------------------


def check(nginn_yaml: str, layout: str = "nginn") -> None:
    text = textwrap.dedent(
        f"""\
        connections:
          legacy:
            type: sqlite
            path: ./a.db
            layout: {layout}
        {textwrap.indent(nginn_yaml, "    ")}
        routes: []
        """
    )
    parse_config(text, "routes.yaml", {})


def test_good_settings_pass() -> None:
    check("nginn: {timezone: Europe/Warsaw, alias: db, types: {A.B: 'A.B, A'}, retries: true}")
    assert (
        NGinnOptions.model_validate({"timezone": "UTC", "alias": "db"}).subscriptions
        == "NGinnMessageBus_Subscriptions"
    )


@pytest.mark.parametrize(
    ("nginn_yaml", "layout", "where", "message"),
    [
        ("nginn: {timezone: Mars/Olympus, alias: db}", "nginn", "6:23", "is not an IANA time zone"),
        ("nginn: {timezone: UTC, alias: " + "a" * 45 + "}", "nginn", "6:35", "at most 50"),
        (
            "nginn: {timezone: UTC, types: {A.B: NoAssembly}, alias: db}",
            "nginn",
            "6:35",
            "not an NGinn",
        ),
        ("nginn: {timezone: UTC, alias: db}", "nservicebus", "6:12", "need `layout: nginn`"),
        # NGinn throws "Unknown connection string alias" for rows from an alias it does not know
        # (Impl/SqlMessageTransport2.cs:979): no default that may be wrong
        ("nginn: {timezone: UTC}", "nginn", "6:12", "nginn: missing required key 'alias'"),
        ("", "nginn", "5:13", "needs `nginn: {alias: <NGinn's connection alias>, timezone"),
        ("nginn: {alias: db}", "nginn", "6:12", "missing required key 'timezone'"),
    ],
)
def test_bad_settings_are_named_at_their_place(
    nginn_yaml: str, layout: str, where: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check(nginn_yaml, layout)
    assert str(info.value).startswith(f"routes.yaml:{where}: "), str(info.value)
    assert message in str(info.value)


def test_an_nginn_source_keeps_failures_in_f_unless_its_route_names_an_error_queue() -> None:
    text = textwrap.dedent(
        """\
        connections:
          legacy: {type: sqlite, path: ./a.db, layout: nginn, nginn: {timezone: UTC, alias: db}}
          shop: {type: sqlite, path: ./b.db}
        routes:
          - {name: a, from: {connection: legacy, queue: Orders}, to: {connection: shop, queue: O}}
          - {name: b, from: {connection: legacy, queue: Bills}, to: {connection: shop, queue: B},
             error_queue: Poison}
          - {name: c, from: {connection: shop, queue: Back}, to: {connection: legacy, queue: In}}
        """
    )
    config = parse_config(text, "routes.yaml", {}).config
    a, b, c = config.routes
    assert [config.error_queue_of(r) for r in (a, b, c)] == [None, "Poison", "bridge.error"]
    made = addresses(config, installing=True)
    assert made == {
        "legacy": ["Orders", "Bills", "Poison", "In"],
        "shop": ["O", "B", "Back", "bridge.error"],
    }


def test_the_readmes_example_is_valid() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## NGinn.MessageBus tables", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = parse_config(example, "README.md", {"LEGACY_ODBC": "Driver=x"}).config
    legacy = config.connections["legacy"]
    assert isinstance(legacy, SqlServerConnection) and legacy.layout == "nginn"
    assert legacy.nginn is not None and legacy.nginn.timezone == "Europe/Warsaw"


def test_a_range_source_on_an_nginn_table_is_a_config_error() -> None:
    from bridge.transports.sql.source import SqlSource

    with pytest.raises(ConfigError, match="nginn layout has no sequence ranges"):
        SqlSource(sqlite(), "Orders", seq_range=(1, 10))


def test_parameters_bind_in_the_order_the_statements_declare_them() -> None:
    """The send's parameters are an `OutgoingNGinnRow`; the receive's (endpoint, n), the
    failure's (error_info, id): each T-SQL DECLARE and each placeholder list in that order."""
    fields = ["from_endpoint", "to_endpoint", "error_info", "msg_text", "correlation_id"]
    fields += ["label", "headers", "unique_id"]
    assert list(OutgoingNGinnRow._fields) == fields
    declared = ["from_endpoint", "to_endpoint", "error_info", "msg_body", "correl_id"]
    declared += ["label", "headers", "unique_id"]
    statements = layout_of(sqlserver()).nginn_statements("Orders")
    for text, names in [
        (statements.send, declared),
        (statements.receive, ["endpoint", "n"]),
        (statements.fail, ["error_info", "id"]),
    ]:
        declare = text.split(";\n", 1)[0]
        assert [p.split()[0][1:] for p in declare[len("DECLARE ") :].split(", ")] == names
        assert declare.count("?") == len(names)
    portable = layout_of(sqlite()).nginn_statements("Orders")
    assert portable.send.count("?") == len(fields) and portable.receive.count("?") == 2
    assert portable.fail.index("error_info = ?") < portable.fail.index("id = ?")


def test_nginn_endpoints_are_the_addresses_of_an_nginn_connections_tables() -> None:
    from bridge.transports.sql.addresses import address_key, canonical_address

    legacy = PostgresConnection.model_validate(
        {"type": "postgresql", "dsn": "x", "layout": "nginn", "nginn": {**NGINN, "alias": "DB"}}
    )
    assert canonical_address(legacy, "Sales") == "sql://DB/Sales"
    key = address_key(legacy, '"public"."Sales"')
    # the alias compares without case, as NGinn compares endpoints (SqlMessageTransport2.cs:1127)
    assert address_key(legacy, "sql://db/Sales") == key == address_key(legacy, "sql://DB/Sales")
    assert address_key(legacy, "sql://other/Sales") != key
    assert address_key(legacy, "sql://db/sales") != key  # tables compare exactly
    nservicebus = PostgresConnection.model_validate({"type": "postgresql", "dsn": "x"})
    assert canonical_address(nservicebus, "Sales") == '"public"."Sales"'
    assert address_key(nservicebus, "sql://db/Sales") != address_key(nservicebus, "Sales")
