"""A route between two connection names that reach one table, topic or queue is a loop, and
`bridge check` refuses it where its `to` is written; places that only look alike are not one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.config.loader import parse_config
from bridge.errors import ConfigError


def routes(first: str, second: str, source: str = "Sales", destination: str = "Sales") -> str:
    key = "topic" if "kafka" in first else "queue"
    group = ", group: g" if key == "topic" else ""
    return textwrap.dedent(
        f"""\
        connections:
          one: {first}
          two: {second}
        routes:
          - name: copy
            from: {{connection: one, {key}: {source}{group}}}
            to:   {{connection: two, {key}: {destination}}}
        """
    )


def loop_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "routes.yaml", {})
    assert str(info.value).startswith("routes.yaml:7:11: from and to are the same place"), info
    return str(info.value)


PG = "{type: postgresql, schema: sales, dsn: "


@pytest.mark.parametrize(
    ("first", "second", "reached"),
    [
        (
            PG + '"postgresql://bridge:pw@127.0.0.1:5432/shop"}',
            PG + "\"host=localhost dbname=shop user=other password='x y'\"}",
            'table "sales"."Sales" of database \'shop\' on localhost:5432',
        ),
        (
            PG + '"postgresql://db1:5433,db2:5433/shop"}',
            PG + '"postgresql://DB2:5433/shop?application_name=bridge"}',
            'table "sales"."Sales" of database \'shop\' on db2:5433',
        ),
        (
            "{type: sqlserver, dsn: 'Driver=x;Server=tcp:sql1,1433;Database=Shop'}",
            "{type: sqlserver, dsn: 'DRIVER={y};SERVER=SQL1;UID=u', catalog: shop}",
            "table [dbo].[Sales] of database 'shop' on sql1:1433",
        ),
        (
            '{type: rabbitmq, url: "amqp://guest:guest@127.0.0.1:5672/%2F"}',
            '{type: rabbitmq, url: "amqp://u:p@localhost", topology: direct}',
            "queue 'Sales' of virtual host '/' on localhost:5672",
        ),
        (
            '{type: kafka, bootstrap_servers: "k1:9092,k2:9092"}',
            '{type: kafka, bootstrap_servers: "k2:9092", client_id: other}',
            "topic 'Sales' of the cluster at k2:9092",
        ),
    ],
    ids=["postgresql", "postgresql-hosts", "sqlserver", "rabbitmq", "kafka"],
)
def test_two_names_for_one_place_are_a_loop(first: str, second: str, reached: str) -> None:
    message = loop_error(routes(first, second))
    assert message.endswith(
        f"connections 'one' and 'two' both reach {reached}, so the route would loop"
    )


def test_one_sqlite_file_by_two_paths_is_one_place_and_table_names_fold_ascii(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite matches table names without ASCII case; the path resolves as the bridge opens it:
    from the working directory, through symlinks."""
    (tmp_path / "data").mkdir()
    (tmp_path / "link.db").symlink_to(tmp_path / "data" / "queues.db")
    monkeypatch.chdir(tmp_path / "data")
    text = routes(
        "{type: sqlite, path: queues.db}",
        f'{{type: sqlite, path: "{tmp_path}/data/../link.db"}}',
        destination="SALES",
    )
    message = loop_error(text)
    real = os.path.realpath(tmp_path / "data" / "queues.db")
    assert f"both reach table 'SALES' of {real}" in message


@pytest.mark.parametrize(
    ("first", "second", "destination"),
    [
        (PG + '"postgresql://h/shop"}', PG + '"postgresql://h/other"}', "Sales"),
        (PG + '"postgresql://h/shop"}', PG + '"postgresql://h:5433/shop"}', "Sales"),
        (PG + '"postgresql://h/shop"}', "{type: postgresql, dsn: 'postgresql://h/shop'}", "Sales"),
        (PG + '"postgresql://h/shop"}', PG + '"postgresql://h/shop"}', "sales"),
        (
            '{type: rabbitmq, url: "amqp://h/%2F"}',
            '{type: rabbitmq, url: "amqp://h/prod"}',
            "Sales",
        ),
        ('{type: rabbitmq, url: "amqp://h"}', '{type: rabbitmq, url: "amqps://h"}', "Sales"),
        (
            '{type: kafka, bootstrap_servers: "k1:9092"}',
            '{type: kafka, bootstrap_servers: "k2"}',
            "Sales",
        ),
        ("{type: sqlite, path: a.db}", "{type: sqlite, path: b.db}", "Sales"),
        ("{type: sqlite, path: ':memory:'}", "{type: sqlite, path: ':memory:'}", "Sales"),
        ("{type: sqlserver, dsn: 'DSN=prod'}", "{type: sqlserver, dsn: 'DSN=prod'}", "Sales"),
    ],
    ids=[
        "pg-other-database",
        "pg-other-port",
        "pg-other-schema",
        "pg-names-keep-case",
        "rabbitmq-other-vhost",
        "rabbitmq-other-port",
        "kafka-other-cluster",
        "sqlite-other-file",
        "sqlite-in-memory",
        "sqlserver-dsn-alias-unknown",
    ],
)
def test_places_that_only_look_alike_are_not_a_loop(
    first: str, second: str, destination: str
) -> None:
    parse_config(routes(first, second, destination=destination), "routes.yaml", {})


def test_a_derived_route_into_its_own_queue_is_refused_at_the_endpoint() -> None:
    """Two connections to one schema: every endpoint's proxy would be its own queue."""
    text = textwrap.dedent(
        """\
        connections:
          east: {type: postgresql, dsn: "postgresql://db/shop"}
          west: {type: postgresql, dsn: "host=db dbname=shop"}
        endpoints:
          Sales: {connection: east}
        """
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, "routes.yaml", {})
    assert str(info.value).startswith(
        "routes.yaml:5:3: endpoint 'Sales', its proxy on 'west': from and to are the same "
        "place: connections 'west' and 'east' both reach table \"public\".\"Sales\""
    ), info.value


def test_bridge_check_refuses_the_loop_with_its_location(tmp_path: Path) -> None:
    config = tmp_path / "routes.yaml"
    config.write_text(
        routes(
            '{type: rabbitmq, url: "amqp://guest:guest@127.0.0.1:5672/%2F"}',
            '{type: rabbitmq, url: "amqp://guest:guest@localhost/"}',
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "check", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"{config}:7:11: from and to are the same place"), result.stderr
