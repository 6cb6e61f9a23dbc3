"""The SQL side of the bulk jobs, on real SQLite and PostgreSQL: a source restricted to a
sequence range, and the range reads (bounds, count, scan) the Spark jobs plan and report with.

No Spark here: these are the transport pieces `bridge.migrate` builds on.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.config.models import PostgresConnection, SqliteConnection
from bridge.envelope import Envelope, Headers
from bridge.migrate.ranges import split
from bridge.nservicebus.deadletter import RAW_HEADERS
from bridge.transports import load
from bridge.transports.sql import Transport as SqlTransport
from tests.conftest import unique

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(params=["sqlite", "postgresql"])
async def transport(request: pytest.FixtureRequest) -> AsyncIterator[SqlTransport]:
    if request.param == "sqlite":
        config: object = SqliteConnection.model_validate(
            {"type": "sqlite", "path": str(request.getfixturevalue("sqlite_path"))}
        )
    else:
        config = PostgresConnection.model_validate(
            {
                "type": "postgresql",
                "dsn": request.getfixturevalue("pg_dsn"),
                "schema": request.getfixturevalue("pg_schema"),
            }
        )
    built = load("db", config)
    assert isinstance(built, SqlTransport)
    yield built
    await built.close()


def message(n: int, *, ttl: float | None = None, size: int = 1) -> Envelope:
    headers = Headers([("NServiceBus.MessageId", f"m{n}"), ("n", str(n))])
    expires_at = None if ttl is None else time.time() + ttl
    return Envelope(headers, b"x" * size, expires_at=expires_at)


def write_raw(transport: SqlTransport, queue: str, headers: str) -> None:
    """Insert a row with the dialect's own statement but headers the bridge would never write."""
    dialect = transport.dialect
    db = dialect.connect()
    try:
        db.cursor().execute(
            dialect.queue_statements(queue).send, (str(uuid.uuid4()), None, headers, b"p")
        )
        db.commit()
    finally:
        db.close()


async def fill(transport: SqlTransport, queue: str, envelopes: list[Envelope]) -> None:
    await transport.install([queue, "error"])
    sink = transport.sink(queue)
    await sink.send(envelopes)
    await sink.close()


async def test_a_range_source_takes_only_its_range_oldest_first(transport: SqlTransport) -> None:
    queue = unique("Range")
    await fill(transport, queue, [message(n) for n in range(20)])
    bounds = await transport.bounds(queue)
    assert bounds is not None
    lo, hi = bounds
    assert hi - lo == 19
    source = transport.source(queue, error_queue="error", seq_range=(lo + 5, lo + 9))
    try:
        taken = []
        while True:
            batch = await source.receive_batch(3, 0.0)
            if not batch.messages:
                await batch.commit()
                break
            taken += [m.headers.get("n") for m in batch.messages]
            await batch.commit()
    finally:
        await source.close()
    assert taken == [str(n) for n in range(5, 10)]
    assert await transport.count_range(queue, lo, hi) == 15
    assert await transport.count_range(queue, lo + 5, lo + 9) == 0


async def test_a_range_source_aborts_drops_expired_and_moves_poison(
    transport: SqlTransport,
) -> None:
    queue = unique("Range")
    await fill(transport, queue, [message(0), message(1, ttl=-5), message(2)])
    write_raw(transport, queue, "not json")  # a row a foreign writer left
    lo, hi = await transport.bounds(queue) or (0, 0)
    errors_before = await transport.bounds("error")
    source = transport.source(queue, error_queue="error", seq_range=(lo, hi))
    try:
        batch = await source.receive_batch(10, 0.0)
        assert (len(batch.messages), batch.expired, len(batch.poison)) == (2, 1, 1)
        await batch.abort()
        assert await transport.count_range(queue, lo, hi) == 4
        batch = await source.receive_batch(10, 0.0)
        await batch.commit()
    finally:
        await source.close()
    assert await transport.count_range(queue, lo, hi) == 0
    assert errors_before is None
    elo, ehi = await transport.bounds("error") or (0, 0)
    (copy,) = await transport.scan_range("error", elo - 1, ehi, 10)
    assert isinstance(copy.headers, str)
    assert json.loads(copy.headers)[RAW_HEADERS] == "not json"


async def test_scan_reads_pages_without_taking_anything(transport: SqlTransport) -> None:
    queue = unique("Scan")
    await fill(
        transport, queue, [message(0, size=10), message(1, ttl=-5, size=0), message(2, size=300)]
    )
    lo, hi = await transport.bounds(queue) or (0, 0)
    first = await transport.scan_range(queue, lo - 1, hi, 2)
    rest = await transport.scan_range(queue, first[-1].seq, hi, 2)
    rows = first + rest
    assert [(r.expired, r.body_size) for r in rows] == [(False, 10), (True, 0), (False, 300)]
    assert [json.loads(str(r.headers))["n"] for r in rows] == ["0", "1", "2"]
    assert [r.seq for r in rows] == sorted(r.seq for r in rows) and rows[0].seq == lo
    assert await transport.count_range(queue, lo, hi) == 3


async def test_bounds_of_an_empty_table_are_none(transport: SqlTransport) -> None:
    queue = unique("Empty")
    await transport.install([queue])
    assert await transport.bounds(queue) is None


async def test_the_service_goes_on_next_to_a_range_source(pg_dsn: str, pg_schema: str) -> None:
    config = PostgresConnection.model_validate(
        {"type": "postgresql", "dsn": pg_dsn, "schema": pg_schema}
    )
    transport = load("db", config)
    assert isinstance(transport, SqlTransport)
    queue = unique("Shared")
    try:
        await fill(transport, queue, [message(n) for n in range(10)])
        lo, _ = await transport.bounds(queue) or (0, 0)
        ranged = transport.source(queue, seq_range=(lo, lo + 9))
        service = transport.source(queue)
        try:
            held = await ranged.receive_batch(4, 0.0)  # rows 0-3 locked, not committed
            other = await service.receive_batch(10, 1.0)  # skips them instead of waiting
            assert [m.headers.get("n") for m in other.messages] == [str(n) for n in range(4, 10)]
            await other.commit()
            await held.commit()
        finally:
            await ranged.close()
            await service.close()
        assert await transport.bounds(queue) is None
    finally:
        await transport.close()


@given(lo=st.integers(-5, 10**12), width=st.integers(0, 10**6), parts=st.integers(1, 64))
def test_split_covers_the_range_in_contiguous_near_equal_parts(
    lo: int, width: int, parts: int
) -> None:
    hi = lo + width - 1
    ranges = split(lo, hi, parts)
    if width == 0:
        assert ranges == []
        return
    assert ranges[0][0] == lo and ranges[-1][1] == hi
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [b - a + 1 for a, b in ranges]
    assert len(ranges) == min(parts, width) and max(sizes) - min(sizes) <= 1
