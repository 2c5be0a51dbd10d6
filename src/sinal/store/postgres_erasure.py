"""PostgreSQL side of `ErasureStore`: `events` is locked against writers first (SHARE ROW
EXCLUSIVE, `LOCK_EVENTS`), then the contact's row (`FOR UPDATE`).

A transaction that records an event holds ROW EXCLUSIVE on `events` before it reads the
contact (plain reads: see `sinal.store.postgres`), so the table lock waits for every emit
that may have found the contact — they commit, and the erasure's statements (each with a
fresh snapshot) delete what they wrote — and an emit that comes during the erasure waits
for it, then finds no contact and is rejected `contact_not_found`, as for any unknown
contact. Every writer of events waits that long, whatever its account: the price of not
locking a contact's row for each event (an erasure is rare, an event is not). The lock is
self-exclusive, so two erasures take turns instead of deadlocking on each other's deletes.
Other writers naming the contact (tags, orders) lock it FOR KEY SHARE, which `FOR UPDATE`
excludes; one with a foreign key to it finds it gone (`ContactNotFound`). A checkout has
neither, and holds the buyer's identities: its write takes ROW EXCLUSIVE on `events` before
it reads the contact, as an emit does (`require_contact`), so that the erasure deletes what
it wrote, or it finds no contact. A commerce write that may wait for `events` or the
contact while it holds an order or checkout row (an order, a checkout naming its buyer,
an abandonment) takes that lock before any row, in the erasure's order: the row first, it
deadlocked with an erasure waiting for that row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow

from sinal.errors import ContactNotFound
from sinal.store.erasure import erase_in, erase_statements

T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]

LOCK_EVENTS = "LOCK TABLE events IN SHARE ROW EXCLUSIVE MODE"
# What every writer of events holds from its first insert; one that reads a contact before
# it inserts (a streamed batch, a checkout) takes it first. Not self-conflicting: writers
# wait only for an erasure.
WRITE_EVENTS = "LOCK TABLE events IN ROW EXCLUSIVE MODE"
_IS_CONTACT = "SELECT 1 FROM contacts WHERE account_id = %s AND id = %s"
_ERASE = erase_statements("%(account)s", "%(contact)s", " FOR UPDATE")


class PostgresErasure:
    """Mixin for `PostgresStore`: the `ErasureStore` method."""

    def _retrying(self, work: Callable[[Conn], T]) -> T:
        raise NotImplementedError

    def erase_contact(self, account_id: UUID, contact_id: UUID) -> bool:
        """The erasure's statements after the locks (see the module), again on a deadlock
        (with a worker recording steps of the contact's executions)."""
        params: dict[str, Any] = {"account": account_id, "contact": contact_id}

        def erase(conn: Conn) -> bool:
            conn.execute(LOCK_EVENTS)
            return erase_in(conn, _ERASE, params)

        return self._retrying(erase)


def require_contact(conn: Conn, account_id: UUID, contact_id: UUID) -> None:
    """In a writer's transaction, before it writes a row naming the contact: wait for an
    erasure running now (`WRITE_EVENTS`), then raise `ContactNotFound` if the contact is
    not in the account; one that starts later waits for this transaction."""
    conn.execute(WRITE_EVENTS)
    if conn.execute(_IS_CONTACT, (account_id, contact_id)).fetchone() is None:
        raise ContactNotFound(f"contact {contact_id} does not exist in account {account_id}")
