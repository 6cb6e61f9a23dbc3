"""`bridge run --workers N` without processes: the primary's merge of its workers' /routes and
/metrics, the socket pair a worker talks to the primary over, the status read over HTTP, and
the command line's refusal of a bad worker count."""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bridge.envelope import Envelope, Headers
from bridge.service.http import HealthServer
from bridge.service.workers import WorkerLink, Workers, merge_metrics, merge_routes
from bridge.telemetry.metrics import Metrics
from tests.support.localkafka import free_port

# --- /routes ----------------------------------------------------------------------------------


def route(
    state: str = "running",
    name: str = "a-to-b",
    *,
    forwarded: int = 0,
    expired: int = 0,
    poison: int = 0,
    retried: int = 0,
    retried_messages: int = 0,
    batches: int = 0,
    idle_seconds: float = 0.0,
    last_error: str | None = None,
    last_error_at: float | None = None,
    published: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One route of a worker's /routes, as `bridge.service.api.route_report` writes it."""
    return {
        "name": name,
        "from": {"connection": "a", "address": "In"},
        "to": {"connection": "b", "address": "Out"},
        "concurrency": 1,
        "batch_size": 50,
        "batch_bytes": 1048576,
        "idle_seconds": idle_seconds,
        "forwarded": forwarded,
        "expired": expired,
        "poison": poison,
        "retried": retried,
        "retried_messages": retried_messages,
        "batches": batches,
        "control_dropped": batches // 2,
        "published": published or {},
        "state": state,
        "last_error": last_error,
        "last_error_at": last_error_at,
    }


def test_two_workers_reports_are_one_route_with_summed_counters() -> None:
    zero = route(
        forwarded=700,
        expired=3,
        poison=1,
        retried=2,
        retried_messages=100,
        batches=14,
        idle_seconds=4.5,
        last_error="TransportUnavailable: b went away",
        last_error_at=1000.0,
        published={"Sales.OrderPlaced": 5},
    )
    one = route(
        "backoff",
        forwarded=300,
        expired=1,
        poison=0,
        retried=5,
        retried_messages=50,
        batches=6,
        idle_seconds=0.25,
        last_error="TransportUnavailable: b is still away",
        last_error_at=1010.0,
        published={"Sales.OrderPlaced": 2, "Sales.OrderShipped": 1},
    )
    reports: list[tuple[int, list[dict[str, Any]] | None]] = [(0, [zero]), (1, [one])]
    before = copy.deepcopy(reports)
    (merged,) = merge_routes(reports, ["a-to-b"])
    assert reports == before, "the workers' reports are left as they came"
    assert merged == {
        **zero,
        "forwarded": 1000,
        "expired": 4,
        "poison": 1,
        "retried": 7,
        "retried_messages": 150,
        "batches": 20,
        "control_dropped": 10,
        "published": {"Sales.OrderPlaced": 7, "Sales.OrderShipped": 1},  # summed by event
        "state": "backoff",  # the worse of running and backoff
        "last_error": "TransportUnavailable: b is still away",  # the more recent
        "last_error_at": 1010.0,
        "idle_seconds": 0.25,  # a route is as idle as its busiest worker
        "workers": [{"worker": 0, "state": "running"}, {"worker": 1, "state": "backoff"}],
    }


def test_the_most_recent_error_wins_whichever_worker_comes_first() -> None:
    older = route(last_error="old", last_error_at=50.0)
    newer = route(last_error="new", last_error_at=60.0)
    clean = route()  # never failed: no error to offer
    for order in itertools.permutations([older, newer, clean]):
        reports: list[tuple[int, list[dict[str, Any]] | None]] = [
            (i, [r]) for i, r in enumerate(order)
        ]
        (merged,) = merge_routes(reports, ["a-to-b"])
        assert (merged["last_error"], merged["last_error_at"]) == ("new", 60.0), order
    (merged,) = merge_routes([(0, [clean]), (1, [route()])], ["a-to-b"])
    assert merged["last_error"] is None and merged["last_error_at"] is None


SEVERITY = ["failed", "failing", "backoff", "starting", "stopped", "running"]  # worst first


@pytest.mark.parametrize(("worse", "better"), list(itertools.combinations(SEVERITY, 2)))
def test_the_worst_state_of_any_worker_wins(worse: str, better: str) -> None:
    for first, second in ((worse, better), (better, worse)):
        (merged,) = merge_routes([(0, [route(first)]), (1, [route(second)])], ["a-to-b"])
        assert merged["state"] == worse
        assert merged["workers"] == [
            {"worker": 0, "state": first},
            {"worker": 1, "state": second},
        ]


def test_a_worker_that_did_not_answer_is_down_and_the_route_not_running() -> None:
    (merged,) = merge_routes([(0, [route(forwarded=10)]), (1, None)], ["a-to-b"])
    assert merged["state"] == "starting"
    assert merged["forwarded"] == 10  # what the answering worker counted
    assert merged["workers"] == [
        {"worker": 0, "state": "running"},
        {"worker": 1, "state": "down"},
    ]
    # a state worse than starting stays as it is
    (merged,) = merge_routes([(0, None), (1, [route("backoff")])], ["a-to-b"])
    assert merged["state"] == "backoff"
    assert merged["workers"] == [{"worker": 0, "state": "down"}, {"worker": 1, "state": "backoff"}]


def test_a_route_no_worker_reported_yet_is_starting() -> None:
    merged = merge_routes([(0, None), (1, None)], ["a-to-b", "b-to-c"])
    assert merged == [
        {
            "name": name,
            "state": "starting",
            "workers": [{"worker": 0, "state": "down"}, {"worker": 1, "state": "down"}],
        }
        for name in ("a-to-b", "b-to-c")
    ]
    # a worker that answers without the route counts as down for it
    merged = merge_routes([(0, [route(forwarded=5)]), (1, [route()])], ["a-to-b", "b-to-c"])
    assert [m["name"] for m in merged] == ["a-to-b", "b-to-c"]
    assert merged[0]["forwarded"] == 5 and merged[0]["state"] == "running"
    assert merged[1] == {
        "name": "b-to-c",
        "state": "starting",
        "workers": [{"worker": 0, "state": "down"}, {"worker": 1, "state": "down"}],
    }


def test_each_route_is_merged_on_its_own() -> None:
    reports: list[tuple[int, list[dict[str, Any]] | None]] = [
        (0, [route(forwarded=1), route("backoff", "b-to-c", forwarded=10)]),
        (1, [route(forwarded=2), route("running", "b-to-c", forwarded=20)]),
    ]
    first, second = merge_routes(reports, ["a-to-b", "b-to-c"])
    assert (first["name"], first["state"], first["forwarded"]) == ("a-to-b", "running", 3)
    assert (second["name"], second["state"], second["forwarded"]) == ("b-to-c", "backoff", 30)


# --- /metrics ---------------------------------------------------------------------------------


def exposition(forwarded: int, expired: int = 0, depth: int = 0) -> str:
    """What a worker's /metrics shows once its route forwarded `forwarded` messages: the real
    instruments on their own provider and prometheus_client registry."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    metrics = Metrics(MeterProvider(metric_readers=[reader], shutdown_on_exit=False))
    route = metrics.for_route("a-to-b")
    envelopes = [Envelope(Headers([("NServiceBus.MessageId", f"m{i}")]), b"") for i in range(50)]
    for start in range(0, forwarded, 50):
        batch = envelopes[: min(50, forwarded - start)]
        route.received(len(batch))
        route.forwarded(batch, expired if start == 0 else 0, 0)
        route.settled(len(batch), time.perf_counter())
    metrics.set_depth("a-to-b", depth)
    return generate_latest(registry).decode()


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Family name -> its samples (name, labels, value); a family twice is an error."""
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in out, f"family {family.name} twice"
        out[family.name] = [(s.name, s.labels, s.value) for s in family.samples]
    return out


def value(text: str, name: str, **labels: str) -> float:
    found = [
        v
        for samples in families(text).values()
        for sample, got, v in samples
        if sample == name and labels.items() <= got.items()
    ]
    assert len(found) == 1, f"{name} {labels}: {found}"
    return found[0]


def test_every_workers_metrics_carry_its_index() -> None:
    zero, one = exposition(120, expired=2, depth=7), exposition(80)
    merged = merge_metrics([(0, zero), (1, one)], {0: 0, 1: 3}).decode()
    found = families(merged)
    # every family of a worker is there once, with each worker's samples under its label
    assert set(families(zero)) | {"bridge_worker_up", "bridge_worker_restarts"} == set(found)
    for name, samples in found.items():
        assert samples, name
        assert {labels.get("worker") for _, labels, _ in samples} == {"0", "1"}, name
    for line in ("# HELP", "# TYPE"):
        heads = [h.split()[2] for h in merged.splitlines() if h.startswith(line + " ")]
        assert len(heads) == len(set(heads)) == len(found), line
    forwarded = "bridge_messages_forwarded_total"
    assert value(merged, forwarded, route="a-to-b", worker="0") == 120
    assert value(merged, forwarded, route="a-to-b", worker="1") == 80
    assert value(merged, "bridge_messages_expired_total", worker="0") == 2
    assert value(merged, "bridge_source_depth", worker="0") == 7
    # a histogram keeps its buckets, sum and count per worker
    assert value(merged, "bridge_batch_size_count", worker="0") == 3  # 50 + 50 + 20
    assert value(merged, "bridge_batch_size_sum", worker="1") == 80
    assert value(merged, "bridge_batch_size_bucket", worker="1", le="+Inf") == 2
    assert value(merged, "bridge_worker_up", worker="0") == 1
    assert value(merged, "bridge_worker_up", worker="1") == 1
    assert value(merged, "bridge_worker_restarts_total", worker="0") == 0
    assert value(merged, "bridge_worker_restarts_total", worker="1") == 3


def test_a_worker_that_did_not_answer_is_down_with_its_restarts() -> None:
    merged = merge_metrics([(0, exposition(10)), (1, None)], {1: 2}).decode()
    assert value(merged, "bridge_worker_up", worker="0") == 1
    assert value(merged, "bridge_worker_up", worker="1") == 0
    assert value(merged, "bridge_worker_restarts_total", worker="0") == 0  # none given: 0
    assert value(merged, "bridge_worker_restarts_total", worker="1") == 2
    assert value(merged, "bridge_messages_forwarded_total", worker="0") == 10
    for name, samples in families(merged).items():
        if name not in ("bridge_worker_up", "bridge_worker_restarts"):
            assert {labels["worker"] for _, labels, _ in samples} == {"0"}, name
    # no worker answering: still the two families the primary keeps itself
    nothing = merge_metrics([(0, None), (1, None)], {0: 1, 1: 0}).decode()
    assert set(families(nothing)) == {"bridge_worker_up", "bridge_worker_restarts"}
    assert value(nothing, "bridge_worker_up", worker="1") == 0
    assert value(nothing, "bridge_worker_restarts_total", worker="0") == 1


def test_hand_written_text_keeps_its_labels_help_and_types() -> None:
    text = textwrap.dedent(
        """\
        # HELP jobs_total Jobs done, with a "quote" and a \\\\ backslash
        # TYPE jobs_total counter
        jobs_total{queue="a b"} 4.0
        jobs_total{queue="c"} 1.0
        # HELP temperature Degrees
        # TYPE temperature gauge
        temperature 21.5
        """
    )
    merged = merge_metrics([(0, text), (1, text.replace("4.0", "6.0"))], {}).decode()
    assert value(merged, "jobs_total", queue="a b", worker="0") == 4
    assert value(merged, "jobs_total", queue="a b", worker="1") == 6
    assert value(merged, "temperature", worker="1") == 21.5
    assert merged.count("# TYPE jobs_total counter\n") == 1
    assert merged.count("# TYPE temperature gauge\n") == 1
    (help_line,) = [line for line in merged.splitlines() if line.startswith("# HELP jobs_total")]
    assert help_line == '# HELP jobs_total Jobs done, with a "quote" and a \\\\ backslash'


# --- the socket pair and the status read over HTTP --------------------------------------------


def test_a_worker_tells_its_port_and_hears_the_primary_go() -> None:
    primary, worker = socket.socketpair()
    link = WorkerLink(worker.detach())
    try:
        link.announce(43210)
        primary.settimeout(5)
        assert primary.recv(64) == b"43210\n"

        async def watch() -> int:
            gone = asyncio.Event()
            calls = 0

            def on_gone() -> None:
                nonlocal calls
                calls += 1
                gone.set()

            link.watch(asyncio.get_running_loop(), on_gone)
            await asyncio.sleep(0.05)
            assert not gone.is_set()  # nothing comes while the primary lives
            primary.close()
            await asyncio.wait_for(gone.wait(), timeout=5)
            await asyncio.sleep(0.05)
            return calls

        assert asyncio.run(watch()) == 1  # once, not at every wake-up
    finally:
        primary.close()
        link.close()


class FixedStatus:
    """A worker's status page with fixed content (the primary reads it over HTTP)."""

    def __init__(self, routes: list[dict[str, Any]], metrics: str) -> None:
        self._routes, self._metrics = routes, metrics

    def not_ready(self) -> list[dict[str, Any]]:
        return []

    def routes(self) -> list[dict[str, Any]]:
        return self._routes

    def metrics(self) -> tuple[bytes, str]:
        return self._metrics.encode(), "text/plain"


@pytest.fixture
def serving() -> Iterator[HealthServer]:
    text = "# HELP up_total Ups\n# TYPE up_total counter\nup_total 3.0\n"
    server = HealthServer("127.0.0.1", 0, FixedStatus([route(forwarded=9)], text)).start()
    yield server
    server.stop()


def test_the_primary_reads_its_workers_status_over_http(serving: HealthServer) -> None:
    from bridge.service.workers import WorkersStatus

    primary = Workers(3, [], routes=["a-to-b"], http=None)
    primary.workers[0].port = serving.port  # answers
    primary.workers[1].port = None  # not started yet, or gone
    primary.workers[2].port = free_port()  # nothing listens: refused, counts as down
    primary.workers[2].restarts = 4
    status = WorkersStatus(primary)
    assert status.not_ready() == [{"worker": 1, "state": "down"}, {"worker": 2, "state": "down"}]
    (merged,) = status.routes()
    assert merged["forwarded"] == 9 and merged["state"] == "starting"
    assert merged["workers"] == [
        {"worker": 0, "state": "running"},
        {"worker": 1, "state": "down"},
        {"worker": 2, "state": "down"},
    ]
    body, content_type = status.metrics()
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert value(text, "up_total", worker="0") == 3
    assert [value(text, "bridge_worker_up", worker=str(i)) for i in range(3)] == [1, 0, 0]
    assert value(text, "bridge_worker_restarts_total", worker="2") == 4
    primary.workers[1].port = primary.workers[2].port = serving.port
    assert status.not_ready() == []
    assert status.routes()[0]["forwarded"] == 27


# --- the command line -------------------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              a: {{type: sqlite, path: "{tmp_path / "a.db"}"}}
              b: {{type: sqlite, path: "{tmp_path / "b.db"}"}}
            routes:
              - name: a-to-b
                from: {{connection: a, queue: In}}
                to: {{connection: b, queue: Out}}
            """
        )
    )
    return path


def run(config: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "run", "-c", str(config), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**{k: v for k, v in os.environ.items() if k != "BRIDGE_WORKERS"}, **(env or {})},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, result.stderr


@pytest.mark.parametrize("count", ["0", "-2"])
def test_workers_below_one_exit_2(config: Path, count: str) -> None:
    code, err = run(config, "--workers", count)
    assert code == 2, err
    assert "--workers: must be a whole number of at least 1" in err
    assert f"(from --workers or BRIDGE_WORKERS), got '{count}'" in err
    assert not list(config.parent.glob("*.db")), "nothing may run"


@pytest.mark.parametrize("count", ["x", "0", "1.5"])
def test_a_bad_bridge_workers_exits_2(config: Path, count: str) -> None:
    code, err = run(config, env={"BRIDGE_WORKERS": count})
    assert code == 2, err
    assert "--workers: must be a whole number of at least 1" in err
    assert f"(from --workers or BRIDGE_WORKERS), got '{count}'" in err
    assert not list(config.parent.glob("*.db")), "nothing may run"
