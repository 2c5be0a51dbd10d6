"""Housekeeping: periodic tasks every worker runs beside dispatch.

Some work has no event to start it — Shopify sends no "checkout abandoned" webhook, so
something must notice the time passing. A worker (`sinal worker`, or the one inside
`sinal serve`) runs every task of `TASKS` once each `SINAL_HOUSEKEEPING_INTERVAL` seconds,
in order, with `now` from the ledger's clock (tests inject one).

A task is a callable `(ledger, now) -> object` or a "module:function" string naming one
(imported on first use: the registry costs nothing and makes no import cycles). A task

- runs in every worker, at once on PostgreSQL: it must be safe against itself (row locks,
  conditional updates, dedup keys);
- bounds its work per run (drain in batches, up to a cap): the next run comes anyway;
- may fail: the exception is logged and the task runs again next interval.

Adding a task is one line in `TASKS`. A task that needs settings is the worker's own: its
`Dispatcher.prune_expired` (`sinal.retention`) runs after these, with the worker's
retention periods.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Sequence
from datetime import datetime

from sinal.errors import StoreError
from sinal.ledger import Ledger

__all__ = ["TASKS", "Task", "resolve", "run_tasks", "task_name"]

log = logging.getLogger("sinal.housekeeping")

Task = Callable[[Ledger, datetime], object]

# The registry: read on every pass, so a task appended at import time is picked up.
TASKS: list[str | Task] = [
    "sinal.commerce:derive_all_abandoned",  # Shopify checkouts with no order in time
    "sinal.webhooks:process_deferred",  # statuses, refunds, shipments that came too early
    "sinal.retention:prune_versions",  # automations' replaced definitions no run needs
]


def resolve(task: str | Task) -> Task:
    """The callable a registry entry names."""
    if not isinstance(task, str):
        return task
    module, _, name = task.partition(":")
    found: Task = getattr(importlib.import_module(module), name)
    return found


def task_name(task: str | Task) -> str:
    """A registry entry as the log names it ("module:function")."""
    if isinstance(task, str):
        return task
    return f"{getattr(task, '__module__', '?')}:{getattr(task, '__qualname__', repr(task))}"


def run_tasks(
    ledger: Ledger,
    tasks: Sequence[str | Task] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run each task once (default: `TASKS`), logging any failure instead of raising; stop
    early when `stop` is set. How many tasks failed."""
    failed = 0
    for task in list(TASKS if tasks is None else tasks):
        if stop is not None and stop.is_set():
            break
        name = task_name(task)
        try:
            resolve(task)(ledger, ledger.clock())
        except StoreError as exc:  # the database is away: the next pass tries again
            log.warning("housekeeping %s: %s", name, exc)
            failed += 1
        except Exception:  # a bug in one task must not stop the others, nor the worker
            log.exception("housekeeping %s failed", name)
            failed += 1
    return failed
