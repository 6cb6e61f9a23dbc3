"""A RabbitMQ node of one's own, with TLS listeners: for the TLS tests, which must not
reconfigure or restart the machine's shared broker.

`with PrivateRabbitMQ(certificate, key) as node:` starts `rabbitmq-server` with its own node
name, directories (database, logs) and ports in a temporary directory: AMQP over TLS only
(`listeners.ssl.default` on a free port of 127.0.0.1, `node.port`; no plain listener), the
management API over https only (`node.management_port`), Erlang distribution on another free
port of 127.0.0.1. The node's TLS asks clients for no certificate. As root it runs as the
`rabbitmq` user, whose Erlang cookie it shares with the machine's node. The default user
guest/guest may log in, since clients connect from loopback. Leaving the block stops the node
(SIGTERM: Erlang's orderly stop) and removes its directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

from tests.support.localkafka import free_port

__all__ = ["PrivateRabbitMQ"]

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # Debian's; /usr/sbin's wrapper runs `su`


class PrivateRabbitMQ:
    """See the module docstring."""

    def __init__(self, certificate: Path, key: Path) -> None:
        self.port = free_port()
        self.management_port = free_port()
        self.dist_port = free_port()
        self.node = f"bridge-tls-{uuid.uuid4().hex[:8]}@localhost"
        self.dir = Path(tempfile.mkdtemp(prefix="bridge-rabbitmq-"))
        self.log = self.dir / "server.log"
        self._files = (certificate, key)
        self._process: subprocess.Popen[bytes] | None = None

    def _configure(self) -> dict[str, str]:
        cert, key = self.dir / "server.pem", self.dir / "server.key"
        shutil.copyfile(self._files[0], cert)
        key.touch(mode=0o600)
        key.write_bytes(self._files[1].read_bytes())
        (self.dir / "rabbitmq.conf").write_text(
            "listeners.tcp = none\n"
            f"listeners.ssl.default = 127.0.0.1:{self.port}\n"
            f"ssl_options.certfile = {cert}\n"
            f"ssl_options.keyfile = {key}\n"
            "ssl_options.verify = verify_none\n"
            "ssl_options.fail_if_no_peer_cert = false\n"
            f"management.ssl.port = {self.management_port}\n"
            "management.ssl.ip = 127.0.0.1\n"
            f"management.ssl.certfile = {cert}\n"
            f"management.ssl.keyfile = {key}\n"
        )
        (self.dir / "enabled_plugins").write_text("[rabbitmq_management].\n")
        (self.dir / "rabbitmq-env.conf").write_text("")  # not the machine's node's
        for sub in ("mnesia", "log"):
            (self.dir / sub).mkdir()
        if os.geteuid() == 0:
            for path in [self.dir, *self.dir.rglob("*")]:
                shutil.chown(path, "rabbitmq")
        home = "/var/lib/rabbitmq" if os.geteuid() == 0 else os.environ.get("HOME", "/")
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": home,  # where the Erlang cookie is
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def __enter__(self) -> PrivateRabbitMQ:
        if not Path(SERVER).exists():
            raise RuntimeError(f"{SERVER} not found: install the rabbitmq-server package")
        env = self._configure()
        prefix = ["runuser", "-u", "rabbitmq", "--"] if os.geteuid() == 0 else []
        with self.log.open("wb") as log:
            self._process = subprocess.Popen(
                [*prefix, SERVER],
                env=env,
                cwd=self.dir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait(60.0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait(self, timeout: float) -> None:
        """The AMQP listener opens last in the node's boot, after the management API's: then
        it takes connections."""
        deadline = time.monotonic() + timeout
        assert self._process is not None
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"rabbitmq-server exited with {self._process.returncode}: "
                    + self.log.read_text(errors="replace")[-2000:]
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"RabbitMQ did not listen on {self.port}: {exc}") from exc
                time.sleep(0.1)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, 15)  # the session started above: runuser, the node
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, 9)
                    process.wait()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
