"""Tracked links: `POST /v1/links` makes a short URL; `GET /l/{token}` redirects to the
stored target and records Link Clicked (see `sinal.links` for what counts as a click)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import RedirectResponse, Response

from sinal import links
from sinal.api.body import read_json, validate
from sinal.api.errors import NotFound, problem_responses
from sinal.api.service import service
from sinal.api.views import json_response, opt_str
from sinal.events import stamp
from sinal.integrations.links import is_prefetch
from sinal.store.messaging import Link
from sinal.urls import MAX_URL_LENGTH

router = APIRouter(tags=["links"])
MAX_BODY = 16 * 1024


class LinkIn(BaseModel):
    """A link to track: its target, and whom and what a click counts for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: str = Field(description="Absolute http(s) URL: where a click is sent",
                     max_length=MAX_URL_LENGTH)  # fmt: skip
    contact_id: str | None = Field(None, description="The contact a click is recorded for")
    campaign: str | None = Field(None, max_length=links.MAX_CAMPAIGN_LENGTH)
    automation_execution_id: str | None = Field(
        None, description="The automation execution whose message carries the link"
    )


class LinkOut(BaseModel):
    """A tracked link."""

    id: str
    token: str
    short_url: str = Field(description="Ends in /l/{token}")
    url: str
    contact_id: str | None
    campaign: str | None
    automation_execution_id: str | None
    created_at: str


def inline_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a body read by the route, its (flat) schema inline."""
    schema = model.model_json_schema()
    return {"requestBody": {"required": True,
                            "content": {"application/json": {"schema": schema}}}}  # fmt: skip


@router.post(
    "/v1/links",
    summary="Make a tracked short link",
    status_code=201,
    response_model=LinkOut,
    openapi_extra=inline_body(LinkIn),
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
)
async def create_link(request: Request) -> Response:
    """`short_url` is built on SINAL_PUBLIC_URL when set, else on this request's URL."""
    svc = service(request)
    key = await svc.authorize(request, "ingest")
    body = validate(LinkIn, await read_json(request, MAX_BODY))
    link = await svc.run(
        links.create_link, svc.ledger, key.account_id, url=body.url,
        contact_id=body.contact_id, campaign=body.campaign,
        automation_execution_id=body.automation_execution_id,
    )  # fmt: skip
    return json_response(link_view(link, svc.public_base_url(request)), 201)


@router.get(
    "/l/{token}",
    summary="Follow a tracked link",
    status_code=302,
    response_class=RedirectResponse,
    responses={
        302: {
            "description": "To the link's target; a person's click records Link Clicked",
            "headers": {"Location": {"schema": {"type": "string"}}},
        },
        **problem_responses(404, 503),
    },
)
async def follow_link(request: Request, token: str) -> Response:
    """Unknown or malformed tokens answer 404. Link-preview fetchers and browsers'
    prefetches (`Sec-Purpose: prefetch`) are redirected too, and not counted."""
    return await _follow(request, token, is_click=not is_prefetch(request.headers))


@router.head("/l/{token}", include_in_schema=False)
async def check_link(request: Request, token: str) -> Response:
    """A HEAD (link checkers) is answered like a click, and never counted."""
    return await _follow(request, token, is_click=False)


async def _follow(request: Request, token: str, *, is_click: bool) -> Response:
    svc = service(request)
    agent = request.headers.get("user-agent")
    link = await svc.run(links.follow_link, svc.ledger, token, user_agent=agent,
                         is_click=is_click)  # fmt: skip
    if link is None:
        raise NotFound("no such link")
    # no-store: every click comes back here; no-referrer: the token stays ours.
    headers = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
    return RedirectResponse(link.url, status_code=302, headers=headers)


def link_view(link: Link, base_url: str) -> dict[str, Any]:
    """A link as the API shows it."""
    return {
        "id": str(link.id),
        "token": link.token,
        "short_url": links.short_url(base_url, link),
        "url": link.url,
        "contact_id": opt_str(link.contact_id),
        "campaign": link.campaign,
        "automation_execution_id": opt_str(link.automation_execution_id),
        "created_at": stamp(link.created_at),
    }
