"""The dispatcher: outbox → executions → steps, effectively once.

Dispatch is at least once (the outbox row is deleted in the transaction that creates the
executions); an automation runs at most once per event (the executions' unique key); a
step's side effect happens at most once (its record is committed as `started` before the
side effect, `completed` after; a `started` external send found on resume is `unknown`).

Any number of workers may run against PostgreSQL; on SQLite, run one.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, cast
from uuid import UUID

import httpx
import orjson

from sinal.automations.backoff import RetryPolicy, is_exhausted, next_delay
from sinal.automations.matching import explain_match
from sinal.automations.model import AutomationSpec, parse_automation
from sinal.automations.steps import (
    EXTERNAL_SENDS,
    OutcomeUnknown,
    StepContext,
    StepFailed,
    StepOutcome,
    run_step,
)
from sinal.errors import RetryLater, StoreError
from sinal.events import EmitEvent, prepare
from sinal.failpoints import failpoint
from sinal.ledger import Ledger
from sinal.store.automations import Advance, AutomationRow, AutomationStore, Claim
from sinal.store.base import StoredEvent

log = logging.getLogger("sinal.dispatcher")


@dataclass(frozen=True, slots=True)
class DispatchSettings:
    """How a worker behaves."""

    worker_id: str = ""
    lease: float = 300.0  # seconds an execution stays claimed without progress
    fan_out_batch: int = 200
    claim_batch: int = 20
    poll_interval: float = 1.0  # the fallback when no NOTIFY arrives
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    http_timeout: float = 30.0
    allow_private_webhooks: bool = False

    def with_worker_id(self) -> DispatchSettings:
        """These settings with a worker id (host:pid:random) if none was set."""
        if self.worker_id:
            return self
        from dataclasses import replace

        ident = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        return replace(self, worker_id=ident)


@lru_cache(maxsize=1024)
def _spec(
    account_id: UUID, automation_id: UUID, updated_at: datetime, raw: bytes
) -> AutomationSpec:
    return parse_automation(orjson.loads(raw))


def spec_of(row: AutomationRow) -> AutomationSpec:
    """The parsed definition of a stored automation (cached per version)."""
    return _spec(row.account_id, row.id, row.updated_at, orjson.dumps(row.spec))


def choose(event: StoredEvent, candidates: Sequence[AutomationRow]) -> list[UUID]:
    """The automations that run for `event` (same rules as the event trace)."""
    return [
        row.id for row in candidates if explain_match(spec_of(row), event, row.created_at).triggered
    ]


class Dispatcher:
    """One worker: fans out the outbox and runs claimed executions."""

    def __init__(
        self,
        ledger: Ledger,
        settings: DispatchSettings | None = None,
        *,
        http: httpx.Client | None = None,
    ) -> None:
        self.ledger = ledger
        self.store = cast(AutomationStore, ledger.store)
        self.settings = (settings or DispatchSettings()).with_worker_id()
        self.http = http or httpx.Client(timeout=self.settings.http_timeout)
        self._wake = threading.Event()

    # -- the loop ------------------------------------------------------------------------

    def run_once(self) -> int:
        """Fan out what the outbox holds and run what is due; how much work was done."""
        fanned = self.store.fan_out(choose, self.settings.fan_out_batch)
        claims = self.store.claim_executions(
            self.settings.worker_id, self.settings.claim_batch, self.settings.lease
        )
        if claims:
            failpoint("after_claim")
        for claim in claims:
            self.run_claim(claim)
        return fanned.events + len(claims)

    def run(self, stop: threading.Event) -> None:
        """Work until `stop` is set; sleep on NOTIFY (PostgreSQL) or the poll interval."""
        listener = self._start_listener(stop)
        log.info("worker %s started", self.settings.worker_id)
        while not stop.is_set():
            try:
                busy = self.run_once()
            except StoreError as exc:  # database restarting: wait, then try again
                log.warning("worker %s: %s", self.settings.worker_id, exc)
                busy = 0
                stop.wait(self.settings.poll_interval)
            if not busy:
                self._wake.wait(self.settings.poll_interval)
                self._wake.clear()
        if listener is not None:
            listener.join(timeout=2)
        log.info("worker %s stopped", self.settings.worker_id)

    def _start_listener(self, stop: threading.Event) -> threading.Thread | None:
        listen = getattr(self.store, "listen", None)
        if listen is None:
            return None

        def loop() -> None:
            for _ in listen(["sinal_outbox", "sinal_executions"]):
                if stop.is_set():
                    return
                self._wake.set()

        thread = threading.Thread(target=loop, name="sinal-listen", daemon=True)
        thread.start()
        return thread

    # -- one execution -------------------------------------------------------------------

    def run_claim(self, claim: Claim) -> None:
        """Run a claimed execution from its next step until it waits, stops or completes."""
        spec = spec_of(claim.automation)
        done = {s.step_index: s for s in claim.execution.steps}
        index = claim.execution.next_step
        while index < len(spec.steps):
            record = done.get(index)
            if record is not None and record.status == "completed":
                index += 1
                continue
            verdict = self._run_step(claim, index, spec)
            if verdict is None:
                return  # the claim was lost, or the execution was settled
            if verdict.control == "wait":
                self._advance(claim, "waiting", index + 1, run_at=verdict.resume_at)
                return
            if verdict.control == "stop":
                self._advance(claim, "stopped", index + 1, last_error=verdict.reason)
                return
            index += 1
        self._advance(claim, "completed", index)

    def _run_step(self, claim: Claim, index: int, spec: AutomationSpec) -> StepOutcome | None:
        step = spec.steps[index]
        started = self.store.start_step(claim, index, step.type)
        if started is None:
            return None
        record, fresh = started
        if record.status == "completed":
            return StepOutcome()
        if not fresh and step.type in EXTERNAL_SENDS:
            # a worker stopped inside this send: it may have gone out; never resend blindly
            message = "the step was interrupted mid-send; it may or may not have been sent"
            self.store.finish_step(claim, index, "unknown", error=message)
            self._advance(claim, "unknown", index, last_error=message)
            return None
        try:
            outcome = run_step(step, self._context(claim, index))
        except OutcomeUnknown as exc:
            self.store.finish_step(claim, index, "unknown", error=str(exc))
            self._advance(claim, "unknown", index, last_error=str(exc))
            return None
        except (StepFailed, RetryLater) as exc:
            self.store.finish_step(claim, index, "failed", error=str(exc))
            self._retry(claim, index, exc)
            return None
        event_id = self._emit(outcome.emit)
        self.store.finish_step(claim, index, "completed", result=outcome.result, event_id=event_id)
        failpoint("after_step")
        return outcome

    def _emit(self, event: EmitEvent | None) -> UUID | None:
        if event is None:
            return None
        return self.ledger.emit(event).event_id

    def _retry(self, claim: Claim, index: int, exc: Exception) -> None:
        attempts = claim.execution.attempts + 1
        policy = self.settings.retry
        retryable = isinstance(exc, RetryLater) or (isinstance(exc, StepFailed) and exc.retry)
        if not retryable or is_exhausted(attempts, policy.max_attempts):
            self._advance(claim, "dead", index, attempts=attempts, last_error=str(exc))
            return
        delay = (
            exc.delay
            if isinstance(exc, RetryLater) and exc.delay
            else next_delay(attempts, base=policy.base, factor=policy.factor, cap=policy.cap)
        )
        run_at = self.ledger.clock() + timedelta(seconds=delay)
        self._advance(claim, "pending", index, run_at=run_at, attempts=attempts,
                      last_error=str(exc))  # fmt: skip

    def _advance(self, claim: Claim, status: Any, next_step: int, **kw: Any) -> None:
        if not self.store.advance(claim, Advance(status, next_step, **kw)):
            log.warning("lost the claim on execution %s", claim.execution.id)

    def _context(self, claim: Claim, index: int) -> StepContext:
        account, contact = claim.execution.account_id, claim.execution.contact_id

        def integration(kind: str) -> Any:
            found = self.store.list_integrations(account, kind)  # type: ignore[arg-type]
            return found[0] if found else None

        def change_tag(tag: str, add: bool, event: EmitEvent) -> None:
            prepared = prepare(event, self.ledger.clock())
            store: Any = self.ledger.store
            store.change_tags(account, contact, [tag], add=add, on_change=lambda _: prepared)

        return StepContext(
            claim=claim,
            index=index,
            now=self.ledger.clock(),
            http=self.http,
            integrations=integration,
            change_tag=change_tag,
            close_conversation=lambda: self.store.close_open_conversation(account, contact),
            allow_private_webhooks=self.settings.allow_private_webhooks,
        )

    def close(self) -> None:
        """Release the HTTP client."""
        self.http.close()
