"""PostgreSQL side of `ErasureStore`: the contact's row is locked first (`FOR UPDATE`).

Every statement that records an event checks its contact `FOR KEY SHARE` (migration
0017, `_KNOWN`, `_MISSING_CONTACTS_SQL`), which that lock excludes: an emit that checked
the contact before the erasure commits first, and the erasure's later statements (each
with a fresh snapshot) delete what it wrote; one that comes during the erasure waits for
it, finds no contact and is rejected `contact_not_found`, as for any unknown contact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow

from sinal.store.erasure import erase_in, erase_statements

T = TypeVar("T")
Conn = psycopg.Connection[TupleRow]

_ERASE = erase_statements(
    "%(account)s", "%(contact)s", "payload ->> 'contact_id' = %(contact)s::text", " FOR UPDATE"
)


class PostgresErasure:
    """Mixin for `PostgresStore`: the `ErasureStore` method."""

    def _retrying(self, work: Callable[[Conn], T]) -> T:
        raise NotImplementedError

    def erase_contact(self, account_id: UUID, contact_id: UUID) -> bool:
        """The erasure's statements after the lock (see the module), again on a deadlock
        (with a worker recording steps of the contact's executions)."""
        params: dict[str, Any] = {"account": account_id, "contact": contact_id}
        return self._retrying(lambda conn: erase_in(conn, _ERASE, params))
