"""`bridge install --print-sql` for RabbitMQ prints what a client can run: requests to the
management HTTP API as `curl` commands. Run with sh against the real broker, they declare
exactly what `bridge install` declares: the same queues, exchanges, bindings and policies
(compared through the management API), and running them over what install made changes
nothing and fails nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.management import api

pytestmark = pytest.mark.integration

AUTH = {"RABBITMQ_USER": "guest", "RABBITMQ_PASSWORD": "guest"}


def bridge(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result.stdout


def get(path: str) -> Any:
    return api("GET", path)


def routes(
    tmp_path: Path, url: str, queues: Callable[..., str], topology: str, queue_type: str
) -> tuple[Path, list[str]]:
    """A route between two fresh queues with a fresh error queue; the config and the names."""
    names = [queues("Printed"), queues("PrintedOut"), queues("PrintedErr")]
    path = tmp_path / f"{names[0]}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              rabbit: {{type: rabbitmq, url: "{url}", topology: {topology},
                        queue_type: {queue_type}}}
            routes:
              - {{name: printed, from: {{connection: rabbit, queue: {names[0]}}},
                  to: {{connection: rabbit, queue: {names[1]}}}, error_queue: {names[2]}}}
            """
        )
    )
    return path, names


def run_printed(config: Path) -> str:
    """The printed block of connection `rabbit`, run by sh as a user would run it."""
    printed = bridge("install", "--print-sql", "-c", str(config))
    assert printed.startswith("# connection rabbit (rabbitmq)\n")
    assert "-- " not in printed and "queue.declare" not in printed
    result = subprocess.run(
        ["sh", "-e"],
        input=printed,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **AUTH},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return printed


def state(names: list[str]) -> dict[str, Any]:
    """What the broker holds for `names`, with each name replaced by its position."""

    def mark(value: Any) -> Any:
        return f"<{names.index(value)}>" if value in names else value

    vhost = quote("/", safe="")
    found: dict[str, Any] = {"queues": [], "exchanges": [], "bindings": [], "policies": []}
    for name in names:
        queue = get(f"queues/{vhost}/{quote(name, safe='')}")
        found["queues"].append(
            {key: queue.get(key) for key in ("durable", "auto_delete", "exclusive", "arguments")}
            | {"type": queue.get("type"), "name": mark(name)}
        )
        for binding in get(f"queues/{vhost}/{quote(name, safe='')}/bindings"):
            found["bindings"].append(
                {key: mark(binding[key]) for key in ("source", "destination", "routing_key")}
                | {"arguments": binding["arguments"]}
            )
    for exchange in get(f"exchanges/{vhost}"):
        if exchange["name"] in names:
            found["exchanges"].append(
                {key: exchange[key] for key in ("type", "durable", "auto_delete", "internal")}
                | {"arguments": exchange["arguments"], "name": mark(exchange["name"])}
            )
    for policy in get(f"policies/{vhost}"):
        if any(name in policy["name"] for name in names):
            found["policies"].append(policy["name"])
    return found


@pytest.mark.parametrize(
    ("topology", "queue_type"),
    [("conventional", "quorum"), ("conventional", "classic"), ("direct", "quorum")],
)
def test_the_printed_commands_declare_exactly_what_install_declares(
    tmp_path: Path,
    rabbitmq_url: str,
    rabbitmq_queues: Callable[..., str],
    topology: str,
    queue_type: str,
) -> None:
    installed, installed_names = routes(
        tmp_path, rabbitmq_url, rabbitmq_queues, topology, queue_type
    )
    printed, printed_names = routes(tmp_path, rabbitmq_url, rabbitmq_queues, topology, queue_type)
    bridge("install", "-c", str(installed))
    run_printed(printed)
    by_install = state(installed_names)
    assert by_install == state(printed_names)
    assert len(by_install["queues"]) == 3
    assert len(by_install["exchanges"]) == (3 if topology == "conventional" else 0)
    # the printed commands over what install made: the same declarations, refused nowhere
    run_printed(installed)
    assert state(installed_names) == by_install
    assert "rabbit: OK" in bridge("check", "--connect", "-c", str(printed))
