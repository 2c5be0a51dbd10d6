"""SQLite side of `CommerceStore` (`BEGIN IMMEDIATE` serializes writers: no races to lose)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any
from uuid import UUID

import orjson

from sinal.events import PreparedEvent, dumps_json
from sinal.ids import new_id
from sinal.store.base import Outcome
from sinal.store.commerce import (
    CHECKOUT_COLUMNS,
    ORDER_COLUMNS,
    STOPPED_BY_RECOVERY,
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
from sinal.store.sqlite_erasure import require_contact

_ORDER_KEY = "account_id = ? AND integration_id = ? AND external_id = ?"
_CHECKOUT_KEY = "account_id = ? AND integration_id = ? AND token = ?"
_HAS_ORDER = (
    "SELECT 1 FROM orders WHERE account_id = ? AND integration_id = ? "
    "AND (checkout_token = ? OR cart_token = ?) LIMIT 1"
)
# The orders of the integration carrying this token (they completed the checkout).
_ORDERS_OF = (
    f"SELECT {ORDER_COLUMNS} FROM orders WHERE account_id = ? AND integration_id = ? "
    "AND (checkout_token = ? OR cart_token = ?)"
)
# An order's contact, NULL when the account does not have it: orders have no foreign key to
# contacts, and one whose buyer was found before an erasure deleted it would keep its id.
_KNOWN_CONTACT = "(SELECT id FROM contacts WHERE account_id = ? AND id = ?)"
# Is the checkout's integration still connected (not deleted)?
_IS_LIVE = "SELECT 1 FROM integrations WHERE account_id = ? AND id = ? AND deleted_at IS NULL"


class SQLiteCommerce:
    """Mixin for `SQLiteStore`: the `CommerceStore` methods."""

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    # -- orders --------------------------------------------------------------------------

    def find_order(self, account_id: UUID, integration_id: UUID, external_id: str) -> Order | None:
        """The integration's order with this provider id, or None."""
        with self._read() as conn:
            return _find_order(conn, (str(account_id), str(integration_id), external_id))

    def save_order(
        self,
        update: OrderUpdate,
        events: Sequence[PreparedEvent],
        recoveries: Mapping[str, PreparedEvent],
        abandon: BuildCheckoutEvent | None = None,
    ) -> OrderSaved:
        """Events, order row and recoveries in one transaction (see `CommerceStore`)."""
        from sinal.store.sqlite import _record_in

        key = (str(update.account_id), str(update.integration_id), update.external_id)
        with self._write() as conn:
            current = _find_order(conn, key)
            outcomes = _record_in(conn, events) if events else []
            fresh = any(o.kind == "created" for o in outcomes)
            now = datetime.now(UTC)
            order = merge_order(current, update, new_id=new_id(), now=now, refund_is_new=fresh)
            if order is not None and order != current:
                _write_order(conn, order)
            recovered: list[Outcome] = []
            if order is not None and recoveries:
                completed = _complete_checkouts(conn, order, now, recoveries, abandon)
                tokens = [t for t in completed if t in recoveries]
                found = _abandonments(conn, order, tokens)
                won_back, withdrawn = recovery_events(tokens, recoveries, found)
                _withdraw(conn, order.account_id, withdrawn, now)
                recovered = _record_in(conn, won_back) if won_back else []
        return OrderSaved(order, outcomes, recovered)

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
        from sinal.store.sqlite import _record_in

        u = update
        key = (str(u.account_id), str(u.integration_id), u.token)
        with self._write() as conn:
            if u.contact_id is not None:  # erased meanwhile: nothing written, not its details
                require_contact(conn, u.account_id, u.contact_id)
            current = _find_checkout(conn, key)
            orders = [_order(r) for r in conn.execute(_ORDERS_OF, (*key, u.token)).fetchall()]
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
                _write_checkout(conn, checkout)
            if reminded is not None:
                return _record_late_reminder(conn, reminded, now)
            recorded = checkout_events(checkout, change, kept)
            return _record_in(conn, recorded) if recorded else []

    def get_checkout(self, account_id: UUID, integration_id: UUID, token: str) -> Checkout | None:
        """One checkout, or None."""
        with self._read() as conn:
            return _find_checkout(conn, (str(account_id), str(integration_id), token))

    def due_checkouts(self, now: datetime, limit: int = 500) -> list[Checkout]:
        """Checkouts due for abandonment at `now`, oldest due first."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE due_at IS NOT NULL "
                "AND abandoned_at IS NULL AND completed_at IS NULL AND due_at <= ? "
                "ORDER BY due_at LIMIT ?",
                (_ts(now), limit),
            ).fetchall()
        return [_checkout(r) for r in rows]

    def abandon_checkout(
        self,
        account_id: UUID,
        integration_id: UUID,
        token: str,
        now: datetime,
        build: BuildCheckoutEvent,
    ) -> Outcome | None:
        """Record the abandonment once, unless an order completed the checkout meanwhile."""
        from sinal.store.sqlite import _record_in

        key = (str(account_id), str(integration_id), token)
        with self._write() as conn:
            checkout = _find_checkout(conn, key)
            if checkout is None or not is_due(checkout, now):
                return None
            if conn.execute(_HAS_ORDER, (*key, token)).fetchone() is not None:
                conn.execute(
                    f"UPDATE checkouts SET completed_at = ?, due_at = NULL WHERE {_CHECKOUT_KEY}",
                    (_ts(now), *key),
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
                f"UPDATE checkouts SET abandoned_at = ? WHERE {_CHECKOUT_KEY}", (_ts(now), *key)
            )
            return outcome


def _find_order(conn: sqlite3.Connection, key: tuple[str, str, str]) -> Order | None:
    row = conn.execute(f"SELECT {ORDER_COLUMNS} FROM orders WHERE {_ORDER_KEY}", key).fetchone()
    return None if row is None else _order(row)


def _is_live(conn: sqlite3.Connection, key: tuple[str, str, str]) -> bool:
    """Whether the checkout's integration is connected (read in the write's transaction:
    SQLite's one writer at a time, a delete committed before it is seen)."""
    return conn.execute(_IS_LIVE, key[:2]).fetchone() is not None


def _find_checkout(conn: sqlite3.Connection, key: tuple[str, str, str]) -> Checkout | None:
    row = conn.execute(
        f"SELECT {CHECKOUT_COLUMNS} FROM checkouts WHERE {_CHECKOUT_KEY}", key
    ).fetchone()
    return None if row is None else _checkout(row)


def _write_order(conn: sqlite3.Connection, order: Order) -> None:
    o = order
    conn.execute(
        f"INSERT INTO orders ({ORDER_COLUMNS}) VALUES "
        f"(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {_KNOWN_CONTACT}, ?, ?, ?, ?) "
        "ON CONFLICT (account_id, id) DO UPDATE SET number = excluded.number, "
        "status = excluded.status, provider_status = excluded.provider_status, "
        "total = excluded.total, refunded = excluded.refunded, currency = excluded.currency, "
        "checkout_token = excluded.checkout_token, cart_token = excluded.cart_token, "
        "contact_id = excluded.contact_id, source_updated_at = excluded.source_updated_at, "
        "updated_at = excluded.updated_at, placed_at = excluded.placed_at",
        (str(o.account_id), str(o.id), o.provider, str(o.integration_id), o.external_id,
         o.number, o.status, o.provider_status, _text(o.total), str(o.refunded), o.currency,
         o.checkout_token, o.cart_token, str(o.account_id), _text(o.contact_id),
         _opt_ts(o.source_updated_at),
         _ts(o.created_at), _ts(o.updated_at), _opt_ts(o.placed_at)),
    )  # fmt: skip


def _write_checkout(conn: sqlite3.Connection, checkout: Checkout) -> None:
    c = checkout
    conn.execute(
        f"INSERT INTO checkouts ({CHECKOUT_COLUMNS}) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (account_id, integration_id, token) DO UPDATE SET "
        "provider = excluded.provider, contact_id = excluded.contact_id, "
        "recovery_url = excluded.recovery_url, total = excluded.total, "
        "currency = excluded.currency, details = excluded.details, "
        "updated_at = excluded.updated_at, due_at = excluded.due_at, "
        "completed_at = excluded.completed_at, abandoned_at = excluded.abandoned_at, "
        "recovered_at = excluded.recovered_at",
        (str(c.account_id), str(c.integration_id), c.token, c.provider, _text(c.contact_id),
         c.recovery_url, _text(c.total), c.currency, dumps_json(c.details), _ts(c.updated_at),
         _opt_ts(c.due_at), _opt_ts(c.completed_at), _opt_ts(c.abandoned_at),
         _opt_ts(c.recovered_at)),
    )  # fmt: skip


def _complete_checkouts(
    conn: sqlite3.Connection,
    order: Order,
    now: datetime,
    recoveries: Mapping[str, PreparedEvent],
    abandon: BuildCheckoutEvent | None,
) -> list[str]:
    """Mark the checkouts the order carries completed, abandoning first one it finds overdue
    (`overdue_abandonment`); the tokens of those won back from abandonment (now marked
    recovered)."""
    from sinal.store.sqlite import _record_in

    won_back: list[str] = []
    for token in sorted(set(order.tokens)):
        key = (str(order.account_id), str(order.integration_id), token)
        checkout = _find_checkout(conn, key)
        if checkout is None:
            continue
        late = overdue_abandonment(checkout, recoveries.get(token), abandon)
        if late is not None:
            [outcome] = _record_in(conn, [late])
            if outcome.kind == "created":
                _withdraw(conn, order.account_id, [(late.id, STOPPED_BY_RECOVERY)], now)
            checkout = replace(checkout, abandoned_at=now)
        pending = checkout.abandoned_at is not None and checkout.recovered_at is None
        conn.execute(
            "UPDATE checkouts SET completed_at = coalesce(completed_at, ?), due_at = NULL, "
            "abandoned_at = coalesce(abandoned_at, ?), "
            f"recovered_at = CASE WHEN ? THEN ? ELSE recovered_at END WHERE {_CHECKOUT_KEY}",
            (_ts(now), _opt_ts(checkout.abandoned_at), pending, _ts(now), *key),
        )
        if pending:
            won_back.append(token)
    return won_back


def _record_late_reminder(
    conn: sqlite3.Connection, reminded: LateReminder, now: datetime
) -> list[Outcome]:
    """Record a late reminder's abandonment, withdrawn from automations (its customer has
    bought), then its recovery (`late_reminder`)."""
    from sinal.store.sqlite import _record_in

    [abandoned] = _record_in(conn, [reminded.abandoned])
    if abandoned.kind == "created":
        withdrawn = [(reminded.abandoned.id, STOPPED_BY_RECOVERY)]
        _withdraw(conn, reminded.checkout.account_id, withdrawn, now)
    return [abandoned, *_record_in(conn, [reminded.recovered])]


def _abandonments(
    conn: sqlite3.Connection, order: Order, tokens: Sequence[str]
) -> dict[str, Abandonment]:
    """The Checkout Abandoned of these tokens of the order's integration, by token."""
    keys = abandonment_keys(order.provider, tokens)
    if not keys:
        return {}
    rows = conn.execute(
        "SELECT unique_event_id, id, occurred_at FROM events WHERE account_id = ? "
        f"AND unique_event_id IN ({', '.join('?' * len(keys))})",
        (str(order.account_id), *keys),
    ).fetchall()
    return {keys[key]: Abandonment(UUID(ident), _parse(at)) for key, ident, at in rows}


def _withdraw(
    conn: sqlite3.Connection,
    account_id: UUID,
    withdrawn: Sequence[tuple[UUID, str]],
    now: datetime,
) -> None:
    """A Checkout Abandoned its order withdraws (`recovery_events`) runs no more automation
    steps: its outbox row, not fanned out yet, goes, and its executions still to run stop as
    a deleted automation's do, with the reason given."""
    for event_id, reason in withdrawn:
        key = (str(account_id), str(event_id))
        conn.execute("DELETE FROM outbox WHERE account_id = ? AND event_id = ?", key)
        conn.execute(
            "UPDATE executions SET status = 'stopped', last_error = ?, updated_at = ? "
            "WHERE account_id = ? AND event_id = ? AND status IN ('pending', 'waiting')",
            (reason, _ts(now), *key),
        )


def _order(r: Sequence[Any]) -> Order:
    return Order(
        UUID(r[0]), UUID(r[1]), r[2], UUID(r[3]), r[4], r[5], r[6], r[7], _decimal(r[8]),
        Decimal(r[9]), r[10], r[11], r[12], _uuid(r[13]), _opt_parse(r[14]), _parse(r[15]),
        _parse(r[16]), _opt_parse(r[17]),
    )  # fmt: skip


def _checkout(r: Sequence[Any]) -> Checkout:
    return Checkout(
        UUID(r[0]), UUID(r[1]), r[2], r[3], _uuid(r[4]), r[5], _decimal(r[6]), r[7],
        orjson.loads(r[8]), _parse(r[9]), _opt_parse(r[10]), _opt_parse(r[11]),
        _opt_parse(r[12]), _opt_parse(r[13]),
    )  # fmt: skip


def _ts(when: datetime) -> str:
    from sinal.store.sqlite import ts

    return ts(when)


def _opt_ts(when: datetime | None) -> str | None:
    return None if when is None else _ts(when)


def _parse(text: str) -> datetime:
    from sinal.store.sqlite import parse_ts

    return parse_ts(text)


def _opt_parse(text: str | None) -> datetime | None:
    return None if text is None else _parse(text)


def _text(value: object | None) -> str | None:
    return None if value is None else str(value)


def _uuid(text: str | None) -> UUID | None:
    return None if text is None else UUID(text)


def _decimal(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)
