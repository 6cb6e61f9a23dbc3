"""The `BridgeDelays` producer against real databases and a real Kafka broker: on PostgreSQL
it waits (it does not poll again and again) while the only due row is held by another
producer; on SQLite it holds no write lock while a send is on its way, yet deletes a row only
after the destination acknowledged it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from bridge.config.models import BridgeConfig
from bridge.envelope import Envelope, Headers
from bridge.service.delaying import DelayedProducer, delaying_sink
from bridge.service.movers import MAX_WAIT
from bridge.transports import load
from bridge.transports.sql.transport import Transport as SqlTransport

pytestmark = pytest.mark.integration


def config_with_delays(store: dict[str, Any], kafka: str) -> BridgeConfig:
    return BridgeConfig.model_validate(
        {
            "connections": {
                "db": store,
                "kafka": {
                    "type": "kafka",
                    "bootstrap_servers": kafka,
                    "idempotence": False,
                    "partitions": 1,
                },
            },
            "delays": {"connection": "db"},
        }
    )


def message(message_id: str, deliver_at: float | None = None) -> Envelope:
    return Envelope(Headers([("NServiceBus.MessageId", message_id)]), b"{}", deliver_at=deliver_at)


def counting(take: Callable[..., Any], calls: list[float]) -> Callable[..., Any]:
    def counted(*args: Any) -> Any:
        calls.append(time.monotonic())
        return take(*args)

    return counted


async def test_postgresql_producer_waits_while_the_due_row_is_held_by_another(
    pg_dsn: str, pg_schema: str
) -> None:
    """Another producer holds the only due row (FOR UPDATE, as its send is on its way): this
    one skips it when taking and when reading the next due time alike, so it waits `MAX_WAIT`
    between looks instead of looking again at once (thousands of times a second)."""
    config = config_with_delays(
        {"type": "postgresql", "dsn": pg_dsn, "schema": pg_schema}, "127.0.0.1:1"
    )
    store = load("db", config.connections["db"])
    assert isinstance(store, SqlTransport)
    stopping = asyncio.Event()
    holder = psycopg.connect(pg_dsn)
    try:
        await store.install_delay_table()
        sink = delaying_sink(config, "kafka", "t", None, Unused(), lambda name: store)
        await sink.send([message("held", time.time() + 0.05)])
        await sink.close()
        await asyncio.sleep(0.1)
        holder.execute(f'SELECT Id FROM "{pg_schema}"."BridgeDelays" FOR UPDATE').fetchall()
        producer = DelayedProducer(store, lambda connection, address, key: Unused())
        takes: list[float] = []
        producer.table.take_due = counting(producer.table.take_due, takes)  # type: ignore[method-assign]
        running = asyncio.create_task(producer.run(stopping))
        await asyncio.sleep(2.5 * MAX_WAIT)
        stopping.set()
        await running
    finally:
        stopping.set()
        holder.rollback()
        holder.close()
        await store.close()
    print(f"takes of a held row in {2.5 * MAX_WAIT:.1f} s: {len(takes)}")
    assert 1 <= len(takes) <= 4, f"{len(takes)} takes: the producer polls in a loop"


class Unused:
    """A destination nothing may reach (the row it would get is held by another)."""

    async def send(self, envelopes: Any, checkpoint: Any = None) -> None:
        raise AssertionError("a held row was sent")

    async def close(self) -> None:
        pass
