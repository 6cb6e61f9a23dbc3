"""The AMQP URL's rules, as pika's `URLParameters` reads it, checked without pika.

`bridge check` finds here, at the URL's `FILE:LINE:COL`, what pika would refuse when a command
first connects (or worse, accept and ignore), with a message that says what to write. What
pika 1.3 (`pika/connection.py`, `URLParameters` and the `Parameters` setters) does with a URL:

- the scheme is `amqp` or `amqps` (pika also takes `http` and `https` as their synonyms, which
  the bridge refuses); the host defaults to localhost, the port to 5672 (5671);
- `user:password@`: a user without a password fails inside pika with a TypeError;
- the vhost is the first path segment only (`/a/b` is vhost `a`): the bridge refuses more;
- each query option is one of `blocked_connection_timeout`, `channel_max`, `client_properties`,
  `connection_attempts`, `frame_max`, `heartbeat`, `locale`, `retry_delay`, `socket_timeout`,
  `stack_timeout`, `ssl_options`, `tcp_options`, given once (an empty value is ignored, as
  `urllib.parse.parse_qs` drops it); numbers are parsed with `int()` or `float()` and range
  checked (`NUMBERS`); `ssl_options`, `tcp_options` and `client_properties` are Python literals
  (`ast.literal_eval`): a dict, or None (`ssl_options=None` only with `amqp://`). Of
  `ssl_options` pika reads only the keys in `SSL_KEYS` and ignores the rest silently, so the
  bridge refuses the rest, and it needs the CA certificates in it (`ca_certs` or another key
  of `_CA_KEYS`). Its `protocol` is the `ssl.SSLContext` protocol pika builds the context
  with: any but `PROTOCOL_TLS_CLIENT` (16, pika's default) makes a context that verifies
  neither the broker's certificate nor its host name, so the bridge refuses it.

Messages quote numbers and option names, never a literal's text: `ssl_options` may hold a
certificate's password.
"""

from __future__ import annotations

import ast
import ssl
from collections.abc import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

__all__ = ["NUMBERS", "SSL_KEYS", "ca_locations", "url_problems"]

_FRAME_MIN, _FRAME_MAX = 4096, 131072  # pika.spec.FRAME_MIN_SIZE, FRAME_MAX_SIZE
_CHANNELS_MAX = 65535  # pika.channel.MAX_CHANNELS

#: Numeric query options: how pika parses each, and the range its setter accepts.
NUMBERS: dict[str, tuple[Callable[[str], float], Callable[[float], bool], str]] = {
    "heartbeat": (int, lambda v: v >= 0, "a whole number of seconds, 0 or more (0: off)"),
    "channel_max": (int, lambda v: 1 <= v <= _CHANNELS_MAX, f"from 1 to {_CHANNELS_MAX}"),
    "connection_attempts": (int, lambda v: v >= 1, "a whole number, 1 or more"),
    "frame_max": (int, lambda v: _FRAME_MIN <= v <= _FRAME_MAX, f"{_FRAME_MIN} to {_FRAME_MAX}"),
    "blocked_connection_timeout": (float, lambda v: v >= 0, "seconds, 0 or more"),
    "retry_delay": (float, lambda v: True, "seconds"),
    "socket_timeout": (float, lambda v: v > 0, "seconds, more than 0"),
    "stack_timeout": (float, lambda v: v > 0, "seconds, more than 0"),
}
_LITERALS = ("ssl_options", "tcp_options", "client_properties")
_OPTIONS = (*NUMBERS, *_LITERALS, "locale")
#: The `ssl_options` keys that name the CA certificates; pika refuses an `ssl_options` without
#: one (`SSLContext.load_verify_locations` with nothing to load raises TypeError).
_CA_KEYS = ("ca_certs", "cafile", "ca_path", "capath", "ca_data", "cadata")
#: The one `ssl_options` protocol whose context verifies the broker (and pika's default).
_VERIFYING_PROTOCOL = int(ssl.PROTOCOL_TLS_CLIENT)
#: The `ssl_options` keys pika uses (`URLParameters._set_url_ssl_options`).
SSL_KEYS = (
    "protocol",
    "ca_certs",
    "cafile",
    "ca_path",
    "capath",
    "ca_data",
    "cadata",
    "certfile",
    "keyfile",
    "password",
    "ciphers",
    "server_hostname",
)


def url_problems(url: str) -> Iterator[str]:
    """What is wrong with the AMQP URL `url`, one message each (nothing: pika takes it)."""
    try:
        split = urlsplit(url)
        split.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        yield f"invalid url: {exc}"
        return
    if split.scheme not in ("amqp", "amqps"):
        yield "url must start with amqp:// or amqps://"
        return
    if split.username is not None and split.password is None:
        yield (
            f"url names user {split.username!r} without a password: write "
            f"{split.scheme}://{split.username}:${{PASSWORD}}@{split.hostname or 'host'}/..."
        )
    if split.path.count("/") > 1:
        yield (
            f"url path {split.path!r}: the vhost is one path segment, with '/' in it written "
            "%2F (the default vhost '/' is /%2F)"
        )
    yield from _query_problems(split.query, tls=split.scheme == "amqps")


def _query_problems(query: str, *, tls: bool) -> Iterator[str]:
    for name, values in parse_qs(query).items():
        if name not in _OPTIONS:
            yield f"url option {name!r} is not one pika knows (it takes: {', '.join(_OPTIONS)})"
            continue
        if len(values) > 1:
            yield f"url option {name!r} is given {len(values)} times; give it once"
            continue
        (value,) = values
        if name in NUMBERS:
            yield from _number_problems(name, value)
        elif name in _LITERALS:
            yield from _literal_problems(name, value, tls=tls)


def _number_problems(name: str, value: str) -> Iterator[str]:
    parse, within, expected = NUMBERS[name]
    try:
        number = parse(value)
    except ValueError:
        yield f"url option {name}={value!r}: expected {expected}"
        return
    if not within(number):
        yield f"url option {name}={value!r}: expected {expected}"


def _literal_problems(name: str, value: str, *, tls: bool) -> Iterator[str]:
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        yield f"url option {name}: not a Python dict literal such as {{'key': 'value'}}"
        return
    if parsed is None:
        if name == "ssl_options" and tls:
            yield "url option ssl_options=None contradicts amqps:// (which means TLS)"
        return
    if not isinstance(parsed, dict):
        yield f"url option {name}: expected a dict, got a {type(parsed).__name__}"
        return
    if name == "ssl_options":
        unknown = sorted(str(key) for key in parsed if key not in SSL_KEYS)
        if unknown:
            yield (
                f"url option ssl_options: pika ignores {', '.join(map(repr, unknown))}; it reads "
                f"only {', '.join(SSL_KEYS)}"
            )
        protocol = parsed.get("protocol")
        if protocol is not None and protocol != _VERIFYING_PROTOCOL:
            yield (
                f"url option ssl_options: protocol {protocol!r} makes a TLS context that verifies "
                f"neither the broker's certificate nor its host name (only "
                f"ssl.PROTOCOL_TLS_CLIENT, {_VERIFYING_PROTOCOL}, does): leave protocol out"
            )
        if not any(parsed.get(key) for key in _CA_KEYS):
            yield (
                "url option ssl_options: pika builds its own TLS context from it and needs the "
                "CA certificates to verify the broker: give ca_certs (or cafile, capath, cadata)"
            )


def ca_locations(url: str) -> dict[str, str]:
    """The CA certificates the URL's `ssl_options` name, as `ssl.create_default_context` takes
    them (`cafile`, `capath`, `cadata`), with pika's precedence (`ca_certs` before `cafile`,
    ...); empty without any (the system's CAs). For a URL `url_problems` accepts."""
    values = parse_qs(urlsplit(url).query).get("ssl_options")
    options = ast.literal_eval(values[0]) if values else None
    if not isinstance(options, dict):
        return {}
    found = {
        "cafile": options.get("ca_certs") or options.get("cafile"),
        "capath": options.get("ca_path") or options.get("capath"),
        "cadata": options.get("ca_data") or options.get("cadata"),
    }
    return {key: str(value) for key, value in found.items() if value}
