"""Load routes.yaml: YAML with positions, `${VAR}` / `${VAR:-default}` from the environment,
strict models, then the cross-field rules. Every error is a `ConfigError` located at
`FILE:LINE:COLUMN` (1-based), so a user never sees a traceback.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bridge.config.lint import credential_warnings, lint
from bridge.config.models import BridgeConfig
from bridge.errors import ConfigError
from bridge.transports import TRANSPORTS

__all__ = ["LoadedConfig", "Positions", "load_config", "parse_config"]

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

PathKey = tuple[str | int, ...]


@dataclass
class Positions:
    """Where each value (and each mapping key) of the document stands."""

    file: str
    values: dict[PathKey, tuple[int, int]] = field(default_factory=dict)
    keys: dict[PathKey, tuple[int, int]] = field(default_factory=dict)

    def at(self, path: PathKey, *, key: bool = False) -> str:
        """`FILE:LINE:COL` of the deepest known prefix of `path`."""
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            if key and end == len(path) and prefix in self.keys:
                line, col = self.keys[prefix]
                break
            if prefix in self.values:
                line, col = self.values[prefix]
                break
        else:
            line, col = 1, 1
        return f"{self.file}:{line}:{col}"


@dataclass
class LoadedConfig:
    config: BridgeConfig
    positions: Positions
    #: names of environment variables the file used: their values are secrets to redact
    variables: set[str] = field(default_factory=set)
    #: `FILE:LINE:COL: warning: ...` lines for things that work but should not be so
    warnings: list[str] = field(default_factory=list)


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


class _Builder:
    def __init__(self, positions: Positions, env: Mapping[str, str]) -> None:
        self.positions = positions
        self.env = env
        self.used: set[str] = set()
        self.raw: dict[PathKey, str] = {}  # string scalars as written, before ${VAR}
        self.constructor = yaml.SafeLoader("")

    def build(self, node: yaml.Node, path: PathKey) -> Any:
        self.positions.values[path] = _mark(node)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            self.constructor.flatten_mapping(node)
            for key_node, value_node in node.value:
                key = self.constructor.construct_object(key_node)
                if not isinstance(key, str):
                    raise ConfigError(
                        f"keys must be strings, got {key!r}",
                        f"{self.positions.file}:{_mark(key_node)[0]}:{_mark(key_node)[1]}",
                    )
                if key in out:
                    line, col = _mark(key_node)
                    where = f"{self.positions.file}:{line}:{col}"
                    raise ConfigError(f"duplicate key {key!r}", where)
                self.positions.keys[(*path, key)] = _mark(key_node)
                out[key] = self.build(value_node, (*path, key))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        value = self.constructor.construct_object(node)
        if isinstance(value, str):
            self.raw[path] = value
            if "${" in value:
                return self._expand(value, path)
        return value

    def _expand(self, text: str, path: PathKey) -> str:
        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            self.used.add(name)
            value = self.env.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    raise ConfigError(
                        f"environment variable {name} is not set (use ${{{name}:-default}} "
                        "for a default)",
                        self.positions.at(path),
                    )
                return default
            return value

        return _VAR.sub(replace, text)


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validation_error(exc: ValidationError, positions: Positions) -> ConfigError:
    first = exc.errors()[0]
    loc = tuple(first["loc"])
    # Discriminated unions put the tag into loc ("connections", NAME, "postgresql", ...).
    path = list(loc[:2] + loc[3:]) if loc[:1] == ("connections",) and len(loc) > 2 else list(loc)
    kind = first["type"]
    message = first["msg"]
    shown = _dotted(tuple(path))
    where = positions.at(tuple(path))
    if kind == "extra_forbidden":
        message = f"unknown key {path[-1]!r}"
        where = positions.at(tuple(path), key=True)
    elif kind == "missing":
        message = f"missing required key {path[-1]!r}"
        shown = _dotted(tuple(path[:-1]))
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = first.get("ctx", {}).get("tag")
        known = ", ".join(TRANSPORTS)
        close = difflib.get_close_matches(str(tag), TRANSPORTS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = (
            f"unknown connection type {tag!r}{hint}; known: {known}"
            if tag is not None
            else f"missing required key 'type' ({known})"
        )
        where = positions.at((*path, "type"))
    more = len(exc.errors()) - 1
    suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    return ConfigError(f"{shown}: {message}{suffix}" if shown else message + suffix, where)


def _yaml_error(exc: yaml.MarkedYAMLError, file: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else f"{file}:1:1"
    return ConfigError(f"invalid YAML: {exc.problem or exc.context}", where)


def parse_config(
    text: str, file: str = "routes.yaml", env: Mapping[str, str] | None = None
) -> LoadedConfig:
    positions = Positions(file)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, file) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        raise ConfigError(
            f"invalid YAML: character {character!r} is not allowed", f"{file}:{line}:{column}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", f"{file}:1:1") from None
    if root is None:
        raise ConfigError("the file is empty; it needs `connections` and `routes`", f"{file}:1:1")
    builder = _Builder(positions, os.environ if env is None else env)
    try:
        data = builder.build(root, ())
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, file) from None
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", positions.at(()))
    try:
        config = BridgeConfig.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, positions) from None
    lint(config, positions)
    warnings = credential_warnings(builder.raw, positions)
    return LoadedConfig(config, positions, builder.used, warnings)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> LoadedConfig:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("config file not found (use -c FILE)", file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config: {exc}", file) from None
    return parse_config(text, file, env)
