"""Yampi webhooks into sinal events. Pure: no I/O.

The event name is in the body (``{"event": "order.paid", "time": ..., "merchant": {...},
"resource": {...}}``); related objects come wrapped as ``{"data": ...}``. Yampi's times
carry no offset: they are America/Sao_Paulo (or the ``timezone`` beside them: an IANA
zone, or PHP's fixed offset ``"-03:00"``; "localtime" and other zoneinfo files that are no
zone are refused, as the time would depend on the host).

| event                | metric                              | entity_type (dedup) | source_id   |
|----------------------|-------------------------------------|---------------------|-------------|
| order.created        | Order Placed                        | order_placed        | order id    |
| order.paid           | Order Paid                          | order_paid          | order id    |
| order.status.updated | by status alias, see STATUS_ALIASES | one per metric      | order id    |
| cart.reminder        | Checkout Abandoned (recovery URL)   | checkout_abandoned  | cart token  |
| customer.created     | Customer Created                    | customer            | customer id |

`order.paid` and `order.status.updated` to "paid" share the dedup key: one Order Paid.
A later order carrying the abandoned cart's token is the recovery: `recovered_checkout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, NoReturn

from sinal.catalog import (
    METRIC_CUSTOMER_CREATED,
    METRIC_ORDER_CANCELLED,
    METRIC_ORDER_FULFILLED,
    METRIC_ORDER_PAID,
    METRIC_ORDER_PLACED,
    METRIC_ORDER_REFUNDED,
    METRIC_SHIPMENT_CREATED,
    METRIC_SHIPMENT_DELIVERED,
    METRIC_SHIPMENT_IN_TRANSIT,
)
from sinal.integrations import _read as r
from sinal.integrations.base import (
    CheckoutRef,
    ContactRef,
    Delivery,
    Mapped,
    Normalized,
    OrderRef,
    OrderStatus,
    UnmappablePayload,
)
from sinal.integrations.checkouts import abandoned_checkout, recovered_checkout

__all__ = [
    "EVENTS",
    "STATUS_ALIASES",
    "YAMPI_TIMEZONE",
    "map_yampi",
    "normalize_yampi",
    "recovered_checkout",
    "yampi_checkout",
    "yampi_delivery",
]

SOURCE: Final = "yampi"
YAMPI_TIMEZONE: Final = "America/Sao_Paulo"
EVENTS: Final = frozenset(
    {"order.created", "order.paid", "order.status.updated", "cart.reminder", "customer.created"}
)

# order.status.updated: Yampi status alias -> (order status, metrics to record).
# An alias with no metric updates the order row only; an unknown alias records nothing
# and reports ignored="unknown_status_alias" (add it here, then replay).
STATUS_ALIASES: Final[Mapping[str, tuple[OrderStatus, tuple[str, ...]]]] = {
    "waiting_payment": ("pending", ()),  # Aguardando pagamento
    "paid": ("paid", (METRIC_ORDER_PAID,)),  # Pagamento aprovado
    "invoiced": ("paid", ()),  # Faturado (NF-e issued)
    "handling_products": ("paid", ()),  # Em separação
    "shipped": ("fulfilled", (METRIC_ORDER_FULFILLED, METRIC_SHIPMENT_CREATED)),  # Enviado
    "on_carriage": ("fulfilled", (METRIC_SHIPMENT_IN_TRANSIT,)),  # Em transporte
    "delivered": ("delivered", (METRIC_SHIPMENT_DELIVERED,)),  # Entregue
    "cancelled": ("cancelled", (METRIC_ORDER_CANCELLED,)),  # Cancelado
    "refused": ("cancelled", (METRIC_ORDER_CANCELLED,)),  # Pagamento recusado
    "refunded": ("refunded", (METRIC_ORDER_REFUNDED,)),  # Estornado
}

_ENTITY_TYPES: Final[Mapping[str, str]] = {
    METRIC_ORDER_PLACED: "order_placed",
    METRIC_ORDER_PAID: "order_paid",
    METRIC_ORDER_CANCELLED: "order_cancelled",
    METRIC_ORDER_REFUNDED: "order_refunded",
    METRIC_ORDER_FULFILLED: "order_fulfilled",
    METRIC_SHIPMENT_CREATED: "shipment_created",
    METRIC_SHIPMENT_IN_TRANSIT: "shipment_in_transit",
    METRIC_SHIPMENT_DELIVERED: "shipment_delivered",
}
_SHIPMENT_METRICS: Final = frozenset(
    {METRIC_SHIPMENT_CREATED, METRIC_SHIPMENT_IN_TRANSIT, METRIC_SHIPMENT_DELIVERED}
)


def yampi_delivery(headers: Mapping[str, str], body: bytes) -> Delivery:
    """The delivery's event name, dedup id (a digest of the body: Yampi sends no id), time."""
    del headers  # Yampi sends no delivery id or event header; kept for a uniform signature
    # Nothing here may stop the raw body from being stored: processing reports what is bad.
    try:
        payload: Mapping[str, Any] = r.parse_body(body)
    except UnmappablePayload:
        payload = {}
    try:
        occurred_at = r.local_time(r.get(payload, "time"), YAMPI_TIMEZONE)
    except UnmappablePayload:
        occurred_at = None  # informational only: the event's time is read again
    return Delivery(
        provider=SOURCE,
        topic=r.text(payload, "event"),
        delivery_id=r.body_digest(body),
        occurred_at=occurred_at,
        origin=r.text(payload, "merchant", "alias"),
    )


def map_yampi(payload: Mapping[str, Any]) -> list[Mapped]:
    """The events to record for one Yampi webhook (see the module table)."""
    return list(normalize_yampi(payload).events)


def normalize_yampi(payload: Mapping[str, Any]) -> Normalized:
    """Events, order row and cart of one Yampi webhook; raises UnmappablePayload."""
    if not isinstance(payload, Mapping):
        raise UnmappablePayload("invalid_json", "the payload is not a JSON object")
    event = r.required_text(payload, "event").lower()
    resource = r.get(payload, "resource")
    if not isinstance(resource, Mapping):
        raise UnmappablePayload("missing_field", "resource is missing or not an object")
    if event == "order.created":
        return _order(payload, resource, (METRIC_ORDER_PLACED,), None)
    if event == "order.paid":
        return _order(payload, resource, (METRIC_ORDER_PAID,), "paid")
    if event == "order.status.updated":
        return _status_updated(payload, resource)
    if event == "cart.reminder":
        return _cart_reminder(payload, resource)
    if event == "customer.created":
        return _customer_created(payload, resource)
    raise UnmappablePayload("unsupported_event", f"event {event[:64]!r} is not mapped")


# --- orders ------------------------------------------------------------------------------


def _status_updated(payload: Mapping[str, Any], order: Mapping[str, Any]) -> Normalized:
    alias = _alias(order)
    if alias is None:
        return Normalized(ignored="no_status_alias")
    if alias not in STATUS_ALIASES:
        return Normalized(ignored="unknown_status_alias")
    status, metrics = STATUS_ALIASES[alias]
    if not metrics:
        return Normalized(order=_order_ref(order, status), ignored="status_without_event")
    return _order(payload, order, metrics, status)


def _order(
    payload: Mapping[str, Any],
    order: Mapping[str, Any],
    metrics: tuple[str, ...],
    status: OrderStatus | None,
) -> Normalized:
    ref = _order_ref(order, status)
    contact = _contact(r.obj(order, "customer", "data"))
    if contact.is_empty:
        raise UnmappablePayload("no_contact", "the order has no customer phone, email or id")
    placed = metrics == (METRIC_ORDER_PLACED,)
    occurred_at = _order_time(payload, order, placed=placed)
    events = tuple(_order_event(m, ref, order, contact, occurred_at) for m in metrics)
    return Normalized(events=events, order=ref)


def _order_ref(order: Mapping[str, Any], status: OrderStatus | None) -> OrderRef:
    alias = _alias(order)
    if status is None:
        known = STATUS_ALIASES.get(alias or "")
        status = known[0] if known else "pending"
    return OrderRef(
        provider=SOURCE,
        external_id=r.required_text(order, "id"),
        # read as ids: a status with no event keeps them in the row unchecked (a NUL, which
        # PostgreSQL refuses; a token no cart can have, past its index's limit)
        number=r.id_text(order, "number"),
        status=status,
        provider_status=alias,
        total=r.money(order, "value_total"),
        currency="BRL",  # Yampi sells in reais only
        cart_token=r.first(
            r.id_text(order, "cart_token"), r.id_text(order, "cart", "data", "token")
        ),
        updated_at=_yampi_time(r.get(order, "updated_at")),
        placed_at=_yampi_time(r.get(order, "created_at")),
    )


def _order_event(
    metric: str,
    ref: OrderRef,
    order: Mapping[str, Any],
    contact: ContactRef,
    occurred_at: datetime,
) -> Mapped:
    properties: dict[str, Any] = {
        "order_id": ref.external_id,
        "order_number": ref.number,
        "status": ref.provider_status,
        "items": _items(order),
        "discount_codes": _discount_codes(order),
        "total": r.money_text(ref.total),
        "subtotal": r.money_text(r.money(order, "value_products")),
        "shipping": r.money_text(r.money(order, "value_shipment")),
        "discount": r.money_text(r.money(order, "value_discount")),
        "cart_token": ref.cart_token,
    }
    is_shipment = metric in _SHIPMENT_METRICS
    if is_shipment:
        properties.update(_tracking(order))
    if metric == METRIC_ORDER_CANCELLED and ref.provider_status == "refused":
        properties["cancel_reason"] = "payment_refused"
    return Mapped(
        metric_name=metric,
        contact=contact,
        source=SOURCE,
        source_id=ref.external_id,
        entity_type=_ENTITY_TYPES[metric],
        entity_id=ref.external_id,
        occurred_at=occurred_at,
        properties=r.compact(properties),
        value=None if is_shipment else ref.total,
        currency=None if is_shipment else ref.currency,
        order=ref,
        order_id=ref.external_id,
    )


def _order_time(payload: Mapping[str, Any], order: Mapping[str, Any], *, placed: bool) -> datetime:
    created = _yampi_time(r.get(order, "created_at"))
    if placed and created is not None:
        return created
    for when in (
        _yampi_time(r.get(payload, "time")),
        _yampi_time(r.get(order, "updated_at")),
        created,
    ):
        if when is not None:
            return when
    raise UnmappablePayload("missing_field", "the order has no created_at, updated_at or time")


def _tracking(order: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "tracking_number": r.first(r.text(order, "track_code"), r.text(order, "tracking_code")),
        "tracking_url": r.first(r.text(order, "track_url"), r.text(order, "tracking_url")),
        "tracking_company": r.text(order, "shipment_service"),
    }


def _alias(order: Mapping[str, Any]) -> str | None:
    alias = r.first(r.text(order, "status", "data", "alias"), r.text(order, "status_alias"))
    return None if alias is None else alias.lower()


# --- carts and customers -----------------------------------------------------------------


def yampi_checkout(cart: Mapping[str, Any], event_time: object = None) -> CheckoutRef:
    """The cart in a cart.reminder resource (token, recovery URL, items, total)."""
    updated_at = r.first(
        _yampi_time(r.get(cart, "updated_at")),
        _yampi_time(event_time),
        _yampi_time(r.get(cart, "created_at")),
    )
    if updated_at is None:
        raise UnmappablePayload("missing_field", "the cart has no updated_at, created_at or time")
    return CheckoutRef(
        provider=SOURCE,
        token=r.first(r.text(cart, "token"), r.text(cart, "id")) or _missing("resource.token"),
        contact=_contact(r.obj(cart, "customer", "data")),
        recovery_url=r.first(
            r.text(cart, "simulate_url"), r.text(cart, "recovery_url"), r.text(cart, "url")
        ),
        total=r.first(r.money(cart, "totalizers", "total"), r.money(cart, "value_total")),
        currency="BRL",
        updated_at=updated_at,
        external_id=r.text(cart, "id"),
        items=tuple(_items(cart)),
        discount_codes=tuple(_discount_codes(cart)),
    )


def _cart_reminder(payload: Mapping[str, Any], cart: Mapping[str, Any]) -> Normalized:
    checkout = yampi_checkout(cart, r.get(payload, "time"))
    if checkout.contact.is_empty:
        raise UnmappablePayload("no_contact", "the cart has no customer phone, email or id")
    occurred_at = _yampi_time(r.get(payload, "time")) or checkout.updated_at
    event = abandoned_checkout(checkout, occurred_at=occurred_at)
    return Normalized(events=(event,), checkout=checkout)


def _customer_created(payload: Mapping[str, Any], customer: Mapping[str, Any]) -> Normalized:
    customer_id = r.required_text(customer, "id")
    contact = _contact(customer)
    occurred_at = r.first(
        _yampi_time(r.get(customer, "created_at")), _yampi_time(r.get(payload, "time"))
    )
    if occurred_at is None:
        raise UnmappablePayload("missing_field", "the customer has no created_at or time")
    event = Mapped(
        metric_name=METRIC_CUSTOMER_CREATED,
        contact=contact,
        source=SOURCE,
        source_id=customer_id,
        entity_type="customer",
        entity_id=customer_id,
        occurred_at=occurred_at,
        properties={"customer_id": customer_id},
    )
    return Normalized(events=(event,))


def _contact(customer: Mapping[str, Any]) -> ContactRef:
    customer_id = r.text(customer, "id")
    phone = r.obj(customer, "phone")
    return ContactRef.parse(
        phone=r.first_phone(
            r.text(phone, "full_number"),
            r.text(phone, "formated_number"),
            r.text(customer, "phone"),  # some payloads send it as plain text
        ),
        email=r.first_email(r.text(customer, "email")),
        external_id=None if customer_id is None else f"yampi:customer:{customer_id}",
        name=r.first(
            r.text(customer, "name"),
            r.full_name(r.text(customer, "first_name"), r.text(customer, "last_name")),
        ),
    )


# --- shared readers ----------------------------------------------------------------------


def _yampi_time(raw: object) -> datetime | None:
    """A Yampi time: "YYYY-MM-DD HH:MM:SS[.ffffff]" or {"date": ..., "timezone": ...}."""
    if isinstance(raw, Mapping):
        zone = r.text(raw, "timezone") or YAMPI_TIMEZONE
        return r.local_time(r.get(raw, "date"), zone)
    return r.local_time(raw, YAMPI_TIMEZONE)


def _items(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        r.compact(
            {
                "sku": r.first(
                    r.text(item, "sku", "data", "sku"),
                    r.text(item, "sku"),
                    r.text(item, "item_sku"),
                ),
                "product_id": r.text(item, "product_id"),
                "sku_id": r.text(item, "sku_id"),
                "title": r.first(r.text(item, "sku", "data", "title"), r.text(item, "name")),
                "quantity": r.quantity(item, "quantity"),
                "price": r.money_text(r.money(item, "price")),
            }
        )
        for item in r.objects(data, "items", "data")
    ]


def _discount_codes(data: Mapping[str, Any]) -> list[str]:
    code = r.first(r.text(data, "promocode", "data", "code"), r.text(data, "coupon"))
    return [code] if code else []


def _missing(where: str) -> NoReturn:
    raise UnmappablePayload("missing_field", f"{where} is missing or empty")
