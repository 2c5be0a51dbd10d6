"""Defensive reading of provider payloads: nulls and missing keys are normal, junk is named.

Optional values of the wrong type read as absent; a value the event cannot do without
(an id, an amount that is there but unreadable) raises `UnmappablePayload`, never a
`KeyError`, `TypeError`, `ValueError`, `OverflowError` or `OSError`: a time within a year
of datetime's limits, a timezone naming a directory, an amount past 10^14 are junk like any
other, and an id sinal keeps is one both databases keep alike (see `id_text`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from datetime import MAXYEAR, MINYEAR, UTC, datetime, timedelta, timezone, tzinfo
from decimal import ROUND_HALF_EVEN, Decimal, DecimalException
from typing import Any, TypeVar

import orjson

from sinal.contacts import InvalidIdentity, normalize_email, normalize_phone
from sinal.currencies import is_currency
from sinal.events import MAX_ABS_VALUE, MAX_ID_TEXT, VALUE_PLACES, VALUE_QUANTUM, decimal_from_text
from sinal.integrations.base import UnmappablePayload
from sinal.zones import iana_zone

_T = TypeVar("_T")

_CENT = Decimal("0.01")
_MAX_QUANTIZE = Decimal("1e20")  # beyond this, cents would exceed Decimal's 28 digits
# Far beyond any real order total, short enough to keep Decimal parsing cheap.
_MAX_AMOUNT_TEXT = 40
# Digits in a whole number a provider can mean (a Unix time, an error code): int() of
# thousands is slow, and past 4300 refused.
_MAX_DIGITS = 20
# What no id can hold: control characters (NUL, which PostgreSQL's text refuses, among them)
# and surrogates, which UTF-8 cannot encode.
_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# A fixed UTC offset as a zone's name: PHP's "+HH:MM" (timezone_type 1), or "+HHMM".
_OFFSET = re.compile(r"(?P<sign>[+-])(?P<hours>[0-9]{2}):?(?P<minutes>[0-9]{2})")


def parse_body(body: bytes) -> Mapping[str, Any]:
    """The JSON object in a webhook body, or UnmappablePayload("invalid_json")."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise UnmappablePayload("invalid_json", f"the body is not JSON: {exc}") from exc
    if not isinstance(data, Mapping):
        raise UnmappablePayload("invalid_json", "the body is not a JSON object")
    return data


def body_digest(body: bytes) -> str:
    """A delivery id for providers that send none: the same bytes give the same id."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def get(data: object, *path: str) -> object:
    """The value at `path` inside nested objects, or None if any step is missing."""
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def obj(data: object, *path: str) -> Mapping[str, Any]:
    """The object at `path`, or an empty one when it is missing or not an object."""
    found = get(data, *path)
    return found if isinstance(found, Mapping) else {}


def objects(data: object, *path: str) -> list[Mapping[str, Any]]:
    """The objects in the list at `path` (other entries skipped); [] if it is no list."""
    found = get(data, *path)
    if not isinstance(found, list):
        return []
    return [item for item in found if isinstance(item, Mapping)]


def text(data: object, *path: str) -> str | None:
    """The text at `path`: strings stripped, integer ids as digits; None when blank."""
    found = get(data, *path) if path else data
    if isinstance(found, bool):
        return None
    if isinstance(found, int):
        return str(found)
    if isinstance(found, str):
        return found.strip() or None
    return None


def required_text(data: object, *path: str) -> str:
    """Like `text`, but a missing value is UnmappablePayload("missing_field"), and one no id
    can be (see `id_text`) UnmappablePayload("invalid_field")."""
    found = text(data, *path)
    where = ".".join(path)
    if found is None:
        raise UnmappablePayload("missing_field", f"{where} is missing or empty")
    if not _is_id(found):
        why = f"{where} is longer than {MAX_ID_TEXT} characters or holds control characters"
        raise UnmappablePayload("invalid_field", why)
    return found


def id_text(data: object, *path: str) -> str | None:
    """Like `text`, for an id: None also when no id can be it (longer than MAX_ID_TEXT, or
    holding control characters), so both backends look up and keep the same ids."""
    found = text(data, *path)
    return found if found is not None and _is_id(found) else None


def _is_id(found: str) -> bool:
    return len(found) <= MAX_ID_TEXT and _CONTROL_OR_SURROGATE.search(found) is None


def texts(data: object, *path: str) -> list[str]:
    """The non-blank texts in the list at `path`; [] if it is no list."""
    found = get(data, *path)
    if not isinstance(found, list):
        return []
    return [t for t in (text(item) for item in found) if t]


def money(data: object, *path: str) -> Decimal | None:
    """A decimal amount (providers send strings, ints or floats); None when absent."""
    found = get(data, *path) if path else data
    if found is None or (isinstance(found, str) and not found.strip()):
        return None  # blank, as `text` reads it
    try:
        amount = _decimal(found)
        # -0 becomes 0; "1e999999999" (past the context's exponents) signals Overflow
        amount = None if amount is None else amount + Decimal(0)
    except DecimalException:
        amount = None
    # past 10^14 no event (nor an order's numeric(18, 4) total, on PostgreSQL) can hold it
    if amount is None or not amount.is_finite() or abs(amount) >= MAX_ABS_VALUE:
        where = ".".join(path) or "amount"
        raise UnmappablePayload("invalid_amount", f"{where} is not a decimal amount below 10^14")
    return amount


def _decimal(raw: object) -> Decimal | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int | float):
        # JSON numbers (Yampi's amounts): repr is the shortest text that round-trips (150.9,
        # not 150.8999...), shown in cents like the amounts providers send as strings.
        amount = Decimal(repr(raw))
        if not amount.is_finite() or abs(amount) >= _MAX_QUANTIZE:
            return amount
        if _places(amount) > VALUE_PLACES:
            # Binary noise of the sender's float arithmetic (PHP's json_encode of 0.1 + 0.2
            # is 0.30000000000000004): a float stands for an amount, so it is read at the
            # places an amount has. Half-even, Decimal's default and ABNT NBR 5891's rule:
            # noise is never a tie, and a true fifth-place 5 is rounded without bias.
            amount = amount.quantize(VALUE_QUANTUM, ROUND_HALF_EVEN).normalize()
        return amount if _places(amount) >= 2 else amount.quantize(_CENT)
    if isinstance(raw, str) and len(raw) <= _MAX_AMOUNT_TEXT:
        return decimal_from_text(raw)  # written as a JSON number, as an event's value is
    return None


def _places(amount: Decimal) -> int:
    exponent = amount.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def money_text(amount: Decimal | None) -> str | None:
    """An amount as it goes into properties (a string: JSON numbers are floats)."""
    return None if amount is None else str(amount)


def iso_time(data: object, *path: str) -> datetime | None:
    """An ISO 8601 time with an offset, in UTC; None when absent."""
    raw = text(data, *path)
    if raw is None:
        return None
    try:
        when = datetime.fromisoformat(_utc_suffix(raw))
    except ValueError:
        raise _bad_time(path) from None
    if when.utcoffset() is None:
        raise UnmappablePayload("invalid_timestamp", f"{'.'.join(path)} has no UTC offset")
    return _in_utc(when, path)


def _utc_suffix(raw: str) -> str:
    """`raw` with its "Z" (or "z", which RFC 3339 allows too) spelled "+00:00"."""
    return raw[:-1] + "+00:00" if raw[-1:] in ("Z", "z") else raw


def first_iso_time(data: object, *fields: str) -> datetime:
    """The first of `fields` holding an ISO time; UnmappablePayload if none does."""
    for name in fields:
        when = iso_time(data, name)
        if when is not None:
            return when
    raise UnmappablePayload("missing_field", f"{' or '.join(fields)} is missing")


def local_time(raw: object, zone: str) -> datetime | None:
    """A time without offset, read in `zone` (or ISO with offset), in UTC; None if absent."""
    found = text(raw)
    if found is None:
        return None
    try:
        when = datetime.fromisoformat(_utc_suffix(found))
    except ValueError:
        raise _bad_time(("time",)) from None
    if when.utcoffset() is None:
        when = when.replace(tzinfo=_zone(zone))
    return _in_utc(when, ("time",))


def _in_utc(when: datetime, path: tuple[str, ...]) -> datetime:
    try:
        utc = when.astimezone(UTC)
    except OverflowError:  # before year 1 or after 9999 once in UTC
        raise _bad_time(path) from None
    # A year away from datetime's limits: adding a delay to it (a checkout's abandonment)
    # must not overflow either.
    if not MINYEAR < utc.year < MAXYEAR:
        raise _bad_time(path)
    return utc


def _zone(name: str) -> tzinfo:
    """An IANA zone, or a fixed offset as PHP names a DateTime's built with one
    (timezone_type 1: "-03:00"; "-0300" taken too)."""
    offset = _OFFSET.fullmatch(name)
    if offset is not None and int(offset["hours"]) < 24 and int(offset["minutes"]) < 60:
        sign = -1 if offset["sign"] == "-" else 1
        minutes = int(offset["hours"]) * 60 + int(offset["minutes"])
        return timezone(sign * timedelta(minutes=minutes))
    zone = iana_zone(name)
    if zone is None:  # "localtime" too: the host's zone would decide the time
        raise UnmappablePayload("invalid_timestamp", f"unknown timezone {name[:64]!r}")
    return zone


def epoch_time(data: object, *path: str) -> datetime | None:
    """A Unix time in seconds (a string or a number), in UTC; None when absent."""
    raw = get(data, *path)
    if raw is None or raw == "":
        return None
    seconds = whole_number(raw)
    if seconds is None:
        raise _bad_time(path)
    try:
        when = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        raise _bad_time(path) from None
    return _in_utc(when, path)


def whole_number(raw: object) -> int | None:
    """A JSON integer, or text of ASCII digits (not "²": `str.isdigit` takes it, `int` does
    not) up to 20 of them; None for anything else."""
    if isinstance(raw, str):
        digits = raw.strip()
        if digits.isascii() and digits.isdigit() and len(digits) <= _MAX_DIGITS:
            return int(digits)
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    return None


def _bad_time(path: tuple[str, ...]) -> UnmappablePayload:
    return UnmappablePayload("invalid_timestamp", f"{'.'.join(path)} is not a valid time")


def first(*values: _T | None) -> _T | None:
    """The first value that is present (not None)."""
    return next((v for v in values if v is not None), None)


def compact(data: dict[str, Any]) -> dict[str, Any]:
    """`data` without None values and empty lists: properties carry only what is known."""
    return {k: v for k, v in data.items() if v is not None and v != []}


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value, matching its name case-insensitively; None when absent or blank."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    if value is None:
        return None
    return value.strip() or None


def currency(data: object, *path: str) -> str | None:
    """An ISO 4217 code, upper case; None when absent, UnmappablePayload when unknown."""
    code = text(data, *path)
    if code is None:
        return None
    if not is_currency(code.upper()):
        raise UnmappablePayload("invalid_currency", f"{'.'.join(path)} is not an ISO 4217 code")
    return code.upper()


def quantity(data: object, *path: str) -> int | None:
    """A whole quantity; None when absent or not an integer."""
    found = get(data, *path)
    if isinstance(found, int) and not isinstance(found, bool):
        return found
    return None


def first_phone(*candidates: str | None) -> str | None:
    """The first candidate that is a valid phone number (raw; ContactRef normalizes it)."""
    for raw in candidates:
        if raw is not None and _is_valid(normalize_phone, raw):
            return raw
    return None


def first_email(*candidates: str | None) -> str | None:
    """The first candidate that is a valid email address (raw)."""
    for raw in candidates:
        if raw is not None and _is_valid(normalize_email, raw):
            return raw
    return None


def _is_valid(normalize: Callable[[str], str], raw: str) -> bool:
    try:
        normalize(raw)
    except InvalidIdentity:
        return False
    return True


def full_name(*parts: str | None) -> str | None:
    """Name parts joined by spaces; None when all are blank."""
    joined = " ".join(p for p in parts if p)
    return joined or None


def flag(data: object, *path: str) -> bool | None:
    """A JSON boolean; None when absent or not a boolean."""
    found = get(data, *path)
    return found if isinstance(found, bool) else None
