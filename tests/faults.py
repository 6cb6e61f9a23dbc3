"""What fault tests share: a `bridge` child process to kill -9 and start again, the kills
timed to cut a stream mid-way, and the delivery report each case ends with, collected for the
table printed at the end of the run (`pytest_terminal_summary` in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.conftest import unique

__all__ = ["REPORTED", "BridgeProcess", "Delivery", "delivery_table", "kill_mid_stream", "report"]


class BridgeProcess:
    """`python -m bridge ARGS -c CONFIG` as a child process: start, kill -9, restart, stop.

    Its stderr goes to `log`, a file next to the config, appended across restarts, so a bridge
    that logs much never blocks on a full pipe. Leaving the `with` block kills it if it still
    runs, so a failed test leaves no bridge behind.
    """

    def __init__(self, config: Path, *args: str, log_level: str = "WARNING") -> None:
        self.command = [sys.executable, "-m", "bridge", *args, "-c", str(config)]
        self.command += ["--log-level", log_level]
        self.log = config.parent / f"{unique('bridge')}.log"
        self.kills = 0
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BridgeProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.running:
            self.kill()

    @property
    def pid(self) -> int:
        return self._started().pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> BridgeProcess:
        assert not self.running, "the bridge runs already"
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=log)
        return self

    def kill(self) -> None:
        """kill -9: no signal handler runs, nothing is finished or committed."""
        process = self._started()
        process.kill()
        process.wait(timeout=30)
        self.kills += 1

    def restart(self) -> BridgeProcess:
        """kill -9 when it runs, then start the same command again."""
        if self.running:
            self.kill()
        return self.start()

    def wait(self, timeout: float = 300) -> int:
        """Wait until it exits on its own (`--until-idle`); its exit code."""
        return self._started().wait(timeout=timeout)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM: it finishes the batches in hand, commits and exits; its exit code."""
        process = self._started()
        process.terminate()
        return process.wait(timeout=timeout)

    def output(self) -> str:
        """Everything it wrote to stderr so far, over every start."""
        return self.log.read_text() if self.log.exists() else ""

    def _started(self) -> subprocess.Popen[bytes]:
        assert self._process is not None, "the bridge was never started"
        return self._process


async def kill_mid_stream(
    bridge: BridgeProcess, delivered: Callable[[], Awaitable[int]], total: int, kills: int
) -> list[int]:
    """Start the route and kill -9 it while messages move, `kills` times; the delivered count
    right after each kill, which must be past 0 and short of `total`.

    The k-th kill comes once the count passed a random point in the k-th of `kills` + 1 equal
    slices of the stream, and this start of the bridge has delivered something itself. So
    at least a slice of the stream is left to move when the kill is due: a stream that moves
    fast still is cut, however late a look at the count comes.
    """
    rng = random.Random(os.getpid())
    at_kills = []
    for k in range(kills):
        target = total * (k + rng.random()) / (kills + 1)
        before = await delivered()
        bridge.restart()  # the first time, a plain start
        deadline = time.monotonic() + 60
        while (count := await delivered()) <= before or count < target:
            assert bridge.running, f"the bridge exited: {bridge.output()}"
            assert time.monotonic() < deadline, f"no progress past {count} of {total}"
            await asyncio.sleep(0.02)
        bridge.kill()
        count = await delivered()
        assert 0 < count < total, f"kill {k + 1} came with {count} of {total} delivered"
        at_kills.append(count)
    assert bridge.kills == len(at_kills) == kills
    return at_kills


@dataclass(frozen=True)
class Delivery:
    """One fault case's count: `lost` must be 0, `duplicated` at most `bound`."""

    case: str
    sent: int
    delivered: int
    lost: int
    duplicated: int
    bound: int


#: Every case reported in this pytest run, in order.
REPORTED: list[Delivery] = []


def report(case: str, sent: set[str], delivered: Collection[str], bound: int) -> None:
    """Count what arrived against what was sent, keep the row for the table, then assert."""
    counts = Counter(delivered)
    row = Delivery(
        case=case,
        sent=len(sent),
        delivered=len(delivered),
        lost=len(sent - counts.keys()),
        duplicated=counts.total() - len(counts),
        bound=bound,
    )
    REPORTED.append(row)
    assert row.lost == 0, f"{case}: lost {row.lost}"
    assert counts.keys() <= sent, f"{case}: delivered ids that were never sent"
    assert row.duplicated <= bound, f"{case}: {row.duplicated} duplicates > {bound} in flight"


def delivery_table(rows: Sequence[Delivery]) -> list[str]:
    """The rows as a plain text table, a header line first."""
    header = ("case", "sent", "delivered", "lost", "duplicated", "bound")
    cells = [header] + [
        (r.case, *(str(n) for n in (r.sent, r.delivered, r.lost, r.duplicated, r.bound)))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]
