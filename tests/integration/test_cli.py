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
