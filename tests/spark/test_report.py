"""`bridge report` on a dataset whose figures are known: every number in JSON, the same in
CSV and in the table; many PostgreSQL queues at once, read without taking anything."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.migrate.report import describe_row
from bridge.nservicebus.wireformat import format_timestamp
from bridge.transports import load
from bridge.transports.sql import ScannedRow
from bridge.transports.sql import Transport as SqlTransport
from tests.spark.conftest import Cli, write_routes

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TYPES = ["Shop.OrderPlaced, Shop.Messages, Version=1.0.0.0;Shop.IEvent", "Shop.OrderShipped", None]


@dataclass
class Dataset:
    """97 small messages, 2 of 5000 bytes, 1 of 200 KiB, 3 expired, 2 poison rows."""

    live: list[Envelope]
    expired: list[Envelope]
    poison: int = 2

    @classmethod
    def make(cls, now: float) -> Dataset:
        live = []
        for n in range(100):
            size = (n + 1) * 10 if n < 97 else (5000 if n < 99 else 200 * 1024)
            headers = Headers(
                [
                    ("NServiceBus.MessageId", str(uuid.UUID(int=n + 1))),
                    ("NServiceBus.MessageIntent", "Send" if n % 2 else "Publish"),
                    ("NServiceBus.OriginatingEndpoint", "Sales" if n % 5 else "Billing"),
                    ("NServiceBus.TimeSent", format_timestamp(_utc(now - (n + 1) * 60))),
                ]
            )
            kind = TYPES[n % 3]
            if kind is not None:
                headers.add("NServiceBus.EnclosedMessageTypes", kind)
            live.append(Envelope(headers, b"b" * size))
        expired = [
            Envelope(Headers([("NServiceBus.MessageId", f"x{n}")]), b"", expires_at=now - 5)
            for n in range(3)
        ]
        return cls(live, expired)

    async def write(self, transport: SqlTransport, queue: str) -> None:
        await transport.install([queue])
        sink = transport.sink(queue)
        await sink.send(self.live + self.expired)
        await sink.close()
        db = transport.dialect.connect()
        try:
            for n in range(self.poison):
                statement = transport.dialect.queue_statements(queue).send
                db.cursor().execute(statement, (str(uuid.uuid4()), None, "{oops", b"p" * n))
            db.commit()
        finally:
            db.close()

    def sizes(self) -> list[int]:
        return sorted([len(m.body) for m in self.live] + [0] * 3 + list(range(self.poison)))


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def percentile(values: list[int], p: float) -> int:
    """Spark's percentile_approx at full accuracy: the smallest value with at least p of the
    values at or below it."""
    return sorted(values)[max(0, math.ceil(p * len(values)) - 1)]


@pytest.fixture
async def routes(tmp_path: Path, pg_dsn: str, pg_schema: str) -> Path:
    return write_routes(
        tmp_path / "routes.yaml",
        f"""
        local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
        shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
        """,
        """
        - name: r
          from: {connection: local, queue: Sales}
          to: {connection: shop, queue: Sales}
        """,
    )


def transport(routes: Path, name: str) -> SqlTransport:
    built = load(name, load_config(routes).config.connections[name])
    assert isinstance(built, SqlTransport)
    return built


@pytest.fixture
async def in_sqlite(routes: Path) -> Dataset:
    data = Dataset.make(time.time())
    local = transport(routes, "local")
    await data.write(local, "Sales")
    await local.close()
    return data


@pytest.fixture
async def in_postgresql(routes: Path) -> Dataset:
    data = Dataset.make(time.time())
    shop = transport(routes, "shop")
    await data.write(shop, "Sales")
    await Dataset(data.live[:5], [], poison=0).write(shop, "Other")
    await shop.install(["Empty"])
    await shop.close()
    return data


def test_report_figures_in_json_csv_and_table(
    spark: Any, cli: Cli, routes: Path, in_sqlite: Dataset
) -> None:
    data = in_sqlite
    code, out, err = cli("report", "local", "Sales", "--json", "--top", "3", "-c", str(routes))
    assert code == 0, err
    report = json.loads(out)
    assert (report["connection"], report["kind"]) == ("local", "sqlite")
    (sales,) = report["queues"]
    sizes = data.sizes()
    assert (sales["queue"], sales["messages"], sales["expired"], sales["poison"]) == (
        "Sales",
        105,
        3,
        2,
    )
    assert sales["body_size"] == {
        "min": 0,
        "p50": percentile(sizes, 0.5),
        "p90": percentile(sizes, 0.9),
        "p99": percentile(sizes, 0.99),
        "max": 200 * 1024,
    }
    assert sales["size_buckets"] == {
        "< 1 KiB": 97 + 3 + 2,
        "1-10 KiB": 2,
        "10-100 KiB": 0,
        "100 KiB-1 MiB": 1,
        ">= 1 MiB": 0,
    }
    ages = sorted((n + 1) * 60 for n in range(100))
    for name, expected in (
        ("min", ages[0]),
        ("p50", percentile(ages, 0.5)),
        ("p90", percentile(ages, 0.9)),
        ("p99", percentile(ages, 0.99)),
        ("max", ages[-1]),
    ):
        assert expected <= sales["age_seconds"][name] < expected + 60, name
    assert sales["by_type"] == {"Shop.OrderPlaced": 34, "Shop.OrderShipped": 33, "(none)": 36}
    assert sales["by_intent"] == {"Publish": 50, "Send": 50, "(none)": 3}
    assert sales["by_endpoint"] == {"Sales": 80, "Billing": 20, "(none)": 3}
    assert sales["largest"] == [
        {"id": str(uuid.UUID(int=100)), "type": "Shop.OrderPlaced", "size": 200 * 1024},
        {"id": str(uuid.UUID(int=98)), "type": "Shop.OrderShipped", "size": 5000},
        {"id": str(uuid.UUID(int=99)), "type": None, "size": 5000},
    ]

    code, out, err = cli("report", "local", "Sales", "--csv", "--top", "3", "-c", str(routes))
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    figures = {(r["section"], r["key"]): r["value"] for r in rows}
    assert figures[("messages", "")] == "105" and figures[("poison", "")] == "2"
    assert figures[("body_size", "p90")] == str(sales["body_size"]["p90"])
    assert figures[("size_buckets", "100 KiB-1 MiB")] == "1"
    assert figures[("by_type", "Shop.OrderPlaced")] == "34"
    assert figures[("by_endpoint", "Billing")] == "20"
    assert float(figures[("age_seconds", "p50")]) == pytest.approx(
        sales["age_seconds"]["p50"], abs=60
    )
    largest = [(r["key"], r["value"], r["detail"]) for r in rows if r["section"] == "largest"]
    assert largest[1] == (str(uuid.UUID(int=98)), "5000", "Shop.OrderShipped")
    assert {r["queue"] for r in rows} == {"Sales"}

    code, out, err = cli("report", "local", "Sales", "-c", str(routes))
    assert code == 0, err
    assert out.startswith("sqlite connection local, ")
    assert "  messages 105   expired 3   poison 2\n" in out
    assert f"  body bytes   min 0  p50 {sales['body_size']['p50']}  " in out
    assert re.search(r"\n  by type\n    \(none\) +36\n    Shop.OrderPlaced +34\n", out)
    assert str(uuid.UUID(int=100)) in out and "largest" in out


def test_report_reads_many_postgresql_queues_and_takes_nothing(
    spark: Any, cli: Cli, routes: Path, in_postgresql: Dataset, pg_dsn: str, pg_schema: str
) -> None:
    code, out, err = cli(
        "report", "shop", "Sales", "Other", "Empty", "--json", "--partitions", "3",
        "-c", str(routes),
    )  # fmt: skip
    assert code == 0, err
    queues = {q["queue"]: q for q in json.loads(out)["queues"]}
    assert [(q["messages"], q["expired"], q["poison"]) for q in queues.values()] == [
        (105, 3, 2),
        (5, 0, 0),
        (0, 0, 0),
    ]
    assert queues["Other"]["body_size"]["max"] == 50
    assert queues["Empty"]["body_size"]["p50"] is None and queues["Empty"]["largest"] == []
    with psycopg.connect(pg_dsn) as db:
        (left,) = db.execute(f'SELECT count(*) FROM "{pg_schema}"."Sales"').fetchone() or (0,)
    assert left == 105


def test_report_errors(cli: Cli, routes: Path) -> None:
    code, _, err = cli("report", "nowhere", "Sales", "-c", str(routes))
    assert code == 2 and "no connection named 'nowhere'" in err
    code, _, err = cli("report", "local", "Missing", "-c", str(routes))
    assert code == 1 and "does not exist" in err


def test_a_row_is_described_without_its_body() -> None:
    headers = '{"NServiceBus.MessageId":"m","NServiceBus.EnclosedMessageTypes":"A.B, A;C.D"}'
    assert describe_row("Q", ScannedRow("n1", False, headers, 2048, 7)) == (
        "Q", "m", "A.B", None, None, 2048, None, False, False, 1,
    )  # fmt: skip
    assert describe_row("Q", ScannedRow("n2", True, "[]", 0, 8)) == (
        "Q", "n2", None, None, None, 0, None, True, True, 0,
    )  # fmt: skip
