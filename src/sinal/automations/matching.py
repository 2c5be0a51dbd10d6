"""Which automations an event triggers, and why the others did not. No I/O.

`explain_match` is what the dispatcher asks for every automation listening to an event's
metric, and what `GET /v1/events/{id}/trace` shows for every such automation; for the
account's others the trace reads no definition, and says `other_metric_decision`.
Its reasons, checked in this order (the first that applies is reported):

| outcome | meaning |
|---|---|
| `other_metric` | the automation listens to another metric |
| `from_automation` | an automation step emitted the event; such events never trigger (no loops) |
| `own_message` | a status (Delivered, Read, Failed) of a message this automation sent (no loops) |
| `paused` | the automation is paused |
| `created_after_event` | the automation was created after sinal received the event |
| `filter_false` | filter number `filter_index` (on `filter_field`) does not hold |
| `triggered` | the automation runs for this event |

How conditions compare (`evaluate_filters`):

- A field that is absent or JSON `null` fails every operator except `exists: false`.
- Numbers compare as exact decimals, never floats: `297.9`, `297.90` and `"297.90"` in an
  event are equal to a filter value of `297.9`. A *text* filter value is compared as text
  when the event's value is text too (`"00123"` is not `"123"`); write a number to
  compare amounts. Text is a number only when written as a JSON number is (" 5 ",
  "1_000", "+5" and "١٠" are not: `sinal.events.decimal_from_text`). Text that is not a
  number never equals, and is never greater or smaller than, a number — the condition is
  false, not an error.
- `gt`/`gte`/`lt`/`lte` with a date (`"2026-11-29"`) compare the event's date or datetime
  text by calendar date; with a datetime, by instant (naive datetimes never match).
- `contains` on text is a case-insensitive substring test; on a list, an element `eq` test.
- `in` is `eq` against any of the listed values; booleans only equal booleans.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal, Protocol
from uuid import UUID

from sinal.automations.model import (
    AutomationSpec,
    Condition,
    ConditionValue,
    FieldKind,
    parse_condition_field,
    to_moment,
)
from sinal.automations.templates import MISSING, Path, lookup, to_decimal
from sinal.events import stamp
from sinal.integrations.whatsapp import SENT_BY_AUTOMATION

__all__ = [
    "SENT_BY_AUTOMATION",
    "ContactData",
    "ContactView",
    "EventData",
    "EventView",
    "FilterResult",
    "MatchDecision",
    "MatchOutcome",
    "evaluate_condition",
    "evaluate_filters",
    "explain_match",
    "other_metric_decision",
    "resolve_trigger_metric",
    "template_context",
]

MatchOutcome = Literal[
    "triggered",
    "other_metric",
    "from_automation",
    "own_message",
    "paused",
    "created_after_event",
    "filter_false",
]


class EventView(Protocol):
    """What matching reads from an event; `StoredEvent` and `PreparedEvent` fit."""

    @property
    def id(self) -> UUID | None:
        """The event's id."""

    @property
    def metric_name(self) -> str:
        """The metric the event belongs to."""

    @property
    def value(self) -> Decimal | None:
        """The event's amount."""

    @property
    def currency(self) -> str:
        """ISO 4217 code of `value`."""

    @property
    def source(self) -> str:
        """Where the event came from (`shopify`, `whatsapp`, `automation`, …)."""

    @property
    def properties(self) -> Mapping[str, Any]:
        """The event's JSON properties."""

    @property
    def automation_execution_id(self) -> UUID | None:
        """The execution that emitted the event, if a step did."""

    @property
    def occurred_at(self) -> datetime:
        """When it happened, by the source's clock."""

    @property
    def received_at(self) -> datetime | None:
        """When sinal recorded it."""


class ContactView(Protocol):
    """What filter steps and templates read from a contact."""

    @property
    def id(self) -> UUID | None:
        """The contact's id."""

    @property
    def name(self) -> str | None:
        """Full name."""

    @property
    def email(self) -> str | None:
        """E-mail address."""

    @property
    def phone(self) -> str | None:
        """Phone in E.164."""

    @property
    def tags(self) -> Collection[str]:
        """The contact's tags."""

    @property
    def attributes(self) -> Mapping[str, Any]:
        """Custom attributes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventData:
    """A plain `EventView` (for tests, previews and traces built from rows)."""

    metric_name: str
    occurred_at: datetime
    value: Decimal | None = None
    currency: str = "BRL"
    source: str = "api"
    properties: Mapping[str, Any] = field(default_factory=dict)
    automation_execution_id: UUID | None = None
    received_at: datetime | None = None
    id: UUID | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContactData:
    """A plain `ContactView`."""

    id: UUID | None = None
    name: str | None = None
    email: str | None = None
    phone: str | None = None
    tags: Collection[str] = ()
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FilterResult:
    """Whether all conditions hold; if not, the first that failed."""

    matched: bool
    index: int | None = None
    condition: Condition | None = None
    missing: bool = False  # the failed condition's field was absent

    def __bool__(self) -> bool:
        return self.matched

    @property
    def message(self) -> str:
        """A sentence for people: which condition failed, and whether its field was absent."""
        if self.matched or self.condition is None:
            return "all conditions hold"
        c = self.condition
        text = f"filter {self.index} ({c.field} {c.op} {_show(c.value)}) is false"
        return f"{text}: {c.field} is absent" if self.missing else text


@dataclass(frozen=True, slots=True)
class MatchDecision:
    """Whether an automation runs for an event, or the first reason it does not."""

    outcome: MatchOutcome
    message: str
    filter_index: int | None = None
    filter_field: str | None = None

    @property
    def triggered(self) -> bool:
        """Whether the automation runs for the event."""
        return self.outcome == "triggered"

    def as_dict(self) -> dict[str, Any]:
        """The decision as JSON-ready data (for the trace endpoint)."""
        data: dict[str, Any] = {"outcome": self.outcome, "message": self.message}
        if self.filter_index is not None:
            data["filter_index"] = self.filter_index
            data["filter_field"] = self.filter_field
        return data


def resolve_trigger_metric(spec: AutomationSpec) -> str:
    """The metric an automation listens to (`trigger_type` mapped by `TRIGGER_TO_METRIC`)."""
    return spec.metric_name


def explain_match(
    automation: AutomationSpec,
    event: EventView,
    created_at: datetime,
    automation_id: UUID | None = None,
) -> MatchDecision:
    """Decide whether `automation` (created at `created_at`, stored as `automation_id`) runs
    for `event`, and why."""
    metric = resolve_trigger_metric(automation)
    if event.metric_name != metric:
        return other_metric_decision(metric, event.metric_name)
    if event.automation_execution_id is not None:
        return MatchDecision(
            "from_automation",
            f"the event was emitted by execution {event.automation_execution_id}; "
            "events from automations never trigger automations",
        )
    if automation_id is not None and event.properties.get(SENT_BY_AUTOMATION) == str(automation_id):
        return MatchDecision(
            "own_message",
            "the event is a status of a message this automation sent; "
            "it never re-triggers the automation that sent it",
        )
    if not automation.is_active:
        return MatchDecision("paused", "the automation is paused")
    # Received, not occurred: an automation acts on what arrives after it exists, and a
    # backlog of old events (imports, replays) must not wake a brand-new automation.
    arrived = event.received_at or event.occurred_at
    if created_at > arrived:
        return MatchDecision(
            "created_after_event",
            f"the automation was created at {stamp(created_at)}, "
            f"after the event arrived at {stamp(arrived)}",
        )
    result = evaluate_filters(automation.filters, event)
    if not result.matched:
        assert result.condition is not None
        return MatchDecision("filter_false", result.message, result.index, result.condition.field)
    return MatchDecision("triggered", "all conditions hold")


def other_metric_decision(metric: str, event_metric: str) -> MatchDecision:
    """The decision for an automation listening to `metric` on an event of `event_metric`."""
    return MatchDecision("other_metric", f"listens to {metric!r}, not {event_metric!r}")


def evaluate_filters(
    filters: Sequence[Condition], event: EventView, contact: ContactView | None = None
) -> FilterResult:
    """Check every condition against the event (and contact); report the first false one."""
    for index, condition in enumerate(filters):
        actual = _field_value(condition.field, event, contact)
        if not evaluate_condition(condition, actual):
            return FilterResult(False, index, condition, missing=_is_absent(actual))
    return FilterResult(True)


def evaluate_condition(condition: Condition, actual: object) -> bool:
    """Whether one condition holds for `actual` (`MISSING` when the field is absent)."""
    op, expected = condition.op, condition.value
    if op == "exists":
        return (not _is_absent(actual)) == expected
    if _is_absent(actual):
        return False
    if op == "eq":
        return _equals(actual, expected)
    if op == "neq":
        return not _equals(actual, expected)
    if op == "in":
        return isinstance(expected, tuple) and any(_equals(actual, item) for item in expected)
    if op == "contains":
        return _contains(actual, expected)
    order = _compare(actual, expected)
    if order is None:
        return False
    return {"gt": order > 0, "gte": order >= 0, "lt": order < 0, "lte": order <= 0}[op]


def template_context(event: EventView, contact: ContactView | None = None) -> dict[str, object]:
    """The `{"event": …, "contact": …}` mapping message templates are rendered with."""
    return {
        "event": {
            "id": event.id,
            "metric_name": event.metric_name,
            "value": event.value,
            "currency": event.currency,
            "source": event.source,
            "occurred_at": event.occurred_at,
            "properties": event.properties,
        },
        "contact": {} if contact is None else _contact_fields(contact),
    }


def _contact_fields(contact: ContactView) -> dict[str, object]:
    return {
        "id": contact.id,
        "name": contact.name,
        "email": contact.email,
        "phone": contact.phone,
        "tags": list(contact.tags),
        "attributes": contact.attributes,
    }


@lru_cache(maxsize=4096)
def _parsed_field(text: str) -> tuple[Path, FieldKind]:
    return parse_condition_field(text, allow_contact=True)


def _field_value(name: str, event: EventView, contact: ContactView | None) -> object:
    path, _kind = _parsed_field(name)
    root, rest = path[0], path[1:]
    if root == "properties":
        return lookup(event.properties, rest)
    if root == "contact":
        return MISSING if contact is None else lookup(_contact_fields(contact), rest)
    if root == "value":
        return event.value
    return event.currency if root == "currency" else event.source


def _is_absent(value: object) -> bool:
    return value is MISSING or value is None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _equals(actual: object, expected: ConditionValue) -> bool:
    if isinstance(expected, tuple):
        return False
    if isinstance(actual, bool) or isinstance(expected, bool):
        return actual is expected
    if _is_number(actual) or _is_number(expected):
        left, right = to_decimal(actual), to_decimal(expected)
        return left is not None and right is not None and left == right
    return isinstance(actual, str) and actual == expected


def _contains(actual: object, expected: ConditionValue) -> bool:
    if isinstance(expected, tuple):
        return False
    if isinstance(actual, str):
        return isinstance(expected, str) and expected.casefold() in actual.casefold()
    if isinstance(actual, list | tuple | set | frozenset):
        return any(_equals(item, expected) for item in actual)
    return False


def _compare(actual: object, expected: ConditionValue) -> int | None:
    """-1, 0 or 1 comparing `actual` with `expected`; None when they do not compare."""
    if isinstance(expected, bool | tuple) or isinstance(actual, bool):
        return None
    target = to_decimal(expected)
    if target is not None:
        number = to_decimal(actual)
        return None if number is None else (number > target) - (number < target)
    moment = to_moment(expected)
    found = to_moment(actual)
    if isinstance(moment, datetime):
        if not isinstance(found, datetime) or found.utcoffset() is None:
            return None
        return (found > moment) - (found < moment)
    if isinstance(moment, date) and found is not None:
        day = found.date() if isinstance(found, datetime) else found
        return (day > moment) - (day < moment)
    return None


def _show(value: ConditionValue) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)
