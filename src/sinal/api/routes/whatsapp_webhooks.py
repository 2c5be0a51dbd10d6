"""WhatsApp Cloud API webhooks: Meta's subscription handshake and signed deliveries.

A delivery is verified over the raw bytes as received (Meta escapes non-ASCII text as
``\\uXXXX``; re-serialized JSON would never match), kept raw once per delivery, processed
(`sinal.messaging.process_whatsapp`) and answered 200 — also when a part of it cannot be
mapped (it is kept, with its reason, for `sinal webhooks replay`) and when statuses in it
wait for their send to be recorded (``deferred``: the rest is recorded at once; the worker
processes it again after the integration's ``status_grace_seconds``): Meta retries anything
else for days. A bad signature is answered 401 and nothing is stored.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import PlainTextResponse, Response

from sinal import webhooks
from sinal.api.errors import NotFound, VerificationFailed, problem_responses
from sinal.api.service import Service, service
from sinal.api.signed_webhooks import Provider, receive_signed
from sinal.api.views import parse_path_id
from sinal.integrations.signatures import WHATSAPP_SIGNATURE_HEADER, verify_whatsapp
from sinal.integrations.whatsapp import verify_challenge, whatsapp_delivery
from sinal.store.automations import Integration

router = APIRouter(tags=["webhooks"])
# Meta batches at most a few hundred small changes per delivery.
MAX_BODY = 1024 * 1024
_HUB_PARAMETERS = ("hub.mode", "hub.verify_token", "hub.challenge")
_WHATSAPP = Provider(
    "whatsapp", verify_whatsapp, WHATSAPP_SIGNATURE_HEADER, whatsapp_delivery, MAX_BODY
)


class WebhookAck(BaseModel):
    """A delivery kept and processed, as the commerce webhooks answer."""

    status: str = Field(
        description="processed, duplicate (a redelivery of a processed one), "
        "deferred (statuses in it wait for the record of their message's send; processed "
        "again when due), unmappable or failed (both kept with their reason, for replay)"
    )
    delivery_id: str
    reason: str | None


@router.get(
    "/webhooks/whatsapp/{integration_id}",
    summary="Meta's webhook subscription handshake",
    response_class=PlainTextResponse,
    responses={
        200: {"description": "The challenge, echoed", "content": {"text/plain": {}}},
        **problem_responses(403, 404, 503),
    },
)
async def verify_subscription(
    request: Request,
    integration_id: str,
    mode: Annotated[str | None, Query(alias="hub.mode")] = None,
    verify_token: Annotated[str | None, Query(alias="hub.verify_token")] = None,
    challenge: Annotated[str | None, Query(alias="hub.challenge")] = None,
) -> Response:
    """`hub.mode=subscribe` with the integration's verify token: 200 with `hub.challenge`
    as plain text; any other answer is 403, a `hub.` parameter given twice too."""
    svc = service(request)
    integration = await _integration(svc, integration_id)
    # Meta sends each once. Read by its last value, "?hub.verify_token=x&hub.verify_token=
    # <token>" passed, where a proxy or a log reading the first value saw a wrong token.
    repeated = [name for name in _HUB_PARAMETERS if len(request.query_params.getlist(name)) > 1]
    if repeated:
        raise VerificationFailed(f"{', '.join(repeated)} given more than once; give each once")
    params = {"hub.mode": mode or "", "hub.verify_token": verify_token or "",
              "hub.challenge": challenge or ""}  # fmt: skip
    expected = str(integration.secrets.get("verify_token") or "")
    echoed = verify_challenge(params, expected)
    if echoed is None:
        raise VerificationFailed("hub.mode must be subscribe and hub.verify_token must match")
    return PlainTextResponse(echoed, headers={"X-Content-Type-Options": "nosniff"})


@router.post(
    "/webhooks/whatsapp/{integration_id}",
    summary="A WhatsApp Cloud API webhook delivery (messages and statuses)",
    response_model=WebhookAck,
    responses=problem_responses(401, 404, 413, 503),
)
async def receive_delivery(request: Request, integration_id: str) -> Response:
    """Signed by Meta (`X-Hub-Signature-256: sha256=<hex>` of the raw body with the app
    secret). Redeliveries are recognised and recorded once. Each change is recorded for the
    account's connection of the number it names, when it has this one's app secret (the
    Meta app's one callback URL may be any of its connections')."""
    svc = service(request)
    integration = await _integration(svc, integration_id)
    return await receive_signed(svc, request, integration, _WHATSAPP)


async def _integration(svc: Service, raw: str) -> Integration:
    """The live WhatsApp integration the URL names; 404 for anything else."""
    ident: UUID | None = parse_path_id(raw)
    found = None
    if ident is not None:
        found = await svc.run(webhooks.store_of(svc.ledger).find_integration, ident)
    if found is None or found.kind != "whatsapp" or not found.secrets.get("secret"):
        raise NotFound(f"no WhatsApp integration {raw}")
    return found
