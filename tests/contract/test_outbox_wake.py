"""Writers of the outbox wake the workers only while one waits (PostgreSQL, migration 0014).

A transaction that notifies commits while holding a lock of the whole server, so writers
notify only while the `outbox_wake` flag is armed, or while a worker arming it holds the
barrier lock. These tests check each part, then a worker that can only be woken by a
NOTIFY (its poll is a minute away) fanning out every event of writers that come and go.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import sinal
from sinal import Ledger
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.ledger import connect
from sinal.store.postgres import PostgresStore
from sinal.store.postgres_automations import listen
from tests.helpers import count, cut_connections, sql, wait_until

pytestmark = pytest.mark.postgres

BARRIER = (1936289388, 14)  # the advisory lock of migration 0014


@pytest.fixture
def pg_ledger(pg_url: str) -> Iterator[Ledger]:
    ledger = connect(pg_url)
    yield ledger
    ledger.close()


@pytest.fixture
def listener(pg_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("LISTEN sinal_outbox")
        conn.execute("LISTEN sinal_test_end")
        yield conn


def _store(ledger: Ledger) -> PostgresStore:
    assert isinstance(ledger.store, PostgresStore)
    return ledger.store


def _notified(listener: psycopg.Connection[tuple[object, ...]], url: str) -> int:
    """The NOTIFYs on "sinal_outbox" that arrived before a marker sent now: PostgreSQL
    delivers notifications in commit order, so every one committed before is counted."""
    sql(url, "NOTIFY sinal_test_end")
    for seen, notice in enumerate(listener.notifies(timeout=10.0)):
        if notice.channel == "sinal_test_end":
            return seen
    raise AssertionError("the end marker never arrived")


def _waits_for_the_barrier(url: str) -> bool:
    """Whether PostgreSQL shows a session arming the flag waiting for the barrier lock."""
    waiting = sql(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
        "AND strpos(query, 'sinal_outbox_arm') > 0",
    )
    return waiting == [(1,)]


def _disarm(url: str) -> None:
    """Lower the flag, as a worker's listener does when a NOTIFY wakes it."""
    sql(url, "UPDATE outbox_wake SET armed = false")


def _order_paid(account: sinal.Account, contact: sinal.Contact) -> dict[str, Any]:
    return {
        "account_id": account.id, "contact_id": contact.id, "source": "shopify",
        "metric_name": sinal.METRIC_ORDER_PAID, "source_id": uuid.uuid4().hex,
    }  # fmt: skip


def _emit(ledger: Ledger, account: sinal.Account, contact: sinal.Contact, n: int = 1) -> None:
    for _ in range(n):
        ledger.emit_event(**_order_paid(account, contact))


def _batch(account: sinal.Account, contact: sinal.Contact, n: int) -> list[sinal.EmitEvent]:
    return [sinal.EmitEvent(**_order_paid(account, contact)) for _ in range(n)]


def test_writers_notify_only_while_the_flag_is_armed(
    pg_ledger: Ledger, pg_url: str, listener: psycopg.Connection[tuple[object, ...]]
) -> None:
    account = pg_ledger.create_account("Loja")
    contact = pg_ledger.create_contact(account.id, phone="+55 11 98765-4321")
    store = _store(pg_ledger)
    assert sql(pg_url, "SELECT armed FROM outbox_wake") == [(True,)]  # as migrated

    _emit(pg_ledger, account, contact)
    assert _notified(listener, pg_url) == 1  # armed: writers notify, as before 0014

    _disarm(pg_url)
    _emit(pg_ledger, account, contact, 3)
    pg_ledger.emit_many(_batch(account, contact, 5))  # one statement
    pg_ledger.emit_many(_batch(account, contact, 600))  # streamed: COPY, closing statements
    assert _notified(listener, pg_url) == 0
    assert count(pg_url, "outbox") == 1 + 3 + 5 + 600  # the rows are there all the same

    store.arm_outbox()
    _emit(pg_ledger, account, contact)
    pg_ledger.emit_many(_batch(account, contact, 600))
    assert _notified(listener, pg_url) == 2
    [row] = sql(pg_url, "SELECT source_id FROM events LIMIT 1")
    pg_ledger.emit_event(
        account_id=account.id,
        contact_id=contact.id,
        metric_name=sinal.METRIC_ORDER_PAID,
        source="shopify",
        source_id=row[0],
    )  # a duplicate adds no outbox row: no NOTIFY, armed or not
    assert _notified(listener, pg_url) == 0


def test_a_writer_notifies_while_a_worker_holds_the_barrier(
    pg_ledger: Ledger, pg_url: str, listener: psycopg.Connection[tuple[object, ...]]
) -> None:
    account = pg_ledger.create_account("Loja")
    contact = pg_ledger.create_contact(account.id, phone="+55 11 98765-4321")
    _disarm(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as worker:
        worker.execute("SELECT pg_advisory_lock(%s, %s)", BARRIER)  # as while arming
        _emit(pg_ledger, account, contact)
        pg_ledger.emit_many(_batch(account, contact, 3))
        assert _notified(listener, pg_url) == 2
        worker.execute("SELECT pg_advisory_unlock(%s, %s)", BARRIER)
    _emit(pg_ledger, account, contact)
    assert _notified(listener, pg_url) == 0


def test_arming_waits_for_the_writers_that_would_not_notify(pg_ledger: Ledger, pg_url: str) -> None:
    """A writer that added outbox rows and saw the flag down holds the barrier in shared
    mode until it commits: arming returns only then, so the worker's next look at the
    outbox sees those rows."""
    account = pg_ledger.create_account("Loja")
    contact = pg_ledger.create_contact(account.id, phone="+55 11 98765-4321")
    store = _store(pg_ledger)
    _disarm(pg_url)
    with psycopg.connect(pg_url) as writer:  # a transaction left open after its insert
        writer.execute(
            "INSERT INTO outbox (account_id, event_id, metric_name) VALUES (%s, %s, 'x')",
            (account.id, uuid.uuid4()),
        )
        armed = threading.Event()

        def arm() -> None:
            store.arm_outbox()
            armed.set()

        arming = threading.Thread(target=arm)
        arming.start()
        wait_until(lambda: _waits_for_the_barrier(pg_url))
        assert _waits_for_the_barrier(pg_url)
        assert not armed.is_set()
        assert sql(pg_url, "SELECT armed FROM outbox_wake") == [(False,)]  # not committed
        writer.commit()
        arming.join(timeout=10)
        assert armed.is_set()
    assert sql(pg_url, "SELECT armed FROM outbox_wake") == [(True,)]
    _emit(pg_ledger, account, contact)  # arming when armed returns at once
    store.arm_outbox()


def test_a_worker_woken_only_by_notify_fans_out_every_event(pg_ledger: Ledger, pg_url: str) -> None:
    """Writers on four threads emit in bursts with pauses (the worker goes back to waiting
    between them, and arms each time); its poll is a minute away, so every event is fanned
    out only if some writer notified after the worker's last look."""
    account = pg_ledger.create_account("Loja")
    contacts = [
        pg_ledger.create_contact(account.id, phone=f"+55 11 98765-43{i:02}") for i in range(8)
    ]
    Automations(pg_ledger).create(account.id, {
        "name": "tag buyers", "trigger_metric": sinal.METRIC_ORDER_PAID,
        "steps": [{"type": "add_tag", "tag": "comprou"}],
    })  # fmt: skip
    settings = DispatchSettings(poll_interval=60.0, fan_out_interval=0.01)
    dispatcher = Dispatcher(pg_ledger, settings)
    stop = threading.Event()
    worker = threading.Thread(target=dispatcher.run, args=(stop,))
    worker.start()
    emitted = 0
    lock = threading.Lock()

    def writer(seed: int) -> None:
        nonlocal emitted
        rng = random.Random(seed)
        for _ in range(15):
            burst = rng.randint(1, 6)
            if rng.random() < 0.3:
                pg_ledger.emit_many(
                    _batch(account, rng.choice(contacts), burst)  # one statement
                )
            else:
                _emit(pg_ledger, account, rng.choice(contacts), burst)
            with lock:
                emitted += burst
            time.sleep(rng.choice((0, 0.001, 0.005, 0.02, 0.06)))

    try:
        writers = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        wait_until(lambda: count(pg_url, "executions") == emitted, timeout=20)
        assert count(pg_url, "executions") == emitted
        assert count(pg_url, "outbox") == 0
    finally:
        stop.set()
        worker.join(timeout=70)
    assert not worker.is_alive()
    # the worker armed the flag again as it stopped
    assert sql(pg_url, "SELECT armed FROM outbox_wake") == [(True,)]


def test_a_listener_whose_connection_is_cut_listens_again(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    states: list[bool] = []
    notices = listen(pg_url, ["sinal_outbox"], timeout=0.1, on_state=states.append)
    assert next(notices) == set()  # listening; nothing came within the timeout

    assert cut_connections(pg_url) == 1
    assert next(notices) == set()  # the broken wait: the caller polls meanwhile
    assert next(notices) == set()  # listening again
    sql(pg_url, "NOTIFY sinal_outbox")

    assert next(notices) == {"sinal_outbox"}
    assert "listening for notifications failed, polling meanwhile" in caplog.text
    assert "listening for notifications again, after 1 failed attempts" in caplog.text
    assert states == [True, False, True]  # the worker's gauge and outage counter


def test_a_listener_that_cannot_connect_tries_again_at_a_measured_pace(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A database the server does not have: every attempt fails at once. The listener
    # used to try again at once, ~5,000 times a second, spinning a core.
    missing = pg_url.rsplit("/", 1)[0] + "/sinal_no_such_database"
    started = time.monotonic()
    attempts = 0
    for notified in listen(missing, ["sinal_outbox"], timeout=1.0):
        assert notified == set()
        attempts += 1
        if time.monotonic() - started > 1.0:
            break

    assert attempts <= 6  # 0.1, 0.2, 0.5 and 1 s apart
    assert caplog.text.count("listening for notifications failed") == 1  # once per outage
