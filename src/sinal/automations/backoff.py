"""Retry delays: exponential backoff with full jitter, and when to give up. No I/O.

Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter"): the delay before
the next attempt is drawn uniformly from `[0, min(cap, base * factor ** (attempt - 1))]`.
Spreading retries over the whole window keeps many workers that failed together (a
provider outage) from retrying together. Pass a seeded `random.Random` for repeatable
delays in tests.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

__all__ = ["RandomSource", "RetryPolicy", "delay_ceiling", "is_exhausted", "next_delay"]


class RandomSource(Protocol):
    """Anything with `random() -> float` in [0, 1): `random.Random`, or the module."""

    def random(self) -> float:
        """A float in [0, 1)."""
        ...


def delay_ceiling(
    attempt: int, *, base: float = 1.0, factor: float = 2.0, cap: float = 3600.0
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
    base: float = 1.0,
    factor: float = 2.0,
    cap: float = 3600.0,
    jitter: RandomSource | None = None,
) -> float:
    """Seconds to wait after `attempt` failed attempts (1 = the first failure)."""
    ceiling = delay_ceiling(attempt, base=base, factor=factor, cap=cap)
    draw = (jitter or random).random()
    return draw * ceiling


def is_exhausted(attempt: int, max_attempts: int) -> bool:
    """Whether `attempt` failed attempts use up `max_attempts` (no retry is left)."""
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
    return attempt >= max_attempts


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How an execution retries: the backoff shape and how many attempts in all."""

    max_attempts: int = 8
    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0

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
