"""What every signed webhook route does once it has found its integration: read the raw
body, check the provider's signature over those bytes, keep the delivery once per
delivery id, process it (`sinal.webhooks`), and answer 200 with what became of it.

Describing a delivery never fails on what the body or a header holds (anything bad is
kept, then reported by processing), except a delivery id no provider sends: it keys the
kept delivery, so it is refused (400) before anything is stored."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from sinal import webhooks
from sinal.api.body import read_raw
from sinal.api.errors import InvalidHeader
from sinal.api.service import Service
from sinal.api.views import json_response
from sinal.events import MAX_ID_TEXT
from sinal.integrations import Delivery
from sinal.store.automations import Integration

Verify = Callable[[str, bytes, str | None], None]  # raises SignatureMismatch
Describe = Callable[[Mapping[str, str], bytes], Delivery]


@dataclass(frozen=True, slots=True)
class Provider:
    """How one provider signs and identifies its deliveries."""

    kind: str
    verify: Verify
    signature_header: str
    describe: Describe
    max_body: int  # bytes read at most (413 beyond), before anything is verified
    id_header: str | None = None  # where `describe` reads the delivery id (else a digest)


async def receive_signed(
    svc: Service, request: Request, integration: Integration, provider: Provider
) -> Response:
    """413 past `max_body`, 401 on a missing or wrong signature, 400 on a delivery id no
    provider sends (nothing stored), else the delivery kept and processed: "processed",
    "duplicate" (a redelivery of a processed one; or, with a reason, another topic or
    body under a kept delivery's id, neither kept nor processed), or the status and reason
    `sinal.webhooks.receive` ended it with."""
    body = await read_raw(request, provider.max_body)
    secret = str(integration.secrets.get("secret") or "")
    provider.verify(secret, body, request.headers.get(provider.signature_header))
    headers = dict(request.headers)
    delivery = provider.describe(headers, body)
    _check_delivery_id(delivery.delivery_id, provider)
    received = await svc.run(
        webhooks.receive, svc.ledger, integration, topic=delivery.topic,
        delivery_id=delivery.delivery_id, headers=headers, body=body,
    )  # fmt: skip
    # a redelivery of a processed one, or another delivery under a kept one's id (not kept)
    was_done = not received.is_new and received.delivery.status == "processed"
    status = "duplicate" if was_done or received.is_clash else received.status
    svc.metrics.count_delivery(provider.kind, status)
    answer = {"status": status, "delivery_id": str(received.delivery.id), "reason": received.reason}
    return json_response(answer)


def _check_delivery_id(delivery_id: str, provider: Provider) -> None:
    """The same ids on both backends: PostgreSQL refuses a key over about 2.7 kB (and any
    NUL) that SQLite would keep. Shopify's ids are UUIDs; events' ids stop at 255 too."""
    if len(delivery_id) > MAX_ID_TEXT or not delivery_id.isprintable():
        where = provider.id_header or "the delivery id"
        raise InvalidHeader(f"{where} must be printable and at most {MAX_ID_TEXT} characters")
