"""The storage interface: a handful of methods, each one transaction.

Backends (`SQLiteStore`, `PostgresStore`) keep their SQL to themselves and translate their
driver's errors into `sinal.errors.StoreError` (chained), so nothing above `store/` ever
sees a `sqlite3` or `psycopg` exception. One contract test suite runs against both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from importlib import resources
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar
from uuid import UUID

from sinal.errors import StoreError, UnstorableInput
from sinal.events import EventKey, PreparedEvent, StoredPayload
from sinal.store.respelling import Unrespelled

IdentityKind = Literal["phone", "email", "external_id"]
ContactField = Literal["name", "phone", "email", "external_id"]
Measurement = Literal["count", "sum_value", "unique_contacts"]

# Seconds a call waits for the database by default before `StoreUnavailable`: for a
# PostgreSQL connection from the pool, for SQLite's write lock (SINAL_DATABASE_WAIT).
DEFAULT_WAIT = 30.0
log = logging.getLogger("sinal.store")


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


# A contact's columns, in the order `Contact` takes them (both backends).
CONTACT_COLUMNS = "account_id, id, name, phone, email, external_id, created_at, updated_at"


def qualified(columns: str, alias: str) -> str:
    """`columns` (a list such as `CONTACT_COLUMNS`), each named through table `alias`."""
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


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


class Outcome(NamedTuple):
    """What the store did with one prepared event. (A tuple: a streamed batch makes one per
    event while it feeds the COPY, at a third of a frozen dataclass's cost.)"""

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
    """One contact's running totals for one metric in one currency: its events of that
    metric whose `currency` is this one (an event without a value carries one too, BRL
    unless given). A total never adds two currencies' values: a contact who paid in BRL
    and in USD has a row for each (migration 0031)."""

    account_id: UUID
    contact_id: UUID
    metric_name: str
    currency: str  # ISO 4217, of `total_value` and of every event the row counts
    event_count: int
    total_value: Decimal | None  # None: none of the events carried a value (SUM's NULL)
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

    def add(self, part: RebuildReport) -> None:
        """Count in what one chunk of the account's contacts found."""
        self.rows += part.rows
        self.inserted += part.inserted
        self.changed += part.changed
        self.deleted += part.deleted
        self.details.extend(part.details)


# Contacts per transaction of `rebuild_summaries`: their summary rows are recounted while
# their writers wait (read at each call, so a test can lower it here).
REBUILD_CONTACTS = 500
# Account ids read per query by `rebuild_summaries` of every account (read at each call).
REBUILD_ACCOUNTS = 1000
_Row = TypeVar("_Row")


def read_pages(read: Callable[[_Row | None], list[_Row]], size: int) -> Iterator[list[_Row]]:
    """Every row of a list read by keyset, a page at a time: `read(None)` the first page,
    `read(its last row)` the next, until one of fewer than `size` rows."""
    page = read(None)
    while page:
        yield page
        page = read(page[-1]) if len(page) == size else []


def every_account(read: Callable[[Any, int], list[Any]]) -> Iterator[Any]:
    """Every account's id, in order of id, `REBUILD_ACCOUNTS` at a time: `read(after,
    limit)` reads the first `limit` ids after `after` (None: from the first). Only a page
    is held, and an account made meanwhile comes (its id, time-ordered, is the last)."""
    size = REBUILD_ACCOUNTS
    for page in read_pages(lambda after: read(after, size), size):
        yield from page


def rebuild_accounts(
    accounts: Iterable[Any],
    contacts: int,
    step: Callable[[Any, Any], tuple[list[Any], RebuildReport]],
    progress: Progress | None,
) -> Iterator[RebuildReport]:
    """`rebuild_summaries` over `accounts` (ids as the store keeps them), whose contacts
    number `contacts`: each account's contacts in order of id, `REBUILD_CONTACTS` at a
    time, and its report once they are all recounted. `step(account, after)` recounts,
    in a transaction of its own, the account's next contacts after `after` (None: from
    the first) and answers them with what it found; `progress(done, total)` counts
    contacts (more may be made meanwhile)."""
    done = 0
    for account in accounts:
        report = RebuildReport(UUID(str(account)))
        after = None
        while True:
            chunk, found = step(account, after)
            report.add(found)
            done += len(chunk)
            if progress is not None:
                progress(done, max(contacts, done))
            if len(chunk) < REBUILD_CONTACTS:
                break
            after = chunk[-1]
        yield report


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
    # The events an automation execution emitted.
    automation_execution_id: UUID | None = None


@dataclass(frozen=True, slots=True)
class ContactQuery:
    """Filters for listing an account's contacts, oldest first (by id), with a keyset
    cursor. Values are compared as contacts store them: build it with
    `sinal.ledger.contact_query`, which normalizes them."""

    account_id: UUID
    email: str | None = None
    phone: str | None = None
    external_id: str | None = None
    tag: str | None = None
    # Keyset cursor: contacts whose id is greater.
    after: UUID | None = None
    limit: int = 100


@dataclass(frozen=True, slots=True)
class ListedContact:
    """A contact of a list, with its tags (sorted as `Store.list_tags` sorts them)."""

    contact: Contact
    tags: tuple[str, ...]

    @property
    def id(self) -> UUID:
        """The contact's id (a page's cursor is its last row's)."""
        return self.contact.id


# An identity filter's lookup: at most one contact has each (kind, value).
_HOLDER = (
    "(SELECT contact_id FROM contact_identities "
    "WHERE account_id = {p} AND kind = '{kind}' AND value = {p})"
)


def contacts_page_sql(query: ContactQuery, p: str, tags: str = "") -> tuple[str, list[Any]]:
    """`Store.list_contacts`' statement in the backend's placeholder `p`, selecting
    `CONTACT_COLUMNS` (through alias `c`) and then `tags`, and its parameters (ids as
    UUIDs). Each read is an index range: the account's contacts by their key; a tag's by
    `contact_tags_tag` (account_id, tag, contact_id), in id order (migration 0027); an
    identity's contact by `contact_identities`' key."""
    args: list[Any] = [query.account_id]
    if query.tag is None:
        key, source, where = "c.id", "contacts c", [f"c.account_id = {p}"]
    else:
        key = "g.contact_id"
        source = ("contact_tags g JOIN contacts c "
                  "ON c.account_id = g.account_id AND c.id = g.contact_id")  # fmt: skip
        where = [f"g.account_id = {p}", f"g.tag = {p}"]
        args.append(query.tag)
    for kind in ("external_id", "phone", "email"):
        value = getattr(query, kind)
        if value is not None:
            where.append(f"{key} = " + _HOLDER.format(p=p, kind=kind))
            args.extend([query.account_id, value])
    if query.after is not None:
        where.append(f"{key} > {p}")
        args.append(query.after)
    statement = (
        f"SELECT {qualified(CONTACT_COLUMNS, 'c')}{tags} FROM {source} "
        f"WHERE {' AND '.join(where)} ORDER BY {key} LIMIT {p}"
    )
    return statement, [*args, query.limit]


class FeedPosition(NamedTuple):
    """A place in an account's change feed, just after the event it names.

    `arrival` orders events by when they became visible, not by `occurred_at`: on
    PostgreSQL the id of the transaction that wrote the event (`events.tx`), on SQLite
    the number its commit gave it (`events.seq`); `event_id` orders the events of one
    transaction. Both backends' feeds start at `FEED_START`."""

    arrival: int
    event_id: UUID


FEED_START = FeedPosition(0, UUID(int=0))


@dataclass(frozen=True, slots=True)
class FeedPage:
    """Events after a feed position, in the order they arrived, and the position after
    the last of them (the one asked for, when there are none)."""

    events: list[StoredEvent]
    next: FeedPosition
    has_more: bool  # whether more events can be read at once from `next`


def feed_page(after: FeedPosition, limit: int, rows: Sequence[tuple[int, StoredEvent]]) -> FeedPage:
    """The page of a feed read for `limit` events that fetched up to `limit + 1` rows of
    (arrival, event), in feed order."""
    events = [event for _, event in rows[:limit]]
    if not events:
        return FeedPage([], after, has_more=False)
    arrival, last = rows[len(events) - 1]
    return FeedPage(events, FeedPosition(arrival, last.id), has_more=len(rows) > limit)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as stored: only the SHA-256 of its text is kept."""

    account_id: UUID
    id: UUID
    key_hash: str  # lowercase hex
    hint: str  # the key's last characters, to tell keys apart
    name: str | None
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def is_active(self) -> bool:
        """Whether the key still authenticates."""
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class MetricInfo:
    """One of an account's metrics, with how many events it has."""

    name: str
    category: str
    is_system: bool
    event_count: int
    created_at: datetime


@dataclass(frozen=True, slots=True)
class AggregateQuery:
    """One metric measured per time bucket (and per property value, with `by`).

    `starts` are the buckets' first instants, ascending; bucket i holds the events with
    starts[i] <= occurred_at < starts[i + 1] (the last one up to `until`). Only events
    with since <= occurred_at < until count.

    `currency` given, only the events in that currency count. A `sum_value` never adds two
    currencies' values: its cells are per currency (of the events with a value).
    """

    account_id: UUID
    metric_name: str
    measurement: Measurement
    starts: tuple[datetime, ...]
    since: datetime
    until: datetime
    by: str | None = None
    currency: str | None = None


@dataclass(frozen=True, slots=True)
class AggregateCell:
    """One non-empty (bucket, group) of an aggregate: bucket is an index into `starts`.
    For `sum_value`, a cell per currency of the values summed (`currency`).
    """

    bucket: int
    group: str | None
    value: int | Decimal
    currency: str | None = None  # `sum_value`'s: the currency of `value`


@dataclass(frozen=True, slots=True)
class Replay:
    """What replaying a kept rejection did.

    `outcome` is None when the cause persists (nothing was written), and `reason` then
    names it as an emit would: `contact_required` (the event still names no contact) or
    `contact_not_found`. `earlier` says the rejection had been replayed before, and
    `outcome` is then that replay's event.
    """

    rejection: Rejection
    outcome: Outcome | None
    earlier: bool = False
    reason: str | None = None

    @classmethod
    def refused(cls, rejection: Rejection, event: PreparedEvent) -> Replay:
        """Nothing written: `event`, the replay's, has no contact or an unknown one."""
        return cls(rejection, None, reason=contact_reason(event))


BuildEvent = Callable[[Contact], PreparedEvent]
BuildChangeEvent = Callable[[Contact, Contact], PreparedEvent]
BuildTagEvent = Callable[[str], PreparedEvent]
BuildReplayEvent = Callable[[Rejection], PreparedEvent]

Progress = Callable[[int, int], None]  # (done, total)


# A round's events and outcomes -> the events of the next round, in the same transaction
# (none: the batch is done). See `Store.record`.
Settle = Callable[[Sequence[PreparedEvent], list[Outcome]], Sequence[PreparedEvent]]


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
        """Find the account's contact by any identity, or create it; (contact, created).
        `AccountNotFound` (nothing written) when there is no such account."""
        ...

    def get_contact(self, account_id: UUID, contact_id: UUID) -> Contact | None:
        """One contact of the account, or None (also for another account's id)."""
        ...

    def find_contacts(self, contact: NewContact) -> dict[IdentityKind, Contact]:
        """The contact each of `contact`'s identities names in its account, most specific
        first (one read: no write transaction, no writer's lock)."""
        ...

    def older_spellings(self, account_id: UUID) -> list[Unrespelled]:
        """The account's emails and external ids stored in a spelling sinal no longer
        stores, which migration 0032 left (refused now, or another contact's form now)."""
        ...

    def record(
        self, events: Sequence[PreparedEvent], settle: Settle | None = None
    ) -> list[Outcome]:
        """Store a batch with unique `unique_event_id`s: events, metrics, summaries, outbox
        and rejections in one transaction. One outcome per event, in order.

        With `settle`, the store calls it with each round's events and outcomes, this
        first round's included, and records the events it returns (repeats of a key
        whose earlier occurrence was rejected) in the same transaction as the next round,
        until it returns none: all the rounds commit, or none does. A transaction redone
        starts again from the first round.

        When the database refuses the batch for the data of some of its events
        (`UnstorableInput`), the batch is recorded again in one transaction, in parts, down
        to those events: they come back rejected, reason "refused" (`refused`), and the
        others are recorded as if they were not there."""
        ...

    def record_chunks(
        self,
        chunks: Iterable[Sequence[PreparedEvent]],
        keys: Sequence[EventKey],
        early: Callable[[list[Outcome]], None] | None = None,
        settle: Settle | None = None,
    ) -> list[Outcome]:
        """`record` for the events of every chunk together (one transaction), pulling each
        chunk only when ready for it. One outcome per event, in order. `keys` identify
        every item of the batch (`identify`, invalid items included) before any chunk is
        validated: what the store may look up first. `settle` as for `record`, its first
        round being every chunk's events, in order.

        The store may call `early` with the outcomes once they are known, while the
        transaction commits, so the caller's work overlaps the database's. If the commit
        then fails and the batch is redone, the outcomes returned are another list."""
        ...

    def list_events(self, query: EventQuery) -> list[StoredEvent]:
        """Events matching the query, newest first."""
        ...

    def list_contacts(self, query: ContactQuery) -> list[ListedContact]:
        """The account's contacts matching the query, oldest first, each with its tags
        (one read)."""
        ...

    def read_feed(self, account_id: UUID, after: FeedPosition, limit: int) -> FeedPage:
        """Up to `limit` of the account's events after `after`, in the order they arrived:
        read again from each page's `next`, a poller gets every committed event once,
        however late its `occurred_at` and whichever transactions commit first."""
        ...

    def get_summary(self, account_id: UUID, contact_id: UUID | None = None) -> list[SummaryRow]:
        """Summary rows of the account (or of one contact), by contact, metric, currency."""
        ...

    def list_rejections(
        self, account_id: UUID, limit: int = 100, before: UUID | None = None
    ) -> list[Rejection]:
        """Kept rejections, newest first (older than the rejection `before`, when given)."""
        ...

    def rebuild_summaries(
        self, account_id: UUID | None = None, progress: Progress | None = None
    ) -> Iterator[RebuildReport]:
        """Recompute summaries from events, per account, each account's report (the drift
        fixed) once it is done; accounts are read a page at a time as it goes.
        `progress(done, total)` counts contacts recounted."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...

    # -- added for the HTTP service ---------------------------------------------------

    def list_accounts(self, limit: int = 100, after: Account | None = None) -> list[Account]:
        """Accounts, oldest first (an operator's view across tenants); those after `after`,
        the last of the previous page."""
        ...

    def update_account(
        self, account_id: UUID, name: str | None, timezone: str | None
    ) -> Account | None:
        """Change an account's name and/or timezone (None: unchanged); None if no account."""
        ...

    def create_api_key(self, key: ApiKey) -> None:
        """Insert an API key."""
        ...

    def find_api_key(self, account_id: UUID, key_hash: str) -> ApiKey | None:
        """The account's key with this hash (revoked ones too), or None."""
        ...

    def list_api_keys(
        self, account_id: UUID, limit: int | None = None, after: ApiKey | None = None
    ) -> list[ApiKey]:
        """The account's keys, oldest first: the first `limit` (None: every one) after
        `after`, the last of the previous page, when given."""
        ...

    def revoke_api_key(self, key_id: UUID, when: datetime) -> ApiKey | None:
        """Revoke a key by id (an operator's command; idempotent); None if no such key."""
        ...

    def upsert_contact_recorded(
        self, contact: NewContact, on_create: BuildEvent
    ) -> tuple[Contact, bool]:
        """`upsert_contact`, also recording `on_create(contact)` in the same transaction
        when the contact is new."""
        ...

    def update_contact(
        self,
        account_id: UUID,
        contact_id: UUID,
        changes: Mapping[ContactField, str | None],
        on_change: BuildChangeEvent,
        *,
        only_missing: bool = False,
    ) -> Contact | None:
        """Apply normalized changes (None removes a value) and record `on_change(before,
        after)` in the same transaction, only if something changed. None if no contact;
        raises `IdentityConflict` when an identity names another contact. `only_missing`:
        only the fields the contact has no value for, as it is when locked, change."""
        ...

    def change_tags(
        self,
        account_id: UUID,
        contact_id: UUID,
        tags: Sequence[str],
        *,
        add: bool,
        on_change: BuildTagEvent,
    ) -> list[str] | None:
        """Add (or remove) tags and record `on_change(tag)` for each tag that changed, in
        one transaction; the changed tags, or None if no contact."""
        ...

    def list_tags(self, account_id: UUID, contact_id: UUID) -> list[str]:
        """A contact's tags, sorted."""
        ...

    def get_event(self, account_id: UUID, event_id: UUID) -> StoredEvent | None:
        """One event of the account, or None (also for another account's id)."""
        ...

    def find_event(self, account_id: UUID, unique_event_id: str) -> StoredEvent | None:
        """The account's event with this `unique_event_id` (by its unique key), or None."""
        ...

    def list_metrics(
        self,
        account_id: UUID,
        name: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[MetricInfo]:
        """The account's metrics (or the one named), by name (code point order), with their
        event counts: the first `limit` (None: every one) named after `after`, when given."""
        ...

    def has_metric(self, account_id: UUID, name: str) -> bool:
        """Whether the account has a metric of this name (its row alone: nothing counted)."""
        ...

    def aggregate(self, query: AggregateQuery) -> list[AggregateCell]:
        """The non-empty cells of an aggregate (see `AggregateQuery`)."""
        ...

    def replay_rejection(
        self, account_id: UUID, rejection_id: UUID, build: BuildReplayEvent
    ) -> Replay | None:
        """Record `build(rejection)` and mark the rejection replayed, in one transaction
        that holds the rejection's lock (two replays never store two events). Nothing is
        written when the event's contact still does not exist. None if no rejection."""
        ...


def read_migrations(backend: str) -> list[tuple[int, str, str]]:
    """The backend's migrations as (version, name, sql), in order."""
    folder = resources.files("sinal.store") / "migrations" / backend
    found: list[tuple[int, str, str]] = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            text = entry.read_text(encoding="utf-8")  # 0032 names "ａ" and "ﬁ"
            found.append((version, entry.name.removesuffix(".sql"), text))
    return sorted(found)


def latest_schema_version(backend: str) -> int:
    """The version of the newest migration this code has for a store's `backend`."""
    return max(v for v, _, _ in read_migrations("sqlite" if backend == "sqlite" else "postgres"))


SummaryKey = tuple[UUID, UUID | None, str, str]  # account, contact, metric, currency


def summary_deltas(created: Iterable[PreparedEvent]) -> dict[SummaryKey, list[Any]]:
    """What newly stored events add to each summary row, by (account, contact, metric,
    currency), in order of first appearance: [event count, total value (None when none of
    them has a value), first and last occurred_at, the id of the first of them].

    That id becomes the row's own when these events create the row. A summary row's `id`
    is the id of an event that created it: unique, since an event adds to one row only,
    and free, where a new id cost every row of a batch (the upsert makes one per row
    before it finds the row exists: ~0.4 ms of PostgreSQL's ~2 ms for a batch's ~320
    summary rows). Nothing refers to it; the seed's model has it. Rebuilt rows get new
    ones."""
    deltas: dict[SummaryKey, list[Any]] = {}
    for e in created:
        delta = deltas.get(key := (e.account_id, e.contact_id, e.metric_name, e.currency))
        if delta is None:
            deltas[key] = [1, e.value, e.occurred_at, e.occurred_at, e.id]
        else:
            delta[0] += 1
            delta[1] = add_values(delta[1], e.value)
            delta[2] = min(delta[2], e.occurred_at)
            delta[3] = max(delta[3], e.occurred_at)
    return deltas


def add_values(total: Decimal | None, value: Decimal | None) -> Decimal | None:
    """A summary's total with `value` added, as SQL's SUM adds: None (no value) only while
    both are."""
    if value is None:
        return total
    return value if total is None else total + value


def compare_summaries(
    account_id: UUID,
    truth: dict[tuple[Any, str, str], Any],
    kept: dict[tuple[Any, str, str], Any],
) -> RebuildReport:
    """Compare summaries recomputed from events (`truth`) with the stored ones (`kept`),
    both by (contact, metric, currency)."""
    report = RebuildReport(account_id, rows=len(truth))
    for contact, metric, currency in truth.keys() - kept.keys():
        report.inserted += 1
        report.details.append(f"missing: contact {contact}, {metric} in {currency}")
    for contact, metric, currency in kept.keys() - truth.keys():
        report.deleted += 1
        report.details.append(f"no events behind: contact {contact}, {metric} in {currency}")
    for contact, metric, currency in truth.keys() & kept.keys():
        if truth[(contact, metric, currency)] != kept[(contact, metric, currency)]:
            report.changed += 1
            report.details.append(f"wrong figures: contact {contact}, {metric} in {currency}")
    return report


def changed_fields(
    before: Contact, changes: Mapping[ContactField, str | None], *, only_missing: bool
) -> dict[str, str | None]:
    """The changes that change `before` (`only_missing`: only where it has no value).

    Read under the contact's lock: a value a concurrent writer gave it since the caller
    last read it is kept, not overwritten."""
    return {
        k: v
        for k, v in changes.items()
        if getattr(before, k) != v and (not only_missing or getattr(before, k) is None)
    }


def contact_reason(event: PreparedEvent) -> str:
    """Why `event`, whose contact was not found, is refused: it names none, or an unknown one."""
    return "contact_required" if event.contact_id is None else "contact_not_found"


# The one text of `contact_required`, for every caller (the library names a contact by
# `contact_id` only, the HTTP API by `contact_id` or by a `contact` object): PostgreSQL's
# record statement writes it too (`sinal.store.postgres`).
CONTACT_REQUIRED_MESSAGE = (
    "an event needs a contact: give contact_id (or, over HTTP, a contact object with a "
    "phone, email or external_id)"
)


def account_missing(event: PreparedEvent) -> Outcome:
    """The outcome of an event whose account does not exist: rejected, reason
    "account_not_found", and kept nowhere, as a rejection under that account is one no
    list can show (only the library can name an account; a key is of its account)."""
    message = f"account {event.account_id} does not exist"
    return Outcome("rejected", reason="account_not_found", message=message)


def rejection_message(reason: str, event: PreparedEvent) -> str:
    """The human-readable sentence for a rejection reason."""
    if reason == "contact_required":
        return CONTACT_REQUIRED_MESSAGE
    return f"contact {event.contact_id} does not exist in account {event.account_id}"


# A refused event's message: the database's own (`UnstorableInput`'s cause, in the log)
# may name tables and quote data, and goes to no answer.
REFUSED_MESSAGE = (
    "the database refused this event's data (a value, a text or a constraint sinal's "
    "validation did not foresee): it was not recorded, and sending it again fails alike"
)


def refused(event: PreparedEvent, cause: BaseException) -> Outcome:
    """The outcome of an event the database refused (`UnstorableInput`) when its batch was
    recorded again in parts: rejected, reason "refused", not kept (the data the database
    refused may be in its kept payload too). Logged, with the database's reason: it names
    a check validation lacks."""
    reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:500]
    log.warning(
        "the database refused event %s of account %s, answered rejected (refused): %s",
        event.unique_event_id or event.id, event.account_id, reason,
    )  # fmt: skip
    return Outcome("rejected", reason="refused", message=REFUSED_MESSAGE)


C = TypeVar("C")  # a backend's connection


@dataclass(frozen=True, slots=True)
class Refusals(Generic[C]):
    """What each backend's `_record_isolated` (the one way a batch the database refused is
    recorded again, its refused events isolated, each part under a savepoint) does with a
    refusal: the errors it isolates (`isolated`); how it splits the batch (`split`:
    "halves", the batch first, then its halves down to the events refused; "events", each
    event alone at once); and the outcome of an event refused alone (`outcome`, given the
    transaction's connection, the event and the error), written in the same transaction."""

    isolated: tuple[type[StoreError], ...]
    split: Literal["halves", "events"]
    outcome: Callable[[C, PreparedEvent, StoreError], Outcome]

    def record(
        self,
        conn: C,
        events: Sequence[PreparedEvent],
        attempt: Callable[[Sequence[PreparedEvent]], list[Outcome]],
    ) -> list[Outcome]:
        """`attempt(events)` (a backend's: the part recorded under a savepoint), split as
        `split` says down to the events refused with one of `isolated`, each of which gets
        `outcome`."""
        if self.split == "events" and len(events) > 1:
            return [o for event in events for o in self.record(conn, [event], attempt)]
        try:
            return attempt(events)
        except self.isolated as exc:
            if len(events) == 1:
                return [self.outcome(conn, events[0], exc)]
        half = len(events) // 2
        return self.record(conn, events[:half], attempt) + self.record(conn, events[half:], attempt)


def _answered(conn: object, event: PreparedEvent, error: StoreError) -> Outcome:
    return refused(event, error.__cause__ or error)


# Ingest's refusals (`Store.record`): an event whose data the database refuses is answered
# rejected ("refused") and not kept, as its sender holds it and is told. A statement
# refused as sinal's own fault (`SchemaViolation`) is no event's: it fails the whole call
# (the API's 500), where "refused" would tell the sender to change an input that is fine.
# In halves: a batch is up to thousands of events, a refusal one event's data (PostgreSQL,
# 500 events, one refused: 19 parts, 2.5-4x less time than 500 one-event parts).
# An automation step's event is kept instead, as a rejection, `SchemaViolation` and
# `StoreMisconfigured` too (`EVENT_REFUSALS`): its
# step happened (a message went out) and nobody else holds it, so its record must not fail
# with it (left `started`, the send would end `unknown`, its WAMID lost). And event by
# event: a batch of steps is at most a worker's threads (`concurrency`, 32), and what is
# refused there is as likely all of a metric's events (a schema changed under sinal) as
# one; halving a batch whose every event is refused takes 2n - 1 parts, each a multi-event
# statement (PostgreSQL, 32 of 32 refused: 3-4x the time of 32 one-event parts; one of 32:
# no difference the noise let show). Each backend's automation store names those refusals
# (`_STEP_REFUSALS`; `AutomationStore.finish_steps`).
ANSWERED: Refusals[Any] = Refusals((UnstorableInput,), "halves", _answered)
