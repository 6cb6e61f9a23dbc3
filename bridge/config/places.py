"""Where a route end really is: two connection names may reach one table, topic or queue.

`place(connection, address)` resolves a route end to the server(s), database and name it
reaches, from the connection's settings alone (nothing connects), so `lint` can refuse a route
whose `from` and `to` are one place under two names: it would forward each message to where
it took it from, for ever.

    sqlite      the database file's real path (symlinks and `..` resolved from the working
                directory, as the bridge opens it) and the table, without ASCII case (SQLite
                folds it in names)
    postgresql  the servers (host:port), the database, the schema and the table; from a URL
                or `key=value` DSN, with libpq's defaults (PGHOST, PGPORT, PGDATABASE,
                PGUSER) for what it leaves out
    sqlserver   the server (`tcp:` and the default port 1433 taken off), the catalog (the
                connection's, else the DSN's `Database`), schema and table, without case (the
                default collation's)
    rabbitmq    the broker (host:port, the scheme's default port), the virtual host (as pika
                reads the URL) and the queue
    kafka       the bootstrap servers and the topic

Two places are one when their kind, database, schema and name are equal and their servers
share one (`localhost`, `127.0.0.1` and `::1` are one host). A connection whose settings cannot
be read here (a DSN alias, an in-memory SQLite database) has no place, and is compared by name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from bridge.config.models import (
    ConnectionConfig,
    PostgresConnection,
    RabbitMQConnection,
    SqliteConnection,
    SqlServerConnection,
)

__all__ = ["Place", "place"]

_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_KEY_VALUE = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")


@dataclass(frozen=True)
class Place:
    """A table, topic or queue as it is on its server; `shown` says it for people."""

    kind: str
    servers: frozenset[str]
    name: tuple[str, ...]
    shown: str

    def same_as(self, other: Place) -> bool:
        return (
            self.kind == other.kind
            and self.name == other.name
            and not self.servers.isdisjoint(other.servers)
        )


def place(connection: ConnectionConfig, address: str) -> Place | None:
    """Where `address` on `connection` is (module docstring); None when it cannot be told."""
    try:
        if isinstance(connection, SqliteConnection):
            return _sqlite(connection.path, address)
        if isinstance(connection, PostgresConnection):
            return _postgresql(connection.dsn, connection.schema_, address)
        if isinstance(connection, SqlServerConnection):
            return _sqlserver(connection.dsn, connection.catalog, connection.schema_, address)
        if isinstance(connection, RabbitMQConnection):
            return _rabbitmq(connection.url, address)
        return _kafka(connection.bootstrap_servers, address)
    except ValueError:  # a setting its own rules refuse, reported there
        return None


def _host(name: str) -> str:
    host = name.strip().strip("[]").lower()
    return "localhost" if host in _LOOPBACK else host


def _server(host: str, port: int | str) -> str:
    return f"{_host(host)}:{port}"


def _sqlite(path: str, table: str) -> Place | None:
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    real = os.path.realpath(Path(path))
    return Place(
        "sqlite", frozenset({real}), (table.translate(_ASCII_LOWER),), f"table {table!r} of {real}"
    )


def _postgresql(dsn: str, schema: str, table: str) -> Place:
    settings = _libpq_settings(dsn)
    hosts = (settings.get("host") or os.environ.get("PGHOST") or "").split(",")
    ports = (settings.get("port") or os.environ.get("PGPORT") or "5432").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    servers = frozenset(
        _server(h or "local socket", p or "5432") for h, p in zip(hosts, ports, strict=True)
    )
    user = settings.get("user") or os.environ.get("PGUSER") or ""
    database = settings.get("dbname") or os.environ.get("PGDATABASE") or user
    shown = f'table "{schema}"."{table}" of database {database!r} on {", ".join(sorted(servers))}'
    return Place("postgresql", servers, (database, schema, table), shown)


def _libpq_settings(dsn: str) -> dict[str, str]:
    """host, port, dbname and user of a libpq URL or `key=value` connection string."""
    if dsn.startswith(("postgresql://", "postgres://")):
        split = urlsplit(dsn)
        netloc = split.netloc.rpartition("@")[2]
        hosts, ports = [], []
        for part in netloc.split(","):
            host, _, port = part.rpartition(":") if not part.endswith("]") else (part, "", "")
            if not host:  # no port: the whole part is the host
                host, port = part, ""
            hosts.append(unquote(host))
            ports.append(port)
        settings = {"host": ",".join(hosts), "dbname": unquote(split.path[1:])}
        if any(ports):
            settings["port"] = ",".join(ports)
        user = split.netloc.rpartition("@")[0].partition(":")[0]
        if user:
            settings["user"] = unquote(user)
        settings.update(parse_qsl(split.query))  # query parameters win, as in libpq
        return {key: value for key, value in settings.items() if value}
    settings = {}
    for match in _KEY_VALUE.finditer(dsn):
        value = match[2]
        if value.startswith("'"):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        settings[match[1].lower()] = value
    return settings


def _sqlserver(dsn: str, catalog: str | None, schema: str, table: str) -> Place | None:
    settings: dict[str, str] = {}
    for part in re.findall(r"((?:[^;{]|\{[^}]*\})+)", dsn):
        key, sep, value = part.partition("=")
        if sep:
            settings[key.strip().lower()] = value.strip().strip("{}")
    raw = next(
        (settings[k] for k in ("server", "address", "addr", "data source") if k in settings), None
    )
    if raw is None:  # a DSN= alias: its server is in odbc.ini, unknown here
        return None
    raw = raw.removeprefix("tcp:")
    host, _, port = raw.partition(",")
    if host in ("(local)", "."):
        host = "localhost"
    if "\\" in host:  # a named instance: its port is the SQL Browser's to say
        machine, _, instance = host.partition("\\")
        server = f"{_host(machine)}\\{instance.lower()}"
    else:
        server = _server(host, port.strip() or "1433")
    database = catalog or settings.get("database") or settings.get("initial catalog") or ""
    name = (database.casefold(), schema.casefold(), table.casefold())
    shown = f"table [{schema}].[{table}] of database {database or '(default)'!r} on {server}"
    return Place("sqlserver", frozenset({server}), name, shown)


def _rabbitmq(url: str, queue: str) -> Place:
    split = urlsplit(url)
    port = split.port or (5671 if split.scheme == "amqps" else 5672)
    server = _server(split.hostname or "localhost", port)
    vhost = unquote(split.path.split("/")[1]) if len(split.path) > 1 else "/"
    shown = f"queue {queue!r} of virtual host {vhost!r} on {server}"
    return Place("rabbitmq", frozenset({server}), (vhost, queue), shown)


def _kafka(bootstrap_servers: str, topic: str) -> Place:
    servers = set()
    for entry in bootstrap_servers.split(","):
        if entry.strip():
            host, _, port = entry.strip().rpartition(":")
            servers.add(_server(host, port) if host else _server(port, 9092))
    shown = f"topic {topic!r} of the cluster at {', '.join(sorted(servers))}"
    return Place("kafka", frozenset(servers), (topic,), shown)
