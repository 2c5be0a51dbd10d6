"""Retry delays: exponential backoff with jitter, bounded, repeatable with a seed."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinal.automations.backoff import (
    RetryPolicy,
    delay_ceiling,
    honour_retry_after,
    is_exhausted,
    next_delay,
    parse_retry_after,
)


class Fixed:
    """A jitter source that always draws the same number."""

    def __init__(self, draw: float) -> None:
        self.draw = draw

    def random(self) -> float:
        return self.draw


@pytest.mark.parametrize(
    ("attempt", "kwargs", "ceiling"),
    [
        (1, {}, 10.0),
        (2, {}, 20.0),
        (3, {}, 40.0),
        (12, {}, 20_480.0),
        (13, {}, 21_600.0),  # 40960 capped at 6 h
        (10_000, {}, 21_600.0),  # 2.0 ** 9999 overflows a float: the cap applies
        (3, {"base": 0.5, "factor": 3.0}, 4.5),
        (5, {"factor": 1.0}, 10.0),  # constant backoff
        (4, {"base": 10.0, "cap": 60.0}, 60.0),
        (1, {"base": 5.0, "cap": 2.0}, 2.0),
        (3, {"cap": 0.0}, 0.0),
    ],
)
def test_delay_ceiling_grows_exponentially_up_to_the_cap(
    attempt: int, kwargs: dict[str, float], ceiling: float
) -> None:
    assert delay_ceiling(attempt, **kwargs) == ceiling


@pytest.mark.parametrize(
    ("draw", "attempt", "delay"),
    [(0.0, 1, 0.5), (0.5, 1, 0.75), (0.5, 4, 6.0), (0.999, 20, 3598.2), (0.25, 13, 2250.0)],
)
def test_next_delay_is_drawn_from_the_upper_half_of_the_ceiling(
    draw: float, attempt: int, delay: float
) -> None:
    drawn = next_delay(attempt, base=1.0, cap=3600.0, jitter=Fixed(draw))
    assert drawn == pytest.approx(delay)


def test_next_delay_is_repeatable_with_a_seeded_random() -> None:
    first = [next_delay(n, jitter=random.Random(42)) for n in range(1, 20)]
    second = [next_delay(n, jitter=random.Random(42)) for n in range(1, 20)]
    assert first == second


def test_next_delay_spreads_retries_over_the_upper_half_of_the_ceiling() -> None:
    rng = random.Random(7)
    delays = [next_delay(5, base=1.0, jitter=rng) for _ in range(2000)]
    assert 8.0 <= min(delays) < 8.5
    assert 15.5 < max(delays) <= 16.0
    assert 11.5 < sum(delays) / len(delays) < 12.5  # uniform on [8, 16]: mean 12


def test_next_delay_uses_the_random_module_by_default() -> None:
    delays = {next_delay(10) for _ in range(20)}
    assert all(2560.0 <= d <= 5120.0 for d in delays)
    assert len(delays) > 1


@pytest.mark.parametrize(
    ("attempt", "kwargs", "message"),
    [
        (0, {}, "attempt"),
        (-1, {}, "attempt"),
        (1, {"base": 0.0}, "base"),
        (1, {"base": -1.0}, "base"),
        (1, {"base": math.inf}, "base"),
        (1, {"factor": 0.5}, "factor"),
        (1, {"factor": math.nan}, "factor"),
        (1, {"cap": -1.0}, "cap"),
        (1, {"cap": math.inf}, "cap"),
    ],
)
def test_next_delay_rejects_nonsense(attempt: int, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        next_delay(attempt, **kwargs)


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "exhausted"),
    [(0, 1, False), (1, 1, True), (1, 5, False), (4, 5, False), (5, 5, True), (9, 5, True)],
)
def test_is_exhausted(attempt: int, max_attempts: int, exhausted: bool) -> None:
    assert is_exhausted(attempt, max_attempts) is exhausted


def test_is_exhausted_rejects_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        is_exhausted(1, 0)


def test_retry_policy_bundles_the_settings() -> None:
    policy = RetryPolicy(max_attempts=3, base=2.0, factor=3.0, cap=100.0)
    assert policy.next_delay(3, jitter=Fixed(0.5)) == 13.5
    assert policy.next_delay(9, jitter=Fixed(1.0)) == 100.0
    assert not policy.is_exhausted(2)
    assert policy.is_exhausted(3)


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"base": 0.0}, {"factor": 0.9}, {"cap": -5.0}]
)
def test_retry_policy_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        RetryPolicy(**kwargs)


@settings(database=None, max_examples=300)
@given(
    attempt=st.integers(1, 5000),
    base=st.floats(1e-3, 1e3),
    factor=st.floats(1.0, 10.0),
    cap=st.floats(0.0, 1e6),
    seed=st.integers(0, 2**32),
)
def test_next_delay_stays_within_half_and_all_of_the_capped_ceiling(
    attempt: int, base: float, factor: float, cap: float, seed: int
) -> None:
    delay = next_delay(attempt, base=base, factor=factor, cap=cap, jitter=random.Random(seed))
    ceiling = min(cap, delay_ceiling(attempt, base=base, factor=factor, cap=cap))
    assert ceiling / 2 <= delay <= ceiling
    assert delay_ceiling(attempt, base=base, factor=factor, cap=cap) <= cap
    if attempt > 1:
        previous = delay_ceiling(attempt - 1, base=base, factor=factor, cap=cap)
        assert delay_ceiling(attempt, base=base, factor=factor, cap=cap) >= previous


def test_retry_policy_by_default_outlasts_an_outage_of_twenty_hours() -> None:
    """The attempts of a failing execution span 20.7 h at least (the lower halves of the
    ceilings 10 s, 20 s, ... 5 h 41 min, then 6 h five times), 41.4 h at most: a provider's
    outage of minutes or hours makes nothing dead (8 attempts from 1 s did, after 2 min)."""
    least, most = RetryPolicy().window()
    assert (least, most) == (74_475.0, 148_950.0)
    assert RetryPolicy(max_attempts=8, base=1.0, cap=3600.0).window() == (63.5, 127.0)


def test_retry_policy_window_of_one_attempt_is_empty() -> None:
    assert RetryPolicy(max_attempts=1).window() == (0.0, 0.0)


NOW = datetime(2026, 12, 7, 15, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        ("0", 0.0),
        (" 7 ", 7.0),
        ("9" * 400, math.inf),  # more than a float holds: the cap cuts it
        # an HTTP-date: IMF-fixdate, and the obsolete RFC 850 and asctime forms
        ("Mon, 07 Dec 2026 15:05:00 GMT", 300.0),
        ("Monday, 07-Dec-26 15:05:00 GMT", 300.0),
        ("Mon Dec  7 15:05:00 2026", 300.0),
        ("Mon, 07 Dec 2026 14:00:00 GMT", 0.0),  # past: at once (the backoff stands)
        # neither: ignored
        (None, None),
        ("", None),
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("+5", None),
        ("١٢٠", None),  # digits, but not ASCII ones
        ("Mon, 32 Dec 2026 15:05:00 GMT", None),
        ("Mon, 07 Dec 2026", None),
    ],
)
def test_parse_retry_after_reads_delta_seconds_and_http_dates(
    value: str | None, seconds: float | None
) -> None:
    assert parse_retry_after(value, NOW) == seconds


@pytest.mark.parametrize(
    ("delay", "retry_after", "waited"),
    [
        (5.0, 120.0, 120.0),  # as asked
        (50.0, 10.0, 50.0),  # never sooner than the backoff's draw
        (5.0, 86_400.0, 3600.0),  # never later than the cap
        (5.0, math.inf, 3600.0),
    ],
)
def test_honour_retry_after_keeps_within_the_backoff_and_the_cap(
    delay: float, retry_after: float, waited: float
) -> None:
    assert honour_retry_after(delay, retry_after, cap=3600.0) == waited
