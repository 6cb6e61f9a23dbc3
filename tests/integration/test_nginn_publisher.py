"""`NGinnPublisher` and NGinn's subscription table on real PostgreSQL and SQLite, without a
bridge process: who gets a copy, and what each copy's row holds.

NGinn facts pinned here (lafar6502/nginn-messagebus @1fa4baf, `NGinnBPM.MessageBus/`):
- subscribers are the union of the subscribers of each class of the chain, from rows whose
  expiration has not passed (Impl/MessageBus.cs:264-287; NamedQueries.sqlserver.json:27);
- one row per distinct subscriber endpoint, `from_endpoint` the publisher, the first copy with
  the message's unique id and each clone with a new one (MessageBus.cs:347-371, 213-217);
- Subscribe updates the expiration of an existing row and inserts only when there is none
  (Impl/SqlSubscriptionService.cs:104-134).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pydantic import TypeAdapter

from bridge.envelope import Envelope, Headers
from bridge.errors import BridgeError
from bridge.telemetry.metrics import Metrics
from bridge.transports.sql.config import SqlConnection
from bridge.transports.sql.nginn_publish import NGinnPublisher
from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
from bridge.transports.sql.transport import Transport as SqlTransport
from tests.conftest import unique
from tests.support.nginn import NGinn

pytestmark = pytest.mark.integration

TABLE = "NGinnMessageBus_Subscriptions"
BASE, DERIVED = "Sales.OrderPlaced", "Sales.ExpressOrderPlaced"


@pytest.fixture(params=["postgresql", "sqlite"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield {"type": "sqlite", "path": str(tmp_path / "ng.db")}
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        yield {"type": "postgresql", "dsn": dsn, "schema": schema}


def transport_of(place: dict[str, Any]) -> SqlTransport:
    config: SqlConnection = TypeAdapter(SqlConnection).validate_python(
        place
        | {
            "layout": "nginn",
            "nginn": {"alias": "db", "timezone": "Europe/Warsaw", "types": {BASE: "Lg.Base, Lg"}},
        }
    )
    return SqlTransport("ng", config)


def event(message_id: str) -> Envelope:
    headers = Headers(
        [
            ("NServiceBus.MessageId", message_id),
            ("NServiceBus.EnclosedMessageTypes", f"{DERIVED}, Sales;{BASE}, Sales"),
        ]
    )
    return Envelope(headers, json.dumps({"$type": "Lg.Express, Lg", "OrderId": 1}).encode())


async def test_publishes_one_row_per_subscriber_of_the_class_chain(place: dict[str, Any]) -> None:
    transport = transport_of(place)
    billing, shipping, gone = unique("Billing"), unique("Shipping"), unique("Gone")
    await transport.install([billing, shipping, gone])
    table = NGinnSubscriptionTable(transport.dialect, TABLE)
    pub = "sql://db/Sales"
    try:
        await table.create()
        await table.create()  # idempotent
        await table.subscribe(pub, f"sql://db/{billing}", "Lg.Base")  # by the NGinn name
        await table.subscribe(pub, f"sql://db/{billing}", DERIVED)  # the same endpoint twice
        await table.subscribe(pub, f"sql://db/{shipping}", "System.Object")
        await table.subscribe("sql://db/Other", f"sql://db/{gone}", "Lg.Base")  # not Sales's
        await table.subscribe(pub, f"sql://db/{gone}", BASE)  # not the NGinn name (nginn.types)
        rows = await table.rows()
        await table.subscribe(pub, f"sql://db/{shipping}", "System.Object")
        assert await table.rows() == rows  # NGinn's update-then-insert: the same row
        assert len(rows) == 5 and all(r[4] is None for r in rows)
    finally:
        await table.close()
    sink = NGinnPublisher(transport.dialect, transport.config, pub, transport.pool)
    try:
        await sink.send([event("e-1")])
    finally:
        await sink.close()
        await transport.close()
    where = place.get("path") or f"{place['dsn']}|{place['schema']}"
    got = {}
    for name in (billing, shipping, gone):
        reader = NGinn(place["type"], where, name, "Europe/Warsaw")
        received = reader.receive()
        assert reader.receive() is None
        got[name] = received
    assert got[gone] is None
    copies = [got[billing], got[shipping]]
    assert all(c is not None and c.from_endpoint == pub for c in copies)
    ids = sorted(c.unique_id or "" for c in copies if c is not None)
    assert "e-1" in ids and len(set(ids)) == 2  # one keeps the message id, the clone a new one
    assert {c.to_endpoint for c in copies if c is not None} == {
        f"sql://db/{billing}",
        f"sql://db/{shipping}",
    }
    assert all(
        c is not None and c.headers["NServiceBus.MessageIntent"] == "Publish" for c in copies
    )


async def test_unreachable_subscribers_are_skipped_counted_and_logged_once(
    place: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A subscriber endpoint of another alias (another database: NGinn forwards there, the
    bridge does not) and the publisher itself (NGinn's `local`, which NGinn maps to the
    publishing endpoint, MessageBus.cs:274, or its endpoint by name) get no copy; every other
    subscriber gets its copy, and each skipped copy is counted and each endpoint logged once."""
    transport = transport_of(place)
    billing, pub = unique("Billing"), "sql://db/Sales"
    await transport.install([billing, "Sales"])
    table = NGinnSubscriptionTable(transport.dialect, TABLE)
    try:
        await table.create()
        for subscriber in ("sql://elsewhere/Billing", "local", pub, f"sql://DB/{billing}"):
            await table.subscribe(pub, subscriber, "Lg.Base")
    finally:
        await table.close()
    reader = InMemoryMetricReader()
    route = Metrics(MeterProvider(metric_readers=[reader])).for_route("r")
    sink = NGinnPublisher(
        transport.dialect, transport.config, pub, transport.pool, on_skipped=route.nginn_skipped
    )
    try:
        with caplog.at_level(logging.WARNING, logger="bridge.transports.sql.nginn_publish"):
            await sink.send([event("e-2"), event("e-3")])
            await sink.send([event("e-4")])
    finally:
        await sink.close()
        await transport.close()
    where = place.get("path") or f"{place['dsn']}|{place['schema']}"
    reader_of = NGinn(place["type"], where, billing, "Europe/Warsaw")
    got = [reader_of.receive() for _ in range(4)]
    assert [r.unique_id for r in got if r is not None] == ["e-2", "e-3", "e-4"]
    assert NGinn(place["type"], where, "Sales", "Europe/Warsaw").receive() is None
    assert sink.skipped == {
        ("sql://elsewhere/Billing", "other_database"): 3,
        ("local", "publisher"): 3,
        (pub, "publisher"): 3,
    }
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3, warnings
    assert sum("'sql://elsewhere/Billing'" in w and "other databases" in w for w in warnings) == 1
    assert sum("'local'" in w and "publisher itself" in w for w in warnings) == 1
    data = reader.get_metrics_data()
    assert data is not None
    counted = {
        (p.attributes["subscriber"], p.attributes["reason"]): p.value
        for r in data.resource_metrics
        for sm in r.scope_metrics
        for m in sm.metrics
        if m.name == "bridge_nginn_copies_skipped"
        for p in m.data.data_points
    }
    assert counted == {
        ("sql://elsewhere/Billing", "other_database"): 3,
        ("local", "publisher"): 3,
        (pub, "publisher"): 3,
    }


async def test_a_skipped_copy_is_counted_once_its_batch_is_committed(
    place: dict[str, Any],
) -> None:
    """A batch whose insert fails (a subscriber's table is missing) writes nothing and counts
    no skipped copy; sent again once it can be written, each skip counts once."""
    transport = transport_of(place)
    billing, pub = unique("Billing"), "sql://db/Sales"
    await transport.install(["Sales"])  # not Billing's table yet
    table = NGinnSubscriptionTable(transport.dialect, TABLE)
    try:
        await table.create()
        for subscriber in ("local", f"sql://db/{billing}"):
            await table.subscribe(pub, subscriber, "Lg.Base")
    finally:
        await table.close()
    counted: list[tuple[str, str]] = []
    sink = NGinnPublisher(
        transport.dialect,
        transport.config,
        pub,
        transport.pool,
        on_skipped=lambda subscriber, reason: counted.append((subscriber, reason)),
    )
    try:
        with pytest.raises(BridgeError):
            await sink.send([event("e-1")])
        assert (sink.skipped, counted) == ({}, [])
        await transport.install([billing])
        await sink.send([event("e-1")])  # the batch again, as the runner sends it
    finally:
        await sink.close()
        await transport.close()
    assert sink.skipped == {("local", "publisher"): 1}
    assert counted == [("local", "publisher")]


def nservicebus_event(message_id: str) -> Envelope:
    """A derived event as an NServiceBus publisher sends it: EnclosedMessageTypes most derived
    first, the base after, and no `$type` in the body (NServiceBus's serializers write none)."""
    headers = Headers(
        [
            ("NServiceBus.MessageId", message_id),
            ("NServiceBus.MessageIntent", "Publish"),
            ("NServiceBus.EnclosedMessageTypes", f"{DERIVED}, Sales;{BASE}, Sales"),
        ]
    )
    return Envelope(headers, json.dumps({"OrderId": 1}).encode())


async def test_a_derived_event_reaches_an_nginn_subscriber_of_its_mapped_base(
    place: dict[str, Any],
) -> None:
    """Only the base is in `nginn.types`, which is how the subscription row got NGinn's name:
    the lookup finds the subscriber by the base, and the row is typed as the base NGinn knows
    (not the whole event refused to the error queue)."""
    transport = transport_of(place)
    books = unique("Books")
    await transport.install([books])
    table = NGinnSubscriptionTable(transport.dialect, TABLE)
    try:
        await table.create()
        await table.subscribe("sql://db/Sales", f"sql://db/{books}", "Lg.Base")
    finally:
        await table.close()
    sink = NGinnPublisher(transport.dialect, transport.config, "sql://db/Sales", transport.pool)
    try:
        await sink.send([nservicebus_event("e-3")])
    finally:
        await sink.close()
        await transport.close()
    where = place.get("path") or f"{place['dsn']}|{place['schema']}"
    received = NGinn(place["type"], where, books, "Europe/Warsaw").receive()
    assert received is not None and received.unique_id == "e-3"
    body = json.loads(received.body)
    assert next(iter(body.items())) == ("$type", "Lg.Base, Lg") and body["OrderId"] == 1


async def test_a_redelivered_event_reaches_every_subscriber_with_the_same_unique_id(
    place: dict[str, Any],
) -> None:
    """After a kill -9 before the source's commit the event is published again by a new
    process: each subscriber's copy must carry the unique id it had the first time (the first
    copy the message id, MessageBus.cs:360-361; the others an id of their own, :364-366, here
    derived from the message id and the subscriber), within NGinn's varchar(40) unique_id."""
    transport = transport_of(place)
    names = [unique("A"), unique("B"), unique("C")]
    await transport.install(names)
    table = NGinnSubscriptionTable(transport.dialect, TABLE)
    try:
        await table.create()
        for name in names:
            await table.subscribe("sql://db/Sales", f"sql://db/{name}", "Lg.Base")
    finally:
        await table.close()
    message_id = "m" * 40  # NGinn's widest unique_id
    for _ in range(2):  # two processes: each publisher its own
        sink = NGinnPublisher(transport.dialect, transport.config, "sql://db/Sales", transport.pool)
        try:
            await sink.send([event(message_id)])
        finally:
            await sink.close()
    await transport.close()
    where = place.get("path") or f"{place['dsn']}|{place['schema']}"
    ids: dict[str, list[str | None]] = {}
    for name in names:
        reader = NGinn(place["type"], where, name, "Europe/Warsaw")
        got = [reader.receive(), reader.receive()]
        ids[name] = [r.unique_id if r is not None else None for r in got]
    first, *others = (ids[name] for name in sorted(names, key=lambda n: f"sql://db/{n}"))
    assert first == [message_id, message_id]
    for pair in others:
        assert pair[0] is not None and pair[0] == pair[1] and len(pair[0]) <= 40
    assert len({pair[0] for pair in ids.values()}) == 3  # one id per subscriber
