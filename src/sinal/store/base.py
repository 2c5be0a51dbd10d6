"""The storage interface: a handful of methods, each one transaction.

Backends (`SQLiteStore`, `PostgresStore`) keep their SQL to themselves and translate their
driver's errors into `sinal.errors.StoreError` (chained), so nothing above `store/` ever
sees a `sqlite3` or `psycopg` exception. One contract test suite runs against both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from importlib import resources
from typing import Any, Literal, Protocol
from uuid import UUID

from sinal.events import PreparedEvent, StoredPayload

IdentityKind = Literal["phone", "email", "external_id"]


@dataclass(frozen=True, slots=True)
class Account:
    """A tenant: every other row belongs to exactly one account."""

    id: UUID
    name: str
    timezone: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Contact:
    """A person the account talks to or sells to."""

    account_id: UUID
    id: UUID
    name: str | None
    phone: str | None
    email: str | None
    external_id: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class NewContact:
    """A contact to find by its identities, or create."""

    account_id: UUID
    id: UUID
    name: str | None = None
    phone: str | None = None
    email: str | None = None
    external_id: str | None = None

    def identities(self) -> list[tuple[IdentityKind, str]]:
        """The (kind, value) pairs that identify this contact, most specific first."""
        pairs: list[tuple[IdentityKind, str]] = []
        if self.external_id:
            pairs.append(("external_id", self.external_id))
        if self.phone:
            pairs.append(("phone", self.phone))
        if self.email:
            pairs.append(("email", self.email))
        return pairs


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the store did with one prepared event."""

    kind: Literal["created", "duplicate", "rejected"]
    event_id: UUID | None = None
    stored: StoredPayload | None = None  # for duplicates: the earlier event's payload
    reason: str | None = None
    message: str | None = None
    rejection_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event as stored."""

    account_id: UUID
    id: UUID
    contact_id: UUID
    metric_name: str
    properties: dict[str, Any]
    value: Decimal | None
    currency: str
    source: str
    source_id: str | None
    integration_id: UUID | None
    unique_event_id: str | None
    entity_type: str | None
    entity_id: str | None
    automation_execution_id: UUID | None
    occurred_at: datetime
    received_at: datetime
    schema_version: int


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One contact's running totals for one metric."""

    account_id: UUID
    contact_id: UUID
    metric_name: str
    event_count: int
    total_value: Decimal
    first_event_at: datetime
    last_event_at: datetime


@dataclass(frozen=True, slots=True)
class Rejection:
    """An input that was valid but could not be recorded, kept for inspection and replay."""

    account_id: UUID
    id: UUID
    reason: str
    message: str
    payload: dict[str, Any]
    created_at: datetime
    replayed_event_id: UUID | None = None


@dataclass(slots=True)
class RebuildReport:
    """What `rebuild_summaries` found and fixed for one account."""

    account_id: UUID
    rows: int = 0  # summary rows after the rebuild
    inserted: int = 0  # rows that were missing
    changed: int = 0  # rows whose figures were wrong
    deleted: int = 0  # rows with no events behind them
    details: list[str] = field(default_factory=list)

    @property
    def drift(self) -> int:
        """Rows that were wrong in any way."""
        return self.inserted + self.changed + self.deleted


@dataclass(frozen=True, slots=True)
class EventQuery:
    """Filters for listing events, newest first, with a keyset cursor."""

    account_id: UUID
    contact_id: UUID | None = None
    metric_name: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    # Keyset cursor: events strictly older than (occurred_at, id).
    before: tuple[datetime, UUID] | None = None
    limit: int = 100


Progress = Callable[[int, int], None]  # (done, total)


class Store(Protocol):
    """What the ledger needs from a database. Every method is one transaction."""

    def migrate(self) -> list[int]:
        """Apply pending migrations; return the versions applied (idempotent)."""
        ...

    def schema_version(self) -> int:
        """The highest applied migration version (0 on an empty database)."""
        ...

    def create_account(self, account: Account) -> None:
        """Insert an account."""
        ...

    def get_account(self, account_id: UUID) -> Account | None:
        """One account, or None."""
        ...

    def upsert_contact(self, contact: NewContact) -> tuple[Contact, bool]:
        """Find the account's contact by any identity, or create it; (contact, created)."""
        ...

    def get_contact(self, account_id: UUID, contact_id: UUID) -> Contact | None:
        """One contact of the account, or None (also for another account's id)."""
        ...

    def record(self, events: Sequence[PreparedEvent]) -> list[Outcome]:
        """Store a batch with unique `unique_event_id`s: events, metrics, summaries, outbox
        and rejections in one transaction. One outcome per event, in order."""
        ...

    def list_events(self, query: EventQuery) -> list[StoredEvent]:
        """Events matching the query, newest first."""
        ...

    def get_summary(self, account_id: UUID, contact_id: UUID | None = None) -> list[SummaryRow]:
        """Summary rows of the account (or of one contact), by contact then metric."""
        ...

    def list_rejections(self, account_id: UUID, limit: int = 100) -> list[Rejection]:
        """Kept rejections, newest first."""
        ...

    def rebuild_summaries(
        self, account_id: UUID | None = None, progress: Progress | None = None
    ) -> list[RebuildReport]:
        """Recompute summaries from events, per account; report the drift fixed."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def read_migrations(backend: str) -> list[tuple[int, str, str]]:
    """The backend's migrations as (version, name, sql), in order."""
    folder = resources.files("sinal.store") / "migrations" / backend
    found: list[tuple[int, str, str]] = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name.removesuffix(".sql"), entry.read_text()))
    return sorted(found)


def compare_summaries(
    account_id: UUID, truth: dict[tuple[Any, str], Any], kept: dict[tuple[Any, str], Any]
) -> RebuildReport:
    """Compare summaries recomputed from events (`truth`) with the stored ones (`kept`)."""
    report = RebuildReport(account_id, rows=len(truth))
    for contact, metric in truth.keys() - kept.keys():
        report.inserted += 1
        report.details.append(f"missing: contact {contact}, {metric}")
    for contact, metric in kept.keys() - truth.keys():
        report.deleted += 1
        report.details.append(f"no events behind: contact {contact}, {metric}")
    for key in truth.keys() & kept.keys():
        if truth[key] != kept[key]:
            report.changed += 1
            report.details.append(f"wrong figures: contact {key[0]}, {key[1]}")
    return report


def rejection_message(reason: str, event: PreparedEvent) -> str:
    """The human-readable sentence for a rejection reason."""
    if reason == "contact_required":
        return "contact_id is required to record an event"
    return f"contact {event.contact_id} does not exist in account {event.account_id}"
