"""The cross-field rules of routes.yaml, one precise message each, at `FILE:LINE:COL`.

Rules that belong to one connection type (Kafka's security settings, RabbitMQ's URL, each
transport's names) live with that transport in its driver-free `config.py`, listed in `RULES`.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bridge.config.models import BridgeConfig, ConnectionConfig, Endpoint
from bridge.errors import ConfigError
from bridge.transports.kafka import config as kafka_config
from bridge.transports.rabbitmq import config as rabbitmq_config
from bridge.transports.sql import config as sql_config

if TYPE_CHECKING:
    from bridge.config.loader import Positions

__all__ = ["RULES", "SECRET_KEYS", "credential_warnings", "is_secret", "lint"]

#: Connection type -> the driver-free module with its rules: `ADDRESS_KEY` (a route end names a
#: `queue` or a `topic`), `SOURCE_GROUP` (a source reads in a consumer group), `lint(connection)`
#: yields (key, problem) pairs, `address_problem(kind, name)` says why a name would be refused.
RULES: dict[str, ModuleType] = {
    kind: module for module in (sql_config, kafka_config, rabbitmq_config) for kind in module.KINDS
}

#: Connection fields that may hold a credential; nothing else in routes.yaml may.
SECRET_KEYS = ("dsn", "url", "management_url", "sasl_password")
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
    rules = RULES[kind]
    key, other = ("topic", "queue") if rules.ADDRESS_KEY == "topic" else ("queue", "topic")
    if getattr(endpoint, key) is None or getattr(endpoint, other) is not None:
        name = "Kafka" if kind == "kafka" else kind
        raise ConfigError(
            f"{role} is the {name} connection {endpoint.connection!r}: name a `{key}`, "
            f"not a `{other}`",
            at.at(path),
        )
    if rules.SOURCE_GROUP and role == "from" and not endpoint.group:
        raise ConfigError("a Kafka source needs a consumer `group`", at.at((*path, "topic")))
    if endpoint.group is not None and not (rules.SOURCE_GROUP and role == "from"):
        raise ConfigError("`group` is only for Kafka sources", at.at((*path, "group")))
    address = endpoint.address
    if not address.strip() or "\x00" in address:
        raise ConfigError(f"{role}: empty or invalid name {address!r}", at.at(path))
    _address_name(kind, address, role, at.at((*path, "queue" if endpoint.queue else "topic")))


def _address_name(kind: str, name: str, role: str, where: str) -> None:
    """A queue, table or topic name its transport would refuse, found before anything runs.

    Empty names and NUL (every transport's rule) are checked above for every endpoint.
    """
    problem = RULES[kind].address_problem(kind, name)
    if problem is not None:
        raise ConfigError(f"{role}: {problem}", where)


def _connection(name: str, connection: ConnectionConfig, at: Positions) -> None:
    """The rules of the connection's own transport, at the key each is about."""
    for key, problem in RULES[connection.type].lint(connection):
        path: tuple[str | int, ...] = ("connections", name) + ((key,) if key else ())
        raise ConfigError(f"connections.{name}: {problem}", at.at(path))


def lint(config: BridgeConfig, at: Positions) -> None:
    """Raise ConfigError for the first rule a valid-shaped config breaks."""
    for name, connection in config.connections.items():
        _connection(name, connection, at)
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
