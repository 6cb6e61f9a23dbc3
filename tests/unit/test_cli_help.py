"""`bridge --help` and each command's: every option and argument says what it is for."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from bridge.cli import _parser


def _parsers(
    parser: argparse.ArgumentParser, name: str = "bridge"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {command}")


def test_every_option_and_argument_of_every_command_has_a_help_text() -> None:
    missing = []
    walked = []
    for name, parser in _parsers(_parser()):
        walked.append(name)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                listed = {choice.dest: choice.help for choice in action._choices_actions}
                missing += [f"{name} {cmd}" for cmd in action.choices if not listed.get(cmd)]
            elif not action.help:  # argparse.SUPPRESS (hidden) is a help text too
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert "bridge send" in walked and "bridge migrate" in walked
    assert missing == []
