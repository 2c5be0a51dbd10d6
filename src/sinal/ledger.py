"""The ledger: `emit_event` and `emit_many` over a store, one transaction per call.

The seed's flow (validate contact → upsert metric → dedup → insert → dispatch), with the
dispatch written to the outbox in the same transaction instead of fired and forgotten.
`AsyncLedger` runs the same code in worker threads, so asyncio callers never block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sinal.contacts import Identities, InvalidIdentities, InvalidIdentity, normalize_name
from sinal.errors import (
    AccountNotFound,
    FieldError,
    InvalidAccount,
    InvalidContact,
    InvalidEvent,
)
from sinal.events import (
    Clock,
    EmitEvent,
    EmitResult,
    PreparedEvent,
    StoredPayload,
    differs_from,
    prepare,
    utcnow,
)
from sinal.ids import new_id
from sinal.store import open_store
from sinal.store.base import (
    Account,
    Contact,
    EventQuery,
    NewContact,
    Outcome,
    Progress,
    RebuildReport,
    Rejection,
    Store,
    StoredEvent,
    SummaryRow,
)

MAX_BATCH = 1000
DEFAULT_TIMEZONE = "America/Sao_Paulo"


class Ledger:
    """Records events for many accounts in one store."""

    def __init__(self, store: Store, *, clock: Clock = utcnow) -> None:
        self.store = store
        self.clock = clock

    # -- schema and tenants ------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending schema migrations (idempotent); return the versions applied."""
        return self.store.migrate()

    def schema_version(self) -> int:
        """The applied schema version."""
        return self.store.schema_version()

    def create_account(self, name: str, *, timezone: str = DEFAULT_TIMEZONE) -> Account:
        """Create an account (a tenant)."""
        errors: list[FieldError] = []
        clean = normalize_name(name) if isinstance(name, str) else None
        if not clean:
            errors.append(FieldError("name", "required", "an account needs a name"))
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            errors.append(FieldError("timezone", "invalid_timezone", f"unknown zone {timezone}"))
        if errors:
            raise InvalidAccount(errors)
        account = Account(new_id(), str(clean), timezone, self.clock())
        self.store.create_account(account)
        return account

    def get_account(self, account_id: UUID | str) -> Account | None:
        """One account, or None."""
        return self.store.get_account(_uuid(account_id))

    def create_contact(
        self,
        account_id: UUID | str,
        *,
        phone: str | None = None,
        email: str | None = None,
        external_id: str | None = None,
        name: str | None = None,
    ) -> Contact:
        """Find the account's contact by any identity given, or create it."""
        contact, _ = self.upsert_contact(
            account_id, phone=phone, email=email, external_id=external_id, name=name
        )
        return contact

    def upsert_contact(
        self,
        account_id: UUID | str,
        *,
        phone: str | None = None,
        email: str | None = None,
        external_id: str | None = None,
        name: str | None = None,
    ) -> tuple[Contact, bool]:
        """Like `create_contact`, also telling whether the contact is new."""
        try:
            ids = Identities.parse(phone=phone, email=email, external_id=external_id)
            clean_name = normalize_name(name)
        except InvalidIdentities as exc:
            raise InvalidContact([_field_error(e) for e in exc.errors]) from exc
        except InvalidIdentity as exc:
            raise InvalidContact([_field_error(exc)]) from exc
        account = _uuid(account_id)
        if self.store.get_account(account) is None:
            raise AccountNotFound(f"account {account} does not exist")
        new = NewContact(account, new_id(), clean_name, ids.phone, ids.email, ids.external_id)
        return self.store.upsert_contact(new)

    def get_contact(self, account_id: UUID | str, contact_id: UUID | str) -> Contact | None:
        """One contact of the account, or None (another account's id included)."""
        return self.store.get_contact(_uuid(account_id), _uuid(contact_id))

    # -- events ------------------------------------------------------------------------

    def emit_event(self, **params: Any) -> EmitResult:
        """Record one event; the keyword arguments are `EmitEvent`'s fields.

        Raises `InvalidEvent` (one entry per bad field) and writes nothing when the input
        is malformed; a valid event that cannot be recorded comes back `rejected`.
        """
        return self.emit(EmitEvent(**params))

    def emit(self, event: EmitEvent) -> EmitResult:
        """Record one `EmitEvent` (see `emit_event`)."""
        prepared = prepare(event, self.clock())
        outcome = self.store.record([prepared])[0]
        return _result(prepared, outcome)

    def emit_many(self, events: Sequence[EmitEvent]) -> list[EmitResult]:
        """Record up to 1,000 events in one transaction; one result per item, in order.

        Invalid items come back `rejected` with reason "invalid" and their field errors;
        the valid ones are recorded. Within the batch the first of a unique id wins.
        """
        if len(events) > MAX_BATCH:
            raise InvalidEvent(
                [FieldError("events", "too_many", f"a batch holds at most {MAX_BATCH} events")]
            )
        now = self.clock()
        results: list[EmitResult | None] = [None] * len(events)
        valid: list[tuple[int, PreparedEvent]] = []
        for i, event in enumerate(events):
            try:
                valid.append((i, prepare(event, now)))
            except InvalidEvent as exc:
                results[i] = EmitResult(
                    "rejected", reason="invalid", message=str(exc), errors=exc.errors
                )
        self._record_rounds(valid, results)
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def record_prepared(self, events: Sequence[PreparedEvent]) -> list[EmitResult]:
        """Record already validated events in one transaction (used by group commit)."""
        results: list[EmitResult | None] = [None] * len(events)
        self._record_rounds(list(enumerate(events)), results)
        return results  # type: ignore[return-value]

    def _record_rounds(
        self, items: list[tuple[int, PreparedEvent]], results: list[EmitResult | None]
    ) -> None:
        """Record the first occurrence of each unique id; settle the repeats against it."""
        first: dict[tuple[UUID, str], int] = {}
        batch: list[tuple[int, PreparedEvent]] = []
        repeats: list[tuple[int, PreparedEvent, int]] = []
        for i, event in items:
            key = (
                None if event.unique_event_id is None else (event.account_id, event.unique_event_id)
            )
            if key is not None and key in first:
                repeats.append((i, event, first[key]))
                continue
            if key is not None:
                first[key] = i
            batch.append((i, event))
        if not batch:
            return
        payloads: dict[int, StoredPayload] = {}
        for (i, event), outcome in zip(
            batch, self.store.record([e for _, e in batch]), strict=True
        ):
            results[i] = _result(event, outcome)
            payloads[i] = outcome.stored or _payload(event)
        retry: list[tuple[int, PreparedEvent]] = []
        for i, event, j in repeats:
            earlier = results[j]
            assert earlier is not None
            if earlier.status == "rejected":
                retry.append((i, event))  # the first could not be stored: the next one may
            else:
                results[i] = replace(
                    earlier, status="duplicate", differs=differs_from(event, payloads[j])
                )
        self._record_rounds(retry, results)

    # -- queries and maintenance -------------------------------------------------------

    def list_events(self, query: EventQuery) -> list[StoredEvent]:
        """Events matching the query, newest first."""
        return self.store.list_events(query)

    def get_summary(
        self, account_id: UUID | str, contact_id: UUID | str | None = None
    ) -> list[SummaryRow]:
        """The per-contact metric summaries of an account (or of one contact)."""
        contact = None if contact_id is None else _uuid(contact_id)
        return self.store.get_summary(_uuid(account_id), contact)

    def list_rejections(self, account_id: UUID | str, limit: int = 100) -> list[Rejection]:
        """What was not recorded and why, newest first."""
        return self.store.list_rejections(_uuid(account_id), limit)

    def rebuild_summaries(
        self, account_id: UUID | str | None = None, progress: Progress | None = None
    ) -> list[RebuildReport]:
        """Recompute `contact_metrics_summary` from events; report the drift fixed."""
        account = None if account_id is None else _uuid(account_id)
        return self.store.rebuild_summaries(account, progress)

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncLedger:
    """The same ledger for asyncio code: each call runs in a worker thread."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def emit_event(self, **params: Any) -> EmitResult:
        """See `Ledger.emit_event`."""
        return await asyncio.to_thread(self.ledger.emit_event, **params)

    async def emit(self, event: EmitEvent) -> EmitResult:
        """See `Ledger.emit`."""
        return await asyncio.to_thread(self.ledger.emit, event)

    async def emit_many(self, events: Sequence[EmitEvent]) -> list[EmitResult]:
        """See `Ledger.emit_many`."""
        return await asyncio.to_thread(self.ledger.emit_many, events)

    async def create_contact(self, account_id: UUID | str, **identities: str | None) -> Contact:
        """See `Ledger.create_contact`."""
        return await asyncio.to_thread(self.ledger.create_contact, account_id, **identities)

    async def get_summary(
        self, account_id: UUID | str, contact_id: UUID | str | None = None
    ) -> list[SummaryRow]:
        """See `Ledger.get_summary`."""
        return await asyncio.to_thread(self.ledger.get_summary, account_id, contact_id)


def connect(url: str, *, clock: Clock = utcnow) -> Ledger:
    """A ledger on the database at `url` ("sqlite:///path.db" or "postgresql://...")."""
    return Ledger(open_store(url), clock=clock)


def _result(event: PreparedEvent, outcome: Outcome) -> EmitResult:
    if outcome.kind == "duplicate":
        assert outcome.stored is not None
        return EmitResult(
            "duplicate",
            event_id=outcome.event_id,
            unique_event_id=event.unique_event_id,
            differs=differs_from(event, outcome.stored),
        )
    if outcome.kind == "rejected":
        return EmitResult(
            "rejected",
            unique_event_id=event.unique_event_id,
            reason=outcome.reason,
            message=outcome.message,
            rejection_id=outcome.rejection_id,
        )
    return EmitResult("created", event_id=outcome.event_id, unique_event_id=event.unique_event_id)


def _payload(event: PreparedEvent) -> StoredPayload:
    return StoredPayload(
        event.metric_name, event.properties, event.value, event.currency, event.occurred_at
    )


def _field_error(error: InvalidIdentity) -> FieldError:
    return FieldError(error.field, error.code, error.message)


def _uuid(value: UUID | str) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))
