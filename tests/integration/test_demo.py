"""The README's first command: the demo moves every message SQLite -> Kafka -> SQLite intact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_the_demo_moves_every_message_unchanged(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--count", "500", "--workdir", str(tmp_path)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Traceback" not in out + result.stderr
    assert (
        "every MessageId sent arrived once with its body unchanged: True "
        "(500 sent, 500 arrived, 500 distinct)" in out
    )
    # TimeToBeReceived arrives as the endpoint wrote it; the lifetime left crossed in Kafka's
    # deadline header, which is the transport's, not a header of the message
    before, _, after = out.partition("the same message in SalesCopy")
    assert "NServiceBus.TimeToBeReceived: 01:00:00\n" in before
    assert "NServiceBus.TimeToBeReceived: 01:00:00\n" in after
    assert "NServiceBus.Bridge.ExpiresAt" not in out
