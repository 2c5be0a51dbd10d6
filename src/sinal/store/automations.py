"""The storage interface of integrations, automations and their executions.

Kept apart from the ledger's `Store` (as eventsourcing keeps its process recorder apart from
its aggregate recorder): the same backend classes implement both, through mixins
(`sqlite_automations.py`, `postgres_automations.py`), each method one transaction.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol
from uuid import UUID

from sinal.errors import (
    ConfigurationError,
    SchemaViolation,
    StoreError,
    StoreMisconfigured,
    UnstorableInput,
)
from sinal.events import PreparedEvent
from sinal.integrations.whatsapp import SENT_BY_EXECUTION
from sinal.keyring import (
    PLAINTEXT,
    SECRET_KEYS_VARIABLE,
    Keyring,
    integration_place,
    is_sealed,
    open_all,
    reseal,
    reseal_all,
    seal_all,
    webhook_header_place,
    webhook_secret_place,
)
from sinal.store.base import Contact, Outcome, StoredEvent, refused

log = logging.getLogger("sinal.store")

# Column lists both backends select, in the order the records' fields take them.
EXECUTION_COLUMNS = (
    "account_id, id, automation_id, event_id, contact_id, status, next_step, attempts, run_at, "
    "last_error, created_at, updated_at, chain_depth, automation_version"
)
STEP_COLUMNS = (
    "step_index, step_type, status, attempts, result, error, event_id, started_at, finished_at"
)
AUTOMATION_COLUMNS = (
    "account_id, id, name, status, trigger_metric, spec, created_at, updated_at, version"
)
# The event trace's read (`AutomationStore.trace_automations`), in the backend's placeholder
# `p`: an account's live automations (the second parameter), oldest first, each one's
# definition only when it listens to the metric (the first parameter; NULL for the others).
TRACE_AUTOMATIONS_SQL = (
    "SELECT "
    + AUTOMATION_COLUMNS.replace(" spec,", " CASE WHEN trigger_metric = {p} THEN spec END,")
    + " FROM automations WHERE account_id = {p} AND deleted_at IS NULL ORDER BY id"
)
# What a claim reads of its automation: the current row, deleted or not.
CLAIMED_AUTOMATION_COLUMNS = f"{AUTOMATION_COLUMNS}, deleted_at"
INTEGRATION_COLUMNS = "account_id, id, kind, name, settings, secrets, created_at"


IntegrationKind = Literal["whatsapp", "ai", "shopify", "yampi"]
# The tables holding secrets: integrations' `secrets`, automations' webhook steps' `secret`
# and header values, and those of the earlier versions kept for executions under way.
SecretTable = Literal["integrations", "automations", "automation_versions"]
ExecutionStatus = Literal["pending", "waiting", "completed", "stopped", "unknown", "dead"]
StepStatus = Literal["started", "completed", "failed", "unknown"]
# Why a held execution's next step does not start (see `AutomationStore.start_steps`).
Halt = Literal["paused", "deleted", "stopped"]

# The `last_error` of an execution held because its automation is paused: a worker that
# claims one runs no step and puts it back to wait; resuming the automation (a PATCH to
# `active`) finds its held executions by this text and moves them up.
HELD_WHILE_PAUSED = "the automation is paused: held until it is active again"
# The `last_error` of an execution stopped because its automation was deleted.
STOPPED_BY_DELETE = "the automation was deleted"

# The deepest an execution may be in a chain of automations and still run. An execution
# made for a status of a message another execution's step sent (the event names it:
# `SENT_BY_EXECUTION`) is one deeper than that execution; one made for any other event is
# at depth 0. Events emitted by steps never trigger automations, and a status never
# triggers the automation that sent its message, but two automations could still answer
# each other's statuses (Delivered → send a message) for ever: one deeper than this is
# recorded `stopped` (`too_deep`) and runs no step.
MAX_CHAIN_DEPTH = 8


def too_deep(depth: int) -> str:
    """The `last_error` of an execution stopped, unrun, at chain depth `depth`."""
    return (
        f"not run: {depth} executions before it each sent a message whose status triggered "
        f"the next (at most {MAX_CHAIN_DEPTH} may); stopped so that automations cannot "
        "trigger each other for ever"
    )


def stopped_too_deep(execution: Execution) -> bool:
    """Whether `execution` was recorded stopped, unrun, for its chain depth (`too_deep`)."""
    return execution.status == "stopped" and execution.chain_depth > MAX_CHAIN_DEPTH


def chain_parent(event: StoredEvent) -> UUID | None:
    """The execution that sent the message `event` is a status of, as the event names it;
    None for any other event (the caller looks it up in the event's account only)."""
    named = event.properties.get(SENT_BY_EXECUTION)
    if not isinstance(named, str):
        return None
    try:
        return UUID(named)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Integration:
    """A connection of an account to a provider (WhatsApp Cloud API, an AI endpoint, a store)."""

    account_id: UUID
    id: UUID
    kind: IntegrationKind
    name: str | None
    settings: dict[str, Any]
    secrets: dict[str, Any] = field(repr=False)  # opened: never in a log line or traceback
    created_at: datetime


def opened_integration(keyring: Keyring | None, stored: Integration) -> Integration:
    """An integration as read from its row, its secrets opened (`SecretUnreadable` for one
    no key of `keyring` opens)."""
    place = integration_place(stored.account_id, stored.id)
    return replace(stored, secrets=open_all(keyring, stored.secrets, place))


def sealed_secrets(keyring: Keyring | None, integration: Integration) -> dict[str, Any]:
    """An integration's secrets as its row stores them: sealed with `keyring`'s current
    key, or as they are without one."""
    place = integration_place(integration.account_id, integration.id)
    return seal_all(keyring, integration.secrets, place)


def sealed_spec(keyring: Keyring | None, row: AutomationRow) -> dict[str, Any]:
    """An automation's definition as its row stores it: each webhook step's signing secret
    and header values sealed with `keyring`'s current key (as they are without one, or
    when sealed already)."""
    if keyring is None:
        return row.spec

    def seal(value: Any, place: str) -> Any:
        return keyring.seal(value, place) if isinstance(value, str) else value

    return _with_secrets(row.spec, row.account_id, row.id, seal)[0]


def resealed_spec(
    keyring: Keyring, account_id: UUID, automation_id: UUID, spec: dict[str, Any]
) -> tuple[dict[str, Any] | None, int, int]:
    """A stored definition with each webhook step's signing secret and header values
    sealed with the current key (None when every one was already), the number of its
    secrets, and of those sealed again; `SecretUnreadable` for one no key opens."""
    resealed = 0

    def again(value: Any, place: str) -> Any:
        nonlocal resealed
        fresh = reseal(keyring, value, place)
        resealed += fresh is not value
        return fresh

    fresh, scanned = _with_secrets(spec, account_id, automation_id, again)
    return (fresh if resealed else None), scanned, resealed


def _with_secrets(
    spec: dict[str, Any], account_id: UUID, automation_id: UUID, change: Callable[[Any, str], Any]
) -> tuple[dict[str, Any], int]:
    """A stored definition with `change(value, its place)` applied to each secret of its
    webhook steps (the signing secret, each header's value), and the number of them."""
    steps = spec.get("steps")
    if not isinstance(steps, list):
        return spec, 0
    secret_place = webhook_secret_place(account_id, automation_id)
    fresh, count = [], 0
    for stored in steps:
        step = dict(stored) if isinstance(stored, dict) else stored
        if isinstance(step, dict) and step.get("type") == "webhook":
            if _is_secret(step.get("secret")):
                step["secret"] = change(step["secret"], secret_place)
                count += 1
            if isinstance(headers := step.get("headers"), dict):
                places = {n: webhook_header_place(account_id, automation_id, n) for n in headers}
                step["headers"] = {n: change(v, places[n]) if _is_secret(v) else v
                                   for n, v in headers.items()}  # fmt: skip
                count += sum(_is_secret(v) for v in headers.values())
        fresh.append(step)
    return {**spec, "steps": fresh}, count


def secrets_of(table: SecretTable) -> tuple[str, str]:
    """The column of `table` holding its secrets, and the column naming the row they are
    bound to (an automation's kept version's secrets are its automation's)."""
    if table == "integrations":
        return "secrets", "id"
    return "spec", "automation_id" if table == "automation_versions" else "id"


def _resealed_row(
    keyring: Keyring, table: SecretTable, account_id: UUID, owner: UUID, stored: dict[str, Any]
) -> tuple[dict[str, Any] | None, int, int]:
    """A row's stored secrets (an integration's `secrets`, an automation's `spec` or that
    of one of its versions), bound to the row `owner`, sealed again with the current key
    (None: nothing to write), with the number of secrets read and of those sealed again."""
    if table != "integrations":
        return resealed_spec(keyring, account_id, owner, stored)
    fresh = reseal_all(keyring, stored, integration_place(account_id, owner))
    changed = 0 if fresh is None else sum(fresh[k] is not stored[k] for k in stored)
    return fresh, len(stored), changed


def secret_counts(rows: Iterable[tuple[str | None, int]]) -> dict[str, int]:
    """(key id or None, count) rows, some ids repeated, as `count_secrets` answers them."""
    counts: dict[str, int] = {}
    for kid, n in rows:
        key = PLAINTEXT if kid is None else str(kid)
        counts[key] = counts.get(key, 0) + n
    return counts


def resealed_rows(
    keyring: Keyring | None, table: SecretTable, rows: Iterable[tuple[UUID, UUID, Any, UUID]]
) -> tuple[list[tuple[UUID, UUID, dict[str, Any]]], int, int]:
    """For `reseal_secrets`: of (account_id, id, stored secrets or spec, the row they are
    bound to: `secrets_of`) rows, those to write again (with what to write), the number of
    secrets read, and of those sealed again; `ConfigurationError` without a keyring,
    `SecretUnreadable` as `reseal`."""
    if keyring is None:
        raise ConfigurationError(f"{SECRET_KEYS_VARIABLE} is not set: no key to seal with")
    writes, scanned, resealed = [], 0, 0
    for account_id, ident, stored, owner in rows:
        fresh, read, changed = _resealed_row(keyring, table, account_id, owner, stored)
        scanned, resealed = scanned + read, resealed + changed
        if fresh is not None:
            writes.append((account_id, ident, fresh))
    return writes, scanned, resealed


def _is_secret(value: object) -> bool:
    """Whether a stored value of a secret's place holds one (a text, or a sealed value)."""
    return isinstance(value, str) or is_sealed(value)


@dataclass(frozen=True, slots=True)
class ResealBatch:
    """What one transaction of `AutomationStore.reseal_secrets` did: the secrets it read,
    those it sealed again, and the last row it read (None: no row was left)."""

    scanned: int
    resealed: int
    last: tuple[UUID, UUID] | None


@dataclass(frozen=True, slots=True)
class AutomationRow:
    """An automation as stored: its parsed definition is `spec` (JSON)."""

    account_id: UUID
    id: UUID
    name: str
    status: Literal["active", "paused"]
    trigger_metric: str
    spec: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    # Its definition's version: 1 when created, one more with each change of its steps
    # (`sinal.automations.service`). A claim's is its execution's, with that version's
    # definition (`pinned`).
    version: int = 1
    deleted_at: datetime | None = None  # read by claims only: other reads skip deleted rows

    @property
    def halt(self) -> Halt | None:
        """Why its executions run no step now: "deleted", "paused", or None."""
        return automation_halt(self.status, self.deleted_at)


def automation_halt(status: str, deleted_at: object) -> Halt | None:
    """Why an automation's executions run no step now, from its `status` and `deleted_at`
    columns: "deleted", "paused", or None (`_START_STEPS_SQL` decides alike in SQL)."""
    if deleted_at is not None:
        return "deleted"
    return None if status == "active" else "paused"


@dataclass(frozen=True, slots=True)
class AutomationTitle:
    """An automation as the event trace reads one listening to another metric than the
    event's: what it shows of it, not its definition."""

    id: UUID
    name: str
    trigger_metric: str


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What happened to one step of one execution."""

    step_index: int
    step_type: str
    status: StepStatus
    attempts: int
    result: dict[str, Any] | None
    error: str | None
    event_id: UUID | None
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, slots=True)
class Execution:
    """One run of one automation for one event."""

    account_id: UUID
    id: UUID
    automation_id: UUID
    event_id: UUID
    contact_id: UUID
    status: ExecutionStatus
    next_step: int
    attempts: int
    run_at: datetime
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    chain_depth: int  # in a chain of automations (`MAX_CHAIN_DEPTH`): 0 unless a status
    # The version of its automation's definition it runs: the one it was made with, kept
    # by the store while the execution may still run (`AutomationStore.update_automation`).
    automation_version: int = 1
    steps: tuple[StepRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class Claim:
    """An execution claimed by a worker until `claimed_until`, with what it needs to run."""

    execution: Execution
    automation: AutomationRow
    event: StoredEvent
    contact: Contact
    tags: tuple[str, ...]
    worker: str
    lease: float


@dataclass(frozen=True, slots=True)
class Advance:
    """How a worker leaves an execution it holds (applied only while it still holds it)."""

    status: ExecutionStatus
    next_step: int
    run_at: datetime | None = None
    attempts: int | None = None
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class StepStart:
    """A step about to run (see `AutomationStore.start_steps`)."""

    claim: Claim
    step_index: int
    step_type: str


@dataclass(frozen=True, slots=True)
class StepFinish:
    """A step's outcome to record (see `AutomationStore.finish_steps`): the event it emits
    goes in the same transaction (its id on the record), and so does `then`, the execution's
    advance, when the step settles it."""

    claim: Claim
    step_index: int
    status: StepStatus
    result: dict[str, Any] | None = None
    error: str | None = None
    event_id: UUID | None = None
    emit: PreparedEvent | None = None
    then: Advance | None = None


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits for the workers: outbox rows not yet fanned out, and executions due to run
    that no worker holds, each with how long its oldest has waited (seconds; 0 if none)."""

    outbox_rows: int
    outbox_oldest: float
    executions_due: int
    executions_oldest: float


@dataclass(slots=True)
class FanOut:
    """What one fan-out pass did; `skipped`: the executions it recorded `stopped`, unrun,
    with why (`too_deep`)."""

    events: int = 0
    executions: int = 0
    skipped: list[tuple[UUID, str]] = field(default_factory=list)


def pinned(automation: AutomationRow, execution: Execution, kept: Any) -> AutomationRow:
    """A claim's automation: the current row, with the definition `kept` for the
    execution's version when it is not the current one (as stored: JSON text or parsed;
    None, the current definition, for a version no longer kept)."""
    if kept is None or execution.automation_version == automation.version:
        return automation
    return replace(automation, spec=decode_json(kept), version=execution.automation_version)


# What `AutomationStore.start_steps` answers for one step (see `start_step`).
StepStarted = tuple[StepRecord, bool] | Halt | None

# Given a conversation's id, the event of its closing (`close_open_conversation`).
BuildCloseEvent = Callable[[UUID], PreparedEvent]

# Given an automation as stored, the automation to store (`update_automation`).
ChangeAutomation = Callable[[AutomationRow], AutomationRow]

# Given an event and its account's automations listening to its metric, the ids to run.
Chooser = Callable[[StoredEvent, Sequence[AutomationRow]], list[UUID]]


class AutomationStore(Protocol):
    """What the dispatcher and the automations API need from a database."""

    keyring: Keyring | None  # seals the secrets written (integrations', webhook steps')

    def create_integration(self, integration: Integration) -> None:
        """Insert an integration."""
        ...

    def get_integration(self, account_id: UUID, integration_id: UUID) -> Integration | None:
        """One live integration of the account (secrets included: for internal use)."""
        ...

    def list_integrations(
        self,
        account_id: UUID,
        kind: IntegrationKind | None = None,
        *,
        after: UUID | None = None,
        limit: int | None = None,
    ) -> list[Integration]:
        """The account's live integrations (of `kind`, when given), oldest first by id
        (UUIDv7: creation order): past the integration `after`, when given; at most
        `limit` (all of them when None)."""
        ...

    def delete_integration(self, account_id: UUID, integration_id: UUID) -> bool:
        """Soft-delete; False when there was none. In the same transaction, its Checkout
        Abandoned events leave the outbox if still there and their executions still pending
        or waiting stop (`sinal.store.commerce.STOPPED_BY_DISCONNECT`): with the store
        disconnected, no order can come to stop a cart message to a customer who bought."""
        ...

    def count_secrets(self) -> dict[str, int]:
        """The stored secrets — of every integration, and every webhook step's signing
        secret and header values, deleted rows' and kept versions' too — by the id of the
        key that sealed them (`PLAINTEXT` for those not sealed)."""
        ...

    def reseal_secrets(
        self, table: SecretTable, after: tuple[UUID, UUID] | None, limit: int
    ) -> ResealBatch:
        """Seal again, with the store's current key, the secrets that another key sealed or
        none did, of up to `limit` rows of `table` (deleted ones too) past `after` in
        (account_id, id) order — one short transaction, the rows locked; `SecretUnreadable`
        (nothing of the batch written) for a secret no key opens. A row's other columns
        (an automation's `updated_at`) stay as they are."""
        ...

    def create_automation(self, row: AutomationRow) -> None:
        """Insert an automation."""
        ...

    def get_automation(self, account_id: UUID, automation_id: UUID) -> AutomationRow | None:
        """One live automation, or None."""
        ...

    def list_automations(
        self, account_id: UUID, *, after: UUID | None = None, limit: int | None = None
    ) -> list[AutomationRow]:
        """The account's live automations, oldest first by id (UUIDv7: creation order):
        past the automation `after`, when given; at most `limit` (all of them when None)."""
        ...

    def trace_automations(
        self, account_id: UUID, metric_name: str
    ) -> list[AutomationRow | AutomationTitle]:
        """The account's live automations, oldest first by id, as the event trace needs them:
        in full those listening to `metric_name`, the others as `AutomationTitle` (their
        definitions, most of what an automation holds, are not read)."""
        ...

    def update_automation(
        self, account_id: UUID, automation_id: UUID, change: ChangeAutomation
    ) -> AutomationRow | None:
        """Replace name, status, trigger and spec with what `change` makes of the live row,
        read under the row's write lock in the transaction that writes: no update commits
        between its read and its write, so concurrent ones each see the other's (a rename
        cannot undo a pause). The row written; None when there was none; what `change`
        raises, nothing written. Setting a paused automation active moves its held
        executions (`HELD_WHILE_PAUSED`) up to now, in the same transaction. A row
        `change` gives a new `version` (its steps changed) has the definition it replaces
        kept, as stored, in the same transaction, for the executions made with it (their
        claims read it), until `prune_versions` finds none of them left to run it."""
        ...

    def delete_automation(self, account_id: UUID, automation_id: UUID) -> bool:
        """Soft-delete (executions keep pointing at it) and stop its pending and waiting
        executions (`STOPPED_BY_DELETE`) in the same transaction, leaving the claim of one
        a worker holds, so that worker still records the step it is running; False when
        there was none."""
        ...

    def fan_out(self, choose: Chooser, limit: int) -> FanOut:
        """Take up to `limit` outbox rows, create one execution per chosen automation (unique
        per automation and event) and delete the rows — one transaction, so a crash anywhere
        leaves the rows for another worker. An execution deeper than `MAX_CHAIN_DEPTH` in
        a chain of automations (see there) is created `stopped`, in `FanOut.skipped`."""
        ...

    def claim_executions(self, worker: str, limit: int, lease: float) -> list[Claim]:
        """Claim due executions (pending/waiting with run_at passed, not held by a live
        claim) for `lease` seconds, loading what they need in a few set-based queries: a
        claim's automation is the current row (its status, whether deleted) with the
        definition of the execution's version (`pinned`)."""
        ...

    def start_step(self, claim: Claim, step_index: int, step_type: str) -> StepStarted:
        """Record that a step starts (committed before any side effect) and extend the lease.

        Returns (record, True) when this call started it (fresh, or again after a definite
        failure); (the earlier record, False) when it had been started or done before; None
        when the claim was lost; and, starting nothing, a `Halt` when the automation is
        "paused" or "deleted" or the execution was "stopped" (by the automation's delete,
        or by the order of its Checkout Abandoned's checkout: `STOPPED_BY_ORDER`,
        `STOPPED_BY_RECOVERY` in `sinal.store.commerce`) — read in the transaction that
        would record the start, so no step starts after a pause, delete or stop that
        committed first."""
        ...

    def start_steps(self, starts: Sequence[StepStart]) -> list[StepStarted]:
        """`start_step` for steps of many executions at once: one transaction (concurrent
        workers' threads share it; each one's record is still committed before its step
        runs). One answer per start, in order."""
        ...

    def finish_steps(self, finishes: Sequence[StepFinish]) -> list[bool]:
        """`finish_step` for many at once: one transaction; whether each claim held.

        A step's event the database refuses to record, for its data or its schema
        (`UnstorableInput`, `SchemaViolation`), fails no record: the step is recorded as
        given, without the event's id, its `error` saying so (`unrecorded_event_error`),
        and the event is kept as a rejection, reason "refused" (`STEP_EVENT_REFUSED`), its
        id the event's, to replay once the cause is fixed."""
        ...

    def finish_step(
        self,
        claim: Claim,
        step_index: int,
        status: StepStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        event_id: UUID | None = None,
        emit: PreparedEvent | None = None,
        then: Advance | None = None,
    ) -> bool:
        """Record a step's outcome — with the event it `emit`s (its id goes on the record)
        and, when `then` is given, the execution's advance — in one transaction; False when
        the claim was lost (the emitted event is recorded even so: the step did happen)."""
        ...

    def advance(self, claim: Claim, advance: Advance) -> bool:
        """Move the execution on and release the claim; False when the claim was lost. An
        execution stopped while held (its automation deleted, its abandonment withdrawn)
        stays stopped, with its reason: so does `finish_steps`'s advance."""
        ...

    def renew_claims(self, claims: Sequence[Claim]) -> set[UUID]:
        """Extend the leases of claims still held, each by its own `lease` from now; the ids
        of the executions renewed. A lost claim stays lost, and an execution whose row
        another transaction has locked (its step being recorded) is skipped, not waited
        for: the next renewal, or the next step's start, extends it."""
        ...

    def get_execution(self, account_id: UUID, execution_id: UUID) -> Execution | None:
        """One execution with its step records."""
        ...

    def list_executions(
        self,
        account_id: UUID,
        *,
        automation_id: UUID | None = None,
        event_id: UUID | None = None,
        limit: int | None = 100,
        before: UUID | None = None,
    ) -> list[Execution]:
        """Executions, newest first (without step records): older than the execution
        `before`, when given (ids are UUIDv7: id order is creation order); all of them
        when `limit` is None."""
        ...

    def retry_dead(self, account_id: UUID | None = None, execution_id: UUID | None = None) -> int:
        """Revive dead (and unknown, when named by id) executions: pending again, now."""
        ...

    def close_open_conversation(
        self, account_id: UUID, contact_id: UUID, key: str, on_close: BuildCloseEvent
    ) -> tuple[UUID, UUID | None] | None:
        """Close the contact's open conversation and record `on_close(its id)`, in one
        transaction; the conversation's id and the event's, or None when none was open.
        Once per `key`, the event's `unique_event_id`: when that event is recorded already,
        nothing is closed, and the conversation it names comes back, with its id."""
        ...

    def backlog(self) -> Backlog:
        """What waits for the workers, by the database's clock (see `Backlog`)."""
        ...


class Notices(Protocol):
    """A store whose writers wake waiting workers with a NOTIFY (PostgreSQL)."""

    def listen(
        self,
        channels: Sequence[str],
        timeout: float = 1.0,
        on_state: Callable[[bool], None] | None = None,
    ) -> Iterator[set[str]]:
        """The channels notified, each time a NOTIFY arrives; an empty set every `timeout`
        seconds without one. A NOTIFY on "sinal_outbox" lowers the flag `arm_outbox`
        raises. `on_state(True)` once listening, `on_state(False)` when the connection
        fails or cannot be made (once an outage)."""
        ...

    def arm_outbox(self) -> None:
        """Have the next writer of outbox rows notify; returns once every writer that would
        not has committed. Call it before each look at the outbox that may be followed by
        waiting for a NOTIFY."""
        ...


# The `message` of a kept rejection of a step's event that the database refused to record,
# for its data or for its schema (`AutomationStore.finish_steps`): the step happened.
STEP_EVENT_REFUSED = (
    "the database refused to record this event of an automation step (a value, a text, a "
    "constraint or a schema sinal's validation did not foresee); the step itself happened "
    "(a message was sent, say) and is recorded completed. Replay it once the cause is fixed"
)


def unrecorded_event_error(event: PreparedEvent, outcome: Outcome) -> str:
    """The `error` of a step that happened but whose event was not recorded (`outcome`
    rejected): why, and where the event was kept, if it was."""
    why = "the database refused it" if outcome.reason == "refused" else outcome.message
    if outcome.rejection_id is None:
        kept = "it could not be kept as a rejection either (the worker's log says why)"
    else:
        kept = f"kept as rejection {outcome.rejection_id}, to replay once the cause is fixed"
    return f"the step's {event.metric_name} event was not recorded ({why}); {kept}"


# What the database refuses a step's event for, whatever the step: its data
# (`UnstorableInput`), sinal's own statement (`SchemaViolation`) or its operator's
# configuration (`StoreMisconfigured`: a privilege its role lacks). The event is kept as a
# rejection instead, so that the step's own record does not fail with it.
EVENT_REFUSALS = (UnstorableInput, SchemaViolation, StoreMisconfigured)


def refusal_outcome(
    event: PreparedEvent, cause: StoreError, unkept: StoreError | None = None
) -> Outcome:
    """The outcome of a step's event the database refused (`cause`), logged with the
    database's reason: kept as a rejection (`refusal_row`), unless the database refused
    that too (`unkept`)."""
    outcome = refused(event, cause.__cause__ or cause)
    if unkept is not None:
        log.warning("the refused event %s of account %s could not be kept either: %s",
                    event.unique_event_id, event.account_id, unkept)  # fmt: skip
        return outcome
    return outcome._replace(message=STEP_EVENT_REFUSED, rejection_id=event.id)


def refusal_row(event: PreparedEvent) -> tuple[Any, ...]:
    """A rejection row's (account_id, id, contact_id, message, source, payload) for a step's
    event the database refused, its id the event's: the payload cleaned as a step's result
    is (`storable_json`), since what was refused may be in it."""
    payload = storable_json(event.as_input())
    return (event.account_id, event.id, event.contact_id, STEP_EVENT_REFUSED, event.source,
            payload)  # fmt: skip


# What a text column cannot hold alike on both backends: NUL (PostgreSQL refuses it, in
# text and in jsonb) and surrogate code points (lone halves UTF-8 cannot encode).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str | None) -> str | None:
    """`text` with each NUL and lone surrogate replaced by U+FFFD: errors and results quote
    remote answers, which may hold anything, and a record refused for it would be lost."""
    if text is None or not _UNSTORABLE.search(text):
        return text
    return _UNSTORABLE.sub("\ufffd", text)


def storable_json(value: Any) -> Any:
    """`value` (JSON-like data) with its strings, keys included, made `storable_text`."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_json(k): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v) for v in value]
    return value


def decode_json(value: Any) -> Any:
    """JSON columns come back parsed from PostgreSQL and as text from SQLite."""
    if isinstance(value, str | bytes):
        import orjson

        return orjson.loads(value)
    return value


__all__ = [
    "Advance",
    "AutomationRow",
    "AutomationStore",
    "BuildCloseEvent",
    "ChangeAutomation",
    "Chooser",
    "Claim",
    "Execution",
    "FanOut",
    "Halt",
    "Integration",
    "Notices",
    "ResealBatch",
    "SecretTable",
    "StepFinish",
    "StepRecord",
    "StepStart",
    "StepStarted",
    "pinned",
]
