"""Routes between two queue tables of one database: one atomic move per batch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.config.loader import load_config
from bridge.envelope import Envelope, Headers
from bridge.transports import load
from tests.conftest import unique

pytestmark = pytest.mark.integration


def write_routes(tmp_path: Path, connection: str) -> tuple[Path, str, str]:
    src, dst = unique("In"), unique("Out")
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              db: {connection}
            routes:
              - name: move
                from: {{connection: db, queue: "{src}"}}
                to: {{connection: db, queue: "{dst}"}}
                batch_size: 64
                concurrency: 2
            """
        )
    )
    return path, src, dst


def bridge(config: Path, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", *args, "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_same_database_route_moves_everything_once(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if dialect == "sqlite":
        connection = f'{{type: sqlite, path: "{tmp_path / "one.db"}"}}'
    else:
        dsn, schema = request.getfixturevalue("pg_dsn"), request.getfixturevalue("pg_schema")
        connection = f'{{type: postgresql, dsn: "{dsn}", schema: "{schema}"}}'
    config, src, dst = write_routes(tmp_path, connection)
    bridge(config, "install")
    transport = load("db", load_config(config).config.connections["db"])
    try:
        sink = transport.sink(src)
        await sink.send(
            [Envelope(Headers([("NServiceBus.MessageId", f"m{i}")]), b"x" * i) for i in range(500)]
        )
        bridge(config, "run", "--until-idle", "1")
        assert (await transport.peek(src)).depth == 0
        source = transport.source(dst)
        batch = await source.receive_batch(1000, 1.0)
        await batch.abort()
        await source.close()
        ids = [e.message_id for e in batch.messages]
        assert sorted(ids) == sorted(f"m{i}" for i in range(500))
        assert len(set(ids)) == 500
    finally:
        await transport.close()
