"""The RabbitMQ connection of routes.yaml, its rules, timeouts, queue arguments and routes.

Driver-free: `bridge check` and the config loader import it without pika.
Connection (`connection.py`): the URL is parsed by pika (`amqp://` or `amqps://`, its query
options such as `heartbeat` or `ssl_options` included); `url.py` holds pika's rules, so `bridge
check` refuses what pika would. Where the URL does not say otherwise the
bridge asks for one connection attempt per call (the runner's backoff does the retrying), asks
for an AMQP heartbeat of `heartbeat` seconds (rather than whatever the broker proposes, which
may be none), closes a connection the broker has blocked (memory or disk alarm) for
`blocked_timeout` seconds instead of waiting forever, and names the connection `bridge
<connection> <role>` in the management UI. The URL's `heartbeat` and
`blocked_connection_timeout` options are the same two settings: giving one both ways is an
error. The password only ever goes to pika; messages and logs name the connection, never the URL.

Timeouts (`Link` in `connection.py`): opening a connection and its channel waits at most
`connect_timeout`, a declare, qos, consume or ack round trip `operation_timeout`, the confirms
of one send `confirm_timeout`; a call past its deadline closes the connection (its state is
then unknown) and fails retriable. A silent network is noticed by the heartbeat: pika closes a
connection that received nothing for a whole check interval of `heartbeat` + 5 seconds
(`pika/heartbeat.py`), i.e. `heartbeat` + 5 to 2 x (`heartbeat` + 5) seconds after it fell
silent, whatever the call in progress.

TLS: `amqps://` verifies the broker's certificate chain and the URL's host name, against the
system's CAs or, for a private CA, the PEM file named by the URL's `ssl_options`:
`amqps://user:${PASSWORD}@rabbit.example.com:5671/%2F?ssl_options={'ca_certs':'/etc/ca.pem'}`.
The CA lives in the URL (pika's own option, checked by `url.py`) rather than in a field of its
own, so there is one place for it. A certificate that does not verify is `TlsRefused`
(`errors.py`), never a connection without verification.

Management API: `management_url`, or by default the URL's host on port 15672 (15671 for
`amqps`) with the URL's credentials, as NServiceBus RabbitMQ derives it; with `amqps` a
`management_url` must be `https://` too (its login would otherwise go in clear). Through it
the bridge keeps the delivery limit of quorum queues it receives from unlimited, or refuses
them (`delivery_limit.py`), unless `validate_delivery_limits` is false.

Topology (wire-format §7): `conventional` publishes to a durable fanout exchange named like the
queue, routing key `""`; `direct` publishes to the default exchange with the queue's name as
routing key. Queues are durable and declared with `x-queue-type` = `queue_type`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field

from bridge.config.base import Problem, Strict
from bridge.transports.rabbitmq.delays import MAX_DELAY_SECONDS
from bridge.transports.rabbitmq.url import url_problems

__all__ = [
    "ADDRESS_KEY",
    "BLOCKED_TIMEOUT",
    "CONFIRM_TIMEOUT",
    "CONNECT_TIMEOUT",
    "DELIVERY_PAUSE",
    "GATHER_LIMIT",
    "HEARTBEAT",
    "KINDS",
    "MAX_DELAY_SECONDS",
    "OPERATION_TIMEOUT",
    "SOURCE_GROUP",
    "URL_SETTINGS",
    "RabbitMQConnection",
    "address_key",
    "address_problem",
    "canonical_address",
    "describe",
    "lint",
    "publish_route",
    "queue_arguments",
]

KINDS = ("rabbitmq",)
#: What a route end on this connection names, and whether a source reads in a consumer group.
ADDRESS_KEY = "queue"
SOURCE_GROUP = False
RABBITMQ_MAX_NAME_BYTES = 255  # AMQP shortstr


#: The defaults of the connection's timeouts (seconds; see the module docstring).
HEARTBEAT = 60  # NServiceBus RabbitMQ's HeartbeatInterval (RabbitMQTransport.cs)
CONNECT_TIMEOUT = 15.0
OPERATION_TIMEOUT = 30.0
CONFIRM_TIMEOUT = 120.0
BLOCKED_TIMEOUT = 60.0
#: The url options that are also connection settings: giving both is an error.
URL_SETTINGS = {"heartbeat": "heartbeat", "blocked_connection_timeout": "blocked_timeout"}


class RabbitMQConnection(Strict):
    type: Literal["rabbitmq"]
    url: str = Field(
        min_length=1, description="AMQP URL (amqp:// or amqps://); keep secrets in ${VAR}."
    )
    topology: Literal["conventional", "direct"] = Field(
        "conventional", description="Exchange per queue (conventional) or default exchange."
    )
    queue_type: Literal["quorum", "classic"] = Field("quorum", description="Declared type.")
    prefetch: int = Field(500, gt=0, description="Consumer prefetch count.")
    management_url: str | None = Field(
        None,
        min_length=1,
        description="Management API URL (http:// or https://), for quorum queues' delivery "
        "limits; default: the url's host on port 15672 (15671 for amqps), the url's credentials. "
        "Keep secrets in ${VAR}.",
    )
    validate_delivery_limits: bool = Field(
        True,
        description="Refuse quorum source queues whose delivery limit could drop messages, "
        "and lift RabbitMQ 4's default limit with a policy, as NServiceBus does.",
    )
    heartbeat: int = Field(
        HEARTBEAT,
        ge=0,
        description="AMQP heartbeat timeout in seconds asked of the broker (0: off): a silent "
        "connection is closed heartbeat + 5 to 2 x (heartbeat + 5) s after it fell silent. "
        "Default 60, NServiceBus RabbitMQ's HeartbeatInterval. The url's heartbeat option is "
        "the same setting.",
    )
    connect_timeout: float = Field(
        CONNECT_TIMEOUT, gt=0, description="Seconds to open a connection and its channel."
    )
    operation_timeout: float = Field(
        OPERATION_TIMEOUT,
        gt=0,
        description="Seconds for one declare, qos, consume or ack round trip.",
    )
    confirm_timeout: float = Field(
        CONFIRM_TIMEOUT,
        gt=0,
        description="Seconds for the broker to confirm every message of one send.",
    )
    blocked_timeout: float = Field(
        BLOCKED_TIMEOUT,
        gt=0,
        description="Seconds a connection may stay blocked by a broker alarm (memory, disk) "
        "before it is closed and retried. The url's blocked_connection_timeout option is the "
        "same setting.",
    )


def lint(config: RabbitMQConnection) -> Iterator[Problem]:
    """The URL as pika reads it (`url.py`), a setting given both in it and as a key, and the
    management URL, found before anything connects."""
    for problem in url_problems(config.url):
        yield "url", problem
    try:
        given = parse_qs(urlsplit(config.url).query)
    except ValueError:  # url_problems said so
        given = {}
    for option, setting in URL_SETTINGS.items():
        if option in given and setting in config.model_fields_set:
            yield setting, f"{setting} is also given in the url ({option}); give it once"
    if config.management_url is not None:
        amqps = config.url.lower().startswith("amqps:")
        yield from _lint_management_url(config.management_url, amqps)


def warnings(config: RabbitMQConnection) -> Iterator[Problem]:
    """Settings that work but leave a silent network unnoticed: `heartbeat` 0 (in the url or
    as the key) turns the AMQP heartbeat off, and only it notices a connection that falls
    silent while a source waits for deliveries (or a sink for a broker that blocked it)."""
    try:
        given = parse_qs(urlsplit(config.url).query).get("heartbeat")
    except ValueError:  # lint said so
        return
    key, value = ("url", given[-1].strip()) if given else ("heartbeat", str(config.heartbeat))
    if value == "0":
        yield (
            key,
            "heartbeat 0 turns the AMQP heartbeat off: an idle source never notices a network "
            "that falls silent (it waits for deliveries for ever); give it a number of seconds",
        )


def _lint_management_url(url: str, amqps: bool) -> Iterator[Problem]:
    """The management API is HTTP (as NServiceBus RabbitMQ requires, ManagementClient.cs:43-46),
    over TLS when AMQP is: the API's basic authentication would otherwise carry in clear the
    credentials the amqps URL keeps encrypted (its own, or the URL's)."""
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        yield "management_url", f"invalid management_url: {exc}"
        return
    if split.scheme not in ("http", "https") or not split.hostname:
        yield "management_url", "management_url must start with http:// or https:// and name a host"
    elif amqps and split.scheme == "http":
        yield (
            "management_url",
            "management_url is http:// while the url is amqps://: the management API's login "
            "would cross the network unencrypted; use https://",
        )


def address_problem(kind: str, name: str) -> str | None:
    """Why RabbitMQ would refuse a queue called `name`, or None."""
    size = len(name.encode("utf-8"))
    if size > RABBITMQ_MAX_NAME_BYTES:
        return (
            f"RabbitMQ queue name {name[:40]!r}... is {size} bytes long; "
            f"AMQP allows at most {RABBITMQ_MAX_NAME_BYTES}"
        )
    if name.startswith("amq."):
        return f"RabbitMQ queue name {name!r}: names starting 'amq.' are the broker's"
    return None


#: A receive stops gathering once no delivery has arrived for this many seconds.
DELIVERY_PAUSE = 0.025
#: A receive hands over what it has at most this many seconds after its first delivery arrived
#: (from the broker, not when the receive began), so a steady trickle (1,000 msg/s fills a
#: batch of 100 in 100 ms) does not wait for a full batch.
GATHER_LIMIT = 0.02


def describe(name: str) -> str:
    return f"rabbitmq connection {name!r}"


def queue_arguments(config: RabbitMQConnection) -> dict[str, object]:
    return {"x-queue-type": config.queue_type}


def publish_route(config: RabbitMQConnection, queue: str) -> tuple[str, str]:
    """(exchange, routing key) a message for `queue` is published with."""
    if config.topology == "conventional":
        return queue, ""
    return "", queue


def canonical_address(connection: object, name: str) -> str:
    """The address of the queue `name` as it appears in NServiceBus headers: the name itself."""
    return name


def address_key(connection: object, address: str) -> tuple[str, str | None, str | None]:
    """What identifies the queue an address in a header names: the name itself."""
    return address, None, None
