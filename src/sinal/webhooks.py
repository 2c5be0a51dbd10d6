"""Webhook deliveries: kept raw first, then processed, idempotently, by their provider's
processor; `sinal webhooks replay` processes kept deliveries again after a fix.

A processor turns one stored delivery into events (and the rows that go with them: orders,
checkouts, message statuses). It must be idempotent — a redelivery, or a replay, records
duplicates, never second events — and raise `UnmappablePayload` for a verified payload it
cannot map (kept with its reason), or `DeliveryDeferred` when part of it waits for a record
that may still be coming (a message's send still committing, an order whose webhook is
seconds behind): the delivery is then kept as ``deferred`` until its due time, and
`process_deferred` (run periodically by the worker) processes it again. Only a first pass
within the integration's grace (`deferral_grace`) may wait (`may_defer_until`); the next
pass is final, and so is a redelivery or replay of one past its grace.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, cast
from uuid import UUID

from sinal.errors import StoreMisconfigured, StoreUnavailable
from sinal.ids import new_id
from sinal.integrations.base import DeliveryDeferred, UnmappablePayload
from sinal.ledger import Ledger
from sinal.store.automations import Integration
from sinal.store.webhooks import DeliveryCursor, DeliveryStatus, StoredDelivery, WebhookStore

log = logging.getLogger("sinal.webhooks")

Processor = Callable[[Ledger, Integration, StoredDelivery], None]

# provider -> "module:function", imported on first use
PROCESSORS: Mapping[str, str] = {
    "shopify": "sinal.commerce:process_shopify",
    "yampi": "sinal.commerce:process_yampi",
    "whatsapp": "sinal.messaging:process_whatsapp",
}
# Deliveries `replay` reads at a time.
REPLAY_PAGE_SIZE = 500
# Seconds a deferred delivery stays claimed by `process_deferred` (a crash: taken again).
DEFERRED_LEASE: Final = 300.0
# How long a delivery may wait for a record, unless its integration's setting says otherwise.
DEFAULT_GRACE: Final = timedelta(seconds=60)
MAX_GRACE_SECONDS: Final = 3600
# Kept with a delivery: what identifies and explains it; never credentials.
_DROPPED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
# Characters kept of a delivery's topic (read from a header or the body: any length) and of
# the reason it ended so (which may quote the body).
_MAX_TOPIC = 255
MAX_REASON: Final = 2000


@dataclass(frozen=True, slots=True)
class Received:
    """A delivery after it was kept and processed."""

    delivery: StoredDelivery
    is_new: bool
    status: DeliveryStatus
    reason: str | None
    # The delivery id came before with another topic or body: this one was not processed.
    is_clash: bool = False


def store_of(ledger: Ledger) -> WebhookStore:
    """The ledger's store, as a `WebhookStore`."""
    return cast(WebhookStore, ledger.store)


def receive(
    ledger: Ledger,
    integration: Integration,
    *,
    topic: str | None,
    delivery_id: str,
    headers: Mapping[str, str],
    body: bytes,
) -> Received:
    """Keep the delivery raw (once per delivery id), then process it if it is new or was
    not processed yet (a redelivery after a failure gets another go; a deferred one waits
    for its due time)."""
    kept = {k.lower(): v for k, v in headers.items() if k.lower() not in _DROPPED_HEADERS}
    delivery, is_new = store_of(ledger).save_delivery(
        StoredDelivery(
            account_id=integration.account_id, id=new_id(), integration_id=integration.id,
            provider=integration.kind, topic=_storable(topic, _MAX_TOPIC),
            delivery_id=delivery_id, headers=kept, body=body, received_at=ledger.clock(),
            status="received", reason=None, attempts=0, processed_at=None,
        )
    )  # fmt: skip
    clash = None if is_new else _clash(delivery, _storable(topic, _MAX_TOPIC), body)
    if clash is not None:
        return Received(delivery, False, delivery.status, clash, is_clash=True)
    if delivery.status == "processed":
        return Received(delivery, is_new, "processed", None)
    if delivery.status == "deferred":
        return Received(delivery, is_new, "deferred", delivery.reason)
    status, reason = process(ledger, integration, delivery)
    return Received(delivery, is_new, status, reason)


def _clash(kept: StoredDelivery, topic: str | None, body: bytes) -> str | None:
    """Why a delivery under a kept delivery's id is not its retry, or None when it is. A
    provider's retry repeats its delivery byte for byte; another topic or body under the
    same id is a request made by hand reusing one (the README's Shopify example has an
    id): answered as the kept delivery, it recorded nothing and said only "duplicate"."""
    changed = [f"topic ({kept.topic or 'none'})"] if kept.topic != topic else []
    changed += ["body"] if kept.body != body else []
    if not changed:
        return None
    return (
        f"delivery id {kept.delivery_id} came before, as delivery {kept.id}, with another "
        f"{' and '.join(changed)}: this one was neither kept nor processed; give each "
        "delivery an id of its own"
    )


def process(
    ledger: Ledger, integration: Integration, delivery: StoredDelivery
) -> tuple[DeliveryStatus, str | None]:
    """Run the provider's processor on a kept delivery and record how it ended."""
    status: DeliveryStatus
    reason: str | None
    due_at: datetime | None = None
    try:
        _processor(delivery.provider)(ledger, integration, delivery)
    except DeliveryDeferred as exc:
        status, reason, due_at = "deferred", exc.message, exc.until
    except UnmappablePayload as exc:
        status, reason = "unmappable", f"{exc.reason}: {exc.message}"
    except (StoreUnavailable, StoreMisconfigured):
        # the database, for now or until its operator's fix (a privilege revoked, a file
        # not writable): the delivery stays `received` (a deferred one `deferred`), not
        # `failed`; the provider, answered 503, delivers it again, the worker's next pass
        # claims a deferred one again, and `sinal webhooks replay` stops saying why
        raise
    except Exception as exc:  # kept with its reason for replay; the provider still gets 200
        log.exception("processing delivery %s failed", delivery.id)
        status, reason = "failed", f"{type(exc).__name__}: {exc}"
    else:
        status, reason = "processed", None
    reason = _storable(reason, MAX_REASON)
    store_of(ledger).finish_delivery(delivery.account_id, delivery.id, status, reason, due_at)
    return status, reason


def deferral_grace(integration: Integration, setting: str) -> timedelta:
    """How long a delivery of `integration` may wait for a record that may still be coming:
    its `setting` (whole seconds, at most `MAX_GRACE_SECONDS`), else `DEFAULT_GRACE`."""
    seconds = integration.settings.get(setting)
    if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds >= 0:
        return timedelta(seconds=min(seconds, MAX_GRACE_SECONDS))
    return DEFAULT_GRACE


def may_defer_until(ledger: Ledger, delivery: StoredDelivery, grace: timedelta) -> datetime | None:
    """Until when this pass may defer `delivery` (its receipt plus `grace`), or None when the
    pass is final: a deferred delivery's next pass, or any pass once the grace is over."""
    until = delivery.received_at + grace
    return until if delivery.due_at is None and ledger.clock() < until else None


def _storable(text: str | None, limit: int) -> str | None:
    """`text` as both backends keep it alike: NUL (PostgreSQL's text refuses it) and lone
    surrogates (UTF-8 cannot encode them) escaped, cut to `limit` characters."""
    if text is None:
        return None
    kept = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return kept if len(kept) <= limit else kept[: limit - 1] + "…"


def process_deferred(
    ledger: Ledger, now: datetime | None = None, *, limit: int = 500, max_rounds: int = 20
) -> int:
    """Process the deferred deliveries due at `now` (default: the ledger's clock) once more,
    without waiting this time, `limit` claimed at a time until fewer than that are due (at
    most `max_rounds` claims: the rest waits for the next call); how many were processed.
    The worker's housekeeping task: statuses of messages other systems send all pass here
    (and refunds and shipments of orders placed before a store was connected), so one call
    must keep up with more than one page."""
    store = store_of(ledger)
    now = now or ledger.clock()
    integrations: dict[UUID, Integration | None] = {}
    processed = 0
    for _ in range(max_rounds):
        due = store.claim_deferred(now, limit, DEFERRED_LEASE)
        for delivery in due:
            if delivery.integration_id not in integrations:
                found = store.find_integration(delivery.integration_id)
                integrations[delivery.integration_id] = found
            integration = integrations[delivery.integration_id]
            if integration is None:  # kept as failed, for `sinal webhooks replay` to report
                reason = "integration_deleted: its integration was deleted while it waited"
                store.finish_delivery(delivery.account_id, delivery.id, "failed", reason)
            else:
                process(ledger, integration, delivery)
        processed += len(due)
        if len(due) < limit:
            break
    return processed


def replay(
    ledger: Ledger,
    statuses: tuple[DeliveryStatus, ...] = ("unmappable", "failed", "received"),
    account_id: UUID | None = None,
    progress: Callable[[int, int], None] | None = None,
    *,
    page_size: int = REPLAY_PAGE_SIZE,
) -> dict[str, int]:
    """Process kept deliveries again, oldest first, a page at a time; how many ended in
    each state. `progress(done, total)` after each (total grows if more arrive meanwhile)."""
    store = store_of(ledger)
    total = store.count_deliveries(statuses, account_id)
    outcome: dict[str, int] = {}
    integrations: dict[UUID, Integration | None] = {}
    done = 0
    after: DeliveryCursor | None = None
    while True:
        # keyset, not offset: a replayed delivery leaves (or keeps) its state, and pages
        # after it must neither skip nor repeat any
        page = store.list_deliveries(statuses, account_id, page_size, after)
        for delivery in page:
            if delivery.integration_id not in integrations:
                found = store.find_integration(delivery.integration_id)
                integrations[delivery.integration_id] = found
            integration = integrations[delivery.integration_id]
            if integration is None:
                status: str = "integration_deleted"
            else:
                status, _ = process(ledger, integration, delivery)
            outcome[status] = outcome.get(status, 0) + 1
            done += 1
            total = max(total, done)
            if progress is not None:
                progress(done, total)
        if len(page) < page_size:
            return outcome
        after = (page[-1].received_at, page[-1].id)


def _processor(provider: str) -> Processor:
    target = PROCESSORS.get(provider)
    if target is None:
        raise UnmappablePayload("unsupported_provider", f"no processor for {provider!r}")
    module, _, name = target.partition(":")
    found: Processor = getattr(importlib.import_module(module), name)
    return found
