"""What `bridge endpoints --connect` says of a subscription on NGinn tables (`state`), on real
PostgreSQL and SQLite: a row whose expiration has passed by the database's clock is `expired`,
as NGinn's publisher no longer reads it (`expiration_date is null or expiration_date >=
getdate()`, Impl/SqlQueue/NamedQueries.sqlserver.json:27 of lafar6502/nginn-messagebus
@1fa4baf)."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from bridge.config.loader import parse_config
from bridge.service.subscription_state import state
from bridge.transports.sql.layouts.nginn_formats import local_text
from bridge.transports.sql.nginn_subscriptions import NGinnSubscriptionTable
from tests.integration.test_nginn_publisher import TABLE, place, transport_of

pytestmark = pytest.mark.integration
__all__ = ["place"]

ZONE = "Europe/Warsaw"


def set_expiration(place: dict[str, Any], message_type: str, at: datetime) -> None:
    sql = "update {} set expiration_date = {p} where message_type = {p}"
    if place["type"] == "sqlite":
        with sqlite3.connect(place["path"]) as db:
            db.execute(sql.format(f'"{TABLE}"', p="?"), (local_text(at), message_type))
    else:
        with psycopg.connect(place["dsn"], autocommit=True) as db:
            table = f'"{place["schema"]}"."{TABLE}"'
            db.execute(sql.format(table, p="%s"), (at, message_type))


async def test_a_row_whose_expiration_has_passed_is_expired(place: dict[str, Any]) -> None:
    options = {"alias": "db", "timezone": ZONE, "types": {f"I.{x}": f"I.{x}, I" for x in "ABCD"}}
    subscribes = ", ".join(f"{{event: I.{x}, publisher: Inventory}}" for x in "ABCD")
    config = parse_config(
        "connections:\n"
        f"  ng: {json.dumps(place | {'layout': 'nginn', 'nginn': options})}\n"
        "  kafka: {type: kafka, bootstrap_servers: '127.0.0.1:9092'}\n"
        "endpoints:\n"
        "  Inventory: {connection: kafka}\n"
        f"  Books: {{connection: ng, subscribes: [{subscribes}]}}\n"
    ).config
    transport = transport_of(place)
    table = NGinnSubscriptionTable(transport.dialect, TABLE)
    try:
        await table.create()
        for x in "ABC":
            await table.subscribe("sql://db/Inventory", "sql://db/Books", f"I.{x}")
    finally:
        await table.close()
        await transport.close()
    now = datetime.now(ZoneInfo(ZONE)).replace(tzinfo=None)
    set_expiration(place, "I.B", now + timedelta(hours=1))
    set_expiration(place, "I.C", now - timedelta(hours=1))
    assert await state(config) == {
        ("Books", "I.A"): "subscribed",
        ("Books", "I.B"): "expiring",
        ("Books", "I.C"): "expired",
        ("Books", "I.D"): "missing",
    }
