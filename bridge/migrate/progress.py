"""What `bridge migrate` and `bridge report` show while Spark starts and works, and Ctrl-C.

Status line
    On a terminal (stderr a TTY, TERM not `dumb`) one line on stderr, redrawn a few times a
    second: what is happening (starting Spark, moving, reading), counts out of the total, the
    rate, the time left, Spark's stage and its tasks finished, the seconds so far. Log lines
    written meanwhile clear it first and it is drawn again under them; it is erased before
    the command prints its result. Elsewhere (a pipe, a file, a CI log) nothing is drawn:
    `bridge migrate` logs a progress line every few seconds instead.

Ctrl-C
    The command's Spark jobs run in a thread, under a job group (`interruptible`). Ctrl-C
    cancels the command's asyncio task; the job group is cancelled, its tasks stop (a task's
    batch in flight is rolled back at its source, as after any failed task), and `Interrupted`
    tells the command, which says what was done and exits 130.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from bridge.errors import BridgeError

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = [
    "Interrupted",
    "StatusLine",
    "describe_stages",
    "duration",
    "interruptible",
    "job_group",
]

T = TypeVar("T")

#: Seconds between two redraws of the status line.
TICK = 0.25
#: Seconds a cancelled job's tasks get to stop before the command goes on without them.
GRACE = 30.0


class Interrupted(BridgeError):
    """Ctrl-C stopped the command's Spark jobs (they were cancelled and have stopped)."""


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def duration(seconds: float) -> str:
    """`7s`, `3m05s`, `1h02m`: short, for the status line."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class StatusLine:
    """One line on a terminal, redrawn from `render()` every TICK seconds by a thread of its
    own (see the module docstring); does nothing when the stream is not a terminal."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self._render: Callable[[], str] = lambda: ""
        self._lock = threading.Lock()
        self._drawn = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []

    def show(self, render: Callable[[], str]) -> None:
        """Draw `render()` from now on (the first call starts the drawing)."""
        self._render = render
        if not self.enabled or self._thread is not None:
            return
        self._interleave_logs()
        self._thread = threading.Thread(target=self._run, name="bridge-status", daemon=True)
        self._thread.start()

    def starting(self, what: str, master: str | None, began: float) -> None:
        """`<what>: starting Spark on <master>, 5s` until the job shows its own progress."""
        where = master or "the master spark-submit gives"
        self.show(
            lambda: f"{what}: starting Spark on {where}, {duration(time.monotonic() - began)}"
        )

    def close(self) -> None:
        """Stop drawing and erase the line; the stream is the command's again."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        with self._lock:
            self._erase()
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers.clear()

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            self._draw()

    def _draw(self) -> None:
        try:
            text = self._render()
        except Exception:  # Spark or the database mid-way: the next tick tries again
            return
        width = _width(self.stream)
        with self._lock:
            self.stream.write("\r" + text[: width - 1] + "\x1b[K")
            self.stream.flush()
            self._drawn = bool(text)

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _interleave_logs(self) -> None:
        """Log handlers writing to this stream erase the line before each record."""
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self.stream:
                self._handlers.append((handler, handler.setStream(_Erasing(self))))

    def write_through(self, text: str) -> None:
        with self._lock:
            self._erase()
            self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


class _Erasing:
    """The stream a log handler writes to while the status line is shown."""

    def __init__(self, line: StatusLine) -> None:
        self._line = line

    def write(self, text: str) -> None:
        self._line.write_through(text)

    def flush(self) -> None:
        self._line.flush()


def _width(stream: TextIO) -> int:
    """The terminal's columns (100 when it does not say: a pseudo-terminal without a size)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        columns = 0
    return columns if columns > 0 else 100


def job_group() -> str:
    return f"bridge-{uuid.uuid4().hex[:12]}"


@dataclass
class Stages:
    """Spark's view of a job group: the stage running now (the one with the most tasks
    running) and the tasks of the stages that ran, finished and all."""

    stage: int | None = None
    finished: int = 0
    tasks: int = 0
    stage_finished: int = 0
    stage_tasks: int = 0


def stages_of(sc: SparkContext, group: str) -> Stages:
    """Read the status tracker for `group` (best effort: a finished job may be gone). A stage
    Spark skips (its output is cached) never runs and is left out."""
    tracker = sc.statusTracker()
    active = set(tracker.getActiveStageIds())
    out = Stages()
    running = -1
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        for stage_id in info.stageIds if info is not None else ():
            stage = tracker.getStageInfo(stage_id)
            if stage is None or not (stage_id in active or stage.numCompletedTasks):
                continue
            out.finished += stage.numCompletedTasks
            out.tasks += stage.numTasks
            if stage_id in active and stage.numActiveTasks > running:
                running = stage.numActiveTasks
                out.stage = stage_id
                out.stage_finished = stage.numCompletedTasks
                out.stage_tasks = stage.numTasks
    return out


def describe_stages(stages: Stages) -> str:
    if stages.stage is None:
        return f"tasks {stages.finished}/{stages.tasks}" if stages.tasks else "waiting for Spark"
    return f"stage {stages.stage}: tasks {stages.stage_finished}/{stages.stage_tasks}"


async def interruptible(
    sc: SparkContext,
    group: str,
    description: str,
    work: Callable[[], T],
    *,
    every: float | None = None,
    tick: Callable[[float], Any] | None = None,
) -> T:
    """Run `work` (Spark actions) in a thread under job group `group` and return its result.

    `tick(elapsed)` (a coroutine function) runs every `every` seconds while the jobs run. When
    the calling task is cancelled (Ctrl-C), the group's jobs are cancelled, their tasks are
    given GRACE seconds to stop, and Interrupted is raised.
    """

    def run() -> T:
        sc.setJobGroup(group, description, interruptOnCancel=False)
        return work()

    started = time.monotonic()
    job = asyncio.ensure_future(asyncio.to_thread(run))
    try:
        while True:
            done, _ = await asyncio.wait({job}, timeout=every)
            if done:
                return job.result()
            if tick is not None:
                await tick(time.monotonic() - started)
    except asyncio.CancelledError:
        sc.cancelJobGroup(group)
        await asyncio.wait({job}, timeout=GRACE)
        if job.done() and not job.cancelled():
            job.exception()  # retrieved: the cancelled job's error is the interruption's
        raise Interrupted(f"interrupted after {duration(time.monotonic() - started)}") from None
