"""Shopify webhooks (Admin API, JSON) into sinal events. Pure: no I/O.

| topic               | metric                               | entity_type (dedup) | source_id   |
|---------------------|--------------------------------------|---------------------|-------------|
| orders/create       | Order Placed                         | order_placed        | order id    |
| orders/paid         | Order Paid                           | order_paid          | order id    |
| orders/cancelled    | Order Cancelled                      | order_cancelled     | order id    |
| orders/fulfilled    | Order Fulfilled                      | order_fulfilled     | order id    |
| refunds/create      | Order Refunded (value: amount)       | refund              | refund id   |
| checkouts/create    | Checkout Started                     | checkout_started    | token       |
| checkouts/update    | none (`Normalized.checkout`)         |                     |             |
| customers/create    | Customer Created                     | customer            | customer id |
| fulfillments/create | Shipment Created                     | shipment_created    | fulfillment |
| fulfillments/update | by shipment_status, SHIPMENT_METRICS | shipment_{status}   | fulfillment |

Shopify sends no "abandoned" webhook: the caller schedules `abandonment_due(checkout)` from
each checkout webhook and, if no order completed it by then, records
`abandoned_checkout(checkout, occurred_at=...)`; a later order carrying that checkout's
token records `recovered_checkout(order_event, token)`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Final

from sinal.catalog import (
    METRIC_CHECKOUT_STARTED,
    METRIC_CUSTOMER_CREATED,
    METRIC_ORDER_CANCELLED,
    METRIC_ORDER_FULFILLED,
    METRIC_ORDER_PAID,
    METRIC_ORDER_PLACED,
    METRIC_ORDER_REFUNDED,
    METRIC_SHIPMENT_CREATED,
    METRIC_SHIPMENT_DELIVERED,
    METRIC_SHIPMENT_EXCEPTION,
    METRIC_SHIPMENT_IN_TRANSIT,
    METRIC_SHIPMENT_OUT_FOR_DELIVERY,
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
from sinal.integrations.checkouts import (
    abandoned_checkout,
    abandonment_due,
    checkout_event,
    recovered_checkout,
)

__all__ = [
    "SHIPMENT_METRICS",
    "TOPICS",
    "abandoned_checkout",
    "abandonment_due",
    "map_shopify",
    "normalize_shopify",
    "recovered_checkout",
    "shopify_checkout",
    "shopify_delivery",
]

SOURCE: Final = "shopify"

# fulfillments/update: shipment_status -> metric. Other statuses (confirmed, label_printed,
# label_purchased, ready_for_pickup) and a null status record nothing.
SHIPMENT_METRICS: Final[Mapping[str, str]] = {
    "in_transit": METRIC_SHIPMENT_IN_TRANSIT,
    "out_for_delivery": METRIC_SHIPMENT_OUT_FOR_DELIVERY,
    "delivered": METRIC_SHIPMENT_DELIVERED,
    "attempted_delivery": METRIC_SHIPMENT_EXCEPTION,
    "failure": METRIC_SHIPMENT_EXCEPTION,
}

# The resource each topic's body is, by the type in its admin_graphql_api_id
# ("gid://shopify/Order/5829371002921"), and by top-level fields Shopify always sends in
# that resource's body and in no other's: a checkout has no admin_graphql_api_id at all.
_GID_FIELD: Final = "admin_graphql_api_id"
_GID: Final = re.compile(r"gid://shopify/(?P<type>[A-Za-z]+)/[^/]+")
_TOPIC_RESOURCES: Final[Mapping[str, str]] = {
    "orders": "Order", "refunds": "Refund", "customers": "Customer",
    "fulfillments": "Fulfillment", "checkouts": "Checkout",
}  # fmt: skip
_RESOURCES: Final = frozenset(_TOPIC_RESOURCES.values())
_RESOURCE_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "Order": ("order_number", "order_status_url"),
    "Refund": ("refund_line_items",),
    "Customer": ("verified_email", "addresses"),
    "Fulfillment": ("tracking_numbers", "shipment_status"),
    "Checkout": ("abandoned_checkout_url",),
}
# Order states a topic's body cannot be in, when it names them: an order that was paid is
# never again pending, authorized, voided or expired; a cancelled one has cancelled_at;
# a fulfilled one has a fulfillment_status.
_TOPIC_STATES: Final[Mapping[str, tuple[tuple[str, frozenset[str | None]], ...]]] = {
    "orders/paid": (
        ("financial_status", frozenset({"pending", "authorized", "voided", "expired"})),
    ),
    "orders/cancelled": (("cancelled_at", frozenset({None})),),
    "orders/fulfilled": (("fulfillment_status", frozenset({None})),),
}

# orders/* topics: metric, entity_type, the timestamps to read occurred_at from (first found).
_ORDER_TOPICS: Final[Mapping[str, tuple[str, str, tuple[str, ...]]]] = {
    "orders/create": (METRIC_ORDER_PLACED, "order_placed", ("created_at",)),
    "orders/paid": (METRIC_ORDER_PAID, "order_paid", ("updated_at", "processed_at")),
    "orders/cancelled": (METRIC_ORDER_CANCELLED, "order_cancelled", ("cancelled_at", "updated_at")),
    "orders/fulfilled": (METRIC_ORDER_FULFILLED, "order_fulfilled", ("updated_at", "closed_at")),
}


def shopify_delivery(headers: Mapping[str, str], body: bytes) -> Delivery:
    """The delivery's topic, dedup id (X-Shopify-Webhook-Id, same on retries) and time."""
    delivery_id = r.first(
        r.header(headers, "X-Shopify-Webhook-Id"), r.header(headers, "X-Shopify-Event-Id")
    )
    triggered = r.header(headers, "X-Shopify-Triggered-At")
    try:
        occurred_at = r.iso_time(triggered)
    except UnmappablePayload:
        occurred_at = None  # a bad header must not stop the raw body from being stored
    return Delivery(
        provider=SOURCE,
        topic=r.header(headers, "X-Shopify-Topic"),
        delivery_id=delivery_id or r.body_digest(body),
        occurred_at=occurred_at,
        origin=r.header(headers, "X-Shopify-Shop-Domain"),
    )


def map_shopify(topic: str, payload: Mapping[str, Any]) -> list[Mapped]:
    """The events to record for one Shopify webhook (see the module table)."""
    return list(normalize_shopify(topic, payload).events)


def normalize_shopify(topic: str, payload: Mapping[str, Any]) -> Normalized:
    """Events, order row and checkout of one Shopify webhook; raises UnmappablePayload."""
    if not isinstance(payload, Mapping):
        raise UnmappablePayload("invalid_json", "the payload is not a JSON object")
    name = topic.strip().lower()
    if name not in TOPICS:
        raise UnmappablePayload("unsupported_topic", f"topic {topic[:64]!r} is not mapped")
    _check_topic(name, payload)
    if name in _ORDER_TOPICS:
        return _order_event(name, payload)
    return _HANDLERS[name](payload)


def _check_topic(topic: str, payload: Mapping[str, Any]) -> None:
    """Refuse a body that cannot be this topic's. The signature covers the body, not the
    X-Shopify-Topic header: a signed orders/create body sent again as orders/paid or
    checkouts/create would otherwise record a payment, or an abandoned cart, that never
    happened. The body must show its topic's resource and no other; an order state is
    checked only when the body names it (a subscription may leave fields out)."""
    expected = _TOPIC_RESOURCES[topic.partition("/")[0]]
    shown = _resources_shown(payload)
    for resource, field in shown:
        if resource != expected:
            raise UnmappablePayload(
                "topic_mismatch", f"a {resource} is no {topic} payload ({field})"
            )
    if not shown:
        fields = " or ".join(_RESOURCE_FIELDS[expected])
        raise UnmappablePayload(
            "topic_mismatch", f"the body shows no {expected} for {topic} ({fields})"
        )
    for field, refused in _TOPIC_STATES.get(topic, ()):
        if field in payload and r.text(payload, field) in refused:
            state = r.text(payload, field) or "null"
            raise UnmappablePayload(
                "topic_mismatch", f"an order with {field} {state[:64]!r} is no {topic} payload"
            )


def _resources_shown(payload: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each resource the body says it is, with the field that says so."""
    kind = _GID.fullmatch(r.text(payload, _GID_FIELD) or "")
    shown = [(kind["type"], _GID_FIELD)] if kind is not None and kind["type"] in _RESOURCES else []
    for resource, fields in _RESOURCE_FIELDS.items():
        shown += [(resource, field) for field in fields if field in payload]
    return shown


# --- orders ------------------------------------------------------------------------------


def _order_event(topic: str, order: Mapping[str, Any]) -> Normalized:
    metric, entity_type, time_fields = _ORDER_TOPICS[topic]
    ref = _order_ref(order)
    contact = _order_contact(order)
    if contact.is_empty:
        raise UnmappablePayload("no_contact", "the order has no customer, phone or email")
    value = ref.total
    properties = _order_properties(order, ref)
    properties["total"] = r.money_text(value)
    if topic == "orders/cancelled":
        properties["cancel_reason"] = r.text(order, "cancel_reason")
    if topic == "orders/fulfilled":
        properties.update(_order_tracking(order))
    event = Mapped(
        metric_name=metric,
        contact=contact,
        source=SOURCE,
        source_id=ref.external_id,
        entity_type=entity_type,
        entity_id=ref.external_id,
        occurred_at=r.first_iso_time(order, *time_fields, "created_at"),
        properties=r.compact(properties),
        value=value,
        currency=ref.currency,
        order=ref,
        order_id=ref.external_id,
    )
    return Normalized(events=(event,), order=ref)


def _order_ref(order: Mapping[str, Any]) -> OrderRef:
    return OrderRef(
        provider=SOURCE,
        external_id=r.required_text(order, "id"),
        number=r.first(r.text(order, "name"), r.text(order, "order_number")),
        status=_order_status(order),
        provider_status=r.text(order, "financial_status"),
        total=_order_total(order),
        currency=r.currency(order, "currency"),
        checkout_token=r.text(order, "checkout_token"),
        cart_token=r.text(order, "cart_token"),
        updated_at=r.iso_time(order, "updated_at"),
        placed_at=r.iso_time(order, "created_at"),
    )


def _order_status(order: Mapping[str, Any]) -> OrderStatus:
    """The order's state in this snapshot (the caller merges with merge_order_status)."""
    financial = r.text(order, "financial_status")
    if r.text(order, "cancelled_at") or financial == "voided":
        return "cancelled"
    if financial in ("refunded", "partially_refunded"):
        return "refunded" if financial == "refunded" else "partially_refunded"
    if r.text(order, "fulfillment_status") == "fulfilled":
        return "fulfilled"
    return "paid" if financial == "paid" else "pending"


def _order_total(order: Mapping[str, Any]) -> Decimal | None:
    """What was ordered: total_price. Not current_total_price, which has the refunds taken
    off (0.00 once all went back): refunds are events of their own, and the order row adds
    them up against this total (a second partial refund must not count the first twice)."""
    current = r.money(order, "current_total_price")  # read anyway: junk is still named
    original = r.money(order, "total_price")
    return original if original is not None else current


def _order_contact(order: Mapping[str, Any]) -> ContactRef:
    customer = r.obj(order, "customer")
    billing = r.obj(order, "billing_address")
    shipping = r.obj(order, "shipping_address")
    return ContactRef.parse(
        phone=r.first_phone(
            r.text(customer, "phone"),
            r.text(order, "phone"),
            r.text(billing, "phone"),
            r.text(shipping, "phone"),
            r.text(customer, "default_address", "phone"),
        ),
        email=r.first_email(
            r.text(order, "email"), r.text(order, "contact_email"), r.text(customer, "email")
        ),
        external_id=_customer_id(customer),
        name=_person_name(customer) or r.text(billing, "name") or r.text(shipping, "name"),
    )


def _order_properties(order: Mapping[str, Any], ref: OrderRef) -> dict[str, Any]:
    return {
        "order_id": ref.external_id,
        "order_number": r.text(order, "order_number"),
        "order_name": r.text(order, "name"),
        "items": _line_items(order),
        "discount_codes": _discount_codes(order),
        "subtotal": r.money_text(r.money(order, "current_subtotal_price")),
        "total_discounts": r.money_text(r.money(order, "current_total_discounts")),
        "shipping": r.money_text(
            r.money(order, "total_shipping_price_set", "shop_money", "amount")
        ),
        "financial_status": r.text(order, "financial_status"),
        "fulfillment_status": r.text(order, "fulfillment_status"),
        "payment_gateways": r.texts(order, "payment_gateway_names"),
        "checkout_token": ref.checkout_token,
        "order_status_url": r.text(order, "order_status_url"),
        "source_name": r.text(order, "source_name"),
        "test": r.flag(order, "test") or None,
    }


def _order_tracking(order: Mapping[str, Any]) -> dict[str, Any]:
    fulfillments = r.objects(order, "fulfillments")
    numbers = [n for f in fulfillments for n in r.texts(f, "tracking_numbers")]
    urls = [u for f in fulfillments for u in r.texts(f, "tracking_urls")]
    return {"tracking_numbers": numbers, "tracking_urls": urls}


# --- refunds -----------------------------------------------------------------------------


def _refund(refund: Mapping[str, Any]) -> Normalized:
    refund_id = r.required_text(refund, "id")
    order_id = r.required_text(refund, "order_id")
    amount, amount_source, currency = _refund_amount(refund)
    properties = {
        "order_id": order_id,
        "refund_id": refund_id,
        "amount": r.money_text(amount),
        "amount_source": amount_source,
        "items": _refund_items(refund),
        "note": r.text(refund, "note"),
    }
    event = Mapped(
        metric_name=METRIC_ORDER_REFUNDED,
        contact=ContactRef(),  # refunds carry no customer: resolve through order_id
        source=SOURCE,
        source_id=refund_id,
        entity_type="refund",
        entity_id=order_id,
        occurred_at=r.first_iso_time(refund, "processed_at", "created_at"),
        properties=r.compact(properties),
        value=amount,
        currency=currency,
        order_id=order_id,
    )
    return Normalized(events=(event,))


def _refund_amount(refund: Mapping[str, Any]) -> tuple[Decimal, str, str | None]:
    """The refunded amount: successful refund transactions, else the line items' subtotals."""
    paid_back = [
        t
        for t in r.objects(refund, "transactions")
        if r.text(t, "kind") == "refund" and r.text(t, "status") == "success"
    ]
    if paid_back:
        total = sum((r.money(t, "amount") or Decimal(0) for t in paid_back), Decimal(0))
        return total, "transactions", r.currency(paid_back[0], "currency")
    lines = r.objects(refund, "refund_line_items")
    total = sum((r.money(line, "subtotal") or Decimal(0) for line in lines), Decimal(0))
    currency = next(
        (
            code
            for line in lines
            if (code := r.currency(line, "subtotal_set", "shop_money", "currency_code"))
        ),
        None,
    )
    return total, "line_items", currency


def _refund_items(refund: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        r.compact(
            {
                "line_item_id": r.text(line, "line_item_id"),
                "sku": r.text(line, "line_item", "sku"),
                "title": r.text(line, "line_item", "title"),
                "quantity": r.quantity(line, "quantity"),
                "subtotal": r.money_text(r.money(line, "subtotal")),
            }
        )
        for line in r.objects(refund, "refund_line_items")
    ]


# --- checkouts ---------------------------------------------------------------------------


def shopify_checkout(checkout: Mapping[str, Any]) -> CheckoutRef:
    """The checkout in a checkouts/create or checkouts/update payload, for abandonment."""
    customer = r.obj(checkout, "customer")
    contact = ContactRef.parse(
        phone=r.first_phone(
            r.text(checkout, "phone"),
            r.text(customer, "phone"),
            r.text(checkout, "shipping_address", "phone"),
            r.text(checkout, "billing_address", "phone"),
        ),
        email=r.first_email(r.text(checkout, "email"), r.text(customer, "email")),
        external_id=_customer_id(customer),
        name=_person_name(customer) or r.text(checkout, "shipping_address", "name"),
    )
    return CheckoutRef(
        provider=SOURCE,
        token=r.required_text(checkout, "token"),
        contact=contact,
        recovery_url=r.text(checkout, "abandoned_checkout_url"),
        total=r.money(checkout, "total_price"),
        currency=r.first(
            r.currency(checkout, "currency"), r.currency(checkout, "presentment_currency")
        ),
        updated_at=r.first_iso_time(checkout, "updated_at", "created_at"),
        completed_at=r.iso_time(checkout, "completed_at"),
        external_id=r.text(checkout, "id"),
        items=tuple(_line_items(checkout)),
        discount_codes=tuple(_discount_codes(checkout)),
    )


def _checkout_created(payload: Mapping[str, Any]) -> Normalized:
    checkout = shopify_checkout(payload)
    if checkout.contact.is_empty:
        return Normalized(checkout=checkout, ignored="anonymous_checkout")
    event = checkout_event(
        checkout,
        metric_name=METRIC_CHECKOUT_STARTED,
        entity_type="checkout_started",
        occurred_at=r.first_iso_time(payload, "created_at", "updated_at"),
    )
    return Normalized(events=(event,), checkout=checkout)


def _checkout_updated(payload: Mapping[str, Any]) -> Normalized:
    return Normalized(checkout=shopify_checkout(payload), ignored="checkout_updated")


# --- customers ---------------------------------------------------------------------------


def _customer_created(customer: Mapping[str, Any]) -> Normalized:
    customer_id = r.required_text(customer, "id")
    contact = ContactRef.parse(
        phone=r.first_phone(
            r.text(customer, "phone"), r.text(customer, "default_address", "phone")
        ),
        email=r.first_email(r.text(customer, "email")),
        external_id=_customer_id(customer),
        name=_person_name(customer),
    )
    properties = {
        "customer_id": customer_id,
        "email_marketing": r.text(customer, "email_marketing_consent", "state"),
        "sms_marketing": r.text(customer, "sms_marketing_consent", "state"),
        "tags": _tags(customer),
        "verified_email": r.flag(customer, "verified_email"),
    }
    event = Mapped(
        metric_name=METRIC_CUSTOMER_CREATED,
        contact=contact,
        source=SOURCE,
        source_id=customer_id,
        entity_type="customer",
        entity_id=customer_id,
        occurred_at=r.first_iso_time(customer, "created_at", "updated_at"),
        properties=r.compact(properties),
    )
    return Normalized(events=(event,))


# --- fulfillments ------------------------------------------------------------------------


def _fulfillment_created(fulfillment: Mapping[str, Any]) -> Normalized:
    event = _shipment_event(
        fulfillment, METRIC_SHIPMENT_CREATED, "shipment_created", ("created_at", "updated_at")
    )
    return Normalized(events=(event,))


def _fulfillment_updated(fulfillment: Mapping[str, Any]) -> Normalized:
    r.required_text(fulfillment, "id")
    status = r.text(fulfillment, "shipment_status")
    if status is None:
        return Normalized(ignored="no_shipment_status")
    metric = SHIPMENT_METRICS.get(status)
    if metric is None:
        return Normalized(ignored="shipment_status_not_tracked")
    event = _shipment_event(fulfillment, metric, f"shipment_{status}", ("updated_at", "created_at"))
    return Normalized(events=(event,))


def _shipment_event(
    fulfillment: Mapping[str, Any], metric: str, entity_type: str, time_fields: tuple[str, ...]
) -> Mapped:
    fulfillment_id = r.required_text(fulfillment, "id")
    order_id = r.required_text(fulfillment, "order_id")
    destination = r.obj(fulfillment, "destination")
    contact = ContactRef.parse(
        phone=r.first_phone(r.text(destination, "phone")),
        email=r.first_email(r.text(fulfillment, "email")),
        name=r.text(destination, "name"),
    )
    properties = {
        "order_id": order_id,
        "fulfillment_id": fulfillment_id,
        "fulfillment_name": r.text(fulfillment, "name"),
        "shipment_status": r.text(fulfillment, "shipment_status"),
        "tracking_company": r.text(fulfillment, "tracking_company"),
        "tracking_number": r.first(
            r.text(fulfillment, "tracking_number"), *r.texts(fulfillment, "tracking_numbers")
        ),
        "tracking_url": r.first(
            r.text(fulfillment, "tracking_url"), *r.texts(fulfillment, "tracking_urls")
        ),
        "items": _line_items(fulfillment),
    }
    return Mapped(
        metric_name=metric,
        contact=contact,  # often empty (protected data): resolve through order_id
        source=SOURCE,
        source_id=fulfillment_id,
        entity_type=entity_type,
        entity_id=fulfillment_id,
        occurred_at=r.first_iso_time(fulfillment, *time_fields),
        properties=r.compact(properties),
        order_id=order_id,
    )


# --- shared readers ----------------------------------------------------------------------


def _customer_id(customer: Mapping[str, Any]) -> str | None:
    customer_id = r.text(customer, "id")
    return None if customer_id is None else f"shopify:customer:{customer_id}"


def _person_name(person: Mapping[str, Any]) -> str | None:
    return r.full_name(r.text(person, "first_name"), r.text(person, "last_name"))


def _line_items(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        r.compact(
            {
                "sku": r.text(line, "sku"),
                "product_id": r.text(line, "product_id"),
                "variant_id": r.text(line, "variant_id"),
                "title": r.text(line, "title"),
                "quantity": r.quantity(line, "quantity"),
                "price": r.money_text(r.money(line, "price")),
            }
        )
        for line in r.objects(data, "line_items")
    ]


def _discount_codes(data: Mapping[str, Any]) -> list[str]:
    codes = (r.text(d, "code") for d in r.objects(data, "discount_codes"))
    return [code for code in codes if code]


def _tags(data: Mapping[str, Any]) -> list[str]:
    raw = r.text(data, "tags") or ""
    return [tag.strip() for tag in raw.split(",") if tag.strip()]


_HANDLERS: Final[dict[str, Callable[[Mapping[str, Any]], Normalized]]] = {
    "refunds/create": _refund,
    "checkouts/create": _checkout_created,
    "checkouts/update": _checkout_updated,
    "customers/create": _customer_created,
    "fulfillments/create": _fulfillment_created,
    "fulfillments/update": _fulfillment_updated,
}

TOPICS: Final[frozenset[str]] = frozenset(_ORDER_TOPICS) | frozenset(_HANDLERS)
"""The Shopify topics sinal maps (subscribe the integration to these)."""
