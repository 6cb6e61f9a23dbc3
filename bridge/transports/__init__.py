"""One lazy name table from connection `type` to its transport class.

Importing a transport pulls in its driver (psycopg, aiokafka, pika, pyodbc), so nothing is
imported until a connection of that type is used.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

from bridge.errors import ConfigError
from bridge.protocols import Transport

__all__ = ["TRANSPORTS", "lazy_exports", "load"]

TRANSPORTS: dict[str, str] = {
    "sqlite": "bridge.transports.sql.transport:Transport",
    "postgresql": "bridge.transports.sql.transport:Transport",
    "sqlserver": "bridge.transports.sql.transport:Transport",
    "kafka": "bridge.transports.kafka.transport:Transport",
    "rabbitmq": "bridge.transports.rabbitmq.transport:Transport",
}


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's `__getattr__` that imports each exported name's module on first use, so that
    importing the package (for its driver-free `config`) imports no driver."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__


def load(name: str, config: Any) -> Transport:
    """Build the transport for connection `name` from its config model."""
    kind: str = config.type
    target = TRANSPORTS.get(kind)
    if target is None:
        close = difflib.get_close_matches(kind, TRANSPORTS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown connection type {kind!r}{hint}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        extra = {"postgresql": "postgresql", "sqlserver": "sqlserver"}.get(kind, kind)
        raise ConfigError(
            f"connection {name!r} needs the optional dependency {exc.name!r}: "
            f"pip install './[{extra}]' in the bridge checkout"
        ) from exc
    transport: Transport = getattr(module, attr)(name, config)
    return transport
