"""SQLite side of `RetentionStore`: a batch is one write transaction (`BEGIN IMMEDIATE`:
writers wait for it, as for any other, and only for that batch)."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import datetime

from sinal.store.retention import LIVE_VERSION_INDEX, UNNEEDED_VERSION, Prunable, expired_rows

# SQLite's planner, without statistics, takes the executions' key over the partial index.
_UNNEEDED = UNNEEDED_VERSION.format(
    before="?", executions=f"executions x INDEXED BY {LIVE_VERSION_INDEX}"
)


class SQLiteRetention:
    """Mixin for `SQLiteStore`: the `RetentionStore` method."""

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def prune(self, kind: Prunable, before: datetime, limit: int) -> int:
        """One batch of deletes (see the module); an execution's steps go with it."""
        from sinal.store.sqlite import ts

        params = {"before": ts(before), "limit": limit}
        with self._write() as conn:
            found = expired_rows(kind, ":before", ":limit", indexed_by=True)
            keys = conn.execute(found, params).fetchall()
            if kind == "executions":
                conn.executemany(
                    "DELETE FROM execution_steps WHERE account_id = ? AND execution_id = ?", keys
                )
            conn.executemany(f"DELETE FROM {kind} WHERE account_id = ? AND id = ?", keys)
        return len(keys)

    def prune_versions(self, before: datetime, limit: int) -> int:
        """One batch of unneeded kept versions (see `RetentionStore`)."""
        from sinal.store.sqlite import ts

        with self._write() as conn:
            cur = conn.execute(
                "DELETE FROM automation_versions WHERE (account_id, id) IN (SELECT account_id, "
                f"id FROM automation_versions v WHERE {_UNNEEDED} "
                "LIMIT ?)",
                (ts(before), limit),
            )
            return cur.rowcount
