"""Whatever the file holds, loading it gives a config or a located ConfigError: no traceback."""

from __future__ import annotations

import re

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.config.loader import parse_config
from bridge.errors import ConfigError
from tests.unit.test_config import ENV, GOOD

LOCATION = re.compile(r"^routes\.yaml:\d+:\d+: ")

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


def load_or_located_error(text: str) -> None:
    try:
        parse_config(text, "routes.yaml", ENV)
    except ConfigError as exc:
        assert LOCATION.match(str(exc)), str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_any_text(text: str) -> None:
    load_or_located_error(text)


@settings(max_examples=300, deadline=None)
@given(documents)
def test_any_yaml_document(document: object) -> None:
    load_or_located_error(yaml.safe_dump(document))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(GOOD) - 1), st.integers(0, 8), st.text(max_size=3))
def test_edits_of_a_good_file(at: int, cut: int, insert: str) -> None:
    load_or_located_error(GOOD[:at] + insert + GOOD[at + cut :])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["connections", "routes", "from", "to", "batch_size", "type"]), documents)
def test_a_key_replaced_by_anything(key: str, value: object) -> None:
    data = yaml.safe_load(GOOD)
    if key in ("connections", "routes"):
        data[key] = value
    elif key == "type":
        data["connections"]["local"]["type"] = value
    else:
        data["routes"][0][key] = value
    load_or_located_error(yaml.safe_dump(data))


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.booleans())
def test_aliases_of_aliases(width: int, depth: int, merge: bool) -> None:
    """Any fan-out of aliases (lists or `<<` merges) loads or stops at the budget, quickly."""
    lines = ["connections: {}", "l0: &l0 {x: 1}"]
    for i in range(1, depth + 1):
        refs = ", ".join([f"*l{i - 1}"] * width)
        lines.append(f"l{i}: &l{i} " + (f"{{<<: [{refs}]}}" if merge else f"[{refs}]"))
    load_or_located_error("\n".join(lines))


@given(st.sampled_from(["&a [*a]", "&a {k: *a}", "&a {<<: *a}", "&a [{k: [*a]}]"]))
def test_recursive_aliases(value: str) -> None:
    load_or_located_error(f"connections: {{}}\nx: {value}\n")
