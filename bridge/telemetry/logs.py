"""Logging set-up: plain text for people, one JSON object per line for collectors.

Route state changes and errors are logged; single messages never are at INFO. Every record
passes the redactor first, so secrets never reach a log line. Below DEBUG no line carries a
traceback: the drivers' own records (aiokafka, pika) are cut to their first line, and pika's,
which repeat each connection failure the route already logs with its cause and retry (a dozen
ERROR lines and two stack dumps per reconnect attempt), are shown only from CRITICAL.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from bridge.telemetry.redact import install_log_filter

__all__ = ["JsonFormatter", "OneLine", "setup_logging"]

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_text:
            data["exception"] = record.exc_text
        elif record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class OneLine(logging.Filter):
    """Records of loggers outside `bridge` become one line: no traceback, no stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "bridge" or record.name.startswith("bridge."):
            return True
        message = record.getMessage()
        record.msg, record.args = message.split("\n", 1)[0].rstrip(), None
        record.exc_info = record.exc_text = record.stack_info = None
        return True


class _Worker(logging.Filter):
    """Every record of a worker of `bridge run --workers N` carries its index."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.index
        return True


def setup_logging(level: str = "INFO", fmt: str = "text", worker: int | None = None) -> None:
    """`worker`: the index of a worker process; its lines say which one wrote them."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        where = "%(name)s" if worker is None else "%(name)s[worker %(worker)s]"
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {where}: %(message)s"))
    if worker is not None:
        handler.addFilter(_Worker(worker))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("aiokafka", "kafka", "asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    logging.getLogger("pika").setLevel(
        logging.DEBUG if root.level <= logging.DEBUG else logging.CRITICAL
    )
    if root.level > logging.DEBUG:
        handler.addFilter(OneLine())
    install_log_filter(root)
