"""Runs the routes of a config: one transport per connection, one RouteRunner per route.

SIGTERM/SIGINT: every loop finishes the batch in hand, commits, and the process exits 0.
`until_idle`: exit 0 once every loop of every route has found its source empty since the
route last forwarded, and stayed so for that many seconds (0: drain, then stop; a receive
then waits the full poll timeout before it counts as empty, so a broker's deliveries in
flight are not taken for an empty queue); a route that fails for good in that mode stops the
run at once (the other routes finish the batches in hand) and makes it exit 1 with the
route's error. `summary()` is what each route did, which `bridge run` prints in that mode.

Every SQL queue table of the routes gets a mover of its delayed messages
(`bridge.service.movers`), and with `delays:` the messages delayed for destinations that
cannot delay are sent when due (`bridge.service.delaying`); both run until the routes stop.

At start, the registry's native subscriptions are made again (`subscriptions.py`), retried in
the background until they are, while the routes run. A route of an event published on Kafka
publishes through its destination's publisher, and the route of an event table (NGinn) or
event queue (Kafka subscribers) marks what it reads published (`bridge.config.pubsub`,
`bridge.routing.rules`).

Each route's readiness probe is its transports' `check` of its source and destination. Every
`depth_every` seconds the source depth gauge is refreshed: `peek` for a queue, the consumer
group's lag for a Kafka topic (from the destination's stored positions when it keeps them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Sequence

from bridge.config.models import BridgeConfig, EventRoute, Route
from bridge.protocols import (
    CheckpointStore,
    GroupLag,
    Sink,
    Source,
    TransactionalSource,
    Transport,
)
from bridge.routing.retry import Backoff
from bridge.routing.rules import RouteRules
from bridge.routing.runner import Probe, RouteRunner
from bridge.service.delaying import delayed_producer, delaying_sink
from bridge.service.http import HealthServer, RunnerStatus
from bridge.service.movers import movers
from bridge.service.subscriptions import (
    EventTablesMissing,
    not_ready,
    publisher,
    subscribe_all,
)
from bridge.service.summary import RouteSummary, RunSummary
from bridge.service.workers import WorkerLink
from bridge.telemetry.metrics import Metrics
from bridge.transports import load

__all__ = ["Supervisor"]

log = logging.getLogger("bridge.supervisor")


class Supervisor:
    def __init__(
        self,
        config: BridgeConfig,
        routes: Sequence[str] | None = None,
        *,
        until_idle: float | None = None,
        poll_timeout: float = 1.0,
        depth_every: float = 15.0,
        link: WorkerLink | None = None,
    ) -> None:
        self.config = config
        self.routes = [r for r in config.all_routes if not routes or r.name in routes]
        self.registry = config.registry
        self.until_idle = until_idle
        # A shorter wait finds idle sooner; 0 waits the full timeout (the module docstring).
        self.poll_timeout = min(poll_timeout, until_idle) if until_idle else poll_timeout
        self.depth_every = depth_every
        self.transports: dict[str, Transport] = {}
        self._position_stores: dict[str, CheckpointStore | None] = {}
        self.runners: list[RouteRunner] = []
        self.metrics = Metrics.setup()
        self.http: HealthServer | None = None
        self.link = link
        self._stopping = asyncio.Event()
        self._started = time.monotonic()
        self._ended: float | None = None

    def _transport(self, name: str) -> Transport:
        if name not in self.transports:
            self.transports[name] = load(name, self.config.connections[name])
        return self.transports[name]

    def _runner(self, route: Route) -> RouteRunner:
        source_transport = self._transport(route.from_.connection)
        sink_transport = self._transport(route.to.connection)
        config = self.config
        metrics = self.metrics.for_route(route.name, f"{route.to.connection}/{route.to.address}")

        def endpoints() -> tuple[Source, Sink]:
            if route.publish:  # each message is published (an event route's: read from Kafka)
                source = source_transport.source(
                    route.from_.address,
                    group=route.from_.group,
                    error_queue=route.error_queue_name,
                )
                if isinstance(route, EventRoute):  # as the registered publisher
                    sink = publisher(
                        config,
                        sink_transport,
                        route.to.connection,
                        route.event,
                        endpoint=route.endpoint,
                        on_skipped=metrics.nginn_skipped,
                    )
                else:  # as the table it names (on NGinn tables)
                    sink = publisher(
                        config,
                        sink_transport,
                        route.to.connection,
                        queue=route.to.queue,
                        on_skipped=metrics.nginn_skipped,
                    )
                return source, sink
            source, sink = plain()
            to = route.to
            return source, delaying_sink(
                self.config, to.connection, to.address, route.key, sink, self._transport
            )

        def plain() -> tuple[Source, Sink]:
            if route.from_.connection == route.to.connection:
                source = source_transport.source(
                    route.from_.address, error_queue=self.config.error_queue_of(route)
                )
                if isinstance(source, TransactionalSource):
                    return source, source.sink_in_transaction(route.to.address)
                return source, source_transport.sink(route.to.address, key=route.key)
            sink = sink_transport.sink(route.to.address, key=route.key)
            # A sink that stores source positions with its rows makes the route exactly-once.
            store = sink if isinstance(sink, CheckpointStore) else None
            return source_transport.source(
                route.from_.address,
                group=route.from_.group,
                error_queue=self.config.error_queue_of(route),
                checkpoint_store=store,
            ), sink

        return RouteRunner(
            route,
            endpoints,
            poll_timeout=self.poll_timeout,
            stop_on_fatal=self.until_idle is not None,
            metrics=metrics,
            probe=self._probe(route),
            rules=RouteRules(route, self.registry),
            keeps_failed=self.config.error_queue_of(route) is None,
        )

    def _probe(self, route: Route) -> Probe:
        """Reach the route's source and destination, as `bridge check --connect` does."""
        wanted: dict[str, list[str]] = {}
        ends = [(route.from_.connection, route.from_.address)]
        if not route.publish:  # `to` names no queue: the subscribers say where events go
            ends.append((route.to.connection, route.to.address))
        for connection, address in ends:
            wanted.setdefault(connection, []).append(address)

        async def probe() -> None:
            for connection, addresses in wanted.items():
                await self._transport(connection).check(addresses)

        return probe

    async def _depth(self, route: Route) -> int:
        source = self._transport(route.from_.connection)
        group = route.from_.group
        if group is None or not isinstance(source, GroupLag):
            return (await source.peek(route.from_.address)).depth
        store = self._position_store(route)
        stored = None
        if store is not None:
            stored = await store.load_checkpoint(f"{group}/{route.from_.address}/")
        return await source.lag(route.from_.address, group, stored)

    def _position_store(self, route: Route) -> CheckpointStore | None:
        """Where the route's source positions are stored with its rows (exactly-once), if any."""
        if route.name not in self._position_stores:
            store = None
            if route.from_.connection != route.to.connection and not route.publish:
                sink = self._transport(route.to.connection).sink(route.to.address, key=route.key)
                store = sink if isinstance(sink, CheckpointStore) else None
            self._position_stores[route.name] = store
        return self._position_stores[route.name]

    def stop(self) -> None:
        if not self._stopping.is_set():
            log.info("stopping: finishing the batches in hand")
        self._stopping.set()
        for runner in self.runners:
            runner.stop()

    async def _subscribe(self) -> None:
        """Make the registry's subscriptions (idempotent), retrying until they are made: a
        publisher's database or broker that is down at start must not stop the routes."""
        backoff = Backoff(initial=1.0, maximum=60.0)
        while not self._stopping.is_set():
            try:
                await subscribe_all(self.config, self.transports)
                return
            except EventTablesMissing as exc:  # made once someone creates the tables
                delay = backoff.next_delay()
                for line in not_ready(exc):
                    log.error("%s; trying again in %.0fs", line, delay)
            except Exception as exc:  # retried; the routes run meanwhile
                delay = backoff.next_delay()
                log.error("subscriptions not made: %s; trying again in %.0fs", exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)

    async def _run_route(self, runner: RouteRunner) -> None:
        await runner.run()
        if runner.fatal is not None:  # failed for good: waiting for idle would never end
            self.stop()

    async def _watch_idle(self) -> None:
        assert self.until_idle is not None
        wanted = self.until_idle
        while not self._stopping.is_set():
            if all(r.drained and r.idle_for >= wanted for r in self.runners):
                if wanted:
                    log.info("every source idle for %.1fs: stopping", wanted)
                else:
                    log.info("every source drained: stopping")
                self.stop()
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=min(0.1, wanted or 0.1))

    def summary(self) -> RunSummary:
        """What each route did, and how long the run took (so far, while it runs)."""
        routes = [
            RouteSummary(
                r.route.name,
                r.stats.forwarded,
                r.stats.expired,
                r.stats.poison,
                r.busy_seconds,
                r.fatal is not None,
            )
            for r in self.runners
        ]
        end = time.monotonic() if self._ended is None else self._ended
        return RunSummary(routes, end - self._started)

    async def _watch_depths(self) -> None:
        """Refresh each route's source depth gauge now and then; failures only log."""
        while not self._stopping.is_set():
            for runner in self.runners:
                route = runner.route
                try:
                    self.metrics.set_depth(route.name, await self._depth(route))
                except Exception as exc:  # a failed look must never disturb the routes
                    log.debug("depth of %s unavailable: %s", route.name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self.depth_every)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self._started = time.monotonic()
        try:
            self.runners = [self._runner(route) for route in self.routes]
            if self.config.http is not None:
                self.http = HealthServer(
                    self.config.http.host, self.config.http.port, RunnerStatus(lambda: self.runners)
                ).start()
                log.info("serving /healthz /readyz /metrics /routes on port %d", self.http.port)
            if self.link is not None:  # a worker of `bridge run --workers N`
                self.link.announce(0 if self.http is None else self.http.port)
                self.link.watch(loop, self.stop)
            tasks = [
                asyncio.create_task(self._run_route(r), name=r.route.name) for r in self.runners
            ]
            depths = asyncio.create_task(self._watch_depths(), name="depths")
            subscribing = asyncio.create_task(self._subscribe(), name="subscriptions")
            moving = [  # delayed messages (`bridge.service.movers`, `delaying`)
                asyncio.create_task(m.run(self._stopping), name=f"mover {m.address}")
                for m in movers(self.config, self.routes, self._transport)
            ]
            producer = delayed_producer(self.config, self._transport)
            if producer is not None:
                moving.append(asyncio.create_task(producer.run(self._stopping), name="delays"))
            if self.until_idle is not None:
                tasks.append(asyncio.create_task(self._watch_idle(), name="until-idle"))
            log.info("running %d route(s)", len(self.runners))
            await asyncio.gather(*tasks)
            self._ended = time.monotonic()
            self._stopping.set()
            await depths
            subscribing.cancel()
            await asyncio.gather(subscribing, return_exceptions=True)
            await asyncio.gather(*moving)
        finally:
            if self.http is not None:
                self.http.stop()
            if self.link is not None:
                if self.until_idle is not None:  # the primary prints the whole run's
                    self.link.report(self.summary().to_json())
                self.link.close()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            for transport in self.transports.values():
                await transport.close()
        failed = [r for r in self.runners if r.fatal is not None]
        for runner in failed:
            name = runner.route.name
            log.error("route %s failed: %s", name, runner.fatal, extra={"route": name})
        return 1 if failed else 0
