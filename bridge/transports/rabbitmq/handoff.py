"""Results handed from pika's ioloop thread to the event loop: `Done` settles a future once.

An `Op` runs on the ioloop thread with the channel, its epoch and a `Done`; it settles the
`Done` when the broker answered. `Calls` are a session's calls not settled yet, so that a lost
connection can fail every one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pika

__all__ = ["Calls", "Done", "Op"]


class Calls:
    """The calls of one session: `outstanding` were submitted, `running` began on a channel."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outstanding: set[Done] = set()  # under `lock`: the event loop adds, any thread ends
        self.running: set[Done] = set()  # the ioloop thread's own


class Done:
    """Settles one asyncio future from any thread, once."""

    __slots__ = ("_calls", "_loop", "future", "settled")

    def __init__(self, calls: Calls, loop: asyncio.AbstractEventLoop) -> None:
        self._calls = calls
        self._loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.settled = False

    def ok(self, value: Any = None) -> None:
        if self._finish():
            self._post(self._set_result, value)

    def fail(self, error: BaseException) -> None:
        if self._finish():
            self._post(self._set_exception, error)

    def _finish(self) -> bool:
        with self._calls.lock:
            if self.settled:
                return False
            self.settled = True
            self._calls.outstanding.discard(self)
        self._calls.running.discard(self)
        return True

    def _post(self, setter: Callable[[Any], None], value: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits
            self._loop.call_soon_threadsafe(setter, value)

    def _set_result(self, value: Any) -> None:
        if not self.future.done():
            self.future.set_result(value)

    def _set_exception(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


Op = Callable[[pika.channel.Channel, int, Done], None]
