"""Proof under concurrency: real OS processes racing on one database, both backends."""

from __future__ import annotations

import multiprocessing
import random
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from sinal import EmitEvent, connect
from sinal.commerce import derive_all_abandoned
from sinal.store.base import EventQuery
from tests.helpers import count, save_checkouts, sql

pytestmark = pytest.mark.slow

T0 = datetime(2026, 10, 1, tzinfo=UTC)
SPAWN = multiprocessing.get_context("spawn")  # children share nothing but the database


def _event(account: str, contacts: list[str], uid: int) -> EmitEvent:
    """The event for a unique id: identical in every process that emits it."""
    rng = random.Random(uid)
    return EmitEvent(
        account_id=account,
        contact_id=contacts[rng.randrange(len(contacts))],
        metric_name=rng.choice(["Order Paid", "Message Delivered", "Link Clicked"]),
        source="race",
        source_id=str(uid),
        value=Decimal(rng.randrange(0, 100_000)) / 100,
        occurred_at=T0 + timedelta(minutes=rng.randrange(-50_000, 50_000)),
    )


def _emit_same_ids(
    url: str, account: str, contacts: list[str], seed: int, start: Any
) -> dict[int, str]:
    """Emit ids 0..499 in a shuffled order, half one by one, half in batches."""
    ids = list(range(500))
    random.Random(seed).shuffle(ids)
    got: dict[int, str] = {}
    with connect(url) as ledger:
        start.wait()
        if seed % 2:
            for uid in ids:
                got[uid] = str(ledger.emit(_event(account, contacts, uid)).event_id)
        else:
            for i in range(0, len(ids), 125):  # more than a chunk: by COPY on PostgreSQL
                chunk = ids[i : i + 125]
                results = ledger.emit_many([_event(account, contacts, u) for u in chunk])
                got.update({u: str(r.event_id) for u, r in zip(chunk, results, strict=True)})
    return got


def _emit_mixed(url: str, account: str, contacts: list[str], worker: int, start: Any) -> int:
    """5,000 events: 70% ids of this worker's own, 30% drawn from a pool shared by all."""
    rng = random.Random(1000 + worker)
    ids = [worker * 1_000_000 + i for i in range(3500)]
    ids += [rng.randrange(1000) for _ in range(1500)]  # shared pool: cross-process duplicates
    rng.shuffle(ids)
    created = 0
    with connect(url) as ledger:
        start.wait()
        for i in range(0, len(ids), 250):
            results = ledger.emit_many([_event(account, contacts, u) for u in ids[i : i + 250]])
            created += sum(r.status == "created" for r in results)
    return created


def _derive_abandoned(url: str, now: str, worker: int, start: Any) -> int:
    """One worker's housekeeping pass, in small batches: how many abandonments it recorded."""
    with connect(url) as ledger:
        start.wait()
        return derive_all_abandoned(ledger, datetime.fromisoformat(now), limit=10)


def _run(processes: int, target: Callable[..., Any], *args: Any) -> list[Any]:
    start = SPAWN.Manager().Barrier(processes)
    with SPAWN.Pool(processes) as pool:
        pending = [pool.apply_async(target, (*args, n, start)) for n in range(processes)]
        return [p.get(timeout=600) for p in pending]


def _setup(url: str, contacts: int) -> tuple[str, list[str]]:
    with connect(url) as ledger:
        account = ledger.create_account("Race")
        ids = [
            str(ledger.create_contact(account.id, external_id=f"c{i}").id) for i in range(contacts)
        ]
    return str(account.id), ids


def _expected_summary(events: list[EmitEvent]) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, Decimal(0), None, None])
    for e in events:
        row = rows[(str(e.contact_id), e.metric_name)]
        row[0] += 1
        row[1] += Decimal(str(e.value))
        row[2] = e.occurred_at if row[2] is None else min(row[2], e.occurred_at)
        row[3] = e.occurred_at if row[3] is None else max(row[3], e.occurred_at)
    return {k: tuple(v) for k, v in rows.items()}


def _actual_summary(url: str, account: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    with connect(url) as ledger:
        return {
            (str(s.contact_id), s.metric_name): (
                s.event_count, s.total_value, s.first_event_at, s.last_event_at,
            )
            for s in ledger.get_summary(account)
        }  # fmt: skip


def test_eight_processes_racing_on_the_same_500_ids_store_each_once(database_url: str) -> None:
    _race_on_the_same_ids(database_url)


@pytest.mark.postgres
def test_the_race_holds_whatever_the_databases_session_defaults(pg_unusual_url: str) -> None:
    """sinal's sessions run read committed whatever the database's default: with
    serializable, racing writers failed with serialization errors faster than they retried.
    (And its dates are read back whatever the database's date style.)"""
    _race_on_the_same_ids(pg_unusual_url)


def _race_on_the_same_ids(database_url: str) -> None:
    account, contacts = _setup(database_url, 20)

    answers = _run(8, _emit_same_ids, database_url, account, contacts)

    assert count(database_url, "events") == 500
    for uid in range(500):
        assert len({a[uid] for a in answers}) == 1, f"callers disagree on the event for {uid}"
    with connect(database_url) as ledger:
        stored = {str(e.id) for e in ledger.list_events(EventQuery(account, limit=1000))}  # type: ignore[arg-type]
    assert stored == set(answers[0].values())
    expected = _expected_summary([_event(account, contacts, uid) for uid in range(500)])
    assert _actual_summary(database_url, account) == expected
    assert count(database_url, "outbox") == 500


def test_four_processes_with_thirty_percent_duplicates_keep_exact_counts(
    database_url: str,
) -> None:
    account, contacts = _setup(database_url, 50)

    created = _run(4, _emit_mixed, database_url, account, contacts)

    distinct: set[int] = set()
    for worker in range(4):
        rng = random.Random(1000 + worker)
        distinct.update(worker * 1_000_000 + i for i in range(3500))
        distinct.update(rng.randrange(1000) for _ in range(1500))
    assert sum(created) == len(distinct)
    assert count(database_url, "events") == len(distinct)
    expected = _expected_summary([_event(account, contacts, uid) for uid in distinct])
    assert _actual_summary(database_url, account) == expected


def test_four_workers_deriving_abandoned_checkouts_at_once_record_each_once(
    database_url: str,
) -> None:
    with connect(database_url) as ledger:
        account = ledger.create_account("Race")
        save_checkouts(ledger, account.id, 120, updated_at=T0)
    due = (T0 + timedelta(minutes=30)).isoformat()

    recorded = _run(4, _derive_abandoned, database_url, due)

    assert sum(recorded) == 120  # each counted by the one worker that recorded it
    [(events, tokens)] = sql(
        database_url,
        "SELECT count(*), count(DISTINCT entity_id) FROM events "
        "WHERE metric_name = 'Checkout Abandoned'",
    )
    assert (events, tokens) == (120, 120)
    # drained by one pass of each worker, even as they took turns on the same rows
    assert sql(database_url, "SELECT count(*) FROM checkouts WHERE abandoned_at IS NULL") == [(0,)]
