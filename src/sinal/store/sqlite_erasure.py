"""SQLite side of `ErasureStore`: one write transaction (`BEGIN IMMEDIATE`), so no emit for
the contact runs while it is erased; one after it finds no contact.

A writer that found the contact in an earlier transaction (a link, a WhatsApp user id or
status, a checkout: the contact is found, then the row written) checks it again in its
own (`require_contact`): an erasure may have committed in between."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

from sinal.errors import ContactNotFound
from sinal.store.erasure import erase_in, erase_statements

_ERASE = erase_statements(":account", ":contact")


class SQLiteErasure:
    """Mixin for `SQLiteStore`: the `ErasureStore` method."""

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def erase_contact(self, account_id: UUID, contact_id: UUID) -> bool:
        """The erasure's statements, under the write lock (see `sinal.store.erasure`)."""
        params: dict[str, Any] = {"account": str(account_id), "contact": str(contact_id)}
        with self._write() as conn:
            return erase_in(conn, _ERASE, params)


def require_contact(conn: sqlite3.Connection, account_id: UUID, contact_id: UUID) -> None:
    """In a write transaction, before it writes a row naming the contact: `ContactNotFound`
    if the account does not have it (any more)."""
    found = conn.execute(
        "SELECT 1 FROM contacts WHERE account_id = ? AND id = ?", (str(account_id), str(contact_id))
    ).fetchone()
    if found is None:
        raise ContactNotFound(f"contact {contact_id} does not exist in account {account_id}")
