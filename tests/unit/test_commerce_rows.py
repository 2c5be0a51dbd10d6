"""How webhooks change order and checkout rows (pure: `merge_order`, `merge_checkout`)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast
from uuid import UUID, uuid4

import pytest

from sinal.events import EmitEvent, PreparedEvent, prepare
from sinal.integrations.base import OrderRef, OrderStatus
from sinal.store.commerce import (
    STOPPED_BY_ORDER,
    STOPPED_BY_RECOVERY,
    Abandonment,
    Checkout,
    CheckoutUpdate,
    Order,
    OrderUpdate,
    checkout_events,
    lapsed_abandonment,
    merge_checkout,
    merge_order,
    overdue_abandonment,
    recovery_events,
)

ACCOUNT, INTEGRATION, CONTACT = uuid4(), uuid4(), uuid4()
T0 = datetime(2024, 5, 10, 17, 0, tzinfo=UTC)


def snapshot(status: OrderStatus, at: datetime, total: str = "297.90", **kw: Any) -> OrderRef:
    return OrderRef(
        provider="shopify", external_id="1001", number="#1042", status=status,
        provider_status=None, total=Decimal(total), currency="BRL", updated_at=at, **kw,
    )  # fmt: skip


def update(snap: OrderRef | None = None, **kw: Any) -> OrderUpdate:
    return OrderUpdate(ACCOUNT, INTEGRATION, "shopify", "1001", CONTACT, snapshot=snap, **kw)


def apply(current: Order | None, change: OrderUpdate, *, new: bool = True) -> Order:
    merged = merge_order(current, change, new_id=uuid4(), now=T0, refund_is_new=new)
    assert merged is not None
    return merged


def test_merge_order_status_only_moves_forward_whatever_the_arrival_order() -> None:
    cancelled = apply(None, update(snapshot("cancelled", T0 + timedelta(days=1), "0.00")))
    placed_late = apply(cancelled, update(snapshot("pending", T0)))
    assert placed_late.status == "cancelled"
    assert placed_late.total == Decimal("0.00")  # an older snapshot only fills gaps


def test_merge_order_newest_snapshot_wins_the_figures() -> None:
    placed = apply(None, update(snapshot("pending", T0, checkout_token="tok")))
    paid = apply(placed, update(snapshot("paid", T0 + timedelta(minutes=9), "280.00")))
    assert (paid.status, paid.total, paid.checkout_token) == ("paid", Decimal("280.00"), "tok")
    assert paid.id == placed.id


def test_merge_order_refunds_add_up_once_and_set_the_status() -> None:
    placed = apply(None, update(snapshot("paid", T0)))
    first = apply(placed, update(refund=Decimal("80.91")))
    redelivered = apply(first, update(refund=Decimal("80.91")), new=False)
    full = apply(redelivered, update(refund=Decimal("216.99")))
    assert (first.status, first.refunded) == ("partially_refunded", Decimal("80.91"))
    assert redelivered.refunded == Decimal("80.91")
    assert (full.status, full.refunded) == ("refunded", Decimal("297.90"))


def test_merge_order_without_a_snapshot_creates_no_row() -> None:
    change = update(refund=Decimal("10"))
    assert merge_order(None, change, new_id=uuid4(), now=T0, refund_is_new=True) is None


def checkout_update(at: datetime, contact: UUID | None = CONTACT, **kw: Any) -> CheckoutUpdate:
    return CheckoutUpdate(
        account_id=ACCOUNT, integration_id=INTEGRATION, provider="shopify", token="tok",
        contact_id=contact, recovery_url="https://loja/recover", total=Decimal("310.89"),
        currency="BRL", details={}, updated_at=at, abandon_after=timedelta(minutes=60), **kw,
    )  # fmt: skip


def test_merge_checkout_is_due_an_hour_after_its_last_update() -> None:
    created = merge_checkout(None, checkout_update(T0), now=T0, has_order=False)
    updated = merge_checkout(created, checkout_update(T0 + timedelta(minutes=4)), now=T0,
                             has_order=False)  # fmt: skip
    stale = merge_checkout(updated, checkout_update(T0), now=T0, has_order=False)
    assert created.due_at == T0 + timedelta(minutes=60)
    assert updated.due_at == stale.due_at == T0 + timedelta(minutes=64)


@pytest.mark.parametrize(
    ("contact", "has_order", "completed_at"),
    [(None, False, None), (CONTACT, True, None), (CONTACT, False, T0)],
    ids=["anonymous", "order_already_there", "completed"],
)
def test_merge_checkout_never_due_without_a_contact_or_once_completed(
    contact: UUID | None, has_order: bool, completed_at: datetime | None
) -> None:
    change = checkout_update(T0, contact, completed_at=completed_at)
    assert merge_checkout(None, change, now=T0, has_order=has_order).due_at is None


def test_merge_checkout_a_reminder_is_the_abandonment() -> None:
    reminder = checkout_update(T0, abandoned=True)
    merged = merge_checkout(None, reminder, now=T0, has_order=False)
    assert (merged.abandoned_at, merged.due_at) == (T0, None)


@pytest.mark.parametrize("order_first", ["in_the_same_transaction", "before"])
def test_merge_checkout_a_reminder_after_the_order_abandons_nothing(order_first: str) -> None:
    current = None
    if order_first == "before":  # the order completed the checkout row earlier
        current = merge_checkout(None, checkout_update(T0), now=T0, has_order=True)
    reminder = checkout_update(T0 + timedelta(minutes=30), abandoned=True)
    merged = merge_checkout(current, reminder, now=T0, has_order=current is None)
    abandonment = [cast(PreparedEvent, object())]
    assert (merged.completed_at, merged.abandoned_at, merged.due_at) == (T0, None, None)
    assert checkout_events(merged, reminder, abandonment) == ()


LATER = T0 + timedelta(days=1)


def recovery(token: str, at: datetime, received: datetime = LATER) -> PreparedEvent:
    emit = EmitEvent(
        account_id=ACCOUNT, contact_id=CONTACT, metric_name="Checkout Recovered",
        source="shopify", source_id=token, entity_type="checkout_recovered", occurred_at=at,
        properties={"checkout_token": token, "ordered_before_abandonment": False},
    )  # fmt: skip
    return prepare(emit, received)


def test_a_recovery_is_never_dated_before_its_abandonment() -> None:
    """An order placed before the abandonment (its webhook late) recovers at the abandonment,
    saying so; one at or after it keeps its time; a token whose abandonment is not found
    keeps the order's time. Every abandonment found is withdrawn, saying why."""
    abandoned = T0 + timedelta(minutes=30)
    marks = {t: Abandonment(uuid4(), abandoned) for t in ("early", "on-time", "late")}
    times = {"early": T0, "on-time": abandoned, "late": abandoned + timedelta(hours=1),
             "unknown": T0}  # fmt: skip
    recoveries = {token: recovery(token, at) for token, at in times.items()}

    recorded, withdrawn = recovery_events(list(times), recoveries, marks)

    said = {e.source_id: (e.occurred_at, e.properties["ordered_before_abandonment"])
            for e in recorded}  # fmt: skip
    assert said == {
        "early": (abandoned, True), "on-time": (abandoned, False),
        "late": (abandoned + timedelta(hours=1), False), "unknown": (T0, False),
    }  # fmt: skip
    # its customer bought: whichever came first, no abandoned-cart step runs any more
    assert withdrawn == [
        (marks["early"].event_id, STOPPED_BY_ORDER),
        (marks["on-time"].event_id, STOPPED_BY_RECOVERY),
        (marks["late"].event_id, STOPPED_BY_RECOVERY),
    ]


def abandonment(checkout: Checkout) -> PreparedEvent:
    """The Checkout Abandoned a housekeeping pass would build for `checkout`."""
    assert checkout.due_at is not None
    emit = EmitEvent(
        account_id=ACCOUNT, contact_id=CONTACT, metric_name="Checkout Abandoned",
        source="shopify", source_id=checkout.token, entity_type="checkout_abandoned",
        occurred_at=checkout.due_at,
        properties={"checkout_token": checkout.token, "recorded_after_order": False},
    )  # fmt: skip
    return prepare(emit, T0 + timedelta(days=1))


@pytest.mark.parametrize(
    ("placed", "received", "abandoned"),
    [
        (timedelta(minutes=59), timedelta(days=1), False),  # placed before it was due
        (timedelta(minutes=60), timedelta(days=1), True),  # due when it was placed
        (timedelta(hours=5), timedelta(hours=5), True),
        (timedelta(hours=5), timedelta(minutes=59), False),  # the store's clock runs fast
    ],
    ids=["placed-in-time", "placed-at-due", "placed-after", "placed-ahead-of-the-clock"],
)
def test_an_order_placed_after_its_checkout_was_due_abandons_it_first(
    placed: timedelta, received: timedelta, abandoned: bool
) -> None:
    """Counted by sinal's definition, not by when a worker looked: the abandonment is dated
    when the checkout became due and says it was recorded with its order."""
    checkout = merge_checkout(None, checkout_update(T0), now=T0, has_order=False)
    won = recovery("tok", T0 + placed, T0 + received)

    event = overdue_abandonment(checkout, won, abandonment)

    if not abandoned:
        assert event is None
        return
    assert event is not None
    assert event.occurred_at == T0 + timedelta(minutes=60)
    assert event.properties == {"checkout_token": "tok", "recorded_after_order": True}


def test_an_order_abandons_no_checkout_already_abandoned_or_none_can_say() -> None:
    due = merge_checkout(None, checkout_update(T0), now=T0, has_order=False)
    won = recovery("tok", T0 + timedelta(hours=5))
    recorded = replace(due, abandoned_at=T0 + timedelta(minutes=61))
    assert overdue_abandonment(recorded, won, abandonment) is None  # a pass recorded it
    assert overdue_abandonment(due, won, lambda checkout: None) is None  # no valid event
    assert overdue_abandonment(due, won, None) is None  # the caller builds none
    assert overdue_abandonment(due, None, abandonment) is None  # no recovery for its token


@pytest.mark.parametrize(
    ("came_back", "update", "has_order", "abandoned"),
    [
        (timedelta(minutes=59), {}, False, False),  # before it was due: rescheduled
        (timedelta(minutes=70), {}, False, True),
        (timedelta(minutes=70), {}, True, False),  # its order came first: it says
        (timedelta(minutes=70), {"completed_at": T0 + timedelta(minutes=70)}, False, False),
    ],
    ids=["in-time", "after-due", "order-known", "completed"],
)
def test_an_update_after_its_checkout_was_due_abandons_it_first(
    came_back: timedelta, update: dict[str, Any], has_order: bool, abandoned: bool
) -> None:
    checkout = merge_checkout(None, checkout_update(T0), now=T0, has_order=False)
    change = checkout_update(T0 + came_back, **update)

    found, event = lapsed_abandonment(checkout, change, abandonment, now=LATER, has_order=has_order)

    if not abandoned:
        assert (found, event) == (checkout, None)
        return
    assert event is not None
    assert event.occurred_at == T0 + timedelta(minutes=60)
    assert found == replace(checkout, abandoned_at=LATER)
    merged = merge_checkout(found, change, now=LATER, has_order=False)
    assert (merged.abandoned_at, merged.due_at) == (LATER, None)  # never due again
