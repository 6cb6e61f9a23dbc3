"""Logs: one JSON object per line when asked, and never a secret, in text or traceback."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from bridge.telemetry.logs import setup_logging
from bridge.telemetry.redact import Redactor, redactor


@pytest.fixture
def root_logger() -> Iterator[None]:
    """setup_logging owns the root logger in a process; give the test run its own back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.usefixtures("root_logger")
def test_json_lines_with_secrets_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    redactor.add_from_dsn("Driver=FreeTDS;Server=db;UID=sa;PWD={hunter2};")
    setup_logging("INFO", "json")
    log = logging.getLogger("bridge.test")
    log.info("route %s: state %s", "sales", "running")
    log.warning("cannot reach postgresql://app:pa55word@db/shop (PWD=hunter2)")
    try:
        raise RuntimeError("login failed for amqp://guest:guest@rabbit/%2F")
    except RuntimeError:
        log.exception("failed")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["message"] == "route sales: state running"
    assert lines[0]["level"] == "info" and lines[0]["logger"] == "bridge.test"
    everything = json.dumps(lines)
    for secret in ("pa55word", "hunter2", "guest@"):
        assert secret not in everything
    assert "postgresql://app:***@db/shop" in lines[1]["message"]
    assert "RuntimeError" in lines[2]["exception"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amqps://user:p%40ss@h:5671/v", "amqps://user:***@h:5671/v"),
        ("host=db password='a b' user=x", "host=db password=*** user=x"),
        ("Server=db;Pwd=s3cr3t;UID=sa", "Server=db;Pwd=***;UID=sa"),
        ("sasl_password=abc", "sasl_password=***"),
        ("nothing secret here", "nothing secret here"),
    ],
)
def test_patterns(text: str, expected: str) -> None:
    assert Redactor()(text) == expected


@pytest.mark.usefixtures("root_logger")
def test_driver_records_are_one_line_without_tracebacks(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "text")
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        # what pika logs when a broker goes away: ERROR, its own stack text, and exc_info
        logging.getLogger("pika.adapters.utils.io_services_utils").exception(
            "_produce() failed; Caller's stack:\n%s", "Traceback (most recent call last): ..."
        )
        logging.getLogger("aiokafka.conn").exception("Unable connect to %s\nmore", "node 1")
        logging.getLogger("bridge.route").exception("route sales: unexpected")
    err = capsys.readouterr().err
    assert "pika" not in err  # the route logs the failure itself, with its retry
    assert "ERROR aiokafka.conn: Unable connect to node 1\n" in err
    assert "more" not in err
    head, _, trace = err.partition("ERROR bridge.route: route sales: unexpected\n")
    assert "Traceback" not in head and trace.startswith("Traceback")


@pytest.mark.usefixtures("root_logger")
def test_debug_keeps_every_driver_line(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("DEBUG", "text")
    logging.getLogger("pika.connection").error("first\nsecond")
    assert "ERROR pika.connection: first\nsecond" in capsys.readouterr().err
