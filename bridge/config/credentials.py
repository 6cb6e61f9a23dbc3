"""Credentials in routes.yaml: the fields that may hold one, and the warnings for a credential
written where it would be read (a literal password, a default in `${VAR:-...}`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from bridge.config.loader import Positions


__all__ = ["SECRET_KEYS", "credential_warnings", "is_secret"]


#: Connection fields that may hold a credential; nothing else in routes.yaml may.
SECRET_KEYS = ("dsn", "url", "management_url", "sasl_password")


_KEY_VALUE_SECRET = re.compile(
    r"\b(?:password|pwd)\s*=\s*(?P<value>\{[^}]*\}|'[^']*'|[^;\s&]+)", re.I
)


_VARIABLE = re.compile(r"\$\{[^}]*\}")


_DEFAULT = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}")


def _defaults_used(raw: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """`raw` as the loader uses it, secrets aside: each `${VAR:-default}` becomes its default
    where VAR is unset or empty (the loader then uses the default), else `${VAR}` (the value
    comes from the environment); and the names of the variables whose defaults are used."""
    used: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name, default = match.groups()
        if env.get(name):
            return f"${{{name}}}"
        used.append(name)
        return default

    return _DEFAULT.sub(replace, raw), used


def _holds_password(text: str, key: str) -> bool:
    if key == "sasl_password":
        return bool(text) and not _VARIABLE.fullmatch(text.strip())
    try:
        password = urlsplit(text).password
    except ValueError:
        password = None
    found = [password] if password else []
    found += [m.group("value") for m in _KEY_VALUE_SECRET.finditer(text)]
    return any(value and not _VARIABLE.search(value) for value in found)


def is_secret(path: tuple[str | int, ...]) -> bool:
    """Whether the value at `path` is a connection field that may hold a credential."""
    return len(path) == 3 and path[0] == "connections" and path[2] in SECRET_KEYS


def credential_warnings(
    raw: dict[tuple[str | int, ...], str], at: Positions, env: Mapping[str, str]
) -> list[str]:
    """Credentials written into the file instead of taken from the environment: a literal
    password, or one in the default of a `${VAR:-default}` that is in use (VAR is not set in
    `env`). A default the environment overrides is not used, so it is not warned about: a
    local default such as RabbitMQ's guest:guest is harmless where the variable is set."""
    out = []
    for path, value in raw.items():
        if not is_secret(path):
            continue
        key = str(path[2])
        text, defaults = _defaults_used(value, env)
        if not _holds_password(text, key):
            continue
        where = f"{at.at(path)}: warning: connection {path[1]!r} has a password written in "
        written = _DEFAULT.sub(lambda match: f"${{{match.group(1)}}}", value)  # defaults aside
        if defaults and not _holds_password(written, key):
            names = ", ".join(defaults)
            out.append(
                f"{where}the default of `{key}`, used because {names} is not set; set {names}, "
                "or use ${VAR} and keep secrets in the environment"
            )
        else:
            out.append(f"{where}`{key}`; use ${{VAR}} and keep secrets in the environment")
    return out
