"""PostgreSQL side of `CommerceStore`.

Each write takes `events`' writer lock (`WRITE_EVENTS`), then locks its row (`FOR UPDATE`;
a first insert races on the unique key and the loser retries), records its events with
the same statement as `record`, and writes the row as `merge_order` / `merge_checkout`
decide — all in one transaction, so an order row never says more than its events, nor
less. `events` comes first, as in an erasure (`postgres_erasure`), which locks it and
then the contact's rows: a write that held an order or checkout row of the contact while
it waited for `events` (or the contact) deadlocked with an erasure waiting for that row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from sinal.events import PreparedEvent
from sinal.ids import new_id
from sinal.store.base import Outcome
from sinal.store.commerce import (
    CHECKOUT_COLUMNS,
    ORDER_COLUMNS,
    Abandonment,
    BuildCheckoutEvent,
    BuildRecovery,
    Checkout,
    CheckoutUpdate,
    LateReminder,
    Order,
    OrderSaved,
    OrderUpdate,
    abandonment_keys,
    checkout_events,
    connected_only,
    is_due,
    lapsed_abandonment,
    late_reminder,
    merge_checkout,
    merge_order,
    overdue_abandonment,
    recovery_events,
)
from sinal.store.postgres_erasure import WRITE_EVENTS, require_contact

Conn = psycopg.Connection[TupleRow]
T = TypeVar("T")

_ORDER_KEY = "account_id = %s AND integration_id = %s AND external_id = %s"
_CHECKOUT_KEY = "account_id = %s AND integration_id = %s AND token = %s"
# Does an order of the integration carry this token (it completed the checkout)?
_HAS_ORDER = (
    "SELECT 1 FROM orders WHERE account_id = %s AND integration_id = %s "
    "AND (checkout_token = %s OR cart_token = %s) LIMIT 1"
)
# The orders of the integration carrying this token (they completed the checkout).
_ORDERS_OF = (
    f"SELECT {ORDER_COLUMNS} FROM orders WHERE account_id = %s AND integration_id = %s "
    "AND (checkout_token = %s OR cart_token = %s)"
)
# An order's contact, NULL when there is none: orders have no foreign key to contacts (an
# erasure detaches them), so an order written while its contact is erased would keep the
# erased id. FOR KEY SHARE waits for the erasure's lock, then finds no contact.
_KNOWN_CONTACT = "(SELECT id FROM contacts WHERE account_id = %s AND id = %s FOR KEY SHARE)"
# Is the checkout's integration still connected (not deleted)? FOR SHARE: a delete committing
# meanwhile is waited for (and seen), and a delete that comes after waits for this
# transaction, so it withdraws the abandonment recorded here (`delete_integration`).
_IS_LIVE = (
    "SELECT 1 FROM integrations WHERE account_id = %s AND id = %s AND deleted_at IS NULL FOR SHARE"
)
# A cart reminder (the abandonment itself) and the order carrying its token can race with
# neither row there to lock yet: both lock (account, integration, token) first, so the
# reminder sees the order, or the order the abandonment it then recovers. (A checkout that
# is only due needs no such lock: `abandon_checkout` looks for its order under the row lock.)
_LOCK_TOKENS = (
    "SELECT pg_advisory_xact_lock(hashtextextended(%s || t, 0)) FROM unnest(%s::text[]) AS t"
)

# A Checkout Abandoned its order withdraws (`recovery_events`) runs no more automation steps:
# its outbox row, not fanned out yet, goes (a worker fanning it out now is waited for, and
# the executions it made stop below), and its executions still to run stop as a deleted
# automation's do: a step running now is recorded, no other starts.
_WITHDRAW_OUTBOX = "DELETE FROM outbox WHERE account_id = %s AND event_id = ANY(%s)"
#
# One statement stops them all, taking their rows in key order (account_id, id), as a
# worker's batch of step records does (`postgres_automations`): a scan's order (the heap's,
# an index's by event) could take two executions a worker holds in the other order, each
# of the two then waiting for a row the other holds (a deadlock, reproduced with a
# worker's batch starting or finishing three executions, two of them the abandonment's:
# PostgreSQL aborted the worker's statement). One statement, not one per reason: two would
# take their rows in two passes, out of key order.
_STOP_EXECUTIONS = """
UPDATE executions e SET status = 'stopped', last_error = d.reason, updated_at = now()
FROM (SELECT x.account_id, x.id, w.reason FROM executions x
      JOIN unnest(%(events)s::uuid[], %(reasons)s::text[]) AS w(event_id, reason)
        ON x.event_id = w.event_id
      WHERE x.account_id = %(account)s AND x.status IN ('pending', 'waiting')
      ORDER BY x.id FOR UPDATE OF x) d
WHERE e.account_id = d.account_id AND e.id = d.id
"""


class PostgresCommerce:
    """Mixin for `PostgresStore`: the `CommerceStore` methods."""

    def _conn(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _retrying(self, work: Callable[[Conn], T]) -> T:
        raise NotImplementedError

    # -- orders --------------------------------------------------------------------------

    def find_order(self, account_id: UUID, integration_id: UUID, external_id: str) -> Order | None:
        """The integration's order with this provider id, or None."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {ORDER_COLUMNS} FROM orders WHERE {_ORDER_KEY}",
                (account_id, integration_id, external_id),
            ).fetchone()
        return None if row is None else Order(*row)

    def save_order(
        self,
        update: OrderUpdate,
        events: Sequence[PreparedEvent],
        recoveries: Mapping[str, PreparedEvent],
        abandon: BuildCheckoutEvent | None = None,
    ) -> OrderSaved:
        """Events, order row and recoveries in one transaction (see `CommerceStore`)."""
        from sinal.store.postgres import _record_in

        key = (update.account_id, update.integration_id, update.external_id)

        def work(conn: Conn) -> OrderSaved:
            conn.execute(WRITE_EVENTS)  # before the row: the erasure's order (see the module)
            found = conn.execute(
                f"SELECT {ORDER_COLUMNS} FROM orders WHERE {_ORDER_KEY} FOR UPDATE", key
            ).fetchone()
            current = None if found is None else Order(*found)
            outcomes = _record_in(conn, events) if events else []
            fresh = any(o.kind == "created" for o in outcomes)
            now = datetime.now(UTC)
            order = merge_order(current, update, new_id=new_id(), now=now, refund_is_new=fresh)
            if order is not None and order != current:
                _write_order(conn, order, is_new=current is None)
            recovered: list[Outcome] = []
            if order is not None and recoveries:
                recovered = _complete_checkouts(conn, order, recoveries, abandon, _record_in)
            return OrderSaved(order, outcomes, recovered)

        return self._retrying(work)

    # -- checkouts -----------------------------------------------------------------------

    def save_checkout(
        self,
        update: CheckoutUpdate,
        events: Sequence[PreparedEvent],
        abandon: BuildCheckoutEvent | None = None,
        recover: BuildRecovery | None = None,
    ) -> list[Outcome]:
        """Checkout row and its events in one transaction; `ContactNotFound` when the
        update's contact is not in the account (an erasure deleted it since it was found)."""
        from sinal.store.postgres import _record_in

        u = update
        key = (u.account_id, u.integration_id, u.token)

        def work(conn: Conn) -> list[Outcome]:
            if abandon is not None:  # may record an abandonment: `events` before the row
                conn.execute(WRITE_EVENTS)
            if u.contact_id is not None:  # erased meanwhile: nothing written, not its details
                require_contact(conn, u.account_id, u.contact_id)
            if u.abandoned:
                conn.execute(_LOCK_TOKENS, (_lock_prefix(*key[:2]), [u.token]))
            found = conn.execute(
                f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE {_CHECKOUT_KEY} FOR UPDATE", key
            ).fetchone()
            current = None if found is None else Checkout(*found)
            orders = [Order(*r) for r in conn.execute(_ORDERS_OF, (*key, u.token)).fetchall()]
            has_order = bool(orders)
            now = datetime.now(UTC)
            change, kept, build = connected_only(u, events, abandon, partial(_is_live, conn, key))
            before, late = lapsed_abandonment(current, change, build, now=now, has_order=has_order)
            if late is not None:
                _record_in(conn, [late])
            checkout = merge_checkout(before, change, now=now, has_order=has_order)
            reminded = late_reminder(checkout, change, kept, orders, recover, now=now)
            if reminded is not None:
                checkout = reminded.checkout
            if checkout != current:
                _write_checkout(conn, checkout, is_new=current is None)
            if reminded is not None:
                return _record_late_reminder(conn, reminded, _record_in)
            recorded = checkout_events(checkout, change, kept)
            return _record_in(conn, recorded) if recorded else []

        return self._retrying(work)

    def get_checkout(self, account_id: UUID, integration_id: UUID, token: str) -> Checkout | None:
        """One checkout, or None."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE {_CHECKOUT_KEY}",
                (account_id, integration_id, token),
            ).fetchone()
        return None if row is None else Checkout(*row)

    def due_checkouts(self, now: datetime, limit: int = 500) -> list[Checkout]:
        """Checkouts due for abandonment at `now`, oldest due first."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE due_at IS NOT NULL "
                "AND abandoned_at IS NULL AND completed_at IS NULL AND due_at <= %s "
                "ORDER BY due_at LIMIT %s",
                (now, limit),
            ).fetchall()
        return [Checkout(*r) for r in rows]

    def abandon_checkout(
        self,
        account_id: UUID,
        integration_id: UUID,
        token: str,
        now: datetime,
        build: BuildCheckoutEvent,
    ) -> Outcome | None:
        """Record the abandonment once, unless an order completed the checkout meanwhile."""
        from sinal.store.postgres import _record_in

        key = (account_id, integration_id, token)

        def work(conn: Conn) -> Outcome | None:
            conn.execute(WRITE_EVENTS)  # before the row: the erasure's order (see the module)
            found = conn.execute(
                f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE {_CHECKOUT_KEY} FOR UPDATE", key
            ).fetchone()
            checkout = None if found is None else Checkout(*found)
            if checkout is None or not is_due(checkout, now):
                return None
            if conn.execute(_HAS_ORDER, (*key, token)).fetchone() is not None:
                conn.execute(
                    f"UPDATE checkouts SET completed_at = %s, due_at = NULL WHERE {_CHECKOUT_KEY}",
                    (now, *key),
                )
                return None
            # A store the user disconnected abandons nothing: the checkout stops being due.
            is_live = _is_live(conn, key)
            event = build(checkout) if is_live else None
            if event is None:
                conn.execute(f"UPDATE checkouts SET due_at = NULL WHERE {_CHECKOUT_KEY}", key)
                return None
            [outcome] = _record_in(conn, [event])
            conn.execute(
                f"UPDATE checkouts SET abandoned_at = %s WHERE {_CHECKOUT_KEY}", (now, *key)
            )
            return outcome

        return self._retrying(work)


def _write_order(conn: Conn, order: Order, *, is_new: bool) -> None:
    o = order
    if is_new:
        conn.execute(
            f"INSERT INTO orders ({ORDER_COLUMNS}) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
            f"{_KNOWN_CONTACT}, %s, %s, %s, %s)",
            (o.account_id, o.id, o.provider, o.integration_id, o.external_id, o.number,
             o.status, o.provider_status, o.total, o.refunded, o.currency, o.checkout_token,
             o.cart_token, o.account_id, o.contact_id, o.source_updated_at, o.created_at,
             o.updated_at, o.placed_at),
        )  # fmt: skip
        return
    conn.execute(
        "UPDATE orders SET number = %s, status = %s, provider_status = %s, total = %s, "
        "refunded = %s, currency = %s, checkout_token = %s, cart_token = %s, "
        f"contact_id = {_KNOWN_CONTACT}, source_updated_at = %s, updated_at = %s, "
        "placed_at = %s WHERE account_id = %s AND id = %s",
        (o.number, o.status, o.provider_status, o.total, o.refunded, o.currency,
         o.checkout_token, o.cart_token, o.account_id, o.contact_id, o.source_updated_at,
         o.updated_at, o.placed_at, o.account_id, o.id),
    )  # fmt: skip


def _is_live(conn: Conn, key: tuple[UUID, UUID, str]) -> bool:
    """Whether the checkout's integration is connected, under `_IS_LIVE`'s FOR SHARE."""
    return conn.execute(_IS_LIVE, key[:2]).fetchone() is not None


def _write_checkout(conn: Conn, checkout: Checkout, *, is_new: bool) -> None:
    c = checkout
    values: tuple[Any, ...] = (
        c.provider, c.contact_id, c.recovery_url, c.total, c.currency, Jsonb(c.details),
        c.updated_at, c.due_at, c.completed_at, c.abandoned_at, c.recovered_at,
    )  # fmt: skip
    if is_new:
        conn.execute(
            f"INSERT INTO checkouts ({CHECKOUT_COLUMNS}) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (c.account_id, c.integration_id, c.token, *values),
        )
        return
    conn.execute(
        "UPDATE checkouts SET provider = %s, contact_id = %s, recovery_url = %s, total = %s, "
        "currency = %s, details = %s, updated_at = %s, due_at = %s, completed_at = %s, "
        f"abandoned_at = %s, recovered_at = %s WHERE {_CHECKOUT_KEY}",
        (*values, c.account_id, c.integration_id, c.token),
    )


def _complete_checkouts(
    conn: Conn,
    order: Order,
    recoveries: Mapping[str, PreparedEvent],
    abandon: BuildCheckoutEvent | None,
    record_in: Callable[[Conn, Sequence[PreparedEvent]], list[Outcome]],
) -> list[Outcome]:
    """Mark the checkouts the order carries completed, abandoning first those it finds
    overdue (`overdue_abandonment`); record the abandoned ones' recovery (`recovery_events`)."""
    tokens = sorted(set(order.tokens))  # one lock order for concurrent callers
    if not tokens:
        return []
    conn.execute(_LOCK_TOKENS, (_lock_prefix(order.account_id, order.integration_id), tokens))
    if abandon is not None:
        _abandon_overdue(conn, order, tokens, recoveries, abandon=abandon, record_in=record_in)
    rows = conn.execute(
        "UPDATE checkouts SET completed_at = coalesce(completed_at, now()), due_at = NULL "
        "WHERE account_id = %s AND integration_id = %s AND token = ANY(%s) "
        "RETURNING token, abandoned_at IS NOT NULL AND recovered_at IS NULL",
        (order.account_id, order.integration_id, tokens),
    ).fetchall()
    pending = sorted(token for token, is_pending in rows if is_pending and token in recoveries)
    if not pending:
        return []
    found = _abandonments(conn, order, pending)
    won_back, withdrawn = recovery_events(pending, recoveries, found)
    if withdrawn:
        conn.execute(_WITHDRAW_OUTBOX, (order.account_id, [ident for ident, _ in withdrawn]))
        conn.execute(_STOP_EXECUTIONS, {
            "account": order.account_id, "events": [ident for ident, _ in withdrawn],
            "reasons": [why for _, why in withdrawn],
        })  # fmt: skip
    outcomes = record_in(conn, won_back)
    conn.execute(
        "UPDATE checkouts SET recovered_at = now() WHERE account_id = %s AND integration_id = %s "
        "AND token = ANY(%s) AND abandoned_at IS NOT NULL AND recovered_at IS NULL",
        (order.account_id, order.integration_id, tokens),
    )
    return outcomes


def _abandon_overdue(
    conn: Conn,
    order: Order,
    tokens: Sequence[str],
    recoveries: Mapping[str, PreparedEvent],
    *,
    abandon: BuildCheckoutEvent,
    record_in: Callable[[Conn, Sequence[PreparedEvent]], list[Outcome]],
) -> None:
    """Record the Checkout Abandoned of the order's checkouts it finds overdue, withdrawn
    from automations at once, and mark them abandoned (`overdue_abandonment`)."""
    rows = conn.execute(
        f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE account_id = %s "
        "AND integration_id = %s AND token = ANY(%s) AND due_at IS NOT NULL "
        "AND abandoned_at IS NULL AND completed_at IS NULL ORDER BY token FOR UPDATE",
        (order.account_id, order.integration_id, list(tokens)),
    ).fetchall()
    late: dict[str, PreparedEvent] = {}
    for row in rows:
        checkout = Checkout(*row)
        event = overdue_abandonment(checkout, recoveries.get(checkout.token), abandon)
        if event is not None:
            late[checkout.token] = event
    if not late:
        return
    outcomes = record_in(conn, list(late.values()))
    made = [e.id for e, o in zip(late.values(), outcomes, strict=True) if o.kind == "created"]
    if made:
        conn.execute(_WITHDRAW_OUTBOX, (order.account_id, made))
    conn.execute(
        "UPDATE checkouts SET abandoned_at = now() WHERE account_id = %s "
        "AND integration_id = %s AND token = ANY(%s)",
        (order.account_id, order.integration_id, list(late)),
    )


def _record_late_reminder(
    conn: Conn,
    reminded: LateReminder,
    record_in: Callable[[Conn, Sequence[PreparedEvent]], list[Outcome]],
) -> list[Outcome]:
    """Record a late reminder's abandonment, withdrawn from automations (its customer has
    bought: nothing fanned it out yet, its row is new), then its recovery (`late_reminder`)."""
    [abandoned] = record_in(conn, [reminded.abandoned])
    if abandoned.kind == "created":
        conn.execute(_WITHDRAW_OUTBOX, (reminded.checkout.account_id, [reminded.abandoned.id]))
    return [abandoned, *record_in(conn, [reminded.recovered])]


def _abandonments(conn: Conn, order: Order, tokens: Sequence[str]) -> dict[str, Abandonment]:
    """The Checkout Abandoned of these tokens of the order's integration, by token."""
    keys = abandonment_keys(order.provider, tokens)
    rows = conn.execute(
        "SELECT unique_event_id, id, occurred_at FROM events "
        "WHERE account_id = %s AND unique_event_id = ANY(%s)",
        (order.account_id, list(keys)),
    ).fetchall()
    return {keys[key]: Abandonment(event_id, at) for key, event_id, at in rows}


def _lock_prefix(account_id: UUID, integration_id: UUID) -> str:
    """The text a checkout token is appended to for its `_LOCK_TOKENS` lock key."""
    return f"sinal:checkout:{account_id}:{integration_id}:"
