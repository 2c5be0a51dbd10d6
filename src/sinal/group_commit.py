"""Group commit: many concurrent single-event calls share one transaction.

Each caller's event is validated at once (bad input fails fast, alone), then waits in a
queue; the queue is flushed as one `record` call when it holds `max_batch` events or its
oldest event has waited `max_delay` seconds — if fewer than `max_inflight` transactions
are in flight. Otherwise it keeps filling, and the first transaction to finish takes it:
under load, batches grow instead of queueing up as many small transactions, each with
its own round trips, commit and NOTIFY. Every caller is answered only after the
transaction holding its event has committed, so an acknowledged event is durable.

A transaction that fails fails every caller in it when the database is away or busy
(`StoreUnavailable`: each may retry) or refuses sinal's own SQL (`SchemaViolation`: a
table dropped, say, fails any part alike, so it is not split), or its configuration
refuses sinal (`StoreMisconfigured`: a privilege its role lacks, alike; but for a trigger
someone added, which may fail for one row alone). An event whose data the
database refuses comes back rejected ("refused") from the store, which stores the others
of the transaction.
One that fails otherwise (another `StoreError`, rolled back whole) is tried again in
halves, down to the events it fails on: only their callers get the error, and the others
are stored as if those were not there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from sinal.errors import SchemaViolation, StoreError, StoreMisconfigured, StoreUnavailable
from sinal.events import EmitEvent, EmitResult, PreparedEvent, prepare
from sinal.ledger import MAX_BATCH, Ledger

# The longest an event may wait for company before its transaction starts, in seconds.
MAX_DELAY = 1.0


def _is_about_none(exc: StoreError) -> bool:
    """Whether a failed transaction's error is about none of its events: its parts would
    fail alike."""
    if isinstance(exc, StoreMisconfigured):
        return exc.code != "trigger_failed"  # a trigger may fail for one row alone
    return isinstance(exc, StoreUnavailable | SchemaViolation)


def check_limits(max_batch: int, max_inflight: int, max_delay: float) -> None:
    """`ValueError` unless one shared transaction may hold `max_batch` events, at least one
    may be in flight (with none, no caller would ever be answered), and an event waits for
    company at most a second."""
    if not 1 <= max_batch <= MAX_BATCH:
        raise ValueError(f"max_batch must be within 1..{MAX_BATCH}")
    if max_inflight < 1:
        raise ValueError("max_inflight must be at least 1")
    if not 0.0 <= max_delay <= MAX_DELAY:  # also refuses NaN
        raise ValueError(f"max_delay must be within 0..{MAX_DELAY:g} seconds")


@dataclass(slots=True)
class _Pending:
    events: list[PreparedEvent] = field(default_factory=list)
    futures: list[asyncio.Future[EmitResult]] = field(default_factory=list)


class GroupCommitter:
    """Batches concurrent `emit` calls on one event loop into shared transactions."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_batch: int = 500,
        max_delay: float = 0.002,
        max_inflight: int = 4,
    ) -> None:
        check_limits(max_batch, max_inflight, max_delay)
        self.ledger = ledger
        self.max_batch = max_batch
        self.max_delay = max_delay
        self._pending = _Pending()
        self.max_inflight = max_inflight
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the transactions in flight

    async def emit(self, event: EmitEvent) -> EmitResult:
        """Record one event; raises `InvalidEvent` at once for malformed input."""
        prepared = prepare(event, self.ledger.clock())
        future: asyncio.Future[EmitResult] = asyncio.get_running_loop().create_future()
        self._pending.events.append(prepared)
        self._pending.futures.append(future)
        if len(self._pending.events) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_delay, self._flush)
        return await future

    def _flush(self) -> None:
        """Start transactions for what waits, `max_batch` each, while slots are free; with
        none free, what waits goes with the next transaction to finish."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending.events and len(self._tasks) < self.max_inflight:
            waiting = self._pending
            batch = _Pending(waiting.events[: self.max_batch], waiting.futures[: self.max_batch])
            self._pending = _Pending(
                waiting.events[self.max_batch :], waiting.futures[self.max_batch :]
            )
            task = asyncio.get_running_loop().create_task(self._commit(batch))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._pending.events:
            self._flush()

    async def _commit(self, batch: _Pending) -> None:
        try:
            results = await asyncio.to_thread(self.ledger.record_prepared, batch.events)
        except StoreError as exc:
            # not about any one event: halves would fail alike, 2N-1 transactions for N
            if _is_about_none(exc) or len(batch.events) == 1:
                _fail(batch, exc)
            else:
                await self._isolate(batch)
            return
        except Exception as exc:  # every waiter must hear about the failure
            _fail(batch, exc)
            return
        for future, result in zip(batch.futures, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def _isolate(self, batch: _Pending) -> None:
        """Record a batch the database failed in halves, one after the other, down to the
        events it fails on: a statement failing for one event (a trigger's error; data the
        database refuses comes back "refused" from the store instead) fails that event's
        caller alone, not every caller who shared its transaction. The failed transaction
        was rolled back whole, so nothing is stored twice; the halves go in order, so a
        repeat still follows its first."""
        half = len(batch.events) // 2
        for part in (slice(None, half), slice(half, None)):
            await self._commit(_Pending(batch.events[part], batch.futures[part]))

    async def drain(self) -> None:
        """Flush what is queued and wait for every transaction in flight (at shutdown)."""
        self._flush()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._flush()


def _fail(batch: _Pending, exc: Exception) -> None:
    """Every caller still waiting in `batch` gets `exc`."""
    for future in batch.futures:
        if not future.done():
            future.set_exception(exc)
