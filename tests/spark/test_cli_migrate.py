"""`bridge migrate` as users call it: exit codes 0/1/2, the summary, no traceback; the
`spark-submit` entry point; and the runtime never importing PySpark."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bridge.config.loader import load_config
from bridge.errors import ConfigError
from bridge.migrate import job as job_module
from bridge.migrate.session import check_master
from bridge.transports import load
from tests.spark.conftest import Cli, write_routes
from tests.spark.data import message, pg_rows
from tests.support.queues import drain

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def routes(tmp_path: Path, pg_dsn: str, pg_schema: str, kafka_bootstrap: str) -> Path:
    path = write_routes(
        tmp_path / "routes.yaml",
        f"""
        shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
        local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
        kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false}}
        """,
        """
        - name: to-local
          from: {connection: shop, queue: Orders}
          to: {connection: local, queue: Orders}
        - name: to-missing
          from: {connection: shop, queue: Orders}
          to: {connection: local, queue: Missing}
        - name: to-broken
          from: {connection: shop, queue: Orders}
          to: {connection: shop, queue: Broken}
        - name: kafka-to-kafka
          from: {connection: kafka, topic: a, group: g}
          to: {connection: kafka, topic: b}
        """,
    )
    config = load_config(path).config
    shop = load("shop", config.connections["shop"])
    local = load("local", config.connections["local"])
    await shop.install(["Orders", "bridge.error"])
    await local.install(["Orders"])
    sink = shop.sink("Orders")
    await sink.send([message(n) for n in range(300)])
    await sink.close()
    await shop.close()
    await local.close()
    return path


def without_config_warnings(err: str) -> list[str]:
    """stderr's lines less routes.yaml's warnings (its PostgreSQL -> SQLite routes have no
    address_map, which `bridge check` warns about)."""
    return [line for line in err.strip().splitlines() if ": warning: route " not in line]


def test_migrate_prints_the_summary_and_exits_0(spark: Any, cli: Cli, routes: Path) -> None:
    code, out, err = cli("migrate", "--route", "to-local", "-c", str(routes), "--partitions", "3")
    assert code == 0, err
    assert "migrated route to-local (postgresql shop/Orders -> sqlite local/Orders)" in out
    assert "  moved    300\n" in out and "  tasks    3\n" in out
    assert "msg/s" in out


def test_config_and_usage_errors_exit_2(cli: Cli, routes: Path, tmp_path: Path) -> None:
    code, _, err = cli("migrate", "--route", "nope", "-c", str(routes))
    assert code == 2 and "no route named 'nope' (known: to-local" in err
    code, _, err = cli("migrate", "--route", "kafka-to-kafka", "-c", str(routes))
    assert code == 2 and "kafka -> kafka" in err and "bridge run --until-idle" in err
    code, _, err = cli("migrate", "--route", "to-local", "-c", str(routes), "--partitions", "0")
    assert code == 2 and "--partitions" in err
    broken = tmp_path / "broken.yaml"
    broken.write_text(routes.read_text().replace("queue: Orders}", "queue: Orders, x: 1}", 1))
    code, _, err = cli("migrate", "--route", "to-local", "-c", str(broken))
    assert code == 2 and "unknown key 'x'" in err


def test_a_master_url_spark_does_not_know_exits_2_in_one_line(cli: Cli, routes: Path) -> None:
    for command in (
        ("migrate", "--route", "to-local", "-c", str(routes)),
        ("report", "shop", "Orders", "-c", str(routes)),
    ):
        code, out, err = cli(*command, "--master", "bogus://x")
        assert code == 2 and out == ""
        assert without_config_warnings(err) == [
            "--master 'bogus://x' is not a Spark master URL: use local, local[N], local[*], "
            "local[N,F] (F tries per task), spark://HOST:PORT, yarn, k8s://URL or mesos://URL"
        ]
    job = subprocess.run(
        [
            *(sys.executable, "-m", "bridge.migrate.job", "--route", "to-local"),
            *("-c", str(routes), "--master", "bogus://x"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert job.returncode == 2 and job.stdout == ""
    assert job.stderr.startswith("--master 'bogus://x' is not a Spark master URL")


@pytest.mark.parametrize(
    ("master", "known"),
    [
        *((m, True) for m in ("local", "local[4]", "local[*]", "local[2,3]", "local[*, 4]")),
        *((m, True) for m in ("spark://a:7077", "spark://a:7077,b:7077", "yarn")),
        *((m, True) for m in ("k8s://https://k:6443", "mesos://m:5050", "local-cluster[2,1,1024]")),
        *((m, False) for m in ("bogus://x", "local[]", "local[x]", "local[2,]", "spark://", "")),
        *((m, False) for m in ("yarn-cluster", " local", "LOCAL")),
    ],
)
def test_master_urls_are_checked_by_their_form(master: str, known: bool) -> None:
    if known:
        check_master(master)
    else:
        with pytest.raises(ConfigError, match="is not a Spark master URL"):
            check_master(master)


def test_a_missing_table_exits_1_before_spark_starts(cli: Cli, routes: Path) -> None:
    code, _, err = cli("migrate", "--route", "to-missing", "-c", str(routes))
    assert code == 1
    (line,) = without_config_warnings(err)
    assert line.startswith("bridge migrate: ") and "does not exist (run `bridge install`)" in line


def test_a_task_failing_for_good_exits_1_and_loses_nothing(
    spark: Any, cli: Cli, routes: Path, pg_dsn: str, pg_schema: str
) -> None:
    with psycopg.connect(pg_dsn) as db:  # a table the rows cannot go into
        db.execute(
            f'CREATE TABLE "{pg_schema}"."Broken" (id uuid PRIMARY KEY, expires timestamp, '
            "headers text NOT NULL, body bytea, seq serial, owner text NOT NULL)"
        )
    code, out, err = cli("migrate", "--route", "to-broken", "-c", str(routes))
    assert code == 1
    # How far it got, on stdout, before the error line on stderr.
    assert out.startswith("stopped migrating route to-broken (postgresql shop/Orders -> ")
    assert "  planned  300\n  moved    0\n" in out and "  left     300\n" in out
    assert (
        out.strip()
        .splitlines()[-1]
        .startswith("warning: 300 of the 300 planned messages are still in the source")
    )
    last = err.strip().splitlines()[-1]
    assert last.startswith("bridge migrate: route to-broken: TransportError:") and '"owner"' in last
    assert len(pg_rows(pg_dsn, pg_schema, "Orders")) == 300


def test_without_pyspark_migrate_says_what_to_install(routes: Path) -> None:
    hide = "import sys; sys.modules['pyspark'] = None; from bridge.cli import main; "
    result = subprocess.run(
        [
            *(sys.executable, "-c", hide + "raise SystemExit(main(sys.argv[1:]))"),
            *("migrate", "--route", "to-local", "-c", str(routes)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "PySpark is not installed: pip install './[spark]' in the bridge" in result.stderr
    assert "Traceback" not in result.stderr


def test_spark_submit_runs_the_job_module(routes: Path, pg_dsn: str, pg_schema: str) -> None:
    venv = Path(sys.executable).parent
    result = subprocess.run(
        [
            str(venv / "spark-submit"),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            str(job_module.__file__),  # the installed module's file, as the README says
            *("--route", "to-local", "-c", str(routes), "--partitions", "2"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            **os.environ,
            "PATH": f"{venv}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
        },
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "  moved    300\n" in result.stdout and "  tasks    2\n" in result.stdout
    assert pg_rows(pg_dsn, pg_schema, "Orders") == []


def test_the_runtime_never_imports_pyspark() -> None:
    modules = [
        "bridge.cli",
        "bridge.service.supervisor",
        "bridge.transports.sql.transport",
        "bridge.transports.sql.dialects.sqlite",
        "bridge.transports.sql.dialects.postgresql",
        "bridge.transports.sql.dialects.sqlserver",
        "bridge.transports.kafka",
        "bridge.migrate",
    ]
    probe = f"import sys; import {', '.join(modules)}; print('pyspark' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "False", result.stderr
    offenders = [
        path.relative_to(REPO)
        for path in (REPO / "bridge").rglob("*.py")
        if "pyspark" in path.read_text() and "migrate" not in path.parts
    ]
    assert offenders == []


def test_migrating_a_derived_route_translates_addresses_as_the_service_does(
    spark: Any, cli: Cli, tmp_path: Path, pg_dsn: str, pg_schema: str
) -> None:
    """A bulk move of a proxy's backlog is a route of the registry like any other: reply
    addresses become the sender's address on the destination (its proxy there), the Transfer
    header is added, and an address no endpoint has goes to the error queue."""
    from bridge.envelope import Envelope, Headers

    path = tmp_path / "routes.yaml"
    path.write_text(
        f"""\
connections:
  shop: {{type: postgresql, dsn: "{pg_dsn}", schema: "{pg_schema}"}}
  local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
endpoints:
  Sales: {{connection: shop}}
  Billing: {{connection: local}}
proxies: {{create: true}}
"""
    )
    config = load_config(path).config

    async def fill() -> None:
        shop = load("shop", config.connections["shop"])
        local = load("local", config.connections["local"])
        await shop.install(["Sales", "Billing", "bridge.error"])
        await local.install(["Billing"])
        sales = f'"{pg_schema}"."Sales"'
        sink = shop.sink("Billing")
        await sink.send(
            [
                Envelope(
                    Headers(
                        [("NServiceBus.MessageId", f"m{n}"), ("NServiceBus.ReplyToAddress", sales)]
                    ),
                    b"{}",
                )
                for n in range(20)
            ]
            + [
                Envelope(
                    Headers(
                        [("NServiceBus.MessageId", "bad"), ("NServiceBus.ReplyToAddress", "sales")]
                    ),
                    b"{}",
                )
            ]
        )
        await sink.close()

        await shop.close()
        await local.close()

    asyncio.run(fill())
    code, _, err = cli("migrate", "--route", "proxy.shop.Billing", "-c", str(path))
    assert code == 0, err

    async def look() -> None:
        shop = load("shop", config.connections["shop"])
        local = load("local", config.connections["local"])
        moved = await drain(local, "Billing")
        assert sorted(e.message_id or "" for e in moved) == sorted(f"m{n}" for n in range(20))
        assert {e.headers.get("NServiceBus.ReplyToAddress") for e in moved} == {'"main"."Sales"'}
        assert {e.headers.get("NServiceBus.Bridge.Transfer") for e in moved} == {"shop->local"}
        [failed] = await drain(shop, "bridge.error")
        assert failed.message_id == "bad"
        assert "nearest: 'Sales'" in (failed.headers.get("NServiceBus.ExceptionInfo.Message") or "")
        await shop.close()
        await local.close()

    asyncio.run(look())
