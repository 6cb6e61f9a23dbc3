"""`bridge ...` run as users run it: a process of its own, its output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["run_bridge"]


def run_bridge(
    *args: str,
    config: Path | None = None,
    check: bool = True,
    timeout: float = 180,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m bridge ARGS [-c CONFIG]`; never a traceback, and with `check` exit code 0
    (the assertion shows both outputs)."""
    command = [sys.executable, "-m", "bridge", *args]
    if config is not None:
        command += ["-c", str(config)]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    if check:
        assert result.returncode == 0, output
    return result
