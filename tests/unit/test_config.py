from __future__ import annotations

import re
import subprocess
import sys
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
    assert first.batch_size == 500 and first.batch_bytes == 1 << 20 and first.concurrency == 1
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
        ('{type: postgresql, dsn: "${PG_DSN:-postgresql://bob:DefaultPw1@h/x}"}', "dsn"),
        ('{type: rabbitmq, url: "${AMQP_URL:-amqp://app:pw@h/%2F}"}', "url"),
        (
            '{type: kafka, bootstrap_servers: "k:9092", security_protocol: SASL_SSL, '
            'sasl_mechanism: PLAIN, sasl_username: u, sasl_password: "${PW:-pa55}"}',
            "sasl_password",
        ),
        ('{type: rabbitmq, url: "amqp://guest:guest@127.0.0.1/%2F"}', "url"),
        (
            '{type: kafka, bootstrap_servers: "k:9092", security_protocol: SASL_SSL, '
            'sasl_mechanism: PLAIN, sasl_username: u, sasl_password: "pa55"}',
            "sasl_password",
        ),
    ],
)
def test_credentials_written_in_the_file_are_warned_about(connection: str, key: str) -> None:
    line = f"  db: {connection}"
    column = line.index('"', line.index(f"{key}:")) + 1
    text = f"connections:\n{line}\nroutes: []\n"
    (warning,) = parse_config(text, env={}).warnings
    where = f"routes.yaml:2:{column}: warning: connection 'db' has a password written in "
    variable = re.search(r"\$\{(\w+):-", connection)
    if variable is None:
        assert warning == f"{where}`{key}`; use ${{VAR}} and keep secrets in the environment"
    else:  # a default is used only while its variable is not set
        name = variable.group(1)
        assert warning == (
            f"{where}the default of `{key}`, used because {name} is not set; set {name}, or "
            "use ${VAR} and keep secrets in the environment"
        )
        given = "amqp://h/%2F" if key == "url" else "host=db"
        assert parse_config(text, env={name: given}).warnings == []


README_RABBITMQ = """\
connections:
  rabbit: {type: rabbitmq, url: "amqps://bridge:${RABBIT_PASSWORD}@rabbit.example.com:5671/shop?heartbeat=30"}
  local:  {type: rabbitmq, url: "${RABBIT_URL:-amqp://guest:guest@127.0.0.1:5672/%2F}",
           topology: direct, queue_type: classic, prefetch: 1000}
routes: []
"""


def test_the_readme_rabbitmq_example_warns_only_while_its_default_url_is_used() -> None:
    """The README's own example: with RABBIT_URL set, the guest:guest default is not what the
    bridge uses, so there is nothing to warn about; without it, the warning says why."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert README_RABBITMQ.split("\n", 1)[1].rsplit("routes:", 1)[0] in readme
    env = {"RABBIT_PASSWORD": "x", "RABBIT_URL": "amqp://bridge:pw@rabbit/%2F"}
    assert parse_config(README_RABBITMQ, env=env).warnings == []
    (warning,) = parse_config(README_RABBITMQ, env={"RABBIT_PASSWORD": "x"}).warnings
    assert warning.startswith("routes.yaml:3:33: warning: connection 'local' has a password")
    assert "the default of `url`, used because RABBIT_URL is not set" in warning
    # a literal password next to a variable is in the file whatever the environment says
    literal = README_RABBITMQ.replace("bridge:${RABBIT_PASSWORD}", "bridge:pa55")
    (warning,) = parse_config(literal, env=env).warnings
    assert "connection 'rabbit' has a password written in `url`;" in warning


@pytest.mark.parametrize(
    "connection",
    [
        '{type: postgresql, dsn: "${PG_DSN:-postgresql://postgres@127.0.0.1/test}"}',
        '{type: kafka, bootstrap_servers: "k:9092", security_protocol: SASL_SSL, '
        'sasl_mechanism: PLAIN, sasl_username: u, sasl_password: "${PW:-}"}',
        '{type: kafka, bootstrap_servers: "k:9092", security_protocol: SASL_SSL, '
        'sasl_mechanism: PLAIN, sasl_username: u, sasl_password: "${PW}"}',
    ],
)
def test_defaults_without_a_password_are_fine(connection: str) -> None:
    text = f"connections:\n  db: {connection}\nroutes: []\n"
    assert parse_config(text, env={"PW": "x"}).warnings == []


def test_password_from_a_variable_inside_a_url_is_fine() -> None:
    text = 'connections:\n  db: {type: rabbitmq, url: "amqp://guest:${PW}@h/%2F"}\nroutes: []\n'
    assert parse_config(text, env={"PW": "x"}).warnings == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("connections: &c\n  a: *c\n", "routes.yaml:2:3: recursive alias"),
        ("connections: {}\nroutes: &r\n  - *r\n", "routes.yaml:2:9: recursive alias"),
        ("connections: &c\n  a: {<<: *c}\n", "routes.yaml:2:3: recursive alias"),
    ],
)
def test_recursive_alias_is_a_located_error(text: str, expected: str) -> None:
    assert error_of(text).startswith(expected)


def test_aliases_of_aliases_stop_at_a_budget() -> None:
    lines = ["l0: &l0 [a, b, c, d, e, f, g, h, i, j]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    assert error_of("\n".join(lines)).startswith(
        "routes.yaml:5:1: alias expansion too large: more than 100,000 values"
    )


def test_merges_of_merges_stop_at_a_budget() -> None:
    # PyYAML's own flatten_mapping copies the merged lists: 2**30 pairs before any check.
    lines = ["connections: {}", "l0: &l0 {x: 1}"]
    lines += [f"l{i}: &l{i} {{<<: [*l{i - 1}, *l{i - 1}]}}" for i in range(1, 30)]
    assert "alias expansion too large" in error_of("\n".join(lines))


def test_aliases_and_merges_share_settings() -> None:
    text = textwrap.dedent(
        """\
        connections:
          shop: &pg {type: postgresql, dsn: "postgresql://db/shop", schema: sales}
          billing: {<<: *pg, schema: billing}
        routes:
          - &route
            {name: a, from: {connection: shop, queue: A}, to: {connection: billing, queue: A}}
          - {<<: *route, name: b, batch_size: 5}
        """
    )
    config = parse_config(text, env={}).config
    assert config.connections["billing"].schema_ == "billing"  # type: ignore[union-attr]
    assert config.connections["billing"].dsn == "postgresql://db/shop"  # type: ignore[union-attr]
    assert [(r.name, r.batch_size, r.to.queue) for r in config.routes] == [
        ("a", 500, "A"),
        ("b", 5, "A"),
    ]
    assert error_of("connections: {a: {<<: [1]}}\n").startswith(
        "routes.yaml:1:24: `<<` merges a mapping or a list of mappings"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("${1BAD}", "invalid variable name '1BAD': names are letters, digits and _"),
        ("x${}", "invalid variable name '': names are letters"),
        ("${A:=x}", "invalid variable reference ${A:...}: use ${A} or ${A:-default}"),
        ("${A", "unterminated ${ (a variable is ${NAME} or ${NAME:-default})"),
        ("${A:-${B}}", "the default of ${A:-...} cannot hold a ${...}"),
    ],
)
def test_malformed_variables_are_located_errors(value: str, expected: str) -> None:
    text = f'connections:\n  k: {{type: kafka, bootstrap_servers: "{value}"}}\n'
    assert error_of(text, env={"A": "a", "B": "b"}).startswith(f"routes.yaml:2:39: {expected}")


@pytest.mark.parametrize(
    ("connection", "expected"),
    [
        ('{type: sqlite, path: "${DB_PATH:-}"}', "path: must not be empty (the file has"),
        ('{type: sqlite, path: "${DB_PATH}"}', "path: must not be empty (the file has"),
        ('{type: postgresql, dsn: "", schema: "${SCHEMA:-}"}', "schema: must not be empty"),
        ('{type: sqlserver, dsn: "${ODBC:-}"}', "dsn: must not be empty"),
        ('{type: sqlserver, dsn: "x", catalog: ""}', "catalog: must not be empty"),
        ('{type: kafka, bootstrap_servers: ""}', "bootstrap_servers: must not be empty"),
        ('{type: rabbitmq, url: "${RABBIT_URL:-}"}', "url: must not be empty"),
    ],
)
def test_empty_required_values_are_located_errors(connection: str, expected: str) -> None:
    message = error_of(f"connections:\n  db: {connection}\n", env={"DB_PATH": ""})
    assert message.startswith("routes.yaml:2:"), message
    assert f"connections.db.{expected}" in message


def test_a_file_that_is_not_utf8_points_at_its_first_bad_byte(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_bytes(b"connections:\n  caf\xe9: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:2:6: the file is not UTF-8 text (byte 0xe9)"


POSTGRES_ROUTE = textwrap.dedent(
    """\
    connections:
      shop: {type: postgresql, dsn: ""}
      lite: {type: sqlite, path: ./bridge.db}
    routes:
      - name: r
        from: {connection: FROM_CONNECTION, queue: FROM_QUEUE}
        to: {connection: shop, queue: TO_QUEUE}
        error_queue: ERROR_QUEUE
    """
)


@pytest.mark.parametrize(
    ("field", "source", "expected"),
    [
        ("TO_QUEUE", "lite", "routes.yaml:7:35: to: PostgreSQL queue table name"),
        ("FROM_QUEUE", "shop", "routes.yaml:6:37: from: PostgreSQL queue table name"),
        ("ERROR_QUEUE", "shop", "routes.yaml:8:18: error_queue: PostgreSQL queue table name"),
    ],
)
def test_postgresql_queue_names_over_55_bytes_are_refused_where_written(
    field: str, source: str, expected: str
) -> None:
    names = {"FROM_QUEUE": "In", "TO_QUEUE": "Out", "ERROR_QUEUE": "Errors"}
    text = POSTGRES_ROUTE.replace("FROM_CONNECTION", source)
    fits = {**names, field: "é" * 27 + "x"}  # 55 bytes
    parse_config(_fill(text, fits), env={})
    message = error_of(_fill(text, {**names, field: "é" * 28}), env={})  # 56 bytes
    assert message.startswith(expected), message
    assert "is 56 bytes long; the NServiceBus PostgreSQL transport allows at most 55" in message


def test_long_queue_names_are_fine_elsewhere() -> None:
    text = POSTGRES_ROUTE.replace("FROM_CONNECTION", "lite")
    names = {"FROM_QUEUE": "q" * 60, "TO_QUEUE": "Out", "ERROR_QUEUE": "e" * 60}
    parse_config(_fill(text, names), env={})


NAMED_ROUTE = textwrap.dedent(
    """\
    connections:
      kafka:  {type: kafka, bootstrap_servers: "k:9092"}
      rabbit: {type: rabbitmq, url: "amqp://h/%2F"}
      legacy: {type: sqlserver, dsn: "${ODBC:-x}", schema: dbo, catalog: nsb}
      lite:   {type: sqlite, path: ./b.db}
    routes:
      - name: r
        from: {connection: FROM, FROM_KEY: FROM_NAME, GROUP}
        to:   {connection: lite, queue: Out}
    """
)


@pytest.mark.parametrize(
    ("connection", "key", "name", "expected"),
    [
        ("kafka", "topic", "bad topic!", "Kafka topic name 'bad topic!' is not valid"),
        ("kafka", "topic", "t" * 250, "Kafka topic name"),
        ("kafka", "topic", "..", "Kafka topic name '..' is not valid"),
        ("rabbit", "queue", "q" * 256, "is 256 bytes long; AMQP allows at most 255"),
        ("rabbit", "queue", "amq.mine", "names starting 'amq.' are the broker's"),
        ("legacy", "queue", "s" * 129, "is 129 characters long; identifiers hold at most 128"),
    ],
)
def test_names_a_transport_refuses_are_config_errors_where_written(
    connection: str, key: str, name: str, expected: str
) -> None:
    group = "group: g" if connection == "kafka" else ""
    text = NAMED_ROUTE.replace("FROM_KEY", key).replace("GROUP", group)
    text = text.replace("connection: FROM", f"connection: {connection}")
    message = error_of(text.replace("FROM_NAME", f'"{name}"'), env={})
    line = text.splitlines()[7]
    assert message.startswith(f"routes.yaml:8:{line.index('FROM_NAME') + 1}: from: "), message
    assert expected in message, message


@pytest.mark.parametrize(
    ("connection", "key", "name"),
    [
        ("kafka", "topic", "Sales.Orders_v2-eu"),
        ("kafka", "topic", "t" * 249),
        ("rabbit", "queue", "é" * 127),
        ("legacy", "queue", "Sales.Delayed with spaces" + "s" * 100),
    ],
)
def test_names_at_the_limits_are_fine(connection: str, key: str, name: str) -> None:
    group = "group: g" if connection == "kafka" else ""
    text = NAMED_ROUTE.replace("FROM_KEY", key).replace("GROUP", group)
    text = text.replace("connection: FROM", f"connection: {connection}")
    parse_config(text.replace("FROM_NAME", f'"{name}"'), env={})


def test_a_kafka_error_topic_follows_the_topic_rule() -> None:
    text = NAMED_ROUTE.replace("FROM_KEY", "topic").replace("GROUP", "group: g")
    text = text.replace("connection: FROM", "connection: kafka").replace("FROM_NAME", "in")
    text += '    error_queue: "bad topic"\n'
    assert "error_queue: Kafka topic name 'bad topic' is not valid" in error_of(text, env={})


def _fill(text: str, names: dict[str, str]) -> str:
    for placeholder, name in names.items():
        text = text.replace(placeholder, name)
    return text


def test_the_name_rules_need_no_database_driver() -> None:
    """psycopg and pyodbc are optional: checking a config must not import them."""
    program = textwrap.dedent(
        f"""\
        import sys
        sys.modules["psycopg"] = sys.modules["pyodbc"] = None  # importing them now fails
        from bridge.config.loader import parse_config
        from bridge.errors import ConfigError
        try:
            parse_config({POSTGRES_ROUTE.replace("FROM_CONNECTION", "lite")!r}
                         .replace("TO_QUEUE", "x" * 56), env={{}})
        except ConfigError as exc:
            print(exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert "PostgreSQL queue table name 'xxx" in result.stdout, result.stderr


OFFLINE = textwrap.dedent(
    """\
    connections:
      legacy: {type: sqlserver, dsn: "${LEGACY_ODBC}", schema: "${LEGACY_SCHEMA:-dbo}"}
      shop: {type: postgresql, dsn: "postgresql://app:${SHOP_PW}@db/shop"}
      rabbit: {type: rabbitmq, url: "${RABBIT_URL}"}
      kafka: {type: kafka, bootstrap_servers: "k:9092", security_protocol: SASL_SSL,
              sasl_mechanism: PLAIN, sasl_username: u, sasl_password: "${KAFKA_PW}"}
    routes: []
    """
)


def test_offline_missing_credentials_become_placeholders_with_a_warning() -> None:
    loaded = parse_config(OFFLINE, env={"KAFKA_PW": "s3cret"}, offline=True)
    connections = loaded.config.connections
    assert connections["legacy"].dsn == "<unset-LEGACY_ODBC>"  # type: ignore[union-attr]
    assert connections["shop"].dsn == "postgresql://app:<unset-SHOP_PW>@db/shop"  # type: ignore[union-attr]
    assert connections["rabbit"].url == "amqp://<unset-RABBIT_URL>/"  # type: ignore[union-attr]
    assert connections["kafka"].sasl_password == "s3cret"  # type: ignore[union-attr]
    assert loaded.warnings == [
        f"routes.yaml:{line}:{column}: warning: environment variable {name} is not set; "
        f"<unset-{name}> in its place, as this connects to nothing"
        for line, column, name in [
            (2, 34, "LEGACY_ODBC"),
            (3, 33, "SHOP_PW"),
            (4, 33, "RABBIT_URL"),
        ]
    ]
    assert error_of(OFFLINE, env={}).startswith(
        "routes.yaml:2:34: environment variable LEGACY_ODBC is not set"
    )


def test_offline_still_needs_the_variables_of_names() -> None:
    text = OFFLINE.replace("${LEGACY_SCHEMA:-dbo}", "${LEGACY_SCHEMA}")
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={}, offline=True)
    assert str(info.value).startswith(
        "routes.yaml:2:60: environment variable LEGACY_SCHEMA is not set"
    )


def test_nesting_too_deep_is_a_located_error() -> None:
    # PyYAML composes recursively: 3,000 levels were a RecursionError.
    assert error_of("connections: " + "[" * 3000 + "]" * 3000) == (
        "routes.yaml:1:77: nested too deep: more than 64 levels"
    )
    for chain in ("[*l{}]", "{{<<: *l{}}}"):
        lines = ["connections: {}", "l0: &l0 {x: 1}"]
        lines += [f"l{i}: &l{i} " + chain.format(i - 1) for i in range(1, 1500)]
        assert error_of("\n".join(lines)) == "routes.yaml:2:5: nested too deep: more than 64 levels"


@pytest.mark.parametrize("name", ["  ", "a\x00b"])
def test_invalid_error_queue_names(name: str) -> None:
    text = POSTGRES_ROUTE.replace("FROM_CONNECTION", "lite")
    text = _fill(text, {"FROM_QUEUE": "In", "TO_QUEUE": "Out", "ERROR_QUEUE": f'"{name}"'})
    assert error_of(text.replace("\x00", "\\0"), env={}).startswith(
        "routes.yaml:8:18: error_queue: invalid name"
    )


def test_a_malformed_variable_in_a_credential_field_shows_nothing_of_it() -> None:
    text = 'connections:\n  db: {type: sqlserver, dsn: "Server=db;PWD=pa${s w0rd"}\n'
    message = error_of(text, env={})
    assert message.startswith("routes.yaml:2:30: unterminated ${")
    message = error_of(text.replace('w0rd"', 'w0rd}"'), env={})
    assert message.startswith("routes.yaml:2:30: invalid variable name: names are letters")
    assert "w0rd" not in message


@pytest.mark.parametrize(
    ("connection", "key", "message"),
    [
        (
            '{type: kafka, bootstrap_servers: "k:9092", security_protocol: SASL_SSL}',
            "security_protocol",
            "kafka: security_protocol SASL_SSL needs sasl_mechanism",
        ),
        (
            '{type: kafka, bootstrap_servers: "k:9092", sasl_username: bob}',
            "sasl_username",
            "kafka: sasl_username is set but security_protocol PLAINTEXT does not use SASL",
        ),
        (
            '{type: kafka, bootstrap_servers: "k:9092", ssl_cafile: /ca.pem}',
            "ssl_cafile",
            "kafka: ssl_cafile is set but security_protocol PLAINTEXT does not use SSL",
        ),
        (
            '{type: kafka, bootstrap_servers: "k:9092", security_protocol: SSL, ssl_certfile: c}',
            "ssl_certfile",
            "kafka: ssl_certfile and ssl_keyfile go together",
        ),
        (
            '{type: rabbitmq, url: "http://guest:guest@127.0.0.1:5672/"}',
            "url",
            "url must start with amqp:// or amqps://",
        ),
        (
            '{type: rabbitmq, url: "amqp://guest:guest@127.0.0.1:port/"}',
            "url",
            "invalid url: Port could not be cast to integer value as 'port'",
        ),
    ],
)
def test_each_transports_connection_rules_are_reported_at_the_key(
    connection: str, key: str, message: str
) -> None:
    """Each transport's connection rules, reported by `bridge check` at the key, unconnected."""
    line = f"  db: {connection}"
    text = f"connections:\n{line}\nroutes: []\n"
    column = line.index(f" {key}:") + len(f" {key}: ") + 1
    assert error_of(text) == f"routes.yaml:2:{column}: connections.db: {message}"
