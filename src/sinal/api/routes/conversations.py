"""Conversations: a minimal one per contact (open or closed, maybe with an agent).

An inbound WhatsApp message opens one when none is open (Conversation Opened); closing
(here or by an automation step) records Conversation Closed, assigning records
Conversation Assigned — each in the transaction that makes the change.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from sinal import messaging
from sinal.api.body import read_json, validate
from sinal.api.cursors import Listing, decode_id_cursor
from sinal.api.errors import InvalidInput, NotFound, problem_responses
from sinal.api.routes.links import inline_body
from sinal.api.service import service
from sinal.api.views import (
    id_page,
    json_response,
    parse_path_id,
)
from sinal.errors import FieldError, InvalidQuery
from sinal.events import stamp
from sinal.store.messaging import Conversation, ConversationQuery

router = APIRouter(tags=["conversations"])
MAX_BODY = 4096
MAX_AGENT = 200


class AssignIn(BaseModel):
    """Who takes the conversation: an agent's name, e-mail or id."""

    model_config = ConfigDict(extra="forbid", strict=True)

    agent: str = Field(min_length=1, max_length=MAX_AGENT)


class ConversationOut(BaseModel):
    """A conversation."""

    id: str
    contact_id: str
    status: Literal["open", "closed"]
    assigned_to: str | None
    opened_at: str
    closed_at: str | None


class ConversationPage(BaseModel):
    """Conversations, newest first; `next_cursor` fetches the next page."""

    data: list[ConversationOut]
    next_cursor: str | None


_ID_ERRORS = problem_responses(401, 403, 404, 503)


@router.get(
    "/v1/conversations",
    summary="Conversations, newest first (a contact's, open or closed ones)",
    response_model=ConversationPage,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_conversations(
    request: Request,
    contact_id: Annotated[str | None, Query(description="Only this contact's")] = None,
    status: Annotated[Literal["open", "closed"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """Another account's contact id lists nothing, as one that does not exist."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    contact = None
    if contact_id is not None:
        contact = parse_path_id(contact_id)
        if contact is None:
            raise InvalidQuery([FieldError("contact_id", "invalid_uuid", "not a UUID")])
    listing = Listing.of("conversations", key.account_id, contact_id=contact, status=status)
    before = decode_id_cursor(cursor, listing)
    query = ConversationQuery(key.account_id, contact, status, before, limit + 1)
    rows = await svc.run(messaging.list_conversations, svc.ledger, query)
    return json_response(id_page(rows, limit, conversation_view, listing))


@router.get(
    "/v1/conversations/{conversation_id}",
    summary="One conversation",
    response_model=ConversationOut,
    responses=_ID_ERRORS,
)
async def get_conversation(request: Request, conversation_id: str) -> Response:
    """404 for an id of another account, as for one that does not exist."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    ident = _path_id(conversation_id)
    found = await svc.run(messaging.get_conversation, svc.ledger, key.account_id, ident)
    return json_response(conversation_view(_found(found, conversation_id)))


@router.post(
    "/v1/conversations/{conversation_id}/close",
    summary="Close a conversation",
    response_model=ConversationOut,
    responses=_ID_ERRORS,
)
async def close_conversation(request: Request, conversation_id: str) -> Response:
    """Records Conversation Closed; closing a closed one changes and records nothing. The
    contact's next message opens a new conversation."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    ident = _path_id(conversation_id)
    closed = await svc.run(messaging.close_conversation, svc.ledger, key.account_id, ident)
    return json_response(conversation_view(_found(closed, conversation_id)))


@router.post(
    "/v1/conversations/{conversation_id}/assign",
    summary="Assign a conversation to an agent",
    response_model=ConversationOut,
    openapi_extra=inline_body(AssignIn),
    responses=problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 503),
)
async def assign_conversation(request: Request, conversation_id: str) -> Response:
    """Records Conversation Assigned when the agent changes (the same agent again changes
    nothing); a closed conversation answers 409."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    ident = _path_id(conversation_id)
    agent = _agent(validate(AssignIn, await read_json(request, MAX_BODY)).agent)
    assigned = await svc.run(
        messaging.assign_conversation, svc.ledger, key.account_id, ident, agent
    )
    return json_response(conversation_view(_found(assigned, conversation_id)))


def conversation_view(conversation: Conversation) -> dict[str, Any]:
    """A conversation as the API shows it."""
    c = conversation
    return {
        "id": str(c.id),
        "contact_id": str(c.contact_id),
        "status": c.status,
        "assigned_to": c.assigned_to,
        "opened_at": stamp(c.opened_at),
        "closed_at": None if c.closed_at is None else stamp(c.closed_at),
    }


def _agent(raw: str) -> str:
    text = " ".join(unicodedata.normalize("NFC", raw).split())
    problem = None
    if not text:
        problem = ("empty", "agent must not be blank")
    elif len(text) > MAX_AGENT:
        # The model's max_length saw the text before NFC, which can triple it (U+FB2C).
        problem = ("too_long", f"agent is at most {MAX_AGENT} characters")
    elif any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        problem = ("control_characters", "agent must not contain control characters")
    if problem is not None:
        raise InvalidInput(problem[1], [FieldError("agent", *problem)])
    return text


def _path_id(raw: str) -> UUID:
    ident = parse_path_id(raw)
    if ident is None:
        raise NotFound(f"no conversation {raw}")
    return ident


def _found(conversation: Conversation | None, raw: str) -> Conversation:
    if conversation is None:
        raise NotFound(f"no conversation {raw}")
    return conversation
