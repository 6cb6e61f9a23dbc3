"""What the driver ships to every task: the routes file's text, the values of the environment
variables it references, and the route's name. Each task parses the file itself, so a task
builds exactly the transports the service would, on whatever machine Spark runs it.

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

__all__ = ["FAIL_AFTER_ENV", "JobSpec"]

#: Test hook: the first attempt of the job's first task fails right after its N-th send,
#: before that batch is committed (the retry then sends that batch again).
FAIL_AFTER_ENV = "BRIDGE_MIGRATE_TEST_FAIL_AFTER"


@dataclass(frozen=True)
class JobSpec:
    config_text: str
    config_file: str
    route_name: str
    env: dict[str, str] = field(default_factory=dict, repr=False)
    fail_after: int | None = None

    @classmethod
    def from_file(cls, path: str, route_name: str) -> JobSpec:
        """Read and validate the routes file; raise ConfigError for it or an unknown route."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("config file not found (use -c FILE)", path) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config: {exc}", path) from None
        loaded = parse_config(text, path)
        env = {name: os.environ[name] for name in loaded.variables if name in os.environ}
        hook = os.environ.get(FAIL_AFTER_ENV)
        spec = cls(text, path, route_name, env, int(hook) if hook else None)
        spec.route(loaded.config)  # an unknown route is a config error before Spark starts
        return spec

    def load(self) -> tuple[BridgeConfig, Route]:
        """The config and the route, parsed from the shipped text (in a task or the driver)."""
        config = parse_config(self.config_text, self.config_file, env=self.env).config
        return config, self.route(config)

    def route(self, config: BridgeConfig) -> Route:
        try:
            return config.route(self.route_name)
        except KeyError:
            known = ", ".join(r.name for r in config.routes) or "none"
            raise ConfigError(
                f"no route named {self.route_name!r} (known: {known})", self.config_file
            ) from None

    def remember_secrets(self) -> None:
        """Teach the process's redactor the passwords of the config (the CLI does it too)."""
        config = parse_config(self.config_text, self.config_file, env=self.env).config
        for connection in config.connections.values():
            for attr in ("dsn", "url"):
                value = getattr(connection, attr, None)
                if isinstance(value, str):
                    redactor.add_from_dsn(value)
            redactor.add([getattr(connection, "sasl_password", None)])
