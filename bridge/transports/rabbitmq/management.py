"""The RabbitMQ management HTTP API, for what AMQP cannot tell: a queue's policy and limits.

Where: `management_url` when the connection sets one, else derived from the AMQP URL as
NServiceBus RabbitMQ derives it: `http://<host>:15672/`, or `https://<host>:15671/` for
`amqps://`. Credentials: the user and password in `management_url`, else the AMQP URL's. The
vhost is the AMQP URL's. Requests are plain HTTP with basic authentication, run on a worker
thread (`asyncio.to_thread`) so the event loop never waits on a socket. Over `https` the API's
certificate chain and host name are verified against the broker's CAs: those the AMQP URL's
`ssl_options` name (`ca_certs`, ...), else the system's.

Errors: every failure is a `ManagementError` carrying the HTTP status (None when nothing
answered), whether TLS refused the API's certificate (`tls_refused`), and a text that names
the API's address without its credentials. The caller
(`delivery_limit.py`) turns it into the transport error that says what to do.

Printed: `curl` writes one request to the API as a `curl` command a shell runs as printed
(`bridge install --print-sql`), with the credentials left to `$RABBITMQ_USER` and
`$RABBITMQ_PASSWORD`, never written out.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shlex
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from bridge.errors import ConfigError
from bridge.transports.rabbitmq.config import RabbitMQConnection
from bridge.transports.rabbitmq.url import ca_locations

__all__ = ["HTTPS_PORT", "HTTP_PORT", "ManagementApi", "ManagementError", "curl", "endpoint"]

#: The management plugin's default listeners (ManagementClient.cs:17-18 in NServiceBus RabbitMQ).
HTTP_PORT = 15672
HTTPS_PORT = 15671


class ManagementError(Exception):
    """A management API request failed; `status` is the HTTP status, None if none came."""

    def __init__(self, message: str, status: int | None, *, tls_refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.tls_refused = tls_refused


@dataclass(frozen=True)
class Endpoint:
    base: str  # ends with "/", no credentials
    username: str
    password: str
    vhost: str


def endpoint(config: RabbitMQConnection) -> Endpoint:
    """Where the management API of `config`'s broker is, and how to log in to it."""
    amqp = urlsplit(config.url)
    username = unquote(amqp.username or "guest")
    password = unquote(amqp.password or "guest")
    path = amqp.path[1:] if amqp.path.startswith("/") else amqp.path
    vhost = unquote(path) if path else "/"
    if config.management_url:
        given = urlsplit(config.management_url)
        if given.scheme not in ("http", "https"):
            raise ConfigError("management_url must start with http:// or https://")
        netloc = given.hostname or ""
        if ":" in netloc:  # an IPv6 literal
            netloc = f"[{netloc}]"
        if given.port is not None:
            netloc = f"{netloc}:{given.port}"
        base_path = given.path if given.path.endswith("/") else f"{given.path}/"
        base = urlunsplit((given.scheme, netloc, base_path, "", ""))
        if given.username is not None:
            username = unquote(given.username)
            password = unquote(given.password or "")
        return Endpoint(base, username, password, vhost)
    tls = amqp.scheme == "amqps"
    host = amqp.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    scheme, port = ("https", HTTPS_PORT) if tls else ("http", HTTP_PORT)
    return Endpoint(f"{scheme}://{host}:{port}/", username, password, vhost)


def curl(endpoint: Endpoint, method: str, path: str, body: object) -> str:
    """The `curl` command that sends `body` (JSON) with `method` to `path` under the API of
    `endpoint`, as a shell runs it; `{vhost}` in `path` is the endpoint's vhost, escaped.
    `--fail-with-body` (curl 7.76 or later) stops a script at a refusal and shows its reason."""
    url = endpoint.base + path.replace("{vhost}", quote(endpoint.vhost, safe=""))
    data = json.dumps(body, separators=(",", ":"))
    return (
        f'curl --fail-with-body -sS -u "$RABBITMQ_USER:$RABBITMQ_PASSWORD" -X {method} '
        f"-H 'content-type: application/json' -d {shlex.quote(data)} {shlex.quote(url)}"
    )


class ManagementApi:
    """The few management API calls the bridge makes, for one connection's vhost."""

    def __init__(self, config: RabbitMQConnection) -> None:
        self.endpoint = endpoint(config)
        self._timeout = config.connect_timeout
        token = f"{self.endpoint.username}:{self.endpoint.password}".encode()
        self._authorization = "Basic " + base64.b64encode(token).decode("ascii")
        self._vhost = quote(self.endpoint.vhost, safe="")
        self._context: ssl.SSLContext | None = None
        if self.endpoint.base.startswith("https:"):
            try:
                cas = ca_locations(config.url)
                self._context = ssl.create_default_context(
                    cafile=cas.get("cafile"), capath=cas.get("capath"), cadata=cas.get("cadata")
                )
            except OSError as exc:  # ssl.SSLError included
                raise ConfigError(
                    f"url ssl_options: cannot load the CA certificates: {exc}"
                ) from None

    @property
    def address(self) -> str:
        """The API's base URL, safe to print (it never holds credentials)."""
        return self.endpoint.base

    async def overview(self) -> dict[str, Any]:
        return await self._object("api/overview")

    async def queue(self, name: str) -> dict[str, Any]:
        """The queue's details: `type`, `arguments`, `policy`, `effective_policy_definition`,
        and on RabbitMQ 4 `delivery_limit` (the last three once the management database has
        caught up with a new queue)."""
        return await self._object(f"api/queues/{self._vhost}/{quote(name, safe='')}")

    async def bindings_from(self, exchange: str) -> list[Any]:
        """The bindings whose source is `exchange` (`destination`, `destination_type`,
        `routing_key`, ...)."""
        name = quote(exchange, safe="")
        return await self._list(f"api/exchanges/{self._vhost}/{name}/bindings/source")

    async def policies(self) -> list[Any]:
        """The vhost's user policies."""
        return await self._list(f"api/policies/{self._vhost}")

    async def operator_policies(self) -> list[Any]:
        return await self._list(f"api/operator-policies/{self._vhost}")

    async def put_policy(self, name: str, policy: dict[str, Any]) -> None:
        """Create or replace the user policy `name` in the vhost."""
        path = f"api/policies/{self._vhost}/{quote(name, safe='')}"
        await asyncio.to_thread(self._request, "PUT", path, policy)

    async def _object(self, path: str) -> dict[str, Any]:
        answer = await asyncio.to_thread(self._request, "GET", path, None)
        if not isinstance(answer, dict):
            raise ManagementError(f"GET {self.endpoint.base}{path}: not a JSON object", None)
        return answer

    async def _list(self, path: str) -> list[Any]:
        answer = await asyncio.to_thread(self._request, "GET", path, None)
        if not isinstance(answer, list):
            raise ManagementError(f"GET {self.endpoint.base}{path}: not a JSON array", None)
        return answer

    def _request(self, method: str, path: str, body: object) -> Any:
        url = self.endpoint.base + path
        data = None if body is None else json.dumps(body).encode()
        # The scheme is http or https: `endpoint` makes it so, and lint checks management_url.
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        request.add_header("Authorization", self._authorization)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        where = f"{method} {self.endpoint.base}{path}"
        try:
            with urllib.request.urlopen(  # noqa: S310 (http or https, as above)
                request, timeout=self._timeout, context=self._context
            ) as got:
                text = got.read()
        except urllib.error.HTTPError as exc:
            reason = _reason(exc)
            raise ManagementError(f"{where}: HTTP {exc.code} {reason}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            cause = getattr(exc, "reason", exc)
            if isinstance(cause, ssl.SSLCertVerificationError):
                raise ManagementError(
                    f"{where}: no verified TLS connection: certificate verify failed: "
                    f"{cause.verify_message}",
                    None,
                    tls_refused=True,
                ) from None
            raise ManagementError(f"{where}: no answer: {cause}", None) from None
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            raise ManagementError(f"{where}: the answer is not JSON", None) from None


def _reason(error: urllib.error.HTTPError) -> str:
    """The management API's reason for an error status (its JSON `reason`), when it gives one."""
    try:
        detail = json.loads(error.read() or b"{}")
    except (ValueError, OSError):
        detail = {}
    reason = detail.get("reason") if isinstance(detail, dict) else None
    return " ".join(str(reason).split()) if reason else str(error.reason)
