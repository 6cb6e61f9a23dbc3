"""NServiceBus timestamps (`yyyy-MM-dd HH:mm:ss:ffffff Z`) and .NET TimeSpans, both ways."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridge.nservicebus.wireformat import (
    format_timespan,
    format_timestamp,
    parse_timespan,
    parse_timestamp,
)

SPEC_MOMENT = datetime(2026, 4, 29, 21, 56, 55, 590807, tzinfo=UTC)


class TestTimestamp:
    def test_format_is_exactly_the_nservicebus_one(self) -> None:
        assert format_timestamp(SPEC_MOMENT) == "2026-04-29 21:56:55:590807 Z"

    def test_parse_gives_an_aware_utc_datetime(self) -> None:
        parsed = parse_timestamp("2026-04-29 21:56:55:590807 Z")
        assert parsed == SPEC_MOMENT
        assert parsed.tzinfo is UTC

    def test_other_time_zones_are_written_in_utc(self) -> None:
        cest = SPEC_MOMENT.astimezone(timezone(timedelta(hours=2)))
        assert format_timestamp(cest) == "2026-04-29 21:56:55:590807 Z"

    def test_whole_seconds_keep_six_zero_digits(self) -> None:
        moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        assert format_timestamp(moment) == "2026-01-02 03:04:05:000000 Z"

    def test_years_before_1000_are_four_digits_as_dotnet_writes_them(self) -> None:
        minimum = datetime(1, 1, 1, tzinfo=UTC)
        assert format_timestamp(minimum) == "0001-01-01 00:00:00:000000 Z"
        assert parse_timestamp("0001-01-01 00:00:00:000000 Z") == minimum

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "2026-04-29T21:56:55.590807Z",
            "2026-04-29 21:56:55.590807 Z",
            "2026-04-29 21:56:55:590807",
            "2026-04-29 21:56:55:590807Z",
            "2026-13-01 00:00:00:000000 Z",
            "2026-04-29 24:00:00:000000 Z",
            "not a timestamp",
        ],
    )
    def test_parse_rejects_other_forms(self, text: str) -> None:
        with pytest.raises(ValueError):
            parse_timestamp(text)

    @given(st.datetimes(timezones=st.just(UTC)))
    def test_round_trip(self, moment: datetime) -> None:
        text = format_timestamp(moment)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{6} Z", text)
        assert parse_timestamp(text) == moment


# (span, text): each is the other's only form, so they are checked in both directions.
TIMESPANS = [
    (timedelta(0), "00:00:00"),
    (timedelta(seconds=10), "00:00:10"),
    (timedelta(days=1), "1.00:00:00"),
    (timedelta(seconds=1.5), "00:00:01.5000000"),
    (timedelta(hours=23, minutes=59, seconds=59), "23:59:59"),
    (timedelta(days=12, hours=3, minutes=4, seconds=5, microseconds=6), "12.03:04:05.0000060"),
    (timedelta(microseconds=1), "00:00:00.0000010"),
    (timedelta(seconds=-10), "-00:00:10"),
    (timedelta(microseconds=-1), "-00:00:00.0000010"),
    (-timedelta(days=2, hours=1, seconds=0.25), "-2.01:00:00.2500000"),
]


class TestTimeSpan:
    @pytest.mark.parametrize(("span", "text"), TIMESPANS, ids=[text for _, text in TIMESPANS])
    def test_format(self, span: timedelta, text: str) -> None:
        assert format_timespan(span) == text

    @pytest.mark.parametrize(("span", "text"), TIMESPANS, ids=[text for _, text in TIMESPANS])
    def test_parse(self, span: timedelta, text: str) -> None:
        assert parse_timespan(text) == span

    @pytest.mark.parametrize(
        ("text", "span"),
        [
            ("00:00:01.5", timedelta(seconds=1.5)),
            ("1:2:3", timedelta(hours=1, minutes=2, seconds=3)),
            (" 00:00:10 ", timedelta(seconds=10)),
            ("00:00:00.0000001", timedelta(0)),  # below a microsecond: truncated
            ("-00:00:00.0000015", timedelta(microseconds=-1)),
            ("-0.00:00:00", timedelta(0)),
        ],
    )
    def test_parse_other_valid_forms(self, text: str, span: timedelta) -> None:
        assert parse_timespan(text) == span

    @pytest.mark.parametrize(
        "text",
        [
            "",
            "10",
            "00:10",
            "abc",
            "24:00:00",
            "00:60:00",
            "00:00:60",
            "00:00:01.12345678",
            "00:00:01.",
            "+00:00:10",
            "--00:00:10",
            "1.2.00:00:00",
            "00:00:10 Z",
            "\u0661\u0660:00:00",  # Arabic-Indic digits: .NET reads ASCII digits only
        ],
    )
    def test_parse_rejects_other_forms(self, text: str) -> None:
        with pytest.raises(ValueError):
            parse_timespan(text)

    @given(st.timedeltas())
    def test_round_trip_at_microsecond_precision(self, span: timedelta) -> None:
        # .NET ticks are 100 ns; timedelta holds whole microseconds, so every value survives.
        text = format_timespan(span)
        assert re.fullmatch(r"-?(\d+\.)?\d\d:\d\d:\d\d(\.\d{6}0)?", text)
        assert parse_timespan(text) == span
