"""The cross-field rules of routes.yaml, in one function, one precise message each."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bridge.config.models import BridgeConfig, Endpoint
from bridge.errors import ConfigError

if TYPE_CHECKING:
    from bridge.config.loader import Positions

__all__ = ["SECRET_KEYS", "credential_warnings", "is_secret", "lint"]

#: Connection fields that may hold a credential; nothing else in routes.yaml may.
SECRET_KEYS = ("dsn", "url", "sasl_password")
_KEY_VALUE_SECRET = re.compile(
    r"\b(?:password|pwd)\s*=\s*(?P<value>\{[^}]*\}|'[^']*'|[^;\s&]+)", re.I
)
_VARIABLE = re.compile(r"\$\{[^}]*\}")
_DEFAULT = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}")


def _endpoint(
    config: BridgeConfig, endpoint: Endpoint, role: str, path: tuple[str | int, ...], at: Positions
) -> None:
    """Check one route end against its connection."""
    connection = config.connections.get(endpoint.connection)
    if connection is None:
        known = ", ".join(sorted(config.connections)) or "none"
        raise ConfigError(
            f"{role} names connection {endpoint.connection!r}, which is not defined "
            f"(known: {known})",
            at.at((*path, "connection")),
        )
    kind = connection.type
    if kind == "kafka":
        if endpoint.topic is None or endpoint.queue is not None:
            raise ConfigError(
                f"{role} is the Kafka connection {endpoint.connection!r}: name a `topic`, "
                "not a `queue`",
                at.at(path),
            )
        if role == "from" and not endpoint.group:
            raise ConfigError("a Kafka source needs a consumer `group`", at.at((*path, "topic")))
    else:
        if endpoint.queue is None or endpoint.topic is not None:
            raise ConfigError(
                f"{role} is the {kind} connection {endpoint.connection!r}: name a `queue`, "
                "not a `topic`",
                at.at(path),
            )
    if endpoint.group is not None and (kind != "kafka" or role != "from"):
        raise ConfigError("`group` is only for Kafka sources", at.at((*path, "group")))
    address = endpoint.address
    if not address.strip() or "\x00" in address:
        raise ConfigError(f"{role}: empty or invalid name {address!r}", at.at(path))
    _address_name(kind, address, role, at.at((*path, "queue" if endpoint.queue else "topic")))


#: Kafka's own rule for topic names (the broker refuses others, and `.`/`..` are reserved).
_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
RABBITMQ_MAX_NAME_BYTES = 255  # AMQP shortstr
SQLSERVER_MAX_NAME = 128  # sysname


def _address_name(kind: str, name: str, role: str, where: str) -> None:
    """A queue, table or topic name its transport would refuse, found before anything runs.

    Empty names and NUL (every transport's rule) are checked above for every endpoint.
    """
    problem: str | None = None
    if kind == "kafka":
        if not _KAFKA_TOPIC.fullmatch(name) or name in (".", ".."):
            problem = (
                f"Kafka topic name {name!r} is not valid: 1-249 characters of "
                "A-Z a-z 0-9 . _ - (and not '.' or '..')"
            )
    elif kind == "rabbitmq":
        size = len(name.encode("utf-8"))
        if size > RABBITMQ_MAX_NAME_BYTES:
            problem = (
                f"RabbitMQ queue name {name[:40]!r}... is {size} bytes long; "
                f"AMQP allows at most {RABBITMQ_MAX_NAME_BYTES}"
            )
        elif name.startswith("amq."):
            problem = f"RabbitMQ queue name {name!r}: names starting 'amq.' are the broker's"
    elif kind == "sqlserver":
        if len(name) > SQLSERVER_MAX_NAME:
            problem = (
                f"SQL Server table name {name[:40]!r}... is {len(name)} characters long; "
                f"identifiers hold at most {SQLSERVER_MAX_NAME}"
            )
    elif kind == "postgresql":
        # Lazily, as `bridge.transports` loads transports: the module imports no driver itself.
        from bridge.transports.sql.postgresql import check_table_name

        try:
            check_table_name(name)
        except ConfigError as exc:
            problem = exc.message
    if problem is not None:
        raise ConfigError(f"{role}: {problem}", where)


def lint(config: BridgeConfig, at: Positions) -> None:
    """Raise ConfigError for the first rule a valid-shaped config breaks."""
    seen: set[str] = set()
    for i, route in enumerate(config.routes):
        path: tuple[str | int, ...] = ("routes", i)
        if route.name in seen:
            raise ConfigError(f"duplicate route name {route.name!r}", at.at((*path, "name")))
        seen.add(route.name)
        _endpoint(config, route.from_, "from", (*path, "from"), at)
        _endpoint(config, route.to, "to", (*path, "to"), at)
        if (route.from_.connection, route.from_.address) == (route.to.connection, route.to.address):
            raise ConfigError(
                "from and to are the same place: the route would loop", at.at((*path, "to"))
            )
        if route.error_queue is not None:
            where = at.at((*path, "error_queue"))
            # Empty means the default, `bridge.error`.
            if "\x00" in route.error_queue or (route.error_queue and not route.error_queue.strip()):
                raise ConfigError(f"error_queue: invalid name {route.error_queue!r}", where)
            source = config.connections[route.from_.connection].type
            _address_name(source, route.error_queue, "error_queue", where)
        for old, new in route.headers.rename.items():
            if not old or not new:
                raise ConfigError("header names cannot be empty", at.at((*path, "headers")))


def _literal_secret(raw: str, key: str) -> bool:
    """Whether a value as written holds a password that is not a ${VAR}, the default of a
    `${VAR:-default}` included (it is in the file as much as a bare value)."""
    return any(_holds_password(text, key) for text in (raw, *_DEFAULT.findall(raw)))


def _holds_password(text: str, key: str) -> bool:
    if key == "sasl_password":
        return bool(text) and not _VARIABLE.fullmatch(text.strip())
    try:
        password = urlsplit(text).password
    except ValueError:
        password = None
    found = [password] if password else []
    found += [m.group("value") for m in _KEY_VALUE_SECRET.finditer(text)]
    return any(value and not _VARIABLE.search(value) for value in found)


def is_secret(path: tuple[str | int, ...]) -> bool:
    """Whether the value at `path` is a connection field that may hold a credential."""
    return len(path) == 3 and path[0] == "connections" and path[2] in SECRET_KEYS


def credential_warnings(raw: dict[tuple[str | int, ...], str], at: Positions) -> list[str]:
    """Credentials written into the file instead of taken from the environment."""
    out = []
    for path, value in raw.items():
        if is_secret(path) and _literal_secret(value, str(path[2])):
            out.append(
                f"{at.at(path)}: warning: connection {path[1]!r} has a password written in "
                f"`{path[2]}`; use ${{VAR}} and keep secrets in the environment"
            )
    return out
