"""What fault tests share: a `bridge` child process to kill -9 and start again, and the
delivery report each case ends with, collected for the table printed at the end of the run
(`pytest_terminal_summary` in tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.conftest import unique

__all__ = ["REPORTED", "BridgeProcess", "Delivery", "delivery_table", "report"]


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
