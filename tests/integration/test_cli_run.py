"""`bridge run --until-idle` as scripts call it: 0 drains then stops, a negative time is a usage
error, and the run ends with what each route did, on stdout, with or without workers."""

from __future__ import annotations

import json
import re
import sqlite3
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from tests.integration.test_cli import bridge

pytestmark = pytest.mark.integration

SECONDS = r"\d+\.\d s"


def sqlite_routes(tmp_path: Path, *, rabbitmq: str | None = None, queue: str = "In") -> Path:
    """Two SQLite files: route `move` from a.db `In` to b.db `Out`, route `other` from b.db
    `Side` to a.db `Back`; with `rabbitmq`, route `move` reads RabbitMQ queue `queue`."""
    source = f'{{type: sqlite, path: "{tmp_path / "a.db"}"}}'
    if rabbitmq is not None:
        source = f'{{type: rabbitmq, url: "{rabbitmq}", topology: direct, prefetch: 50}}'
    path = tmp_path / "routes.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            connections:
              src: {source}
              a: {{type: sqlite, path: "{tmp_path / "a.db"}"}}
              b: {{type: sqlite, path: "{tmp_path / "b.db"}"}}
            routes:
              - name: move
                from: {{connection: src, queue: "{queue}"}}
                to: {{connection: b, queue: Out}}
                batch_size: 100
              - name: other
                from: {{connection: b, queue: Side}}
                to: {{connection: a, queue: Back}}
            """
        )
    )
    installed = bridge("install", "-c", str(path))
    assert installed.returncode == 0, installed.stderr
    return path


def depth(config: Path, connection: str, queue: str) -> int:
    peek = bridge("peek", connection, queue, "--json", "-c", str(config))
    assert peek.returncode == 0, peek.stderr
    return int(json.loads(peek.stdout)["depth"])


def test_until_idle_0_drains_every_source_then_stops(tmp_path: Path) -> None:
    config = sqlite_routes(tmp_path)
    assert bridge("send", "src", "In", "--count", "1000", "-c", str(config)).returncode == 0
    run = bridge("run", "--until-idle", "0", "-c", str(config))
    assert run.returncode == 0, run.stderr
    assert "every source drained: stopping" in run.stderr
    assert depth(config, "src", "In") == 0
    assert depth(config, "b", "Out") == 1000


def test_until_idle_0_drains_a_rabbitmq_queue_whose_deliveries_are_still_coming(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_queues: Callable[[str], str]
) -> None:
    """A consumer's first deliveries take a moment to arrive: an empty first look at a queue
    that holds messages is not a drained queue."""
    queue = rabbitmq_queues("drain")
    config = sqlite_routes(tmp_path, rabbitmq=rabbitmq_url, queue=queue)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    channel = connection.channel()
    for _ in range(500):
        channel.basic_publish(
            "",
            queue,
            b"{}",
            pika.BasicProperties(message_id=str(uuid.uuid4()), delivery_mode=2),
        )
    connection.close()
    run = bridge("run", "--until-idle", "0", "-c", str(config))
    assert run.returncode == 0, run.stderr
    assert depth(config, "b", "Out") == 500
    assert depth(config, "src", queue) == 0


def test_until_idle_0_drains_a_kafka_topic_once_its_consumer_holds_the_partitions(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """A consumer still joining its group has not looked at the topic yet."""
    topic = f"drain-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "routes.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            connections:
              kafka: {{type: kafka, bootstrap_servers: "{kafka_bootstrap}", idempotence: false}}
              b: {{type: sqlite, path: "{tmp_path / "b.db"}"}}
            routes:
              - name: from-kafka
                from: {{connection: kafka, topic: {topic}, group: {topic}}}
                to: {{connection: b, queue: Out}}
            """
        )
    )
    assert bridge("install", "-c", str(config)).returncode == 0
    assert bridge("send", "kafka", topic, "--count", "300", "-c", str(config)).returncode == 0
    run = bridge("run", "--until-idle", "0", "-c", str(config))
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("route from-kafka: 300 forwarded,"), run.stdout
    assert depth(config, "b", "Out") == 300


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf", "soon"])
def test_a_negative_or_no_number_of_seconds_is_a_usage_error(tmp_path: Path, value: str) -> None:
    config = sqlite_routes(tmp_path)
    run = bridge("run", f"--until-idle={value}", "-c", str(config))
    assert run.returncode == 2
    assert run.stderr.endswith(
        "bridge run: error: argument --until-idle: takes seconds, 0 or more (0: stop as soon as "
        f"every source is drained), got {value!r}\n"
    ), run.stderr
    assert "running" not in run.stderr


def test_until_idle_ends_with_what_each_route_did(tmp_path: Path) -> None:
    """30 forwarded, 2 expired and 1 to the error queue on `move`; nothing on `other`."""
    config = sqlite_routes(tmp_path)
    assert bridge("send", "src", "In", "--count", "30", "-c", str(config)).returncode == 0
    short = bridge("send", "src", "In", "--count", "2", "--ttl", "00:00:00.001", "-c", str(config))
    assert short.returncode == 0, short.stderr
    with sqlite3.connect(tmp_path / "a.db") as db:  # a row whose headers cannot be read
        db.execute("INSERT INTO \"In\" (id, headers, body) VALUES ('x', 'not json', x'00')")
    time.sleep(0.05)  # the two short-lived ones expire
    run = bridge("run", "--until-idle", "0.5", "-c", str(config))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 3, run.stdout
    assert re.fullmatch(
        rf"route move: 30 forwarded, 2 expired, 1 to the error queue in {SECONDS}", lines[0]
    ), lines
    assert re.fullmatch(
        rf"route other: 0 forwarded, 0 expired, 0 to the error queue in {SECONDS}", lines[1]
    ), lines
    assert re.fullmatch(
        rf"total: 30 forwarded, 2 expired, 1 to the error queue; ran {SECONDS}", lines[2]
    ), lines
    assert float(lines[2].rsplit(" ", 2)[1]) >= 0.5  # the wait for idle counts in the total


@pytest.mark.slow
def test_until_idle_with_workers_prints_one_summary_for_all_of_them(tmp_path: Path) -> None:
    config = sqlite_routes(tmp_path)
    assert bridge("send", "src", "In", "--count", "3000", "-c", str(config)).returncode == 0
    run = bridge("run", "--workers", "2", "--until-idle", "0", "-c", str(config))
    assert run.returncode == 0, run.stderr
    assert "[worker 0]: every source drained: stopping" in run.stderr, run.stderr
    assert "[worker 1]: every source drained: stopping" in run.stderr, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 3, run.stdout  # the primary's alone: the workers print none
    assert re.fullmatch(
        rf"route move: 3000 forwarded, 0 expired, 0 to the error queue in {SECONDS}", lines[0]
    ), lines
    assert lines[1].startswith("route other: 0 forwarded"), lines
    assert re.fullmatch(
        rf"total: 3000 forwarded, 0 expired, 0 to the error queue; ran {SECONDS}", lines[2]
    ), lines
    assert depth(config, "b", "Out") == 3000
