"""bridge.service.tuning changes no result: a route moves the same messages (bodies, headers,
order) with the process tuned as `bridge run` tunes it and with `BRIDGE_TUNING=off`.

Each run is a fresh interpreter (tuning is process-wide and cannot be undone in this one)
that tunes itself as `bridge run` does, then runs a route over the in-memory transport.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

from bridge.service.tuning import GC_YOUNG_THRESHOLD, tune_gc

ROUTE = """
import asyncio, gc, hashlib, json
from bridge.service.tuning import tune_process

tune_process()

from bridge.config.models import Route
from bridge.envelope import Envelope, Headers
from bridge.routing.runner import RouteRunner
from bridge.transports.memory import Broker, Transport

COUNT = 6000


def message(i):
    headers = Headers([
        ("NServiceBus.MessageId", f"id-{i}"),
        ("NServiceBus.ReplyToAddress", "Sales@[dbo]@[shop]" if i % 3 else "Other@[dbo]"),
        ("x-tenant", f"t{i % 5}"),
        ("x-debug", "on"),
        ("x-empty", ""),
        ("x-null", None),
        ("x-twice", "1"),
    ])
    headers.add("x-twice", "2")
    # mostly small bodies, every 2000th larger than the allocator's mmap threshold
    body = bytes([i % 256]) * (9 << 20 if i % 2000 == 7 else 40 + i % 300)
    return Envelope(headers, body)


async def main():
    transport = Transport(broker=Broker(), receives_ahead=True)
    route = Route.model_validate({
        "name": "r",
        "from": {"connection": "a", "queue": "src"},
        "to": {"connection": "b", "queue": "dst"},
        "batch_size": 500,
        "address_map": {"Sales@[dbo]@[shop]": '"public"."Sales"'},
        "headers": {"rename": {"x-tenant": "Shop.TenantId"}, "drop": ["x-debug"],
                    "set": {"Shop.Bridged": "true"}},
    })
    await transport.sink("src").send([message(i) for i in range(COUNT)])
    runner = RouteRunner(
        route, lambda: (transport.source("src"), transport.sink("dst")), poll_timeout=0.05
    )
    task = asyncio.create_task(runner.run())
    moved = transport.broker.queue("dst")
    while len(moved) < COUNT:
        assert not task.done()
        await asyncio.sleep(0.01)
    runner.stop()
    await task
    print(json.dumps({
        "young_threshold": gc.get_threshold()[0],
        "left": len(transport.broker.queue("src")),
        "batches": runner.stats.batches,
        "moved": [[e.headers.items(), hashlib.sha256(e.body).hexdigest()] for e in moved],
    }))


asyncio.run(main())
"""


def route_run(tuning: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", ROUTE],
        env={**os.environ, "BRIDGE_TUNING": tuning},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_route_moves_the_same_messages_tuned_and_untuned() -> None:
    tuned, untuned = route_run("on"), route_run("off")
    assert tuned["young_threshold"] == GC_YOUNG_THRESHOLD  # the runs did differ in tuning
    assert untuned["young_threshold"] != GC_YOUNG_THRESHOLD
    assert tuned["left"] == untuned["left"] == 0
    assert len(tuned["moved"]) == 6000
    assert tuned["moved"] == untuned["moved"]
    assert tuned["batches"] == untuned["batches"]
    first = tuned["moved"][1]  # what the header rules made of one message
    assert first[0] == [
        ["NServiceBus.MessageId", "id-1"],
        ["NServiceBus.ReplyToAddress", '"public"."Sales"'],
        ["Shop.TenantId", "t1"],
        ["x-empty", ""],
        ["x-null", None],
        ["x-twice", "1"],
        ["x-twice", "2"],
        ["Shop.Bridged", "true"],
    ]


def test_tune_gc_freezes_what_lives_and_collects_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
