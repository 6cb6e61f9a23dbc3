"""The README's first command: the demo moves every message SQLite -> Kafka -> SQLite intact,
echoes commands a user can paste as they are, and installs only what it runs."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.localkafka import LocalKafka

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]


def run_demo(workdir: Path, count: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "examples.demo", "--count", str(count), "--workdir", str(workdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_demo_moves_every_message_unchanged(tmp_path: Path) -> None:
    result = run_demo(tmp_path, 500)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traceback" not in out + result.stderr
    assert (
        "every MessageId sent arrived once with its body unchanged: True "
        "(500 sent, 500 arrived, 500 distinct)" in out
    )
    # TimeToBeReceived arrives as the endpoint wrote it; the lifetime left crossed in Kafka's
    # deadline header, which is the transport's, not a header of the message
    before, _, after = out.partition("the same message in SalesCopy")
    assert "NServiceBus.TimeToBeReceived: 01:00:00\n" in before
    assert "NServiceBus.TimeToBeReceived: 01:00:00\n" in after
    assert "NServiceBus.Bridge.ExpiresAt" not in out


def test_each_echoed_command_can_be_pasted_and_runs(tmp_path: Path) -> None:
    # A folder with a space, and headers and a body with spaces and quotes: pasted unquoted,
    # each would split into other arguments.
    workdir = tmp_path / "my demo"
    result = run_demo(workdir, 20)
    assert result.returncode == 0, result.stdout + result.stderr
    echoed = [line[2:] for line in result.stdout.splitlines() if line.startswith("$ ")]
    assert [shlex.split(line)[1] for line in echoed] == ["install", "send", "run", "peek", "peek"]
    config = workdir / "routes.yaml"
    for line in echoed:  # the config as the user would type it from the demo's folder
        assert shlex.split(line)[-2:] in (
            ["-c", os.path.relpath(config, ROOT)],
            ["-c", str(config)],
        )
    send = shlex.split(echoed[1])
    assert "NServiceBus.EnclosedMessageTypes=Shop.Messages.OrderPlaced, Shop.Messages" in send
    assert '{"OrderId":"42","Total":9.99,"Note":"café / résumé"}' in send
    # The broker went with the demo: start one where routes.yaml says, and run each line as a
    # shell would, from where the demo was started.
    port = int(re.findall(r'bootstrap_servers: "127\.0\.0\.1:(\d+)"', config.read_text())[0])
    with LocalKafka(port=port):
        for line in echoed:
            ran = subprocess.run(
                shlex.split(line), cwd=ROOT, capture_output=True, text=True, timeout=120
            )
            assert ran.returncode == 0, f"$ {line}\n{ran.stdout}{ran.stderr}"
            assert "Traceback" not in ran.stderr
        assert ran.stdout.startswith("local/SalesCopy\n  depth:")


#: What the demo copies of the checkout: all ./scripts/demo needs, nothing else.
DEMO_FILES = ["pyproject.toml", "README.md", "bridge", "examples", "scripts", "tests/support"]


@pytest.mark.slow
def test_the_demo_installs_only_what_it_runs(tmp_path: Path) -> None:
    """./scripts/demo on a checkout without a .venv: it makes one with the `demo` extra only
    (no PySpark, no Helm SDK, no test tools), and the demo runs on it."""
    checkout = tmp_path / "checkout"
    for name in DEMO_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, checkout / name)
    (checkout / "tests" / "__init__.py").touch()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    result = subprocess.run(
        [str(checkout / "scripts" / "demo"), "--count", "50", "--workdir", str(tmp_path / "w")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(50 sent, 50 arrived, 50 distinct)" in result.stdout
    assert "installing bridge with only what the demo runs" in result.stderr
    python = checkout / ".venv" / "bin" / "python"
    probe = (
        "import importlib.util as u; "
        "print(*[m for m in ('pyspark', 'helm_python', 'pytest', 'mypy', 'psycopg', 'pika') "
        "if u.find_spec(m)])"
    )
    found = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert found.stdout.split() == []
    assert (checkout / ".venv" / ".bootstrap-pyproject.sha256").read_text().split()[1] == "demo"
