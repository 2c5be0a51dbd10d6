"""The storage interface of data retention (implemented by the backends' mixins,
`sqlite_retention.py` and `postgres_retention.py`): deleting, a batch at a time, the rows
sinal keeps only for a while once nothing will process them again unasked.

- `rejections` (emits refused for their contact, kept for inspection and replay): by
  `created_at`, replayed or not.
- `webhook_deliveries` (raw provider bodies: personal data): by `received_at`, once
  processed, unmappable or failed. One `received` (kept, never finished) or `deferred`
  (due to be processed again) stays, however old.
- `executions`, each with its `execution_steps`: by `updated_at`, when it finished, once
  completed, stopped, dead or unknown. One pending or waiting (due, running, held by a
  paused automation, retrying) stays, with its steps.

An automation's kept versions (`automation_versions`: the definitions its changes of
steps replaced) go once no execution that may still run names one (`prune_versions`).

Events and summaries are the ledger: never deleted here (only with their contact, by
`sinal.store.erasure`). The outbox deletes its rows itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Protocol

Prunable = Literal["rejections", "webhook_deliveries", "executions"]
PRUNABLE: tuple[Prunable, ...] = ("rejections", "webhook_deliveries", "executions")

# The finished states, as the partial indexes of migration 0016 say them: a query uses
# such an index only when its condition names the index's.
FINISHED_DELIVERY = "status IN ('processed', 'unmappable', 'failed')"
FINISHED_EXECUTION = "status IN ('completed', 'stopped', 'unknown', 'dead')"

# A kept version of an automation is needed while an execution made with it may run: one
# pending or waiting, and one dead or unknown (`retry_dead` may revive it). Both backends'
# `prune_versions` delete those, replaced before `{before}`, that no such execution names,
# found through the partial index of migration 0028 (`{executions}`: SQLite's planner,
# without statistics, walked the account's executions by their key instead).
LIVE_VERSION_INDEX = "executions_live_version"
UNNEEDED_VERSION = (
    "v.created_at < {before} AND NOT EXISTS (SELECT 1 FROM {executions} "
    "WHERE x.account_id = v.account_id AND x.automation_id = v.automation_id "
    "AND x.automation_version = v.version AND x.status NOT IN ('completed', 'stopped'))"
)

# Per kind: its table, the index of migration 0016 its rows are found by, which of its
# rows are finished and past `{before}`, and the column their age is read from, the
# index's. An execution is found by created_at and goes by updated_at: it finished after
# it was created, so one that finished before an instant is among those created before it.
_EXPIRED: dict[Prunable, tuple[str, str, str, str]] = {
    "rejections": ("rejections", "rejections_created", "", "created_at"),
    "webhook_deliveries": (
        "webhook_deliveries",
        "webhook_deliveries_finished",
        f"{FINISHED_DELIVERY} AND ",
        "received_at",
    ),
    "executions": (
        "executions",
        "executions_finished",
        f"{FINISHED_EXECUTION} AND updated_at < {{before}} AND ",
        "created_at",
    ),
}


def expiry_index(kind: Prunable) -> str:
    """The index the rows of `kind` past their period are found by."""
    return _EXPIRED[kind][1]


def expired_rows(kind: Prunable, before: str, limit: str, *, indexed_by: bool = False) -> str:
    """A SELECT of the keys (account_id, id) of up to `limit` finished rows of `kind`
    older than `before` (the backend's placeholders), oldest first, read in the order of
    their index. `indexed_by`: say which (SQLite; without statistics its planner took an
    index of the status and sorted every finished row, each batch)."""
    table, index, finished, age = _EXPIRED[kind]
    hint = f" INDEXED BY {index}" if indexed_by else ""
    return (
        f"SELECT account_id, id FROM {table}{hint} "
        f"WHERE {finished.format(before=before)}{age} < {before} ORDER BY {age} LIMIT {limit}"
    )


class RetentionStore(Protocol):
    """What `sinal.retention` needs from a database."""

    def prune(self, kind: Prunable, before: datetime, limit: int) -> int:
        """Delete up to `limit` of the finished rows of `kind` older than `before`, oldest
        first (see the module), in one short transaction; how many (executions: without
        their steps, deleted with them). On PostgreSQL a row another transaction has
        locked is skipped, not waited for: callers at once delete different rows."""
        ...

    def prune_versions(self, before: datetime, limit: int) -> int:
        """Delete up to `limit` of the automations' kept versions replaced before `before`
        that no unfinished, dead or unknown execution names (`UNNEEDED_VERSION`), in one
        short transaction; how many."""
        ...
