"""`rebuild_summaries` while writers write: nothing lost, and nobody else held up."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID, uuid4

import psycopg
import pytest

import sinal
from sinal import EmitEvent, Ledger
from sinal.store import base
from sinal.store.base import EventQuery, RebuildReport
from sinal.store.sqlite import ts
from tests.helpers import sql

T0 = datetime(2026, 6, 1, tzinfo=UTC)
METRICS = ["Order Paid", "Message Read", "Quiz Answered", "Survey Sent"]


def _event(account: sinal.Account, contact: UUID, rnd: random.Random, n: int) -> EmitEvent:
    return EmitEvent(
        account_id=account.id,
        contact_id=contact,
        metric_name=rnd.choice(METRICS),
        source="rebuild",
        source_id=str(rnd.randrange(n)),  # repeats: duplicates too
        value=Decimal(rnd.randrange(-500, 5000)) / 100 if rnd.random() < 0.8 else None,
        currency=rnd.choice(["BRL", "BRL", "USD"]),  # a row per currency
        occurred_at=T0 + timedelta(minutes=rnd.randrange(-50_000, 50_000)),  # out of order
    )


Key = tuple[UUID, str, str]  # contact, metric, currency


def _group_by(ledger: Ledger, account: sinal.Account) -> dict[Key, tuple[object, ...]]:
    """The oracle: the account's events, added up in Python by contact, metric and
    currency (a total None while none has a value, as SQL's SUM)."""
    truth: dict[Key, tuple[int, Decimal | None, datetime, datetime]] = {}
    for ev in ledger.list_events(EventQuery(account.id, limit=100_000)):
        key = (ev.contact_id, ev.metric_name, ev.currency)
        n, total, first, last = truth.get(key, (0, None, ev.occurred_at, ev.occurred_at))
        if ev.value is not None:
            total = ev.value if total is None else total + ev.value
        truth[key] = (n + 1, total, min(first, ev.occurred_at), max(last, ev.occurred_at))
    return dict(truth)


def _summaries(ledger: Ledger, account: sinal.Account) -> dict[Key, tuple[object, ...]]:
    return {
        (s.contact_id, s.metric_name, s.currency):
            (s.event_count, s.total_value, s.first_event_at, s.last_event_at)
        for s in ledger.get_summary(account.id)
    }  # fmt: skip


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three contacts per rebuild transaction: every account spans several chunks."""
    monkeypatch.setattr(base, "REBUILD_CONTACTS", 3)


@pytest.mark.usefixtures("small_chunks")
def test_rebuilds_during_writes_leave_summaries_equal_to_the_events(
    ledger: Ledger, database_url: str
) -> None:
    account = ledger.create_account("Rebuilt while written")
    contacts = [ledger.create_contact(account.id, external_id=f"c{i}").id for i in range(8)]
    seed = random.Random(7)
    ledger.emit_many([_event(account, seed.choice(contacts), seed, 400) for _ in range(300)])
    # Drift of every kind, in the first chunk and the last: wrong figures, a missing row, a
    # row with no events behind it.
    sql(database_url, "UPDATE contact_metrics_summary SET event_count = event_count + 5, "
        "first_event_at = ? WHERE contact_id = ?", ts(T0 - timedelta(days=900)),
        str(contacts[-1]))  # fmt: skip
    sql(database_url, "DELETE FROM contact_metrics_summary WHERE contact_id = ?", str(contacts[1]))
    sql(database_url, "INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, "
        "currency, id, event_count, total_value, first_event_at, last_event_at, updated_at) "
        "VALUES (?, ?, ?, 'BRL', ?, 3, 9, ?, ?, ?)", str(account.id), str(contacts[2]),
        "Never Emitted", str(uuid4()), ts(T0), ts(T0), ts(T0))  # fmt: skip

    errors: list[BaseException] = []

    def write(worker: int) -> None:
        rnd = random.Random(worker)
        try:
            for i in range(40):
                if i % 4 == 0:  # batches too, over many contacts (and locks)
                    ledger.emit_many([_event(account, rnd.choice(contacts), rnd, 400)
                                      for _ in range(12)])  # fmt: skip
                else:
                    ledger.emit(_event(account, rnd.choice(contacts), rnd, 400))
        except BaseException as exc:  # reported below
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in writers:
        t.start()
    reports: list[RebuildReport] = []
    while any(t.is_alive() for t in writers) or not reports:
        [report] = ledger.rebuild_summaries(account.id)
        reports.append(report)
    for t in writers:
        t.join()

    assert errors == []
    assert reports[0].drift >= 3
    # No rebuild after the writers stopped: every addition made while rebuilds ran is kept.
    assert _summaries(ledger, account) == _group_by(ledger, account)
    [last] = ledger.rebuild_summaries(account.id)
    assert last.drift == 0


@pytest.fixture
def blocker(pg_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A PostgreSQL transaction, left open by the test, for holding row locks."""
    with psycopg.connect(pg_url) as conn:
        yield conn
        conn.rollback()


def _waiting_on_a_lock(pg_url: str, timeout: float = 30.0) -> bool:
    """Whether some other backend of the database waits for a lock (polled)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()
            if waiting and waiting[0]:
                return True
            time.sleep(0.02)
    return False


@pytest.mark.postgres
def test_a_rebuild_waiting_on_one_account_holds_up_no_other_account(
    pg_url: str, blocker: psycopg.Connection[tuple[object, ...]]
) -> None:
    with sinal.connect(pg_url) as ledger:
        busy, other = ledger.create_account("Busy"), ledger.create_account("Other")
        ana = ledger.create_contact(busy.id, external_id="ana")
        bia = ledger.create_contact(other.id, external_id="bia")
        for account, contact in ((busy, ana), (other, bia)):
            ledger.emit_event(account_id=account.id, contact_id=contact.id,
                              metric_name="Order Paid", source="shop", source_id="1",
                              value=Decimal("10.00"))  # fmt: skip
        sql(pg_url, "UPDATE contact_metrics_summary SET event_count = 9 WHERE account_id = ?",
            str(busy.id))  # fmt: skip
        # A writer of Busy's summary row, slow to commit: the rebuild of Busy waits for it.
        blocker.execute(
            "SELECT 1 FROM contact_metrics_summary WHERE account_id = %s FOR UPDATE", (busy.id,)
        )
        reports: list[list[RebuildReport]] = []
        rebuild = threading.Thread(target=lambda: reports.append(ledger.rebuild_summaries()))
        rebuild.start()
        assert _waiting_on_a_lock(pg_url)

        # Meanwhile another account's events go in.
        answers: list[sinal.EmitResult] = []

        def write_other() -> None:
            answers.append(
                ledger.emit_event(
                    account_id=other.id,
                    contact_id=bia.id,
                    metric_name="Order Paid",
                    source="shop",
                    source_id="2",
                    value=Decimal("5.00"),
                )
            )

        writer = threading.Thread(target=write_other)
        writer.start()
        writer.join(timeout=30)
        held_up = writer.is_alive()
        alive = rebuild.is_alive()
        blocker.rollback()  # the slow writer ends; the rebuild goes on
        rebuild.join(timeout=60)
        writer.join(timeout=60)

        assert not held_up, "another account's writer waited for the rebuild"
        assert alive, "the rebuild did not wait for the locked row"
        assert [a.status for a in answers] == ["created"]
        [(busy_report, other_report)] = [sorted(r, key=lambda x: x.account_id != busy.id)
                                         for r in reports]  # fmt: skip
        assert (busy_report.changed, other_report.drift) == (1, 0)
        counts = {s.metric_name: s.event_count for s in ledger.get_summary(busy.id)}
        assert counts == {"Order Paid": 1}
        assert [s.event_count for s in ledger.get_summary(other.id)] == [2]


@pytest.mark.usefixtures("small_chunks")
def test_rebuild_reports_progress_in_contacts(ledger: Ledger) -> None:
    first, second = ledger.create_account("First"), ledger.create_account("Second")
    for account, n in ((first, 7), (second, 2)):
        for i in range(n):
            ledger.create_contact(account.id, external_id=f"c{i}")
    seen: list[tuple[int, int]] = []

    ledger.rebuild_summaries(first.id, lambda done, total: seen.append((done, total)))
    assert seen == [(3, 7), (6, 7), (7, 7)]
    seen.clear()
    ledger.rebuild_summaries(None, lambda done, total: seen.append((done, total)))
    assert seen == [(3, 9), (6, 9), (7, 9), (9, 9)]


def test_rebuild_of_every_account_reads_the_accounts_a_page_at_a_time(
    ledger: Ledger, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every account's id was read into memory before the first was rebuilt. They are read
    a page at a time as the rebuild goes: an account made while it runs, whose id comes
    last, is rebuilt too; and each report comes as its account is done."""
    monkeypatch.setattr(base, "REBUILD_ACCOUNTS", 2, raising=False)
    accounts = [ledger.create_account(f"Loja {n}") for n in range(3)]
    for account in accounts:
        ledger.create_contact(account.id, external_id="ana")
    late: list[sinal.Account] = []

    def make_one_more(done: int, total: int) -> None:
        if not late:  # once the first account is done, before the next page is read
            late.append(ledger.create_account("Depois"))
            contact = ledger.create_contact(late[0].id, external_id="bia")
            ledger.emit_event(account_id=late[0].id, contact_id=contact.id,
                              metric_name="Order Paid", source="shop", source_id="1")  # fmt: skip
            sql(database_url, "DELETE FROM contact_metrics_summary WHERE account_id = ?",
                str(late[0].id))  # fmt: skip

    reports = ledger.rebuild_summaries(None, make_one_more)

    assert [r.account_id for r in reports] == [*sorted(a.id for a in accounts), late[0].id]
    assert (reports[-1].inserted, reports[-1].rows) == (1, 1)
    assert [s.event_count for s in ledger.get_summary(late[0].id)] == [1]
