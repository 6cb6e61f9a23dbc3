"""The Kafka connection of routes.yaml and its rules.

Driver-free: `bridge check` and the config loader import it without aiokafka. The syntax of
`bootstrap_servers` (`servers_problems`) and the security settings are checked here, with one
message per mistake, before anything connects: SASL needs a mechanism, a user name and a
password; credentials or certificate files given for a protocol that would not use them are
errors rather than silently ignored; a certificate goes with its key; a request may wait longer
than a join of the group can be held at the broker (`request_timeout_ms` above
`session_timeout_ms`, aiokafka's rebalance timeout). Topic names follow
Kafka's own rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

from pydantic import Field

from bridge.config.base import Problem, Strict
from bridge.errors import ConfigError

__all__ = [
    "ADDRESS_KEY",
    "KINDS",
    "MAX_DELAY_SECONDS",
    "SOURCE_GROUP",
    "KafkaConnection",
    "address_key",
    "address_problem",
    "canonical_address",
    "lint",
    "servers_problems",
    "validate",
]

KINDS = ("kafka",)
#: What a route end on this connection names, and whether a source reads in a consumer group.
ADDRESS_KEY = "topic"
#: Kafka has no delayed delivery: a delayed message cannot be sent to a topic.
MAX_DELAY_SECONDS: int | None = None
SOURCE_GROUP = True


class KafkaConnection(Strict):
    type: Literal["kafka"]
    bootstrap_servers: str = Field(min_length=1, description="Comma-separated host:port list.")
    idempotence: bool = Field(True, description="Idempotent producer (off for the local broker).")
    client_id: str = Field("bridge", min_length=1, description="Client id reported to the brokers.")
    compression_type: Literal["gzip", "snappy", "lz4", "zstd"] | None = Field(
        None, description="Producer compression."
    )
    max_batch_size: int = Field(
        1_048_576,
        gt=0,
        description="Largest record batch in bytes; a send is split into batches of at most this.",
    )
    max_request_size: int = Field(1_048_576, gt=0, description="Largest record accepted.")
    session_timeout_ms: int = Field(
        10_000,
        ge=1_000,
        description="Consumer group session timeout: how soon a dead bridge's partitions move.",
    )
    request_timeout_ms: int = Field(
        40_000,
        ge=1_000,
        description="How long any request to a broker (produce, fetch, offsets, commit, "
        "metadata, joining the group) waits for its answer before the connection is dropped and "
        "the call fails: what bounds a silent network (aiokafka's default, 40 s).",
    )
    partitions: int = Field(
        6,
        gt=0,
        description="Partitions of topics `bridge install` creates (6: an even share for 1, 2, "
        "3 or 6 consumers, i.e. workers x replicas).",
    )
    replication_factor: int = Field(1, gt=0, description="Replication of created topics.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None


_SASL = ("sasl_mechanism", "sasl_username", "sasl_password")
_SSL_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


def lint(config: KafkaConnection) -> Iterator[Problem]:
    """The bootstrap servers' syntax, and security settings that contradict each other, each
    with the key it is about."""
    for problem in servers_problems(config.bootstrap_servers):
        yield "bootstrap_servers", f"kafka: {problem}"
    protocol = config.security_protocol
    if protocol.startswith("SASL_"):
        for key in _SASL:
            if getattr(config, key) is None:
                yield "security_protocol", f"kafka: security_protocol {protocol} needs {key}"
    else:
        for key in _SASL:
            if getattr(config, key) is not None:
                yield key, f"kafka: {key} is set but security_protocol {protocol} does not use SASL"
    if not protocol.endswith("SSL"):
        for key in _SSL_FILES:
            if getattr(config, key) is not None:
                yield key, f"kafka: {key} is set but security_protocol {protocol} does not use SSL"
    if config.request_timeout_ms <= config.session_timeout_ms:
        yield (
            "request_timeout_ms",
            (
                f"kafka: request_timeout_ms ({config.request_timeout_ms}) must be more than "
                f"session_timeout_ms ({config.session_timeout_ms}): the broker may hold a "
                "consumer's request to join its group that long"
            ),
        )
    if (config.ssl_certfile is None) != (config.ssl_keyfile is None):
        key = "ssl_certfile" if config.ssl_certfile is not None else "ssl_keyfile"
        yield key, "kafka: ssl_certfile and ssl_keyfile go together"


_BRACKETED = re.compile(r"\[(?P<host>[^\]]+)\](?::(?P<port>[^:]*))?")


def servers_problems(servers: str) -> Iterator[str]:
    """What aiokafka would fail on in `bootstrap_servers`, or connect to in vain for ever.

    aiokafka (`aiokafka/conn.py`, `collect_hosts` and `get_ip_port_afi`) splits the stripped
    text at commas and reads each entry as `host`, `host:port`, `[ipv6]` or `[ipv6]:port` (port
    9092 when left out); a port that is not a number fails inside aiokafka with a bare
    ValueError, and an entry such as `PLAINTEXT://kafka:9092` or an empty one (a stray comma)
    is taken as a host name that never resolves.
    """
    for entry in servers.strip().split(","):
        entry = entry.strip()
        if not entry:
            yield "bootstrap_servers has an empty entry (a stray comma?); write host:port,..."
            continue
        if "://" in entry:
            yield (
                f"bootstrap_servers entry {entry!r}: write host:port, without a scheme "
                "(the protocol is security_protocol)"
            )
            continue
        if entry.startswith("["):
            bracketed = _BRACKETED.fullmatch(entry)
            if bracketed is None:
                yield f"bootstrap_servers entry {entry!r}: an IPv6 address is [address]:port"
                continue
            host, port = bracketed.group("host"), bracketed.group("port")
        elif entry.count(":") == 1:
            host, port = entry.split(":")
        else:  # a host name, or an IPv6 address without a port, as aiokafka reads it
            host, port = entry, None
        if not host or any(ch.isspace() for ch in host):
            yield f"bootstrap_servers entry {entry!r}: no host name, or one with a space"
        elif port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            yield f"bootstrap_servers entry {entry!r}: the port must be a number from 1 to 65535"


def validate(config: KafkaConnection) -> None:
    """Raise ConfigError for the first rule `lint` finds (a connection built without a file)."""
    for _, message in lint(config):
        raise ConfigError(message)


#: Kafka's own rule for topic names (the broker refuses others, and `.`/`..` are reserved).
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def address_problem(kind: str, name: str) -> str | None:
    """Why Kafka would refuse a topic called `name`, or None."""
    if not _TOPIC.fullmatch(name) or name in (".", ".."):
        return (
            f"Kafka topic name {name!r} is not valid: 1-249 characters of "
            "A-Z a-z 0-9 . _ - (and not '.' or '..')"
        )
    return None


def canonical_address(connection: object, name: str) -> str:
    """The address of the topic `name` as it appears in NServiceBus headers: the name itself."""
    return name


def address_key(connection: object, address: str) -> tuple[str, str | None, str | None]:
    """What identifies the topic an address in a header names: the name itself."""
    return address, None, None
