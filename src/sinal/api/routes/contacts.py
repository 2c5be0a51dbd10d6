"""Contacts: list and look up, create or match, read, change, tag, erase; their timeline
and metric summaries.

Every change records its seed metric (Contact Created, Contact Updated, Tag Added, Tag
Removed) with source `api`, in the transaction that makes the change.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import Response

from sinal.api.body import read_json, validate
from sinal.api.cursors import Listing, decode_id_cursor
from sinal.api.errors import NotFound, problem_responses
from sinal.api.models import (
    ContactIn,
    ContactMetrics,
    ContactOut,
    ContactPage,
    ContactPatch,
    EventPage,
    TagsIn,
)
from sinal.api.openapi import body_of
from sinal.api.routes.events import event_page
from sinal.api.service import Service, service
from sinal.api.views import (
    contact_view,
    id_page,
    json_response,
    locale_of,
    parse_path_id,
    summary_views,
)
from sinal.errors import FieldError, InvalidContact
from sinal.ledger import contact_query
from sinal.store.base import Contact, EventQuery, ListedContact

router = APIRouter(tags=["contacts"])
_ID_ERRORS = problem_responses(401, 403, 404, 503)
_WRITE_ERRORS = problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 503)
MAX_BODY = 64 * 1024


@router.get(
    "/v1/contacts",
    summary="The account's contacts, oldest first, or those with an identifier or a tag",
    response_model=ContactPage,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_contacts(
    request: Request,
    *,
    phone: Annotated[str | None, Query(description="Only the contact with this phone")] = None,
    email: Annotated[str | None, Query(description="Only the contact with this email")] = None,
    external_id: Annotated[
        str | None, Query(description="Only the contact with this external id")
    ] = None,
    tag: Annotated[str | None, Query(description="Only contacts with this tag")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """Each as GET /v1/contacts/{id} answers it. A filter is compared as contacts store it
    ("Ana@Loja.com" finds ana@loja.com, "(11) 98765-4321" +5511987654321); one no contact
    can have is 422 naming it. Keyset pagination, as every list."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    query = contact_query(
        key.account_id, phone=phone, email=email, external_id=external_id, tag=tag
    )
    filters = {"phone": query.phone, "email": query.email,
               "external_id": query.external_id, "tag": query.tag}  # fmt: skip
    listing = Listing.of("contacts", key.account_id, **filters)
    after = decode_id_cursor(cursor, listing)
    rows = await svc.run(svc.ledger.list_contacts, replace(query, after=after, limit=limit + 1))
    return json_response(id_page(rows, limit, _listed_view, listing))


@router.post(
    "/v1/contacts",
    status_code=201,
    summary="Create a contact, or match an existing one by its identifiers",
    openapi_extra=body_of(ContactIn),
    responses={
        201: {"model": ContactOut, "description": "Created (Contact Created recorded)"},
        200: {"model": ContactOut, "description": "An existing contact matched"},
        **problem_responses(400, 401, 403, 413, 415, 422, 503),
    },
)
async def create_contact(request: Request) -> Response:
    """Matched by external_id, then phone, then email; a match is returned unchanged."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    body = validate(ContactIn, await read_json(request, MAX_BODY))
    contact, created = await svc.run(
        svc.ledger.resolve_contact,
        key.account_id,
        phone=body.phone,
        email=body.email,
        external_id=body.external_id,
        name=body.name,
    )
    tags = [] if created else await svc.run(svc.ledger.list_tags, key.account_id, contact.id)
    return json_response(contact_view(contact, tags), 201 if created else 200)


@router.get(
    "/v1/contacts/{contact_id}",
    summary="One contact, with its tags",
    response_model=ContactOut,
    responses=_ID_ERRORS,
)
async def get_contact(request: Request, contact_id: str) -> Response:
    """A contact of the key's account (any other id answers 404)."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    contact = await _contact(svc, key.account_id, contact_id)
    tags = await svc.run(svc.ledger.list_tags, key.account_id, contact.id)
    return json_response(contact_view(contact, tags))


@router.patch(
    "/v1/contacts/{contact_id}",
    summary="Change a contact's name or identifiers",
    response_model=ContactOut,
    openapi_extra=body_of(ContactPatch),
    responses=_WRITE_ERRORS,
)
async def patch_contact(request: Request, contact_id: str) -> Response:
    """Fields given are set (null removes one); a real change records Contact Updated.
    An identifier that already names another contact answers 409."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    ident = _path_id(contact_id)
    body = validate(ContactPatch, await read_json(request, MAX_BODY))
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    contact = await svc.run(svc.ledger.update_contact, key.account_id, ident, changes)
    if contact is None:
        raise NotFound(f"no contact {contact_id}")
    tags = await svc.run(svc.ledger.list_tags, key.account_id, contact.id)
    return json_response(contact_view(contact, tags))


@router.delete(
    "/v1/contacts/{contact_id}",
    summary="Erase a contact and everything of it (LGPD art. 18 VI, GDPR art. 17)",
    status_code=204,
    responses={204: {"description": "Erased"}, **_ID_ERRORS},
)
async def erase_contact(request: Request, contact_id: str) -> Response:
    """Irreversible: its events, summaries, executions, tags, identities, conversations
    and commerce links go in one transaction (README, "Erasing a contact"). The admin
    scope: an erasure destroys the ledger's data, which ingest and read keys never do."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    ident = _path_id(contact_id)
    if not await svc.run(svc.ledger.erase_contact, key.account_id, ident):
        raise NotFound(f"no contact {contact_id}")
    return Response(status_code=204)


@router.post(
    "/v1/contacts/{contact_id}/tags",
    summary="Tag a contact",
    response_model=ContactOut,
    openapi_extra=body_of(TagsIn),
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 503),  # no identity: no 409
)
async def add_tags(request: Request, contact_id: str) -> Response:
    """Each tag the contact did not have records Tag Added; the contact is returned."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    ident = _path_id(contact_id)
    body = validate(TagsIn, await read_json(request, MAX_BODY))
    added = await svc.run(svc.ledger.add_tags, key.account_id, ident, body.tags)
    if added is None:
        raise NotFound(f"no contact {contact_id}")
    contact = await _contact(svc, key.account_id, contact_id)
    tags = await svc.run(svc.ledger.list_tags, key.account_id, ident)
    return json_response(contact_view(contact, tags))


@router.delete(
    "/v1/contacts/{contact_id}/tags/{tag:path}",
    summary="Untag a contact",
    status_code=204,
    responses={204: {"description": "The contact does not have the tag (any more)"},
               **problem_responses(401, 403, 404, 422, 503)},
)  # fmt: skip
async def remove_tag(request: Request, contact_id: str, tag: str) -> Response:
    """Records Tag Removed if the contact had the tag; 204 either way (idempotent)."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    ident = _path_id(contact_id)
    try:
        removed = await svc.run(svc.ledger.remove_tags, key.account_id, ident, [tag])
    except InvalidContact as exc:
        raise InvalidContact([FieldError("tag", e.code, e.message) for e in exc.errors]) from None
    if removed is None:
        raise NotFound(f"no contact {contact_id}")
    return Response(status_code=204)


@router.get(
    "/v1/contacts/{contact_id}/timeline",
    summary="A contact's events, newest first, with labels",
    response_model=EventPage,
    responses=problem_responses(401, 403, 404, 422, 503),
)
async def timeline(
    request: Request,
    contact_id: str,
    *,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    locale: Annotated[str | None, Query(description="pt-BR, en or es")] = None,
    accept_language: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Keyset pagination, as GET /v1/events."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    contact = await _contact(svc, key.account_id, contact_id)
    query = EventQuery(key.account_id, contact_id=contact.id)
    return await event_page(svc, query, limit, cursor, locale_of(locale, accept_language))


@router.get(
    "/v1/contacts/{contact_id}/metrics",
    summary="A contact's per-metric totals, with labels",
    response_model=ContactMetrics,
    responses=_ID_ERRORS,
)
async def contact_metrics(
    request: Request,
    contact_id: str,
    locale: Annotated[str | None, Query(description="pt-BR, en or es")] = None,
    accept_language: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Count, total value (per currency: values of two currencies are never added), first
    and last occurrence of each metric the contact has."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    contact = await _contact(svc, key.account_id, contact_id)
    rows = await svc.run(svc.ledger.get_summary, key.account_id, contact.id)
    lang = locale_of(locale, accept_language)
    return json_response({"data": summary_views(rows, lang)})


def _listed_view(listed: ListedContact) -> dict[str, object]:
    return contact_view(listed.contact, listed.tags)


def _path_id(raw: str) -> UUID:
    ident = parse_path_id(raw)
    if ident is None:
        raise NotFound(f"no contact {raw}")
    return ident


async def _contact(svc: Service, account_id: UUID, raw: str) -> Contact:
    contact = await svc.run(svc.ledger.get_contact, account_id, _path_id(raw))
    if contact is None:
        raise NotFound(f"no contact {raw}")
    return contact
