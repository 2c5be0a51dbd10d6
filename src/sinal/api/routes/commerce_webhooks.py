"""Shopify and Yampi webhooks: `POST /webhooks/{shopify|yampi}/{integration_id}`.

No API key: the integration named in the URL gives the account and the secret, and the
signature over the raw body bytes proves the sender. In order:

1. an unknown, malformed or deleted integration id, or one of another kind → 404;
2. the body, read up to `MAX_BODY` → 413 beyond;
3. the signature (constant-time) → 401 when missing or wrong, and an
   `X-Shopify-Webhook-Id` over 255 characters or not printable → 400; nothing is stored;
4. the delivery is kept raw, once per delivery id, then processed (`sinal.webhooks`) →
   200 with its status: "processed", "duplicate" (a redelivery of a processed one),
   "deferred" (a Shopify refund or shipment of an order not known yet: the worker
   processes it again after the integration's ``order_grace_seconds``), "unmappable"
   (kept with its reason for `sinal webhooks replay`) or "failed".
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from sinal import webhooks
from sinal.api.errors import InvalidHeader, NotFound, problem_responses
from sinal.api.service import Service, service
from sinal.api.signed_webhooks import Provider, receive_signed
from sinal.api.views import parse_path_id
from sinal.integrations.shopify import shopify_delivery
from sinal.integrations.signatures import (
    SHOPIFY_SIGNATURE_HEADER,
    YAMPI_SIGNATURE_HEADER,
    verify_shopify,
    verify_yampi,
)
from sinal.integrations.yampi import yampi_delivery
from sinal.store.automations import Integration

router = APIRouter(tags=["webhooks"])
# Far above any real order payload, small enough to refuse
# a flood before it is signed and stored.
MAX_BODY = 2 * 1024 * 1024


class WebhookReceipt(BaseModel):
    """The answer to a verified delivery (always 200: the provider must not retry it)."""

    status: Literal["processed", "duplicate", "deferred", "unmappable", "failed"]
    delivery_id: str  # sinal's id of the kept delivery
    reason: str | None = None  # why it waits, or is unmappable or failed (kept for replay)


_SHOPIFY = Provider(
    "shopify", verify_shopify, SHOPIFY_SIGNATURE_HEADER, shopify_delivery, MAX_BODY,
    id_header="X-Shopify-Webhook-Id",
)  # fmt: skip
_YAMPI = Provider("yampi", verify_yampi, YAMPI_SIGNATURE_HEADER, yampi_delivery, MAX_BODY)


@router.post(
    "/webhooks/shopify/{integration_id}",
    summary="Receive a Shopify webhook (signed with X-Shopify-Hmac-Sha256)",
    response_model=WebhookReceipt,
    responses=problem_responses(InvalidHeader, 401, 404, 413, 503),
)
async def shopify_webhook(request: Request, integration_id: str) -> Response:
    """Orders, refunds, checkouts, customers and fulfillments of a connected Shopify store."""
    return await _receive(request, integration_id, _SHOPIFY)


@router.post(
    "/webhooks/yampi/{integration_id}",
    summary="Receive a Yampi webhook (signed with X-Yampi-Hmac-SHA256)",
    response_model=WebhookReceipt,
    responses=problem_responses(401, 404, 413, 503),
)
async def yampi_webhook(request: Request, integration_id: str) -> Response:
    """Orders, status changes, cart reminders and customers of a connected Yampi store."""
    return await _receive(request, integration_id, _YAMPI)


async def _receive(request: Request, integration_id: str, provider: Provider) -> Response:
    svc = service(request)
    integration = await _integration(svc, integration_id, provider.kind)
    return await receive_signed(svc, request, integration, provider)


async def _integration(svc: Service, raw_id: str, kind: str) -> Integration:
    """The live integration of this kind named by the URL, else 404 (nothing is read)."""
    ident = parse_path_id(raw_id)
    found = None
    if ident is not None:
        store = webhooks.store_of(svc.ledger)
        found = await svc.run(store.find_integration, ident)
    if found is None or found.kind != kind:
        raise NotFound(f"no {kind} integration {raw_id}")
    return found
