"""The local RabbitMQ's management HTTP API, called as an operator's script would call it
(guest is an administrator on the test broker)."""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any

__all__ = ["MANAGEMENT", "api"]

MANAGEMENT = "http://127.0.0.1:15672/api/"


def api(method: str, path: str, body: object = None) -> Any:
    """`method` on `MANAGEMENT + path` with `body` as JSON; the JSON answer, or None."""
    request = urllib.request.Request(
        MANAGEMENT + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read()
    return json.loads(text) if text else None
