"""What each `bridge` command does, called by `bridge.cli` with the parsed options.

Each command loads the config, does its work, prints for the user and returns the exit code;
a wrong call raises `UsageError`. Every connection's secrets are given to the redactor as the
config is loaded, so nothing printed afterwards shows them.

- `common`: the config as commands load it, the addresses each connection needs, transports;
- `setup`: `check`, `install`, `subscribe` / `unsubscribe`;
- `send`: `send`;
- `inspect`: `peek`, `endpoints`;
- `runs`: `run`, `migrate`, `report`.
"""

from bridge.commands.common import addresses, load_routes
from bridge.commands.inspect import (
    describe_registry,
    describe_stats,
    endpoints,
    peek,
    render_registry,
)
from bridge.commands.runs import migrate, report, run
from bridge.commands.send import send
from bridge.commands.setup import check, install, subscription

__all__ = [
    "addresses",
    "check",
    "describe_registry",
    "describe_stats",
    "endpoints",
    "install",
    "load_routes",
    "migrate",
    "peek",
    "render_registry",
    "report",
    "run",
    "send",
    "subscription",
]
