"""Load routes.yaml: YAML with positions, `${VAR}` / `${VAR:-default}` from the environment,
strict models, then the cross-field rules. Every error is a `ConfigError` located at
`FILE:LINE:COLUMN` (1-based), so a user never sees a traceback. What the models refuse is
reported all at once (`ConfigErrors`, one line each, in file order); the cross-field rules run
on a config the models accept, and stop at the first they find.
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
from pydantic_core import ErrorDetails

from bridge.config.credentials import credential_warnings, is_secret
from bridge.config.lint import (
    connection_warnings,
    lint,
    registry_warnings,
    route_warnings,
)
from bridge.config.models import BridgeConfig
from bridge.errors import ConfigError, ConfigErrors
from bridge.transports import TRANSPORTS

__all__ = ["LoadedConfig", "Positions", "load_config", "parse_config"]

# Every `${...}` in a value; its body must be NAME or NAME:-default (no `}` in a default).
_REFERENCE = re.compile(r"\$\{([^}]*)(\}?)")
_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)

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


#: Values built from one document, counting every alias use: far above any real routes.yaml,
#: far below what "billion laughs" aliases of aliases would expand to.
MAX_VALUES = 100_000
#: Collections inside collections (aliases and merges included); routes.yaml needs about 5.
MAX_DEPTH = 64
_MERGE = "tag:yaml.org,2002:merge"


class _Builder:
    def __init__(self, positions: Positions, env: Mapping[str, str], offline: bool) -> None:
        self.positions = positions
        self.env = env
        self.offline = offline
        self.notes: list[str] = []
        self.used: set[str] = set()
        self.raw: dict[PathKey, str] = {}  # string scalars as written, before ${VAR}
        self.constructor = yaml.SafeLoader("")
        self.built = 0
        self.open: set[int] = set()  # ids of the collections being built: an alias cycle

    def _where(self, node: yaml.Node) -> str:
        line, col = _mark(node)
        return f"{self.positions.file}:{line}:{col}"

    def build(self, node: yaml.Node, path: PathKey) -> Any:
        self.built += 1
        if self.built > MAX_VALUES:
            raise ConfigError(
                f"alias expansion too large: more than {MAX_VALUES:,} values "
                "(aliases repeating aliases)",
                self.positions.at(path[:1], key=True),
            )
        self.positions.values[path] = _mark(node)
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.open:
            raise ConfigError(
                "recursive alias: this value contains itself", self.positions.at(path, key=True)
            )
        if len(self.open) >= MAX_DEPTH:
            raise ConfigError(f"nested too deep: more than {MAX_DEPTH} levels", self._where(node))
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            return [self.build(item, (*path, i)) for i, item in enumerate(node.value)]
        finally:
            self.open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: PathKey) -> dict[str, Any]:
        # `<<` merges by hand (not PyYAML's flatten_mapping, which copies merged lists without
        # limit): keys written here win over merged ones, earlier merged mappings over later.
        merged: dict[str, Any] = {}
        own = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                own.append((key_node, value_node))
                continue
            sources = (
                value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            )
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    raise ConfigError(
                        "`<<` merges a mapping or a list of mappings", self._where(source)
                    )
                for key, value in self.build(source, path).items():
                    merged.setdefault(key, value)
        self.positions.values[path] = _mark(node)
        out: dict[str, Any] = {}
        for key_node, value_node in own:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError("keys must be strings, got a collection", self._where(key_node))
            key = self.constructor.construct_object(key_node)
            if not isinstance(key, str):
                raise ConfigError(f"keys must be strings, got {key!r}", self._where(key_node))
            if key in out:
                if path == ("endpoints",):
                    raise ConfigError(
                        f"endpoint {key!r} is registered twice: an endpoint lives on exactly "
                        "one connection",
                        self._where(key_node),
                    )
                raise ConfigError(f"duplicate key {key!r}", self._where(key_node))
            self.positions.keys[(*path, key)] = _mark(key_node)
            out[key] = self.build(value_node, (*path, key))
        return {**merged, **out}

    def _scalar(self, node: yaml.ScalarNode, path: PathKey) -> Any:
        value = self.constructor.construct_object(node)
        if isinstance(value, str):
            self.raw[path] = value
            if "${" in value:
                return self._expand(value, path)
        return value

    def _expand(self, text: str, path: PathKey) -> str:
        def replace(match: re.Match[str]) -> str:
            body, closed = match.groups()
            where = self.positions.at(path)
            if not closed:
                raise ConfigError(
                    "unterminated ${ (a variable is ${NAME} or ${NAME:-default})", where
                )
            reference = _BODY.fullmatch(body)
            if reference is None:
                # Show the name only, never what follows, and nothing of a credential field's:
                # a literal there may be (part of) a password.
                name = body.partition(":")[0]
                if _BODY.fullmatch(name) is None:
                    shown = "" if is_secret(path) else f" {name!r}"
                    raise ConfigError(
                        f"invalid variable name{shown}: names are letters, digits and _, "
                        "not starting with a digit",
                        where,
                    )
                raise ConfigError(
                    f"invalid variable reference ${{{name}:...}}: use ${{{name}}} or "
                    f"${{{name}:-default}}",
                    where,
                )
            name, default = reference.groups()
            if default is not None and "${" in default:
                raise ConfigError(f"the default of ${{{name}:-...}} cannot hold a ${{...}}", where)
            self.used.add(name)
            value = self.env.get(name)
            if value is None or (value == "" and default is not None):
                if default is None and self.offline and is_secret(path):
                    return self._placeholder(name, path, whole=match.group() == text)
                if default is None:
                    raise ConfigError(
                        f"environment variable {name} is not set (use ${{{name}:-default}} "
                        "for a default)",
                        where,
                    )
                return default
            return value

        return _REFERENCE.sub(replace, text)

    def _placeholder(self, name: str, path: PathKey, *, whole: bool) -> str:
        """What stands for a missing credential when nothing is connected to (never a value)."""
        placeholder = f"<unset-{name}>"
        self.notes.append(
            f"{self.positions.at(path)}: warning: environment variable {name} is not set; "
            f"{placeholder} in its place, as this connects to nothing"
        )
        # The RabbitMQ transport parses its URL as it is built, even to print its plan.
        return f"amqp://{placeholder}/" if whole and path[-1] == "url" else placeholder


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _validation_error(
    exc: ValidationError, positions: Positions, raw: Mapping[PathKey, str]
) -> ConfigError:
    """Every error of `exc`, each at its place, in the order they stand in the file."""
    errors = [_located(error, positions, raw) for error in exc.errors()]
    errors.sort(key=lambda error: _line_col(error.location))
    unique = list({str(error): error for error in errors}.values())
    return unique[0] if len(unique) == 1 else ConfigErrors(unique)


def _line_col(location: str | None) -> tuple[int, int]:
    _, line, col = (location or "::").rsplit(":", 2)
    return (int(line), int(col)) if line.isdigit() and col.isdigit() else (0, 0)


def _located(error: ErrorDetails, positions: Positions, raw: Mapping[PathKey, str]) -> ConfigError:
    loc = tuple(error["loc"])
    # Discriminated unions put the tag into loc ("connections", NAME, "postgresql", ...).
    path = list(loc[:2] + loc[3:]) if loc[:1] == ("connections",) and len(loc) > 2 else list(loc)
    kind = error["type"]
    message = error["msg"]
    shown = _dotted(tuple(path))
    where = positions.at(tuple(path))
    if kind == "extra_forbidden":
        message = f"unknown key {path[-1]!r}"
        where = positions.at(tuple(path), key=True)
    elif kind == "string_too_short" and error.get("ctx", {}).get("min_length") == 1:
        written = raw.get(tuple(path), "")
        message = "must not be empty" + (
            f" (the file has {written!r}: a variable or default was empty)"
            if "${" in written
            else ""
        )
    elif kind == "missing":
        message = f"missing required key {path[-1]!r}"
        shown = _dotted(tuple(path[:-1]))
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = error.get("ctx", {}).get("tag")
        known = ", ".join(TRANSPORTS)
        close = difflib.get_close_matches(str(tag), TRANSPORTS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = (
            f"unknown connection type {tag!r}{hint}; known: {known}"
            if tag is not None
            else f"missing required key 'type' ({known})"
        )
        where = positions.at((*path, "type"))
    return ConfigError(f"{shown}: {message}" if shown else message, where)


def _yaml_error(exc: yaml.MarkedYAMLError, file: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else f"{file}:1:1"
    return ConfigError(f"invalid YAML: {exc.problem or exc.context}", where)


def _too_deep(text: str, file: str) -> str:
    """`FILE:LINE:COL` of the first collection nested deeper than MAX_DEPTH."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            mark = event.start_mark
            if depth > MAX_DEPTH and mark is not None:
                return f"{file}:{mark.line + 1}:{mark.column + 1}"
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return f"{file}:1:1"


def parse_config(
    text: str,
    file: str = "routes.yaml",
    env: Mapping[str, str] | None = None,
    *,
    offline: bool = False,
) -> LoadedConfig:
    """The config in `text`. `offline`: the caller connects to nothing (`install --print-sql`),
    so a missing variable in a credential field (`credentials.SECRET_KEYS`) becomes a
    placeholder and a warning instead of an error; everything else still needs its variables.
    """
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
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(
            f"nested too deep: more than {MAX_DEPTH} levels", _too_deep(text, file)
        ) from None
    if root is None:
        raise ConfigError("the file is empty; it needs `connections` and `routes`", f"{file}:1:1")
    builder = _Builder(positions, os.environ if env is None else env, offline)
    try:
        data = builder.build(root, ())
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, file) from None
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", positions.at(()))
    try:
        config = BridgeConfig.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc, positions, builder.raw) from None
    lint(config, positions)
    warnings = builder.notes + credential_warnings(builder.raw, positions, builder.env)
    warnings += route_warnings(config, positions) + registry_warnings(config, positions)
    warnings += connection_warnings(config, positions)
    return LoadedConfig(config, positions, builder.used, warnings)


def load_config(
    path: str | Path, env: Mapping[str, str] | None = None, *, offline: bool = False
) -> LoadedConfig:
    file = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError("config file not found (use -c FILE)", file) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config: {exc.strerror or exc}", file) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(
            data[data.rfind(b"\n", 0, exc.start) + 1 : exc.start].decode("utf-8", "replace")
        )
        raise ConfigError(
            f"the file is not UTF-8 text (byte 0x{data[exc.start]:02x})",
            f"{file}:{line}:{column + 1}",
        ) from None
    return parse_config(text, file, env, offline=offline)
