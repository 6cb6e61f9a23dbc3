from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bridge.config.loader import load_config, parse_config
from bridge.errors import ConfigError

GOOD = textwrap.dedent(
    """\
    http: {host: 127.0.0.1, port: 8080}
    connections:
      shop:   {type: postgresql, dsn: "${SHOP_DSN:-postgresql://postgres@127.0.0.1:5432/test}"}
      local:  {type: sqlite, path: ./bridge.db}
      kafka:  {type: kafka, bootstrap_servers: "127.0.0.1:9092", idempotence: false}
      rabbit: {type: rabbitmq, url: "amqp://guest:${RABBIT_PASSWORD}@127.0.0.1:5672/%2F"}
    routes:
      - name: sales-to-kafka
        from: {connection: shop, queue: Sales}
        to:   {connection: kafka, topic: sales}
        key: header:NServiceBus.ConversationId
      - name: billing-from-kafka
        from: {connection: kafka, topic: billing, group: bridge-billing}
        to:   {connection: shop, queue: Billing}
        headers: {rename: {a: b}, drop: [c], set: {d: e}}
        address_map: {"Sales@[dbo]@[nservicebus]": '"public"."Sales"'}
    """
)
ENV = {"RABBIT_PASSWORD": "s3cret"}


def error_of(text: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "routes.yaml", ENV if env is None else env)
    return str(info.value)


def test_good_config_loads_with_defaults_and_variables() -> None:
    loaded = parse_config(GOOD, env=ENV)
    config = loaded.config
    assert config.connections["rabbit"].url == "amqp://guest:s3cret@127.0.0.1:5672/%2F"  # type: ignore[union-attr]
    assert config.connections["shop"].dsn.startswith("postgresql://postgres@")  # type: ignore[union-attr]
    assert config.connections["shop"].schema_ == "public"  # type: ignore[union-attr]
    first, second = config.routes
    assert first.batch_size == 100 and first.concurrency == 1
    assert first.key == "header:NServiceBus.ConversationId"
    assert first.error_queue_name == "bridge.error"
    assert second.from_.group == "bridge-billing"
    assert second.headers.drop == ["c"]
    assert loaded.variables == {"SHOP_DSN", "RABBIT_PASSWORD"}


def test_variable_default_used_when_empty() -> None:
    config = parse_config(GOOD, env={**ENV, "SHOP_DSN": ""}).config
    assert config.connections["shop"].dsn.endswith("/test")  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("idempotence: false", "idempotence: false, colour: red"),
            "routes.yaml:5:82: connections.kafka.colour: unknown key 'colour'",
        ),
        (
            ("type: sqlite", "type: sqlit"),
            "routes.yaml:4:18: connections.local: unknown connection type 'sqlit' (did you mean",
        ),
        (
            ("idempotence: false", "idempotence: maybe"),
            "routes.yaml:5:75: connections.kafka.idempotence: Input should be a valid boolean",
        ),
        (
            ("group: bridge-billing", "grp: x"),
            "routes.yaml:13:47: routes[1].from.grp: unknown key 'grp'",
        ),
        (
            ("    to:   {connection: kafka, topic: sales}\n", ""),
            "routes.yaml:8:5: routes[0]: missing required key 'to'",
        ),
        (
            ("{connection: kafka, topic: sales}", "{connection: kafk, topic: sales}"),
            "routes.yaml:10:24: to names connection 'kafk', which is not defined",
        ),
        (
            (
                "{connection: kafka, topic: billing, group: bridge-billing}",
                "{connection: kafka, topic: billing}",
            ),
            "routes.yaml:13:38: a Kafka source needs a consumer `group`",
        ),
        (
            ("{connection: kafka, topic: sales}", "{connection: kafka, queue: sales}"),
            "routes.yaml:10:11: to is the Kafka connection 'kafka': name a `topic`",
        ),
        (
            ("name: billing-from-kafka", "name: sales-to-kafka"),
            "routes.yaml:12:11: duplicate route name 'sales-to-kafka'",
        ),
        (
            ("key: header:NServiceBus.ConversationId", "key: conversation"),
            "routes.yaml:11:10: routes[0].key: Value error, key must be `header:NAME` or `none`",
        ),
        (
            ("{connection: shop, queue: Billing}", "{connection: shop, queue: Billing, group: g}"),
            "routes.yaml:14:53: `group` is only for Kafka sources",
        ),
        (
            ("- name: billing-from-kafka", "- name: 'billing from kafka'"),
            "routes.yaml:12:11: routes[1].name: Value error, route names use letters",
        ),
    ],
)
def test_errors_point_at_file_line_column(change: tuple[str, str], expected: str) -> None:
    assert change[0] in GOOD
    message = error_of(GOOD.replace(*change))
    assert message.startswith(expected), message


def test_missing_variable_is_named_at_its_place() -> None:
    message = error_of(GOOD, env={})
    assert message.startswith("routes.yaml:6:33: environment variable RABBIT_PASSWORD is not set")


def test_yaml_syntax_and_shape_errors() -> None:
    assert error_of("connections: [").startswith("routes.yaml:1:")
    assert error_of("") == "routes.yaml:1:1: the file is empty; it needs `connections` and `routes`"
    assert error_of("- a\n- b\n").startswith("routes.yaml:1:1: the top level must be a mapping")
    assert error_of("connections: {}\nconnections: {}\n").startswith(
        "routes.yaml:2:1: duplicate key 'connections'"
    )


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_no_credential_warning_when_secrets_come_from_the_environment() -> None:
    assert parse_config(GOOD, env=ENV).warnings == []


@pytest.mark.parametrize(
    ("connection", "key"),
    [
        ('{type: postgresql, dsn: "postgresql://app:pa55@db/shop"}', "dsn"),
        ('{type: postgresql, dsn: "host=db user=app password=pa55"}', "dsn"),
        ('{type: sqlserver, dsn: "Driver=FreeTDS;Server=db;UID=sa;PWD={p;w};"}', "dsn"),
        ('{type: sqlserver, dsn: "${ODBC:-Driver=FreeTDS;PWD=fallback}"}', "dsn"),
        ('{type: rabbitmq, url: "amqp://guest:guest@127.0.0.1/%2F"}', "url"),
        ('{type: kafka, bootstrap_servers: "k:9092", sasl_password: "pa55"}', "sasl_password"),
    ],
)
def test_credentials_written_in_the_file_are_warned_about(connection: str, key: str) -> None:
    line = f"  db: {connection}"
    column = line.index('"', line.index(f"{key}:")) + 1
    text = f"connections:\n{line}\nroutes: []\n"
    (warning,) = parse_config(text, env={}).warnings
    assert warning == (
        f"routes.yaml:2:{column}: warning: connection 'db' has a password written in `{key}`; "
        "use ${VAR} and keep secrets in the environment"
    )


def test_password_from_a_variable_inside_a_url_is_fine() -> None:
    text = 'connections:\n  db: {type: rabbitmq, url: "amqp://guest:${PW}@h/%2F"}\nroutes: []\n'
    assert parse_config(text, env={"PW": "x"}).warnings == []
