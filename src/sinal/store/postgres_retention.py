"""PostgreSQL side of `RetentionStore`: a batch is one statement, in a transaction of its
own, whose rows are locked `FOR UPDATE SKIP LOCKED`. Workers pruning at once take
different rows, and a row a writer holds (a rejection being replayed, a dead execution
being revived) is left for a later batch instead of being waited for.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

import psycopg
from psycopg.rows import TupleRow

from sinal.store.postgres_automations import _BY_KEY_SETTINGS, _by_key
from sinal.store.retention import PRUNABLE, UNNEEDED_VERSION, Prunable, expired_rows

# Steps go with their execution, in its statement: a writer of steps locks their execution
# first, and this one holds the execution (or skipped it), so no step is being written.
_STEPS = (
    ", steps AS (DELETE FROM execution_steps s USING d "
    "WHERE s.account_id = d.account_id AND s.execution_id = d.id)"
)
_PRUNE_SQL: dict[Prunable, str] = {
    kind: (
        f"WITH d AS ({expired_rows(kind, '%(before)s', '%(limit)s')} FOR UPDATE SKIP LOCKED)"
        f"{_STEPS if kind == 'executions' else ''} "
        f"DELETE FROM {kind} t USING d WHERE t.account_id = d.account_id AND t.id = d.id"
    )
    for kind in PRUNABLE
}

# Kept versions no execution needs; one another transaction holds (a rotation sealing it
# again) is left for a later pass.
_UNNEEDED = UNNEEDED_VERSION.format(before="%(before)s", executions="executions x")
_PRUNE_VERSIONS_SQL = (
    "DELETE FROM automation_versions t USING (SELECT account_id, id FROM automation_versions v "
    f"WHERE {_UNNEEDED} LIMIT %(limit)s "
    "FOR UPDATE SKIP LOCKED) d WHERE t.account_id = d.account_id AND t.id = d.id"
)

# Whatever the planner's statistics say (they may lag far behind a table that grew: see
# `_BY_KEY_SETTINGS`), a batch reads its index in order and stops at its LIMIT, then
# deletes by key: no scan of the table, nor a bitmap of every old row and a sort of them
# (the plan it took on a small table).
_BY_INDEX = "SELECT " + ", ".join(
    f"set_config('{s}', 'off', true)"
    for s in (*_BY_KEY_SETTINGS, "enable_bitmapscan", "enable_sort")
)


class PostgresRetention:
    """Mixin for `PostgresStore`: the `RetentionStore` method."""

    def _conn(self) -> AbstractContextManager[psycopg.Connection[TupleRow]]:
        raise NotImplementedError

    def prune(self, kind: Prunable, before: datetime, limit: int) -> int:
        """One batch of deletes (see the module), under `_BY_INDEX`."""
        params = {"before": before, "limit": limit}
        with self._conn() as conn:
            cur = _by_key(conn, _PRUNE_SQL[kind], params, _BY_INDEX)
        return cur.rowcount

    def prune_versions(self, before: datetime, limit: int) -> int:
        """One batch of unneeded kept versions (see `RetentionStore`)."""
        with self._conn() as conn:
            cur = conn.execute(_PRUNE_VERSIONS_SQL, {"before": before, "limit": limit})
        return cur.rowcount
