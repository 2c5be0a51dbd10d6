"""Automation definitions: parsed and checked from JSON-like data, no I/O.

```json
{"name": "Pedido pago", "status": "active", "trigger_type": "order_paid",
 "filters": [{"field": "properties.total", "op": "gte", "value": 100}],
 "steps": [{"type": "send_message", "text": "Olá {{ contact.name | first_name }}!"},
           {"type": "wait", "seconds": 3600},
           {"type": "filter", "conditions": [{"field": "contact.tags", "op": "contains",
                                               "value": "vip"}]},
           {"type": "add_tag", "tag": "comprou"}]}
```

- `send_message`, `ai_respond` and `send_template` (its `parameters`) take
  `"track_links": true` (default false): each http(s) URL of the rendered text is sent as
  the short URL of a tracked link made for the execution's contact, whose clicks record
  Link Clicked; `campaign` (default: the automation's name) names them.
- `send_message`, `ai_respond` and `send_template` take `"phone_number_id"` (optional):
  the WhatsApp number to send from to a contact who has written to none of the account's
  numbers (`steps._whatsapp_sender` has the whole rule); that the account has it is
  checked when the definition is saved (`service`: 422 `unknown_connection`), not here.
- `webhook` takes `"secret": "whsec_<base64 of 24 to 64 bytes>"` (optional): its requests
  are then signed as Standard Webhooks sign (`steps`). The API shows it as `SECRET_MASK`
  (`redact_secrets`), which a PATCH may send back to keep it (`apply_patch`). Its
  `headers`' values are secrets too (an `Authorization`, an `X-Api-Key`): shown as
  `HEADER_MASK`, each one kept alike when sent back so.
- Exactly one of `trigger_metric` (any metric name, custom too) and `trigger_type` (one of
  the seed's 8 event triggers, resolved through `TRIGGER_TO_METRIC`). `status` defaults
  to `active`; `filters` to none. 1 to 50 steps.
- Filter fields: `value`, `currency`, `source`, `properties.<path>` (`properties.total`,
  `properties.items[0].sku`; see `templates` for the path syntax). Filter steps may also
  use `contact.name`, `contact.email`, `contact.phone` and `contact.tags` (not
  `contact.attributes.<path>` until contacts hold custom attributes: such a filter could
  never hold). Operators and the values they take:

  | op | value | fields |
  |---|---|---|
  | `eq`, `neq` | text, number or boolean | all but `contact.tags` |
  | `gt`, `gte`, `lt`, `lte` | number (`100`, `"297.90"`), date, aware datetime | `value`, paths |
  | `contains` | text (any case) or, for lists, an element | texts, paths, `contact.tags` |
  | `in` | a non-empty list (≤ 100) of what `eq` takes | all but `contact.tags` |
  | `exists` | `true` / `false` | all |

  Dates are `2026-11-29`; datetimes ISO 8601 with an offset (`2026-11-29T10:00:00-03:00`).
  Values for `contact.email`, `contact.phone` and `contact.tags` are kept as contacts
  store them (`normalize_email`, `normalize_phone`, `normalize_tag`), and refused when no
  contact could have them; `contains` on a phone keeps the value's digits.
  How values compare at run time is `matching`'s docstring.

Every bad field is reported at once, as a `FieldError` whose `field` is a JSON path
(`steps[2].text`, `filters[0].op`) and whose `code` is one of: `required`, `invalid_type`,
`empty`, `too_long`, `too_many`, `control_characters`, `unknown_field`, `invalid_choice`,
`conflict`, `reserved`, `unknown_trigger`, `not_event_trigger`, `invalid_field`,
`unsupported_operator`, `invalid_value`, `naive_datetime`, `out_of_range`, `invalid_format`,
`invalid_url`, `unsupported_scheme`, `invalid_header`, `forbidden_header`,
`duplicate_header`, `too_deep`, `in_the_past`, or a template's syntax code (see
`TemplateSyntaxError`).

A `wait` step's `until` is checked against the time only when a definition is saved
(`parse_automation(…, now=…)`, `apply_patch(…, now=…)`): one already past then is
`in_the_past`, almost surely a mistake (it would not wait at all), unless the stored
definition had that same `until` (saved while it was ahead). A stored definition is read
back without `now`, so one whose date has passed since keeps running, past meaning at once.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import unicodedata
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, ClassVar, Final, Literal, TypeAlias, TypeGuard, TypeVar

from sinal.automations.templates import (
    Path,
    TemplateSyntaxError,
    check_fields,
    parse_path,
    parse_template,
    to_decimal,
)
from sinal.catalog import TRIGGER_TO_METRIC, TRIGGER_TYPES
from sinal.catalog.metrics import misspelt_metric_message, misspelt_system_metric
from sinal.contacts import InvalidIdentity, normalize_email, normalize_phone, normalize_tag
from sinal.currencies import is_currency
from sinal.errors import FieldError, InvalidContact, _FieldErrors
from sinal.events import MAX_METRIC_NAME, normalize_metric_name, stamp
from sinal.integrations.links import MAX_CAMPAIGN_LENGTH
from sinal.keyring import SealedSecret, is_sealed
from sinal.urls import MAX_URL_LENGTH, target_url_problem

__all__ = [
    "HEADER_MASK",
    "MAX_CONDITIONS",
    "MAX_STEPS",
    "OPERATORS",
    "SECRET_MASK",
    "STEP_TYPES",
    "AddTag",
    "AiRespond",
    "AutomationSpec",
    "CloseConversation",
    "Condition",
    "ConditionValue",
    "FieldKind",
    "FilterStep",
    "InvalidAutomation",
    "Operator",
    "RemoveTag",
    "Scalar",
    "SendMessage",
    "SendTemplate",
    "Status",
    "Step",
    "Wait",
    "Webhook",
    "apply_patch",
    "find_sealed_value",
    "parse_automation",
    "parse_condition_field",
    "redact_secrets",
    "signing_key",
    "to_moment",
]

Status = Literal["active", "paused"]
Operator = Literal["eq", "neq", "gt", "gte", "lt", "lte", "contains", "in", "exists"]
OPERATORS: Final[tuple[Operator, ...]] = (
    "eq", "neq", "gt", "gte", "lt", "lte", "contains", "in", "exists",
)  # fmt: skip
"""The filter operators, in documentation order."""

Scalar: TypeAlias = str | int | float | Decimal | bool
ConditionValue: TypeAlias = Scalar | tuple[Scalar, ...]

MAX_STEPS: Final = 50
MAX_CONDITIONS: Final = 20
MAX_NAME: Final = 200
MAX_TEXT: Final = 4096  # WhatsApp's limit for a text message body
MAX_PROMPT: Final = 16_000
MAX_MAX_TOKENS: Final = 32_768
MAX_IN_VALUES: Final = 100
# Integers below this are exact as floats (2^53 ~ 9e15) and fit JSON readers' int64.
MAX_NUMBER: Final = Decimal("1e15")
MAX_STRING_VALUE: Final = 1024
MAX_WAIT_SECONDS: Final = 30 * 24 * 3600
MAX_HEADERS: Final = 20
MAX_HEADER_VALUE: Final = 4096
MAX_TEMPLATE_NAME: Final = 512
MAX_PHONE_NUMBER_ID: Final = 200  # a sending step's; Meta's are 15 or so digits
MAX_PARAMETERS: Final = 50
MAX_COMPONENTS: Final = 10
MAX_COMPONENT_DEPTH: Final = 8
# A webhook step's signing secret: whsec_ and the base64 of its bytes (Standard Webhooks).
SECRET_PREFIX: Final = "whsec_"
MIN_SECRET_BYTES: Final = 24
MAX_SECRET_BYTES: Final = 64
SECRET_MASK: Final = "whsec_********"
"""What the API shows for a webhook step's secret; sent back, it keeps the secret set."""
HEADER_MASK: Final = "********"
"""What the API shows for each value of a webhook step's headers; sent back, it keeps it."""

_LANGUAGE: Final = re.compile(r"[a-z]{2,3}(_[A-Z]{2,3})?")
_TEMPLATE_NAME: Final = re.compile(r"[a-z0-9_]+")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token
_FORBIDDEN_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_ISO_DATE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_EVENT_FIELDS: Final = ("value", "currency", "source")
_CONTACT_TEXT: Final = ("name", "email", "phone")

FieldKind = Literal["number", "currency", "text", "list", "any"]
"""What a filter field holds, which decides the operators it supports."""
_OPS_BY_KIND: Final[Mapping[FieldKind, frozenset[Operator]]] = {
    "number": frozenset({"eq", "neq", "gt", "gte", "lt", "lte", "in", "exists"}),
    "currency": frozenset({"eq", "neq", "in", "exists"}),
    "text": frozenset({"eq", "neq", "contains", "in", "exists"}),
    "list": frozenset({"contains", "exists"}),
    "any": frozenset(OPERATORS),
}


_T = TypeVar("_T")
_STATUSES: Final[Mapping[str, Status]] = {"active": "active", "paused": "paused"}
_OPERATOR_NAMES: Final[Mapping[str, Operator]] = {op: op for op in OPERATORS}


class InvalidAutomation(_FieldErrors):
    """An automation definition is malformed; `.errors` lists every bad field."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Condition:
    """One filter: `field` `op` `value`, e.g. `properties.total gte 100`."""

    field: str
    op: Operator
    value: ConditionValue

    def to_dict(self) -> dict[str, Any]:
        """The condition as JSON-like data."""
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"field": self.field, "op": self.op, "value": value}


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Send a WhatsApp text; `text` is a template. With `track_links`, its URLs go out as
    tracked short links (of `campaign`, default the automation's name)."""

    text: str
    track_links: bool = False
    campaign: str | None = None
    phone_number_id: str | None = None  # see `_sending_dict`
    type: ClassVar[Literal["send_message"]] = "send_message"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        return {"type": self.type, "text": self.text, **_sending_dict(self)}


@dataclass(frozen=True, slots=True)
class SendTemplate:
    """Send an approved WhatsApp template: body `parameters`, or Meta `components`."""

    name: str
    language: str
    parameters: tuple[str, ...] = ()
    components: tuple[dict[str, Any], ...] = ()
    track_links: bool = False  # in `parameters` (components go to Meta as given)
    campaign: str | None = None
    phone_number_id: str | None = None
    type: ClassVar[Literal["send_template"]] = "send_template"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        data: dict[str, Any] = {"type": self.type, "name": self.name, "language": self.language}
        if self.parameters:
            data["parameters"] = list(self.parameters)
        if self.components:
            data["components"] = list(self.components)
        return {**data, **_sending_dict(self)}


@dataclass(frozen=True, slots=True)
class AddTag:
    """Add a tag to the contact."""

    tag: str
    type: ClassVar[Literal["add_tag"]] = "add_tag"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        return {"type": self.type, "tag": self.tag}


@dataclass(frozen=True, slots=True)
class RemoveTag:
    """Remove a tag from the contact."""

    tag: str
    type: ClassVar[Literal["remove_tag"]] = "remove_tag"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        return {"type": self.type, "tag": self.tag}


@dataclass(frozen=True, slots=True)
class CloseConversation:
    """Close the contact's open conversation."""

    type: ClassVar[Literal["close_conversation"]] = "close_conversation"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        return {"type": self.type}


@dataclass(frozen=True, slots=True)
class AiRespond:
    """Ask the account's AI connection for an answer and send it; prompts are templates."""

    system_prompt: str | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    track_links: bool = False  # in the answer
    campaign: str | None = None
    phone_number_id: str | None = None
    type: ClassVar[Literal["ai_respond"]] = "ai_respond"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        data: dict[str, Any] = {"type": self.type}
        for key in ("system_prompt", "prompt", "max_tokens"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return {**data, **_sending_dict(self)}


@dataclass(frozen=True, slots=True)
class Webhook:
    """POST the event as JSON to `url` (private targets are refused when it runs); with a
    `secret` (`whsec_<base64>`), signed as Standard Webhooks sign (`steps`)."""

    url: str
    # (name, value): each value as given, or as stored sealed, like `secret`
    headers: tuple[tuple[str, str | SealedSecret], ...] = dataclasses.field(default=(), repr=False)
    # as given, or as stored sealed (`sinal.keyring`): the step opens it when it runs
    secret: str | SealedSecret | None = dataclasses.field(default=None, repr=False)
    type: ClassVar[Literal["webhook"]] = "webhook"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data, its secret and header values included (as stored;
        the API shows `redact_secrets` of it)."""
        data: dict[str, Any] = {"type": self.type, "url": self.url}
        if self.headers:
            data["headers"] = {
                name: value.as_dict() if isinstance(value, SealedSecret) else value
                for name, value in self.headers
            }
        if isinstance(self.secret, SealedSecret):
            data["secret"] = self.secret.as_dict()
        elif self.secret is not None:
            data["secret"] = self.secret
        return data


def signing_key(secret: str) -> bytes:
    """The HMAC key of a webhook step's secret (checked when the step was): its bytes."""
    key = _secret_bytes(secret)
    assert key is not None, "checked by parse_automation"
    return key


@dataclass(frozen=True, slots=True)
class Wait:
    """Resume the execution after `seconds`, or at `until` (UTC; past means at once)."""

    seconds: int | None = None
    until: datetime | None = None
    type: ClassVar[Literal["wait"]] = "wait"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        if self.until is not None:
            return {"type": self.type, "until": stamp(self.until)}
        return {"type": self.type, "seconds": self.seconds}


@dataclass(frozen=True, slots=True)
class FilterStep:
    """Stop the execution unless every condition holds (contact fields allowed)."""

    conditions: tuple[Condition, ...]
    type: ClassVar[Literal["filter"]] = "filter"

    def to_dict(self) -> dict[str, Any]:
        """The step as JSON-like data."""
        return {"type": self.type, "conditions": [c.to_dict() for c in self.conditions]}


def _sending_dict(step: SendMessage | SendTemplate | AiRespond) -> dict[str, Any]:
    """A sending step's link tracking (nothing when off) and `phone_number_id` (the number
    it sends from to a contact who has written to none of the account's numbers), as
    JSON-like data."""
    data: dict[str, Any] = {}
    if step.track_links:
        data["track_links"] = True
    if step.track_links and step.campaign is not None:
        data["campaign"] = step.campaign
    if step.phone_number_id is not None:
        data["phone_number_id"] = step.phone_number_id
    return data


Step: TypeAlias = (
    SendMessage
    | SendTemplate
    | AddTag
    | RemoveTag
    | CloseConversation
    | AiRespond
    | Webhook
    | Wait
    | FilterStep
)
"""One automation step; `step.type` names its kind."""


@dataclass(frozen=True, slots=True)
class AutomationSpec:
    """A checked automation definition (what `POST /v1/automations` receives)."""

    name: str
    steps: tuple[Step, ...]
    trigger_metric: str | None = None
    trigger_type: str | None = None
    filters: tuple[Condition, ...] = ()
    status: Status = "active"

    @property
    def metric_name(self) -> str:
        """The metric this automation listens to (`trigger_type` resolved)."""
        if self.trigger_metric is not None:
            return self.trigger_metric
        assert self.trigger_type is not None
        return TRIGGER_TO_METRIC[self.trigger_type]

    @property
    def is_active(self) -> bool:
        """Whether the automation runs (not paused)."""
        return self.status == "active"

    def to_dict(self) -> dict[str, Any]:
        """The definition as JSON-like data; `parse_automation` reads it back equal."""
        data: dict[str, Any] = {"name": self.name, "status": self.status}
        if self.trigger_metric is not None:
            data["trigger_metric"] = self.trigger_metric
        else:
            data["trigger_type"] = self.trigger_type
        data["filters"] = [c.to_dict() for c in self.filters]
        data["steps"] = [s.to_dict() for s in self.steps]
        return data


# --------------------------------------------------------------------------- parsing


def parse_automation(
    data: object, *, now: datetime | None = None, kept: Collection[datetime] = ()
) -> AutomationSpec:
    """Check a definition; raise `InvalidAutomation` listing every bad field. Given `now`
    (the definition is being saved), a `wait` step's `until` before it is refused, unless
    it is one of `kept` (the untils of the definition stored, saved while they were ahead)."""
    c = _Checker(now, kept)
    body = c.mapping("$", data, _TOP_KEYS)
    if body is None:
        raise InvalidAutomation(c.errors)
    name = c.text("name", body.get("name"), MAX_NAME, required=True)
    status = c.choice("status", body.get("status", "active"), _STATUSES)
    trigger_metric, trigger_type = _trigger(c, body)
    filters = _conditions(c, "filters", body.get("filters", []), allow_empty=True)
    steps = _steps(c, body.get("steps"))
    if c.errors:
        raise InvalidAutomation(c.errors)
    assert name is not None
    assert status is not None
    return AutomationSpec(
        name=name,
        status=status,
        trigger_metric=trigger_metric,
        trigger_type=trigger_type,
        filters=filters,
        steps=steps,
    )


def apply_patch(
    spec: AutomationSpec | Mapping[str, Any], patch: object, *, now: datetime | None = None
) -> AutomationSpec:
    """Apply a PATCH body (top-level merge; `null` removes) to a definition (checked, or as
    stored) and check the result (with `now`, as `parse_automation` does: the stored
    definition's untils are kept, past or not)."""
    if not isinstance(patch, Mapping):
        raise InvalidAutomation([FieldError("$", "invalid_type", "the patch must be an object")])
    data = spec.to_dict() if isinstance(spec, AutomationSpec) else dict(spec)
    # Switching trigger kinds: naming one trigger replaces the other unless both are named.
    for given, other in (("trigger_metric", "trigger_type"), ("trigger_type", "trigger_metric")):
        if patch.get(given) is not None and other not in patch:
            data.pop(other, None)
    stored_steps = data.get("steps")
    for key, value in patch.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    if isinstance(patch.get("steps"), list) and isinstance(stored_steps, list):
        data["steps"] = _keep_secrets(patch["steps"], stored_steps)
    return parse_automation(data, now=now, kept=_untils(stored_steps))


def _untils(steps: object) -> list[datetime]:
    """The `until` of each wait step of a stored definition's steps."""
    if not isinstance(steps, list):
        return []
    found = (to_moment(s.get("until")) for s in steps if isinstance(s, Mapping))
    return [u for u in found if isinstance(u, datetime) and u.utcoffset() is not None]


def redact_secrets(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A definition as stored, with each webhook step's secret shown as `SECRET_MASK` and
    each of its headers' values as `HEADER_MASK`."""
    steps = spec.get("steps")
    if not isinstance(steps, list):
        return dict(spec)
    return {**spec, "steps": [_redacted(step) if _is_webhook(step) else step for step in steps]}


def _redacted(step: Mapping[str, Any]) -> dict[str, Any]:
    shown = dict(step)
    if _is_signed_webhook(step):
        shown["secret"] = SECRET_MASK
    if isinstance(headers := step.get("headers"), Mapping):
        shown["headers"] = dict.fromkeys(headers, HEADER_MASK)
    return shown


def _keep_secrets(steps: list[Any], stored: list[Any]) -> list[Any]:
    """A PATCH's `steps`, each webhook step's secret sent as `SECRET_MASK`, and each header
    value sent as `HEADER_MASK` (as the API shows them, sent back), given the value stored
    for it (`_kept`). A mask matching no one value stays, and fails the check."""
    kept = []
    for i, sent in enumerate(steps):
        if not _is_webhook(sent):
            kept.append(sent)
            continue
        same = stored[i] if i < len(stored) else None
        url = sent.get("url")
        step = dict(sent)
        if step.get("secret") == SECRET_MASK:
            step["secret"] = _kept(stored, same, url, _secret_of, SECRET_MASK)
        if isinstance(headers := step.get("headers"), Mapping):
            step["headers"] = {
                name: _kept(stored, same, url, _header_of(name), value)
                if value == HEADER_MASK else value
                for name, value in headers.items()
            }  # fmt: skip
        kept.append(step)
    return kept


def _kept(
    stored: list[Any],
    same: object,
    url: object,
    get: Callable[[Mapping[str, Any]], Any],
    mask: str,
) -> Any:
    """The value (`get` of a stored webhook step: its secret, a header's) that a step sent
    back with `mask` stands for: the one value of the stored webhook steps of the same url
    (moved, others put before it), or that of the stored webhook step at the same index
    (its url changed, or several of the url have different values); `mask` itself when
    there is no one such value."""
    of_url = (get(s) for s in stored if _is_webhook(s) and s.get("url") == url)
    found = _distinct(value for value in of_url if value is not None)
    if (
        _is_webhook(same)
        and (here := get(same)) is not None
        and (not found or same.get("url") == url)
    ):
        found = [here]
    return found[0] if len(found) == 1 else mask


def _secret_of(step: Mapping[str, Any]) -> Any:
    """A stored webhook step's secret (a text, or a sealed value), or None."""
    return step["secret"] if _is_signed_webhook(step) else None


def _header_of(name: str) -> Callable[[Mapping[str, Any]], Any]:
    """What reads the value of header `name` (in any case) of a stored webhook step."""

    def get(step: Mapping[str, Any]) -> Any:
        headers = step.get("headers")
        for key, value in headers.items() if isinstance(headers, Mapping) else ():
            if key.lower() == name.lower() and (isinstance(value, str) or is_sealed(value)):
                return value
        return None

    return get


def _distinct(values: Iterable[Any]) -> list[Any]:
    """The different values among `values` (texts, or sealed values: dicts), in order."""
    found: list[Any] = []
    for value in values:
        if value not in found:
            found.append(value)
    return found


def _is_webhook(step: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(step, Mapping) and step.get("type") == "webhook"


def _is_signed_webhook(step: object) -> TypeGuard[Mapping[str, Any]]:
    return _is_webhook(step) and (isinstance(step.get("secret"), str) or
                                  is_sealed(step.get("secret")))  # fmt: skip


def find_sealed_value(steps: object) -> FieldError | None:
    """The error for the first sealed value in a webhook step of `steps`, as its secret or
    a header's value, or None: a sealed value is what sinal stores, never what a client
    sends."""
    if not isinstance(steps, list):
        return None
    for i, step in enumerate(steps):
        if not _is_webhook(step):
            continue
        if is_sealed(step.get("secret")):
            return FieldError(f"steps[{i}].secret", "invalid_type",
                              f"secret must be text: {SECRET_PREFIX} and base64")  # fmt: skip
        headers = step.get("headers")
        for name, value in headers.items() if isinstance(headers, Mapping) else ():
            if is_sealed(value):
                return FieldError(f"steps[{i}].headers.{name}", "invalid_header",
                                  "header values are text (at most 4096 characters)")  # fmt: skip
    return None


def parse_condition_field(text: str, *, allow_contact: bool) -> tuple[Path, FieldKind]:
    """Parse a filter field into its path and kind; raise `ValueError` with the reason."""
    try:
        path = parse_path(text)
    except TemplateSyntaxError as exc:
        raise ValueError(str(exc)) from exc
    root, rest = path[0], path[1:]
    if root in _EVENT_FIELDS and not rest:
        kinds: dict[object, FieldKind] = {"value": "number", "currency": "currency"}
        return path, kinds.get(root, "text")
    if root == "properties" and rest:
        return path, "any"
    if root == "contact" and not allow_contact:
        raise ValueError("contact fields are only available in filter steps")
    if root == "contact" and len(path) == 2 and path[1] in _CONTACT_TEXT:
        return path, "text"
    if root == "contact" and path[1:] == ("tags",):
        return path, "list"
    if root == "contact" and len(path) > 2 and path[1] == "attributes":
        return path, "any"  # matched as soon as contacts hold them; refused until then
    known = "value, currency, source, properties.<path>"
    if allow_contact:
        known += ", contact.name|email|phone|tags"
    raise ValueError(f"unknown field {text!r}; use {known}")


def to_moment(value: object) -> date | datetime | None:
    """A date or datetime from an ISO 8601 text (or a date/datetime); None otherwise."""
    if isinstance(value, date):
        return value
    if not isinstance(value, str) or len(value) > 64:
        return None
    text = value.strip()
    if _ISO_DATE.fullmatch(text):
        try:
            return date.fromisoformat(text)
        except ValueError:
            return None
    if not _ISO_DATE.match(text) or len(text) < 11 or text[10] not in "Tt ":
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None


_TOP_KEYS: Final = ("name", "status", "trigger_metric", "trigger_type", "filters", "steps")


class _Checker:
    """Collects one FieldError per bad field instead of stopping at the first."""

    def __init__(self, now: datetime | None = None, kept: Collection[datetime] = ()) -> None:
        self.errors: list[FieldError] = []
        self.now = now  # when the definition is saved; None when a stored one is read
        self.kept = kept

    def fail(self, field: str, code: str, message: str) -> None:
        self.errors.append(FieldError(field, code, message))

    def mapping(
        self, field: str, raw: object, keys: Collection[str]
    ) -> Mapping[str, object] | None:
        if not isinstance(raw, Mapping):
            self.fail(field, "invalid_type", f"{_name(field)} must be an object")
            return None
        prefix = "" if field == "$" else f"{field}."
        shown = ", ".join(k for k in keys if k != "type")
        expected = f"expected one of: {shown}" if shown else "this step takes no fields"
        for key in raw:
            if key not in keys:
                self.fail(f"{prefix}{key}", "unknown_field", f"unknown field {key!r}; {expected}")
        return raw

    def text(
        self, field: str, raw: object, limit: int, *, required: bool, multiline: bool = False
    ) -> str | None:
        """Check a text; single-line texts are stripped, multi-line ones kept as written."""
        if raw is None:
            if required:
                self.fail(field, "required", f"{field} is required")
            return None
        if not isinstance(raw, str):
            self.fail(field, "invalid_type", f"{field} must be a string")
        elif not raw.strip():
            self.fail(field, "empty", f"{field} must not be empty")
        elif len(raw) > limit:
            self.fail(field, "too_long", f"{field} is longer than {limit} characters")
        elif _has_control(raw, allow_newlines=multiline):
            self.fail(field, "control_characters", f"{field} contains control characters")
        else:
            return raw if multiline else raw.strip()
        return None

    def template(
        self, field: str, raw: object, limit: int, *, required: bool, multiline: bool = False
    ) -> str | None:
        """Check a text that is a template (see `templates`)."""
        text = self.text(field, raw, limit, required=required, multiline=multiline)
        if text is not None:
            try:
                check_fields(parse_template(text))
            except TemplateSyntaxError as exc:
                self.fail(field, exc.code, str(exc))
                return None
        return text

    def tag(self, field: str, raw: object) -> str | None:
        """A tag as contacts store it (`sinal.contacts.normalize_tag`): trimmed, NFC."""
        if raw is None:
            self.fail(field, "required", f"{field} is required")
            return None
        try:
            return normalize_tag(raw, field)
        except InvalidContact as exc:
            self.errors.extend(exc.errors)
            return None

    def choice(self, field: str, raw: object, choices: Mapping[str, _T]) -> _T | None:
        if isinstance(raw, str) and raw in choices:
            return choices[raw]
        self.fail(field, "invalid_choice", f"{field} must be one of: {', '.join(choices)}")
        return None

    def integer(self, field: str, raw: object, low: int, high: int) -> int | None:
        if not isinstance(raw, int) or isinstance(raw, bool):
            self.fail(field, "invalid_type", f"{field} must be a whole number")
        elif not low <= raw <= high:
            self.fail(field, "out_of_range", f"{field} must be between {low} and {high}")
        else:
            return raw
        return None

    def items(self, field: str, raw: object, limit: int, *, allow_empty: bool) -> list[object]:
        if not isinstance(raw, list | tuple):
            self.fail(field, "invalid_type", f"{field} must be a list")
            return []
        if not raw and not allow_empty:
            self.fail(field, "empty", f"{field} must not be empty")
        elif len(raw) > limit:
            self.fail(field, "too_many", f"{field} may hold at most {limit} items")
            return []
        return list(raw)


def _trigger(c: _Checker, body: Mapping[str, object]) -> tuple[str | None, str | None]:
    metric_raw, type_raw = body.get("trigger_metric"), body.get("trigger_type")
    if metric_raw is None and type_raw is None:
        c.fail("trigger_metric", "required", "give trigger_metric or trigger_type")
        return None, None
    if metric_raw is not None and type_raw is not None:
        c.fail("trigger_type", "conflict", "give trigger_metric or trigger_type, not both")
        return None, None
    if metric_raw is not None:
        return _metric_name(c, metric_raw), None
    if not isinstance(type_raw, str):
        c.fail("trigger_type", "invalid_type", "trigger_type must be a string")
    elif type_raw in TRIGGER_TYPES:
        return None, type_raw
    elif type_raw in TRIGGER_TO_METRIC:
        c.fail(
            "trigger_type",
            "not_event_trigger",
            f"{type_raw!r} automations are not started by events; "
            f"use one of: {', '.join(TRIGGER_TYPES)}",
        )
    else:
        c.fail("trigger_type", "unknown_trigger", f"use one of: {', '.join(TRIGGER_TYPES)}")
    return None, None


def _metric_name(c: _Checker, raw: object) -> str | None:
    """The ledger's rules for metric names (see `sinal.events`)."""
    field = "trigger_metric"
    name = normalize_metric_name(raw) if isinstance(raw, str) else None
    if name is None:
        c.fail(field, "invalid_type", "trigger_metric must be a string")
    elif not name:
        c.fail(field, "empty", "trigger_metric must not be empty")
    elif len(name) > MAX_METRIC_NAME:
        c.fail(field, "too_long", f"trigger_metric is longer than {MAX_METRIC_NAME} characters")
    elif _has_control(name, allow_newlines=False):
        c.fail(field, "control_characters", "trigger_metric contains control characters")
    elif name.startswith("__"):
        c.fail(field, "reserved", "metric names starting with '__' are reserved")
    elif (system := misspelt_system_metric(name)) is not None:
        c.fail(field, "misspelt_system_metric", misspelt_metric_message(name, system))
    else:
        return name
    return None


# --------------------------------------------------------------------------- conditions


def _conditions(
    c: _Checker, field: str, raw: object, *, allow_empty: bool, allow_contact: bool = False
) -> tuple[Condition, ...]:
    found: list[Condition] = []
    for i, item in enumerate(c.items(field, raw, MAX_CONDITIONS, allow_empty=allow_empty)):
        condition = _condition(c, f"{field}[{i}]", item, allow_contact)
        if condition is not None:
            found.append(condition)
    return tuple(found)


def _condition(c: _Checker, at: str, raw: object, allow_contact: bool) -> Condition | None:
    body = c.mapping(at, raw, ("field", "op", "value"))
    if body is None:
        return None
    before = len(c.errors)
    field_raw, op_raw = body.get("field"), body.get("op")
    kind: FieldKind | None = None
    if not isinstance(field_raw, str):
        code = "required" if field_raw is None else "invalid_type"
        c.fail(f"{at}.field", code, "field must be a string such as 'properties.total'")
    else:
        try:
            path, kind = parse_condition_field(field_raw, allow_contact=allow_contact)
        except ValueError as exc:
            c.fail(f"{at}.field", "invalid_field", str(exc))
        else:
            if path[:2] == ("contact", "attributes"):  # `Contact` has none: never true
                c.fail(f"{at}.field", "invalid_field",
                       "contacts have no custom attributes yet, so a filter on one would "
                       "never hold; use contact.tags or the event's properties")  # fmt: skip
    if op_raw is None:
        c.fail(f"{at}.op", "required", "op is required")
        return None
    op = c.choice(f"{at}.op", op_raw, _OPERATOR_NAMES)
    if len(c.errors) > before:
        return None
    assert kind is not None
    assert op is not None
    assert isinstance(field_raw, str)
    if op not in _OPS_BY_KIND[kind]:
        allowed = ", ".join(o for o in OPERATORS if o in _OPS_BY_KIND[kind])
        c.fail(f"{at}.op", "unsupported_operator", f"{field_raw} supports: {allowed}")
        return None
    if "value" not in body:
        c.fail(f"{at}.value", "required", "value is required")
        return None
    value = _condition_value(c, f"{at}.value", op, kind, body["value"])
    if value is not None and op != "exists" and path[0] == "contact":
        value = _contact_value(c, f"{at}.value", path[1], op, value)
    return None if value is None else Condition(field_raw, op, value)


def _contact_value(
    c: _Checker, at: str, name: object, op: Operator, value: ConditionValue
) -> ConditionValue | None:
    """An email, phone or tag compared with a contact's, as contacts store them (a
    filter written "Ana@Loja.com" or "+55 11 98765-4321" could never hold otherwise).
    `contains` on a phone keeps the digits ("98765-4321" is in "+5511987654321"); on an
    email it is already a case-insensitive substring test."""
    if name == "tags":
        return c.tag(at, value)
    if name == "phone" and op == "contains" and isinstance(value, str):
        digits = "".join(ch for ch in value if ch in "0123456789")
        if not digits:
            c.fail(at, "invalid_value", "phones are stored as digits: give some")
        return digits or None
    normalize = _CONTACT_NORMALIZERS.get(str(name))
    if normalize is None or op == "contains":
        return value
    if not isinstance(value, tuple):
        return _identity(c, at, normalize, value)
    found = [_identity(c, f"{at}[{i}]", normalize, v) for i, v in enumerate(value)]
    return None if any(v is None for v in found) else tuple(v for v in found if v is not None)


def _identity(c: _Checker, at: str, normalize: Callable[[str], str], raw: Scalar) -> str | None:
    if not isinstance(raw, str):  # "text" fields take only text
        c.fail(at, "invalid_value", "this field compares with text")
        return None
    try:
        return normalize(raw)
    except InvalidIdentity as exc:
        c.fail(at, "invalid_value", f"no contact can have it: {exc.message}")
        return None


_CONTACT_NORMALIZERS: Final[Mapping[str, Callable[[str], str]]] = {
    "email": normalize_email,
    "phone": normalize_phone,
}


def _condition_value(
    c: _Checker, at: str, op: Operator, kind: FieldKind, raw: object
) -> ConditionValue | None:
    if op == "exists":
        if isinstance(raw, bool):
            return raw
        c.fail(at, "invalid_value", "exists takes true or false")
        return None
    if op == "in":
        if not isinstance(raw, list | tuple) or not raw:
            c.fail(at, "invalid_value", "in takes a non-empty list")
            return None
        if len(raw) > MAX_IN_VALUES:
            c.fail(at, "too_many", f"in takes at most {MAX_IN_VALUES} values")
            return None
        items = [_scalar(c, f"{at}[{i}]", kind, v) for i, v in enumerate(raw)]
        return None if any(v is None for v in items) else tuple(v for v in items if v is not None)
    if op in ("gt", "gte", "lt", "lte"):
        return _ordered(c, at, kind, raw)
    return _scalar(c, at, "any" if kind == "list" else kind, raw)


def _scalar(c: _Checker, at: str, kind: FieldKind, raw: object) -> Scalar | None:
    if kind == "number":
        if _is_number(raw):
            return _number(c, at, raw)
        c.fail(at, "invalid_value", 'expected a number such as 100 or "297.90"')
    elif kind == "currency":
        if isinstance(raw, str) and is_currency(raw.strip().upper()):
            return raw.strip().upper()
        c.fail(at, "invalid_value", 'expected an ISO 4217 currency code such as "BRL"')
    elif isinstance(raw, str):
        if len(raw) > MAX_STRING_VALUE:
            c.fail(at, "too_long", f"text values are limited to {MAX_STRING_VALUE} characters")
        else:
            return raw
    elif kind == "any" and isinstance(raw, bool):
        return raw
    elif kind == "any" and _is_number(raw):
        return _number(c, at, raw)
    else:
        expected = "text" if kind == "text" else "text, a number or true/false"
        c.fail(at, "invalid_value", f"this field compares with {expected}")
    return None


def _ordered(c: _Checker, at: str, kind: FieldKind, raw: object) -> Scalar | None:
    if _is_number(raw):
        return _number(c, at, raw)
    moment = to_moment(raw) if kind == "any" else None
    if isinstance(moment, datetime) and moment.utcoffset() is None:
        c.fail(at, "naive_datetime", "datetimes must carry a timezone, e.g. -03:00 or Z")
    elif moment is not None:
        # A date or datetime from Python is kept as the ISO text JSON would carry.
        return raw if isinstance(raw, str) else moment.isoformat()
    elif kind == "number":
        c.fail(at, "invalid_value", 'expected a number such as 100 or "297.90"')
    else:
        c.fail(at, "invalid_value", "expected a number, a date (2026-11-29) or an ISO datetime")
    return None


def _number(c: _Checker, at: str, raw: int | float | Decimal | str) -> Scalar | None:
    """A number as JSON keeps it: a Decimal becomes the int or float it equals exactly.

    Stored definitions are JSON, where a Decimal would come back as text — and text
    compares as text — so the conversion happens here, where it can still be refused.
    """
    number = to_decimal(raw)
    assert number is not None
    if abs(number) >= MAX_NUMBER:
        c.fail(at, "out_of_range", "numbers must be below 10^15 in absolute value")
        return None
    if not isinstance(raw, Decimal):
        return raw
    if number == number.to_integral_value():
        return int(number)
    if Decimal(repr(float(number))) == number:
        return float(number)
    c.fail(at, "invalid_value", "this number has more digits than JSON keeps exactly")
    return None


def _is_number(raw: object) -> TypeGuard[int | float | Decimal | str]:
    """A finite number, or text that reads as one ("297.90")."""
    if isinstance(raw, float | int | Decimal | str) and not isinstance(raw, bool):
        return to_decimal(raw) is not None
    return False


# --------------------------------------------------------------------------- steps


def _steps(c: _Checker, raw: object) -> tuple[Step, ...]:
    if raw is None:
        c.fail("steps", "required", "steps is required (at least one step)")
        return ()
    found: list[Step] = []
    for i, item in enumerate(c.items("steps", raw, MAX_STEPS, allow_empty=False)):
        step = _step(c, f"steps[{i}]", item)
        if step is not None:
            found.append(step)
    return tuple(found)


def _step(c: _Checker, at: str, raw: object) -> Step | None:
    if not isinstance(raw, Mapping):
        c.fail(at, "invalid_type", "each step must be an object")
        return None
    kind = raw.get("type")
    if kind is None:
        c.fail(f"{at}.type", "required", f"type is required: one of {', '.join(STEP_TYPES)}")
        return None
    if not isinstance(kind, str) or kind not in _STEP_PARSERS:
        c.fail(f"{at}.type", "invalid_choice", f"type must be one of: {', '.join(STEP_TYPES)}")
        return None
    keys, parser = _STEP_PARSERS[kind]
    c.mapping(at, raw, ("type", *keys))
    before = len(c.errors)
    step = parser(c, at, raw)
    return step if len(c.errors) == before else None


def _send_message(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
    text = c.template(f"{at}.text", body.get("text"), MAX_TEXT, required=True, multiline=True)
    track_links, campaign = _tracking(c, at, body)
    number = _sender(c, at, body)
    return None if text is None else SendMessage(text, track_links, campaign, number)


def _tracking(c: _Checker, at: str, body: Mapping[str, object]) -> tuple[bool, str | None]:
    """A sending step's `track_links` (a boolean, default false) and `campaign`."""
    raw = body.get("track_links", False)
    if not isinstance(raw, bool):
        c.fail(f"{at}.track_links", "invalid_type", "track_links must be true or false")
    campaign = c.text(f"{at}.campaign", body.get("campaign"), MAX_CAMPAIGN_LENGTH,
                      required=False)  # fmt: skip
    if campaign is not None and raw is False:
        c.fail(f"{at}.campaign", "conflict",
               "campaign names the step's tracked links: set track_links to true")  # fmt: skip
    return raw is True, campaign


def _sender(c: _Checker, at: str, body: Mapping[str, object]) -> str | None:
    """A sending step's `phone_number_id` (optional): which of the account's WhatsApp
    numbers it names is checked when the automation is saved (`service`), not here."""
    return c.text(f"{at}.phone_number_id", body.get("phone_number_id"), MAX_PHONE_NUMBER_ID,
                  required=False)  # fmt: skip


def _send_template(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
    name = c.text(f"{at}.name", body.get("name"), MAX_TEMPLATE_NAME, required=True)
    if name is not None and not _TEMPLATE_NAME.fullmatch(name):
        c.fail(f"{at}.name", "invalid_format", "template names use a-z, 0-9 and _")
    language = c.text(f"{at}.language", body.get("language"), 16, required=True)
    if language is not None and not _LANGUAGE.fullmatch(language):
        c.fail(f"{at}.language", "invalid_format", "language must look like pt_BR or en")
    if "parameters" in body and "components" in body:
        c.fail(f"{at}.components", "conflict", "give parameters or components, not both")
        return None
    # Meta refuses new lines in template parameters, so they are single-line texts.
    raw_parameters = body.get("parameters", [])
    parameters: list[str] = []
    for i, item in enumerate(
        c.items(f"{at}.parameters", raw_parameters, MAX_PARAMETERS, allow_empty=True)
    ):
        text = c.template(f"{at}.parameters[{i}]", item, MAX_STRING_VALUE, required=True)
        parameters.append(text or "")
    components = _components(c, f"{at}.components", body.get("components", []))
    track_links, campaign = _tracking(c, at, body)
    if track_links and "components" in body:
        c.fail(f"{at}.track_links", "conflict",
               "track_links applies to parameters; components go to Meta as given")  # fmt: skip
    if name is None or language is None:
        return None
    number = _sender(c, at, body)
    return SendTemplate(name, language, tuple(parameters), components, track_links, campaign,
                        number)  # fmt: skip


def _components(c: _Checker, at: str, raw: object) -> tuple[dict[str, Any], ...]:
    found: list[dict[str, Any]] = []
    for i, item in enumerate(c.items(at, raw, MAX_COMPONENTS, allow_empty=True)):
        if not isinstance(item, Mapping) or not isinstance(item.get("type"), str):
            c.fail(f"{at}[{i}]", "invalid_type", 'a component is an object with a "type"')
            continue
        found.append(_json_copy(c, f"{at}[{i}]", item, 1))
    return tuple(found)


def _json_copy(c: _Checker, at: str, value: Any, depth: int) -> Any:
    """Copy JSON data, checking each string as a template."""
    if depth > MAX_COMPONENT_DEPTH:
        c.fail(at, "too_deep", f"components nest deeper than {MAX_COMPONENT_DEPTH} levels")
        return None
    if isinstance(value, str):
        return c.template(at, value, MAX_STRING_VALUE, required=True)
    if isinstance(value, Mapping):
        return {str(k): _json_copy(c, f"{at}.{k}", v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(c, f"{at}[{i}]", v, depth + 1) for i, v in enumerate(value)]
    if value is None or isinstance(value, bool):
        return value
    if _is_number(value):  # as in filters: what JSON readers keep exactly
        return _number(c, at, value)
    c.fail(at, "invalid_type", "components hold JSON values only")
    return None


def _tag_step(kind: type[AddTag] | type[RemoveTag]) -> Callable[..., Step | None]:
    def parse(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
        tag = c.tag(f"{at}.tag", body.get("tag"))
        return None if tag is None else kind(tag)

    return parse


def _close_conversation(_c: _Checker, _at: str, _body: Mapping[str, object]) -> Step | None:
    return CloseConversation()


def _ai_respond(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
    prompts = [
        c.template(f"{at}.{key}", body.get(key), MAX_PROMPT, required=False, multiline=True)
        for key in ("system_prompt", "prompt")
    ]
    raw_tokens = body.get("max_tokens")
    max_tokens = None
    if raw_tokens is not None:
        max_tokens = c.integer(f"{at}.max_tokens", raw_tokens, 1, MAX_MAX_TOKENS)
    track_links, campaign = _tracking(c, at, body)
    number = _sender(c, at, body)
    return AiRespond(prompts[0], prompts[1], max_tokens, track_links, campaign, number)


def _webhook(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
    url = _url(c, f"{at}.url", body.get("url"))
    headers = _headers(c, f"{at}.headers", body.get("headers", {}))
    secret = _secret(c, f"{at}.secret", body.get("secret"))
    return None if url is None else Webhook(url, headers, secret)


def _secret(c: _Checker, at: str, raw: object) -> str | SealedSecret | None:
    """A signing secret, checked (or as stored sealed: checked before it was); never
    quoted in an error (it is one)."""
    if raw is None:
        return None
    if is_sealed(raw):
        return SealedSecret.of(raw)
    if not isinstance(raw, str):
        c.fail(at, "invalid_type", f"secret must be text: {SECRET_PREFIX} and base64")
    elif raw == SECRET_MASK:
        c.fail(at, "invalid_value",
               f"{SECRET_MASK} keeps the secret a signed webhook step already has (at the same "
               "position or url); give the secret itself for a new one")  # fmt: skip
    elif not raw.startswith(SECRET_PREFIX) or (key := _secret_bytes(raw)) is None:
        c.fail(at, "invalid_format",
               f"secret must be {SECRET_PREFIX} followed by the base64 of "
               f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} random bytes")  # fmt: skip
    elif not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        c.fail(at, "out_of_range",
               f"secret's base64 must decode to {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} "
               f"bytes, not {len(key)}")  # fmt: skip
    else:
        return raw
    return None


def _secret_bytes(secret: str) -> bytes | None:
    """The bytes of `whsec_<base64>` (padding optional), or None when it is not so."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    if not encoded.isascii():
        return None
    try:
        return base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        return None


def _url(c: _Checker, at: str, raw: object) -> str | None:
    url = c.text(at, raw, MAX_URL_LENGTH, required=True)
    problem = None if url is None else target_url_problem(url)
    if problem is not None:
        c.fail(at, problem.code, problem.message)
        return None
    return url


def _headers(c: _Checker, at: str, raw: object) -> tuple[tuple[str, str | SealedSecret], ...]:
    """A webhook step's headers, checked (a value stored sealed was checked before it was);
    no error quotes a value (one may be a credential)."""
    if not isinstance(raw, Mapping):
        c.fail(at, "invalid_type", "headers must be an object of name: value")
        return ()
    if len(raw) > MAX_HEADERS:
        c.fail(at, "too_many", f"at most {MAX_HEADERS} headers")
        return ()
    found: list[tuple[str, str | SealedSecret]] = []
    seen: set[str] = set()
    for name, value in raw.items():
        where = f"{at}.{name}"
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            c.fail(where, "invalid_header", "header names use letters, digits and - _ .")
        elif name.lower() in _FORBIDDEN_HEADERS:
            c.fail(where, "forbidden_header", f"{name} is set by sinal, not by the automation")
        elif name.lower() in seen:
            c.fail(where, "duplicate_header", f"{name} is given twice")
        elif is_sealed(value):
            seen.add(name.lower())
            found.append((name, SealedSecret.of(value)))
        elif value == HEADER_MASK:
            c.fail(where, "invalid_value",
                   f"{HEADER_MASK} keeps the value this header already has (in the webhook "
                   "step at the same position or url); give the value for a new one")  # fmt: skip
        elif not isinstance(value, str) or len(value) > MAX_HEADER_VALUE:
            c.fail(where, "invalid_header", "header values are text (at most 4096 characters)")
        elif _has_control(value, allow_newlines=False):
            c.fail(where, "invalid_header", "header values may not contain control characters")
        elif not value.isascii():  # httpx sends header values as ASCII, and only so
            c.fail(where, "invalid_header",
                   "header values must be ASCII; percent-encode other characters")  # fmt: skip
        else:
            seen.add(name.lower())
            found.append((name, value))
    return tuple(found)


def _wait(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
    seconds_raw, until_raw = body.get("seconds"), body.get("until")
    if seconds_raw is None and until_raw is None:
        c.fail(f"{at}.seconds", "required", "give seconds or until")
    elif seconds_raw is not None and until_raw is not None:
        c.fail(f"{at}.until", "conflict", "give seconds or until, not both")
    elif seconds_raw is not None:
        seconds = c.integer(f"{at}.seconds", seconds_raw, 1, MAX_WAIT_SECONDS)
        return None if seconds is None else Wait(seconds=seconds)
    else:
        until = to_moment(until_raw) if isinstance(until_raw, str) else None
        if not isinstance(until, datetime):
            c.fail(f"{at}.until", "invalid_value", "until must be an ISO 8601 datetime")
        elif until.utcoffset() is None:
            c.fail(f"{at}.until", "naive_datetime", "until must carry a timezone, e.g. -03:00")
        else:
            try:
                moment = until.astimezone(UTC)
            except OverflowError:  # 0001-01-01T00:00:00+01:00 is in year 0 in UTC
                c.fail(f"{at}.until", "out_of_range", "until must fall in years 1 to 9999 in UTC")
                return None
            if c.now is not None and moment < c.now and moment not in c.kept:
                c.fail(f"{at}.until", "in_the_past",
                       f"until {stamp(moment)} is in the past (now: {stamp(c.now)}): the "
                       "step would not wait at all; give a later time, or seconds")  # fmt: skip
                return None
            return Wait(until=moment)
    return None


def _filter_step(c: _Checker, at: str, body: Mapping[str, object]) -> Step | None:
    raw = body.get("conditions")
    if raw is None:
        c.fail(f"{at}.conditions", "required", "conditions is required")
        return None
    conditions = _conditions(c, f"{at}.conditions", raw, allow_empty=False, allow_contact=True)
    return FilterStep(conditions)


_SENDING_KEYS: Final = ("track_links", "campaign", "phone_number_id")
_StepParser = Callable[[_Checker, str, Mapping[str, object]], Step | None]
_STEP_PARSERS: Final[dict[str, tuple[tuple[str, ...], _StepParser]]] = {
    "send_message": (("text", *_SENDING_KEYS), _send_message),
    "send_template": (
        ("name", "language", "parameters", "components", *_SENDING_KEYS),
        _send_template,
    ),
    "add_tag": (("tag",), _tag_step(AddTag)),
    "remove_tag": (("tag",), _tag_step(RemoveTag)),
    "close_conversation": ((), _close_conversation),
    "ai_respond": (("system_prompt", "prompt", "max_tokens", *_SENDING_KEYS), _ai_respond),
    "webhook": (("url", "headers", "secret"), _webhook),
    "wait": (("seconds", "until"), _wait),
    "filter": (("conditions",), _filter_step),
}

STEP_TYPES: Final[tuple[str, ...]] = tuple(_STEP_PARSERS)
"""The step types, in documentation order."""


def _has_control(text: str, *, allow_newlines: bool) -> bool:
    allowed = "\n\r\t" if allow_newlines else ""
    if any(unicodedata.category(ch) == "Cc" and ch not in allowed for ch in text):
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate cannot be stored
        return True
    return False


def _name(field: str) -> str:
    return "the automation" if field == "$" else field
