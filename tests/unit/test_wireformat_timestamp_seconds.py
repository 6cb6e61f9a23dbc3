"""The fast wire-timestamp reader (TimeSent per message) agrees with the strptime parser."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.nservicebus.wireformat import format_timestamp, parse_timestamp, timestamp_seconds


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)))
def test_timestamp_seconds_is_parse_timestamp(moment: datetime) -> None:
    text = format_timestamp(moment.replace(tzinfo=UTC))
    assert timestamp_seconds(text) == pytest.approx(parse_timestamp(text).timestamp(), abs=1e-6)


@pytest.mark.parametrize(
    "text",
    [
        "2026-02-30 21:56:55:590807 Z",
        "2026-04-29 24:56:55:590807 Z",
        "2026-04-29 21:56:60:590807 Z",
        "2026-04-29T21:56:55.590807Z",
        "",
    ],
)
def test_what_is_not_a_time_sent_raises(text: str) -> None:
    with pytest.raises(ValueError):
        timestamp_seconds(text)


def test_other_forms_the_parser_takes_still_read() -> None:
    assert (
        timestamp_seconds("2026-4-9 1:2:3:5 Z") == parse_timestamp("2026-4-9 1:2:3:5 Z").timestamp()
    )
