"""Driver exceptions -> bridge errors, one function per dialect, nowhere else.

Retriable (`TransportUnavailable`): the database cannot be reached or the connection broke,
timeouts, deadlocks, serialization failures, a busy/locked SQLite file, the server shutting
down or out of resources. A value the database refuses for good (PostgreSQL and ODBC SQLSTATE
class 22 data exception, PostgreSQL class 54 limit exceeded; SQLite too big, datatype mismatch,
a STRICT table's datatype constraint) is `MessageRejected` without an index: in a sink's insert
it is one message the destination can never take, and the runner sends the batch one by one
to find it. Everything else a driver raises (missing table, permission denied) is a
`TransportError`: retrying will not help. A function returns None for an exception that is not
its driver's, so programming errors keep their own type.

Messages name the connection (`sqlite connection 'local'`), never its DSN: DSNs carry secrets,
and never a server's DETAIL, which can quote a row's message content.
"""

from __future__ import annotations

import sqlite3

from bridge.errors import MessageRejected, TransportError, TransportUnavailable

__all__ = ["postgresql_error", "sqlite_error", "sqlserver_error"]

# SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_PROTOCOL
_SQLITE_RETRIABLE = {5, 6, 10, 13, 14, 15}

# SQLITE_TOOBIG, SQLITE_MISMATCH, SQLITE_CONSTRAINT_DATATYPE (a STRICT table's column type)
_SQLITE_REJECTED = {18, 20, 3091}

# connection exception, transaction rollback (serialization, deadlock), insufficient resources,
# operator intervention (shutdown, statement timeout), system error
_PG_RETRIABLE_CLASSES = {"08", "40", "53", "57", "58"}
_PG_RETRIABLE_STATES = {"55P03"}  # lock_not_available
_PG_REJECTED_CLASSES = {"22", "54"}  # data exception, program limit exceeded

# ODBC: 08xxx connection, HYT00/HYT01 timeouts, 40001 deadlock victim (1205)
_ODBC_RETRIABLE_STATES = {"HYT00", "HYT01", "40001"}
_MSSQL_RETRIABLE_NUMBERS = ("(1205)", "(1222)", "(-2)", "(10054)", "(10060)", "(40613)")


def _error(
    where: str, exc: Exception, retriable: bool, text: str | None = None, *, rejected: bool = False
) -> TransportError:
    text = " ".join((text or str(exc)).split()) or type(exc).__name__
    if retriable:
        return TransportUnavailable(f"{where} unavailable: {text}")
    if rejected:
        return MessageRejected(f"{where}: {text}")
    return TransportError(f"{where}: {text}")


def sqlite_error(where: str, exc: Exception) -> TransportError | None:
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    retriable = code is not None and code & 0xFF in _SQLITE_RETRIABLE
    rejected = isinstance(exc, sqlite3.DataError) or code in _SQLITE_REJECTED
    return _error(where, exc, retriable, rejected=rejected)


def postgresql_error(where: str, exc: Exception) -> TransportError | None:
    import psycopg

    if not isinstance(exc, psycopg.Error):
        return None
    state = exc.sqlstate
    if state is None:  # raised by the client: connect failed, connection closed or broken
        retriable = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
    else:
        retriable = state[:2] in _PG_RETRIABLE_CLASSES or state in _PG_RETRIABLE_STATES
    # DataError without a state: refused by psycopg itself (a NUL character in text).
    rejected = isinstance(exc, psycopg.DataError) or (state or "")[:2] in _PG_REJECTED_CLASSES
    # The server's DETAIL can quote a failing row (message headers and body): keep it out.
    primary = exc.diag.message_primary if state is not None else None
    text = f"{primary} (SQLSTATE {state})" if primary else None
    return _error(where, exc, retriable, text, rejected=rejected)


def sqlserver_error(where: str, exc: Exception) -> TransportError | None:
    import pyodbc

    if not isinstance(exc, pyodbc.Error):
        return None
    state = str(exc.args[0]) if exc.args else ""
    message = str(exc.args[1]) if len(exc.args) > 1 else str(exc)
    retriable = (
        state.startswith("08")
        or state in _ODBC_RETRIABLE_STATES
        or any(number in message for number in _MSSQL_RETRIABLE_NUMBERS)
    )
    return _error(where, exc, retriable, rejected=state.startswith("22"))
