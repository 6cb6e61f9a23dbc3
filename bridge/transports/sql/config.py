"""The SQL connections of routes.yaml (`sqlite`, `postgresql`, `sqlserver`) and their rules.

Driver-free: `bridge check` and the config loader import it without psycopg or pyodbc.
PostgreSQL and SQL Server connections size the pool their routes share (`pool_size`,
`pool_timeout`: `bridge.transports.sql.pool`); SQLite has none.
A queue table name a database or the NServiceBus installer would refuse is found here, before
anything connects: PostgreSQL tables of more than 55 bytes (the installer's limit: the `seq`
sequence's name must fit 63-byte identifiers), SQL Server tables over 128 characters (sysname),
and a PostgreSQL DSN libpq would refuse (`dsn_problems`, with psycopg when it is installed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from bridge.config.base import Problem, Strict
from bridge.transports.sql.addresses import address_key, canonical_address

__all__ = [
    "ADDRESS_KEY",
    "DEFAULT_POOL_SIZE",
    "DEFAULT_POOL_TIMEOUT",
    "DEFAULT_RESPONSE_TIMEOUT",
    "DEFAULT_SUBSCRIPTIONS",
    "KINDS",
    "MAX_DELAY_SECONDS",
    "MAX_TABLE_NAME_BYTES",
    "NGINN_ENDPOINT_CHARS",
    "NGINN_MESSAGE_TYPE_CHARS",
    "NGINN_SUBSCRIPTION_ENDPOINT_CHARS",
    "SOURCE_GROUP",
    "SQLSERVER_MAX_NAME",
    "NGinnOptions",
    "PostgresConnection",
    "SqlServerConnection",
    "SqliteConnection",
    "address_key",
    "address_problem",
    "canonical_address",
    "dsn_problems",
    "lint",
    "nginn_problems",
]

KINDS = ("sqlite", "postgresql", "sqlserver")
#: NGinn's subscription table, as its database document names it (seed 001).
DEFAULT_SUBSCRIPTIONS = "NGinnMessageBus_Subscriptions"
#: NGinn's `from_endpoint` and `to_endpoint` are varchar(50) (createmqueue.sqlserver.sql:5-6).
NGINN_ENDPOINT_CHARS = 50
#: The widths of NGinn's subscription table's endpoint and message type columns
#: (create_subscribertable.sqlserver.sql:4-6).
NGINN_SUBSCRIPTION_ENDPOINT_CHARS, NGINN_MESSAGE_TYPE_CHARS = 200, 300
#: What an IANA zone name is made of (the layout writes it into SQL as a literal).
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
#: What a route end on this connection names, and whether a source reads in a consumer group.
ADDRESS_KEY = "queue"
#: The longest delay into a queue table: 2^31-1 s (about 68 years), so that every `Due` and
#: `retry_time` is far inside what `datetime` (to 9999) and `timestamptz` hold, and the
#: seconds fit the Int32 parts of NServiceBus's store (`bridge.transports.sql.delayed`).
MAX_DELAY_SECONDS: int | None = 2**31 - 1
SOURCE_GROUP = False
#: The NServiceBus PostgreSQL installer's limit on a queue table name, in bytes.
MAX_TABLE_NAME_BYTES = 55
SQLSERVER_MAX_NAME = 128  # sysname
#: Server connections one process's routes share per PostgreSQL or SQL Server connection: a
#: busy loop holds two (its batch and the one received ahead), so ten keep about five loops
#: moving at full speed at once while idle ones only borrow one per poll; ten per process
#: and worker leaves most of PostgreSQL's default `max_connections` (100) to the endpoints.
DEFAULT_POOL_SIZE = 10
#: Seconds a route waits for a free pooled connection before it backs off (and retries).
DEFAULT_POOL_TIMEOUT = 10.0
#: Seconds a route's call waits for PostgreSQL's answer before the connection is dropped as
#: dead: well above any receive, send or commit the bridge makes (milliseconds to a second or
#: two under load), well below the hours a silent network holds a blocked read otherwise.
DEFAULT_RESPONSE_TIMEOUT = 60.0


class NGinnOptions(Strict):
    """`nginn:` of a connection with `layout: nginn` (README, "NGinn.MessageBus tables")."""

    alias: str = Field(
        min_length=1,
        description="The connection alias NGinn endpoints use for this database (the name of "
        "its connection string in their configuration): a table's own endpoint is "
        "`sql://<alias>/<table>`. Required: NGinn refuses rows from an alias it does not know.",
    )
    subscriptions: str = Field(
        DEFAULT_SUBSCRIPTIONS,
        min_length=1,
        description="The NGinn subscription table's name.",
    )
    timezone: str = Field(
        description="The IANA time zone of the database server's clock (e.g. Europe/Warsaw): "
        "NGinn's time columns hold that zone's local time.",
    )
    types: dict[str, str] = Field(
        default_factory=dict,
        description="NServiceBus message type full name -> NGinn `$type` (`Ns.Type, Assembly`).",
    )
    retries: bool = Field(
        False,
        description="The bridge moves due `R` rows back to `I` and deletes `X` rows older than "
        "12 hours in the tables it reads, as NGinn's own process does; only for tables no "
        "NGinn process owns.",
    )

    def message_type(self, event: str) -> str:
        """NGinn's name of NServiceBus type `event` (its subscription rows' `message_type`, a
        .NET full name): the part of its `types` entry before the comma, else `event`."""
        return self.types.get(event, event).split(",", 1)[0].strip() or event


class _Sql(Strict):
    layout: Literal["nservicebus", "nginn"] = Field(
        "nservicebus",
        description="Queue table layout: `nservicebus` (the NServiceBus SQL transport's) or "
        "`nginn` (NGinn.MessageBus's; settings in `nginn`).",
    )
    delayed_suffix: str = Field(
        "Delayed",
        min_length=1,
        pattern=r"\S",
        description="Suffix of the delayed table `<queue>.<suffix>` of each queue table "
        "(NServiceBus's `NativeDelayedDelivery().TableSuffix`); `layout: nservicebus` only.",
    )
    # Annotated, so that type checkers without pydantic's plugin see the default too.
    nginn: Annotated[
        NGinnOptions | None,
        Field(
            description="NGinn.MessageBus settings; only with `layout: nginn`, which needs them."
        ),
    ] = None
    subscription_table: str = Field(
        "SubscriptionRouting",
        min_length=1,
        description="The native pub/sub table of the NServiceBus SQL transport, in `schema`.",
    )

    @property
    def keeps_failed(self) -> bool:
        """Whether a source here keeps what it cannot forward in its own table (NGinn's `F`
        subqueue) unless its route names an error queue."""
        return self.layout == "nginn"


class SqliteConnection(_Sql):
    type: Literal["sqlite"]
    path: str = Field(min_length=1, description="SQLite database file; created when missing.")
    busy_timeout: float = Field(30.0, gt=0, description="Seconds to wait on a locked database.")


class _Pooled(_Sql):
    pool_size: int = Field(
        DEFAULT_POOL_SIZE,
        ge=1,
        le=10_000,
        description="Most server connections the routes of one process hold on this connection "
        "at once (plus one for administration); see README, 'Connections and pools'.",
    )
    pool_timeout: float = Field(
        DEFAULT_POOL_TIMEOUT,
        gt=0,
        description="Seconds a route waits for a free pooled connection before it backs off.",
    )


class PostgresConnection(_Pooled):
    type: Literal["postgresql"]
    dsn: str = Field(description="libpq connection string or URL; keep secrets in ${VAR}.")
    schema_: str = Field(
        "public", alias="schema", min_length=1, description="Schema of the queue tables."
    )
    response_timeout: float = Field(
        DEFAULT_RESPONSE_TIMEOUT,
        gt=0,
        description="Seconds one receive, send or commit of a route waits for the server's "
        "answer before the connection is dropped as dead and the route backs off: a network "
        "that stalls without closing the connection is noticed.",
    )


class SqlServerConnection(_Pooled):
    type: Literal["sqlserver"]
    dsn: str = Field(min_length=1, description="ODBC connection string; keep secrets in ${VAR}.")
    schema_: str = Field(
        "dbo", alias="schema", min_length=1, description="Schema of the queue tables."
    )
    catalog: str | None = Field(
        None, min_length=1, description="Database; the DSN's default when omitted."
    )


SqlConnection = SqliteConnection | PostgresConnection | SqlServerConnection


def lint(connection: SqlConnection) -> Iterator[Problem]:
    """A PostgreSQL DSN libpq would refuse (`dsn_problems`); NGinn settings (`nginn_problems`)."""
    if isinstance(connection, PostgresConnection):
        for problem in dsn_problems(connection.dsn):
            yield "dsn", problem
    yield from nginn_problems(connection)


def warnings(connection: SqlConnection) -> Iterator[Problem]:
    """Settings that work but leave a silent network unnoticed: a PostgreSQL DSN whose
    `connect_timeout` is 0 (or less), with which libpq waits for ever to open a connection
    (the bridge's own default, when the DSN names none, is 10 s)."""
    if not isinstance(connection, PostgresConnection) or _UNSET in connection.dsn:
        return
    try:
        from psycopg.conninfo import conninfo_to_dict

        value = str(conninfo_to_dict(connection.dsn).get("connect_timeout", "")).strip()
        seconds = int(value) if value else None
    except Exception:  # psycopg missing, or a DSN that lint refuses
        return
    if seconds is not None and seconds <= 0:
        yield (
            "dsn",
            f"dsn: connect_timeout={value} lets opening a connection wait for ever on a silent "
            "network (libpq reads 0 as no limit); leave it out (10 s) or give it seconds",
        )


def nginn_problems(connection: SqlConnection) -> Iterator[Problem]:
    """`nginn` given without `layout: nginn` or missing with it, a time zone that is no IANA
    zone, an alias that leaves no room in NGinn's 50-character endpoint columns."""
    options = connection.nginn
    if connection.layout != "nginn":
        if options is not None:
            yield "nginn", "`nginn` settings need `layout: nginn`"
        return
    if options is None:
        yield (
            "layout",
            "`layout: nginn` needs `nginn: {alias: <NGinn's connection alias>, "
            "timezone: <IANA zone>}` at least",
        )
        return
    zone = options.timezone
    if not _ZONE_NAME.fullmatch(zone) or not _is_zone(zone):
        yield (
            "nginn.timezone",
            f"nginn.timezone: {zone!r} is not an IANA time zone name (e.g. Europe/Warsaw)",
        )
    alias = options.alias
    if len(f"sql://{alias}/") >= NGINN_ENDPOINT_CHARS or not alias.strip() or "/" in alias:
        yield (
            "nginn.alias",
            (
                f"nginn.alias: {alias[:60]!r}: NGinn endpoints `sql://<alias>/<table>` hold "
                f"at most {NGINN_ENDPOINT_CHARS} characters, and an alias has no `/`"
            ),
        )
    for name, target in options.types.items():
        if not target.strip() or "," not in target:
            yield (
                "nginn.types",
                (
                    f"nginn.types[{name!r}]: {target!r} is not an NGinn `$type` "
                    "(`Ns.Type, Assembly`)"
                ),
            )


def _is_zone(name: str) -> bool:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


#: libpq's values for the options whose mistakes it finds only when it connects (and psycopg
#: then reports as a failed connection, which the bridge would retry).
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: libpq messages whose quoted text is an option name the user wrote; any other quoted text
#: may be (part of) a password, and is not shown.
_NAME_MESSAGES = ("invalid connection option", "invalid URI query parameter")
_QUOTED = re.compile(r'"([^"]*)"')
#: The placeholder the loader writes for a missing variable when nothing will connect.
_UNSET = "<unset-"


def dsn_problems(dsn: str) -> Iterator[str]:
    """What libpq would refuse in a PostgreSQL DSN, parsed as psycopg parses it (libpq's
    `PQconninfoParse`, no connection); nothing when psycopg is not installed (it is needed to
    connect anyway) or the DSN is a placeholder (`install --print-sql` without variables)."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return
    if _UNSET in dsn:
        return
    try:
        options = conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        yield f"invalid dsn: {_without_values(str(exc), dsn)}"
        return
    for port in str(options.get("port", "")).split(",") if options.get("port") else ():
        if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            yield "dsn: the port must be a number from 1 to 65535"
    for name in ("connect_timeout", "keepalives_idle", "keepalives_interval"):
        value = str(options.get(name, "0")).strip()
        if not value.lstrip("-").isdigit():
            yield f"dsn: {name} must be a whole number of seconds"
    sslmode = options.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        yield f"dsn: sslmode {sslmode!r} is not one of {', '.join(_SSLMODES)}"
    elif options.get("sslrootcert"):
        yield from _downgrade_problems(sslmode)


#: sslmodes under which libpq connects without TLS when the server does not offer it.
_DOWNGRADING = ("disable", "allow", "prefer")


def _downgrade_problems(sslmode: str | None) -> Iterator[str]:
    """A DSN that names the CA to verify the server with, and an sslmode under which libpq goes
    on without TLS, or verifies the chain but not the host name (`require`, which libpq with a
    root certificate treats as `verify-ca`, and `verify-ca`): anyone holding a certificate of
    that CA for another host could stand in for the server. Naming a CA asks for verification,
    and `verify-full` is the mode that verifies."""
    said = f"sslmode={sslmode}" if sslmode else None
    if sslmode is None:
        environ = os.environ.get("PGSSLMODE")  # libpq's default for a DSN without sslmode
        sslmode = environ or "prefer"
        said = f"PGSSLMODE={environ}" if environ else "no sslmode (libpq's default: prefer)"
    if sslmode == "verify-full":
        return
    if sslmode in _DOWNGRADING:
        does = (
            "never uses TLS"
            if sslmode == "disable"
            else ("connects without TLS to a server that does not offer it")
        )
    elif sslmode == "require":
        does = (
            "checks the certificate's chain (libpq treats require with a root certificate as "
            "verify-ca) but not the server's host name"
        )
    else:
        does = "checks the certificate's chain but not the server's host name"
    yield (
        f"dsn: sslrootcert names a CA to verify the server with, but {said} {does}: write "
        "sslmode=verify-full"
    )


#: A `password=` value and the word after it (part of the password when it has an unquoted
#: space, which libpq then reads as the next option's name).
_PASSWORD_VALUE = re.compile(r"password\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)(\s+\S+)?", re.IGNORECASE)


def _without_values(message: str, dsn: str) -> str:
    """libpq's `message` with every quoted piece of the DSN hidden but option names outside
    the password: a malformed password shows up there ('missing "=" after "ret"')."""
    secrets = "".join(match.group(0) for match in _PASSWORD_VALUE.finditer(dsn))
    if "://" in dsn and "@" in dsn:
        secrets += dsn.rsplit("@", 1)[0]  # the URL's user and password
    names_shown = message.startswith(_NAME_MESSAGES)

    def shown(match: re.Match[str]) -> str:
        text = match.group(1)
        if not text.strip("=[]") or (
            names_shown and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", text) and text not in secrets
        ):
            return match.group(0)
        return '"..."'

    return _QUOTED.sub(shown, " ".join(message.split()))


def address_problem(kind: str, name: str) -> str | None:
    """Why `kind` would refuse a queue table called `name`, or None."""
    if kind == "postgresql":
        size = len(name.encode("utf-8"))
        if size > MAX_TABLE_NAME_BYTES:
            return (
                f"PostgreSQL queue table name {name!r} is {size} bytes long; "
                f"the NServiceBus PostgreSQL transport allows at most {MAX_TABLE_NAME_BYTES}"
            )
    elif kind == "sqlserver" and len(name) > SQLSERVER_MAX_NAME:
        return (
            f"SQL Server table name {name[:40]!r}... is {len(name)} characters long; "
            f"identifiers hold at most {SQLSERVER_MAX_NAME}"
        )
    return None
