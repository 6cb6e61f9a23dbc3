"""The OpenAPI document's shapes against the replies the primary of `--workers` builds, in the
states a running bridge rarely shows the fuzzer: a worker down, a route no worker has reported,
a route in error. (What one process serves is checked against the document on a running
bridge: tests/integration/test_http_hostile.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bridge.config.loader import parse_config
from bridge.routing.runner import RouteRunner
from bridge.service.api import Readiness, Routes, route_report
from bridge.service.workers import merge_routes

CONFIG = """\
connections:
  a: {type: sqlite, path: a.db}
routes:
  - {name: a-to-b, from: {connection: a, queue: A}, to: {connection: a, queue: B}}
"""


def report(state: str = "running", error: str | None = None) -> list[dict[str, Any]]:
    """One worker's /routes as `route_report` writes it for a real runner."""

    def no_endpoints() -> Any:
        raise AssertionError("not started")

    runner = RouteRunner(parse_config(CONFIG).config.route("a-to-b"), no_endpoints)
    runner.stats.state = state
    runner.stats.last_error, runner.stats.last_error_at = error, 12.5 if error else None
    return route_report([runner])


def test_one_process_and_the_primary_of_workers_coming_and_going_fit_the_document() -> None:
    Routes.model_validate({"routes": report()})
    merged = merge_routes(
        [(0, report("backoff", "TransportUnavailable: down")), (1, None), (2, report())],
        ["a-to-b", "never-reported"],
    )
    assert [r["name"] for r in merged] == ["a-to-b", "never-reported"]
    assert set(merged[1]) == {"name", "state", "workers"}  # only what no worker told
    Routes.model_validate({"routes": merged})
    Readiness.model_validate(
        {
            "ready": False,
            "not_ready": [
                {"worker": 1, "state": "down"},
                {"route": "a-to-b", "state": "backoff", "worker": 0},
            ],
        }
    )


def test_a_key_the_document_does_not_know_is_refused() -> None:
    """So a key added to a reply without its model fails here and in the conformance tests."""
    with pytest.raises(ValidationError):
        Routes.model_validate({"routes": [{**report()[0], "new_key": 1}]})
