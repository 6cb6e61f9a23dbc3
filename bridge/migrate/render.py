"""`bridge report` output: a table for people (default), JSON, or CSV for spreadsheets.

JSON: `{"connection", "kind", "generated_at" (ISO 8601 UTC), "seconds", "queues": [...]}`,
each queue with the fields of `report.QueueReport`. CSV: one row per figure,
`queue,section,key,value,detail` (`detail` is the message type of a `largest` row).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from bridge.migrate.report import QueueReport, Report

__all__ = ["render"]

_SECTIONS = ("body_size", "size_buckets", "age_seconds", "by_type", "by_intent", "by_endpoint")


def render(report: Report, fmt: str = "table") -> str:
    if fmt == "json":
        return _json(report)
    if fmt == "csv":
        return _csv(report)
    return _table(report)


def _generated(report: Report) -> str:
    return datetime.fromtimestamp(report.generated_at, UTC).isoformat(timespec="seconds")


def _json(report: Report) -> str:
    data = {
        "connection": report.connection,
        "kind": report.kind,
        "generated_at": _generated(report),
        "seconds": round(report.seconds, 3),
        "queues": [asdict(queue) for queue in report.queues],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def _csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("queue", "section", "key", "value", "detail"))
    for q in report.queues:
        for name in ("messages", "expired", "poison"):
            writer.writerow((q.queue, name, "", getattr(q, name), ""))
        for section in _SECTIONS:
            for key, value in getattr(q, section).items():
                writer.writerow((q.queue, section, key, "" if value is None else value, ""))
        for item in q.largest:
            writer.writerow((q.queue, "largest", item["id"], item["size"], item["type"] or ""))
    return out.getvalue()


def _table(report: Report) -> str:
    lines = [
        f"{report.kind} connection {report.connection}, {_generated(report)}"
        f" ({report.seconds:.1f} s)"
    ]
    for q in report.queues:
        lines += ["", *_queue_table(q)]
    return "\n".join(lines) + "\n"


def _queue_table(q: QueueReport) -> list[str]:
    lines = [
        q.queue,
        f"  messages {q.messages}   expired {q.expired}   poison {q.poison}",
    ]
    if not q.messages:
        return lines
    lines.append("  body bytes   " + _stats(q.body_size))
    lines.append("  age seconds  " + _stats(q.age_seconds))
    lines.append("  body sizes   " + "   ".join(f"{k}: {v}" for k, v in q.size_buckets.items()))
    for title, counts in (
        ("by type", q.by_type),
        ("by intent", q.by_intent),
        ("by originating endpoint", q.by_endpoint),
    ):
        lines += _counts(title, counts)
    if q.largest:
        lines.append("  largest")
        width = max(len(str(item["id"])) for item in q.largest)
        for item in q.largest:
            kind = item["type"] or "-"
            lines.append(f"    {item['id']:<{width}}  {item['size']:>10}  {kind}")
    return lines


def _stats(values: dict[str, Any]) -> str:
    return "  ".join(f"{name} {_number(value)}" for name, value in values.items())


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _counts(title: str, counts: dict[str, int]) -> list[str]:
    if not counts:
        return []
    width = max(len(key) for key in counts)
    return [f"  {title}", *(f"    {key:<{width}}  {value:>8}" for key, value in counts.items())]
