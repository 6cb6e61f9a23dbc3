"""The cross-field rules of routes.yaml, in one function, one precise message each."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from bridge.config.models import BridgeConfig, Endpoint
from bridge.errors import ConfigError

if TYPE_CHECKING:
    from bridge.config.loader import Positions

__all__ = ["credential_warnings", "lint"]

_SECRET_KEYS = ("dsn", "url", "sasl_password")
_KEY_VALUE_SECRET = re.compile(
    r"\b(?:password|pwd)\s*=\s*(?P<value>\{[^}]*\}|'[^']*'|[^;\s&]+)", re.I
)
_VARIABLE = re.compile(r"\$\{[^}]*\}")


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
        for old, new in route.headers.rename.items():
            if not old or not new:
                raise ConfigError("header names cannot be empty", at.at((*path, "headers")))


def _literal_secret(raw: str, key: str) -> bool:
    """Whether a value as written holds a password that is not a ${VAR}."""
    if key == "sasl_password":
        return bool(raw) and not _VARIABLE.fullmatch(raw.strip())
    try:
        password = urlsplit(raw).password
    except ValueError:
        password = None
    found = [password] if password else []
    found += [m.group("value") for m in _KEY_VALUE_SECRET.finditer(raw)]
    return any(value and not _VARIABLE.search(value) for value in found)


def credential_warnings(raw: dict[tuple[str | int, ...], str], at: Positions) -> list[str]:
    """Credentials written into the file instead of taken from the environment."""
    out = []
    for path, value in raw.items():
        is_secret = len(path) == 3 and path[0] == "connections" and path[2] in _SECRET_KEYS
        if is_secret and _literal_secret(value, str(path[2])):
            out.append(
                f"{at.at(path)}: warning: connection {path[1]!r} has a password written in "
                f"`{path[2]}`; use ${{VAR}} and keep secrets in the environment"
            )
    return out
