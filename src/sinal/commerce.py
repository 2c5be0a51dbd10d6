"""Shopify and Yampi deliveries into events, order rows and checkouts; abandoned carts.

`process_shopify` / `process_yampi` are the processors `sinal.webhooks` runs on a kept raw
delivery. For each: normalize the verified body (pure, `sinal.integrations`), check its
events (one no validation accepts keeps the delivery ``unmappable: invalid_event`` before
anything is written), find or create the contact (a new one with its Contact Created,
source the integration's kind), then write the events together with the row they change:

| payload                         | one transaction                                       |
|---------------------------------|-------------------------------------------------------|
| orders/*, order.*               | events + order row (+ Checkout Recovered, see below)  |
| refunds/create, fulfillments/*  | events + the order's status / refunded amount         |
| checkouts/*, cart.reminder      | events + checkout row                                 |
| customers/create, ...           | events                                                |

Everything is idempotent: events dedup on their unique ids, and a row only changes as
`sinal.store.commerce.merge_order` / `merge_checkout` say (status never moves back). A
payload that verified but cannot be mapped raises `UnmappablePayload`; it is kept and
`sinal webhooks replay` processes it again. A Yampi body whose ``merchant.alias`` is not
the integration's ``alias`` (when both are there) is another store's: `merchant_mismatch`.

Refunds and shipments are about the order's buyer (a shipment's recipient may be someone
else) and move the order's row. One of an order sinal does not know yet waits for it:
webhooks come out of order by seconds, so its first pass within the integration's grace
(`order_grace`, 60 s unless ``order_grace_seconds`` says otherwise) raises
`DeliveryDeferred`, and `sinal.webhooks.process_deferred` processes it again when due. If
the order is still unknown then (a store connected after it was placed: its webhook never
comes), a shipment is recorded for the recipient its destination names, with no row to
move, and a refund, which names no one, is kept ``unmappable: unknown_order`` for replay.

Abandoned carts: Shopify sends none, so `derive_abandoned(ledger, now)` records Checkout
Abandoned for every checkout with no order `abandon_after_minutes` (per integration,
default 60) after its last update (one of a deleted integration stops being due instead);
every worker calls it through `derive_all_abandoned`, a `sinal.housekeeping` task, and
any number may at once (the store abandons each checkout once, under its row lock).
Yampi's `cart.reminder` is the abandonment itself; when an order carrying its token came
first, it is one only if the order was placed after the reminder's time: then recorded
withdrawn from automations and recovered by that order (`sinal.store.commerce.late_reminder`).
An order carrying an abandoned checkout's token records Checkout Recovered, with the
order's value, once, never dated before the abandonment: an order placed before it (its
webhook came after the abandonment was recorded) dates it at the abandonment and says
``ordered_before_abandonment``; either way the abandonment's automations that have not run
stop (`sinal.store.commerce.recovery_events`). An order placed after its checkout became due,
that comes before a pass recorded the abandonment, records it first, dated when it became
due and withdrawn from automations (`sinal.store.commerce.overdue_abandonment`), and a
checkouts/update whose customer came back after it was due records it first
(`lapsed_abandonment`): the count does not depend on how often the workers look, and a
customer who bought gets no cart message.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Final, cast
from uuid import UUID

from sinal.errors import (
    ContactNotFound,
    InvalidContact,
    InvalidEvent,
    StoreError,
    StoreUnavailable,
    UnstorableInput,
)
from sinal.events import PreparedEvent, decimal_text, fits_value, prepare
from sinal.integrations import _read as r
from sinal.integrations.base import (
    CheckoutRef,
    ContactRef,
    DeliveryDeferred,
    Mapped,
    Normalized,
    OrderRef,
    OrderStatus,
    Provider,
    UnmappablePayload,
)
from sinal.integrations.checkouts import (
    DEFAULT_ABANDON_DELAY,
    abandoned_checkout,
    order_recovery,
    recovered_checkout,
)
from sinal.integrations.shopify import normalize_shopify
from sinal.integrations.yampi import normalize_yampi
from sinal.ledger import Ledger
from sinal.store.automations import Integration
from sinal.store.commerce import (
    BuildCheckoutEvent,
    BuildRecovery,
    Checkout,
    CheckoutUpdate,
    CommerceStore,
    Order,
    OrderUpdate,
)
from sinal.store.webhooks import StoredDelivery
from sinal.webhooks import deferral_grace, may_defer_until

__all__ = ["derive_abandoned", "derive_all_abandoned", "process_shopify", "process_yampi"]

log = logging.getLogger("sinal.commerce")

# `Normalized.ignored` codes that mean "not yet mappable": kept as unmappable for replay
# once the mapping knows them (a new Yampi status alias), instead of processed-as-nothing.
_REPLAYABLE: Final = frozenset({"unknown_status_alias"})
# Validating an event looks the contact up nowhere: any id checks the rest of it.
_ANY_CONTACT: Final = UUID(int=0)
# Order status an event implies beyond its order snapshot (shipments carry none).
_IMPLIED_STATUS: Final = {"shipment_delivered": "delivered"}


def commerce_store(ledger: Ledger) -> CommerceStore:
    """The ledger's store, as a `CommerceStore`."""
    return cast(CommerceStore, ledger.store)


def process_shopify(ledger: Ledger, integration: Integration, delivery: StoredDelivery) -> None:
    """Turn a kept Shopify delivery (topic from X-Shopify-Topic) into events and rows;
    raises `DeliveryDeferred` when it waits for its order (see the module docstring)."""
    if not delivery.topic:
        raise UnmappablePayload("missing_topic", "the delivery has no X-Shopify-Topic header")
    normalized = normalize_shopify(delivery.topic, r.parse_body(delivery.body))
    wait = may_defer_until(ledger, delivery, order_grace(integration))
    _apply(ledger, integration, normalized, wait)


def process_yampi(ledger: Ledger, integration: Integration, delivery: StoredDelivery) -> None:
    """Turn a kept Yampi delivery (event name in the body) into events and rows."""
    payload = r.parse_body(delivery.body)
    _check_merchant(integration, payload)
    # every Yampi event carries its order's snapshot: none waits for the order
    _apply(ledger, integration, normalize_yampi(payload), None)


def _check_merchant(integration: Integration, payload: Mapping[str, Any]) -> None:
    """Refuse a body from another Yampi store: its signed ``merchant.alias`` is not the
    integration's `alias` setting (one secret shared by two stores' webhooks, or a store's
    webhook pointed at another integration's URL). No check when either is absent."""
    expected = r.text(integration.settings, "alias")
    named = r.text(payload, "merchant", "alias")
    if expected is not None and named is not None and named.casefold() != expected.casefold():
        raise UnmappablePayload(
            "merchant_mismatch",
            f"the body is from Yampi store {named!r}, this integration's alias is {expected!r}",
        )


def order_grace(integration: Integration) -> timedelta:
    """How long a refund or shipment of an order sinal does not know yet waits for that
    order's webhook before it is recorded without it."""
    return deferral_grace(integration, "order_grace_seconds")


def _apply(
    ledger: Ledger, integration: Integration, normalized: Normalized, wait: datetime | None
) -> None:
    """Record `normalized`; `wait`: until when it may wait for its order (None: it may not)."""
    if normalized.ignored in _REPLAYABLE:
        raise UnmappablePayload(normalized.ignored, "the payload is not mapped yet (replay later)")
    _check_totals(normalized)
    # an event no validation accepts is refused before its contact is found or created:
    # a delivery kept unmappable makes no contact (nor its Contact Created)
    for event in [*normalized.events, *_recoveries(normalized).values()]:
        _prepare(ledger, event, integration, _ANY_CONTACT)
    if normalized.checkout is not None:
        _save_checkout(ledger, integration, normalized.checkout, normalized.events)
        return
    order_id = normalized.order.external_id if normalized.order else None
    order_id = order_id or next((e.order_id for e in normalized.events if e.order_id), None)
    if order_id is not None:
        _save_order(ledger, integration, order_id, normalized, wait)
        return
    for event in normalized.events:
        contact_id = _contact_id(ledger, integration, event.contact)
        if contact_id is None:
            raise UnmappablePayload("no_contact", "the payload has no phone, email or customer id")
        ledger.record_prepared([_prepare(ledger, event, integration, contact_id)])


def _check_totals(normalized: Normalized) -> None:
    """Refuse a total the rows cannot keep alike on both backends: PostgreSQL's numeric(18,4)
    would round or overflow what SQLite keeps as sent (and an abandonment built from such a
    row would fail on every pass, the checkout due forever)."""
    for what, ref in (("order", normalized.order), ("checkout", normalized.checkout)):
        total = ref.total if ref is not None else None
        if total is not None and not fits_value(total):
            raise UnmappablePayload(
                "invalid_amount",
                f"the {what} total {total} is not below 10^14 with at most 4 decimal places",
            )


# -- orders ------------------------------------------------------------------------------


def _save_order(
    ledger: Ledger,
    integration: Integration,
    order_id: str,
    normalized: Normalized,
    wait: datetime | None,
) -> None:
    store = commerce_store(ledger)
    existing = store.find_order(integration.account_id, integration.id, order_id)
    events: list[PreparedEvent] = []
    recoveries: dict[str, PreparedEvent] = {}
    contact_id = existing.contact_id if existing else None
    if normalized.events:  # a status change with no event only moves the row
        contact_id = _order_contact(ledger, integration, normalized, existing, order_id, wait=wait)
        events = [_prepare(ledger, e, integration, contact_id) for e in normalized.events]
        for token, won in _recoveries(normalized).items():
            recoveries[token] = _prepare(ledger, won, integration, contact_id)
    implied = [_IMPLIED_STATUS[e.entity_type] for e in normalized.events
               if e.entity_type in _IMPLIED_STATUS]  # fmt: skip
    refunds = [e.value for e in normalized.events if e.entity_type == "refund" and e.value]
    update = OrderUpdate(
        account_id=integration.account_id,
        integration_id=integration.id,
        provider=integration.kind,
        external_id=order_id,
        contact_id=contact_id,
        snapshot=normalized.order,
        status=implied[0] if implied else None,
        refund=sum(refunds, Decimal(0)) if refunds else None,
    )
    store.save_order(update, events, recoveries, _abandonment_of(ledger))


def _recoveries(normalized: Normalized) -> dict[str, Mapped]:
    """Checkout Recovered, by checkout token, for each checkout an order event won."""
    order_events = [e for e in normalized.events if e.order is not None]
    if normalized.order is None or not order_events:
        return {}
    tokens = normalized.order.checkout_tokens
    return {token: recovered_checkout(order_events[0], token) for token in tokens}


def _order_contact(
    ledger: Ledger,
    integration: Integration,
    normalized: Normalized,
    existing: Order | None,
    order_id: str,
    *,
    wait: datetime | None,
) -> UUID:
    """Order events: the customer in the payload. Refunds and shipments: the order's buyer;
    of an order not known yet, they wait for it until `wait`, then (final pass) whoever the
    payload names (a shipment's recipient), else they are kept for replay."""
    about_order = normalized.order is not None
    buyer = existing.contact_id if existing is not None else None
    if not about_order and buyer is not None:
        return buyer
    if not about_order and wait is not None:
        raise DeliveryDeferred(wait, f"order {order_id} is not known yet: waiting for its webhook")
    for event in normalized.events:
        contact_id = _contact_id(ledger, integration, event.contact)
        if contact_id is not None:
            return contact_id
    if buyer is not None:
        return buyer
    raise UnmappablePayload(
        "unknown_order",
        f"order {order_id} is not known yet and the payload names no customer; "
        "replay once the order's webhook has arrived",
    )


# -- checkouts ---------------------------------------------------------------------------


def _save_checkout(
    ledger: Ledger, integration: Integration, checkout: CheckoutRef, events: Sequence[Mapped]
) -> None:
    is_reminder = checkout.provider == "yampi"  # cart.reminder: the abandonment itself
    if not is_reminder and not checkout.is_completed:
        _check_abandonment(ledger, integration, checkout)
    try:
        _store_checkout(ledger, integration, checkout, events, is_reminder=is_reminder)
    except ContactNotFound:  # erased since it was found: as after the erasure, a new contact
        _store_checkout(ledger, integration, checkout, events, is_reminder=is_reminder)


def _store_checkout(
    ledger: Ledger,
    integration: Integration,
    checkout: CheckoutRef,
    events: Sequence[Mapped],
    *,
    is_reminder: bool,
) -> None:
    """Find or create the checkout's contact, then write the row and its events; raises
    `ContactNotFound` when an erasure deleted that contact in between."""
    contact_id = _contact_id(ledger, integration, checkout.contact)
    prepared: list[PreparedEvent] = []
    if events:
        if contact_id is None:
            raise UnmappablePayload("no_contact", "the checkout has no phone, email or id")
        prepared = [_prepare(ledger, e, integration, contact_id) for e in events]
    update = CheckoutUpdate(
        account_id=integration.account_id,
        integration_id=integration.id,
        provider=checkout.provider,
        token=checkout.token,
        contact_id=contact_id,
        recovery_url=checkout.recovery_url,
        total=checkout.total,
        currency=checkout.currency,
        details=_checkout_details(checkout),
        updated_at=checkout.updated_at,
        abandon_after=None if is_reminder else abandon_delay(integration),
        completed_at=checkout.completed_at,
        abandoned=is_reminder,
    )
    # a pass abandons a Shopify checkout; so does its update, if it was due before it
    abandon = None if is_reminder else _abandonment_of(ledger)
    # a reminder coming after an order placed after it: the order recovers the cart
    recover = _recovery_of(ledger) if is_reminder else None
    commerce_store(ledger).save_checkout(update, prepared, abandon, recover)


def _check_abandonment(ledger: Ledger, integration: Integration, checkout: CheckoutRef) -> None:
    """Refuse a snapshot whose Checkout Abandoned no pass could record (an item or recovery
    URL holding a NUL, items past the properties' 64 kB, a last update before 2000): no
    event checks a checkouts/update, and its row would be refused by PostgreSQL (a NUL)
    and kept by SQLite, due for an abandonment that fails."""
    if checkout.contact.is_empty:  # the row's contact says who then (see `_abandonment`)
        checkout = replace(checkout, contact=ContactRef(external_id="sinal:contact:row"))
    event = abandoned_checkout(checkout, occurred_at=checkout.updated_at)
    _prepare(ledger, event, integration, _ANY_CONTACT)


def abandon_delay(integration: Integration) -> timedelta:
    """How long a checkout of this integration waits for its order before it is abandoned."""
    minutes = integration.settings.get("abandon_after_minutes")
    if isinstance(minutes, int) and not isinstance(minutes, bool) and minutes > 0:
        return timedelta(minutes=minutes)
    return DEFAULT_ABANDON_DELAY


def _checkout_details(checkout: CheckoutRef) -> dict[str, Any]:
    """What the Checkout Abandoned event needs later, beside the row's columns."""
    return {
        "contact": {k: v for k, v in checkout.contact.identities().items() if v},
        "checkout_id": checkout.external_id,
        "items": [dict(item) for item in checkout.items],
        "discount_codes": list(checkout.discount_codes),
    }


def derive_abandoned(ledger: Ledger, now: datetime | None = None, *, limit: int = 500) -> int:
    """Record Checkout Abandoned for up to `limit` checkouts due at `now` (default: the
    ledger's clock) that no order completed; how many were recorded. Call it periodically."""
    return _derive_pass(ledger, now or ledger.clock(), limit, set()).recorded


def derive_all_abandoned(
    ledger: Ledger, now: datetime | None = None, *, limit: int = 500, max_rounds: int = 20
) -> int:
    """`derive_abandoned` pass after pass until one finds fewer than `limit` due (the backlog
    is drained), at most `max_rounds` passes; how many were recorded in all. The worker's
    housekeeping task: whatever is left waits for its next run."""
    now = now or ledger.clock()
    recorded = 0
    failed: set[_Key] = set()  # this run's checkouts whose abandonment failed: not again
    for _ in range(max_rounds):
        done = _derive_pass(ledger, now, limit, failed)
        recorded += done.recorded
        # Not "recorded < limit": beside other workers a pass records only its share of what
        # it saw (and a checkout no event can say is dropped, not seen again).
        if done.seen < limit:
            break
    if recorded:
        log.info("recorded %d abandoned checkout(s)", recorded)
    return recorded


@dataclass(frozen=True, slots=True)
class _Pass:
    """One pass over the due checkouts: seen, recorded here."""

    seen: int
    recorded: int


def _abandonment_of(ledger: Ledger) -> BuildCheckoutEvent:
    """The build of a checkout's Checkout Abandoned, None for a row no valid event can say."""

    def build(checkout: Checkout) -> PreparedEvent | None:
        try:
            return _abandonment(ledger, checkout)
        except (InvalidEvent, UnmappablePayload) as exc:
            # A row no valid event can say (kept before a check refused such snapshots, or
            # data no check foresaw) would fail on every pass, and a page of them would hold
            # back every checkout due after them: it stops being due, once, said here. A
            # later snapshot of the checkout schedules it again.
            log.warning(
                "checkout %s of account %s can never be abandoned, no longer due: %s",
                checkout.token, checkout.account_id, exc,
            )  # fmt: skip
            return None

    return build


_Key = tuple[UUID, UUID, str]  # a checkout's: account, integration, token


def _derive_pass(ledger: Ledger, now: datetime, limit: int, failed: set[_Key]) -> _Pass:
    """Abandon up to `limit` due checkouts, oldest due first, but for those in `failed`
    (the run's earlier passes met them failing), to which it adds its own."""
    store = commerce_store(ledger)
    build = _abandonment_of(ledger)
    due = [
        c
        for c in store.due_checkouts(now, limit + len(failed))
        if (c.account_id, c.integration_id, c.token) not in failed
    ][:limit]
    recorded = 0
    for checkout in due:
        key = (checkout.account_id, checkout.integration_id, checkout.token)
        try:
            outcome = store.abandon_checkout(*key, now, build)
        except StoreUnavailable:  # the database is away or busy: the next run tries again
            raise
        except UnstorableInput:
            # The database refused its event's data (a constraint, a value, a text no
            # check foresaw): it would be refused on every pass. It stops being due, once,
            # said here, as a checkout no valid event can say.
            log.exception(
                "checkout %s of account %s: the database refused its abandonment, no longer due",
                checkout.token, checkout.account_id,
            )  # fmt: skip
            store.abandon_checkout(*key, now, _no_event)
            continue
        except StoreError:
            # Not its data: sinal's own statement, or a schema changed under it (a trigger
            # an operator added), which a fix or a migration mends. It stays due, not lost;
            # the run goes on past it (oldest due first, it would hold back the rest), and
            # the next run tries it again.
            log.exception(
                "checkout %s of account %s: its abandonment failed, tried again on the next run",
                checkout.token, checkout.account_id,
            )  # fmt: skip
            failed.add(key)
            continue
        if outcome is not None and outcome.kind == "created":
            recorded += 1
    return _Pass(len(due), recorded)


def _recovery_of(ledger: Ledger) -> BuildRecovery:
    """The build of the Checkout Recovered of a checkout by an order of its cart that came
    before its reminder (`sinal.store.commerce.late_reminder`), from the order's row, dated
    when the order was placed; None for one no valid event can say."""

    def build(checkout: Checkout, order: Order) -> PreparedEvent | None:
        contact_id = order.contact_id or checkout.contact_id
        if contact_id is None or order.placed_at is None:
            return None
        # as text, alike on both backends (PostgreSQL's numeric gives back 297.9000)
        total = None if order.total is None else Decimal(decimal_text(order.total))
        ref = OrderRef(
            provider=cast(Provider, order.provider), external_id=order.external_id,
            number=order.number, status=cast(OrderStatus, order.status),
            provider_status=order.provider_status, total=total, currency=order.currency,
            checkout_token=order.checkout_token, cart_token=order.cart_token,
            placed_at=order.placed_at,
        )  # fmt: skip
        contact = ContactRef(external_id=f"sinal:contact:{contact_id}")
        event = order_recovery(
            ref, checkout.token, contact=contact, occurred_at=order.placed_at,
            order_number=order.number,
        )  # fmt: skip
        emit = event.to_emit(
            account_id=order.account_id, contact_id=contact_id, integration_id=order.integration_id
        )
        try:
            return prepare(emit, ledger.clock())
        except InvalidEvent as exc:  # the reminder records nothing, as before
            log.warning("order %s cannot recover checkout %s: %s", order.id, checkout.token, exc)
            return None

    return build


def _no_event(checkout: Checkout) -> None:
    """The build of a checkout that stops being due without an event."""
    return None


def _abandonment(ledger: Ledger, checkout: Checkout) -> PreparedEvent:
    # both set: `abandon_checkout` only builds for a due checkout with a contact
    assert checkout.contact_id is not None
    assert checkout.due_at is not None
    details = checkout.details
    contact = ContactRef(**details.get("contact", {}))
    if contact.is_empty:  # a later anonymous snapshot: the row's contact still says who
        contact = ContactRef(external_id=f"sinal:contact:{checkout.contact_id}")
    ref = CheckoutRef(
        provider=cast(Provider, checkout.provider),
        token=checkout.token,
        contact=contact,
        recovery_url=checkout.recovery_url,
        total=checkout.total,
        currency=checkout.currency,
        updated_at=checkout.updated_at,
        external_id=details.get("checkout_id"),
        items=tuple(details.get("items", ())),
        discount_codes=tuple(details.get("discount_codes", ())),
    )
    event = abandoned_checkout(ref, occurred_at=checkout.due_at)
    emit = event.to_emit(
        account_id=checkout.account_id,
        contact_id=checkout.contact_id,
        integration_id=checkout.integration_id,
    )
    return prepare(emit, ledger.clock())


# -- shared ------------------------------------------------------------------------------


def _contact_id(ledger: Ledger, integration: Integration, contact: ContactRef) -> UUID | None:
    """Find or create the contact a payload names (phone, email, store customer id); a
    contact created here records Contact Created (source: the integration's kind) in the
    same transaction, as one first seen through any other source does; a contact found
    gains the name, phone, email or customer id it lacks (Contact Updated)."""
    if contact.is_empty:
        return None
    try:
        found, _ = ledger.resolve_contact(
            integration.account_id, **contact.identities(), source=integration.kind,
            fill_missing=True,
        )  # fmt: skip
    except InvalidContact as exc:
        raise UnmappablePayload("invalid_contact", str(exc)) from exc
    return found.id


def _prepare(
    ledger: Ledger, event: Mapped, integration: Integration, contact_id: UUID
) -> PreparedEvent:
    emit = event.to_emit(
        account_id=integration.account_id, contact_id=contact_id, integration_id=integration.id
    )
    try:
        return prepare(emit, ledger.clock())
    except InvalidEvent as exc:
        raise UnmappablePayload("invalid_event", str(exc)) from exc
