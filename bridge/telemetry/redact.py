"""Keep secrets out of logs, errors and command output.

Two layers: patterns that hide passwords wherever they appear in a DSN, URL or ODBC string,
and an explicit set of secret values (passwords found in the loaded config) replaced verbatim.
`install_log_filter` applies both to every log record.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["Redactor", "install_log_filter", "redactor"]

MASK = "***"
_PATTERNS = [
    # scheme://user:password@host
    (re.compile(r"(?P<pre>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<secret>[^@\s]+)(?=@)"), ""),
    # password=... in libpq key/value strings, PWD=...; in ODBC strings (braced or bare)
    (
        re.compile(
            r"(?P<pre>\b(?:password|pwd|sasl_password|secret|token)\s*=\s*)"
            r"(?P<secret>\{[^}]*\}|'[^']*'|[^;\s&]+)",
            re.IGNORECASE,
        ),
        "",
    ),
]


class Redactor:
    def __init__(self) -> None:
        self._secrets: set[str] = set()

    def add(self, values: Iterable[str | None]) -> None:
        self._secrets.update(v for v in values if v and len(v) >= 3)

    def add_from_dsn(self, dsn: str) -> None:
        """Remember the password inside a URL or key=value connection string."""
        try:
            password = urlsplit(dsn).password
        except ValueError:
            password = None
        self.add([password])
        for pattern, _ in _PATTERNS[1:]:
            self.add(m.group("secret").strip("{}'") for m in pattern.finditer(dsn))

    def __call__(self, text: str) -> str:
        for pattern, _ in _PATTERNS:
            text = pattern.sub(lambda m: m.group("pre") + MASK, text)
        for secret in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text


#: The process-wide redactor the CLI fills from the loaded config.
redactor = Redactor()


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redactor(message)
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redactor(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        return True


def install_log_filter(logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger()
    for handler in target.handlers:
        handler.addFilter(_RedactFilter())
