"""The change feed (`Ledger.read_feed`): a poller reading on from each page's `next` gets
every stored event exactly once, late `occurred_at`s, erasures and concurrent writers
whose transactions commit out of order included, on both backends."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import pytest

from sinal import EmitEvent, connect
from sinal.events import PreparedEvent, identify, prepare
from sinal.ids import new_id
from sinal.ledger import Ledger
from sinal.store.base import FEED_START, Account, FeedPosition, Outcome, StoredEvent
from tests.contract.test_schema import _migrate_up_to
from tests.helpers import refuse_13, sql

SPAWN = multiprocessing.get_context("spawn")  # children share nothing but the database
# How long a test waits for the feed to give what was committed. On PostgreSQL the feed
# holds back the events of transactions younger than the oldest one running on the
# server, in any database: another session's transaction delays it, never hides an event.
CATCH_UP = 60.0


def _event(account: UUID | str, contact: UUID | str, uid: int, **fields: Any) -> EmitEvent:
    fields = {"metric_name": "Order Paid", **fields}
    return EmitEvent(
        account_id=account, contact_id=contact, source="feed", source_id=str(uid), **fields
    )


def _drain(
    ledger: Ledger, account_id: UUID, want: int, after: FeedPosition = FEED_START, limit: int = 100
) -> tuple[list[StoredEvent], FeedPosition]:
    """Read the feed from `after` until it has given `want` events (or `CATCH_UP` seconds
    have passed: the caller asserts what it got); the events and the position after them."""
    got: list[StoredEvent] = []
    deadline = time.monotonic() + CATCH_UP
    while len(got) < want and time.monotonic() < deadline:
        page = ledger.read_feed(account_id, after, limit)
        got += page.events
        after = page.next
        if not page.has_more:
            time.sleep(0.01)
    return got, after


def _ids(events: Sequence[StoredEvent]) -> list[UUID]:
    return [e.id for e in events]


def test_feed_gives_a_late_event_after_the_cursor(ledger: Ledger, account: Account) -> None:
    """An event that arrives with an old occurred_at comes after what was read before it
    (listing by occurred_at, a poller would never see it)."""
    contact = ledger.create_contact(account.id, phone="+55 11 98765-4321").id
    now = datetime.now(UTC)
    first = [ledger.emit(_event(account.id, contact, uid, occurred_at=now)) for uid in range(3)]
    read, position = _drain(ledger, account.id, want=3)

    late = ledger.emit(_event(account.id, contact, 99, occurred_at=now - timedelta(days=365)))
    then, after_late = _drain(ledger, account.id, want=1, after=position)

    assert _ids(read) == [r.event_id for r in first]
    assert _ids(then) == [late.event_id]
    assert ledger.read_feed(account.id, after_late).events == []
    assert ledger.read_feed(account.id, after_late).next == after_late


def test_feed_pages_every_write_path_once_in_order_of_arrival(
    ledger: Ledger, account: Account
) -> None:
    """One event, a batch (one statement) and a big batch (COPY on PostgreSQL), read in
    pages of 7: each event once, each transaction's events after the earlier ones'; a
    duplicate adds nothing, and another account's events are not there."""
    contact = ledger.create_contact(account.id, email="ana@example.com").id
    other = ledger.create_account("Outra")
    stranger = ledger.create_contact(other.id, email="bia@example.com").id
    ledger.emit(_event(other.id, stranger, 1))
    one = ledger.emit(_event(account.id, contact, 1)).event_id
    batch = [_event(account.id, contact, u) for u in range(2, 12)]
    big = [_event(account.id, contact, u) for u in range(100, 300)]  # by COPY on PostgreSQL
    in_batch = {r.event_id for r in ledger.emit_many(batch)}
    in_big = {r.event_id for r in ledger.emit_many(big)}
    assert ledger.emit(_event(account.id, contact, 1)).status == "duplicate"
    last = ledger.emit(_event(account.id, contact, 500)).event_id

    got, position = _drain(ledger, account.id, want=212, limit=7)

    ids = _ids(got)
    assert len(ids) == len(set(ids)) == 212
    assert (ids[0], set(ids[1:11]), set(ids[11:211]), ids[211]) == (one, in_batch, in_big, last)
    final = ledger.read_feed(account.id, position, 7)
    assert (final.events, final.next, final.has_more) == ([], position, False)


# The columns an INSERT of sinal's named before migration 0021 (the feed), but for the
# id and unique_event_id: neither `seq` (SQLite) nor `tx` (PostgreSQL).
_OLD_COLUMNS = (
    "contact_id, metric_id, metric_name, properties, value, currency, source, source_id, "
    "integration_id, entity_type, entity_id, automation_execution_id, occurred_at, "
    "received_at, schema_version, created_at"
)


def _stored_as_before_the_feed(url: str, model: UUID | None) -> UUID:
    """A copy of the event `model`, under a new id and unique_event_id, written as a sinal
    from before migration 0021 still running in a rolling deploy writes one; its id."""
    ident = new_id()
    as_uuid = "" if url.startswith("sqlite") else "::uuid"
    sql(url, f"INSERT INTO events (account_id, id, unique_event_id, {_OLD_COLUMNS}) "
        f"SELECT account_id, ?{as_uuid}, ?, {_OLD_COLUMNS} FROM events WHERE id = ?{as_uuid}",
        str(ident), f"old:{ident}", str(model))  # fmt: skip
    return ident


def test_feed_gives_the_events_an_older_sinal_writes(
    ledger: Ledger, account: Account, database_url: str
) -> None:
    """Its INSERT names no `seq`: the schema numbers the event (SQLite: migration 0024's
    trigger; PostgreSQL: `tx`'s default), in order with this code's events, so the feed
    gives each once (on SQLite it gave none of them)."""
    contact = ledger.create_contact(account.id, email="ana@example.com").id
    first = ledger.emit(_event(account.id, contact, 1)).event_id
    _, position = _drain(ledger, account.id, want=1)

    old = [_stored_as_before_the_feed(database_url, first) for _ in range(2)]
    last = ledger.emit(_event(account.id, contact, 2)).event_id
    got, after = _drain(ledger, account.id, want=3, after=position)

    assert _ids(got) == [*old, last]
    assert ledger.read_feed(account.id, after).events == []


def test_migration_0024_numbers_the_events_an_older_sinal_wrote_before_it(
    sqlite_url: str,
) -> None:
    """SQLite: an event written with no `seq` between migrations 0021 and 0024 gets a
    number after every one given, so a poller past the others still reads it."""
    with connect(sqlite_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, email="ana@example.com").id
        first = ledger.emit(_event(account.id, contact, 1)).event_id
        _, position = _drain(ledger, account.id, want=1)
        sql(sqlite_url, "DROP TRIGGER events_seq_default")  # as at 0023
        sql(sqlite_url, "DELETE FROM schema_migrations WHERE version = 24")
        old = _stored_as_before_the_feed(sqlite_url, first)
        assert ledger.read_feed(account.id, position).events == []

        assert ledger.migrate() == [24]
        last = ledger.emit(_event(account.id, contact, 2)).event_id

        got, _ = _drain(ledger, account.id, want=2, after=position)
        assert _ids(got) == [old, last]


def test_feed_gives_an_event_stored_after_the_newest_ones_were_erased(
    ledger: Ledger, account: Account
) -> None:
    """Erasing a contact deletes its events, the newest ones included: the next event
    still comes after every position handed out (a number is never given twice)."""
    kept = ledger.create_contact(account.id, email="ana@example.com").id
    erased = ledger.create_contact(account.id, email="bia@example.com").id
    ledger.emit(_event(account.id, kept, 1))
    ledger.emit_many([_event(account.id, erased, u) for u in range(2, 5)])
    _, position = _drain(ledger, account.id, want=4)
    assert ledger.erase_contact(account.id, erased)

    new = ledger.emit(_event(account.id, kept, 5)).event_id
    got, _ = _drain(ledger, account.id, want=1, after=position)

    assert _ids(got) == [new]


def test_feed_gives_the_events_of_a_batch_recorded_again_around_a_refused_one(
    ledger: Ledger, account: Account, database_url: str
) -> None:
    """A batch the database refused one event of is recorded again in parts (each under a
    savepoint): its stored events and the next transaction's come each once, in order."""
    contact = ledger.create_contact(account.id, email="ana@example.com").id
    refuse_13(database_url)
    batch = [_event(account.id, contact, u, value=Decimal(u)) for u in range(8, 18)]
    results = ledger.emit_many(batch)
    assert [r.status for r in results].count("rejected") == 1
    stored = [r.event_id for r in results if r.event_id is not None]
    read, position = _drain(ledger, account.id, want=9)

    after = ledger.emit_many([_event(account.id, contact, u) for u in range(20, 23)])
    then, _ = _drain(ledger, account.id, want=3, after=position)

    assert sorted(_ids(read)) == sorted(stored)  # each once
    assert _ids(then) == [r.event_id for r in after]


def test_feed_orders_positions_as_numbers(
    database_url: str, ledger: Ledger, account: Account
) -> None:
    """Positions past a power of ten (9, then 10) keep their order: numbers, not text."""
    contact = ledger.create_contact(account.id, email="ana@example.com").id
    first = ledger.emit(_event(account.id, contact, 1)).event_id
    second = ledger.emit(_event(account.id, contact, 2)).event_id
    column, kind = ("seq", "") if database_url.startswith("sqlite:") else ("tx", "::xid8")
    for arrival, ident in ((9, first), (10, second)):
        sql(
            database_url,
            f"UPDATE events SET {column} = ?{kind} WHERE id = ?",
            str(arrival),
            str(ident),
        )

    got, position = _drain(ledger, account.id, want=2)

    assert second is not None
    assert (_ids(got), position) == ([first, second], FeedPosition(10, second))


class _Held:
    """A transaction that records `events` and stays open until `release` is set."""

    def __init__(self, ledger: Ledger, events: list[EmitEvent], streamed: bool) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.ledger, self.events, self.streamed = ledger, events, streamed
        now = ledger.clock()
        self.prepared = [prepare(e, now) for e in events]
        self.thread = threading.Thread(target=self.record)
        self.thread.start()
        assert self.inside.wait(30)

    def record(self) -> None:
        store = self.ledger.store
        if self.streamed:  # by COPY on PostgreSQL
            keys = [identify(e) for e in self.events]
            store.record_chunks([self.prepared], keys, None, self.hold)
        else:
            store.record(self.prepared, self.hold)

    def hold(self, batch: Sequence[PreparedEvent], outcomes: list[Outcome]) -> list[PreparedEvent]:
        """`settle`: called inside the transaction, once the events are written."""
        self.inside.set()
        assert self.release.wait(30)
        return []


@pytest.mark.parametrize("size", [1, 5, 100], ids=["one", "statement", "streamed"])
def test_feed_gives_an_event_whose_transaction_commits_after_a_later_ones(
    database_url: str, ledger: Ledger, account: Account, size: int
) -> None:
    """Transaction A writes first (smaller ids) and commits last; B commits meanwhile
    (PostgreSQL) or waits for A (SQLite's one writer). A poller reading in between must
    not pass A's events: in the end it has A's, then B's, each once."""
    contact = ledger.create_contact(account.id, email="ana@example.com").id
    other = ledger.create_contact(account.id, email="bia@example.com").id
    held = _Held(ledger, [_event(account.id, contact, u) for u in range(size)], size > 64)
    b: list[UUID | None] = []
    # Another contact and metric: nothing of B waits for A's row locks.
    later = _event(account.id, other, 999, metric_name="Link Clicked")
    writer = threading.Thread(target=lambda: b.append(ledger.emit(later).event_id))
    writer.start()
    if database_url.startswith("postgresql"):
        writer.join()  # B committed while A is open
    between = ledger.read_feed(account.id, FEED_START, 1000)

    held.release.set()
    held.thread.join()
    writer.join()
    rest, _ = _drain(ledger, account.id, want=size + 1 - len(between.events), after=between.next)

    ids = _ids(between.events + rest)
    assert set(ids[:size]) == {e.id for e in held.prepared}
    assert ids[size:] == b


def _write(url: str, account: str, contacts: list[str], worker: int, start: Any) -> int:
    """One writer process: single events, batches of 10 (one statement) and of 80 (COPY
    on PostgreSQL), some in transactions held open 5-50 ms after their writes, with
    occurred_at anywhere in the last year. How many events it stored."""
    rng = random.Random(worker)
    uid, stored = worker * 1_000_000, 0
    with connect(url) as ledger:
        start.wait()
        for _ in range(25):
            size = rng.choice([1, 10, 80])
            events = [
                _event(account, rng.choice(contacts), uid + i,
                       occurred_at=datetime.now(UTC) - timedelta(minutes=rng.randrange(525_600)))
                for i in range(size)
            ]  # fmt: skip
            uid += size
            if rng.random() < 0.5:
                stored += _record_slowly(ledger, events, rng.uniform(0.005, 0.05))
            elif size == 1:
                stored += ledger.emit(events[0]).status == "created"
            else:
                stored += sum(r.status == "created" for r in ledger.emit_many(events))
    return stored


def _record_slowly(ledger: Ledger, events: list[EmitEvent], seconds: float) -> int:
    """Record `events` in a transaction that stays open `seconds` after its writes."""
    now = ledger.clock()
    prepared = [prepare(e, now) for e in events]

    def hold(batch: Sequence[PreparedEvent], outcomes: list[Outcome]) -> list[PreparedEvent]:
        time.sleep(seconds)
        return []

    if len(events) > 64:
        outcomes = ledger.store.record_chunks([prepared], [identify(e) for e in events], None, hold)
    else:
        outcomes = ledger.store.record(prepared, hold)
    return sum(o.kind == "created" for o in outcomes)


@pytest.mark.slow
def test_feed_under_concurrent_writers_gives_every_stored_event_once(
    database_url: str,
) -> None:
    """Three processes write at once, many transactions held open after their writes; a
    poller reads the feed all along. It ends with exactly the stored events, none twice."""
    with connect(database_url) as ledger:
        account = ledger.create_account("Loja")
        contacts = [
            str(ledger.create_contact(account.id, external_id=f"c{i}").id) for i in range(5)
        ]
        start = SPAWN.Manager().Event()
        with SPAWN.Pool(3) as pool:
            jobs = [
                pool.apply_async(_write, (database_url, str(account.id), contacts, w, start))
                for w in range(3)
            ]
            start.set()
            seen: list[UUID] = []
            after = FEED_START
            while not all(job.ready() for job in jobs):
                page = ledger.read_feed(account.id, after, 50)
                seen += _ids(page.events)
                after = page.next
                if not page.has_more:
                    time.sleep(0.005)
            written = sum(job.get() for job in jobs)
        stored = {
            UUID(str(r[0]))
            for r in sql(
                database_url, "SELECT id FROM events WHERE account_id = ?", str(account.id)
            )
        }
        rest, _ = _drain(ledger, account.id, want=len(stored) - len(seen), after=after)
        seen += _ids(rest)

    assert written == len(stored)
    assert len(seen) == len(set(seen))
    assert set(seen) == stored


def test_migration_0021_puts_the_events_stored_before_it_first_in_the_feed(
    empty_url: str,
) -> None:
    _migrate_up_to(empty_url, 20)
    with connect(empty_url) as ledger:
        account = ledger.create_account("Loja")
    old = [uuid4() for _ in range(3)]
    for i, ident in enumerate(old):
        at = f"2026-01-01T00:00:0{i}.000000Z"
        sql(empty_url, "INSERT INTO events (account_id, id, contact_id, metric_id, metric_name, "
            "source, occurred_at, received_at, schema_version, created_at) "
            "VALUES (?, ?, ?, ?, 'Order Paid', 'api', ?, ?, 1, ?)",
            str(account.id), str(ident), str(uuid4()), str(uuid4()), at, at, at)  # fmt: skip

    with connect(empty_url) as ledger:
        assert 21 in ledger.migrate()
        contact = ledger.create_contact(account.id, email="ana@example.com").id
        new = ledger.emit(_event(account.id, contact, 1)).event_id
        got, _ = _drain(ledger, account.id, want=4)

    ids = _ids(got)
    assert set(ids[:3]) == set(old)
    assert ids[3] == new
    if empty_url.startswith("sqlite:"):  # numbered by arrival (on PostgreSQL: one transaction)
        assert ids[:3] == old
