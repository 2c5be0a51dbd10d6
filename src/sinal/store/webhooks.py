"""The storage interface of raw webhook deliveries (implemented by the backends' mixins)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from sinal.store.automations import Integration

# deferred: part of it waits for a record that may still come; processed again at due_at.
DeliveryStatus = Literal["received", "processed", "unmappable", "failed", "deferred"]
# Where a page of deliveries ended: the last one's (received_at, id).
DeliveryCursor = tuple[datetime, UUID]
# The columns both backends select, in the order `StoredDelivery`'s fields take them.
DELIVERY_COLUMNS = (
    "account_id, id, integration_id, provider, topic, delivery_id, headers, body, received_at, "
    "status, reason, attempts, processed_at, due_at"
)


@dataclass(frozen=True, slots=True)
class StoredDelivery:
    """A webhook delivery exactly as received, and what became of it."""

    account_id: UUID
    id: UUID
    integration_id: UUID
    provider: str
    topic: str | None
    delivery_id: str
    headers: dict[str, Any]
    body: bytes
    received_at: datetime
    status: DeliveryStatus
    reason: str | None
    attempts: int
    processed_at: datetime | None
    due_at: datetime | None = None  # set when it was deferred: when it is processed again


class WebhookStore(Protocol):
    """What the webhook routes and `sinal webhooks replay` need."""

    def find_integration(self, integration_id: UUID) -> Integration | None:
        """A live integration by the id in a webhook URL (any account: the URL names it)."""
        ...

    def save_delivery(self, delivery: StoredDelivery) -> tuple[StoredDelivery, bool]:
        """Keep a delivery raw; (the kept row, True) or (the earlier copy, False) when the
        same delivery id came before."""
        ...

    def finish_delivery(
        self,
        account_id: UUID,
        delivery_id: UUID,
        status: DeliveryStatus,
        reason: str | None,
        due_at: datetime | None = None,
    ) -> None:
        """Record how processing ended (and count the attempt); a deferred delivery's
        `due_at` is when it is processed again."""
        ...

    def claim_deferred(self, now: datetime, limit: int, lease: float) -> list[StoredDelivery]:
        """Deferred deliveries due at `now`, oldest first, each pushed `lease` seconds ahead
        so concurrent callers take different ones (and one a crash interrupted comes back)."""
        ...

    def list_deliveries(
        self,
        statuses: tuple[DeliveryStatus, ...],
        account_id: UUID | None = None,
        limit: int = 1000,
        after: DeliveryCursor | None = None,
    ) -> list[StoredDelivery]:
        """Up to `limit` deliveries in these states, oldest first (by received_at, then id);
        `after`: the previous page's last one (keyset pagination, stable while they change
        state)."""
        ...

    def count_deliveries(
        self, statuses: tuple[DeliveryStatus, ...], account_id: UUID | None = None
    ) -> int:
        """How many deliveries are in these states."""
        ...
