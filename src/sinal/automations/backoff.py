"""Retry delays: exponential backoff with jitter, and when to give up. No I/O.

The delay before the next attempt is drawn uniformly from the upper half of its ceiling,
`[c / 2, c]` with `c = min(cap, base * factor ** (attempt - 1))` ("equal jitter", AWS
Architecture Blog, "Exponential Backoff And Jitter"). The spread keeps many executions that
failed together (a provider outage) from retrying together; the lower half is left out so
that the attempts span a known time at least (`RetryPolicy.window`): full jitter, drawing
from `[0, c]`, could spend every attempt within seconds of an outage's start, and the
executions would be dead before it ended. Pass a seeded `random.Random` for repeatable
delays in tests.

The defaults (18 attempts, 10 s doubling up to 6 h) retry for 20.7 to 41.4 hours, as
webhook senders do (Stripe for three days, Svix for a day): an outage of a provider, or of
this service's network, lasting hours makes nothing dead.

A server's `Retry-After` (`parse_retry_after`) is honoured within those bounds
(`honour_retry_after`): the next attempt comes no sooner than it asks, nor sooner than the
backoff's draw (so the attempts still span the window), and at most `cap` later.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol

__all__ = [
    "RandomSource",
    "RetryPolicy",
    "delay_ceiling",
    "honour_retry_after",
    "is_exhausted",
    "next_delay",
    "parse_retry_after",
]

_DELTA_SECONDS = re.compile(r"[0-9]+")  # RFC 9110's 1*DIGIT: no sign, no fraction


class RandomSource(Protocol):
    """Anything with `random() -> float` in [0, 1): `random.Random`, or the module."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...


# The defaults: the first retry after 5 to 10 s, doubling up to 6 h apart.
DEFAULT_MAX_ATTEMPTS = 18
DEFAULT_BASE = 10.0
DEFAULT_FACTOR = 2.0
DEFAULT_CAP = 6 * 3600.0


def delay_ceiling(
    attempt: int,
    *,
    base: float = DEFAULT_BASE,
    factor: float = DEFAULT_FACTOR,
    cap: float = DEFAULT_CAP,
) -> float:
    """The largest delay `next_delay` may return after `attempt` failed attempts."""
    if attempt < 1:
        raise ValueError(f"attempt counts failed attempts from 1, got {attempt}")
    if not (math.isfinite(base) and base > 0):
        raise ValueError(f"base must be a positive number of seconds, got {base}")
    if not (math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor must be at least 1, got {factor}")
    if not (math.isfinite(cap) and cap >= 0):
        raise ValueError(f"cap must be a non-negative number of seconds, got {cap}")
    try:
        raw = base * factor ** (attempt - 1)
    except OverflowError:  # factor ** 10_000 does not fit a float; the cap applies anyway
        return cap
    return min(cap, raw)


def next_delay(
    attempt: int,
    *,
    base: float = DEFAULT_BASE,
    factor: float = DEFAULT_FACTOR,
    cap: float = DEFAULT_CAP,
    jitter: RandomSource | None = None,
) -> float:
    """Seconds to wait after `attempt` failed attempts (1 = the first failure): drawn from
    the upper half of its ceiling."""
    ceiling = delay_ceiling(attempt, base=base, factor=factor, cap=cap)
    draw = (jitter or random).random()
    return ceiling * (1.0 + draw) / 2.0


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """The seconds from `now` a `Retry-After` header value asks to wait (RFC 9110, 10.2.3):
    delta-seconds, or an HTTP-date (one already past: 0); None for no value, or one that is
    neither (ignored)."""
    text = (value or "").strip()
    if _DELTA_SECONDS.fullmatch(text):
        return float(text)  # too many digits for a float: infinity, which the cap cuts
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment.tzinfo is None:  # "-0000": an HTTP-date is in GMT
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - now).total_seconds())


def honour_retry_after(delay: float, retry_after: float, cap: float) -> float:
    """The wait before a retry a server asked to come `retry_after` seconds later: no less
    than that, nor than the backoff's `delay`, and no more than `cap` (that of the policy)."""
    return max(delay, min(retry_after, cap))


def is_exhausted(attempt: int, max_attempts: int) -> bool:
    """Whether `attempt` failed attempts use up `max_attempts` (no retry is left)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    return attempt >= max_attempts


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How an execution retries: the backoff shape and how many attempts in all."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    base: float = DEFAULT_BASE
    factor: float = DEFAULT_FACTOR
    cap: float = DEFAULT_CAP

    def __post_init__(self) -> None:
        delay_ceiling(1, base=self.base, factor=self.factor, cap=self.cap)  # validates
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")

    def next_delay(self, attempt: int, jitter: RandomSource | None = None) -> float:
        """Seconds to wait after `attempt` failed attempts."""
        return next_delay(attempt, base=self.base, factor=self.factor, cap=self.cap, jitter=jitter)

    def is_exhausted(self, attempt: int) -> bool:
        """Whether no retry is left after `attempt` failed attempts."""
        return is_exhausted(attempt, self.max_attempts)

    def window(self) -> tuple[float, float]:
        """The least and the most seconds from the first attempt's failure to the last
        attempt: an outage shorter than the least never makes an execution dead."""
        ceilings = [
            delay_ceiling(n, base=self.base, factor=self.factor, cap=self.cap)
            for n in range(1, self.max_attempts)
        ]
        return sum(ceilings) / 2.0, sum(ceilings)
