"""Shapes shared by the provider normalizers: what a verified webhook turns into.

No I/O. A normalizer reads a parsed payload and returns `Mapped` events (one per event to
record), plus the order row (`OrderRef`) and checkout (`CheckoutRef`) they describe. The
caller finds or creates the contact from `Mapped.contact`, upserts the order, and emits
`Mapped.to_emit(...)` through the ledger. Payloads that verify but cannot be mapped raise
`UnmappablePayload` with a machine-readable `reason`, for the caller to keep and replay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Final, Literal
from uuid import UUID

from sinal.contacts import (
    InvalidIdentity,
    normalize_email,
    normalize_name,
    normalize_phone,
    normalize_wa_id,
)
from sinal.errors import WebhookError
from sinal.events import EmitEvent, build_unique_event_id

__all__ = [
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
    "UnmappablePayload",
    "merge_order_status",
]

Provider = Literal["shopify", "yampi", "whatsapp"]
OrderStatus = Literal[
    "pending", "paid", "fulfilled", "delivered", "partially_refunded", "refunded", "cancelled"
]

# An order's status only moves up this ladder, so a "created" webhook arriving after the
# "cancelled" one cannot bring a cancelled order back to pending.
ORDER_STATUS_RANK: Final[Mapping[str, int]] = {
    "pending": 0,
    "paid": 1,
    "fulfilled": 2,
    "delivered": 3,
    "partially_refunded": 4,
    "refunded": 5,
    "cancelled": 6,
}


class UnmappablePayload(WebhookError):
    """A verified payload that cannot be turned into events; `reason` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)  # both in args: survives pickling to a worker
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class DeliveryDeferred(WebhookError):
    """Part of a verified delivery waits for a record that may still be coming (a status
    that outran the record of its message's send, a refund or shipment that outran its
    order's webhook): process it again at `until`. What could be recorded was; a later
    pass records the rest, or gives up waiting."""

    def __init__(self, until: datetime, message: str) -> None:
        super().__init__(until, message)  # both in args: survives pickling to a worker
        self.until = until
        self.message = message

    def __str__(self) -> str:
        return f"deferred until {self.until.isoformat()}: {self.message}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContactRef:
    """Who an event is about, as the provider identifies them; normalized, maybe empty."""

    phone: str | None = None  # E.164 (Brazilian mobiles always with the ninth digit)
    email: str | None = None
    external_id: str | None = None  # "shopify:customer:123", "yampi:customer:45", ...
    name: str | None = None
    wa_id: str | None = None  # WhatsApp id as Meta sends it (digits), for replies
    user_id: str | None = None  # Meta's business-scoped user id (BSUID)

    @classmethod
    def parse(
        cls,
        *,
        phone: str | None = None,
        email: str | None = None,
        external_id: str | None = None,
        name: str | None = None,
        wa_id: str | None = None,
        user_id: str | None = None,
    ) -> ContactRef:
        """Normalize what a provider sent; an invalid phone, email or name becomes None.
        A typed `phone` may be national (Brazilian first); a `wa_id` is always international."""
        return cls(
            phone=_try(normalize_phone, phone) or _try(normalize_wa_id, wa_id),
            email=_try(normalize_email, email),
            external_id=external_id,
            name=_try(normalize_name, name),
            wa_id=wa_id,
            user_id=user_id,
        )

    @property
    def is_empty(self) -> bool:
        """Whether nothing identifies the contact (no phone, email or external id)."""
        return self.phone is None and self.email is None and self.external_id is None

    def identities(self) -> dict[str, str | None]:
        """Keyword arguments for `Ledger.resolve_contact` (phone, email, external_id, name)."""
        return {
            "phone": self.phone,
            "email": self.email,
            "external_id": self.external_id,
            "name": self.name,
        }


def _try(normalize: Callable[[str], str | None], raw: str | None) -> str | None:
    """`normalize(raw)`, or None when `raw` is absent or invalid (providers send junk)."""
    if raw is None:
        return None
    try:
        return normalize(raw)
    except InvalidIdentity:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class OrderRef:
    """The order row an event describes: upsert it by (provider, external_id)."""

    provider: Provider
    external_id: str
    number: str | None
    status: OrderStatus
    provider_status: str | None  # the provider's own word ("paid", "refused", ...)
    total: Decimal | None  # what was ordered, before refunds (refunds are events)
    currency: str | None
    checkout_token: str | None = None
    cart_token: str | None = None
    updated_at: datetime | None = None
    placed_at: datetime | None = None  # the provider's created_at, whatever the event says

    @property
    def checkout_tokens(self) -> tuple[str, ...]:
        """Tokens under which an abandoned checkout of this order may have been recorded."""
        return tuple(t for t in (self.checkout_token, self.cart_token) if t)


def merge_order_status(current: str | None, new: str) -> str | None:
    """The order status after `new` arrives: the higher of the two on ORDER_STATUS_RANK."""
    new_rank = ORDER_STATUS_RANK.get(new)
    if new_rank is None:
        return current
    current_rank = ORDER_STATUS_RANK.get(current or "")
    return new if current_rank is None or new_rank > current_rank else current


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckoutRef:
    """A cart/checkout a customer may abandon; schedule abandonment from its `updated_at`."""

    provider: Provider
    token: str
    contact: ContactRef
    recovery_url: str | None
    total: Decimal | None
    currency: str | None
    updated_at: datetime
    completed_at: datetime | None = None
    external_id: str | None = None
    items: tuple[Mapping[str, Any], ...] = ()
    discount_codes: tuple[str, ...] = ()

    @property
    def is_completed(self) -> bool:
        """Whether the checkout became an order (nothing to abandon)."""
        return self.completed_at is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class Mapped:
    """One event to record, normalized from a provider payload (no raw payload inside)."""

    metric_name: str
    contact: ContactRef
    source: Provider
    source_id: str
    entity_type: str
    entity_id: str | None
    occurred_at: datetime  # timezone-aware, UTC
    properties: dict[str, Any] = field(default_factory=dict)
    value: Decimal | None = None
    currency: str | None = None
    order: OrderRef | None = None  # the order row to upsert, when the payload is an order
    order_id: str | None = None  # provider order id: resolve the contact through it if empty
    message_status: str | None = None  # WhatsApp status events: see whatsapp.advance_status

    @property
    def unique_event_id(self) -> str:
        """The ledger's dedup key, "{source}:{entity_type}:{source_id}"."""
        return build_unique_event_id(self.source, self.entity_type, self.source_id)

    def to_emit(
        self,
        *,
        account_id: UUID | str,
        contact_id: UUID | str,
        integration_id: UUID | str | None = None,
    ) -> EmitEvent:
        """The ledger input for this event, once the caller knows the contact's id."""
        return EmitEvent(
            account_id=account_id,
            contact_id=contact_id,
            metric_name=self.metric_name,
            source=self.source,
            properties=self.properties,
            value=self.value,
            currency=self.currency,
            source_id=self.source_id,
            integration_id=integration_id,
            entity_type=self.entity_type,
            entity_id=self.entity_id,
            occurred_at=self.occurred_at,
        )


@dataclass(frozen=True, slots=True)
class Normalized:
    """Everything one commerce payload says: events, order row, checkout, or why nothing."""

    events: tuple[Mapped, ...] = ()
    order: OrderRef | None = None
    checkout: CheckoutRef | None = None
    ignored: str | None = None  # a stable code when there is no event to record


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook delivery as received: what to key the raw-body store on."""

    provider: Provider
    topic: str | None  # Shopify topic, Yampi event name, WhatsApp change fields
    delivery_id: str  # the same for every redelivery of this delivery
    occurred_at: datetime | None  # the provider's event time, when it gives one
    origin: str | None = None  # shop domain, Yampi merchant alias, WhatsApp WABA id
