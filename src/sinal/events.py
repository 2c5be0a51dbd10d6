"""Events as values: the input (`EmitEvent`), its validation, and the answer (`EmitResult`).

No I/O here. `prepare()` turns an `EmitEvent` into a `PreparedEvent` (normalized, with
its id and `unique_event_id`) or raises `InvalidEvent` with one entry per bad field.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal, NamedTuple
from uuid import UUID

import orjson

from sinal.catalog import Category, get_metric_category, get_metric_label, is_system_metric
from sinal.catalog.metrics import misspelt_metric_message, misspelt_system_metric
from sinal.currencies import is_currency
from sinal.errors import FieldError, InvalidEvent
from sinal.ids import new_id

SCHEMA_VERSION = 1
DEFAULT_CURRENCY = "BRL"

MAX_METRIC_NAME = 128
MAX_TOKEN = 64  # source, entity_type
MAX_ID_TEXT = 255  # source_id, entity_id
MAX_PROPERTIES_BYTES = 64 * 1024
MAX_DEPTH = 16
# NUMERIC(18,4): 14 integer digits, 4 decimal places.
MAX_ABS_VALUE = Decimal("1e14")
VALUE_PLACES = 4
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
MAX_FUTURE = timedelta(hours=24)
# The integers orjson can write (int64 and uint64); larger ones would raise a TypeError.
_JSON_INT_MIN = -(2**63)
_JSON_INT_MAX = 2**64 - 1

# source and entity_type become parts of "{source}:{entity_type}:{source_id}", so they may
# not contain ':' — otherwise two different triples could build the same unique id.
_TOKEN = re.compile(r"[A-Za-z0-9_.\-/]+")
# A control character (Unicode category Cc) or a surrogate code point, which UTF-8 cannot
# encode (`_has_lone_surrogate`): one search for both.
_CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# A value sent as text: ASCII digits, an optional minus, fraction and exponent, as a JSON
# number is written (the API schema's pattern); and the texts Decimal reads as NaN or
# Infinity, refused as not_finite.
_DECIMAL_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
VALUE_QUANTUM = Decimal(1).scaleb(-VALUE_PLACES)  # 0.0001: a value's smallest step
_NON_FINITE_TEXT = re.compile(r"[+-]?(?:s?nan|inf|infinity)", re.IGNORECASE)

Status = Literal["created", "duplicate", "rejected"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EmitEvent:
    """One activity to record, as a source describes it (the seed's EmitEventParams)."""

    account_id: UUID | str
    contact_id: UUID | str | None
    metric_name: str
    source: str
    properties: Mapping[str, Any] = field(default_factory=dict)
    value: Decimal | int | float | str | None = None
    currency: str | None = None
    source_id: str | None = None
    integration_id: UUID | str | None = None
    entity_type: str | None = None
    entity_id: str | None = None
    occurred_at: datetime | str | None = None
    # Set by automation steps: the causing execution. Such events never trigger automations.
    automation_execution_id: UUID | str | None = None


class PreparedEvent(NamedTuple):
    """A validated, normalized event ready to be stored.

    Immutable like the frozen dataclasses sinal uses for values, but a named tuple: one is
    made for every event emitted, and a frozen dataclass of 20 fields took 2.6 µs to make
    against 1.0 (bench/HISTORY.md, session 13)."""

    id: UUID
    account_id: UUID
    contact_id: UUID | None
    metric_name: str
    category: Category
    is_system: bool
    display_name: str
    properties_json: str  # the properties as stored: validated, canonical JSON
    value: Decimal | None
    currency: str
    source: str
    source_id: str | None
    integration_id: UUID | None
    unique_event_id: str | None
    entity_type: str | None
    entity_id: str | None
    automation_execution_id: UUID | None
    occurred_at: datetime
    occurred_at_given: bool
    received_at: datetime

    @property
    def properties(self) -> dict[str, Any]:
        """The properties as stored, parsed anew on each read (only duplicates' comparison
        and kept rejections read them; parsing every event up front cost ~2.5 µs each)."""
        data: dict[str, Any] = orjson.loads(self.properties_json)
        return data

    @property
    def from_automation(self) -> bool:
        """Whether an automation step emitted this event (the seed's `_fromAutomation`)."""
        return self.automation_execution_id is not None

    def as_input(self) -> dict[str, Any]:
        """The normalized input as JSON-ready data (kept with a rejection, for replay)."""
        return {
            "account_id": str(self.account_id),
            "contact_id": None if self.contact_id is None else str(self.contact_id),
            "metric_name": self.metric_name,
            "properties": self.properties,
            "value": None if self.value is None else str(self.value),
            "currency": self.currency,
            "source": self.source,
            "source_id": self.source_id,
            "integration_id": _opt_str(self.integration_id),
            "entity_type": self.entity_type,
            "entity_id": self.entity_id,
            "occurred_at": stamp(self.occurred_at),
            "automation_execution_id": _opt_str(self.automation_execution_id),
        }


@dataclass(frozen=True, slots=True)
class StoredPayload:
    """The parts of a stored event that decide whether a duplicate differs from it."""

    metric_name: str
    # As the store gives it back, JSON text: parsed only when a duplicate is compared with
    # it (a batch reads its duplicates' payloads before it can start storing).
    properties_json: str
    value: Decimal | None
    currency: str
    occurred_at: datetime


@dataclass(frozen=True, slots=True)
class EmitResult:
    """What happened to one emitted event."""

    status: Status
    event_id: UUID | None = None
    unique_event_id: str | None = None
    # For duplicates: whether metric, properties, value, currency or occurred_at differ.
    differs: bool | None = None
    reason: str | None = None
    message: str | None = None
    errors: tuple[FieldError, ...] = ()
    rejection_id: UUID | None = None

    @property
    def is_stored(self) -> bool:
        """Whether an event with this identity is in the store (new or earlier)."""
        return self.status != "rejected"


def build_unique_event_id(source: str, entity_type: str | None, source_id: str) -> str:
    """The seed's dedup key: "{source}:{entity_type or 'event'}:{source_id}"."""
    return f"{source}:{entity_type or 'event'}:{source_id}"


def differs_from(event: PreparedEvent, stored: StoredPayload) -> bool:
    """Whether a duplicate's payload differs from the stored event's.

    `occurred_at` only counts when the duplicate gave one: a retry that let it default to
    "now" is the same event.
    """
    if _fields_differ(event, stored.metric_name, stored.value, stored.currency, stored.occurred_at):
        return True
    return _properties_differ(event.properties_json, stored.properties_json)


def differs_from_earlier(event: PreparedEvent, earlier: PreparedEvent) -> bool:
    """`differs_from` for a repeat of an event earlier in the same batch: the same JSON text
    is the same properties, and then neither is parsed."""
    if _fields_differ(
        event, earlier.metric_name, earlier.value, earlier.currency, earlier.occurred_at
    ):
        return True
    return _properties_differ(event.properties_json, earlier.properties_json)


def _properties_differ(one: str, other: str) -> bool:
    """Whether two properties' JSON texts hold different objects: the same text is the same
    properties, and then neither is parsed."""
    if one == other:
        return False
    parsed, other_parsed = orjson.loads(one), orjson.loads(other)
    if parsed != other_parsed:  # at C speed: most differences, and all without booleans
        return True
    # Python's == takes true for 1: only texts that may hold a boolean need the strict look
    # (the recursive one cost emit_many ×500 ~10% on PostgreSQL, whose jsonb reorders keys)
    maybe_bool = "true" in one or "false" in one or "true" in other or "false" in other
    return maybe_bool and not _same_json(parsed, other_parsed)


def _same_json(one: Any, other: Any) -> bool:
    """Whether two parsed JSON values are equal as jsonb compares them: numbers by value
    (1 and 1.0 are equal), but a boolean only to a boolean. (Python's `==` says True == 1,
    so {"paid": true} and {"paid": 1} compared equal.)"""
    if isinstance(one, dict):
        return (
            isinstance(other, dict)
            and one.keys() == other.keys()
            and all(_same_json(value, other[key]) for key, value in one.items())
        )
    if isinstance(one, list):
        return (
            isinstance(other, list) and len(one) == len(other) and all(map(_same_json, one, other))
        )
    if isinstance(one, bool) or isinstance(other, bool):
        return one is other
    return bool(one == other)


def _fields_differ(
    event: PreparedEvent,
    metric_name: str,
    value: Decimal | None,
    currency: str,
    occurred_at: datetime,
) -> bool:
    return (
        event.metric_name != metric_name
        or event.currency != currency
        or event.value != value
        or (event.occurred_at_given and event.occurred_at != occurred_at)
    )


class EventKey(NamedTuple):
    """What places an event before the rest of it is checked: its account, contact, metric
    and dedup key (validated; the errors found so far are kept for `prepare`). A named
    tuple, like `PreparedEvent`: made once per emitted event."""

    account_id: UUID | None
    contact_id: UUID | None
    metric_name: str | None
    source: str | None
    entity_type: str | None
    source_id: str | None
    unique_event_id: str | None  # the seed's dedup key, when it has one and all is valid
    errors: tuple[FieldError, ...]


# The order of a rejection's errors: ids first, then what the event is, then its data.
_FIELD_ORDER = {
    name: i
    for i, name in enumerate(
        (
            "account_id", "contact_id", "integration_id", "automation_execution_id",
            "metric_name", "source", "entity_type", "source_id", "entity_id", "properties",
            "value", "currency", "occurred_at",
        )
    )
}  # fmt: skip


def identify(event: EmitEvent) -> EventKey:
    """Validate the fields that identify `event` (a few microseconds): enough to order a
    batch by dedup key before the rest is validated."""
    v = _Validator()
    account_id = v.uuid("account_id", event.account_id, required=True)
    contact_id = v.uuid("contact_id", event.contact_id)
    metric_name = v.metric_name(event.metric_name)
    source = v.token("source", event.source, required=True)
    entity_type = v.token("entity_type", event.entity_type)
    source_id = v.text("source_id", event.source_id)
    unique = (
        build_unique_event_id(source, entity_type, source_id)
        if source is not None and source_id and not v.errors
        else None
    )
    return EventKey(
        account_id, contact_id, metric_name, source, entity_type, source_id, unique, tuple(v.errors)
    )


def prepare(event: EmitEvent, now: datetime, key: EventKey | None = None) -> PreparedEvent:
    """Validate and normalize `event`; raise `InvalidEvent` listing every bad field.

    `key` is `identify(event)` when the caller already has it."""
    key = key or identify(event)
    v = _Validator()
    v.errors.extend(key.errors)
    integration_id = v.uuid("integration_id", event.integration_id)
    execution_id = v.uuid("automation_execution_id", event.automation_execution_id)
    entity_id = v.text("entity_id", event.entity_id)
    properties_json = v.properties(event.properties)
    value = v.value(event.value)
    currency = v.currency(event.currency)
    occurred_at = v.occurred_at(event.occurred_at, now)
    if v.errors:
        raise InvalidEvent(sorted(v.errors, key=lambda e: _FIELD_ORDER.get(e.field, 99)))
    account_id, metric_name, source = key.account_id, key.metric_name, key.source
    assert account_id is not None
    assert metric_name is not None
    assert source is not None
    # Positionally, in the fields' order: keywords cost ~1.5 µs more per event (the named
    # tuple's `__new__` binds them), a few percent of a batch's client CPU.
    return PreparedEvent(
        new_id(),  # id
        account_id,
        key.contact_id,
        metric_name,
        get_metric_category(metric_name),
        is_system_metric(metric_name),
        get_metric_label(metric_name, "en"),  # display_name
        properties_json,
        value,
        currency,
        source,
        key.source_id,
        integration_id,
        key.unique_event_id,
        key.entity_type,
        entity_id,
        execution_id,  # automation_execution_id
        occurred_at or now,
        occurred_at is not None,  # occurred_at_given
        now,  # received_at
    )


def normalize_metric_name(raw: str) -> str:
    """A metric name as metrics are stored and looked up: trimmed, in NFC. "Avaliação"
    typed decomposed (a + U+0303, as some keyboards and PDFs give it) made a second metric
    that printed as the first, which its automations and filters never matched."""
    return unicodedata.normalize("NFC", raw.strip())


def decimal_text(value: Decimal) -> str:
    """A value as text, exact and alike on every backend: 2 to 4 decimal places ("297.90")."""
    whole, _, fraction = f"{value.quantize(Decimal('0.0001')):f}".partition(".")
    return f"{whole}.{fraction.rstrip('0').ljust(2, '0')}"


def dumps_json(data: Any) -> str:
    """Serialize JSON the way sinal stores it (Decimal as a string, datetimes ISO 8601)."""
    return orjson.dumps(data, default=_json_default).decode()


def _json_default(obj: object) -> object:
    if isinstance(obj, Decimal):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _opt_str(value: object | None) -> str | None:
    return None if value is None else str(value)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# Metric names (raw → normalized) and tokens (sources, entity types) already found valid:
# a platform sends the same few again and again, and a hit skips their checks. Bounded;
# a plain str only (a subclass could compare equal and behave otherwise).
_VALID_CACHE_SIZE = 4096
_VALID_NAMES: dict[str, str] = {}
_VALID_TOKENS: set[str] = set()


class _Validator:
    """Collects one FieldError per bad field instead of stopping at the first."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def fail(self, field_name: str, code: str, message: str) -> None:
        self.errors.append(FieldError(field_name, code, message))

    def uuid(self, name: str, raw: object, *, required: bool = False) -> UUID | None:
        if raw is None or raw == "":
            if required:
                self.fail(name, "required", f"{name} is required")
            return None
        if isinstance(raw, UUID):
            return raw
        if isinstance(raw, str):
            try:
                return UUID(raw)
            except ValueError:
                pass
        self.errors.append(uuid_error(name, raw))
        return None

    def metric_name(self, raw: object) -> str | None:
        if type(raw) is str and (known := _VALID_NAMES.get(raw)) is not None:
            return known
        name = self._metric_name(raw)
        if name is not None and type(raw) is str and len(_VALID_NAMES) < _VALID_CACHE_SIZE:
            _VALID_NAMES[raw] = name
        return name

    def _metric_name(self, raw: object) -> str | None:
        if not isinstance(raw, str):
            self.fail("metric_name", "invalid_type", "metric_name must be a string")
            return None
        name = normalize_metric_name(raw)
        if not name:
            self.fail("metric_name", "empty", "metric_name must not be empty")
        elif len(name) > MAX_METRIC_NAME:
            self.fail(
                "metric_name",
                "too_long",
                f"metric_name is longer than {MAX_METRIC_NAME} characters",
            )
        elif _CONTROL_OR_SURROGATE.search(name) is not None:
            self.fail(
                "metric_name", "control_characters", "metric_name contains control characters"
            )
        elif name.startswith("__"):
            self.fail("metric_name", "reserved", "metric names starting with '__' are reserved")
        elif (system := misspelt_system_metric(name)) is not None:
            self.fail(
                "metric_name", "misspelt_system_metric", misspelt_metric_message(name, system)
            )
        else:
            return name
        return None

    def token(self, name: str, raw: object, *, required: bool = False) -> str | None:
        if type(raw) is str and raw in _VALID_TOKENS:
            return raw
        if raw is None or raw == "":
            if required:
                self.fail(name, "required", f"{name} is required")
            return None
        if not isinstance(raw, str):
            self.fail(name, "invalid_type", f"{name} must be a string")
        elif len(raw) > MAX_TOKEN:
            self.fail(name, "too_long", f"{name} is longer than {MAX_TOKEN} characters")
        elif not _TOKEN.fullmatch(raw):
            self.fail(
                name,
                "invalid_format",
                f"{name} may only contain letters, digits and . _ - / (got {_short(raw)})",
            )
        else:
            if len(_VALID_TOKENS) < _VALID_CACHE_SIZE:
                _VALID_TOKENS.add(raw)
            return raw
        return None

    def text(self, name: str, raw: object) -> str | None:
        if raw is None or raw == "":
            return None
        if isinstance(raw, int) and not isinstance(raw, bool):
            try:
                raw = str(raw)  # numeric ids (Shopify's) are common; their text is the id
            except ValueError:  # more digits than Python writes (4,300): far too long
                self.fail(name, "too_long", f"{name} is longer than {MAX_ID_TEXT} characters")
                return None
        if not isinstance(raw, str):
            self.fail(name, "invalid_type", f"{name} must be a string")
        elif len(raw) > MAX_ID_TEXT:
            self.fail(name, "too_long", f"{name} is longer than {MAX_ID_TEXT} characters")
        elif _CONTROL_OR_SURROGATE.search(raw) is not None:
            self.fail(name, "control_characters", f"{name} contains control characters")
        else:
            return raw
        return None

    def properties(self, raw: object) -> str:
        """`raw` as the JSON text to store."""
        if raw is None:
            return "{}"
        if not isinstance(raw, Mapping):
            self.fail(
                "properties", "not_object", f"properties must be a JSON object, got {_kind(raw)}"
            )
            return "{}"
        fast = _fast_properties(raw)
        if fast is not None:
            return fast
        before = len(self.errors)
        clean = self._json_value("properties", raw, 1)
        if len(self.errors) > before:
            return "{}"
        text = dumps_json(clean)
        if len(text.encode()) > MAX_PROPERTIES_BYTES:
            self.fail(
                "properties",
                "too_large",
                f"properties take {len(text.encode())} bytes as JSON; the limit is "
                f"{MAX_PROPERTIES_BYTES}",
            )
            return "{}"
        return text

    def _json_value(self, path: str, value: Any, depth: int) -> Any:
        """Return `value` as plain JSON data, recording what cannot be stored."""
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if _JSON_INT_MIN <= value <= _JSON_INT_MAX:
                return value
            self.fail(path, "out_of_range", f"{path} does not fit in 64 bits; send it as a string")
            return None
        if isinstance(value, str):
            return self._json_string(path, value)
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            self.fail(path, "not_finite", f"{path} is {value}; JSON numbers must be finite")
            return None
        if isinstance(value, Decimal):
            if value.is_finite():
                return str(value)
            self.fail(path, "not_finite", f"{path} is {value}; JSON numbers must be finite")
            return None
        if isinstance(value, datetime | date):
            return value.isoformat()
        if isinstance(value, UUID):
            return str(value)
        if depth > MAX_DEPTH:
            self.fail(path, "too_deep", f"properties nest deeper than {MAX_DEPTH} levels")
            return None
        if isinstance(value, Mapping):
            return self._json_object(path, value, depth)
        if isinstance(value, list | tuple):
            return [self._json_value(f"{path}[{i}]", v, depth + 1) for i, v in enumerate(value)]
        self.fail(path, "invalid_type", f"{path} is a {_kind(value)}, which JSON cannot hold")
        return None

    def _json_object(self, path: str, value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                self.fail(path, "non_string_key", f"{path} has a non-string key {_short(key)}")
                continue
            self._json_string(f"{path} key", key)
            # a str subclass as its text, as orjson writes one as a value (as a key, it
            # refuses it: TypeError, raised from prepare before)
            text = key if type(key) is str else str.__str__(key)
            out[text] = self._json_value(f"{path}.{text}", item, depth + 1)
        return out

    def _json_string(self, path: str, value: str) -> str:
        if "\x00" in value:
            self.fail(path, "nul_character", f"{path} contains a NUL character (\\u0000)")
        elif _has_lone_surrogate(value):
            self.fail(path, "lone_surrogate", f"{path} contains a lone UTF-16 surrogate")
        return value

    def value(self, raw: object) -> Decimal | None:
        if raw is None:
            return None
        number = _to_decimal(raw)
        if number is None:
            self.fail(
                "value",
                "not_a_number",
                f"value must be a decimal number (as text, written as a JSON number: "
                f"297.90, -5, 1.5e2), got {_short(raw)}",
            )
        elif not number.is_finite():
            self.fail("value", "not_finite", "value must be finite (not NaN or Infinity)")
        elif number.copy_abs() >= MAX_ABS_VALUE:  # abs() rounds: 1E1000000 overflowed
            self.fail("value", "out_of_range", "value must be below 10^14 in absolute value")
        elif _places(number) > VALUE_PLACES and number != _to_places(number):
            self.fail(
                "value", "too_precise", f"value may have at most {VALUE_PLACES} decimal places"
            )
        else:
            # "297.9000000" is 297.9 exactly: kept, at the places NUMERIC(18,4) has
            exact = _to_places(number) if _places(number) > VALUE_PLACES else number
            return exact + Decimal(0)  # normalizes -0 to 0
        return None

    def currency(self, raw: object) -> str:
        if raw is None or raw == "":
            return DEFAULT_CURRENCY
        if isinstance(raw, str) and is_currency(raw.upper()):
            return raw.upper()
        self.fail(
            "currency", "invalid_currency", f"currency must be an ISO 4217 code, got {_short(raw)}"
        )
        return DEFAULT_CURRENCY

    def occurred_at(self, raw: object, now: datetime) -> datetime | None:
        if raw is None or raw == "":
            return None
        when = _to_datetime(raw)
        if when is None:
            self.fail(
                "occurred_at", "invalid_datetime", "occurred_at must be an ISO 8601 timestamp"
            )
        elif when.tzinfo is None or when.utcoffset() is None:
            self.fail(
                "occurred_at",
                "naive_datetime",
                "occurred_at must carry a timezone (e.g. 2026-11-29T10:00:00-03:00)",
            )
        else:
            utc = in_utc(when)
            if utc is None or utc < EARLIEST or utc > now + MAX_FUTURE:
                self.fail(
                    "occurred_at",
                    "out_of_window",
                    "occurred_at must be after 2000-01-01 and at most 24 hours ahead",
                )
            else:
                return utc
        return None


def _fast_properties(raw: Mapping[str, Any]) -> str | None:
    """The common case in a few microseconds: orjson refuses non-string keys, surrogates,
    huge integers and unknown types; a walk over containers only checks depth and numbers.
    None when anything looks off: the careful walk then names each problem."""
    try:
        data = orjson.dumps(raw, default=_finite_default, option=_PASSTHROUGH)
    except (TypeError, orjson.JSONEncodeError):
        return None
    if len(data) > MAX_PROPERTIES_BYTES or b"\\u0000" in data:
        return None
    # Nesting needs an opening bracket per level, and orjson writes a non-finite float as
    # null: text with few brackets and no null (the usual properties) needs no walk.
    plain = data.count(b"{") + data.count(b"[") <= MAX_DEPTH and b"null" not in data
    if not plain and not _numbers_ok(raw, 1):
        return None
    # orjson writes only an exact dict as an object (a subclass goes to the default, which
    # refuses it), so this is the object the caller checked `raw` to be.
    return data.decode() if data[:1] == b"{" else None


_PASSTHROUGH = (
    orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


def _finite_default(obj: object) -> object:
    """What the careful walk accepts beyond plain JSON, written the same way."""
    if isinstance(obj, Decimal) and obj.is_finite():
        return str(obj)
    if isinstance(obj, datetime | date):
        return obj.isoformat()
    raise TypeError(type(obj).__name__)


def _numbers_ok(value: Any, depth: int) -> bool:
    """Nesting within MAX_DEPTH and every float finite (orjson would write NaN as null)."""
    if depth > MAX_DEPTH:
        return False
    children = value.values() if isinstance(value, Mapping) else value
    for item in children:
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if kind is float:
            if not math.isfinite(item):
                return False
        elif (
            kind is dict or kind is list or kind is tuple or isinstance(item, Mapping)
        ) and not _numbers_ok(item, depth + 1):
            return False
    return True


def _to_decimal(raw: object) -> Decimal | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, Decimal):
        return raw
    if isinstance(raw, int):
        return Decimal(raw)
    if isinstance(raw, float):
        # repr() is the shortest text that round-trips: 297.9 stays 297.9, not 297.899999...
        return Decimal(repr(raw))
    if isinstance(raw, str):
        return decimal_from_text(raw)
    return None


def decimal_from_text(text: str) -> Decimal | None:
    """The number in `text` written as a JSON number is ("297.90", "-5", "1.5e2"), or
    NaN/Infinity as Decimal spells them (callers refuse those); None for other text.

    The one rule for numbers sent as text: event values, automation filters and provider
    amounts. Decimal() alone also takes "1_000", " 5 ", "+5", ".5" and digits of other
    scripts ("١٠"), which the OpenAPI schema and the README say are no numbers.
    """
    if len(text) > 64:
        return None
    if _DECIMAL_TEXT.fullmatch(text) is None and _NON_FINITE_TEXT.fullmatch(text) is None:
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def fits_value(number: Decimal) -> bool:
    """Whether NUMERIC(18,4) keeps `number` exactly, as an event's value must be: finite,
    below 10^14, at most 4 decimal places (order and checkout totals are held to it too)."""
    return (
        number.is_finite() and number.copy_abs() < MAX_ABS_VALUE and _places(number) <= VALUE_PLACES
    )


def _to_places(number: Decimal) -> Decimal:
    """`number` at VALUE_PLACES decimal places (rounded when it has more digits than
    zeros there; exact below 10^14, far inside the context's 28 digits)."""
    return number.quantize(VALUE_QUANTUM)


def _places(number: Decimal) -> int:
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)
    return max(0, -exponent)


def in_utc(when: datetime) -> datetime | None:
    """An aware `when` in UTC; None when that falls outside years 1 to 9999, which
    `datetime` cannot hold (0001-01-01T00:00:00+01:00, 9999-12-31T23:59:59-01:00)."""
    try:
        return when.astimezone(UTC)
    except OverflowError:
        return None


def stamp(when: datetime) -> str:
    """`when` as every answer, CLI line and outgoing body writes a time: RFC 3339 in UTC
    with "Z", microseconds only when there are some ("2026-11-29T12:00:00Z")."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _to_datetime(raw: object) -> datetime | None:
    if isinstance(raw, datetime):
        return raw
    if isinstance(raw, str) and len(raw) <= 64:
        try:
            return datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return None
    return None


_KINDS: dict[type, str] = {list: "array", tuple: "array", str: "string", dict: "object"}


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def uuid_error(name: str, raw: object) -> FieldError:
    """The error of `raw`, given for the UUID parameter `name`, that is not one."""
    return FieldError(name, "invalid_uuid", f"{name} must be a UUID, got {_short(raw)}")


def _short(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int of more digits than Python writes (4,300)
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else "?"
    return text if len(text) <= 40 else text[:37] + "..."


Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The server clock (UTC, timezone-aware)."""
    return datetime.now(UTC)
