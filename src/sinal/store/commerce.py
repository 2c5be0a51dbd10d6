"""The storage interface of commerce rows beside the events: orders and checkouts.

Implemented by the backends' mixins (`postgres_commerce.py`, `sqlite_commerce.py`), each
method one transaction. How a webhook changes a row is decided here, once, by pure
functions both backends call (`merge_order`, `merge_checkout`):

- an order's status only moves forward (`merge_order_status`), so webhooks arriving out
  of order end in the right state; the rest of the row follows the newest snapshot (by
  the provider's `updated_at`);
- a refund adds to the refunded amount only when its event was new (a redelivery adds
  nothing);
- a checkout is due for abandonment at `due_at` unless an order completed it first or its
  integration was deleted (it then stops being due; the delete also stops the executions
  of the integration's Checkout Abandoned still to run: `STOPPED_BY_DISCONNECT`);
- a reminder (Yampi's cart.reminder) of a checkout an order completed first abandons
  nothing if the order was placed before the reminder's time (`checkout_events`), and
  records the abandonment, withdrawn from automations, and its recovery if it was placed
  after (`late_reminder`);
- an order carrying an abandoned checkout's token recovers it once, never before it was
  abandoned, and withdraws the abandonment from automations (`recovery_events`);
- an order placed after its checkout became due, whose webhook came before a pass recorded
  the abandonment, records it then, dated when it became due and withdrawn from automations
  (`overdue_abandonment`), and recovers it at the order's time; an update of a checkout
  that was due before it, not recorded yet, records it first (`lapsed_abandonment`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol
from uuid import UUID

from sinal.events import PreparedEvent, dumps_json
from sinal.integrations.base import OrderRef, merge_order_status
from sinal.integrations.checkouts import RECORDED_AFTER_ORDER, abandonment_id
from sinal.store.base import Outcome

__all__ = [
    "CHECKOUT_COLUMNS",
    "DISCONNECT_EXECUTIONS_SQL",
    "DISCONNECT_OUTBOX_SQL",
    "ORDER_COLUMNS",
    "STOPPED_BY_DISCONNECT",
    "STOPPED_BY_ORDER",
    "STOPPED_BY_RECOVERY",
    "Abandonment",
    "Checkout",
    "CheckoutUpdate",
    "CommerceStore",
    "LateReminder",
    "Order",
    "OrderSaved",
    "OrderUpdate",
    "abandonment_keys",
    "checkout_events",
    "connected_only",
    "is_due",
    "lapsed_abandonment",
    "late_reminder",
    "merge_checkout",
    "merge_order",
    "overdue_abandonment",
    "recovery_events",
]

# Column lists both backends select, in the order the records' fields take them.
ORDER_COLUMNS = (
    "account_id, id, provider, integration_id, external_id, number, status, provider_status, "
    "total, refunded, currency, checkout_token, cart_token, contact_id, source_updated_at, "
    "created_at, updated_at, placed_at"
)
CHECKOUT_COLUMNS = (
    "account_id, integration_id, token, provider, contact_id, recovery_url, total, currency, "
    "details, updated_at, due_at, completed_at, abandoned_at, recovered_at"
)
# The `last_error` of an execution of a Checkout Abandoned stopped because the checkout's
# order turned out to be placed before it counted as abandoned (`recovery_events`).
STOPPED_BY_ORDER = (
    "the checkout's order was placed before the checkout counted as abandoned (its webhook "
    "came after the abandonment was recorded): the checkout was never abandoned"
)
# The `last_error` of an execution of a Checkout Abandoned stopped because the checkout's
# order, placed after it counted as abandoned, recovered it (`recovery_events`).
STOPPED_BY_RECOVERY = (
    "the checkout was recovered: its order was placed after the checkout counted as "
    "abandoned, and a customer who bought gets no abandoned-cart message"
)
# The `last_error` of an execution of a Checkout Abandoned stopped because the checkout's
# integration was deleted (`DISCONNECT_EXECUTIONS_SQL`).
STOPPED_BY_DISCONNECT = (
    "the checkout's store was disconnected (its integration deleted): no order of it can "
    "reach sinal any more to stop an abandoned-cart message to a customer who bought"
)
# An integration deleted, in its delete's transaction: its Checkout Abandoned events run no
# more automation steps. Their outbox rows not fanned out yet go first (a worker fanning one
# out now is waited for, on PostgreSQL, and the executions it made stop next), then their
# executions still to run stop, as an order's recovery stops them: with no store left to
# send the order, nothing else would stop a "wait 1 h, then message" for a buyer. Scoped to
# the account's outbox and its executions still to run, each one's event looked up by its
# key (not every abandonment the integration ever recorded: the statuses repeat the partial
# index's predicate of 0028, so a planner may use it). `{p}`: the backend's placeholder;
# `{now}`: its current time; `{lock}`: PostgreSQL's `FOR UPDATE OF x`, so that the rows
# are taken in key order (account_id, id), as a worker's batch of step records takes them:
# a scan's order (by event, through `executions_event`) took two executions a worker held
# in the other order, and PostgreSQL aborted the worker's statement with a deadlock
# (`_STOP_EXECUTIONS` in `postgres_commerce` does the same for an order). SQLite has one
# writer at a time: no lock, no order needed.
DISCONNECT_OUTBOX_SQL = (
    "DELETE FROM outbox WHERE account_id = {p} AND metric_name = {p} AND EXISTS ("
    "SELECT 1 FROM events e WHERE e.account_id = outbox.account_id "
    "AND e.id = outbox.event_id AND e.integration_id = {p})"
)
DISCONNECT_EXECUTIONS_SQL = (
    "UPDATE executions SET status = 'stopped', last_error = {p}, updated_at = {now} "
    "FROM (SELECT x.account_id, x.id FROM executions x WHERE x.account_id = {p} "
    "AND x.status NOT IN ('completed', 'stopped') AND x.status IN ('pending', 'waiting') "
    "AND EXISTS (SELECT 1 FROM events e WHERE e.account_id = x.account_id "
    "AND e.id = x.event_id AND e.integration_id = {p} AND e.metric_name = {p}) "
    "ORDER BY x.id{lock}) d "
    "WHERE executions.account_id = d.account_id AND executions.id = d.id"
)


@dataclass(frozen=True, slots=True)
class Order:
    """An order as stored: one row per (account, integration, provider's order id)."""

    account_id: UUID
    id: UUID
    provider: str
    integration_id: UUID
    external_id: str
    number: str | None
    status: str
    provider_status: str | None
    total: Decimal | None  # what was ordered, before refunds
    refunded: Decimal  # the refunds recorded: "refunded" once they reach `total`
    currency: str | None
    checkout_token: str | None
    cart_token: str | None
    contact_id: UUID | None
    source_updated_at: datetime | None  # the provider's updated_at of the snapshot kept
    created_at: datetime
    updated_at: datetime
    placed_at: datetime | None  # the provider's created_at (None: no snapshot said it)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The checkout/cart tokens this order completed."""
        return tuple(t for t in (self.checkout_token, self.cart_token) if t)


@dataclass(frozen=True, slots=True)
class OrderUpdate:
    """What one webhook says about an order: a snapshot (order topics), a status it implies,
    a refund. Without a snapshot, an unknown order gets no row (the events still count)."""

    account_id: UUID
    integration_id: UUID
    provider: str
    external_id: str
    contact_id: UUID | None
    snapshot: OrderRef | None = None
    status: str | None = None
    refund: Decimal | None = None


@dataclass(frozen=True, slots=True)
class OrderSaved:
    """The order row after a webhook, and what became of its events."""

    order: Order | None
    outcomes: list[Outcome]
    recovered: list[Outcome] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Checkout:
    """A cart/checkout as stored, for abandonment and recovery."""

    account_id: UUID
    integration_id: UUID
    token: str
    provider: str
    contact_id: UUID | None
    recovery_url: str | None
    total: Decimal | None
    currency: str | None
    details: dict[str, Any]  # contact identities, checkout id, items, discount codes
    updated_at: datetime  # the provider's: abandonment counts from it
    due_at: datetime | None  # when it counts as abandoned; None: never
    completed_at: datetime | None
    abandoned_at: datetime | None
    recovered_at: datetime | None


@dataclass(frozen=True, slots=True)
class CheckoutUpdate:
    """A checkout snapshot from a webhook; `abandoned` when the webhook is the abandonment
    itself (Yampi's cart.reminder)."""

    account_id: UUID
    integration_id: UUID
    provider: str
    token: str
    contact_id: UUID | None
    recovery_url: str | None
    total: Decimal | None
    currency: str | None
    details: dict[str, Any]
    updated_at: datetime
    abandon_after: timedelta | None  # None: never derived (the provider says it)
    completed_at: datetime | None = None
    abandoned: bool = False


@dataclass(frozen=True, slots=True)
class Abandonment:
    """A checkout's Checkout Abandoned as stored: what its recovery is dated against."""

    event_id: UUID
    occurred_at: datetime


# None: no valid event can say this checkout is abandoned (the row stops being due).
BuildCheckoutEvent = Callable[[Checkout], PreparedEvent | None]
# The Checkout Recovered of a checkout by an order carrying its token (`late_reminder`);
# None: no valid event can say it.
BuildRecovery = Callable[[Checkout, Order], PreparedEvent | None]


@dataclass(frozen=True, slots=True)
class LateReminder:
    """What a reminder that came after its cart's order records (`late_reminder`): the
    checkout abandoned and recovered, its abandonment (withdrawn from automations), then
    its recovery."""

    checkout: Checkout
    abandoned: PreparedEvent
    recovered: PreparedEvent


class CommerceStore(Protocol):
    """What `sinal.commerce` needs: each method one transaction."""

    def find_order(self, account_id: UUID, integration_id: UUID, external_id: str) -> Order | None:
        """The integration's order with this provider id, or None."""
        ...

    def save_order(
        self,
        update: OrderUpdate,
        events: Sequence[PreparedEvent],
        recoveries: Mapping[str, PreparedEvent],
        abandon: BuildCheckoutEvent | None = None,
    ) -> OrderSaved:
        """Record `events` and upsert the order row (see `merge_order`) together (without
        its contact when the account no longer has it: erased since it was found); then, for
        each checkout the order completes that had been abandoned, record its recovery
        event from `recoveries` (keyed by token) once, as `recovery_events` dates it; its
        Checkout Abandoned leaves the outbox if still there, and its executions still
        pending or waiting stop (`STOPPED_BY_ORDER`, `STOPPED_BY_RECOVERY`). A checkout the
        order finds overdue (`overdue_abandonment`) is abandoned first, with `abandon`'s
        event, which leaves the outbox at once, then recovered."""
        ...

    def save_checkout(
        self,
        update: CheckoutUpdate,
        events: Sequence[PreparedEvent],
        abandon: BuildCheckoutEvent | None = None,
        recover: BuildRecovery | None = None,
    ) -> list[Outcome]:
        """Upsert the checkout row (see `merge_checkout`) and record `events`, together;
        `ContactNotFound`, nothing written, when the update names a contact the account no
        longer has (erased since it was found: the row would keep its identities). A
        checkout the update finds due before it (`lapsed_abandonment`) is abandoned first,
        with `abandon`'s event. A reminder that comes after an order of its cart placed
        after it (`late_reminder`) records its abandonment, which leaves the outbox at
        once, and the recovery `recover` builds. A write of a store deleted since the
        webhook's route read it abandons nothing (`connected_only`)."""
        ...

    def due_checkouts(self, now: datetime, limit: int = 500) -> list[Checkout]:
        """Checkouts of every account due for abandonment at `now`, the oldest due first."""
        ...

    def abandon_checkout(
        self,
        account_id: UUID,
        integration_id: UUID,
        token: str,
        now: datetime,
        build: BuildCheckoutEvent,
    ) -> Outcome | None:
        """Record `build(checkout)` and mark it abandoned, if it still is due and no order
        completed it (else mark it completed; and when its integration was deleted or
        `build` gives None, no longer due); None when nothing was recorded."""
        ...

    def get_checkout(self, account_id: UUID, integration_id: UUID, token: str) -> Checkout | None:
        """One checkout, or None."""
        ...


def merge_order(
    current: Order | None,
    update: OrderUpdate,
    *,
    new_id: UUID,
    now: datetime,
    refund_is_new: bool,
) -> Order | None:
    """The order row after `update` (None: no row, and none to create)."""
    snap = update.snapshot
    if current is None:
        if snap is None:
            return None
        current = Order(
            account_id=update.account_id, id=new_id, provider=update.provider,
            integration_id=update.integration_id, external_id=update.external_id,
            number=None, status=snap.status, provider_status=None, total=None,
            refunded=Decimal(0), currency=None, checkout_token=None, cart_token=None,
            contact_id=update.contact_id, source_updated_at=None, created_at=now,
            updated_at=now, placed_at=None,
        )  # fmt: skip
    merged = _with_snapshot(current, snap) if snap is not None else current
    status = merged.status
    for implied in (snap.status if snap else None, update.status):
        if implied is not None:
            status = merge_order_status(status, implied) or status
    refunded = merged.refunded
    if update.refund is not None and refund_is_new:
        refunded += update.refund
        full = merged.total is not None and refunded >= merged.total
        status = merge_order_status(status, "refunded" if full else "partially_refunded") or status
    return replace(
        merged,
        status=status,
        refunded=refunded,
        contact_id=merged.contact_id or update.contact_id,
        updated_at=now,
    )


def _with_snapshot(current: Order, snap: OrderRef) -> Order:
    """The newest snapshot wins what it says; an older one only fills gaps."""
    newer = (
        snap.updated_at is None
        or current.source_updated_at is None
        or snap.updated_at >= current.source_updated_at
    )

    def pick(mine: Any, theirs: Any) -> Any:
        if newer:
            return theirs if theirs is not None else mine
        return mine if mine is not None else theirs

    return replace(
        current,
        number=pick(current.number, snap.number),
        provider_status=pick(current.provider_status, snap.provider_status),
        total=pick(current.total, snap.total),
        currency=pick(current.currency, snap.currency),
        checkout_token=pick(current.checkout_token, snap.checkout_token),
        cart_token=pick(current.cart_token, snap.cart_token),
        source_updated_at=pick(current.source_updated_at, snap.updated_at),
        placed_at=current.placed_at or snap.placed_at,  # an order is placed once
    )


def merge_checkout(
    current: Checkout | None, update: CheckoutUpdate, *, now: datetime, has_order: bool
) -> Checkout:
    """The checkout row after `update`; `has_order`: an order already carries its token."""
    if current is None or update.updated_at >= current.updated_at:
        base = Checkout(
            account_id=update.account_id, integration_id=update.integration_id,
            token=update.token, provider=update.provider,
            contact_id=update.contact_id or (current.contact_id if current else None),
            recovery_url=update.recovery_url or (current.recovery_url if current else None),
            total=update.total, currency=update.currency, details=update.details,
            updated_at=update.updated_at, due_at=None,
            completed_at=current.completed_at if current else None,
            abandoned_at=current.abandoned_at if current else None,
            recovered_at=current.recovered_at if current else None,
        )  # fmt: skip
    else:  # an older snapshot arriving late: it only fills what is missing
        base = replace(current, contact_id=current.contact_id or update.contact_id)
    completed_at = base.completed_at or update.completed_at or (now if has_order else None)
    # a reminder after the order is no abandonment (it would only be "recovered" next)
    abandoned_at = base.abandoned_at or (now if update.abandoned and not completed_at else None)
    due_at = base.due_at
    if update.abandon_after is not None:
        due_at = base.updated_at + update.abandon_after
    if completed_at or abandoned_at or base.contact_id is None:
        due_at = None
    return replace(base, completed_at=completed_at, abandoned_at=abandoned_at, due_at=due_at)


def late_reminder(
    checkout: Checkout,
    update: CheckoutUpdate,
    events: Sequence[PreparedEvent],
    orders: Sequence[Order],
    recover: BuildRecovery | None,
    *,
    now: datetime,
) -> LateReminder | None:
    """What a reminder (`update.abandoned`, its Checkout Abandoned the one of `events`) of
    `checkout` (merged from it) records when `orders` carrying its token came first; None:
    nothing (`checkout_events`).

    Yampi reminds of a cart when it counts it abandoned (the reminder's time), and its
    webhooks come out of order (a retry, sinal down for a while): the order's may come
    first. Placed after the reminder's time, the order is a recovery proper: the cart was
    abandoned, as the reminder says, and recovered at the order's time, whichever webhook
    came first, as a Shopify checkout due before its order is (`overdue_abandonment`); its
    customer has bought, so the abandonment is withdrawn from automations and says
    ``recorded_after_order``. Placed at or before it (Yampi reminded of a cart already
    ordered), or when an order was placed is not known (an order kept before
    migration 0029 with no Order Placed), the cart was never abandoned: nothing."""
    if recover is None or not update.abandoned or checkout.abandoned_at is not None:
        return None
    placed = [order.placed_at for order in orders]
    if len(events) != 1 or not placed or None in placed:
        return None
    [reminder] = events
    first = min(orders, key=lambda order: order.placed_at or now)
    if first.placed_at is None or first.placed_at <= reminder.occurred_at:
        return None
    recovered = recover(checkout, first)
    if recovered is None:
        return None
    won_back = replace(checkout, abandoned_at=now, recovered_at=now)
    return LateReminder(won_back, _recorded_after_order(reminder), recovered)


def checkout_events(
    checkout: Checkout, update: CheckoutUpdate, events: Sequence[PreparedEvent]
) -> Sequence[PreparedEvent]:
    """The events to record with `checkout` (merged from `update`): none for a reminder that
    abandoned nothing, because an order had completed the checkout first."""
    return () if update.abandoned and checkout.abandoned_at is None else events


def connected_only(
    update: CheckoutUpdate,
    events: Sequence[PreparedEvent],
    abandon: BuildCheckoutEvent | None,
    is_live: Callable[[], bool],
) -> tuple[CheckoutUpdate, Sequence[PreparedEvent], BuildCheckoutEvent | None]:
    """`save_checkout`'s `update`, `events` and `abandon` as its transaction finds the
    checkout's store: one deleted since the webhook's route read it (`is_live`, asked in the
    transaction, and only of a write that would abandon the checkout) abandons nothing, as a
    pass finds it (`abandon_checkout`): a reminder records no abandonment (its one event),
    and a checkout found due no lapsed one (`lapsed_abandonment`). The delete withdrew the
    abandonments recorded before it; one recorded after it would run the cart automations
    of a store the user disconnected."""
    if update.abandoned and not is_live():
        return replace(update, abandoned=False), (), abandon
    if abandon is None:
        return update, events, None
    build = abandon
    return update, events, lambda checkout: build(checkout) if is_live() else None


def is_due(checkout: Checkout, now: datetime) -> bool:
    """Whether `checkout` counts as abandoned at `now` and no abandonment was recorded."""
    return (
        checkout.due_at is not None
        and checkout.due_at <= now
        and checkout.abandoned_at is None
        and checkout.completed_at is None
        and checkout.contact_id is not None
    )


def lapsed_abandonment(
    current: Checkout | None,
    update: CheckoutUpdate,
    abandon: BuildCheckoutEvent | None,
    *,
    now: datetime,
    has_order: bool,
) -> tuple[Checkout | None, PreparedEvent | None]:
    """`current` as `update` finds it, and the Checkout Abandoned to record first (None:
    none): its customer came back to the checkout (the update's time) after it became due,
    before a pass recorded the abandonment. By sinal's own definition it was abandoned
    then, as a pass would have recorded (its automations run as for one); rescheduled
    without it, an order placed before the new due time would leave it uncounted. Not for
    an update saying the checkout completed: its order says whether it was abandoned
    (`overdue_abandonment`)."""
    if abandon is None or current is None or has_order or update.completed_at is not None:
        return current, None
    if not is_due(current, min(update.updated_at, now)):
        return current, None
    event = abandon(current)
    return (current, None) if event is None else (replace(current, abandoned_at=now), event)


def overdue_abandonment(
    checkout: Checkout, recovery: PreparedEvent | None, abandon: BuildCheckoutEvent | None
) -> PreparedEvent | None:
    """The Checkout Abandoned to record for `checkout` as its order (`recovery`, the order's
    Checkout Recovered) completes it, or None: one due before the order was placed, that no
    housekeeping pass had recorded yet. By sinal's own definition the cart was abandoned
    (no order `abandon_after_minutes` after its last update), so counting it must not
    depend on how often the workers look; but its customer has bought, so no automation
    runs for it: the caller records it (dated when it became due, by `abandon`) and takes
    it out of the outbox, and it says ``recorded_after_order``."""
    if abandon is None or recovery is None:
        return None
    # placed after it was due, and not ahead of the clock (a store's clock running fast)
    if not is_due(checkout, min(recovery.occurred_at, recovery.received_at)):
        return None
    event = abandon(checkout)
    return None if event is None else _recorded_after_order(event)


def _recorded_after_order(event: PreparedEvent) -> PreparedEvent:
    """A Checkout Abandoned recorded once its order had come: no automation runs for it."""
    properties = {**event.properties, RECORDED_AFTER_ORDER: True}
    return event._replace(properties_json=dumps_json(properties))


def abandonment_keys(provider: str, tokens: Sequence[str]) -> dict[str, str]:
    """The unique_event_id of each token's Checkout Abandoned, to its token."""
    return {abandonment_id(provider, token): token for token in tokens}


def recovery_events(
    pending: Sequence[str],
    recoveries: Mapping[str, PreparedEvent],
    abandonments: Mapping[str, Abandonment],
) -> tuple[list[PreparedEvent], list[tuple[UUID, str]]]:
    """The Checkout Recovered to record for the `pending` tokens (abandoned, not recovered
    yet; each in `recoveries`, dated as its order), and the Checkout Abandoned
    (`abandonments`, by token) to withdraw from automations, each with why its executions
    stop (`STOPPED_BY_ORDER`, `STOPPED_BY_RECOVERY`).

    An order placed before its checkout counted as abandoned, whose webhook came after the
    abandonment was recorded, means the checkout was never abandoned. Events stay as they
    were recorded (corrections are new events): the recovery is dated at the abandonment,
    not before it, so no timeline or summary has the checkout recovered, then abandoned,
    and it says `ordered_before_abandonment`. An order placed after it recovers it at the
    order's time. Either way its customer has bought: the abandonment's automations that
    have not run yet do not (`CommerceStore.save_order`)."""
    recorded: list[PreparedEvent] = []
    withdrawn: list[tuple[UUID, str]] = []
    for token in pending:
        recovery = recoveries[token]
        abandoned = abandonments.get(token)
        if abandoned is not None and recovery.occurred_at < abandoned.occurred_at:
            properties = {**recovery.properties, "ordered_before_abandonment": True}
            recovery = recovery._replace(
                occurred_at=abandoned.occurred_at, properties_json=dumps_json(properties)
            )
            withdrawn.append((abandoned.event_id, STOPPED_BY_ORDER))
        elif abandoned is not None:
            withdrawn.append((abandoned.event_id, STOPPED_BY_RECOVERY))
        recorded.append(recovery)
    return recorded, withdrawn
