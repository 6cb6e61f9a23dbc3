"""The `bridge` command as users and scripts call it: exit codes, output, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import unique

pytestmark = pytest.mark.integration


def bridge(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


@pytest.fixture
def routes(tmp_path: Path, pg_dsn: str, pg_schema: str) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{tmp_path / "bridge.db"}"}}
              shop:  {{type: postgresql, dsn: "${{SHOP_DSN:-{pg_dsn}}}", schema: {pg_schema}}}
              legacy:
                type: sqlserver
                dsn: "${{LEGACY_ODBC:-Driver=FreeTDS;Server=nowhere;PWD=hunter2}}"
                catalog: "my]db"
            routes:
              - name: local-to-shop
                from: {{connection: local, queue: Sales}}
                to:   {{connection: shop, queue: "Sales.Copy"}}
              - name: shop-to-local
                from: {{connection: shop, queue: "Sales.Copy"}}
                to:   {{connection: local, queue: "Sales Done"}}
            """
        )
    )
    return path


def test_check_accepts_a_good_file(routes: Path) -> None:
    result = bridge("check", "-c", str(routes))
    assert result.returncode == 0, result.stderr
    assert "OK (3 connections, 2 routes)" in result.stdout


def test_common_options_go_before_or_after_the_command_and_after_wins(
    routes: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("connections: {}\nroutes: []\n")
    before = bridge("-c", str(routes), "check")
    assert before.returncode == 0, before.stderr
    assert before.stdout == f"{routes}: OK (3 connections, 2 routes)\n"
    both = bridge("-c", str(routes), "check", "-c", str(other))
    assert both.returncode == 0, both.stderr
    assert both.stdout == f"{other}: OK (0 connections, 0 routes)\n"
    bad_level = bridge("--log-level", "LOUD", "check", "-c", str(routes))
    assert bad_level.returncode == 2 and "unknown --log-level 'LOUD'" in bad_level.stderr
    fixed = bridge("--log-level", "LOUD", "check", "--log-level", "INFO", cwd=routes.parent)
    assert fixed.returncode == 0, fixed.stderr


def test_the_config_is_routes_yaml_unless_named(routes: Path) -> None:
    result = bridge("check", cwd=routes.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "routes.yaml: OK (3 connections, 2 routes)\n"


def test_bad_config_exits_2_with_its_location(routes: Path) -> None:
    routes.write_text(routes.read_text().replace("queue: Sales}", "queue: Sales, colour: red}"))
    result = bridge("check", "-c", str(routes))
    assert result.returncode == 2
    assert result.stderr.startswith(f"{routes}:10:45: routes[0].from.colour"), result.stderr
    assert "unknown key 'colour'" in result.stderr


def test_usage_errors_exit_2(routes: Path) -> None:
    assert bridge("nonsense").returncode == 2
    assert bridge("send", "nowhere", "Q", "-c", str(routes)).returncode == 2
    bad_ttl = bridge("send", "local", "Sales", "--ttl", "soon", "-c", str(routes))
    assert bad_ttl.returncode == 2 and "--ttl" in bad_ttl.stderr
    assert bridge("run", "--route", "nope", "-c", str(routes)).returncode == 2
    assert bridge("check", "-c", str(routes.parent / "missing.yaml")).returncode == 2


def test_print_sql_needs_no_connection_and_quotes_names(routes: Path) -> None:
    result = bridge(
        "install",
        "--print-sql",
        "-c",
        str(routes),
        env={"SHOP_DSN": "postgresql://x:pw@127.0.0.1:1/none"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert '"Sales.Copy"' in out and "CREATE TABLE" in out
    assert '"Sales Done"' in out


def test_print_sql_for_sql_server_is_runnable_batches(tmp_path: Path) -> None:
    from bridge.config.models import SqlServerConnection
    from bridge.transports.sql.dialects.sqlserver import SqlServerDialect
    from bridge.transports.sql.dialects.tsql import standalone_batch

    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              legacy: {{type: sqlserver, dsn: "Driver=FreeTDS;Server=nowhere", catalog: shop}}
              local: {{type: sqlite, path: "{tmp_path / "bridge.db"}"}}
            routes:
              - name: legacy-to-local
                from: {{connection: legacy, queue: Sales}}
                to:   {{connection: local, queue: Sales}}
            """
        )
    )
    result = bridge("install", "--print-sql", "-c", str(path))
    assert result.returncode == 0, result.stderr
    legacy = SqlServerDialect(
        "legacy",
        SqlServerConnection.model_validate(
            {"type": "sqlserver", "dsn": "x", "catalog": "shop", "schema": "dbo"}
        ),
    )
    scripts = [  # each queue table, then its delayed table (tests/unit/test_sql_delayed.py)
        legacy.queue_statements("Sales").create[0],
        legacy.delayed_statements("Sales").create[0],
        legacy.queue_statements("bridge.error").create[0],
        legacy.delayed_statements("bridge.error").create[0],
        legacy.checkpoint_statements().create[0],
    ]
    expected = "-- connection legacy (sqlserver)\n" + "".join(
        standalone_batch(script) + "\n\n" for script in scripts
    )
    assert result.stdout.startswith(expected)
    rest = result.stdout.removeprefix(expected)
    assert rest.startswith("-- connection local (sqlite)\nCREATE TABLE IF NOT EXISTS")
    assert rest.count(");\n") == 4  # each SQLite statement ends with one `;` (table, delayed
    # table and its index, checkpoints)


def test_install_send_peek_run_round_trip(routes: Path) -> None:
    config = ("-c", str(routes))
    check = bridge("check", "--connect", *config)
    assert check.returncode == 1  # nothing installed yet
    assert "FAILED" in check.stdout
    for _ in range(2):
        result = bridge("install", *config)
        assert result.returncode == 0, result.stderr
    assert bridge("check", "--connect", *config).returncode == 0

    sent = bridge(
        "send",
        "local",
        "Sales",
        "--count",
        "25",
        "--ttl",
        "00:10:00",
        "--header",
        "NServiceBus.EnclosedMessageTypes=Shop.OrderPlaced",
        "--body",
        '{"a": "/"}',
        *config,
    )
    assert sent.returncode == 0, sent.stderr
    peek = bridge("peek", "local", "Sales", "--json", *config)
    assert peek.returncode == 0, peek.stderr
    stats = json.loads(peek.stdout)
    assert stats["depth"] == 25 and stats["expired"] == 0
    assert stats["oldest_age_seconds"] is not None and stats["oldest_age_seconds"] < 60

    run = bridge("run", "--until-idle", "1", *config)
    assert run.returncode == 0, run.stderr
    assert json.loads(bridge("peek", "local", "Sales", "--json", *config).stdout)["depth"] == 0
    assert json.loads(bridge("peek", "shop", "Sales.Copy", "--json", *config).stdout)["depth"] == 0
    done = json.loads(bridge("peek", "local", "Sales Done", "--json", *config).stdout)
    assert done["depth"] == 25


def test_secrets_never_reach_the_output(routes: Path) -> None:
    secret = unique("pw")
    result = bridge(
        "check",
        "--connect",
        "-c",
        str(routes),
        env={"SHOP_DSN": f"postgresql://postgres:{secret}@127.0.0.1:1/test?connect_timeout=2"},
    )
    assert result.returncode == 1
    assert secret not in result.stdout + result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_unreadable_config_files_exit_2_with_one_line(tmp_path: Path) -> None:
    not_utf8 = tmp_path / "bad8.yaml"
    not_utf8.write_bytes(b"connections: {}\nroutes: [\xff]\n")
    for path, expected in [
        (tmp_path / "nonexist.yaml", f"{tmp_path / 'nonexist.yaml'}: config file not found"),
        (tmp_path, f"{tmp_path}: cannot read config: Is a directory"),
        (not_utf8, f"{not_utf8}:2:10: the file is not UTF-8 text (byte 0xff)"),
    ]:
        result = bridge("check", "-c", str(path))
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(expected), result.stderr
        assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_check_and_install_refuse_a_long_postgresql_queue_name_where_it_is_written(
    routes: Path,
) -> None:
    long_name = "S" * 56
    text = routes.read_text().replace('"Sales.Copy"', long_name, 1)  # the first route's `to`
    routes.write_text(text)
    for command in (("check",), ("install", "--print-sql")):
        result = bridge(*command, "-c", str(routes))
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"{routes}:11:37: to: PostgreSQL queue table name"), (
            result.stderr
        )


def test_print_sql_needs_no_credentials(tmp_path: Path) -> None:
    """A DBA without the production secrets can still print the DDL; the names still count."""
    routes = tmp_path / "routes.yaml"
    text = textwrap.dedent(
        """\
        connections:
          legacy: {type: sqlserver, dsn: "${LEGACY_ODBC}", schema: "${LEGACY_SCHEMA}"}
          rabbit: {type: rabbitmq, url: "amqp://bridge:${RABBIT_PASSWORD}@mq/%2F"}
        routes:
          - name: shipping
            from: {connection: legacy, queue: Shipping}
            to: {connection: rabbit, queue: Shipping}
            address_map: {"Sales@[sales]": Sales}
        """
    )
    routes.write_text(text)
    secret = unique("pw")
    unset = {name: value for name, value in os.environ.items() if name != "LEGACY_ODBC"}
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "install", "--print-sql", "-c", str(routes)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**unset, "LEGACY_SCHEMA": "sales", "RABBIT_PASSWORD": secret},
    )
    assert result.returncode == 0, result.stderr
    assert "CREATE TABLE [sales].[Shipping]" in result.stdout
    assert result.stderr == (
        f"{routes}:2:34: warning: environment variable LEGACY_ODBC is not set; "
        "<unset-LEGACY_ODBC> in its place, as this connects to nothing\n"
    )
    assert secret not in result.stdout + result.stderr

    routes.write_text(text.replace("${LEGACY_SCHEMA}", "${LEGACY_SCHEMA_UNSET}"))
    result = bridge("install", "--print-sql", "-c", str(routes), env={"RABBIT_PASSWORD": "x"})
    assert result.returncode == 2
    assert result.stderr.endswith(
        f"{routes}:2:60: environment variable LEGACY_SCHEMA_UNSET is not set "
        "(use ${LEGACY_SCHEMA_UNSET:-default} for a default)\n"
    )
    assert bridge("check", "-c", str(routes)).returncode == 2


REFUSE_INSERTS = """
CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql
AS $$ BEGIN RAISE EXCEPTION 'the archive is read-only'; END $$;
CREATE TRIGGER refuse BEFORE INSERT ON "{schema}"."Sales.Copy"
FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".refuse();
"""


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ('DROP TABLE "{schema}"."Sales.Copy"', '"Sales.Copy" does not exist'),
        (REFUSE_INSERTS, "the archive is read-only (SQLSTATE P0001)"),
    ],
    ids=["destination-missing", "destination-refuses-every-insert"],
)
def test_until_idle_exits_1_at_once_when_a_route_fails_for_good(
    routes: Path, pg_dsn: str, pg_schema: str, breakage: str, reason: str
) -> None:
    """A destination that will not work by retrying (a missing table: the route's probe finds
    it; a trigger refusing each insert: the first send does) ends the run with exit 1 and the
    route's error, long before the idle time, and the messages stay at the source."""
    import psycopg

    config = ("-c", str(routes))
    assert bridge("install", *config).returncode == 0
    assert bridge("send", "local", "Sales", "--count", "25", *config).returncode == 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(breakage.format(schema=pg_schema).encode())

    # An hour of idle time: only the failure can end this run within the helper's timeout.
    run = bridge("run", "--until-idle", "3600", *config)
    assert run.returncode == 1, run.stderr
    assert "route local-to-shop failed: postgresql connection 'shop'" in run.stderr
    assert reason in run.stderr
    assert json.loads(bridge("peek", "local", "Sales", "--json", *config).stdout)["depth"] == 25


REPO = Path(__file__).resolve().parents[2]
EXAMPLE_VARIABLES = ("SHOP_DSN", "KAFKA_BOOTSTRAP_SERVERS", "RABBITMQ_URL")


def test_the_shipped_routes_yaml_checks_and_holds_the_routes_it_describes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bridge.config.loader import load_config

    for name in EXAMPLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    result = bridge("check", cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "routes.yaml: OK (3 connections, 2 routes, 2 derived from 2 endpoints)\n"
    )
    # the one warning: the local RabbitMQ login in the URL's default
    assert result.stderr.count("warning:") == 1 and "connection 'broker'" in result.stderr

    config = load_config(str(REPO / "routes.yaml")).config
    where = {"type", "dsn", "bootstrap_servers", "url"}  # each connection's defaults
    assert {name: c.model_dump(include=where) for name, c in config.connections.items()} == {
        "shop": {"type": "postgresql", "dsn": "postgresql://postgres@127.0.0.1:5432/test"},
        "events": {"type": "kafka", "bootstrap_servers": "127.0.0.1:9092"},
        "broker": {"type": "rabbitmq", "url": "amqp://guest:guest@127.0.0.1:5672/%2F"},
    }
    assert config.http is not None and config.http.port == 8080
    assert [
        (r.name, r.from_.connection, r.from_.address, r.from_.group, r.to.connection, r.to.address)
        for r in config.all_routes
    ] == [
        ("sales-to-kafka", "shop", "Sales", None, "events", "sales"),
        ("sales-to-billing", "events", "sales", "shop-billing", "shop", "Billing"),
        ("proxy.shop.Shipping", "shop", "Shipping", None, "broker", "Shipping"),
        ("proxy.broker.Warehouse", "broker", "Warehouse", None, "shop", "Warehouse"),
    ]
    assert [r.error_queue_name for r in config.all_routes] == [
        "error",
        "sales-errors",
        "bridge.error",
        "bridge.error",
    ]
    assert [r.concurrency for r in config.derived_routes] == [1, 2]
    billing = config.routes[1]
    assert billing.concurrency == 2
    assert billing.address_map == {"Sales@[dbo]@[shop]": '"public"."Sales"'}
    assert billing.headers.rename == {"x-tenant": "Shop.TenantId"}
    assert billing.headers.drop == ["x-debug"] and billing.headers.set == {"Shop.Bridged": "true"}
