"""Data retention: the finished rows sinal deletes once they are older than the operator's
period for their kind, and nothing unless the operator asks (every period is 0, "for
ever", by default).

`SINAL_REJECTIONS_RETENTION_DAYS`, `SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS` and
`SINAL_EXECUTIONS_RETENTION_DAYS` set the periods; which rows each kind counts as
finished, and by which time, is `sinal.store.retention`'s to say. Every worker prunes in
its housekeeping, `PRUNE_BATCH` rows per short transaction and at most `PRUNE_ROUNDS`
transactions per kind and pass (the next pass goes on); `sinal prune` runs until nothing
is left. Events and summaries, the ledger, are never deleted.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sinal.ledger import Ledger
from sinal.store.retention import PRUNABLE, Prunable, RetentionStore

__all__ = [
    "MAX_DAYS",
    "PRUNE_BATCH",
    "PRUNE_ROUNDS",
    "VERSION_GRACE",
    "Retention",
    "prune",
    "prune_versions",
]

log = logging.getLogger("sinal.retention")

# The longest period a setting takes: a hundred years, far inside what a date can go back.
MAX_DAYS = 36_500
# Rows deleted per transaction: short enough that SQLite's writers hardly notice the wait.
PRUNE_BATCH = 500
# Transactions per kind in one housekeeping pass: 10,000 rows, every pass.
PRUNE_ROUNDS = 20
# How long a replaced version of an automation is kept, needed or not: a fan-out that read
# the automation before the change may commit its executions, made with that version,
# after it (PostgreSQL: its transaction took no lock on the automation).
VERSION_GRACE = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class Retention:
    """Days each kind of row is kept once finished; 0 keeps it for ever."""

    rejections: int = 0
    webhook_deliveries: int = 0
    executions: int = 0

    def cutoffs(self, now: datetime) -> dict[Prunable, datetime]:
        """For each kind with a period, the instant its rows must be older than to go."""
        periods = {kind: getattr(self, kind) for kind in PRUNABLE}
        return {kind: now - timedelta(days=days) for kind, days in periods.items() if days}


def prune(
    ledger: Ledger,
    retention: Retention,
    now: datetime | None = None,
    *,
    limit: int = PRUNE_BATCH,
    max_rounds: int | None = PRUNE_ROUNDS,
    progress: Callable[[Prunable, int], None] | None = None,
) -> dict[Prunable, int]:
    """Delete the finished rows `retention` lets go at `now` (default: the ledger's clock),
    `limit` per transaction until fewer than that are left, at most `max_rounds`
    transactions per kind (None: no bound); how many of each kind with a period (0 when
    none was old enough). `progress(kind, deleted so far)` after each transaction."""
    store = cast(RetentionStore, ledger.store)
    pruned: dict[Prunable, int] = {}
    for kind, before in retention.cutoffs(now or ledger.clock()).items():
        pruned[kind] = 0
        rounds: Iterable[int] = itertools.count() if max_rounds is None else range(max_rounds)
        for _ in rounds:
            deleted = store.prune(kind, before, limit)
            pruned[kind] += deleted
            if progress is not None:
                progress(kind, pruned[kind])
            if deleted < limit:
                break
    if any(pruned.values()):
        log.info("pruned %s", ", ".join(_said(kind, n, retention) for kind, n in pruned.items()))
    return pruned


def prune_versions(ledger: Ledger, now: datetime) -> int:
    """Housekeeping's task: delete the kept versions of automations (definitions their
    changes of steps replaced, `VERSION_GRACE` ago or more) that no execution which may
    still run was made with, up to `PRUNE_ROUNDS` batches; how many."""
    store = cast(RetentionStore, ledger.store)
    deleted = 0
    for _ in range(PRUNE_ROUNDS):
        n = store.prune_versions(now - VERSION_GRACE, PRUNE_BATCH)
        deleted += n
        if n < PRUNE_BATCH:
            break
    return deleted


def _said(kind: Prunable, n: int, retention: Retention) -> str:
    """'12 webhook deliveries older than 30 days', as the log says it."""
    return f"{n} {kind.replace('_', ' ')} older than {getattr(retention, kind)} days"
