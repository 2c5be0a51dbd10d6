"""The API's request and response shapes (Pydantic v2), as the OpenAPI schema shows them.

Request models check structure only (which fields, which JSON types); the rules of an
event (metric names, currencies, value range, time window, identities) live in the
ledger, so the API and library callers get the same errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

_UUID = {"type": "string", "format": "uuid"}
_DECIMAL = {
    "anyOf": [
        {"type": "number"},
        {"type": "string", "pattern": r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$"},
        {"type": "null"},
    ],
    "description": "Exact decimal: < 10^14 in absolute value, at most 4 decimal places.",
}
Decimalish = Annotated[Any, WithJsonSchema(_DECIMAL)]
DecimalText = Annotated[str, Field(description='Exact decimal, as a string: "297.90"')]
Stamp = Annotated[
    str,
    Field(
        description='RFC 3339 in UTC with "Z", microseconds only when there are some',
        pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{6})?Z$",
        examples=["2026-11-29T12:00:00Z", "2026-11-29T12:00:00.120000Z"],
    ),
]
ZoneStamp = Annotated[str, Field(description="RFC 3339 with the zone's offset, \"Z\" for UTC's")]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# -- requests ---------------------------------------------------------------------------


class ContactIdentities(_Input):
    """Identifiers of a contact; resolved to the account's contact, or a new one."""

    phone: str | None = Field(None, description="Any format; stored as E.164")
    email: str | None = None
    external_id: str | None = None
    name: str | None = None


class EventIn(_Input):
    """One event to record."""

    metric: str = Field(description='A catalog metric ("Order Paid") or a custom name')
    contact_id: Annotated[str | None, WithJsonSchema({"anyOf": [_UUID, {"type": "null"}]})] = None
    contact: ContactIdentities | None = Field(
        None, description="Instead of contact_id: the contact's identifiers"
    )
    properties: dict[str, Any] | None = Field(
        None,
        description="Any JSON object, but for sent_by_automation_id and "
        "sent_by_automation_execution_id: only sinal sets those (422, reserved)",
    )
    value: Decimalish = None
    currency: str | None = Field(None, description="ISO 4217; default BRL")
    source: str = Field("api", description="Where the event comes from: shopify, whatsapp, …")
    source_id: Annotated[
        Any,
        WithJsonSchema(
            {
                "anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}],
                "description": "The source's id; with source and entity_type, the dedup key",
            }
        ),
    ] = None
    entity_type: str | None = None
    entity_id: str | None = None
    occurred_at: str | None = Field(None, description="ISO 8601 with an offset; default now")


class BatchIn(_Input):
    """Up to 1,000 events; each is answered on its own."""

    # Items are validated one by one (a bad item is rejected alone); the OpenAPI schema
    # shows them as EventIn (see sinal.api.app.build_openapi).
    events: list[Any] = Field(description="EventIn objects", max_length=1000)


class ContactIn(ContactIdentities):
    """A contact to create, or to match by its identifiers."""


class ContactPatch(_Input):
    """Fields to change; null removes a value, an absent field stays as it is."""

    name: str | None = None
    phone: str | None = None
    email: str | None = None
    external_id: str | None = None


class TagsIn(_Input):
    """Tags to add."""

    tags: list[str] = Field(min_length=1, max_length=50)


class ReplayIn(_Input):
    """Optionally, the contact the kept event lacked."""

    contact_id: Annotated[str | None, WithJsonSchema({"anyOf": [_UUID, {"type": "null"}]})] = None


class AccountPatch(_Input):
    """Account settings to change."""

    name: str | None = None
    timezone: str | None = Field(None, description="IANA zone, e.g. America/Sao_Paulo")


# -- answers ----------------------------------------------------------------------------


class EventAccepted(BaseModel):
    """What happened to one event."""

    status: Literal["created", "duplicate"]
    event_id: str
    unique_event_id: str | None
    contact_id: str
    differs: bool | None = Field(
        None, description="For a duplicate: whether its payload differs from the stored one"
    )


class BatchItem(BaseModel):
    """One batch item's outcome."""

    status: Literal["created", "duplicate", "rejected"]
    event_id: str | None = None
    unique_event_id: str | None = None
    differs: bool | None = None
    reason: str | None = None
    message: str | None = None
    rejection_id: str | None = None
    errors: list[dict[str, str]] | None = None


class BatchOut(BaseModel):
    """One result per item, in order, and the counts."""

    results: list[BatchItem]
    created: int
    duplicate: int
    rejected: int


class EventOut(BaseModel):
    """A stored event."""

    id: str
    contact_id: str
    metric: str
    label: str
    properties: dict[str, Any]
    value: DecimalText | None
    currency: str
    source: str
    source_id: str | None
    unique_event_id: str | None
    entity_type: str | None
    entity_id: str | None
    integration_id: str | None
    automation_execution_id: str | None
    occurred_at: Stamp
    received_at: Stamp


class EventPage(BaseModel):
    """Events, newest first; pass `next_cursor` as `cursor` for the next page."""

    data: list[EventOut]
    next_cursor: str | None


class EventFeedPage(BaseModel):
    """The change feed (with `after`): events in the order they were stored. Keep
    `next_cursor` (never null) and pass it as `after` next time; `has_more` says whether
    more can be read at once."""

    data: list[EventOut]
    next_cursor: str
    has_more: bool


class ContactOut(BaseModel):
    """A contact."""

    id: str
    name: str | None
    phone: str | None
    email: str | None
    external_id: str | None
    tags: list[str]
    created_at: Stamp
    updated_at: Stamp


class ContactPage(BaseModel):
    """Contacts, oldest first; pass `next_cursor` as `cursor` for the next page."""

    data: list[ContactOut]
    next_cursor: str | None


class CurrencyTotal(BaseModel):
    """The sum of a contact's values of one metric in one currency."""

    currency: str
    total_value: DecimalText


class ContactMetricOut(BaseModel):
    """A contact's totals for one metric."""

    metric: str
    label: str
    count: int = Field(description="Its events, whatever their currency")
    total_value: DecimalText | None = Field(
        description='The sum of its events\' values, exact, as a string ("297.90"), when they '
        "are in one currency; null when none of them carried a value (a message) or when "
        'they are in several (see totals); "0.00" when values added up to 0'
    )
    currency: str | None = Field(description="The ISO 4217 currency of total_value")
    totals: list[CurrencyTotal] = Field(
        description="One per currency its values are in, by code: values of two currencies "
        "are never added"
    )
    first_event_at: Stamp
    last_event_at: Stamp


class ContactMetrics(BaseModel):
    """A contact's summary rows."""

    data: list[ContactMetricOut]


class MetricOut(BaseModel):
    """One of the account's metrics."""

    name: str
    label: str
    category: str
    is_system: bool
    count: int


class MetricList(BaseModel):
    """The account's metrics, by name."""

    data: list[MetricOut]
    next_cursor: str | None


class Bucket(BaseModel):
    """One bucket: its first instant in the zone, its value (and group, with `by`)."""

    bucket: ZoneStamp
    value: int | DecimalText
    group: str | None = None


class AggregateOut(BaseModel):
    """Every bucket of the range, empty ones included."""

    metric: str
    measurement: str
    interval: str
    timezone: str
    currency: str | None = Field(
        description="The currency asked for, if any; else, for sum_value, the ISO 4217 "
        "currency of every sum (null when no event of the range carried a value)"
    )
    data: list[Bucket]
    groups_truncated: bool = False


class RejectionOut(BaseModel):
    """An input that was not recorded, and why."""

    id: str
    reason: str
    message: str
    payload: dict[str, Any] = Field(
        description="The event that was not recorded, normalized, under the names POST "
        "/v1/events takes and GET /v1/events shows (metric, contact_id, properties, value, "
        "currency, source, source_id, entity_type, entity_id, occurred_at, integration_id, "
        "automation_execution_id)"
    )
    created_at: Stamp
    replayed_event_id: str | None


class RejectionPage(BaseModel):
    """Rejections, newest first."""

    data: list[RejectionOut]
    next_cursor: str | None


class ReplayOut(BaseModel):
    """The replayed event."""

    status: Literal["created", "duplicate", "already_replayed"]
    event_id: str
    rejection_id: str


class AccountOut(BaseModel):
    """The key's account."""

    id: str
    name: str
    timezone: str
    created_at: Stamp


class Health(BaseModel):
    """Liveness or readiness."""

    status: str
    schema_version: int | None = None


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    EventIn,
    BatchIn,
    ContactIn,
    ContactPatch,
    TagsIn,
    ReplayIn,
    AccountPatch,
)
