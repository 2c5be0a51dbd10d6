"""The ledger: `emit_event` and `emit_many` over a store, one transaction per call.

The seed's flow (validate contact → upsert metric → dedup → insert → dispatch), with the
dispatch written to the outbox in the same transaction instead of fired and forgotten.
`sinal.aio.AsyncLedger` runs it for asyncio code.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any, cast
from uuid import UUID

from sinal.aggregates import (
    Aggregate,
    Interval,
    bucket_starts,
    check_range,
    densify,
    parse_currency,
    parse_zone,
    property_key,
    sum_currency,
)
from sinal.auth import DEFAULT_SCOPES, generate_key, hash_key, key_account
from sinal.catalog import (
    METRIC_CONTACT_CREATED,
    METRIC_CONTACT_UPDATED,
    METRIC_TAG_ADDED,
    METRIC_TAG_REMOVED,
)
from sinal.contacts import (
    Identities,
    InvalidIdentities,
    InvalidIdentity,
    normalize_contact_fields,
    normalize_name,
    normalize_tag,
)
from sinal.errors import (
    AccountNotFound,
    FieldError,
    IdentityConflict,
    InvalidAccount,
    InvalidContact,
    InvalidEvent,
    InvalidQuery,
    SchemaOutOfDate,
    SinalError,
)
from sinal.events import (
    Clock,
    EmitEvent,
    EmitResult,
    EventKey,
    PreparedEvent,
    StoredPayload,
    differs_from,
    differs_from_earlier,
    identify,
    normalize_metric_name,
    prepare,
    utcnow,
    uuid_error,
)
from sinal.ids import new_id
from sinal.keyring import Keyring
from sinal.store import DEFAULT_WAIT, open_store
from sinal.store.base import (
    FEED_START,
    Account,
    AggregateQuery,
    ApiKey,
    BuildEvent,
    Contact,
    ContactField,
    ContactQuery,
    EventQuery,
    FeedPage,
    FeedPosition,
    ListedContact,
    Measurement,
    MetricInfo,
    NewContact,
    Outcome,
    Progress,
    RebuildReport,
    Rejection,
    Replay,
    Store,
    StoredEvent,
    SummaryRow,
    latest_schema_version,
)
from sinal.store.erasure import ErasureStore
from sinal.store.respelling import Unrespelled

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

    def check_schema(self) -> None:
        """`SchemaOutOfDate` while migrations this code needs are not applied."""
        latest = latest_schema_version(getattr(self.store, "backend", "sqlite"))
        version = self.store.schema_version()
        if version < latest:
            raise SchemaOutOfDate(
                f"schema version {version}, this code needs {latest}: run `sinal migrate`"
            )

    def create_account(self, name: str, *, timezone: str = DEFAULT_TIMEZONE) -> Account:
        """Create an account (a tenant)."""
        errors: list[FieldError] = []
        clean = None
        try:
            clean = normalize_name(name) if isinstance(name, str) else None
        except InvalidIdentity as exc:
            errors.append(_field_error(exc))
        else:
            if not clean:
                errors.append(FieldError("name", "required", "an account needs a name"))
        try:
            parse_zone(timezone)
        except InvalidQuery as exc:
            errors.extend(exc.errors)
        if errors:
            raise InvalidAccount(errors)
        account = Account(new_id(), str(clean), timezone, self.clock())
        self.store.create_account(account)
        return account

    def get_account(self, account_id: UUID | str) -> Account | None:
        """One account, or None."""
        return self.store.get_account(_uuid(account_id, "account_id", InvalidAccount))

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
        ids, clean_name = _parse_contact(phone, email, external_id, name)
        account = _uuid(account_id, "account_id", InvalidContact)
        new = NewContact(account, new_id(), clean_name, ids.phone, ids.email, ids.external_id)
        return self.store.upsert_contact(new)  # no account: its insert says so (`AccountNotFound`)

    def get_contact(self, account_id: UUID | str, contact_id: UUID | str) -> Contact | None:
        """One contact of the account, or None (another account's id included)."""
        return self.store.get_contact(
            _uuid(account_id, "account_id", InvalidContact),
            _uuid(contact_id, "contact_id", InvalidContact),
        )

    # -- events ------------------------------------------------------------------------

    def emit_event(self, **params: Any) -> EmitResult:
        """Record one event; the keyword arguments are `EmitEvent`'s fields.

        Raises `InvalidEvent` (one entry per bad field) and writes nothing when the input
        is malformed; a valid event that cannot be recorded comes back `rejected` (reason
        "refused", nothing written, when the database refuses its data; "account_not_found",
        nothing written, for an account that does not exist).
        """
        return self.emit(EmitEvent(**params))

    def emit(self, event: EmitEvent) -> EmitResult:
        """Record one `EmitEvent` (see `emit_event`)."""
        prepared = prepare(event, self.clock())
        outcome = self.store.record([prepared])[0]
        return _result(prepared, outcome)

    def emit_many(self, events: Sequence[EmitEvent]) -> list[EmitResult]:
        """Record up to 1,000 events in one transaction; one result per item, in order.

        Invalid items come back `rejected` with reason "invalid" and their field errors,
        those whose data the database refuses with reason "refused" (`Store.record`); the
        others are recorded. Within the batch the first of a unique id wins.

        The batch goes to the store in chunks ordered by dedup key, each validated only
        when the store asks for it: PostgreSQL stores one chunk while the next is checked.
        """
        if len(events) > MAX_BATCH:
            raise InvalidEvent(
                [FieldError("events", "too_many", f"a batch holds at most {MAX_BATCH} events")]
            )
        now = self.clock()
        results: list[EmitResult | None] = [None] * len(events)
        keys = [identify(event) for event in events]
        rounds = _FirstWins()

        def chunks() -> Iterator[list[PreparedEvent]]:
            # Every transaction inserts dedup keys in this one order (code points, as the
            # store's statements sort them), so concurrent batches never wait on each
            # other in a cycle; the repeats of a key sit together, in input order, in one
            # chunk. Sorted when the store asks for the first chunk, after it has sent the
            # keys to be looked up: PostgreSQL looks while this sorts.
            places = [_lock_order(key) for key in keys]
            order = sorted(range(len(events)), key=places.__getitem__)
            for part in _key_chunks(order, places):
                chunk: list[PreparedEvent] = []
                for i in part:
                    try:
                        event = prepare(events[i], now, keys[i])
                    except InvalidEvent as exc:
                        results[i] = EmitResult(
                            "rejected", reason="invalid", message=str(exc), errors=exc.errors
                        )
                        continue
                    if rounds.take(i, event):
                        chunk.append(event)
                yield chunk

        answered: list[list[Outcome]] = []

        def answer(outcomes: list[Outcome]) -> None:
            if not answered or answered[-1] is not outcomes:  # not already, by `settle`
                self._answer(rounds, outcomes, results)
                answered.append(outcomes)

        def settle(batch: Sequence[PreparedEvent], outcomes: list[Outcome]) -> _Round:
            if isinstance(batch, _Round):  # a later round
                return self._next_round(batch, rounds, outcomes, results)
            # The store's own list of every chunk's events is the first round. Answered
            # here only when a repeat may take over from a rejected first: this runs before
            # the batch's closing statements go out, `answer` while PostgreSQL commits.
            if not rounds.repeats or not any(o.kind == "rejected" for o in outcomes):
                return _NO_ROUND
            answered.append(outcomes)
            return self._next_round(batch, rounds, outcomes, results)

        if len(events) > CHUNK:
            outcomes = self.store.record_chunks(chunks(), keys, answer, settle)
        else:  # one statement
            first = _Round(rounds)
            first.extend(event for chunk in chunks() for event in chunk)
            outcomes = self._record_round(first, results)
        # The store may have answered while PostgreSQL committed; a batch it had to redo
        # comes back with other outcomes, answered again here. (The repeats whose first
        # could not be stored were recorded and answered in the store's transaction.)
        if not answered or answered[-1] is not outcomes:
            self._answer(rounds, outcomes, results)
        assert all(r is not None for r in results)
        return results  # type: ignore[return-value]

    def record_prepared(self, events: Sequence[PreparedEvent]) -> list[EmitResult]:
        """Record already validated events in one transaction (used by group commit)."""
        results: list[EmitResult | None] = [None] * len(events)
        first = _Round.of(list(enumerate(events)))
        self._answer(first.rounds, self._record_round(first, results), results)
        return results  # type: ignore[return-value]

    def _record_round(self, first: _Round, results: list[EmitResult | None]) -> list[Outcome]:
        """Record the first occurrence of each unique id in `first`, and in the same
        transaction, the repeats whose first could not be stored; their outcomes."""
        if not first:
            return []
        if not first.rounds.repeats:
            return self.store.record(first)  # nothing to settle: one statement, as ever

        def settle(batch: Sequence[PreparedEvent], outcomes: list[Outcome]) -> _Round:
            assert isinstance(batch, _Round)
            return self._next_round(batch, batch.rounds, outcomes, results)

        return self.store.record(first, settle)

    def _next_round(
        self,
        batch: Sequence[PreparedEvent],
        first: _FirstWins,
        outcomes: list[Outcome],
        results: list[EmitResult | None],
    ) -> _Round:
        """Answer a round (`first` when it is not a `_Round`); the next: the repeats whose
        first could not be stored."""
        rounds = batch.rounds if isinstance(batch, _Round) else first
        return _Round.of(self._answer(rounds, outcomes, results))

    @staticmethod
    def _answer(
        rounds: _FirstWins, outcomes: list[Outcome], results: list[EmitResult | None]
    ) -> list[tuple[int, PreparedEvent]]:
        """Answer the recorded events from their outcomes, and each repeat like its first
        occurrence; returns the repeats whose first could not be stored (the next round's).
        Writes nothing but `results`: a store may call it before its commit is confirmed,
        and again with the outcomes of a redone batch."""
        stored: dict[int, StoredPayload] = {}  # the firsts that were duplicates themselves
        for (i, event), outcome in zip(rounds.taken, outcomes, strict=True):
            results[i] = _result(event, outcome)
            if outcome.stored is not None:
                stored[i] = outcome.stored
        firsts = dict(rounds.taken) if rounds.repeats else {}
        retry: list[tuple[int, PreparedEvent]] = []
        for i, event, j in rounds.repeats:
            earlier = results[j]
            assert earlier is not None
            if earlier.status == "rejected":
                retry.append((i, event))  # the first could not be stored: the next one may
                continue
            payload = stored.get(j)
            differs = (
                differs_from_earlier(event, firsts[j])
                if payload is None
                else differs_from(event, payload)
            )
            results[i] = replace(earlier, status="duplicate", differs=differs)
        return retry

    # -- queries and maintenance -------------------------------------------------------

    def list_events(self, query: EventQuery) -> list[StoredEvent]:
        """Events matching the query, newest first (its metric named as events name it:
        `normalize_metric_name`)."""
        if query.metric_name is not None:
            query = replace(query, metric_name=normalize_metric_name(query.metric_name))
        return self.store.list_events(query)

    def list_contacts(self, query: ContactQuery) -> list[ListedContact]:
        """The account's contacts matching the query (see `contact_query`), oldest first,
        each with its tags."""
        return self.store.list_contacts(query)

    def older_spellings(self, account_id: UUID | str) -> list[Unrespelled]:
        """The account's emails and external ids left in a spelling sinal no longer stores
        by migration 0032 (`sinal.store.respelling`): refused now, or another's form now."""
        return self.store.older_spellings(_uuid(account_id, "account_id", InvalidContact))

    def read_feed(
        self, account_id: UUID | str, after: FeedPosition = FEED_START, limit: int = 100
    ) -> FeedPage:
        """Up to `limit` of the account's events after `after`, in the order they were
        stored (not by `occurred_at`): pass each page's `next` back to get every event
        once, late ones and concurrent writers' included (see `Store.read_feed`)."""
        return self.store.read_feed(_uuid(account_id, "account_id"), after, limit)

    def get_summary(
        self, account_id: UUID | str, contact_id: UUID | str | None = None
    ) -> list[SummaryRow]:
        """The per-contact metric summaries of an account (or of one contact): a row per
        contact, metric and currency, as values of two currencies are never added."""
        contact = None if contact_id is None else _uuid(contact_id, "contact_id")
        return self.store.get_summary(_uuid(account_id, "account_id"), contact)

    def list_rejections(self, account_id: UUID | str, limit: int = 100) -> list[Rejection]:
        """What was not recorded and why, newest first."""
        return self.store.list_rejections(_uuid(account_id, "account_id"), limit)

    def rebuild_summaries(
        self, account_id: UUID | str | None = None, progress: Progress | None = None
    ) -> list[RebuildReport]:
        """Recompute `contact_metrics_summary` from events; report the drift fixed, one
        report per account (`rebuild_each_account` holds one at a time)."""
        return list(self.rebuild_each_account(account_id, progress))

    def rebuild_each_account(
        self, account_id: UUID | str | None = None, progress: Progress | None = None
    ) -> Iterator[RebuildReport]:
        """`rebuild_summaries`, each account's report yielded once its summaries are
        recounted, the accounts read a page at a time as it goes: for a database of more
        accounts than are worth holding. The rebuild goes as far as it is iterated."""
        account = None if account_id is None else _uuid(account_id, "account_id")
        return self.store.rebuild_summaries(account, progress)

    # -- the HTTP service: accounts, keys, contacts, tags ------------------------------

    def list_accounts(self, limit: int = 100, after: Account | None = None) -> list[Account]:
        """Accounts, oldest first (an operator's view across tenants); those after `after`,
        the last of the previous page."""
        return self.store.list_accounts(limit, after)

    def update_account(
        self, account_id: UUID | str, *, name: str | None = None, timezone: str | None = None
    ) -> Account:
        """Rename an account and/or change its timezone (None: unchanged)."""
        errors: list[FieldError] = []
        clean = None
        try:
            clean = None if name is None else normalize_name(name)
        except InvalidIdentity as exc:
            errors.append(_field_error(exc))
        else:
            if name is not None and not clean:
                errors.append(FieldError("name", "required", "an account needs a name"))
        if timezone is not None:
            try:
                parse_zone(timezone)
            except InvalidQuery as exc:
                errors.extend(exc.errors)
        if errors:
            raise InvalidAccount(errors)
        account = self.store.update_account(
            _uuid(account_id, "account_id", InvalidAccount), clean, timezone
        )
        if account is None:
            raise AccountNotFound(f"account {account_id} does not exist")
        return account

    def create_api_key(
        self,
        account_id: UUID | str,
        scopes: Sequence[str] | str = DEFAULT_SCOPES,
        name: str | None = None,
    ) -> tuple[str, ApiKey]:
        """A new key for the account: its text (shown once; only its hash is kept)."""  # fmt: skip
        account = _uuid(account_id, "account_id", InvalidAccount)
        if self.store.get_account(account) is None:
            raise AccountNotFound(f"account {account} does not exist")
        text, key = generate_key(account, scopes, self.clock(), normalize_name(name))
        self.store.create_api_key(key)
        return text, key

    def authenticate(self, key_text: str) -> ApiKey | None:
        """The active key with this text, or None (unknown, malformed or revoked)."""
        account = key_account(key_text)
        if account is None:
            return None
        key = self.store.find_api_key(account, hash_key(key_text))
        return key if key is not None and key.is_active else None

    def revoke_api_key(self, key_id: UUID | str) -> ApiKey | None:
        """Revoke a key by id (idempotent); None if there is no such key."""
        return self.store.revoke_api_key(_uuid(key_id, "key_id"), self.clock())

    def list_api_keys(
        self, account_id: UUID | str, limit: int | None = None, after: ApiKey | None = None
    ) -> list[ApiKey]:
        """The account's keys (hashes and hints, never the text), oldest first: the first
        `limit` (None: every one) after `after`, the last of the previous page, when given."""
        account = _uuid(account_id, "account_id", InvalidAccount)
        return self.store.list_api_keys(account, limit, after)

    def resolve_contact(
        self,
        account_id: UUID | str,
        *,
        phone: str | None = None,
        email: str | None = None,
        external_id: str | None = None,
        name: str | None = None,
        source: str = "api",
        fill_missing: bool = False,
    ) -> tuple[Contact, bool]:
        """Find the account's contact by its identities, or create it together with its
        Contact Created event (one transaction). At least one identity is required.

        With `fill_missing`, a contact found keeps what it has and gains the name and
        identities it lacks (Contact Updated), except one that already names another contact.

        A contact found with nothing to gain costs one read and no write transaction."""
        ids, clean_name = _parse_contact(phone, email, external_id, name)
        if ids.is_empty:
            raise InvalidContact(
                [FieldError("contact", "identity_required", "give a phone, email or external_id")]
            )
        account = _uuid(account_id, "account_id", InvalidContact)
        new = NewContact(account, new_id(), clean_name, ids.phone, ids.email, ids.external_id)
        # a read first: the contact found is the common case, and needs no writer's lock
        held = self.store.find_contacts(new)
        if held:
            contact = next(iter(held.values()))  # the most specific identity's
            # an identity another contact has stays theirs: no write is tried (it would fail)
            others: dict[str, Any] = {k: None for k, c in held.items() if c.id != contact.id}
            given = replace(new, **others)
        else:  # no account: the contact's insert says so (`AccountNotFound`)
            contact, is_new = self.store.upsert_contact_recorded(new, self._created(source))
            if is_new:
                return contact, True
            given = new  # created meanwhile by a concurrent caller
        if fill_missing:
            # erased meanwhile (None): as found; the caller's write will find it gone
            contact = self._fill_missing(contact, given, source) or contact
        return contact, False

    def _created(self, source: str) -> BuildEvent:
        """The Contact Created event of a contact `resolve_contact` creates."""

        def created(contact: Contact) -> PreparedEvent:
            return self._contact_event(
                METRIC_CONTACT_CREATED, contact, source, _identity_properties(contact),
                source_id=str(contact.id),
            )  # fmt: skip

        return created

    def fill_contact(
        self,
        account_id: UUID | str,
        contact_id: UUID | str | Contact,
        *,
        phone: str | None = None,
        email: str | None = None,
        external_id: str | None = None,
        name: str | None = None,
        source: str = "api",
    ) -> Contact | None:
        """Give a contact the name and identities it lacks (Contact Updated, source
        `source`), as `resolve_contact(..., fill_missing=True)` gives a contact it finds:
        a value it has stays, one that names another contact is left. None if there is no
        such contact; `InvalidContact` naming every bad field.

        The contact is named by its id, or given as just read (then not read again: what a
        concurrent writer gave it since stays, as it does after a read)."""
        ids, clean_name = _parse_contact(phone, email, external_id, name)
        account = _uuid(account_id, "account_id", InvalidContact)
        contact = (
            contact_id
            if isinstance(contact_id, Contact)
            else self.store.get_contact(account, _uuid(contact_id, "contact_id", InvalidContact))
        )
        if contact is None or contact.account_id != account:
            return None
        given = NewContact(
            contact.account_id, contact.id, clean_name, ids.phone, ids.email, ids.external_id
        )
        return self._fill_missing(contact, given, source)

    def _fill_missing(self, contact: Contact, given: NewContact, source: str) -> Contact | None:
        """`contact` with what it lacks of `given` filled in; None if it no longer exists."""
        # a store's customer first seen by email alone (a checkout) must not stay phoneless
        # once its order names the phone: its automations could not message it, and its
        # WhatsApp messages would make a second contact
        fields: tuple[ContactField, ...] = ("name", "phone", "email", "external_id")
        missing: dict[ContactField, str | None] = {
            f: getattr(given, f)
            for f in fields
            if getattr(contact, f) is None and getattr(given, f)
        }

        def changed(before: Contact, after: Contact) -> PreparedEvent:
            filled = [f for f in fields if getattr(before, f) != getattr(after, f)]
            properties: dict[str, Any] = {f: getattr(after, f) for f in filled}
            properties["changed"] = filled
            return self._contact_event(METRIC_CONTACT_UPDATED, after, source, properties)

        while missing:
            try:
                # only_missing: what a concurrent writer gave it since `contact` was read stays
                return self.store.update_contact(
                    contact.account_id, contact.id, missing, changed, only_missing=True
                )
            except IdentityConflict as exc:  # that identity is someone else's: leave it
                if missing.pop(cast(ContactField, exc.field), None) is None:
                    return contact
        return contact

    def update_contact(
        self, account_id: UUID | str, contact_id: UUID | str, changes: Mapping[str, str | None]
    ) -> Contact | None:
        """Set (or, with None, remove) name, phone, email or external_id; a real change
        records Contact Updated in the same transaction. None if there is no such contact.
        Raises `InvalidContact` naming every bad field."""
        try:
            normalized = normalize_contact_fields(changes)
        except InvalidIdentities as exc:
            raise InvalidContact([_field_error(e) for e in exc.errors]) from exc
        clean = {_CONTACT_FIELDS[name]: value for name, value in normalized.items()}

        def changed(before: Contact, after: Contact) -> PreparedEvent:
            fields = [f for f in clean if getattr(before, f) != getattr(after, f)]
            properties: dict[str, Any] = {f: getattr(after, f) for f in fields}
            properties["changed"] = fields
            return self._contact_event(METRIC_CONTACT_UPDATED, after, "api", properties)

        account = _uuid(account_id, "account_id", InvalidContact)
        contact = _uuid(contact_id, "contact_id", InvalidContact)
        return self.store.update_contact(account, contact, clean, changed)

    def erase_contact(self, account_id: UUID | str, contact_id: UUID | str) -> bool:
        """Delete a contact and everything of it, irreversibly, in one transaction (what
        goes and what stays: `sinal.store.erasure`). False if there is no such contact."""
        store = cast(ErasureStore, self.store)
        account = _uuid(account_id, "account_id", InvalidContact)
        return store.erase_contact(account, _uuid(contact_id, "contact_id", InvalidContact))

    def add_tags(
        self, account_id: UUID | str, contact_id: UUID | str, tags: Sequence[str]
    ) -> list[str] | None:
        """Tag a contact; each new tag records Tag Added. The tags added, or None if there
        is no such contact."""
        return self._change_tags(account_id, contact_id, tags, add=True)

    def remove_tags(
        self, account_id: UUID | str, contact_id: UUID | str, tags: Sequence[str]
    ) -> list[str] | None:
        """Untag a contact; each removed tag records Tag Removed."""
        return self._change_tags(account_id, contact_id, tags, add=False)

    def _change_tags(
        self, account_id: UUID | str, contact_id: UUID | str, tags: Sequence[str], *, add: bool
    ) -> list[str] | None:
        if isinstance(tags, str):  # its characters would each be a tag: "vip" tagged v, i, p
            message = f"tags must be a list of tags, not one string: [{tags!r}]"
            raise InvalidContact([FieldError("tags", "invalid_type", message)])
        clean = [normalize_tag(tag, f"tags[{i}]") for i, tag in enumerate(tags)]
        metric = METRIC_TAG_ADDED if add else METRIC_TAG_REMOVED
        account = _uuid(account_id, "account_id", InvalidContact)
        contact = _uuid(contact_id, "contact_id", InvalidContact)

        def event(tag: str) -> PreparedEvent:
            return prepare(
                EmitEvent(
                    account_id=account, contact_id=contact, metric_name=metric, source="api",
                    entity_type="tag", entity_id=tag, properties={"tag": tag},
                ),
                self.clock(),
            )  # fmt: skip

        return self.store.change_tags(account, contact, clean, add=add, on_change=event)

    def list_tags(self, account_id: UUID | str, contact_id: UUID | str) -> list[str]:
        """A contact's tags, sorted."""
        account = _uuid(account_id, "account_id", InvalidContact)
        return self.store.list_tags(account, _uuid(contact_id, "contact_id", InvalidContact))

    def _contact_event(
        self,
        metric: str,
        contact: Contact,
        source: str,
        properties: dict[str, Any],
        source_id: str | None = None,
    ) -> PreparedEvent:
        return prepare(
            EmitEvent(
                account_id=contact.account_id, contact_id=contact.id, metric_name=metric,
                source=source, source_id=source_id, entity_type="contact",
                entity_id=str(contact.id), properties=properties,
            ),
            self.clock(),
        )  # fmt: skip

    # -- the HTTP service: queries and replay ------------------------------------------

    def get_event(self, account_id: UUID | str, event_id: UUID | str) -> StoredEvent | None:
        """One event of the account, or None (another account's id included)."""
        return self.store.get_event(_uuid(account_id, "account_id"), _uuid(event_id, "event_id"))

    def find_event(self, account_id: UUID | str, unique_event_id: str) -> StoredEvent | None:
        """The account's event with this `unique_event_id` (a duplicate's key), or None."""
        return self.store.find_event(_uuid(account_id, "account_id"), unique_event_id)

    def list_metrics(
        self,
        account_id: UUID | str,
        name: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[MetricInfo]:
        """The account's metrics (or the one named) with their event counts, by name (code
        point order): the first `limit` (None: every one) named after `after` (the last
        name of the previous page), when given."""
        named = None if name is None else normalize_metric_name(name)
        return self.store.list_metrics(
            _uuid(account_id, "account_id"), named, after=after, limit=limit
        )

    def aggregate(
        self,
        account_id: UUID | str,
        metric_name: str,
        *,
        measurement: Measurement,
        interval: Interval,
        since: datetime,
        until: datetime,
        timezone: str | None = None,
        by: str | None = None,
        currency: str | None = None,
    ) -> Aggregate | None:
        """A metric per time bucket in `timezone` (default: the account's), every bucket
        of [since, until) included; None if the account has no such metric. `currency`
        (ISO 4217) counts only the events in it; a `sum_value` never adds two currencies:
        values in several, with no `currency`, are `InvalidQuery` (`mixed_currencies`)."""
        account = self.store.get_account(_uuid(account_id, "account_id"))
        if account is None:
            raise AccountNotFound(f"account {account_id} does not exist")
        zone_name = timezone or account.timezone
        zone = parse_zone(zone_name)
        check_range(since, until)
        by = property_key(by)
        currency = parse_currency(currency)
        metric_name = normalize_metric_name(metric_name)
        # the metric's row, not list_metrics: that counts the metric's summary rows, one
        # per contact having it (a million on a big account) before the events are read
        if not _could_name_metric(metric_name) or not self.store.has_metric(
            account.id, metric_name
        ):
            return None
        starts = bucket_starts(since, until, interval, zone)
        query = AggregateQuery(
            account.id, metric_name, measurement, tuple(starts), since, until, by, currency
        )
        cells = self.store.aggregate(query)
        if measurement == "sum_value":
            currency = sum_currency(cells, currency)
        zero: int | Decimal = Decimal(0) if measurement == "sum_value" else 0
        return densify(starts, cells, by=by, zero=zero, timezone=zone_name, currency=currency)

    def list_rejections_page(
        self, account_id: UUID | str, limit: int = 100, before: UUID | str | None = None
    ) -> list[Rejection]:
        """Kept rejections, newest first, older than the rejection `before` if given."""
        cursor = None if before is None else _uuid(before, "before")
        return self.store.list_rejections(_uuid(account_id, "account_id"), limit, cursor)

    def replay_rejection(
        self,
        account_id: UUID | str,
        rejection_id: UUID | str,
        contact_id: UUID | str | None = None,
    ) -> Replay | None:
        """Record a kept rejection's event now that its cause is fixed (optionally naming
        the contact it lacked). At most one event per rejection, even under concurrent
        replays; nothing is written while the contact is still unknown."""
        account = _uuid(account_id, "account_id")

        def build(rejection: Rejection) -> PreparedEvent:
            params = {k: v for k, v in rejection.payload.items() if k in _EMIT_FIELDS}
            params["account_id"] = account  # the rejection's own account, never the payload's
            if contact_id is not None:
                params["contact_id"] = contact_id
            return prepare(EmitEvent(**params), self.clock())

        return self.store.replay_rejection(account, _uuid(rejection_id, "rejection_id"), build)

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    url: str,
    *,
    clock: Clock = utcnow,
    wait: float = DEFAULT_WAIT,
    create: bool = True,
    keyring: Keyring | None = None,
) -> Ledger:
    """A ledger on the database at `url` ("sqlite:///path.db" or "postgresql://..."); a
    call waits up to `wait` seconds for the database; `create=False`: a SQLite file that
    does not exist is an error, not a new database; `keyring`: seals and opens the stored
    secrets (see `open_store`, `sinal.keyring.parse_keyring`)."""
    return Ledger(open_store(url, wait=wait, create=create, keyring=keyring), clock=clock)


def _result(event: PreparedEvent, outcome: Outcome) -> EmitResult:
    if outcome.kind == "duplicate":
        assert outcome.stored is not None
        differs = differs_from(event, outcome.stored)
        return EmitResult("duplicate", outcome.event_id, event.unique_event_id, differs)
    if outcome.kind == "rejected":
        return EmitResult(
            "rejected",
            unique_event_id=event.unique_event_id,
            reason=outcome.reason,
            message=outcome.message,
            rejection_id=outcome.rejection_id,
        )
    # Positionally (status, event_id, unique_event_id): ~0.8 µs less per event than by
    # keyword, for the frozen dataclass every emitted event gets.
    return EmitResult("created", outcome.event_id, event.unique_event_id)


def contact_query(
    account_id: UUID | str,
    *,
    phone: str | None = None,
    email: str | None = None,
    external_id: str | None = None,
    tag: str | None = None,
    limit: int = 100,
) -> ContactQuery:
    """`Ledger.list_contacts`' query, each filter given compared as contacts store it
    ("Ana@Loja.com" finds ana@loja.com, "(11) 98765-4321" +5511987654321, " vip " vip);
    `InvalidQuery` naming every one no contact can have."""
    errors: list[FieldError] = []
    identities: dict[str, str | None] = {}
    try:
        raw = {"phone": phone, "email": email, "external_id": external_id}
        identities = normalize_contact_fields({k: v for k, v in raw.items() if v is not None})
    except InvalidIdentities as exc:
        errors.extend(_field_error(e) for e in exc.errors)
    try:
        tag = None if tag is None else normalize_tag(tag)
    except InvalidContact as exc:
        errors.extend(exc.errors)
    if errors:
        raise InvalidQuery(errors)
    get = identities.get
    account = _uuid(account_id, "account_id")
    return ContactQuery(account, get("email"), get("phone"), get("external_id"), tag,
                        limit=limit)  # fmt: skip


def _field_error(error: InvalidIdentity) -> FieldError:
    return FieldError(error.field, error.code, error.message)


def _identity_properties(contact: Contact) -> dict[str, Any]:
    fields = ("name", "phone", "email", "external_id")
    return {f: getattr(contact, f) for f in fields if getattr(contact, f) is not None}


_CONTACT_FIELDS: dict[str, ContactField] = {
    "name": "name", "phone": "phone", "email": "email", "external_id": "external_id",
}  # fmt: skip
_EMIT_FIELDS = frozenset(EmitEvent.__dataclass_fields__)


def _parse_contact(
    phone: str | None, email: str | None, external_id: str | None, name: str | None
) -> tuple[Identities, str | None]:
    """A new contact's identities and name, or `InvalidContact` naming every bad field."""
    raw = {"phone": phone, "email": email, "external_id": external_id, "name": name}
    try:
        clean = normalize_contact_fields(raw)
    except InvalidIdentities as exc:
        raise InvalidContact([_field_error(e) for e in exc.errors]) from exc
    ids = Identities(phone=clean["phone"], email=clean["email"], external_id=clean["external_id"])
    return ids, clean["name"]


def _could_name_metric(name: str) -> bool:
    """Whether some metric may be called `name`: none holds a control character or a
    surrogate (`events` refuses them), and PostgreSQL refuses a NUL in a query."""
    return not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in name)


def _uuid(
    value: UUID | str, name: str, error: Callable[[list[FieldError]], SinalError] = InvalidQuery
) -> UUID:
    """`value` as a UUID; `error` naming the parameter `name` when it is none (it was
    Python's ValueError "badly formed hexadecimal UUID string", naming nothing)."""
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value if isinstance(value, str) else str(value))
    except ValueError:
        raise error([uuid_error(name, value)]) from None


class _FirstWins:
    """Splits a batch into the first occurrence of each dedup key and its repeats."""

    def __init__(self) -> None:
        self.first: dict[tuple[UUID, str], int] = {}
        self.taken: list[tuple[int, PreparedEvent]] = []  # to record, in the order taken
        self.repeats: list[tuple[int, PreparedEvent, int]] = []  # (index, event, first's)

    def take(self, i: int, event: PreparedEvent) -> bool:
        """Whether item `i` is to be recorded (False: it repeats an earlier key)."""
        if event.unique_event_id is not None:
            key = (event.account_id, event.unique_event_id)
            if key in self.first:
                self.repeats.append((i, event, self.first[key]))
                return False
            self.first[key] = i
        self.taken.append((i, event))
        return True


class _Round(list[PreparedEvent]):
    """The events of one round of a batch, the first of each unique id, with the `_FirstWins`
    that took them (and their repeats): what the ledger answers the round's outcomes by."""

    def __init__(self, rounds: _FirstWins) -> None:
        super().__init__()
        self.rounds = rounds

    @classmethod
    def of(cls, items: list[tuple[int, PreparedEvent]]) -> _Round:
        """The round taking `items` (index in the batch, event)."""
        made = cls(_FirstWins())
        made.extend(event for i, event in items if made.rounds.take(i, event))
        return made


_NO_ROUND = _Round(_FirstWins())


CHUNK = 64  # events per chunk of a batch (measured: bench/HISTORY.md)
# The first chunk is validated while PostgreSQL looks the batch's keys and contacts up,
# which takes about as long as validating 128 events (bench/HISTORY.md); PostgreSQL has
# nothing to store until the answer is in.
FIRST_CHUNK = 128


def _lock_order(key: EventKey) -> tuple[int, int, str]:
    """Where an item goes in a batch: no dedup key first, then by (account, key)."""
    unique = key.unique_event_id
    if unique is None or key.account_id is None:
        return (0, 0, "")
    return (1, key.account_id.int, unique)


def _key_chunks(order: list[int], places: list[tuple[int, int, str]]) -> Iterator[list[int]]:
    """`order` in runs of about CHUNK items (the first of about FIRST_CHUNK), never
    splitting the repeats of a key (`places`: each item's `_lock_order`)."""
    part: list[int] = []
    size = FIRST_CHUNK
    for i in order:
        here = places[i]
        if len(part) >= size and (here[0] == 0 or here != places[part[-1]]):
            yield part
            part, size = [], CHUNK
        part.append(i)
    if part:
        yield part
