"""SQLite database files the bridge cannot use are named, with why; `check` creates none.

Permissions are tested as an unprivileged user (root may open anything): as uid 65534 when the
tests run as root, else as the user running them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


def routes(folder: Path, db: Path) -> Path:
    path = folder / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              local: {{type: sqlite, path: "{db}"}}
            routes:
              - {{name: a-to-b, from: {{connection: local, queue: A}},
                  to: {{connection: local, queue: B}}}}
            """
        )
    )
    return path


def bridge(*args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    command = [*(drop if unprivileged and os.geteuid() == 0 else []), sys.executable]
    result = subprocess.run(
        [*command, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd="/",
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_check_connect_reports_a_missing_file_and_does_not_create_it(tmp_path: Path) -> None:
    db = tmp_path / "nothing-yet.db"
    config = routes(tmp_path, db)
    result = bridge("check", "--connect", "-c", str(config))
    assert result.returncode == 1, result.stderr
    assert f"local: FAILED: sqlite connection 'local': database file '{db}' does not exist" in (
        result.stdout
    )
    assert "`bridge install` creates it" in result.stdout
    assert not db.exists()
    assert bridge("install", "-c", str(config)).returncode == 0  # install still creates it
    assert bridge("check", "--connect", "-c", str(config)).returncode == 0


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    db = tmp_path / "no" / "such" / "dir" / "bridge.db"
    result = bridge("install", "-c", str(routes(tmp_path, db)))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"bridge install: sqlite connection 'local': cannot open database file '{db}': "
        f"directory '{db.parent}' does not exist"
    )


def test_a_directory_in_place_of_the_file_is_named(tmp_path: Path) -> None:
    db = tmp_path / "is-a-dir.db"
    db.mkdir()
    result = bridge("install", "-c", str(routes(tmp_path, db)))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"bridge install: sqlite connection 'local': cannot open database file '{db}': "
        "it is a directory"
    )


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder the unprivileged user can read (pytest's own are the running user's only)."""
    folder = Path(tempfile.mkdtemp(prefix="bridge-sqlite-"))
    folder.chmod(0o755)
    yield folder
    for path in folder.rglob("*"):
        path.chmod(0o700)
    shutil.rmtree(folder)


def test_a_folder_without_write_permission_is_refused_access(shared: Path) -> None:
    locked = shared / "locked"
    locked.mkdir(mode=0o555)
    config = routes(shared, locked / "bridge.db")
    result = bridge("install", "-c", str(config), unprivileged=True)
    assert result.returncode == 1, result.stderr
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    assert result.stderr.strip() == (
        f"bridge install: sqlite connection 'local': cannot open database file "
        f"'{locked / 'bridge.db'}': permission denied: user {uid} cannot create files in "
        f"'{locked}' (SQLite creates the database there, and its -wal and -shm files next to it)"
    )


def test_a_file_without_read_permission_is_refused_access(shared: Path) -> None:
    db = shared / "private.db"
    config = routes(shared, db)
    assert bridge("install", "-c", str(config)).returncode == 0
    db.chmod(0o600 if os.geteuid() == 0 else 0o000)
    result = bridge("run", "--until-idle", "1", "-c", str(config), unprivileged=True)
    assert result.returncode == 1, result.stderr
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    assert f"cannot open database file '{db}': permission denied: user {uid} cannot read" in (
        result.stderr
    )
