"""The dispatcher: outbox → executions → steps, effectively once.

Dispatch is at least once (the outbox row is deleted in the transaction that creates the
executions); an automation runs at most once per event (the executions' unique key); a
step's side effect happens at most once (its record is committed as `started` before the
side effect, `completed` after; a `started` external send found on resume is `unknown`,
so the worker that ran a step tries again, for up to a lease, to record its outcome while
the database is unavailable, and for as long as it runs while the database refuses it for
its operator's configuration, `StoreMisconfigured`: a REVOKE never leaves a send `unknown`).
A step the database refuses for its operator's configuration is no attempt: it waits,
`pending`, for the fix (`_wait_for_operator`), and never ends `dead` for it.
A claim is a lease: the worker renews the leases of the executions in hand every third of
one, so a slow step keeps its execution, while a dead worker's claims expire after one
lease and another worker resumes them.

An execution runs only while its automation is active and not deleted. Deleting it stops
its unfinished executions in the delete's transaction; pausing it changes no execution:
a worker that claims one of a paused automation runs no step and puts it back to wait
(`hold_interval`, saying why in `last_error`), and setting the automation active again
moves the held ones up. Both are checked again as each step starts, in the transaction
that records the start (`AutomationStore.start_steps`): a step already running when the
pause or delete commits finishes and is recorded, and the next one does not start.

Beside dispatch, a worker runs the periodic tasks of `sinal.housekeeping` (abandoned
checkouts, …), then deletes what its `retention` lets go, on a thread of their own, every
`housekeeping_interval` seconds: a slow task never delays dispatch, and a failing one is
logged and runs again next time.

Any number of workers may run against PostgreSQL; on SQLite, run one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Generic, TypeVar, cast
from uuid import UUID

import httpx
import orjson

from sinal.automations.backoff import RetryPolicy, honour_retry_after, is_exhausted, next_delay
from sinal.automations.matching import explain_match
from sinal.automations.metrics import WorkerMetrics
from sinal.automations.model import (
    AddTag,
    AutomationSpec,
    InvalidAutomation,
    RemoveTag,
    Step,
    parse_automation,
)
from sinal.automations.steps import (
    EXTERNAL_SENDS,
    OutcomeUnknown,
    StepContext,
    StepFailed,
    StepOutcome,
    run_step,
)
from sinal.errors import (
    FieldError,
    InvalidEvent,
    RetryLater,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
)
from sinal.events import EmitEvent, PreparedEvent, prepare
from sinal.failpoints import failpoint
from sinal.housekeeping import TASKS, Task, run_tasks
from sinal.ledger import Ledger
from sinal.links import StepLinks
from sinal.logs import ThrottledLog
from sinal.retention import Retention, prune
from sinal.store.automations import (
    HELD_WHILE_PAUSED,
    STOPPED_BY_DELETE,
    Advance,
    AutomationRow,
    AutomationStore,
    Claim,
    FanOut,
    Halt,
    Integration,
    Notices,
    StepFinish,
    StepStart,
    StepStatus,
)
from sinal.store.base import StoredEvent
from sinal.store.messaging import MessagingStore

log = logging.getLogger("sinal.dispatcher")

ItemT = TypeVar("ItemT")
AnswerT = TypeVar("AnswerT")

# Seconds a worker trusts the integrations it read (a changed connection is seen this late).
INTEGRATION_TTL = 5.0
# Seconds a stopping worker waits for a housekeeping task in progress.
HOUSEKEEPING_GRACE = 10.0
# Seconds the loop pauses after an unexpected error (a bug) before it tries again, at least:
# a bug that fails every turn logs a traceback a second, not one per poll.
UNEXPECTED_PAUSE = 1.0
# A running step's claim is renewed for at most this many HTTP timeouts plus one lease: a
# request may wait for a pooled connection, for its host's turn to connect, to connect, to
# write and to read, each up to the timeout. A step running longer is stuck; its claim is
# left to expire, as a dead worker's would.
HTTP_WAITS_PER_STEP = 5
# Seconds between two tries at recording a step's outcome while the database is away: from
# the first, doubling up to the last.
RECORD_RETRY_DELAYS = (0.1, 2.0)
# Seconds between two log lines saying that work waits for the database's operator
# (`StoreMisconfigured`: a privilege revoked, a file not writable), whatever the thread.
OPERATOR_LOG_INTERVAL = 60.0


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """How a worker behaves."""

    worker_id: str = ""
    # Seconds a claim outlives its worker: a running worker renews the claims of the
    # executions in hand every third of it, so a step may take longer than the lease.
    lease: float = 60.0
    fan_out_batch: int = 200
    claim_batch: int = 64
    # Executions run at once, each on a thread. Threads mostly wait (on HTTP, or on the
    # shared transaction of their step records), and the more wait together, the more
    # records share a commit: this is what a worker's throughput grows with.
    concurrency: int = 32
    poll_interval: float = 1.0  # the fallback when no NOTIFY arrives
    # Seconds at least between two fan-outs a NOTIFY asks for: every committed batch of
    # events notifies, and a fan-out per commit costs the worker more than the events'
    # own work (a fifth of `sinal serve`'s CPU at 2,500 events/s); waiting gathers them.
    # A full batch goes on at once.
    fan_out_interval: float = 0.05
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    http_timeout: float = 30.0
    allow_private_webhooks: bool = False
    public_url: str = ""  # where tracked links point (`/l/{token}`); "" refuses track_links
    # Seconds an execution of a paused automation waits before a worker looks at it again.
    # Resuming the automation moves its held executions up at once; this bounds the wait
    # of one the resume missed, and how often a paused automation's backlog is claimed.
    hold_interval: float = 60.0
    housekeeping_interval: float = 20.0  # seconds between housekeeping passes; 0: none
    housekeeping: tuple[str | Task, ...] | None = None  # None: sinal.housekeeping.TASKS
    # Days each kind of finished row is kept (`sinal.retention`): housekeeping's last task
    # deletes older ones. The default keeps everything.
    retention: Retention = field(default_factory=Retention)
    # Seconds a stopping worker waits for the steps running to finish (no step starts once
    # it is told to stop): a step past it is left running, its claim to expire.
    stop_grace: float = 35.0

    def with_worker_id(self) -> DispatchSettings:
        """These settings with a worker id (host:pid:random) if none was set."""
        if self.worker_id:
            return self
        ident = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        return replace(self, worker_id=ident)


@lru_cache(maxsize=1024)
def _spec(
    account_id: UUID, automation_id: UUID, updated_at: datetime, raw: bytes
) -> AutomationSpec | tuple[FieldError, ...]:
    try:
        return parse_automation(orjson.loads(raw))
    except InvalidAutomation as exc:  # said once per version: the result is cached
        log.warning("automation %s does not run: its definition fails today's checks: %s",
                    automation_id, exc)  # fmt: skip
        return exc.errors


def spec_of(row: AutomationRow) -> AutomationSpec:
    """The parsed definition of a stored automation (cached per version); raises
    `InvalidAutomation` for one that fails a check added since it was stored."""
    spec = _spec(row.account_id, row.id, row.updated_at, orjson.dumps(row.spec))
    if not isinstance(spec, AutomationSpec):
        raise InvalidAutomation(spec)
    return spec


def choose(event: StoredEvent, candidates: Sequence[AutomationRow]) -> list[UUID]:
    """The automations that run for `event` (same rules as the event trace): never one
    whose definition fails today's checks (the trace says so)."""
    return [row.id for row in candidates if _runs_for(row, event)]


def _runs_for(row: AutomationRow, event: StoredEvent) -> bool:
    try:
        spec = spec_of(row)
    except InvalidAutomation:  # logged once, as it was parsed
        return False
    return explain_match(spec, event, row.created_at, row.id).triggered


class Dispatcher:
    """One worker: fans out the outbox and runs claimed executions, `concurrency` at a time."""

    def __init__(
        self,
        ledger: Ledger,
        settings: DispatchSettings | None = None,
        *,
        http: httpx.Client | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics or WorkerMetrics()
        self.store = cast(AutomationStore, ledger.store)
        self.settings = (settings or DispatchSettings()).with_worker_id()
        self.http = http or httpx.Client(
            timeout=self.settings.http_timeout,
            limits=httpx.Limits(max_connections=max(self.settings.concurrency, 10)),
        )
        self._wake = threading.Event()
        self._outbox_due = threading.Event()  # set: the outbox may hold rows to fan out
        self._outbox_due.set()
        self._notices: Notices | None = None  # set once NOTIFY says when the outbox fills
        # set: executions may be due. Cleared as a claim starts and set again only by a
        # full claim (a backlog), a NOTIFY, or our own fan-out, so a thread freeing up
        # costs no claim query otherwise; `_last_claim` adds one claim per poll interval
        # (waits and retries falling due notify nobody).
        self._claims_due = threading.Event()
        self._claims_due.set()
        self._last_claim = 0.0
        self._fanned_at = 0.0  # monotonic time of the last fan-out
        self._backlog = False  # the last fan-out took a full batch
        self._pool: ThreadPoolExecutor | None = None
        self._integrations = _IntegrationCache(self.store, INTEGRATION_TTL)
        self._links = StepLinks(ledger, self.settings.public_url)
        # the threads' step records share transactions (each still commits before it goes on)
        self._starts = _Combiner(self.store.start_steps)
        self._finishes = _Combiner(self.store.finish_steps)
        self._held = _HeldClaims()  # the executions in hand, whose leases are renewed
        self._stopping = threading.Event()  # `run`'s stop: no step starts once it is set
        self._late = False  # steps were still running when `run` returned
        # every thread meets the operator's misconfiguration alike: one line a minute
        self._operator = ThrottledLog(log, OPERATOR_LOG_INTERVAL)

    # -- the loop ------------------------------------------------------------------------

    def run_once(self) -> int:
        """Fan out what the outbox holds and run what is due, waiting for it to finish; how
        much work was done."""
        fanned = self._fan_out()
        claims = self._claim(self.settings.claim_batch)
        if claims:
            failpoint("after_claim")
            with self._renewing():
                if len(claims) > 1 and self.settings.concurrency > 1:
                    for future in [self._threads().submit(self.run_claim, c) for c in claims]:
                        future.result()
                else:
                    for claim in claims:
                        self.run_claim(claim)
        return fanned.events + len(claims)

    def _fan_out(self) -> FanOut:
        fanned = self.store.fan_out(choose, self.settings.fan_out_batch)
        self.metrics.fanned_out.inc(fanned.events)
        self.metrics.executions_created.inc(fanned.executions)
        for execution_id, why in fanned.skipped:
            log.warning("execution %s stopped: %s", execution_id, why)
        return fanned

    def _claim(self, limit: int) -> list[Claim]:
        claims = self.store.claim_executions(self.settings.worker_id, limit, self.settings.lease)
        self.metrics.claimed.inc(len(claims))
        self.metrics.running.inc(len(claims))  # until `run_claim` is done with each
        return claims

    def run(self, stop: threading.Event) -> None:
        """Work until `stop` is set; sleep on NOTIFY (PostgreSQL) or the poll interval.

        Claims are handed to `concurrency` threads as they free up (a slow webhook holds
        one thread, not the worker). On stop, no step starts: the steps running finish
        (for up to `stop_grace` seconds), and every execution in hand with steps left,
        started or still queued for a thread, is released, due at once, for another
        worker to go on with."""
        self._stopping = stop
        listener = self._start_listener(stop)
        housekeeper = self._start_housekeeping(stop)
        # a stop wakes the loop at once, not at its next poll
        threading.Thread(target=self._wake_on, args=(stop,), daemon=True).start()
        log.info("worker %s started", self.settings.worker_id)
        # the loop meets an outage at every poll: one line every 10 s, not one a poll
        outage = ThrottledLog(log)
        running: dict[Future[None], Claim] = {}
        with self._renewing():  # until the executions in hand are finished, after a stop
            while not stop.is_set():
                try:
                    busy = self._feed(running)
                except StoreError as exc:  # database restarting: wait, then try again
                    outage.warning("worker %s: %s", self.settings.worker_id, exc)
                    self.metrics.error("database")
                    busy = False
                    stop.wait(self.settings.poll_interval)
                except Exception:  # a bug must not end the worker unseen: logged, tried again
                    log.exception("worker %s: dispatch failed", self.settings.worker_id)
                    self.metrics.error("unexpected")
                    busy = False
                    stop.wait(max(self.settings.poll_interval, UNEXPECTED_PAUSE))
                if not busy:
                    timeout = self.settings.poll_interval
                    if self._outbox_due.is_set():  # held back by fan_out_interval
                        timeout = min(timeout, max(self._fan_out_wait(), 0.001))
                    self._wake.wait(timeout)
                    self._wake.clear()
            for future, claim in running.items():
                if future.cancel():  # still waiting for a thread: given back at once
                    self._give_back(claim)
            _, late = wait(running, timeout=self.settings.stop_grace)
            if late:
                self._late = True
                log.warning(
                    "worker %s: %d execution(s) still running a step after %.0f s; their "
                    "claims expire and another worker resumes them",
                    self.settings.worker_id, len(late), self.settings.stop_grace,
                )  # fmt: skip
        if listener is not None:
            listener.join(timeout=2)
        if self._notices is not None:
            try:  # the flag up again, should this worker have lowered it last
                self._notices.arm_outbox()
            except StoreError as exc:
                log.warning("worker %s: %s", self.settings.worker_id, exc)
        if housekeeper is not None:
            # a task is a series of short transactions: one cut short by exit rolls back
            housekeeper.join(timeout=HOUSEKEEPING_GRACE)
            if housekeeper.is_alive():
                log.warning("worker %s: housekeeping still running", self.settings.worker_id)
        log.info("worker %s stopped", self.settings.worker_id)

    def _wake_on(self, stop: threading.Event) -> None:
        stop.wait()
        self._wake.set()

    def renew_leases(self) -> int:
        """Renew the claims of the executions in hand (the renewal thread does, every third
        of a lease); how many were renewed. A claim whose step has run for longer than
        any step may (`HTTP_WAITS_PER_STEP`) is dropped from renewal, once, with a
        warning."""
        limit = self.settings.lease + HTTP_WAITS_PER_STEP * self.settings.http_timeout
        due, stuck = self._held.split(time.monotonic() - limit)
        for claim in stuck:
            self.metrics.stuck.inc()
            log.warning(
                "execution %s: a step has run for over %.0f s; its claim is no longer "
                "renewed and expires within %.0f s",
                claim.execution.id, limit, self.settings.lease,
            )  # fmt: skip
        return len(self.store.renew_claims(due)) if due else 0

    @contextmanager
    def _renewing(self) -> Iterator[None]:
        """Renew the leases of the executions in hand on a thread, for the block."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(self.settings.lease / 3):
                try:
                    self.renew_leases()
                except StoreError as exc:  # the next renewal tries again
                    log.warning("worker %s: %s", self.settings.worker_id, exc)
                    self.metrics.error("database")
                except Exception:  # a bug must not stop renewals; logged, tried again
                    log.exception("worker %s: renewing leases failed", self.settings.worker_id)
                    self.metrics.error("unexpected")

        thread = threading.Thread(target=loop, name="sinal-leases", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _feed(self, running: dict[Future[None], Claim]) -> bool:
        """One turn of the loop: fan out (when the outbox was notified, or on every turn
        without LISTEN), then top the threads up; whether more work is likely waiting."""
        for future in [f for f in running if f.done()]:
            del running[future]
        more = False
        if (self._outbox_due.is_set() or self._notices is None) and self._fan_out_wait() <= 0:
            self._outbox_due.clear()  # before: a NOTIFY from now on sets it again
            self._fanned_at = time.monotonic()
            # The worker waits for a NOTIFY only after a look at the outbox that followed
            # `arm_outbox`: whatever that look missed, its writer notifies. After a full
            # batch the next look comes at once: no need to arm, and writers keep quiet
            # while the worker works through a backlog.
            notices, armed = self._notices, False
            if notices is not None and not self._backlog:
                notices.arm_outbox()
                armed = True
            fanned = self._fan_out()
            if fanned.executions:
                self._claims_due.set()
            self._backlog = fanned.events >= self.settings.fan_out_batch  # more may wait
            if self._backlog or (notices is not None and not armed):
                self._outbox_due.set()  # look again at once (armed, unless a backlog)
                self._fanned_at = 0.0
                more = True
        # Keep up to one claim queued per thread and claim in batches (not one per freed
        # thread): the threads never starve and the claim query is amortized.
        concurrency = self.settings.concurrency
        room = min(2 * concurrency - len(running), self.settings.claim_batch)
        if len(running) > concurrency or room <= 0:
            return more
        polled = time.monotonic() - self._last_claim >= self.settings.poll_interval
        if self._notices is not None and not polled and not self._claims_due.is_set():
            return more
        self._claims_due.clear()  # before: a NOTIFY from now on sets it again
        self._last_claim = time.monotonic()
        claims = self._claim(room)
        if len(claims) == room:  # a full batch: more may be due
            self._claims_due.set()
        if claims:
            failpoint("after_claim")
        for claim in claims:
            self._held.begin(claim)  # renewed from now, while it waits for a thread too
            future = self._threads().submit(self._run_claim_logged, claim)
            future.add_done_callback(lambda _: self._wake.set())  # a thread freed up
            running[future] = claim
        return more or len(claims) == room  # fewer than asked: none due until woken

    def _fan_out_wait(self) -> float:
        """Seconds until a notified fan-out may run (polling without LISTEN: none)."""
        if self._notices is None:
            return 0.0
        return self._fanned_at + self.settings.fan_out_interval - time.monotonic()

    def _threads(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.settings.concurrency, thread_name_prefix="sinal-step"
            )
        return self._pool

    def _run_claim_logged(self, claim: Claim) -> None:
        try:
            self.run_claim(claim)
        except StoreError as exc:  # the lease runs out and another worker resumes it
            log.warning("execution %s: %s", claim.execution.id, exc)
            self.metrics.error("database")
        except Exception:  # a bug must not take the worker down; the lease runs out, too
            log.exception("execution %s failed unexpectedly", claim.execution.id)
            self.metrics.error("unexpected")

    def housekeep(self, stop: threading.Event | None = None) -> int:
        """Run each housekeeping task once, now, then `prune_expired` (`run` does it every
        interval); how many failed (each failure is logged, never raised)."""
        tasks = TASKS if self.settings.housekeeping is None else self.settings.housekeeping
        failed = run_tasks(self.ledger, [*tasks, self.prune_expired], stop)
        self.metrics.housekeeping_failures.inc(failed)
        return failed

    def prune_expired(self, ledger: Ledger, now: datetime) -> None:
        """Housekeeping's task for this worker's `retention` (settings: no registry entry
        could carry them): delete the finished rows past their period, counted by table."""
        for table, n in prune(ledger, self.settings.retention, now).items():
            self.metrics.prune(table, n)

    def _start_housekeeping(self, stop: threading.Event) -> threading.Thread | None:
        interval = self.settings.housekeeping_interval
        if interval <= 0:
            return None

        def loop() -> None:
            while not stop.is_set():
                self.housekeep(stop)
                stop.wait(interval)

        thread = threading.Thread(target=loop, name="sinal-housekeeping", daemon=True)
        thread.start()
        return thread

    def _start_listener(self, stop: threading.Event) -> threading.Thread | None:
        """Listen for NOTIFY on a thread of its own (PostgreSQL). Writers of the outbox
        notify only while the flag `arm_outbox` raises is up; a NOTIFY lowers it (see
        `Notices.listen`), and `_feed` raises it again before it next looks."""
        if not hasattr(self.store, "listen"):
            return None
        notices = self._notices = cast(Notices, self.store)

        def loop() -> None:
            channels_ = ["sinal_outbox", "sinal_executions"]
            listening = notices.listen(
                channels_, self.settings.poll_interval, on_state=self.metrics.listener
            )
            try:
                for channels in listening:
                    if stop.is_set():
                        return
                    if "sinal_outbox" in channels or not channels:  # notified, or the poll
                        self._outbox_due.set()
                    if "sinal_executions" in channels or not channels:
                        self._claims_due.set()
                    self._wake.set()
            finally:
                self.metrics.listening.set(0)

        thread = threading.Thread(target=loop, name="sinal-listen", daemon=True)
        thread.start()
        return thread

    # -- one execution -------------------------------------------------------------------

    def run_claim(self, claim: Claim) -> None:
        """Run a claimed execution from its next step until it waits, stops or completes
        (its lease renewed meanwhile)."""
        try:
            self._run_claim(claim)
        finally:
            self._held.end(claim)
            self.metrics.running.dec()

    def _run_claim(self, claim: Claim) -> None:
        halt = claim.automation.halt  # as the claim found it
        if halt is not None:
            self._halt(claim, claim.execution.next_step, halt)
            return
        try:
            spec = spec_of(claim.automation)
        except InvalidAutomation as exc:  # made before the definition was found to fail
            message = f"the automation's definition fails today's checks: {exc}"
            self._advance(claim, Advance("dead", claim.execution.next_step, last_error=message))
            return
        done = {s.step_index: s for s in claim.execution.steps}
        index = claim.execution.next_step
        tags = claim.tags  # as the claim found them, then with this run's tag steps applied
        while index < len(spec.steps):
            record = done.get(index)
            if record is not None and record.status == "completed":
                index += 1
                continue
            if self._run_step(claim, index, spec, tags) is None:
                return  # the execution was settled (or the claim lost) with the step
            tags = _tags_after(spec.steps[index], tags)
            index += 1
        # every step had completed before (a resume): settle the execution
        self._advance(claim, Advance("completed", index))

    def _run_step(
        self, claim: Claim, index: int, spec: AutomationSpec, tags: tuple[str, ...]
    ) -> StepOutcome | None:
        """Run one step, the contact's tags being `tags`; its outcome when the execution goes
        on to the next step, None when the step settled it (waiting, stopped, completed,
        failed, unknown) or lost it."""
        if self._stopping.is_set():  # the worker is stopping: another one runs the rest
            self._release(claim, index)
            return None
        step = spec.steps[index]
        self._held.begin(claim)  # the step's time starts
        began = time.monotonic()

        def finish(status: StepStatus, **kw: Any) -> None:
            self._finish(claim, index, status, **kw)
            self.metrics.step(step.type, status, time.monotonic() - began)

        started = self._starts.call(StepStart(claim, index, step.type))
        if started is None:
            self._lost(claim)
            return None
        if isinstance(started, str):  # paused or deleted since the claim: no step starts
            self._halt(claim, index, started)
            return None
        record, fresh = started
        if record.status == "completed":
            return StepOutcome()
        if not fresh and step.type in EXTERNAL_SENDS:
            # a worker stopped inside this send: it may have gone out; never resend blindly
            message = "the step was interrupted mid-send; it may or may not have been sent"
            finish("unknown", error=message, then=Advance("unknown", index, last_error=message))
            return None
        if not fresh:
            # A worker stopped inside this step: an attempt, so a step that stops its worker
            # every time (memory, a crash) ends dead rather than stop worker after worker.
            failed = StepFailed("the step was interrupted (its worker stopped)", retry=True)
            finish("failed", error=str(failed), then=self._retry(claim, index, failed))
            return None
        try:
            outcome = run_step(step, self._context(claim, index, tags))
        except OutcomeUnknown as exc:
            finish("unknown", error=str(exc), then=Advance("unknown", index, last_error=str(exc)))
            return None
        except (StepFailed, RetryLater) as exc:
            retry = self._retry(claim, index, exc)
            finish("failed", error=str(exc), then=retry)
            return None
        except StoreMisconfigured as exc:  # nothing written: waits for the operator's fix
            finish("failed", error=str(exc), then=self._wait_for_operator(claim, index, exc))
            return None
        # the record, the step's event and (after the last step) the execution: one commit
        then = _settles(outcome, index, len(spec.steps))
        emit, refused = self._prepare(claim, index, outcome)
        finish("completed", result=outcome.result, emit=emit, event_id=outcome.event_id,
               error=refused, then=then)  # fmt: skip
        failpoint("after_step")
        return outcome if then is None else None

    def _prepare(
        self, claim: Claim, index: int, outcome: StepOutcome
    ) -> tuple[PreparedEvent | None, str | None]:
        """The event a step that happened emits, checked; or None, and why it was refused:
        the step stays completed all the same (a message was sent: never send it again), its
        result kept."""
        if outcome.emit is None:
            return None, None
        try:
            return prepare(outcome.emit, self.ledger.clock()), None
        except InvalidEvent as exc:
            log.warning("execution %s, step %d: its event was refused: %s",
                        claim.execution.id, index, exc)  # fmt: skip
            return None, f"the step's event was refused: {exc}"

    def _finish(
        self, claim: Claim, index: int, status: StepStatus, then: Advance | None = None, **kw: Any
    ) -> None:
        if not self._record_outcome(StepFinish(claim, index, status, then=then, **kw)):
            self._lost(claim)
        elif then is not None:
            self._settled(claim, then)

    def _record_outcome(self, finish: StepFinish) -> bool:
        """Record a step's outcome, trying again while the database is unavailable, for up
        to a lease: the step happened (a message went out), and left to its lease it would
        be resumed as interrupted, a send `unknown`, its event and result lost. Safe to
        repeat: the record is fenced by the claim, and its event has a unique id. While the
        database refuses it for its operator's configuration (`StoreMisconfigured`), until
        the operator fixes it, its claim renewed meanwhile, or the worker stops."""
        delay, until = RECORD_RETRY_DELAYS[0], None
        while True:
            try:
                return self._finishes.call(finish)
            except StoreMisconfigured as exc:
                if self._stopping.is_set():  # left to its lease, as a dead worker's
                    raise
                self._held.begin(finish.claim)  # waiting, not stuck: still renewed
                self._operator.warning("execution %s: recording step %d waits for the "
                                       "database's operator: %s", finish.claim.execution.id,
                                       finish.step_index, exc)  # fmt: skip
                self.metrics.error("database")
                time.sleep(delay)
                delay = min(2 * delay, RECORD_RETRY_DELAYS[1])
            except StoreUnavailable as exc:
                now = time.monotonic()
                until = now + self.settings.lease if until is None else until
                if now + delay > until:  # tried for a lease: left to it, as before
                    raise
                log.warning("execution %s: recording step %d failed, trying again: %s",
                            finish.claim.execution.id, finish.step_index, exc)  # fmt: skip
                self.metrics.error("database")
                time.sleep(delay)
                delay = min(2 * delay, RECORD_RETRY_DELAYS[1])

    def _retry(self, claim: Claim, index: int, exc: StepFailed | RetryLater) -> Advance:
        attempts = claim.execution.attempts + 1
        policy = self.settings.retry
        retryable = isinstance(exc, RetryLater) or (isinstance(exc, StepFailed) and exc.retry)
        if not retryable or is_exhausted(attempts, policy.max_attempts):
            return Advance("dead", index, attempts=attempts, last_error=str(exc))
        delay = next_delay(attempts, base=policy.base, factor=policy.factor, cap=policy.cap)
        # what the step was told to wait (a server's Retry-After, a `RetryLater`'s delay):
        # honoured within the policy's bounds alike, never past its cap
        asked = exc.delay if isinstance(exc, RetryLater) else exc.retry_after
        if asked:
            delay = honour_retry_after(delay, asked, policy.cap)
        run_at = self.ledger.clock() + timedelta(seconds=delay)
        return Advance("pending", index, run_at=run_at, attempts=attempts, last_error=str(exc))

    def _wait_for_operator(self, claim: Claim, index: int, exc: StoreMisconfigured) -> Advance:
        """Leave a step the database refused for its operator's configuration pending, its
        attempt not counted: none passes until the operator's fix, which no retry policy
        waits for, and the first after it does."""
        self._operator.warning("execution %s: step %d waits for the database's operator: %s",
                               claim.execution.id, index, exc)  # fmt: skip
        self.metrics.error("database")
        attempts, policy = claim.execution.attempts, self.settings.retry
        delay = next_delay(attempts + 1, base=policy.base, factor=policy.factor, cap=policy.cap)
        run_at = self.ledger.clock() + timedelta(seconds=delay)
        return Advance("pending", index, run_at=run_at, attempts=attempts, last_error=str(exc))

    def _halt(self, claim: Claim, index: int, halt: Halt) -> None:
        """Leave an execution whose automation is paused or deleted, `index` its next step:
        held for `hold_interval`, or stopped. One the delete stopped already (while this
        worker held it) stays as the delete left it; this releases its claim."""
        if halt == "paused":
            run_at = self.ledger.clock() + timedelta(seconds=self.settings.hold_interval)
            self._advance(claim, Advance("waiting", index, run_at=run_at,
                                         last_error=HELD_WHILE_PAUSED))  # fmt: skip
        else:
            self._advance(claim, Advance("stopped", index, last_error=STOPPED_BY_DELETE))

    def _advance(self, claim: Claim, advance: Advance) -> None:
        if not self.store.advance(claim, advance):
            self._lost(claim)
        else:
            self._settled(claim, advance)

    def _settled(self, claim: Claim, advance: Advance) -> None:
        """Count how the execution was left, with a warning when it waits for a person:
        `dead` (`sinal executions retry` revives it) or `unknown` (a send that may have
        gone out). Both were counted only, logged by nobody."""
        self.metrics.settle(advance.status)
        if advance.status in ("dead", "unknown"):
            e = claim.execution
            log.warning("execution %s (automation %s, account %s) is %s at step %d: %s",
                        e.id, e.automation_id, e.account_id, advance.status,
                        advance.next_step, advance.last_error)  # fmt: skip

    def _give_back(self, claim: Claim) -> None:
        """Release a claim no thread took up (the worker is stopping)."""
        try:
            self._release(claim, claim.execution.next_step)
        except StoreError as exc:  # its lease runs out instead
            log.warning("execution %s: %s", claim.execution.id, exc)
            self.metrics.error("database")
        finally:
            self._held.end(claim)
            self.metrics.running.dec()

    def _release(self, claim: Claim, index: int) -> None:
        """Give back an execution whose step `index` has not started, due now: claimed by
        no one, unchanged otherwise (its status, attempts and last error)."""
        e = claim.execution
        advance = Advance(e.status, index, run_at=self.ledger.clock(), last_error=e.last_error)
        if not self.store.advance(claim, advance):
            self._lost(claim)
        else:
            log.info("execution %s released at step %d: the worker is stopping", e.id, index)

    def _lost(self, claim: Claim) -> None:
        log.warning("lost the claim on execution %s", claim.execution.id)
        self.metrics.lost.inc()

    def _context(self, claim: Claim, index: int, tags: tuple[str, ...]) -> StepContext:
        account, contact = claim.execution.account_id, claim.execution.contact_id
        messaging = cast(MessagingStore, self.ledger.store)

        def change_tag(tag: str, add: bool, event: EmitEvent) -> None:
            prepared = prepare(event, self.ledger.clock())
            store: Any = self.ledger.store
            store.change_tags(account, contact, [tag], add=add, on_change=lambda _: prepared)

        def close_conversation(
            key: str, closed: Callable[[UUID], EmitEvent]
        ) -> tuple[UUID, UUID | None] | None:
            now = self.ledger.clock()
            return self.store.close_open_conversation(
                account, contact, key, lambda conversation: prepare(closed(conversation), now)
            )

        return StepContext(
            claim=claim if tags == claim.tags else replace(claim, tags=tags),
            index=index,
            now=self.ledger.clock(),
            http=self.http,
            integrations=lambda kind: self._integrations.live(account, kind),
            inbound_number=lambda: messaging.last_inbound_number(account, contact),
            change_tag=change_tag,
            close_conversation=close_conversation,
            allow_private_webhooks=self.settings.allow_private_webhooks,
            links=self._links,
            keyring=self.store.keyring,
        )

    def close(self) -> None:
        """Release the threads and the HTTP client; a step still running after `run`'s
        grace keeps both and is not waited for."""
        if self._pool is not None:
            self._pool.shutdown(wait=not self._late, cancel_futures=True)
            self._pool = None
        if not self._late:
            self.http.close()


def _tags_after(step: Step, tags: tuple[str, ...]) -> tuple[str, ...]:
    """The contact's tags once `step` completed, as the steps after it in the same run see
    them (sorted, as the claim reads them): a filter after `add_tag` finds the tag."""
    if isinstance(step, AddTag) and step.tag not in tags:
        return tuple(sorted((*tags, step.tag)))
    if isinstance(step, RemoveTag):
        return tuple(t for t in tags if t != step.tag)
    return tags


def _settles(outcome: StepOutcome, index: int, steps: int) -> Advance | None:
    """How a step that completed leaves the execution; None when the next step follows."""
    if outcome.control == "wait":
        return Advance("waiting", index + 1, run_at=outcome.resume_at)
    if outcome.control == "stop":
        return Advance("stopped", index + 1, last_error=outcome.reason)
    if index + 1 == steps:
        return Advance("completed", index + 1)
    return None


class _HeldClaims:
    """The claims a worker has in hand, each with the monotonic time its current step (or
    its wait for a thread) began: what `renew_leases` renews."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[UUID, tuple[Claim, float]] = {}

    def begin(self, claim: Claim) -> None:
        """Hold `claim`, its step beginning now."""
        with self._lock:
            self._claims[claim.execution.id] = (claim, time.monotonic())

    def end(self, claim: Claim) -> None:
        """Stop holding `claim` (it was settled, or lost), and only it: once settled, its
        execution may have been claimed again (a retry due at once) and begun by another
        thread before this one ends it; that claim stays held."""
        with self._lock:
            held = self._claims.get(claim.execution.id)
            if held is not None and held[0] is claim:
                del self._claims[claim.execution.id]

    def split(self, since: float) -> tuple[list[Claim], list[Claim]]:
        """The claims whose step began at `since` or later, and those whose step began
        before: these are no longer held."""
        due: list[Claim] = []
        stuck: list[Claim] = []
        with self._lock:
            for claim, began in self._claims.values():
                (due if began >= since else stuck).append(claim)
            for claim in stuck:
                del self._claims[claim.execution.id]
        return due, stuck


class _IntegrationCache:
    """The account's live integrations of a kind, kept for a few seconds: a step per
    execution would otherwise read them every time. A changed or deleted connection is seen
    within `ttl` seconds."""

    def __init__(self, store: AutomationStore, ttl: float) -> None:
        self._store = store
        self._ttl = ttl
        self._found: dict[tuple[UUID, str], tuple[float, list[Integration]]] = {}

    def live(self, account_id: UUID, kind: str) -> list[Integration]:
        """The live integrations of `kind`, oldest first."""
        key = (account_id, kind)
        now = time.monotonic()
        cached = self._found.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = self._store.list_integrations(account_id, kind)  # type: ignore[arg-type]
        self._found[key] = (now + self._ttl, found)  # a race only reads twice: harmless
        return found


class _Combiner(Generic[ItemT, AnswerT]):
    """Concurrent calls share one batched call, like a group commit without a timer.

    A caller that finds no batch in flight sends its own at once, with whatever else is
    waiting; callers that arrive meanwhile wait for it and go together in the next one. So
    a lone thread pays no delay, and busy threads share round trips and commits. Each
    caller returns only once the batch holding its item is done (committed).

    A batch that fails (rolled back) for another reason than an unavailable database runs
    again one item at a time: an item the database refuses fails no other caller's."""

    def __init__(
        self, run: Callable[[list[ItemT]], Sequence[AnswerT]], max_batch: int = 256
    ) -> None:
        self._run = run
        self._max = max_batch
        self._ready = threading.Condition()
        self._waiting: list[_Slot[ItemT, AnswerT]] = []
        self._busy = False

    def call(self, item: ItemT) -> AnswerT:
        """Run `item` in a batch; its own answer (or the batch's exception)."""
        slot: _Slot[ItemT, AnswerT] = _Slot(item)
        with self._ready:
            self._waiting.append(slot)
        while True:
            with self._ready:
                while self._busy and not slot.done:
                    self._ready.wait()
                if slot.done:
                    return slot.answer()
                self._busy = True
                batch, self._waiting = self._waiting[: self._max], self._waiting[self._max :]
            try:
                self._answer(batch)
            finally:
                with self._ready:
                    for waiting in batch:
                        waiting.done = True
                    self._busy = False
                    self._ready.notify_all()

    def _answer(self, batch: list[_Slot[ItemT, AnswerT]]) -> None:
        """Run `batch`, giving each slot its answer or its error."""
        try:
            for waiting, answer in zip(batch, self._run([s.item for s in batch]), strict=True):
                waiting.result = answer
        except BaseException as exc:
            alone = len(batch) > 1 and isinstance(exc, Exception)
            if not alone or isinstance(exc, StoreUnavailable):  # each alone would wait too
                for waiting in batch:  # every caller in the batch hears of it
                    waiting.error = exc
                return
            log.warning("a batch of %d failed (%s); running its items one by one",
                        len(batch), exc)  # fmt: skip
            for waiting in batch:
                self._answer([waiting])


class _Slot(Generic[ItemT, AnswerT]):
    """One caller's item and, once its batch is done, its answer."""

    __slots__ = ("done", "error", "item", "result")

    def __init__(self, item: ItemT) -> None:
        self.item = item
        self.done = False
        self.result: AnswerT | None = None
        self.error: BaseException | None = None

    def answer(self) -> AnswerT:
        if self.error is not None:
            raise self.error
        return cast(AnswerT, self.result)
