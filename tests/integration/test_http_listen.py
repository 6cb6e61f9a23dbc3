"""`bridge run` with an `http` address it cannot listen on says which address, why, and where
the config sets it, instead of `unexpected OSError: [Errno 98]`."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def routes(tmp_path: Path, http: str) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{tmp_path / "local.db"}"}}
            routes:
              - {{name: a-to-b, from: {{connection: local, queue: A}},
                  to: {{connection: local, queue: B}}}}
            http:
            """
        )
        + http
        + "\n"
    )
    install = [sys.executable, "-m", "bridge", "install", "-c", str(path)]
    subprocess.run(install, check=True, capture_output=True)
    return path


def run(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", "run", "--until-idle", "1", "-c", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_names_the_address_and_the_config_line(tmp_path: Path, workers: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = routes(tmp_path, f"  host: 127.0.0.1\n  port: {port}")
        result = run(path, "--workers", workers)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"bridge run: {path}:8:9: http: cannot listen on 127.0.0.1:{port}: Address already in "
        "use: another process listens there (another bridge?): stop it or choose another "
        "http.port"
    )
    assert "unexpected" not in result.stderr and "Traceback" not in result.stderr


def test_a_host_that_is_not_this_machines_points_at_the_host(tmp_path: Path) -> None:
    path = routes(tmp_path, "  host: 192.0.2.1\n  port: 0")  # TEST-NET-1: never local
    result = run(path)
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"bridge run: {path}:7:9: http: cannot listen on 192.0.2.1:0: ")
    assert "check http.host" in last
