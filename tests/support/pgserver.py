"""A PostgreSQL server of one's own: a fresh cluster in a temporary directory.

For what must not touch the machine's shared server: the bench running a server out of
connections (`bench/pool.py`), the TLS tests serving a certificate of a throwaway CA
(`tls=(certificate, key)`: `ssl=on` with copies of both files, the key readable by the server's
user only, as PostgreSQL requires). `initdb` and `pg_ctl` come from `bin_dir`, else PATH, else
the newest of Debian's /usr/lib/postgresql/N/bin; run as root, the server runs as the
`postgres` user. Its settings are initdb's defaults (`max_connections` 100,
`superuser_reserved_connections` 3) unless given; its log is kept, so the connections it
refused can be counted from it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

from tests.support.localkafka import free_port

__all__ = ["PrivateServer"]


def _debian_tool(name: str) -> str | None:
    """The newest version's `name` where Debian's packages put it, off PATH."""
    found = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
    )
    return str(found[-1]) if found else None


class PrivateServer:
    """`with PrivateServer() as server:` a running cluster; `server.dsn`, `server.log`."""

    def __init__(
        self, bin_dir: str | None = None, *, tls: tuple[Path, Path] | None = None, **settings: str
    ) -> None:
        self.bin = Path(bin_dir) if bin_dir else None
        self.settings = settings
        self.tls = tls
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bridge-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _tool(self, name: str) -> str:
        found = str(self.bin / name) if self.bin else shutil.which(name) or _debian_tool(name)
        if not found:
            raise RuntimeError(f"{name} not found: put PostgreSQL's bin directory on PATH")
        return found

    def _as_owner(self, *command: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *command], check=True, capture_output=True)

    def _serve_tls(self, certificate: Path, key: Path) -> None:
        cert_copy, key_copy = self.dir / "server.crt", self.dir / "server.key"
        shutil.copyfile(certificate, cert_copy)
        key_copy.touch(mode=0o600)
        key_copy.write_bytes(key.read_bytes())
        if os.geteuid() == 0:
            for path in (cert_copy, key_copy):
                shutil.chown(path, "postgres")
        self.settings |= {
            "ssl": "on",
            "ssl_cert_file": str(cert_copy),
            "ssl_key_file": str(key_copy),
        }

    def __enter__(self) -> PrivateServer:
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        if self.tls is not None:
            self._serve_tls(*self.tls)
        self._as_owner(self._tool("initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust")
        options = " ".join(
            [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.dir}"]
            + [f"-c {key}={value}" for key, value in self.settings.items()]
        )
        self._as_owner(
            self._tool("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
            "-w", "start",
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2) as db:
                    db.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._as_owner(self._tool("pg_ctl"), "-D", str(self.data), "-m", "fast", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def refused_since(self, offset: int, text: str = "too many clients already") -> int:
        """Log lines with `text` written after byte `offset` of the log."""
        with self.log.open("rb") as log:
            log.seek(offset)
            return sum(1 for line in log if text.encode() in line)

    def version(self) -> str:
        with psycopg.connect(self.dsn) as db:
            row = db.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"
