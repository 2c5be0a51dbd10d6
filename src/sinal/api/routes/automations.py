"""Automations, their executions and the event trace; the account's integrations."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar
from uuid import UUID

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from sinal.api.automation_models import (
    AutomationList,
    AutomationOut,
    ExecutionDetail,
    ExecutionList,
    IntegrationList,
    IntegrationOut,
    TraceOut,
)
from sinal.api.body import read_json
from sinal.api.cursors import Listing, decode_id_cursor
from sinal.api.errors import NotFound, problem_responses
from sinal.api.openapi import body_of
from sinal.api.service import service
from sinal.api.views import id_page, json_response, parse_path_id
from sinal.automations.service import (
    Automations,
    automation_view,
    execution_summary,
    execution_view,
    integration_view,
)
from sinal.store.automations import AutomationRow
from sinal.store.base import EventQuery

T = TypeVar("T")

router = APIRouter(tags=["automations"])
MAX_BODY = 256 * 1024
# The most events an execution's answer lists. A cap, not a page: its steps emit one
# event each at most (50 steps; a step run again never records its event twice), so only
# events a library caller tagged with the execution (EmitEvent.automation_execution_id)
# can pass it, and `emitted_events_truncated` says when they do.
MAX_EMITTED = 1000


class ConditionIn(BaseModel):
    """One condition: `field` (value, currency, source, properties.<path>), `op`, `value`."""

    field: str
    op: Literal["eq", "neq", "gt", "gte", "lt", "lte", "contains", "in", "exists"]
    value: Any = None


class AutomationIn(BaseModel):
    """An automation: exactly one of `trigger_metric` / `trigger_type`, 1 to 50 steps.

    Steps: `send_message` {text}, `send_template` {name, language, parameters | components},
    `add_tag` / `remove_tag` {tag}, `close_conversation`, `ai_respond` {system_prompt,
    prompt, max_tokens}, `webhook` {url, headers, secret}, `wait` {seconds | until (ahead
    when saved)}, `filter` {conditions}. Texts are templates: `{{ event.properties.order_number }}`,
    `{{ contact.name | first_name }}`, `{{ event.value | money }}`. `send_message`,
    `ai_respond` and `send_template` (its parameters) also take `track_links: true`: their
    http(s) URLs go out as tracked short links (on SINAL_PUBLIC_URL) whose clicks record
    Link Clicked for the contact, named by `campaign` (default: the automation's name).
    They send from the WhatsApp number the contact last wrote to, else from their
    `phone_number_id` (one of the account's connections', else 422 `unknown_connection`),
    else from the account's oldest connection.
    A webhook's `secret` (`whsec_` and the base64 of 24 to 64 bytes) signs its requests as
    Standard Webhooks do (`webhook-id`, `webhook-timestamp`, `webhook-signature`); answers
    show it as `whsec_********`, which a PATCH may send back to keep it. Its `headers`'
    values are secrets too: sealed at rest, shown as `********`, kept alike."""

    model_config = ConfigDict(extra="allow")

    name: str
    status: Literal["active", "paused"] = "active"
    trigger_metric: str | None = None
    trigger_type: str | None = None
    filters: list[ConditionIn] = Field(default_factory=list)
    steps: list[dict[str, Any]]


class AutomationPatch(BaseModel):
    """Any fields of an automation; `null` removes an optional one. `steps` replaces them
    all: a webhook step's `secret` sent back as `whsec_********` keeps its secret, and a
    header's value sent back as `********` keeps its value. Changed steps make a new
    version: executions already made keep running theirs, unless `correct_in_place`."""

    model_config = ConfigDict(extra="allow")

    correct_in_place: bool = Field(
        default=False,
        description="The steps correct the current version (same number, each step the same "
        "type, else 422 `not_in_place`): its executions under way run them from their next "
        "step on",
    )


class IntegrationIn(BaseModel):
    """A connection. whatsapp: secret (app secret), verify_token, phone_number_id,
    access_token, api_base_url, status_grace_seconds. ai: base_url, model, api_key.
    shopify / yampi: secret (and abandon_after_minutes, order_grace_seconds for shopify).
    Secrets are never returned."""

    model_config = ConfigDict(extra="allow")

    kind: Literal["whatsapp", "ai", "shopify", "yampi"]


MODELS: tuple[type[BaseModel], ...] = (AutomationIn, AutomationPatch, IntegrationIn)


def _automations(request: Request) -> Automations:
    return Automations(service(request).ledger)


# -- integrations ------------------------------------------------------------------------


@router.post(
    "/v1/integrations",
    summary="Connect a provider (WhatsApp Cloud API, AI endpoint, Shopify, Yampi)",
    status_code=201,
    response_model=IntegrationOut,
    openapi_extra=body_of(IntegrationIn),
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
)
async def create_integration(request: Request) -> Response:
    """The answer has the integration's webhook URL (for WhatsApp, Shopify, Yampi), on
    SINAL_PUBLIC_URL when set, else on this request's URL."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    data = await read_json(request, MAX_BODY)
    made = await svc.run(_automations(request).create_integration, key.account_id, data)
    return json_response(integration_view(made, svc.public_base_url(request)), 201)


@router.get(
    "/v1/integrations",
    summary="The account's integrations (no secrets), oldest first",
    response_model=IntegrationList,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_integrations(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """Keyset pagination, as every list: pass `next_cursor` back as `cursor` until it is
    null (until this release, every integration came in one answer, with no
    `next_cursor`). Oldest first by id: one made while paging comes on the last page."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    listing = Listing.of("integrations", key.account_id)
    after = decode_id_cursor(cursor, listing)
    store = _automations(request).store
    found = await svc.run(
        lambda: store.list_integrations(key.account_id, after=after, limit=limit + 1)
    )
    base = svc.public_base_url(request)
    return json_response(id_page(found, limit, lambda i: integration_view(i, base), listing))


@router.get(
    "/v1/integrations/{integration_id}",
    summary="One integration (no secrets)",
    response_model=IntegrationOut,
    responses=problem_responses(401, 403, 404, 503),
)
async def get_integration(request: Request, integration_id: str) -> Response:
    """404 for an id of another account, as for one that does not exist."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    store = _automations(request).store
    found = await _owned(
        request, store.get_integration, key.account_id, integration_id, "integration"
    )
    return json_response(integration_view(found, svc.public_base_url(request)))


@router.delete(
    "/v1/integrations/{integration_id}",
    summary="Disconnect a provider",
    status_code=204,
    responses={204: {"description": "Disconnected"}, **problem_responses(401, 403, 404, 503)},
)
async def delete_integration(request: Request, integration_id: str) -> Response:
    """Its webhooks answer 404 from then on."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    ident = parse_path_id(integration_id)
    store = _automations(request).store
    if ident is None or not await svc.run(store.delete_integration, key.account_id, ident):
        raise NotFound(f"no integration {integration_id}")
    return Response(status_code=204)


# -- automations -------------------------------------------------------------------------


@router.post(
    "/v1/automations",
    summary="Create an automation",
    status_code=201,
    response_model=AutomationOut,
    openapi_extra=body_of(AutomationIn),
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
)
async def create_automation(request: Request) -> Response:
    """422 names every bad field (`steps[2].text`, `filters[0].op`)."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    data = await read_json(request, MAX_BODY)
    row = await svc.run(_automations(request).create, key.account_id, data)
    return json_response(automation_view(row), 201)


@router.get(
    "/v1/automations",
    summary="The account's automations, oldest first",
    response_model=AutomationList,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_automations(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """Keyset pagination, as every list: pass `next_cursor` back as `cursor` until it is
    null (until this release, every automation came in one answer, with no
    `next_cursor`). Oldest first by id: one made while paging comes on the last page."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    listing = Listing.of("automations", key.account_id)
    after = decode_id_cursor(cursor, listing)
    store = _automations(request).store
    rows = await svc.run(
        lambda: store.list_automations(key.account_id, after=after, limit=limit + 1)
    )
    return json_response(id_page(rows, limit, automation_view, listing))


@router.get(
    "/v1/automations/{automation_id}",
    summary="One automation",
    response_model=AutomationOut,
    responses=problem_responses(401, 403, 404, 503),
)
async def get_automation(request: Request, automation_id: str) -> Response:
    """404 for another account's id."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    row = await _find(request, key.account_id, automation_id)
    return json_response(automation_view(row))


@router.patch(
    "/v1/automations/{automation_id}",
    summary="Change an automation (e.g. pause it)",
    response_model=AutomationOut,
    openapi_extra=body_of(AutomationPatch),
    responses=problem_responses(400, 401, 403, 404, 413, 415, 422, 503),
)
async def patch_automation(request: Request, automation_id: str) -> Response:
    """The result is validated whole. Paused, its executions are held (not run, not lost);
    set active again, the held ones go on at once."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    found = await _find(request, key.account_id, automation_id)
    patch = await read_json(request, MAX_BODY)
    row = await svc.run(_automations(request).update, key.account_id, found.id, patch)
    if row is None:
        raise NotFound(f"no automation {automation_id}")
    return json_response(automation_view(row))


@router.delete(
    "/v1/automations/{automation_id}",
    summary="Delete an automation (its executions stay visible)",
    status_code=204,
    responses={204: {"description": "Deleted"}, **problem_responses(401, 403, 404, 503)},
)
async def delete_automation(request: Request, automation_id: str) -> Response:
    """It stops triggering at once, and its pending and waiting executions end stopped
    (`last_error` says why); a step already running finishes, the next does not start."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    ident = parse_path_id(automation_id)
    store = _automations(request).store
    if ident is None or not await svc.run(store.delete_automation, key.account_id, ident):
        raise NotFound(f"no automation {automation_id}")
    return Response(status_code=204)


@router.get(
    "/v1/automations/{automation_id}/executions",
    summary="An automation's executions, newest first",
    response_model=ExecutionList,
    responses=problem_responses(401, 403, 404, 422, 503),
)
async def list_executions(
    request: Request,
    automation_id: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """Status, attempts and last error of each. Keyset pagination: pass `next_cursor` back
    as `cursor` until it is null; executions made meanwhile shift nothing (none comes
    twice, none there before is skipped)."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    row = await _find(request, key.account_id, automation_id)
    listing = Listing.of("executions", key.account_id, automation=row.id)
    before = decode_id_cursor(cursor, listing)
    store = _automations(request).store
    rows = await svc.run(
        lambda: store.list_executions(
            key.account_id, automation_id=row.id, limit=limit + 1, before=before
        )
    )
    return json_response(id_page(rows, limit, execution_summary, listing))


@router.get(
    "/v1/executions/{execution_id}",
    summary="One execution: steps, attempts, errors, emitted events",
    response_model=ExecutionDetail,
    responses=problem_responses(401, 403, 404, 503),
)
async def get_execution(request: Request, execution_id: str) -> Response:
    """Each step's record ('started', 'completed', 'failed', 'unknown'), and the events that
    name the execution: the newest 1,000 at most, oldest first; `emitted_events_truncated`
    says whether there are more."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    store = _automations(request).store
    found = await _owned(request, store.get_execution, key.account_id, execution_id, "execution")
    query = EventQuery(key.account_id, automation_execution_id=found.id, limit=MAX_EMITTED + 1)
    emitted = await svc.run(svc.ledger.list_events, query)
    view = execution_view(found, list(reversed(emitted[:MAX_EMITTED])))
    return json_response({**view, "emitted_events_truncated": len(emitted) > MAX_EMITTED})


@router.get(
    "/v1/events/{event_id}/trace",
    summary="For every automation: triggered (with its execution) or why not",
    response_model=TraceOut,
    responses=problem_responses(401, 403, 404, 503),
)
async def trace(request: Request, event_id: str) -> Response:
    """Reasons: other_metric, paused, filter_false (which filter), from_automation,
    own_message (a status of a message this automation sent), created_after_event,
    invalid_definition (stored before a check it fails was added), chain_too_deep (matched,
    but its execution was stopped unrun: too deep a chain of automations), withdrawn (matched,
    but a Checkout Abandoned was withdrawn by its order or its store's disconnection: before
    any execution was made, or its execution stopped)."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    event = await _owned(request, svc.ledger.get_event, key.account_id, event_id, "event")
    answer = await svc.run(_automations(request).trace, event)
    return json_response({"event_id": str(event.id), "automations": answer})


async def _find(request: Request, account_id: UUID, automation_id: str) -> AutomationRow:
    store = _automations(request).store
    return await _owned(request, store.get_automation, account_id, automation_id, "automation")


async def _owned(
    request: Request,
    get: Callable[[UUID, UUID], T | None],
    account_id: UUID,
    raw_id: str,
    what: str,
) -> T:
    """The account's row with this path id; 404 for a malformed id, another account's id or
    none at all, alike."""
    ident = parse_path_id(raw_id)
    found = None if ident is None else await service(request).run(get, account_id, ident)
    if found is None:
        raise NotFound(f"no {what} {raw_id}")
    return found
