"""The optional source capabilities the runner checks with `isinstance`, per transport."""

from __future__ import annotations

from pathlib import Path

from bridge.config.models import BridgeConfig
from bridge.protocols import Readiness, ReceivesAhead, Source
from bridge.transports import load
from bridge.transports.memory import Broker, Transport


def connection(name: str, settings: dict[str, str]) -> object:
    """The connection's config model, as routes.yaml would give it."""
    config = BridgeConfig.model_validate({"connections": {name: settings}, "routes": []})
    return config.connections[name]


async def test_an_sql_source_receives_ahead(tmp_path: Path) -> None:
    transport = load(
        "local", connection("local", {"type": "sqlite", "path": str(tmp_path / "q.db")})
    )
    try:
        source = transport.source("Sales", error_queue="error")
        assert isinstance(source, Source)
        assert isinstance(source, ReceivesAhead)
        assert not isinstance(source, Readiness)
    finally:
        await transport.close()


async def test_a_kafka_source_says_whether_it_is_ready_and_does_not_receive_ahead() -> None:
    transport = load(
        "events", connection("events", {"type": "kafka", "bootstrap_servers": "127.0.0.1:1"})
    )
    try:
        source = transport.source("orders", group="bridge", error_queue="error")
        assert isinstance(source, Source) and isinstance(source, Readiness)
        assert not isinstance(source, ReceivesAhead)
    finally:
        await transport.close()


def test_a_memory_source_receives_ahead_when_asked_to() -> None:
    source = Transport(broker=Broker(), receives_ahead=True).source("q")
    assert isinstance(source, ReceivesAhead) and source.receives_ahead
    assert not isinstance(source, Readiness)
