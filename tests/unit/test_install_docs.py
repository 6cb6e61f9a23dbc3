"""Every `pip install` the project tells a user to run installs this project.

`bridge` is not on PyPI, and the `bridge` there is someone else's project: `pip install
'bridge[kafka]'` fails or, worse, installs that. So each install command the README shows, and
each one an error message suggests, names the checkout by path, and its extras are ones
pyproject.toml defines.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: `pip install [-e] 'REQUIREMENT'` as the docs and messages write it.
INSTALL = re.compile(r"pip install (?:-e )?'([^']+)'")


def extras_defined() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def readme_commands() -> list[str]:
    commands = INSTALL.findall((ROOT / "README.md").read_text())
    assert commands, "the README shows no pip install"
    return commands


def message_of(code: str) -> str:
    """What a command prints when an optional dependency is missing (hidden in a new process)."""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


MISSING_SPARK = """
import sys
sys.modules["pyspark"] = None
from bridge.migrate import require_spark
try:
    require_spark("report")
except Exception as exc:
    print(exc)
"""

MISSING_KAFKA = """
import sys
sys.modules["aiokafka"] = None
from bridge.config.models import KafkaConnection
from bridge.transports import load
try:
    load("k", KafkaConnection(type="kafka", bootstrap_servers="127.0.0.1:9092"))
except Exception as exc:
    print(exc)
"""


def assert_installs_this_checkout(requirement: str) -> None:
    path, _, extras = requirement.partition("[")
    assert path.startswith(("./", "/", ".")), (
        f"{requirement!r} names a package on an index, not this checkout"
    )
    assert extras.endswith("]"), requirement
    unknown = set(extras[:-1].split(",")) - extras_defined()
    assert not unknown, f"{requirement!r}: pyproject.toml has no extra {sorted(unknown)}"


@pytest.mark.parametrize("requirement", readme_commands())
def test_readme_installs_from_the_checkout(requirement: str) -> None:
    assert_installs_this_checkout(requirement)


@pytest.mark.parametrize(("code", "extra"), [(MISSING_SPARK, "spark"), (MISSING_KAFKA, "kafka")])
def test_a_missing_dependency_names_a_command_that_installs_it(code: str, extra: str) -> None:
    message = message_of(code)
    found = INSTALL.findall(message)
    assert found, message
    assert_installs_this_checkout(found[0])
    assert found[0].endswith(f"[{extra}]")
    assert "checkout" in message
