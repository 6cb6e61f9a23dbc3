"""What the service's HTTP paths answer (`http.py` serves them): the `Status` a server reads,
`RunnerStatus` for the routes of this process, the /routes report, and the JSON replies as
pydantic models from which `openapi_document` generates /openapi.json.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from bridge import __version__
from bridge.config.models import DerivedRoute
from bridge.routing.runner import RouteRunner
from bridge.telemetry.redact import redactor

__all__ = [
    "Error",
    "Health",
    "Readiness",
    "RouteReport",
    "Routes",
    "RunnerStatus",
    "Status",
    "Waiting",
    "openapi_document",
    "route_report",
]


def route_report(runners: Sequence[RouteRunner]) -> list[dict[str, Any]]:
    out = []
    for runner in runners:
        stats = asdict(runner.stats)
        stats.pop("last_activity")
        if stats["last_error"]:
            stats["last_error"] = redactor(stats["last_error"])
        route = runner.route
        out.append(
            {
                "name": route.name,
                # the registered endpoint a derived route forwards to; None for a written route
                "endpoint": route.endpoint if isinstance(route, DerivedRoute) else None,
                "from": {"connection": route.from_.connection, "address": route.from_.address},
                "to": {"connection": route.to.connection, "address": route.to.address},
                "concurrency": route.concurrency,
                "batch_size": route.batch_size,
                "batch_bytes": route.batch_bytes,
                "idle_seconds": round(runner.idle_for, 3),
                **stats,
            }
        )
    return out


# The JSON the paths answer, as models: /openapi.json is generated from them. Unknown keys are
# refused (`extra="forbid"`), so a key added to a reply without its model fails the conformance
# tests instead of going undocumented.

RouteState = Literal["starting", "running", "backoff", "failing", "failed", "stopped"]


class _Shape(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _drop_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _absent(description: str | None = None, alias: str | None = None) -> Any:
    """A key that may be missing from a reply but is never null when there."""
    return Field(None, alias=alias, description=description, json_schema_extra=_drop_default)


class Health(_Shape):
    status: Literal["ok"]


class Waiting(_Shape):
    """What keeps the process from being ready: a route not running, or (under `--workers`)
    a worker that does not answer (`state: down`, no `route`)."""

    route: str = _absent()
    state: RouteState | Literal["down"]
    worker: int = _absent("the worker, under `bridge run --workers`")


class Readiness(_Shape):
    ready: bool
    not_ready: list[Waiting]


class Address(_Shape):
    connection: str
    address: str


class WorkerRouteState(_Shape):
    worker: int
    state: RouteState | Literal["down"]


class RouteReport(_Shape):
    """One route. Under `--workers` the counters are summed over the workers, `state` is the
    worst of theirs, and a route no worker has reported yet has only `name`, `state` and
    `workers`: so only `name` and `state` are always there."""

    name: str
    state: RouteState
    endpoint: str | None = Field(
        None,
        description="the registered endpoint a derived route forwards to (null: a route "
        "the config writes)",
    )
    from_: Address = _absent(alias="from")
    to: Address = _absent()
    concurrency: int = _absent()
    batch_size: int = _absent()
    batch_bytes: int = _absent()
    idle_seconds: float = _absent()
    forwarded: int = _absent()
    expired: int = _absent()
    poison: int = _absent()
    retried: int = _absent()
    retried_messages: int = _absent()
    batches: int = _absent()
    control_dropped: int = _absent("Subscribe/Unsubscribe control messages a derived route dropped")
    published: dict[str, int] = _absent(
        "published events a derived route forwarded or published, by event type"
    )
    last_error: str | None = Field(None, description="redacted: never a secret")
    last_error_at: float | None = None
    workers: list[WorkerRouteState] = _absent("each worker's state, under `bridge run --workers`")


class Routes(_Shape):
    routes: list[RouteReport]


class Error(_Shape):
    error: str


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every path `HealthServer` serves."""
    models: list[type[BaseModel]] = [Health, Readiness, Routes, Error]
    refs, defs = models_json_schema(
        [(model, "serialization") for model in models],
        ref_template="#/components/schemas/{model}",
    )

    def json_reply(description: str, model: type[BaseModel]) -> dict[str, Any]:
        schema = refs[(model, "serialization")]
        return {"description": description, "content": {"application/json": {"schema": schema}}}

    def get(operation: str, summary: str, ok: dict[str, Any], **more: Any) -> dict[str, Any]:
        responses = {"200": ok, **more, "4XX": json_reply("a request refused", Error)}
        return {"get": {"operationId": operation, "summary": summary, "responses": responses}}

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bridge",
            "version": __version__,
            "description": "Health, readiness, metrics and routes of a running `bridge run`. "
            "Every path answers GET and HEAD; any other method is 405.",
        },
        "paths": {
            "/healthz": get("healthz", "Alive while the process runs", json_reply("alive", Health)),
            "/readyz": get(
                "readyz",
                "Ready once every route runs",
                json_reply("ready", Readiness),
                **{"503": json_reply("not ready: what it waits for", Readiness)},
            ),
            "/routes": get("routes", "Each route's state and counters", json_reply("", Routes)),
            "/metrics": get(
                "metrics",
                "Prometheus text exposition",
                {
                    "description": "the metrics",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
            ),
            "/openapi.json": get(
                "openapi",
                "This document",
                {
                    "description": "OpenAPI 3.1",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
            ),
        },
        "components": {"schemas": defs.get("$defs", {})},
    }


class Status(Protocol):
    def not_ready(self) -> list[dict[str, Any]]:
        """What keeps the process from being ready (empty: ready)."""

    def routes(self) -> list[dict[str, Any]]:
        """The /routes report."""

    def metrics(self) -> tuple[bytes, str]:
        """Prometheus exposition text and its content type."""


class RunnerStatus:
    """The status of the routes this process runs."""

    def __init__(self, runners: Callable[[], Sequence[RouteRunner]]) -> None:
        self._runners = runners

    def not_ready(self) -> list[dict[str, Any]]:
        return [
            {"route": r.route.name, "state": r.stats.state}
            for r in self._runners()
            if r.stats.state != "running"
        ]

    def routes(self) -> list[dict[str, Any]]:
        return route_report(self._runners())

    def metrics(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
