"""Abandoned carts: when a checkout counts as abandoned, and the events that say so.

Shopify sends no "abandoned" webhook, so sinal derives it: schedule
``abandonment_due(checkout)`` from each checkout webhook (a later update moves it); when
it comes and no order completed the checkout, record ``abandoned_checkout(...)``. Yampi's
``cart.reminder`` is the abandonment itself. An order carrying an abandoned checkout's
token (``OrderRef.checkout_tokens``) then records ``recovered_checkout(...)``.
Each is once per checkout token: ``{provider}:checkout_abandoned|checkout_recovered:{token}``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Final

from sinal.catalog import METRIC_CHECKOUT_ABANDONED, METRIC_CHECKOUT_RECOVERED
from sinal.events import build_unique_event_id, decimal_text, fits_value
from sinal.integrations import _read as r
from sinal.integrations.base import CheckoutRef, ContactRef, Mapped, OrderRef, UnmappablePayload

__all__ = [
    "DEFAULT_ABANDON_DELAY",
    "RECORDED_AFTER_ORDER",
    "abandoned_checkout",
    "abandonment_due",
    "abandonment_id",
    "checkout_event",
    "order_recovery",
    "recovered_checkout",
    "recovery_id",
]

DEFAULT_ABANDON_DELAY: Final = timedelta(minutes=60)
_ABANDONED: Final = "checkout_abandoned"  # Checkout Abandoned's entity type
_RECOVERED: Final = "checkout_recovered"  # Checkout Recovered's entity type
# The Checkout Abandoned property saying it was recorded only once its order had come (due
# before the order was placed, not yet recorded by a worker's pass): no automation runs
# for it (`sinal.store.commerce.overdue_abandonment`).
RECORDED_AFTER_ORDER: Final = "recorded_after_order"


def abandonment_due(
    checkout: CheckoutRef, delay: timedelta = DEFAULT_ABANDON_DELAY
) -> datetime | None:
    """When `checkout` counts as abandoned, or None if it never can (completed, anonymous)."""
    if checkout.is_completed or checkout.contact.is_empty:
        return None
    return checkout.updated_at + delay


def abandoned_checkout(checkout: CheckoutRef, *, occurred_at: datetime) -> Mapped:
    """Checkout Abandoned for `checkout` (once per checkout token), with its recovery URL."""
    event = checkout_event(
        checkout,
        metric_name=METRIC_CHECKOUT_ABANDONED,
        entity_type=_ABANDONED,
        occurred_at=occurred_at,
    )
    return replace(event, properties={**event.properties, RECORDED_AFTER_ORDER: False})


def abandonment_id(provider: str, token: str) -> str:
    """The unique_event_id of the Checkout Abandoned of `provider`'s checkout `token`."""
    return build_unique_event_id(provider, _ABANDONED, token)


def recovery_id(provider: str, token: str) -> str:
    """The unique_event_id of the Checkout Recovered of `provider`'s checkout `token`."""
    return build_unique_event_id(provider, _RECOVERED, token)


def checkout_event(
    checkout: CheckoutRef, *, metric_name: str, entity_type: str, occurred_at: datetime
) -> Mapped:
    """An event about `checkout` keyed by its token: items, discount codes, recovery URL."""
    if checkout.contact.is_empty:
        raise UnmappablePayload("no_contact", "the checkout has no phone, email or customer id")
    properties = {
        "checkout_token": checkout.token,
        "checkout_id": checkout.external_id,
        "checkout_url": checkout.recovery_url,
        "items": [dict(item) for item in checkout.items],
        "discount_codes": list(checkout.discount_codes),
        "total": _total_text(checkout.total),
    }
    return Mapped(
        metric_name=metric_name,
        contact=checkout.contact,
        source=checkout.provider,
        source_id=checkout.token,
        entity_type=entity_type,
        entity_id=checkout.token,
        occurred_at=occurred_at,
        properties=r.compact(properties),
        value=checkout.total,
        currency=checkout.currency,
    )


def _total_text(total: Decimal | None) -> str | None:
    """A checkout's total in properties: one text whether it comes from the payload or from
    the stored row (PostgreSQL gives back 297.9000, SQLite 297.90); a total no row can keep
    stays as sent (the event's value is refused with it)."""
    if total is None or not fits_value(total):
        return r.money_text(total)
    return decimal_text(total)


def recovered_checkout(order_event: Mapped, checkout_token: str) -> Mapped:
    """Checkout Recovered (once per checkout token) from the event of the order that won it,
    dated when the order was placed: the event may be its payment's, later (orders/paid
    processed before orders/create), and the store tells a checkout completed in time from
    one recovered after its abandonment by this date."""
    order = order_event.order
    if order is None:
        raise ValueError("recovered_checkout needs an order event (Mapped.order is None)")
    # the number and name as the order's own events say them (Shopify's row keeps the
    # name, "#1042", as its number; its events' order_number is "1042")
    said = order_event.properties
    return order_recovery(
        order,
        checkout_token,
        contact=order_event.contact,
        occurred_at=order.placed_at or order_event.occurred_at,
        order_number=said.get("order_number", order.number),
        order_name=said.get("order_name"),
    )


def order_recovery(
    order: OrderRef,
    checkout_token: str,
    *,
    contact: ContactRef,
    occurred_at: datetime,
    order_number: object,
    order_name: object = None,
) -> Mapped:
    """Checkout Recovered of checkout `checkout_token` by `order`, at `occurred_at`: from an
    order event (`recovered_checkout`), or from the order's row when the checkout's
    abandonment came after it (a Yampi cart.reminder: `sinal.store.commerce.late_reminder`)."""
    properties = {
        "checkout_token": checkout_token,
        "order_id": order.external_id,
        "order_number": order_number,
        "order_name": order_name,
        "total": r.money_text(order.total),
        # True when the store finds the order placed before the checkout counted as
        # abandoned (`sinal.store.commerce.recovery_events`)
        "ordered_before_abandonment": False,
    }
    return Mapped(
        metric_name=METRIC_CHECKOUT_RECOVERED,
        contact=contact,
        source=order.provider,
        source_id=checkout_token,
        entity_type=_RECOVERED,
        entity_id=order.external_id,
        occurred_at=occurred_at,
        properties=r.compact(properties),
        value=order.total,
        currency=order.currency,
        order_id=order.external_id,
    )
