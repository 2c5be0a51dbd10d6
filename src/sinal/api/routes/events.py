"""POST /v1/events (group commit), POST /v1/events/batch, GET /v1/events[/{id}] (and the
change feed, `GET /v1/events?after=`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request
from pydantic import TypeAdapter, ValidationError
from starlette.responses import Response

from sinal.aggregates import naive_time
from sinal.api.body import read_json, validate
from sinal.api.cursors import Listing, decode_event_cursor, decode_feed_cursor
from sinal.api.errors import InvalidInput, NotFound, Rejected, problem_responses
from sinal.api.models import (
    BatchIn,
    BatchOut,
    ContactIdentities,
    EventAccepted,
    EventFeedPage,
    EventIn,
    EventOut,
    EventPage,
)
from sinal.api.openapi import body_of
from sinal.api.service import Service, service
from sinal.api.views import (
    API_NAMES,
    event_view,
    feed_view,
    json_response,
    keyset_page,
    locale_of,
    parse_path_id,
)
from sinal.contacts import InvalidIdentities, normalize_contact_fields
from sinal.errors import FieldError, InvalidContact, InvalidEvent, InvalidQuery
from sinal.events import EmitEvent, EmitResult, in_utc, normalize_metric_name, prepare
from sinal.integrations.whatsapp import SENT_BY_AUTOMATION, SENT_BY_EXECUTION
from sinal.ledger import MAX_BATCH
from sinal.store.base import EventQuery

router = APIRouter(tags=["events"])
# Properties sinal sets on the status of a message an automation sent, from its own record
# of the send: which automation sent it (it never runs for the status) and which execution
# (the status's executions are one deeper in its chain). They decide which automations run,
# so they are sinal's word, never a client's.
RESERVED_PROPERTIES = (SENT_BY_AUTOMATION, SENT_BY_EXECUTION)
# The ledger's field names in a message, to say with the API's.
_RENAMED_WORD = re.compile(r"\b(" + "|".join(API_NAMES) + r")\b")


@router.post(
    "/v1/events",
    status_code=201,
    summary="Record one event",
    openapi_extra=body_of(EventIn),
    responses={
        201: {"model": EventAccepted, "description": "Stored"},
        200: {"model": EventAccepted, "description": "A duplicate of a stored event"},
        **problem_responses(400, 401, 403, 413, 415, 422, 503),
    },
)
async def post_event(request: Request) -> Response:
    """Record one event; answered once it is committed (concurrent requests share a
    transaction). 201 created, 200 duplicate (with `differs`), 422 invalid or rejected."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    item = validate(EventIn, await read_json(request, svc.settings.max_event_bytes))
    event = to_emit(item, key.account_id)
    check_contact_choice(item)
    check_reserved(item)
    if item.contact is not None:
        # Before a contact is created for an event we would refuse.
        check_event(event, item.contact, svc)
        [contact_id] = await svc.run(_resolve_contacts, svc, key.account_id, [item.contact])
        event = replace(event, contact_id=contact_id)
    try:
        result = await svc.committer.emit(event)
    except InvalidEvent as exc:
        raise InvalidEvent(renamed(exc.errors)) from None
    svc.metrics.count_event(event.source, result.status)
    if result.status == "rejected":
        raise rejected(result)
    return json_response(accepted(result, event), 201 if result.status == "created" else 200)


@router.post(
    "/v1/events/batch",
    summary="Record up to 1,000 events",
    openapi_extra=body_of("BatchIn"),
    responses={200: {"model": BatchOut}, **problem_responses(400, 401, 403, 413, 415, 422, 503)},
)
async def post_batch(request: Request) -> Response:
    """One result per item, in order; valid items are stored even when others are not.
    The valid ones share one transaction."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    data = await read_json(request, svc.settings.max_batch_bytes)
    if isinstance(data, list):  # the events alone, as a client may well send them
        message = 'the body is an object holding the list: {"events": [...]}'
        raise InvalidInput(message, [FieldError("body", "model_type", message)])
    items = data.get("events") if isinstance(data, dict) else None
    if isinstance(items, list) and len(items) > MAX_BATCH:
        raise InvalidInput(
            f"a batch holds at most {MAX_BATCH} events",
            [FieldError("events", "too_many", f"a batch holds at most {MAX_BATCH} events")],
        )
    batch = validate(BatchIn, data)
    checked = _checked_items(batch.events)
    results: list[dict[str, Any] | None] = [None] * len(batch.events)
    pending: list[tuple[int, EventIn, EmitEvent]] = []
    counted: list[tuple[str, str]] = []  # (source, status) of each item, for the metrics
    for i, raw in enumerate(batch.events):
        try:
            item = (
                checked[i] if checked is not None else validate(EventIn, raw, prefix=f"events[{i}]")
            )
            event = to_emit(item, key.account_id)
            prefix = f"events[{i}]."
            check_contact_choice(item, prefix)
            check_reserved(item, prefix)
            if item.contact is not None:
                check_event(event, item.contact, svc, prefix)
        except (InvalidInput, InvalidEvent, InvalidContact) as exc:
            results[i] = invalid_item(exc.errors)
            counted.append(("unknown", "rejected"))  # its source may be the problem
            continue
        pending.append((i, item, event))
    outcomes = await svc.run(_record_batch, svc, key.account_id, pending)
    for (i, _, event), result in zip(pending, outcomes, strict=True):
        results[i] = batch_item(result, i)
        counted.append((event.source, result.status))
    svc.metrics.count_events(counted)
    counts = dict.fromkeys(_STATUSES, 0)
    for _, status in counted:
        counts[status] += 1
    return json_response({"results": results, **counts})


def _checked_items(items: list[Any]) -> list[EventIn] | None:
    """Every item as an `EventIn`, in one call to pydantic (~0.8 µs an item less than one
    call each); None when any is invalid, and each is then validated alone, to be answered
    with its own errors."""
    try:
        return _EVENT_LIST.validate_python(items)
    except ValidationError:
        return None


_EVENT_LIST = TypeAdapter(list[EventIn])
_STATUSES = ("created", "duplicate", "rejected")


@router.get(
    "/v1/events",
    summary="List events, newest first; or, with `after`, the change feed",
    response_model=EventPage | EventFeedPage,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_events(
    request: Request,
    *,
    contact_id: Annotated[str | None, Query(description="Only this contact's events")] = None,
    metric: Annotated[str | None, Query(description="Only this metric")] = None,
    since: Annotated[datetime | None, Query(description="occurred_at >= since")] = None,
    until: Annotated[datetime | None, Query(description="occurred_at < until")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    after: Annotated[
        str | None,
        Query(description="The change feed: `start`, then the previous page's next_cursor"),
    ] = None,
    locale: Annotated[str | None, Query(description="pt-BR, en or es")] = None,
    accept_language: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Keyset pagination: pass `next_cursor` back as `cursor` until it is null. With
    `after`, the change feed instead: every event once, in the order they were stored."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    if after is not None:
        others = {"contact_id": contact_id, "metric": metric, "since": since, "until": until,
                  "cursor": cursor}  # fmt: skip
        _check_alone("after", others)
        position = decode_feed_cursor(after, key.account_id)
        page = await svc.run(svc.ledger.read_feed, key.account_id, position, limit)
        return json_response(feed_view(page, key.account_id, locale_of(locale, accept_language)))
    contact = _query_uuid("contact_id", contact_id)
    metric = _query_text("metric", metric)
    if metric is not None:  # as events name it (the listing's cursor binds it so)
        metric = normalize_metric_name(metric)
    return await event_page(
        svc,
        EventQuery(key.account_id, contact, metric, _aware("since", since), _aware("until", until)),
        limit,
        cursor,
        locale_of(locale, accept_language),
    )


@router.get(
    "/v1/events/{event_id}",
    summary="One event",
    response_model=EventOut,
    responses=problem_responses(401, 403, 404, 503),
)
async def get_event(
    request: Request,
    event_id: str,
    locale: Annotated[str | None, Query(description="pt-BR, en or es")] = None,
    accept_language: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """An event of the key's account (any other id answers 404)."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    ident = parse_path_id(event_id)
    event = None if ident is None else await svc.run(svc.ledger.get_event, key.account_id, ident)
    if event is None:
        raise NotFound(f"no event {event_id}")
    return json_response(event_view(event, locale_of(locale, accept_language)))


# -- shared with the contacts routes ----------------------------------------------------


async def event_page(
    svc: Service, query: EventQuery, limit: int, cursor: str | None, locale: str
) -> Response:
    """A page of events and the cursor of the next one (a contact's timeline is the
    list of its events: their cursors are one list's)."""
    filters = {"contact_id": query.contact_id, "metric": query.metric_name,
               "since": query.since, "until": query.until}  # fmt: skip
    listing = Listing.of("events", query.account_id, **filters)
    before = decode_event_cursor(cursor, listing)
    rows = await svc.run(svc.ledger.list_events, replace(query, before=before, limit=limit + 1))
    return json_response(
        keyset_page(rows, limit, lambda e: event_view(e, locale),
                    lambda last: listing.encode(last.occurred_at.isoformat(), str(last.id)))
    )  # fmt: skip


def to_emit(item: EventIn, account_id: UUID) -> EmitEvent:
    """The ledger's input for an API event."""
    return EmitEvent(
        account_id=account_id,
        contact_id=item.contact_id,
        metric_name=item.metric,
        source=item.source,
        properties=item.properties or {},
        value=item.value,
        currency=item.currency,
        source_id=item.source_id,
        entity_type=item.entity_type,
        entity_id=item.entity_id,
        occurred_at=item.occurred_at,
    )


def check_contact_choice(item: EventIn, prefix: str = "") -> None:
    """contact_id or contact, not both."""
    if item.contact is not None and item.contact_id is not None:
        message = "give contact_id or contact, not both"
        raise InvalidEvent([FieldError(f"{prefix}contact", "ambiguous_contact", message)])


def check_reserved(item: EventIn, prefix: str = "") -> None:
    """Refuse the properties only sinal sets (`RESERVED_PROPERTIES`): with them, a client
    could keep an automation from running for its event (``own_message``) or stop every
    one (``chain_too_deep``). No query: the events that carry none pay two lookups."""
    properties = item.properties
    if not properties or properties.keys().isdisjoint(RESERVED_PROPERTIES):
        return
    errors = [
        FieldError(
            f"{prefix}properties.{name}",
            "reserved",
            f"properties.{name} is set by sinal alone, on the status of a message an "
            "automation sent",
        )
        for name in RESERVED_PROPERTIES
        if name in properties
    ]
    if errors:
        raise InvalidEvent(errors)


def check_event(
    event: EmitEvent, contact: ContactIdentities, svc: Service, prefix: str = ""
) -> None:
    """Validate an event whose contact is still to be resolved (nothing is written). When
    the event is invalid, bad `contact` identifiers are listed with its errors: one answer
    names every field to fix."""
    try:
        prepare(replace(event, contact_id=None), svc.ledger.clock())
    except InvalidEvent as exc:
        errors = renamed(exc.errors, prefix)
        try:
            _check_identities(contact)
        except InvalidContact as bad:
            errors += renamed(bad.errors, prefix)
        raise InvalidEvent(errors) from None


def renamed(errors: tuple[FieldError, ...], prefix: str = "") -> list[FieldError]:
    """Ledger field errors with the API's field names, in their messages too (and a batch
    item's prefix)."""
    out = []
    for e in errors:
        head, dot, rest = e.field.partition(".")
        field = API_NAMES.get(head, head) + dot + rest
        message = _RENAMED_WORD.sub(lambda m: API_NAMES[m[1]], e.message)
        out.append(FieldError(prefix + field, e.code, message))
    return out


def accepted(result: EmitResult, event: EmitEvent) -> dict[str, Any]:
    """The body of a 201 or 200."""
    body: dict[str, Any] = {
        "status": result.status,
        "event_id": str(result.event_id),
        "unique_event_id": result.unique_event_id,
        "contact_id": str(event.contact_id),
    }
    if result.status == "duplicate":
        body["differs"] = result.differs
    return body


def rejected(result: EmitResult, field: str = "contact_id") -> Rejected:
    """The 422 for a valid event that was not recorded (kept for replay), or that the
    database refused (reason "refused", not kept: no one field is to blame, the body is)."""
    message = result.message or "the event was not recorded"
    if result.reason == "refused":
        field = "body"
    return Rejected(
        message,
        [FieldError(field, result.reason or "rejected", message)],
        reason=result.reason,
        rejection_id=None if result.rejection_id is None else str(result.rejection_id),
    )


def invalid_item(errors: tuple[FieldError, ...] | list[FieldError]) -> dict[str, Any]:
    """A batch item refused for its input."""
    return {
        "status": "rejected",
        "reason": "invalid",
        "message": "; ".join(f"{e.field}: {e.message}" for e in errors[:5]),
        "errors": [e.as_dict() for e in errors],
    }


def batch_item(result: EmitResult, index: int) -> dict[str, Any]:
    """A batch item's outcome (its ids as UUIDs: `json_response` writes them as text)."""
    if result.status == "rejected" and result.reason == "invalid":
        return invalid_item(renamed(result.errors, f"events[{index}]."))
    item: dict[str, Any] = {
        "status": result.status,
        "event_id": result.event_id,
        "unique_event_id": result.unique_event_id,
    }
    if result.status == "duplicate":
        item["differs"] = result.differs
    if result.status == "rejected":
        item |= {
            "reason": result.reason,
            "message": result.message,
            "rejection_id": result.rejection_id,
        }
    return item


def _record_batch(
    svc: Service, account_id: UUID, pending: list[tuple[int, EventIn, EmitEvent]]
) -> list[EmitResult]:
    """In a worker thread: resolve the items' contacts, then one `emit_many`."""
    events: list[EmitEvent] = []
    resolved: dict[tuple[Any, ...], UUID] = {}
    early: dict[int, EmitResult] = {}
    for n, (_, item, event) in enumerate(pending):
        if item.contact is None:
            events.append(event)
            continue
        ident = (item.contact.phone, item.contact.email, item.contact.external_id)
        try:
            if ident not in resolved:
                [resolved[ident]] = _resolve_contacts(svc, account_id, [item.contact])
        except InvalidContact as exc:
            early[n] = EmitResult("rejected", reason="invalid", message=str(exc), errors=exc.errors)
            continue
        events.append(replace(event, contact_id=resolved[ident]))
    recorded = iter(svc.ledger.emit_many(events))
    return [early[n] if n in early else next(recorded) for n in range(len(pending))]


def _resolve_contacts(svc: Service, account_id: UUID, refs: list[Any]) -> list[UUID]:
    """Blocking: each reference's contact id (created, with Contact Created, if new)."""
    ids = []
    for ref in refs:
        _check_identities(ref)
        contact, _ = svc.ledger.resolve_contact(
            account_id, phone=ref.phone, email=ref.email, external_id=ref.external_id,
            name=ref.name,
        )  # fmt: skip
        ids.append(contact.id)
    return ids


def _check_identities(ref: ContactIdentities) -> None:
    """InvalidContact with fields under `contact.` (the ledger names them bare)."""
    raw = {"phone": ref.phone, "email": ref.email, "external_id": ref.external_id,
           "name": ref.name}  # fmt: skip
    try:
        normalize_contact_fields(raw)
    except InvalidIdentities as exc:
        raise InvalidContact(
            [FieldError(f"contact.{e.field}", e.code, e.message) for e in exc.errors]
        ) from None


def _check_alone(name: str, others: Mapping[str, object]) -> None:
    """Refuse the parameters given with `name` that it cannot be combined with."""
    errors = [
        FieldError(other, "not_with_" + name, f"{other} cannot be combined with {name}")
        for other, value in others.items()
        if value is not None
    ]
    if errors:
        raise InvalidQuery(errors)


def _query_uuid(name: str, raw: str | None) -> UUID | None:
    if raw is None:
        return None
    ident = parse_path_id(raw)
    if ident is None:
        raise InvalidQuery([FieldError(name, "invalid_uuid", f"{name} must be a UUID")])
    return ident


def _query_text(name: str, raw: str | None) -> str | None:
    """A text filter, refused with a NUL in it as a body's strings are: no stored text
    holds one, and PostgreSQL cannot compare one (SQLite found nothing)."""
    if raw is not None and "\x00" in raw:
        message = f"{name} contains a NUL character (\\u0000)"
        raise InvalidQuery([FieldError(name, "nul_character", message)])
    return raw


def _aware(name: str, when: datetime | None) -> datetime | None:
    if when is None:
        return None
    if when.utcoffset() is None:
        raise InvalidQuery([naive_time(name)])
    utc = in_utc(when)
    if utc is None:
        message = f"{name} must fall within years 1 to 9999 once in UTC"
        raise InvalidQuery([FieldError(name, "out_of_range", message)])
    return utc
