"""The whole `routes.py` run: the raw legs, the one-message-per-transaction baselines, then
every route with every `--workers` count, each against its slower raw leg and its baseline."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.baseline import ONE_BY_ONE
from bench.legs import KafkaPlace, Place, RabbitPlace, SqlPlace
from bench.machine import BusySampler
from bench.messages import make_messages, unique
from bench.phases import RoutePhases
from bench.report import RouteResult, ceiling
from bridge.config.models import Route

__all__ = ["DEFAULT_BATCH", "DEFAULT_CONCURRENCY", "Bench"]

DEFAULT_BATCH = Route.model_fields["batch_size"].default
DEFAULT_CONCURRENCY = Route.model_fields["concurrency"].default


class Bench:
    def __init__(
        self, args: argparse.Namespace, kafka: str, workdir: Path, kafka_pid: int = 0
    ) -> None:
        self.args = args
        self.kafka = kafka
        self.workdir = workdir
        self.phases = RoutePhases(args, workdir, kafka_pid)
        self.schema = unique("bench")
        self.places: list[Place] = []
        self.legs: dict[str, float] = {}
        self.leg_busy: dict[str, float] = {}  # share of the machine's CPUs busy during each leg
        self.leg_stolen: dict[str, float] = {}  # and stolen by the hypervisor
        self.results: list[RouteResult] = []

    # places ------------------------------------------------------------------------------------

    def sql(self, db: str, prefix: str) -> SqlPlace:
        if db == "postgresql":
            place = SqlPlace("postgresql", unique(prefix), dsn=self.args.dsn, schema=self.schema)
        else:
            place = SqlPlace("sqlite", unique(prefix), path=str(self.workdir / "bench.db"))
        self.places.append(place)
        return place

    def broker(self, kind: str, prefix: str) -> KafkaPlace | RabbitPlace:
        place: KafkaPlace | RabbitPlace
        if kind == "kafka":
            place = KafkaPlace(unique(prefix), self.kafka, self.args.partitions)
        else:
            place = RabbitPlace(unique(prefix), self.args.rabbitmq)
        self.places.append(place)
        return place

    async def setup(self) -> None:
        with psycopg.connect(self.args.dsn, autocommit=True) as db:
            db.execute(f'CREATE SCHEMA "{self.schema}"')

    async def drop(self, *places: Place) -> None:
        """Drop what a finished measurement used at once, so that nothing it left runs into the
        next ones: a queue table's 100,000 deleted rows and their autovacuum, a Kafka
        destination's reader (it fetches every 5 ms until stopped, and the local broker's
        fetches cost more the more record batches a topic holds: left running, the readers of
        the SQL -> Kafka routes keep tansu busy through every route after them), the messages
        of a topic or queue."""
        for place in places:
            if place in self.places:
                self.places.remove(place)
            try:
                await place.drop()
            except Exception as exc:  # the next measurement goes on
                print(f"dropping {place.address}: {exc}", file=sys.stderr)

    async def cleanup(self) -> None:
        # The tables go with the schema below (SQLite's with the work directory).
        await self.drop(*(place for place in self.places if not isinstance(place, SqlPlace)))
        with psycopg.connect(self.args.dsn, autocommit=True) as db:
            db.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    # legs --------------------------------------------------------------------------------------

    async def leg_pair(self, place: Place, label: str) -> None:
        """Write leg then read leg on one fresh address, `--messages` each."""
        n, batch = self.args.messages, self.args.batch_size or DEFAULT_BATCH
        await place.create()
        messages = make_messages(n, self.args.size)
        with BusySampler() as sampler:
            write = await place.write(messages, batch)
            wrote = time.perf_counter()
            del messages
            read = await place.read(n, batch)
            done = time.perf_counter()
        names = {
            "postgresql": ("PostgreSQL batched insert", "PostgreSQL batched receive"),
            "sqlite": ("SQLite batched insert", "SQLite batched receive"),
            "kafka": ("Kafka producer", "Kafka consumer"),
            "rabbitmq": ("RabbitMQ publisher-confirm window", "RabbitMQ consume"),
        }[label]
        self.record_leg(names[0], n / write, sampler, wrote - write, wrote)
        self.record_leg(names[1], n / read, sampler, done - read, done)
        print(
            f"  {names[0]}: {n / write:,.0f} msg/s; {names[1]}: {n / read:,.0f} msg/s "
            f"(CPU stolen {self.leg_stolen[names[0]]:.0%} / {self.leg_stolen[names[1]]:.0%})"
        )
        if isinstance(place, SqlPlace) and label == "postgresql":
            # For reference, not a ratio: the insert as psycopg's pipelined executemany (what
            # the bridge's sink runs below `STAGE_FROM` rows a send), on the table just emptied.
            name = "PostgreSQL insert by executemany (reference)"
            messages = make_messages(n, self.args.size)
            with BusySampler() as sampler:
                write = await place.write(messages, batch, staged=False)
                wrote = time.perf_counter()
            self.record_leg(name, n / write, sampler, wrote - write, wrote)
            print(f"  {name}: {n / write:,.0f} msg/s")
        await self.drop(place)

    def record_leg(
        self, name: str, rate: float, sampler: BusySampler, start: float, end: float
    ) -> None:
        """A leg's rate, and the shares of the machine's CPUs busy and stolen while it ran."""
        self.legs[name] = rate
        self.leg_busy[name], self.leg_stolen[name] = sampler.shares(start, end)

    def leg_names(self, route: str, db: str) -> tuple[str, str]:
        dbname = "PostgreSQL" if db == "postgresql" else "SQLite"
        return {
            "sql-kafka": (f"{dbname} batched receive", "Kafka producer"),
            "kafka-sql": ("Kafka consumer", f"{dbname} batched insert"),
            "sql-rabbitmq": (f"{dbname} batched receive", "RabbitMQ publisher-confirm window"),
            "rabbitmq-sql": ("RabbitMQ consume", f"{dbname} batched insert"),
        }[route]

    # routes ---------------------------------------------------------------------------------------

    def endpoints(self, route: str, db: str) -> tuple[Place, Place]:
        if route == "sql-kafka":
            return self.sql(db, "src"), self.broker("kafka", "dst")
        if route == "kafka-sql":
            return self.broker("kafka", "src"), self.sql(db, "dst")
        if route == "sql-rabbitmq":
            return self.sql(db, "src"), self.broker("rabbitmq", "dst")
        return self.broker("rabbitmq", "src"), self.sql(db, "dst")

    async def route(self, route: str, db: str, workers: int) -> RouteResult:
        result = RouteResult(route, db, workers)
        source, destination = self.endpoints(route, db)
        await source.create()
        await destination.create()
        try:
            await self.phases.measure(result, source, destination)
        finally:
            await self.drop(source, destination)
        return result

    # baseline ----------------------------------------------------------------------------------

    async def baseline(self, route: str, db: str) -> float:
        n = self.args.baseline_messages
        source, destination = self.endpoints(route, db)
        await source.create()
        await destination.create()
        await source.write(make_messages(n, self.args.size), 1000)
        run: Callable[[Any, Any, int], Awaitable[float]] = ONE_BY_ONE[route]
        try:
            seconds = await run(source, destination, n)
        finally:
            await self.drop(source, destination)
        return n / seconds

    # the whole run -----------------------------------------------------------------------------

    async def run(self) -> None:
        args = self.args
        brokers = {b for r in args.routes for b in r.split("-") if b != "sql"}
        if not args.no_legs:
            print("raw legs", flush=True)
            for db in args.db:
                await self.leg_pair(self.sql(db, "leg"), db)
            for kind in sorted(brokers):
                await self.leg_pair(self.broker(kind, "leg"), kind)
        baselines: dict[tuple[str, str], float] = {}
        if not args.no_baseline:
            print("one message per transaction", flush=True)
            for route in args.routes:
                for db in args.db:
                    baselines[route, db] = await self.baseline(route, db)
                    print(f"  {route} {db}: {baselines[route, db]:,.0f} msg/s", flush=True)
        print("routes", flush=True)
        for route in args.routes:
            for db, workers in ((db, w) for db in args.db for w in args.workers):
                result = await self.route(route, db, workers)
                names = self.leg_names(route, db)
                slower = min(names, key=lambda name: self.legs.get(name, 0.0))
                result.raw_leg, result.raw_rate = slower, self.legs.get(slower, float("nan"))
                result.baseline = baselines.get((route, db), float("nan"))
                result.ceiling = ceiling(self.legs, self.leg_busy, names)
                self.results.append(result)
                print(
                    f"  {route} {db} workers {workers}: {result.rate:,.0f} msg/s, "
                    f"p50 {result.p50_ms:.1f} ms, "
                    f"p99 {result.p99_ms:.1f} ms, CPU stolen {result.stolen:.0%} / "
                    f"{result.latency_stolen:.0%} {' '.join(result.notes)}",
                    flush=True,
                )
