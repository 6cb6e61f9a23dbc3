"""A Kafka listener that refuses every SASL login, as Apache Kafka answers a wrong password.

The local broker (tansu) cannot: it closes the connection of a PLAIN login and answers a failed
SCRAM exchange in a way aiokafka does not parse. Apache Kafka answers the SaslAuthenticate
request with error 58, SASL_AUTHENTICATION_FAILED, and a message; this listener does only that
(ApiVersions, SaslHandshake offering PLAIN, then the refusal), encoded with aiokafka's own
protocol classes, on a thread of its own so a `bridge` subprocess can use it.
"""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType
from typing import Any

from aiokafka.protocol.admin import (
    ApiVersionResponse_v0,
    ApiVersionResponse_v1,
    ApiVersionResponse_v2,
    SaslAuthenticateResponse_v0,
    SaslAuthenticateResponse_v1,
    SaslHandShakeResponse_v0,
    SaslHandShakeResponse_v1,
)

__all__ = ["REFUSAL", "RefusingKafka"]

#: What the listener says, as Apache Kafka's SaslServerAuthenticator says it.
REFUSAL = "Authentication failed: Invalid username or password"
_SASL_AUTHENTICATION_FAILED = 58
#: The requests answered and their versions: ApiVersions 0-2, SaslHandshake 0-1,
#: SaslAuthenticate 0-1 (all with the non-flexible headers aiokafka writes for them).
_APIS = [(18, 0, 2), (17, 0, 1), (36, 0, 1)]


def _answer(api_key: int, version: int) -> Any:
    if api_key == 18:
        versions = {0: ApiVersionResponse_v0, 1: ApiVersionResponse_v1, 2: ApiVersionResponse_v2}
        extra = () if version == 0 else (0,)
        return versions[version](0, _APIS, *extra)
    if api_key == 17:
        handshake = SaslHandShakeResponse_v0 if version == 0 else SaslHandShakeResponse_v1
        return handshake(0, ["PLAIN"])
    if version == 0:
        return SaslAuthenticateResponse_v0(_SASL_AUTHENTICATION_FAILED, REFUSAL, b"")
    return SaslAuthenticateResponse_v1(_SASL_AUTHENTICATION_FAILED, REFUSAL, b"", 0)


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client left")
        data += chunk
    return data


class RefusingKafka:
    """Listen on a free loopback port; `bootstrap_servers` says where."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.bootstrap_servers = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.logins = 0  # SaslAuthenticate requests refused
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    (size,) = struct.unpack(">i", _read(conn, 4))
                    request = _read(conn, size)
                    api_key, version, correlation = struct.unpack(">hhi", request[:8])
                    if api_key == 36:
                        self.logins += 1
                    body = _answer(api_key, version).encode()
                    header = struct.pack(">i", correlation)
                    conn.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
            except (ConnectionError, OSError, KeyError):
                return

    def __enter__(self) -> RefusingKafka:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.close()
