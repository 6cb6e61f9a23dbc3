"""Queue addresses as the NServiceBus SQL transports write and parse them; driver-free.

An address in a header (`NServiceBus.ReplyToAddress`, `NServiceBus.FailedQ`, ...) names a queue
table in the form of the transport that wrote it:

- SQL Server: `table@[schema]@[catalog]` (Addressing/QueueAddress.cs:23-58 of
  NServiceBus.Transport.SqlServer@214c4e8): the table is everything before the first `@`; schema
  and catalog follow, each optionally in brackets (`]` doubled inside), and may be left out,
  meaning the receiving connection's. The canonical form always has both
  (CanonicalQueueAddress.cs:29-32).
- PostgreSQL: `"schema"."table"` (PostgreSql/Addressing/CanonicalQueueAddress.cs:14-15), split at
  the first `.` outside quotes, each part unquoted (PostgreSql/Addressing/QueueAddress.cs:17-42);
  a bare `table` is in the connection's schema.
- SQLite (this project's): the PostgreSQL form with SQLite's schema, `"main"."table"`.
- NGinn.MessageBus (`layout: nginn`): `sql://<alias>/<table>`, the form of its `from_endpoint`
  and `to_endpoint` columns; the alias compares without case (NGinn looks connection aliases
  up in a case-insensitive dictionary), the table exactly. The canonical form of a table on such
  a connection is this one; the connection's own NServiceBus form names the same table.

`address_key` reduces an address to what identifies the table, so that the registry can tell
which endpoint a header names whatever form it was written in. SQL Server's schema and catalog
compare without case, as its default collations compare names; table names compare exactly,
as the Messaging Bridge compares addresses (names differing in case are refused by `bridge
check`, and a header that differs only in case is reported with the endpoint it resembles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.transports.sql.config import SqlConnection

__all__ = ["address_key", "canonical_address", "parse_postgresql", "parse_sqlserver"]

#: (table, schema, catalog); catalog None: the connection's own, whichever it is.
AddressKey = tuple[str, str | None, str | None]


def bracket(part: str) -> str:
    return "[" + part.replace("]", "]]") + "]"


def double_quote(part: str) -> str:
    return '"' + part.replace('"', '""') + '"'


def _unquote(part: str, opening: str, closing: str) -> str | None:
    if len(part) >= 2 and part.startswith(opening) and part.endswith(closing):
        part = part[1:-1].replace(closing * 2, closing)
    return part if part.strip() else None


def _next_part(address: str) -> tuple[str, str]:
    """The first `@`-separated part (`@` inside brackets belongs to it) and the rest."""
    right_brackets = 0
    for index in range(1, len(address)):
        char = address[index]
        if char == "@" and (address[0] != "[" or right_brackets % 2 == 1):
            return address[:index], address[index + 1 :]
        if char == "]":
            right_brackets += 1
    return address, ""


def parse_sqlserver(address: str) -> tuple[str, str | None, str | None]:
    """(table, schema, catalog) of a SQL Server address; None where it leaves a part out."""
    table, at, rest = address.partition("@")
    if not at:
        return address, None, None
    schema, rest = _next_part(rest)
    catalog = _next_part(rest)[0] if rest else None
    return (
        table,
        _unquote(schema, "[", "]"),
        None if catalog is None else _unquote(catalog, "[", "]"),
    )


def parse_postgresql(address: str) -> tuple[str, str | None]:
    """(table, schema) of a PostgreSQL (or SQLite) address; schema None when left out."""
    quotes = 0
    for index, char in enumerate(address):
        if char == '"':
            quotes += 1
        elif char == "." and quotes % 2 == 0:
            schema = _unquote(address[:index], '"', '"')
            return _unquote(address[index + 1 :], '"', '"') or "", schema
    return _unquote(address, '"', '"') or "", None


def nginn_table(connection: SqlConnection, address: str) -> str | None:
    """The table an NGinn address `sql://<alias>/<table>` names on `connection` (a `layout:
    nginn` connection whose alias it holds, compared without case); else None."""
    own = nginn_alias(connection)
    if own is None or not address.startswith("sql://"):
        return None
    alias, slash, table = address[len("sql://") :].partition("/")
    if not slash or not table or "/" in table or alias.casefold() != own.casefold():
        return None
    return table


def nginn_alias(connection: SqlConnection) -> str | None:
    """The alias NGinn endpoints use for `connection`'s database; None: not `layout: nginn`."""
    options = connection.nginn
    return options.alias if connection.layout == "nginn" and options is not None else None


def canonical_address(connection: SqlConnection, table: str) -> str:
    """The address of `table` on `connection` as the senders there write it in headers:
    NServiceBus's form, or NGinn's endpoint on a `layout: nginn` connection."""
    alias = nginn_alias(connection)
    if alias is not None:
        return f"sql://{alias}/{table}"
    return _nservicebus_address(connection, table)


def _nservicebus_address(connection: SqlConnection, table: str) -> str:
    if connection.type == "sqlserver":
        address = f"{table}@{bracket(connection.schema_)}"
        return f"{address}@{bracket(connection.catalog)}" if connection.catalog else address
    schema = connection.schema_ if connection.type == "postgresql" else "main"
    return f"{double_quote(schema)}.{double_quote(table)}"


def address_key(connection: SqlConnection, address: str, database: str | None = None) -> AddressKey:
    """What identifies the table `address` names on `connection`, parts left out filled in.
    `database` (SQL Server): the connection's database when known, which the config may leave
    to the DSN (the dialect's `database` once connected); a catalog naming it is the
    connection's own, as the canonical addresses the connection writes name it."""
    table_ = nginn_table(connection, address)
    if table_ is not None:  # NGinn's form names the table its NServiceBus form names
        address = _nservicebus_address(connection, table_)
    if connection.type == "sqlserver":  # schemas and catalogs compare as SQL Server does
        table, schema, catalog = parse_sqlserver(address)
        if catalog and database and catalog.casefold() == database.casefold():
            catalog = None
        schema, catalog = schema or connection.schema_, catalog or connection.catalog
        return table, schema.casefold(), None if catalog is None else catalog.casefold()
    table, schema = parse_postgresql(address)
    default = connection.schema_ if connection.type == "postgresql" else "main"
    return table, schema or default, None
