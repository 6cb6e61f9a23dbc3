"""PostgreSQL's `response_timeout`: a call the server does not answer (the network between them
silent, through tests/support/faultproxy.py) fails within it, retriable, and the transport
works again once the network is back. libpq alone waits for ever: the proxy's kernel
acknowledges every packet, so not even TCP keepalives would end the wait."""

from __future__ import annotations

import asyncio
import time

import pytest

from bridge.errors import TransportUnavailable
from bridge.protocols import Transport
from bridge.transports import load
from bridge.transports.sql.config import PostgresConnection
from tests.support.faultproxy import FaultProxy

pytestmark = pytest.mark.integration

TIMEOUT = 2.0


def through(proxy: FaultProxy, schema: str, **extra: object) -> Transport:
    config = {
        "type": "postgresql",
        "dsn": f"postgresql://postgres@{proxy.address}/test?connect_timeout=2",
        "schema": schema,
        **extra,
    }
    return load("pg", PostgresConnection.model_validate(config))


async def test_a_call_without_answer_fails_within_response_timeout(
    pg_dsn: str, pg_schema: str
) -> None:
    with FaultProxy("127.0.0.1", 5432) as proxy:
        transport = through(proxy, pg_schema, response_timeout=TIMEOUT)
        try:
            await transport.install(["Q"])
            sink, source = transport.sink("Q"), transport.source("Q")
            proxy.blackhole()
            started = time.monotonic()
            # Each has a connection of the pool in hand or opens one: both must end.
            with pytest.raises(TransportUnavailable, match="no answer"):
                await asyncio.wait_for(transport.peek("Q"), 30)
            with pytest.raises(TransportUnavailable, match=r"no answer|timeout"):
                await asyncio.wait_for(source.receive_batch(10, 0.1), 30)
            assert time.monotonic() - started < 2 * (TIMEOUT + 2) + 2
            proxy.heal()
            assert (await transport.peek("Q")).depth == 0
            await sink.close()
            await source.close()
        finally:
            proxy.heal()
            await transport.close()


async def test_a_slow_answer_within_response_timeout_is_no_outage(
    pg_dsn: str, pg_schema: str
) -> None:
    """The deadline is per call, not per connection: calls slowed down (0.3 s each way, a
    peek's five round trips in about 3 s) succeed one after another, longer together than
    the deadline."""
    with FaultProxy("127.0.0.1", 5432) as proxy:
        transport = through(proxy, pg_schema, response_timeout=3 * TIMEOUT)
        try:
            await transport.install(["Q"])
            proxy.latency(0.3)
            for _ in range(3):
                assert (await transport.peek("Q")).depth == 0
        finally:
            await transport.close()
