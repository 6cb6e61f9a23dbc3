"""`bridge check` refuses, at FILE:LINE:COL, the URLs and DSNs the drivers would refuse later:
pika's AMQP URL, aiokafka's bootstrap servers, libpq's connection string.

Each rule set is compared with the driver itself on the same examples, so the check neither
lets through what the driver refuses nor refuses what it takes, except where the bridge is
stricter on purpose (said where it is).
"""

from __future__ import annotations

import pika
import pytest
from aiokafka.conn import collect_hosts
from psycopg.conninfo import conninfo_to_dict

from bridge.config.loader import parse_config
from bridge.errors import ConfigError
from bridge.transports.kafka.config import servers_problems
from bridge.transports.rabbitmq.url import ca_locations, url_problems
from bridge.transports.sql.config import dsn_problems


def check_error(connection: str, env: dict[str, str] | None = None) -> str:
    text = f"connections:\n  c: {connection}\nroutes: []\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env=env or {})
    return str(caught.value)


#: A CA bundle every Debian machine has (pika loads it as it parses the URL).
CA = "/etc/ssl/certs/ca-certificates.crt"

#: AMQP URLs pika takes, and so does the check.
AMQP_ACCEPTED = [
    "amqp://guest:guest@127.0.0.1:5672/%2F",
    "amqps://bridge:pw@rabbit.example.com:5671/shop?heartbeat=30",
    "amqp://guest:guest@localhost/",
    "amqp://localhost",
    "amqp://u:@h/%2F",  # an empty password is a password (the broker decides)
    "amqp://u:p@h/v?heartbeat=0&channel_max=2047&frame_max=131072&connection_attempts=3",
    "amqp://u:p@h/v?socket_timeout=2.5&stack_timeout=10&retry_delay=0&locale=en_US",
    "amqp://u:p@h/v?blocked_connection_timeout=60&heartbeat=",  # an empty value is ignored
    "amqp://u:p@h/v?ssl_options=None&tcp_options={'TCP_KEEPIDLE':60}",
    f"amqps://u:p@h/v?ssl_options={{'ca_certs':'{CA}','server_hostname':'rabbit'}}",
    f"amqps://u:p@h/v?ssl_options={{'ca_certs':'{CA}','protocol':16}}",  # PROTOCOL_TLS_CLIENT
    "amqp://u:p@h/v?client_properties={'connection_name':'x'}",
]

#: AMQP URLs pika refuses (raising when the bridge first connects), and the check says why.
AMQP_REFUSED = [
    ("amqp://guest@127.0.0.1:5672/%2F", "names user 'guest' without a password"),
    ("amqp://u:p@h:99999/v", "Port out of range"),
    ("amqp://u:p@h:port/v", "invalid url"),
    ("amqp://u:p@h/v?heartbeat=abc", "heartbeat='abc': expected a whole number"),
    ("amqp://u:p@h/v?heartbeat=-5", "heartbeat='-5'"),
    ("amqp://u:p@h/v?heartbeat=1.5", "heartbeat='1.5'"),
    ("amqp://u:p@h/v?channel_max=0", "channel_max='0': expected from 1 to 65535"),
    ("amqp://u:p@h/v?frame_max=100", "frame_max='100'"),
    ("amqp://u:p@h/v?connection_attempts=0", "connection_attempts='0'"),
    ("amqp://u:p@h/v?socket_timeout=0", "socket_timeout='0'"),
    ("amqp://u:p@h/v?stack_timeout=soon", "stack_timeout='soon'"),
    ("amqp://u:p@h/v?blocked_connection_timeout=-1", "blocked_connection_timeout='-1'"),
    ("amqp://u:p@h/v?heartbeat=30&heartbeat=60", "'heartbeat' is given 2 times"),
    ("amqp://u:p@h/v?hearbeat=30", "'hearbeat' is not one pika knows"),
    ("amqp://u:p@h/v?ssl_options=notjson", "ssl_options: not a Python dict literal"),
    ("amqp://u:p@h/v?ssl_options=[1]", "ssl_options: expected a dict, got a list"),
    ("amqps://u:p@h/v?ssl_options=None", "contradicts amqps://"),
    ("amqps://u:p@h/v?ssl_options={'server_hostname':'rabbit'}", "give ca_certs"),
    ("amqp://u:p@h/v?tcp_options=(", "tcp_options: not a Python dict literal"),
    ("amqp://u:p@h/v?client_properties=1", "client_properties: expected a dict, got a int"),
]

#: Taken by pika but refused by the check: pika would silently do something else.
AMQP_STRICTER = [
    ("http://guest:guest@127.0.0.1:5672/%2F", "must start with amqp:// or amqps://"),
    ("amqp://u:p@h/shop/orders", "the vhost is one path segment"),  # pika: vhost 'shop'
    ("amqp://u:p@h//", "the vhost is one path segment"),  # pika: vhost ''
    (f"amqps://u:p@h/v?ssl_options={{'ca_certs':'{CA}','cert_reqs':0}}", "ignores 'cert_reqs'"),
    # ssl.PROTOCOL_TLS (2) and PROTOCOL_TLSv1_2 (5): contexts with CERT_NONE, no host name check
    (f"amqps://u:p@h/v?ssl_options={{'ca_certs':'{CA}','protocol':2}}", "protocol 2 makes"),
    (f"amqps://u:p@h/v?ssl_options={{'ca_certs':'{CA}','protocol':5}}", "verifies neither"),
]


@pytest.mark.parametrize("url", AMQP_ACCEPTED)
def test_amqp_urls_pika_takes_pass(url: str) -> None:
    pika.URLParameters(url)
    assert list(url_problems(url)) == []


@pytest.mark.parametrize(("url", "said"), AMQP_REFUSED)
def test_amqp_urls_pika_refuses_are_refused_with_a_reason(url: str, said: str) -> None:
    with pytest.raises((ValueError, TypeError, SyntaxError, AttributeError)):
        pika.URLParameters(url)
    problems = list(url_problems(url))
    assert len(problems) == 1 and said in problems[0], problems


@pytest.mark.parametrize(("url", "said"), AMQP_STRICTER)
@pytest.mark.filterwarnings("ignore:ssl.PROTOCOL_TLS:DeprecationWarning")  # pika takes it
def test_amqp_urls_pika_would_misread_are_refused(url: str, said: str) -> None:
    pika.URLParameters(url)
    (problem,) = url_problems(url)
    assert said in problem


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://guest:guest@127.0.0.1:5672/%2F", "url must start with amqp://"),
        ("amqp://guest:guest@127.0.0.1:5672/%2F?heartbeat=abc", "heartbeat='abc'"),
        ("amqp://guest@127.0.0.1:5672/%2F", "names user 'guest' without a password"),
    ],
    ids=["http", "heartbeat", "no-password"],
)
def test_check_refuses_the_url_where_it_is_written(url: str, said: str) -> None:
    """The three the README's first user met: before, only `http://` was caught by `bridge
    check`, and a user without a password failed later with pika's raw TypeError."""
    error = check_error(f'{{type: rabbitmq, url: "{url}"}}')
    assert error.startswith("routes.yaml:2:28: connections.c: "), error
    assert said in error


def test_a_url_password_is_never_quoted() -> None:
    url = "amqp://bridge:hunter2@h/v?ssl_options={'password':'hunter2','cert_reqs':0}"
    error = check_error(f'{{type: rabbitmq, url: "{url}"}}')
    assert "cert_reqs" in error and "hunter2" not in error


#: (bootstrap_servers, what the check says), each failing inside aiokafka's own parser.
SERVERS_REFUSED = [
    ("kafka:port", "the port must be a number"),
    ("kafka:9092,kafka2:", "'kafka2:': the port must be a number"),
    ("[::1]:x", "the port must be a number"),
    ("[::1:9092", "an IPv6 address is [address]:port"),
]
#: Taken by aiokafka as host names that never resolve: the route would wait for ever.
SERVERS_STRICTER = [
    ("PLAINTEXT://kafka:9092", "without a scheme"),
    ("kafka:9092,,kafka2:9092", "an empty entry"),
    ("kafka:9092,", "an empty entry"),
    ("kafka:0", "the port must be a number from 1 to 65535"),
    ("kaf ka:9092", "one with a space"),
]


@pytest.mark.parametrize("servers", ["127.0.0.1:9092", "a:1, b:2 ,c", "[::1]:9093,[::1]", "::1"])
def test_bootstrap_servers_aiokafka_takes_pass(servers: str) -> None:
    collect_hosts(servers)
    assert list(servers_problems(servers)) == []


@pytest.mark.parametrize(("servers", "said"), SERVERS_REFUSED)
def test_bootstrap_servers_aiokafka_refuses_are_refused(servers: str, said: str) -> None:
    with pytest.raises(ValueError):
        collect_hosts(servers)
    (problem,) = servers_problems(servers)
    assert said in problem


@pytest.mark.parametrize(("servers", "said"), SERVERS_STRICTER)
def test_bootstrap_servers_that_never_resolve_are_refused(servers: str, said: str) -> None:
    collect_hosts(servers)
    (problem,) = servers_problems(servers)
    assert said in problem


def test_check_refuses_bootstrap_servers_where_they_are_written() -> None:
    error = check_error('{type: kafka, bootstrap_servers: "PLAINTEXT://kafka:9092"}')
    assert error.startswith("routes.yaml:2:39: connections.c: kafka: bootstrap_servers entry")


#: (dsn, what the check says) for DSNs libpq refuses; the password is in each and never shown.
DSN_REFUSED = [
    ("host=db hots=x user=app password=pa55", 'invalid connection option "hots"'),
    ("host=db user=app password=pa55 word", 'missing "=" after "..."'),
    ("postgresql://app:pa%zz55@db/shop", 'invalid percent-encoded token: "..."'),
    ("postgresql://app:pa55@db/shop?colour=red", 'invalid URI query parameter: "colour"'),
    ("postgresql://app:pa55@[::1/shop", "matching"),
    ("host='db password=pa55", "unterminated quoted string"),
]
#: Parsed by libpq, refused only when it connects (psycopg then reports a failed connection,
#: which would be retried).
DSN_REFUSED_AT_CONNECT = [
    ("postgresql://app:pa55@db:port/shop", "the port must be a number"),
    ("host=db password=pa55 port=5432,x", "the port must be a number"),
    ("host=db password=pa55 connect_timeout=soon", "connect_timeout must be a whole number"),
    ("postgresql://app:pa55@db/shop?sslmode=on", "sslmode 'on' is not one of"),
]


#: A CA to verify the server with, and an sslmode that lets libpq go on without TLS or without
#: checking the host name: the downgrade the bridge never makes silently.
DSN_DOWNGRADABLE = [
    ("postgresql://app:pa55@db/shop?sslrootcert=/ca.pem", "but no sslmode (libpq's default"),
    ("postgresql://app:pa55@db/shop?sslrootcert=/ca.pem&sslmode=prefer", "but sslmode=prefer"),
    ("host=db password=pa55 sslrootcert=/ca.pem sslmode=allow", "but sslmode=allow connects"),
    ("host=db password=pa55 sslrootcert=/ca.pem sslmode=disable", "never uses TLS"),
    # A CA named, and a host name left unchecked: any certificate of that CA would do.
    (
        "host=db password=pa55 sslrootcert=/ca.pem sslmode=verify-ca",
        "sslmode=verify-ca checks the certificate's chain but not the server's host name: "
        "write sslmode=verify-full",
    ),
    (
        "postgresql://app:pa55@db/shop?sslrootcert=/ca.pem&sslmode=require",
        "sslmode=require checks the certificate's chain (libpq treats require with a root "
        "certificate as verify-ca) but not the server's host name",
    ),
]


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://postgres@127.0.0.1:5432/test",
        "postgresql://app@db/shop?sslmode=verify-full&sslrootcert=/ca.pem",
        "host=db sslmode=require",  # no CA named: encryption without verification, as asked
        "host=db port=5432,5433 user=app password='p a s s' sslmode=verify-full",
        "postgres://app:pa55@db/shop?connect_timeout=5&application_name=x",
        "",
    ],
)
def test_dsns_libpq_takes_pass(dsn: str) -> None:
    conninfo_to_dict(dsn)
    assert list(dsn_problems(dsn)) == []


@pytest.mark.parametrize(("dsn", "said"), DSN_REFUSED + DSN_REFUSED_AT_CONNECT + DSN_DOWNGRADABLE)
def test_dsns_libpq_refuses_are_refused_without_the_password(dsn: str, said: str) -> None:
    (problem,) = dsn_problems(dsn)
    assert said in problem
    assert "pa55" not in problem and "pa%zz55" not in problem


def test_pgsslmode_stands_for_a_missing_sslmode(monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = "host=db sslrootcert=/ca.pem"
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    assert list(dsn_problems(dsn)) == []
    monkeypatch.setenv("PGSSLMODE", "prefer")
    (problem,) = dsn_problems(dsn)
    assert "but PGSSLMODE=prefer connects without TLS" in problem


def test_check_refuses_a_dsn_where_it_is_written() -> None:
    error = check_error(
        '{type: postgresql, dsn: "${PG_DSN}"}', {"PG_DSN": "hots=x host=db password=s3cret"}
    )
    assert error == (
        'routes.yaml:2:30: connections.c: invalid dsn: invalid connection option "hots"'
    )


def test_a_placeholder_dsn_is_left_to_install_print_sql() -> None:
    """`install --print-sql` connects to nothing: a missing variable becomes `<unset-VAR>`."""
    text = 'connections:\n  c: {type: postgresql, dsn: "${PG_DSN}"}\nroutes: []\n'
    loaded = parse_config(text, env={}, offline=True)
    assert loaded.config.connections["c"].dsn == "<unset-PG_DSN>"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("url", "found"),
    [
        ("amqps://u:p@h/v", {}),
        (f"amqps://u:p@h/v?ssl_options={{'ca_certs':'{CA}'}}", {"cafile": CA}),
        (f"amqps://u:p@h/v?ssl_options={{'cafile':'x','ca_certs':'{CA}'}}", {"cafile": CA}),
        ("amqps://u:p@h/v?ssl_options={'capath':'/etc/ssl/certs'}", {"capath": "/etc/ssl/certs"}),
        ("amqp://u:p@h/v?ssl_options=None", {}),
    ],
)
def test_the_management_api_trusts_the_cas_of_the_urls_ssl_options(
    url: str, found: dict[str, str]
) -> None:
    """As pika reads them (`ca_certs` before `cafile`), for the API's https context."""
    assert ca_locations(url) == found


def check_warnings(connection: str) -> list[str]:
    text = f"connections:\n  c: {connection}\nroutes: []\n"
    return parse_config(text, env={}).warnings


@pytest.mark.parametrize(
    ("connection", "at"),
    [
        ('{type: rabbitmq, url: "amqp://h/%2F", heartbeat: 0}', "2:55"),
        ('{type: rabbitmq, url: "amqp://h/%2F?heartbeat=0"}', "2:28"),
    ],
)
def test_a_heartbeat_of_0_is_warned_about(connection: str, at: str) -> None:
    """Without a heartbeat an idle RabbitMQ source never notices a silent network."""
    (warning,) = check_warnings(connection)
    assert warning.startswith(f"routes.yaml:{at}: warning: connection 'c': heartbeat 0 turns")
    assert "an idle source never notices a network that falls silent" in warning


def test_a_connect_timeout_of_0_is_warned_about() -> None:
    """libpq reads connect_timeout=0 as no limit: opening a connection would wait for ever."""
    dsn = "postgresql://app@db/shop?connect_timeout=0"
    (warning,) = check_warnings(f'{{type: postgresql, dsn: "{dsn}"}}')
    assert warning.startswith("routes.yaml:2:30: warning: connection 'c': dsn: connect_timeout=0")
    assert "wait for ever on a silent network" in warning


@pytest.mark.parametrize(
    "connection",
    [
        '{type: rabbitmq, url: "amqp://h/%2F", heartbeat: 5}',
        '{type: rabbitmq, url: "amqp://h/%2F?heartbeat=10"}',
        '{type: postgresql, dsn: "postgresql://app@db/shop?connect_timeout=5"}',
        '{type: postgresql, dsn: "postgresql://app@db/shop"}',
    ],
)
def test_timeouts_that_notice_a_silent_network_are_not_warned_about(connection: str) -> None:
    assert check_warnings(connection) == []
