"""What was not recorded and why; replaying it once the cause is fixed."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from sinal.api.body import read_json, validate
from sinal.api.cursors import Listing, decode_id_cursor
from sinal.api.errors import NotFound, Rejected, problem_responses
from sinal.api.models import RejectionPage, ReplayIn, ReplayOut
from sinal.api.openapi import body_of
from sinal.api.routes.events import renamed
from sinal.api.service import service
from sinal.api.views import (
    id_page,
    json_response,
    parse_path_id,
    rejection_view,
)
from sinal.errors import FieldError, InvalidEvent

router = APIRouter(tags=["rejections"])
MAX_BODY = 4096
# The 422 message of a replay whose cause persists, by reason.
_STILL = {
    "contact_required": "the event names no contact: give contact_id in the replay request",
    "contact_not_found": "the event's contact still does not exist in this account",
}


@router.get(
    "/v1/rejections",
    summary="Inputs that were valid but not recorded, newest first",
    response_model=RejectionPage,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_rejections(
    request: Request,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> Response:
    """Each with its reason, message and the kept input (`payload`)."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    listing = Listing.of("rejections", key.account_id)
    before = decode_id_cursor(cursor, listing)
    rows = await svc.run(svc.ledger.list_rejections_page, key.account_id, limit + 1, before)
    return json_response(id_page(rows, limit, rejection_view, listing))


@router.post(
    "/v1/rejections/{rejection_id}/replay",
    summary="Record a kept input now that its cause is fixed",
    openapi_extra=body_of(ReplayIn, required=False),
    responses={
        201: {"model": ReplayOut, "description": "The event was recorded"},
        200: {"model": ReplayOut, "description": "Already replayed, or a duplicate"},
        **problem_responses(400, 401, 403, 404, 413, 415, 422, 503),
    },
)
async def replay(request: Request, rejection_id: str) -> Response:
    """Give `contact_id` for an input that had none. At most one event per rejection,
    however often (or concurrently) it is replayed; 422 while the event still names no
    contact (`contact_required`) or an unknown one (`contact_not_found`)."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    ident = parse_path_id(rejection_id)
    contact_id = None
    if await _has_body(request):
        contact_id = validate(ReplayIn, await read_json(request, MAX_BODY)).contact_id
    if ident is None:
        raise NotFound(f"no rejection {rejection_id}")
    try:
        done = await svc.run(svc.ledger.replay_rejection, key.account_id, ident, contact_id)
    except InvalidEvent as exc:
        raise InvalidEvent(renamed(exc.errors)) from None
    if done is None:
        raise NotFound(f"no rejection {rejection_id}")
    if done.outcome is None:
        raise _still_rejected(done.reason or "contact_not_found", ident)
    status = "already_replayed" if done.earlier else done.outcome.kind
    svc.metrics.count_event("replay", "duplicate" if done.earlier else done.outcome.kind)
    body = {"status": status, "event_id": str(done.outcome.event_id), "rejection_id": str(ident)}
    return json_response(body, 201 if status == "created" else 200)


def _still_rejected(reason: str, rejection_id: UUID) -> Rejected:
    """The 422 of a replay whose cause persists, under the reason it was kept for."""
    message = _STILL[reason]
    return Rejected(
        message,
        [FieldError("contact_id", reason, message)],
        reason=reason,
        rejection_id=str(rejection_id),
    )


async def _has_body(request: Request) -> bool:
    if request.headers.get("content-length", "0") not in ("", "0"):
        return True
    return "chunked" in request.headers.get("transfer-encoding", "").lower()
