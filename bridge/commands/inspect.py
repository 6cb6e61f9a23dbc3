"""`bridge peek` and `bridge endpoints`: what a queue holds, and the endpoint registry."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from bridge.commands.common import (
    load_routes,
    transport_for,
)
from bridge.config.models import BridgeConfig
from bridge.protocols import QueueStats, ReadsOldestAge, SharesDelays, Transport
from bridge.service.delaying import waiting_delays


def describe_stats(connection: str, queue: str, stats: QueueStats, *, as_json: bool) -> str:
    """What `peek` prints: one JSON object, or a few lines for people."""
    if as_json:
        return json.dumps(
            {
                "connection": connection,
                "queue": queue,
                "depth": stats.depth,
                "oldest_age_seconds": stats.oldest_age_seconds,
                "expired": stats.expired,
                "elsewhere": stats.elsewhere,
                "delayed": stats.delayed,
                "next_due_seconds": stats.next_due_seconds,
                "delayed_all_destinations": stats.delayed_all_destinations,
            }
        )
    age = stats.oldest_age_seconds
    lines = [
        f"{connection}/{queue}",
        f"  depth:   {stats.depth}",
        f"  oldest:  {'-' if age is None else f'{age:.1f} s'}",
        f"  expired: {stats.expired}",
    ]
    if stats.elsewhere:
        lines.append(
            f"  for other endpoints: {stats.elsewhere} (not in depth; no bridge source takes "
            "them: NGinn forwards them, or they are stranded)"
        )
    if stats.delayed is not None:
        due = stats.next_due_seconds
        lines.append(f"  delayed: {stats.delayed}")
        lines.append(f"  next due: {'-' if due is None else f'in {max(due, 0.0):.1f} s'}")
    if stats.delayed_all_destinations is not None:
        lines.append(
            f"  delayed, every destination together: {stats.delayed_all_destinations} (in the "
            "shared delay levels; how many are for this queue cannot be read without taking them)"
        )
    return "\n".join(lines)


async def peek(config_path: str, connection: str, queue: str, *, as_json: bool) -> int:
    """Print a queue's depth, its oldest message's age and how many expired."""
    config = load_routes(config_path).config
    transport = transport_for(config, connection)
    opened = {connection: transport}

    def opened_transport(name: str) -> Transport:
        if name not in opened:
            opened[name] = transport_for(config, name)
        return opened[name]

    try:
        stats = await transport.peek(queue)
        if (
            stats.depth
            and stats.oldest_age_seconds is None
            and isinstance(transport, ReadsOldestAge)
        ):
            stats = replace(stats, oldest_age_seconds=await transport.oldest_age(queue))
        if isinstance(transport, SharesDelays):
            shared = await transport.delayed_all_destinations()
            stats = replace(stats, delayed_all_destinations=shared)
        # A destination that cannot delay: its delayed messages wait in `delays:`.
        waiting = await waiting_delays(config, connection, queue, opened_transport)
        if waiting is not None:
            stats = replace(stats, delayed=waiting[0], next_due_seconds=waiting[1])
    finally:
        for each in opened.values():
            await each.close()
    print(describe_stats(connection, queue, stats, as_json=as_json))
    return 0


def describe_registry(
    config: BridgeConfig, states: dict[tuple[str, str], str] | None = None
) -> dict[str, Any]:
    """`bridge endpoints --json`: each endpoint's address on every connection, its
    subscriptions (with `states`, what the publisher's side holds), and the routes."""
    registry = config.registry
    routes = {(r.from_.connection, r.from_.address): r.name for r in config.derived_routes}
    listed: dict[str, dict[str, Any]] = {}
    for place in registry.places():
        entry = listed.setdefault(
            place.endpoint,
            {
                "name": place.endpoint,
                "connection": registry.home(place.endpoint),
                "addresses": {},
                "subscriptions": [],
            },
        )
        entry["addresses"][place.connection] = {
            "queue": place.queue,
            "address": place.address,
            "proxy": place.proxy,
            "route": routes.get((place.connection, place.queue)),
        }
    pubsub = registry.pubsub
    for s in pubsub.subscriptions():
        subscribed: dict[str, Any] = {
            "event": s.event,
            "publisher": s.publisher,
            "kind": s.kind,
            "connection": s.connection,
            "address": s.address or None,
        }
        if s.kind == "kafka" or s.kind == "home":
            subscribed["topic"] = pubsub.topic(s.event)
        if s.table is not None:  # an NGinn publisher's event table, or an event queue
            subscribed["table" if pubsub.nginn(s.connection) else "queue"] = s.table
            subscribed["route"] = routes.get((s.connection, s.table))
        if states is not None and s.native:
            subscribed["state"] = states.get((s.endpoint, s.event), "unknown")
        listed[s.endpoint]["subscriptions"].append(subscribed)
    return {
        "endpoints": list(listed.values()),
        "proxies": {"create": config.proxies.create, "connections": registry.connections()},
        "routes": [
            {
                "name": r.name,
                "endpoint": r.endpoint,
                "from": {"connection": r.from_.connection, "address": r.from_.address}
                | ({"group": r.from_.group} if r.from_.group else {}),
                "to": {"connection": r.to.connection, "address": r.to.address},
                "batch_size": r.batch_size,
                "concurrency": r.concurrency,
            }
            for r in config.derived_routes
        ],
    }


def _how(s: dict[str, Any]) -> str:
    """How the bridge subscribes, in words (`bridge.config.pubsub`)."""
    # Through an NGinn publisher's event table, else a Kafka subscribers' event queue.
    table, queue = "table" in s, "queue" in s and "table" not in s
    how = {
        "local": f"on {s['connection']}, by the endpoint itself",
        "proxy": f"{'event table' if table else 'its proxy'} {s['address']} on {s['connection']}",
        "kafka": f"{'event queue' if queue else 'via'} {s['address']} on {s['connection']}, "
        f"to topic {s.get('topic')}",
        "home": f"topic {s.get('topic')} published on {s['connection']} to {s['address']}",
    }[s["kind"]]
    if table or queue:
        how += f", route {s['route']}"
    return how + (f" [{s['state']}]" if "state" in s else "")


def render_registry(report: dict[str, Any]) -> str:
    """`bridge endpoints`: one block per endpoint, one line per connection."""
    if not report["endpoints"]:
        return "no endpoints registered (add `endpoints:` to the config)"
    lines = []
    for endpoint in report["endpoints"]:
        lines.append(f"{endpoint['name']} (lives on {endpoint['connection']})")
        width = max(len(c) for c in endpoint["addresses"])
        for connection, place in endpoint["addresses"].items():
            role = f"proxy, route {place['route']}" if place["proxy"] else "its own queue"
            lines.append(f"  {connection:<{width}}  {place['address']}  ({role})")
        for s in endpoint["subscriptions"]:
            lines.append(f"  subscribes to {s['event']} from {s['publisher']}: {_how(s)}")
    create = "created by `bridge install`" if report["proxies"]["create"] else "must exist"
    lines.append(f"{len(report['routes'])} derived routes; proxies {create}")
    return "\n".join(lines)


async def endpoints(config_path: str, *, as_json: bool, connect: bool = False) -> int:
    """Print the endpoint registry: endpoints, their addresses everywhere, subscriptions,
    derived routes. Without `connect` it connects to nothing, so it needs no credentials; with
    it, each subscription's state is read where its publisher lives."""
    config = load_routes(config_path, offline=not connect).config
    states = None
    if connect:
        from bridge.service.subscription_state import state

        states = await state(config)
    report = describe_registry(config, states)
    print(json.dumps(report, indent=2) if as_json else render_registry(report))
    return 0
