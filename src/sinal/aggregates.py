"""Time buckets for aggregates, in the account's timezone; no I/O.

Bucket boundaries are computed here, once, with `zoneinfo`, and both stores only place
events between them: a day is the zone's calendar day (23 or 25 hours across a DST
change), a week starts on Monday, an hour is an hour of real time labelled with the
zone's offset at that instant (so the repeated hour of a DST fall-back is two buckets).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Literal, get_args
from zoneinfo import ZoneInfo

from sinal.currencies import is_currency
from sinal.errors import FieldError, InvalidQuery
from sinal.store.base import AggregateCell, Measurement
from sinal.zones import iana_zone

Interval = Literal["hour", "day", "week", "month"]
INTERVALS: tuple[Interval, ...] = get_args(Interval)
MEASUREMENTS: tuple[Measurement, ...] = get_args(Measurement)
MAX_SPAN = timedelta(days=366)
MAX_GROUPS = 100  # with `by`: the largest groups, by their total over the range
MAX_ROWS = 100_000  # with `by`, fewer groups are kept when buckets x groups would pass it
# since and until lie in [EARLIEST, LATEST]: a year inside the datetime range at each end,
# so any zone's offset (< 1 day), a month's first day and the bucket after `until` fit.
EARLIEST = datetime(2, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class AggregateRow:
    """One bucket's value (and its group, with `by`)."""

    bucket: datetime  # the bucket's first instant, in the query's timezone
    value: int | Decimal
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Aggregate:
    """An aggregate's answer: every bucket of the range, empty ones included.
    `currency`: the `currency` asked for, if any; else, a `sum_value`'s, that of every
    value summed (None when no event of the range had a value).
    """

    timezone: str
    rows: list[AggregateRow]
    groups_truncated: bool = False
    currency: str | None = None


def parse_zone(name: str, field: str = "timezone") -> ZoneInfo:
    """The IANA zone `name`, or `InvalidQuery` naming `field`."""
    zone = iana_zone(name)
    if zone is None:
        raise InvalidQuery(
            [FieldError(field, "invalid_timezone", f"{name!r} is not an IANA time zone")]
        )
    return zone


# A property to group by: a key both stores can address (SQLite's JSON path breaks on a
# quote or a dot, which PostgreSQL's `->` would take); the API's `by` parameter says so too.
BY_PATTERN = re.compile(r"[\w\-]{1,64}")


def property_key(by: str | None) -> str | None:
    """The property `by` groups by: a plain key (`total`), also written as an automation's
    filter names it (`properties.total`); `InvalidQuery` naming `by` for anything else."""
    if by is None:
        return None
    key = by.removeprefix("properties.")
    if BY_PATTERN.fullmatch(key) is None:
        message = (
            f"by names a property by its key, as total or properties.total: 1 to 64 letters, "
            f"digits, '_' or '-' (a nested path is not grouped by), got {by[:80]!r}"
        )
        raise InvalidQuery([FieldError("by", "invalid_property", message)])
    return key


def naive_time(name: str) -> FieldError:
    """The error of a query's time `name` given without an offset (`since=2026-12-01`)."""
    message = (
        f"{name} must carry a timezone offset or Z, as 2026-12-01T00:00:00Z or "
        "2026-12-01T00:00:00-03:00"
    )
    return FieldError(name, "naive_datetime", message)


def check_range(since: datetime, until: datetime) -> None:
    """`since` before `until`, both timezone-aware, at most a year apart, and both in
    [EARLIEST, LATEST], where every bucket of every zone can be computed."""
    errors: list[FieldError] = []
    for name, value in (("since", since), ("until", until)):
        if value.tzinfo is None or value.utcoffset() is None:
            errors.append(naive_time(name))
        elif not EARLIEST <= value <= LATEST:  # compared without converting: no overflow
            message = f"{name} must be from 0002-01-01T00:00:00Z to 9999-01-01T00:00:00Z"
            errors.append(FieldError(name, "out_of_range", message))
    if not errors and since >= until:
        errors.append(FieldError("until", "before_since", "until must be after since"))
    elif not errors and until - since > MAX_SPAN:
        errors.append(FieldError("until", "range_too_long", "since and until are > 1 year apart"))
    if errors:
        raise InvalidQuery(errors)


def bucket_starts(
    since: datetime, until: datetime, interval: Interval, zone: ZoneInfo
) -> list[datetime]:
    """The first instant of every bucket that meets [since, until), in `zone`."""
    local = since.astimezone(zone)
    starts: list[datetime] = []
    if interval == "hour":
        current = local.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
        while current < until:
            starts.append(current.astimezone(zone))
            current += timedelta(hours=1)
        return starts
    day = _first_day(local.date(), interval)
    while (start := _midnight(day, zone)) < until:
        starts.append(start)
        day = _next_day(day, interval)
    return starts


def _first_day(day: date, interval: Interval) -> date:
    if interval == "week":
        return day - timedelta(days=day.weekday())
    if interval == "month":
        return day.replace(day=1)
    return day


def _next_day(day: date, interval: Interval) -> date:
    if interval == "day":
        return day + timedelta(days=1)
    if interval == "week":
        return day + timedelta(days=7)
    return date(day.year + day.month // 12, day.month % 12 + 1, 1)


def _midnight(day: date, zone: ZoneInfo) -> datetime:
    """The day's first instant; where midnight is skipped by DST, the transition itself
    (zoneinfo reads a skipped wall time with the offset before it)."""
    start = datetime.combine(day, time(0), tzinfo=zone)
    return start.astimezone(UTC).astimezone(zone)


def densify(
    starts: Sequence[datetime],
    cells: Iterable[AggregateCell],
    *,
    by: str | None,
    zero: int | Decimal,
    timezone: str,
    currency: str | None = None,
) -> Aggregate:
    """Every bucket (per group, with `by`) in order, with `zero` where no event fell;
    `cells` of one currency (`sum_currency`)."""
    values: dict[tuple[int, str | None], int | Decimal] = {}
    totals: dict[str | None, int | Decimal] = {}
    for cell in cells:
        values[(cell.bucket, cell.group)] = cell.value
        totals[cell.group] = totals.get(cell.group, zero) + cell.value
    if by is None:
        rows = [AggregateRow(s, values.get((i, None), zero)) for i, s in enumerate(starts)]
        return Aggregate(timezone, rows, currency=currency)
    # Largest groups first; ties by name (None, "no such property", last).
    ranked = sorted(totals, key=lambda g: (-totals[g], g is None, g or ""))
    keep = max(1, min(MAX_GROUPS, MAX_ROWS // max(1, len(starts))))
    groups = ranked[:keep]
    rows = [
        AggregateRow(s, values.get((i, g), zero), g) for i, s in enumerate(starts) for g in groups
    ]
    return Aggregate(timezone, rows, groups_truncated=len(ranked) > keep, currency=currency)


def parse_currency(code: str | None) -> str | None:
    """The ISO 4217 code `code` (any case) an aggregate is asked in, upper case; None for
    none; `InvalidQuery` naming `currency` for anything else."""
    if code is None or is_currency(code.upper()):
        return None if code is None else code.upper()
    message = f"currency must be an ISO 4217 code, as BRL or USD, got {code[:80]!r}"
    raise InvalidQuery([FieldError("currency", "invalid_currency", message)])


def sum_currency(cells: Sequence[AggregateCell], asked: str | None) -> str | None:
    """The one currency of a `sum_value`'s cells (None when there are none), or `asked`.

    Values in two currencies are never added: a sum over a range whose values are in
    several, asked in none, is `InvalidQuery` naming `currency` and listing them."""
    found = sorted({c.currency for c in cells if c.currency is not None})
    if asked is not None or not found:
        return asked
    if len(found) > 1:
        message = (
            f"the metric's values in this range are in {', '.join(found)}; sums are never "
            f"added across currencies: ask for one, as currency={found[0]}"
        )
        raise InvalidQuery([FieldError("currency", "mixed_currencies", message)])
    return found[0]
