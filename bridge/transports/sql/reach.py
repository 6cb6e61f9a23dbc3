"""`QueueTables`: the queue table an address names, in whichever schema (and, on SQL Server,
catalog) it names, with the dialect that names tables there.

An NServiceBus SQL endpoint sends to a schema-qualified address in that schema: SQL Server
`Billing@[sales]`, or `Billing@[sales]@[other]` in another catalog of the same server
(Addressing/QueueAddress.cs:23-58, QueueAddressTranslator.cs:34-49 of
Particular/NServiceBus.SqlServer@214c4e8f), PostgreSQL `"sales"."Billing"`
(PostgreSql/Addressing/QueueAddress.cs:17-42, QueueAddressTranslator.cs:31-45); parts left out
are the connection's. A publisher's copies for subscribers (`publish.py`) and a forwarded
delayed message (`forward.py`) go there alike, on the same connection and in the same
transaction.

SQLite reaches only `main`: another schema would be an attached database the bridge's
connection does not have, and `find` returns None for it.
"""

from __future__ import annotations

from bridge.transports.sql.addresses import parse_postgresql, parse_sqlserver
from bridge.transports.sql.config import SqlConnection
from bridge.transports.sql.dialects.base import Dialect

__all__ = ["QueueTables"]


class QueueTables:
    """The queue tables connection `config` (whose own dialect is `dialect`) reaches by
    address; the dialects of other schemas are made once and kept."""

    def __init__(self, dialect: Dialect, config: SqlConnection) -> None:
        self._dialect = dialect
        self._config = config
        #: (schema, catalog) -> the dialect that names tables there, for addresses elsewhere.
        self._elsewhere: dict[tuple[str, str | None], Dialect] = {}

    def find(self, address: str) -> tuple[Dialect, str] | None:
        """The queue table `address` names, with the dialect of its schema (and catalog); None
        where this connection cannot reach it (no table named; SQLite: not `main`)."""
        config = self._config
        if config.type == "sqlserver":
            table, schema, catalog = parse_sqlserver(address)
            own = getattr(self._dialect, "database", None) or config.catalog
            if catalog is None or (own is not None and catalog.casefold() == own.casefold()):
                catalog = config.catalog
            if schema is None or schema.casefold() == config.schema_.casefold():
                schema = config.schema_
            place: tuple[str, str | None] = (schema, catalog)
            here: tuple[str, str | None] = (config.schema_, config.catalog)
        else:
            table, found = parse_postgresql(address)
            own_schema = config.schema_ if config.type == "postgresql" else "main"
            place, here = (found or own_schema, None), (own_schema, None)
            if config.type == "sqlite" and place != here:
                return None
        if not table:
            return None
        if place == here:
            return self._dialect, table
        if place not in self._elsewhere:
            from bridge.transports.sql.transport import dialect_for

            update: dict[str, object] = {"schema_": place[0]}
            if config.type == "sqlserver":
                update["catalog"] = place[1]
            self._elsewhere[place] = dialect_for(
                self._dialect.connection_name, config.model_copy(update=update)
            )
        return self._elsewhere[place], table
