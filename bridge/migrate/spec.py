"""What the driver ships to every task: the routes file's text and the values of the
environment variables it references (`ShippedConfig`), plus what the job is about. Each task
parses the file itself, so it builds exactly the transports the service would, on whatever
machine Spark runs it.

Secrets travel inside the task closure only (Spark serializes it, never logs it); `env` is
left out of `repr`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bridge.config.loader import parse_config
from bridge.config.models import BridgeConfig, Route
from bridge.errors import ConfigError
from bridge.telemetry.redact import redactor

__all__ = ["FAIL_AFTER_ENV", "JobSpec", "ShippedConfig"]

#: Test hook: the first attempt of the job's first task fails right after its N-th send,
#: before that batch is committed (the retry then sends that batch again).
FAIL_AFTER_ENV = "BRIDGE_MIGRATE_TEST_FAIL_AFTER"


@dataclass(frozen=True)
class ShippedConfig:
    text: str
    file: str
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, path: str) -> ShippedConfig:
        """Read and validate the routes file (ConfigError when it is not valid)."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("config file not found (use -c FILE)", path) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config: {exc}", path) from None
        loaded = parse_config(text, path)
        return cls(text, path, {n: os.environ[n] for n in loaded.variables if n in os.environ})

    def config(self) -> BridgeConfig:
        """The config, parsed from the shipped text with the shipped environment values."""
        return parse_config(self.text, self.file, env=self.env).config

    def remember_secrets(self) -> None:
        """Teach the process's redactor the passwords of the config (the CLI does it too)."""
        for connection in self.config().connections.values():
            for attr in ("dsn", "url"):
                value = getattr(connection, attr, None)
                if isinstance(value, str):
                    redactor.add_from_dsn(value)
            redactor.add([getattr(connection, "sasl_password", None)])


@dataclass(frozen=True)
class JobSpec:
    """A migration: the shipped config and the route to move."""

    shipped: ShippedConfig
    route_name: str
    fail_after: int | None = None

    @classmethod
    def from_file(cls, path: str, route_name: str) -> JobSpec:
        """Raise ConfigError for an invalid file or an unknown route, before Spark starts."""
        hook = os.environ.get(FAIL_AFTER_ENV)
        spec = cls(ShippedConfig.read(path), route_name, int(hook) if hook else None)
        spec.load()
        return spec

    def load(self) -> tuple[BridgeConfig, Route]:
        config = self.shipped.config()
        try:
            route = config.route(self.route_name)
        except KeyError:
            known = ", ".join(r.name for r in config.all_routes) or "none"
            raise ConfigError(
                f"no route named {self.route_name!r} (known: {known})", self.shipped.file
            ) from None
        if route.publish:
            raise ConfigError(
                f"route {self.route_name!r} publishes events, which `bridge migrate` does not: "
                "it moves a queue's backlog into another queue; run the route with `bridge run`",
                self.shipped.file,
            )
        return config, route
