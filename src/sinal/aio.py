"""The ledger for asyncio code: `AsyncLedger`.

Its calls run in worker threads, so the event loop never waits on the database. Single
events go further: concurrent `emit` / `emit_event` calls on one event loop share
transactions (group commit, `sinal.group_commit`). There is no timer: the events of
callers that arrive in the same turn of the loop, or while earlier transactions are in
flight, go together, so a lone caller waits for nothing but its own transaction, and
many callers share commits instead of queueing up as many transactions.

Each caller still gets its own result, and only once the transaction holding its event
has committed. If that transaction fails (the database goes away), every caller in it
gets the error and none of its events is stored; each may retry, and a retried event
with a `source_id` is stored once. An event whose data the database refuses comes back
rejected ("refused") to its own caller alone, and one failing otherwise fails its caller
alone: the others are stored (`sinal.group_commit`).
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sinal.events import EmitEvent, EmitResult
from sinal.group_commit import GroupCommitter, check_limits
from sinal.ledger import Ledger
from sinal.store.base import Contact, SummaryRow


class AsyncLedger:
    """`Ledger` for asyncio code; concurrent single events share transactions.

    `max_batch` bounds the events of one shared transaction (1..1,000), `max_inflight`
    the transactions in flight at once per event loop: with all of them busy, arrivals
    wait, and the first transaction to finish takes them all. `max_delay` (seconds,
    default none) makes an event wait for company before its transaction starts: worth
    it only for callers that arrive one by one at a high rate, as HTTP requests do
    (`sinal serve` waits 2 ms); a caller awaiting one event at a time pays it on each.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_batch: int = 500,
        max_delay: float = 0.0,
        max_inflight: int = 4,
    ) -> None:
        check_limits(max_batch, max_inflight, max_delay)  # here, not when a loop first calls
        self.ledger = ledger
        self.max_batch = max_batch
        self.max_delay = max_delay
        self.max_inflight = max_inflight
        # A committer's queue and futures belong to one event loop: one per loop that
        # calls, forgotten with the loop.
        self._committers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommitter] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()  # loops in other threads may call at once

    def _committer(self) -> GroupCommitter:
        loop = asyncio.get_running_loop()
        with self._lock:
            committer = self._committers.get(loop)
            if committer is None:
                committer = self._committers[loop] = GroupCommitter(
                    self.ledger,
                    max_batch=self.max_batch,
                    max_delay=self.max_delay,
                    max_inflight=self.max_inflight,
                )
            return committer

    async def emit_event(self, **params: Any) -> EmitResult:
        """See `Ledger.emit_event`: `InvalidEvent` at once for malformed input; the
        result once the event's (maybe shared) transaction has committed."""
        return await self._committer().emit(EmitEvent(**params))

    async def emit(self, event: EmitEvent) -> EmitResult:
        """See `Ledger.emit` and `emit_event`."""
        return await self._committer().emit(event)

    async def emit_many(self, events: Sequence[EmitEvent]) -> list[EmitResult]:
        """See `Ledger.emit_many`: one transaction of its own."""
        return await asyncio.to_thread(self.ledger.emit_many, events)

    async def create_contact(self, account_id: UUID | str, **identities: str | None) -> Contact:
        """See `Ledger.create_contact`."""
        return await asyncio.to_thread(self.ledger.create_contact, account_id, **identities)

    async def get_summary(
        self, account_id: UUID | str, contact_id: UUID | str | None = None
    ) -> list[SummaryRow]:
        """See `Ledger.get_summary`."""
        return await asyncio.to_thread(self.ledger.get_summary, account_id, contact_id)

    async def drain(self) -> None:
        """Wait until every event this loop's callers handed over is committed (or failed):
        for shutdown, when callers may have been cancelled while their events were queued."""
        with self._lock:
            committer = self._committers.get(asyncio.get_running_loop())
        if committer is not None:
            await committer.drain()
