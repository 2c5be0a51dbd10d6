"""How the SQLite store writes times as text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import assume, given
from hypothesis import strategies as st

from sinal.store.sqlite import parse_ts, ts

OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
MOMENTS = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=OFFSETS | st.just(UTC)
)


@given(MOMENTS)
def test_ts_is_utc_fixed_width_and_parses_back(when: datetime) -> None:
    text = ts(when)
    assert len(text) == len("2026-11-29T12:00:00.000000Z")
    assert text.endswith("Z")
    assert parse_ts(text) == when


@given(MOMENTS)
def test_ts_writes_what_strftime_wrote(when: datetime) -> None:
    # The text of every time stored before `ts` used `isoformat`: the same, from year 1000
    # on (strftime wrote earlier years unpadded, out of order; no stored time is that old).
    assume(when.astimezone(UTC).year >= 1000)
    assert ts(when) == when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@given(MOMENTS, MOMENTS)
def test_ts_text_order_is_time_order(a: datetime, b: datetime) -> None:
    assert (ts(a) < ts(b)) == (a < b)


def test_ts_writes_a_whole_second_with_its_fraction() -> None:
    assert ts(datetime(2026, 11, 29, 9, 0, tzinfo=timezone(timedelta(hours=-3)))) == (
        "2026-11-29T12:00:00.000000Z"
    )
