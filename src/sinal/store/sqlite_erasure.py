"""SQLite side of `ErasureStore`: one write transaction (`BEGIN IMMEDIATE`), so no emit for
the contact runs while it is erased; one after it finds no contact."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

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
