"""What `bridge check --connect` counts before it asks the server: each connection's route
loops by what they do there, and the connections they could hold in one process."""

from __future__ import annotations

from typing import Any, cast

from bridge.config.models import BridgeConfig
from bridge.protocols import ConnectionLimit, ServerConnections
from bridge.service.capacity import Loops, loops_on
from bridge.transports import load
from bridge.transports.sql import Transport as SqlTransport

PG = {"type": "postgresql", "dsn": "postgresql://nowhere/db"}


def config(routes: list[dict[str, Any]], **pg: Any) -> BridgeConfig:
    return BridgeConfig.model_validate(
        {
            "connections": {
                "pg": PG | pg,
                "other": PG,
                "kafka": {"type": "kafka", "bootstrap_servers": "127.0.0.1:9092"},
            },
            "routes": routes,
        }
    )


def route(name: str, source: str, destination: str, concurrency: int = 1) -> dict[str, Any]:
    to = {"topic": "t"} if destination == "kafka" else {"queue": f"{name}_out"}
    return {
        "name": name,
        "from": {"connection": source, "queue": f"{name}_in"},
        "to": {"connection": destination, **to},
        "concurrency": concurrency,
    }


def test_loops_are_counted_by_what_they_do_on_each_connection() -> None:
    routes = [
        route("out", "pg", "kafka", concurrency=3),
        route("across", "other", "pg", concurrency=2),
        route("within", "pg", "pg", concurrency=4),
    ]
    assert loops_on(config(routes), "pg") == Loops(receiving=3, sending=2, moving=4)
    assert loops_on(config(routes), "other") == Loops(receiving=2)
    assert loops_on(config(routes), "kafka") == Loops(sending=3)


def test_a_loop_receiving_ahead_holds_two_and_the_pool_caps_them_all() -> None:
    wide = cast(SqlTransport, load("pg", config([], pool_size=100).connections["pg"]))
    narrow = cast(SqlTransport, load("pg", config([], pool_size=10).connections["pg"]))
    sqlite = {"connections": {"lite": {"type": "sqlite", "path": "x.db"}}}
    lite_config = BridgeConfig.model_validate(sqlite).connections["lite"]
    lite = cast(SqlTransport, load("lite", lite_config))
    assert isinstance(wide, ConnectionLimit)
    # 3 receiving ahead (6), 2 sending, 4 moving in their source's transaction; + administration
    assert wide.connections_needed(receiving=3, sending=2, moving=4) == 13
    assert narrow.connections_needed(receiving=3, sending=2, moving=4) == 11
    assert lite.connections_needed(receiving=3, sending=2, moving=4) == 10  # one writer, no pool


def test_what_the_server_has_left() -> None:
    server = ServerConnections(limit=100, reserved=3, others=20)
    assert server.available == 77
    assert server.describe() == "100 allowed - 3 reserved for superusers - 20 held by other clients"
    assert ServerConnections(limit=32767).describe() == "32767 allowed"
