"""Provider webhooks (Shopify, Yampi, WhatsApp Cloud API): verify, then normalize. Pure.

Nothing here does I/O. The HTTP edge, for each delivery:

1. ``verify_*(secret, body, header)`` over the raw bytes (``SignatureMismatch`` → 401);
2. ``*_delivery(headers, body)`` → `Delivery` whose ``delivery_id`` keys the raw body store;
3. ``parse_body(body)`` and ``normalize_shopify(topic, payload)`` / ``normalize_yampi(payload)``
   / ``map_whatsapp(payload)`` → events (`Mapped`), order row, checkout; or
   `UnmappablePayload` (``.reason``) to keep with the raw body and replay later, or
   `DeliveryDeferred` (``.until``) to process it again once what it waits for is recorded;
4. per `Mapped`: find or create the contact from ``.contact`` (or through ``.order_id``),
   then ``ledger.emit(mapped.to_emit(account_id=..., contact_id=..., integration_id=...))``.
"""

from __future__ import annotations

from sinal.integrations._read import parse_body
from sinal.integrations.base import (
    ORDER_STATUS_RANK,
    CheckoutRef,
    ContactRef,
    Delivery,
    DeliveryDeferred,
    Mapped,
    Normalized,
    OrderRef,
    OrderStatus,
    Provider,
    UnmappablePayload,
    merge_order_status,
)
from sinal.integrations.checkouts import (
    DEFAULT_ABANDON_DELAY,
    abandoned_checkout,
    abandonment_due,
    recovered_checkout,
)
from sinal.integrations.shopify import (
    map_shopify,
    normalize_shopify,
    shopify_checkout,
    shopify_delivery,
)
from sinal.integrations.signatures import (
    sign_shopify,
    sign_whatsapp,
    sign_yampi,
    verify_shopify,
    verify_whatsapp,
    verify_yampi,
)
from sinal.integrations.whatsapp import (
    StatusUpdate,
    WhatsAppBatch,
    advance_status,
    map_whatsapp,
    status_event,
    status_metric,
    verify_challenge,
    whatsapp_delivery,
)
from sinal.integrations.yampi import map_yampi, normalize_yampi, yampi_checkout, yampi_delivery

__all__ = [
    "DEFAULT_ABANDON_DELAY",
    "ORDER_STATUS_RANK",
    "CheckoutRef",
    "ContactRef",
    "Delivery",
    "DeliveryDeferred",
    "Mapped",
    "Normalized",
    "OrderRef",
    "OrderStatus",
    "Provider",
    "StatusUpdate",
    "UnmappablePayload",
    "WhatsAppBatch",
    "abandoned_checkout",
    "abandonment_due",
    "advance_status",
    "map_shopify",
    "map_whatsapp",
    "map_yampi",
    "merge_order_status",
    "normalize_shopify",
    "normalize_yampi",
    "parse_body",
    "recovered_checkout",
    "shopify_checkout",
    "shopify_delivery",
    "sign_shopify",
    "sign_whatsapp",
    "sign_yampi",
    "status_event",
    "status_metric",
    "verify_challenge",
    "verify_shopify",
    "verify_whatsapp",
    "verify_yampi",
    "whatsapp_delivery",
    "yampi_checkout",
    "yampi_delivery",
]
