"""Everything the models refuse in routes.yaml is reported at once, each at its FILE:LINE:COL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bridge.config.loader import parse_config
from bridge.errors import ConfigError, ConfigErrors

FOUR_MISTAKES = textwrap.dedent(
    """\
    connections:
      local: {type: sqlite, path: ./a.db, colour: red}
      other: {type: sqlite}
      pg: {type: postgresq, dsn: x}
    routes:
      - name: a-to-b
        from: {connection: local, queue: Sales}
        to:   {connection: other, queue: Sales}
        batch_size: -3
    """
)
EXPECTED = [
    "routes.yaml:2:39: connections.local.colour: unknown key 'colour'",
    "routes.yaml:3:10: connections.other: missing required key 'path'",
    "routes.yaml:4:14: connections.pg: unknown connection type 'postgresq' (did you mean "
    "'postgresql'?); known: sqlite, postgresql, sqlserver, kafka, rabbitmq",
    "routes.yaml:9:17: routes[0].batch_size: Input should be greater than 0",
]


def test_every_model_error_is_reported_in_file_order_each_at_its_place() -> None:
    with pytest.raises(ConfigErrors) as info:
        parse_config(FOUR_MISTAKES, "routes.yaml", {})
    assert [str(error) for error in info.value.errors] == EXPECTED
    assert str(info.value) == "\n".join(EXPECTED)
    # Still a ConfigError, located at the first: what callers of one error rely on.
    assert info.value.location == "routes.yaml:2:39"


def test_one_error_is_a_plain_config_error() -> None:
    text = "connections:\n  other: {type: sqlite}\nroutes: []\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "r.yaml", {})
    assert not isinstance(info.value, ConfigErrors)
    assert str(info.value) == "r.yaml:2:10: connections.other: missing required key 'path'"


def test_bridge_check_prints_them_all_and_exits_2(tmp_path: Path) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text(FOUR_MISTAKES)
    result = subprocess.run(
        [sys.executable, "-m", "bridge", "check", "-c", "routes.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == EXPECTED
    assert "more error" not in result.stderr and result.stdout == ""
