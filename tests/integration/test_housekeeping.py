"""The worker's housekeeping on both backends: periodic tasks beside dispatch, failures
logged and retried, abandoned checkouts drained in batches."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import cast
from uuid import UUID

import pytest

from sinal import Ledger
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.metrics import WorkerMetrics
from sinal.automations.service import Automations
from sinal.commerce import derive_all_abandoned
from sinal.config import Settings
from sinal.errors import StoreError
from sinal.housekeeping import TASKS, resolve
from sinal.retention import Retention, prune_versions
from sinal.store.base import EventQuery
from sinal.store.commerce import CommerceStore
from sinal.webhooks import process_deferred
from sinal.worker import dispatch_settings
from tests.contract.test_retention import OLD, YOUNG, age_rejection, reject
from tests.helpers import count, save_checkouts, sql

T0 = datetime(2026, 3, 2, 15, 0, tzinfo=UTC)


def wait_for(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_registry_names_the_abandoned_checkout_drain_the_deferred_deliveries_and_versions() -> (
    None
):
    tasks = [resolve(task) for task in TASKS]
    assert tasks == [derive_all_abandoned, process_deferred, prune_versions]


def test_a_failing_task_is_logged_and_runs_again_while_the_worker_goes_on(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    calls: Counter[str] = Counter()

    def broken(ledger: Ledger, now: datetime) -> None:
        calls["broken"] += 1
        raise RuntimeError("a bug in a task")

    def database_away(ledger: Ledger, now: datetime) -> None:
        calls["database_away"] += 1
        raise StoreError("connection refused")

    def fine(ledger: Ledger, now: datetime) -> None:
        calls["fine"] += 1

    account = ledger.create_account("Loja")
    contact = ledger.create_contact(account.id, email="ana@exemplo.com.br")
    Automations(ledger).create(account.id, {
        "name": "vip", "trigger_metric": "Order Paid",
        "steps": [{"type": "add_tag", "tag": "comprou"}],
    })  # fmt: skip
    settings = DispatchSettings(
        poll_interval=0.02, housekeeping_interval=0.02, housekeeping=(broken, database_away, fine)
    )
    dispatcher = Dispatcher(ledger, settings)
    stop = threading.Event()
    worker = threading.Thread(target=dispatcher.run, args=(stop,))
    with caplog.at_level(logging.WARNING, logger="sinal.housekeeping"):
        worker.start()
        try:
            wait_for(lambda: calls["fine"] >= 3)
            ledger.emit_event(
                account_id=account.id, contact_id=contact.id, metric_name="Order Paid", source="api"
            )
            wait_for(lambda: ledger.list_tags(account.id, contact.id) == ["comprou"])
            assert worker.is_alive()
        finally:
            stop.set()
            worker.join(timeout=15)
            dispatcher.close()

    assert calls["broken"] >= 3
    assert calls["database_away"] >= 3
    failures = [r for r in caplog.records if r.name == "sinal.housekeeping"]
    assert {r.levelname for r in failures if "broken" in r.getMessage()} == {"ERROR"}
    assert any(r.exc_info for r in failures if "broken" in r.getMessage())
    away = [r.getMessage() for r in failures if "database_away" in r.getMessage()]
    assert away
    assert all(m.endswith("connection refused") for m in away)


def test_derive_all_abandoned_drains_the_backlog_in_batches(ledger: Ledger) -> None:
    account = ledger.create_account("Loja")
    save_checkouts(ledger, account.id, 7, updated_at=T0)
    due = T0 + timedelta(minutes=30)

    assert derive_all_abandoned(ledger, due - timedelta(seconds=1), limit=3) == 0
    assert derive_all_abandoned(ledger, due, limit=3, max_rounds=2) == 6  # capped
    assert derive_all_abandoned(ledger, due, limit=3) == 1  # the rest, next run
    assert derive_all_abandoned(ledger, due, limit=3) == 0

    assert abandoned_tokens(ledger, account.id) == [f"checkout-{i:04d}" for i in range(7)]


def test_a_checkout_no_event_can_abandon_stops_being_due_once_and_holds_back_none(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    account = ledger.create_account("Loja")
    # Updated in 1999 (a snapshot no check refused): its Checkout Abandoned would occur
    # before 2000, out of the accepted window, on every pass. A page of them came first.
    save_checkouts(ledger, account.id, 3, updated_at=datetime(1999, 12, 1, tzinfo=UTC))
    save_checkouts(ledger, account.id, 2, updated_at=T0)
    due = T0 + timedelta(minutes=30)

    with caplog.at_level(logging.WARNING, logger="sinal.commerce"):
        assert derive_all_abandoned(ledger, due, limit=3) == 2
        assert derive_all_abandoned(ledger, due + timedelta(days=1), limit=3) == 0

    assert abandoned_tokens(ledger, account.id) == ["checkout-0000", "checkout-0001"]
    assert cast(CommerceStore, ledger.store).due_checkouts(due + timedelta(days=1)) == []
    dropped = [r for r in caplog.records if r.name == "sinal.commerce"]
    assert len(dropped) == 3  # once each, not on every pass
    assert all(r.levelname == "WARNING" and not r.exc_info for r in dropped)
    assert all("no longer due" in r.getMessage() for r in dropped)


# The database refuses the abandonment of the first checkout due (a refusal no validation
# foresaw: a constraint, a value, a text).
_REFUSE_FIRST = {
    "sqlite": "CREATE TRIGGER refuse_first BEFORE INSERT ON events "
              "WHEN json_extract(NEW.properties, '$.checkout_token') = 'checkout-0000' "
              "BEGIN SELECT RAISE(ABORT, 'refused'); END",
    "postgres": "ALTER TABLE events ADD CONSTRAINT refuse_first "
                "CHECK (properties ->> 'checkout_token' IS DISTINCT FROM 'checkout-0000')",
}  # fmt: skip


def test_a_checkout_the_database_refuses_stops_being_due_once_and_holds_back_none(
    ledger: Ledger, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, its StoreError ended the pass, and the next one, oldest due first, met it
    first again: no other checkout was ever abandoned. A page of one (limit=1) holding it
    must not hold back the rest, nor be met again."""
    account = ledger.create_account("Loja")
    save_checkouts(ledger, account.id, 4, updated_at=T0)
    sql(database_url, _REFUSE_FIRST["sqlite" if database_url.startswith("sqlite") else "postgres"])
    due = T0 + timedelta(minutes=30)

    with caplog.at_level(logging.ERROR, logger="sinal.commerce"):
        assert derive_all_abandoned(ledger, due, limit=1) == 3
        assert derive_all_abandoned(ledger, due, limit=1) == 0

    assert abandoned_tokens(ledger, account.id) == [f"checkout-{i:04d}" for i in range(1, 4)]
    assert cast(CommerceStore, ledger.store).due_checkouts(due) == []
    refused = [r for r in caplog.records if "checkout-0000" in r.getMessage()]
    assert len(refused) == 1  # once, not on every pass
    assert "no longer due" in refused[0].getMessage()


# The first checkout due meets a fault that is not its data's: a schema changed under sinal
# (an operator's trigger that fails), which a fix mends. SQLite's json() of a text that is
# not JSON is its generic error; PostgreSQL's 42883 an undefined function.
_FAIL_FIRST = {
    "sqlite": ("CREATE TRIGGER fail_first BEFORE INSERT ON events "
               "WHEN json_extract(NEW.properties, '$.checkout_token') = 'checkout-0000' "
               "BEGIN SELECT json('{'); END", "DROP TRIGGER fail_first"),
    "postgres": ("CREATE FUNCTION fail_first() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.properties ->> 'checkout_token' = 'checkout-0000' THEN "
                 "RAISE EXCEPTION 'no such function' USING ERRCODE = '42883'; END IF; "
                 "RETURN NEW; END $$; CREATE TRIGGER fail_first BEFORE INSERT ON events "
                 "FOR EACH ROW EXECUTE FUNCTION fail_first()",
                 "DROP TRIGGER fail_first ON events"),
}  # fmt: skip


def test_a_checkout_whose_abandonment_fails_for_no_fault_of_its_data_stays_due(
    ledger: Ledger, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, any StoreError but the database being away made the checkout no longer due,
    as a refusal of its data does: a fault of sinal's own statement, or of a schema changed
    under it, lost the abandonment for good, though it would record once mended. It stays
    due, holds back none (a page of one), and records once the fault is gone."""
    account = ledger.create_account("Loja")
    save_checkouts(ledger, account.id, 4, updated_at=T0)
    fail, mend = _FAIL_FIRST["sqlite" if database_url.startswith("sqlite") else "postgres"]
    sql(database_url, fail)
    due = T0 + timedelta(minutes=30)

    with caplog.at_level(logging.ERROR, logger="sinal.commerce"):
        assert derive_all_abandoned(ledger, due, limit=1) == 3
        assert derive_all_abandoned(ledger, due, limit=1) == 0  # tried again, still failing

    assert abandoned_tokens(ledger, account.id) == [f"checkout-{i:04d}" for i in range(1, 4)]
    store = cast(CommerceStore, ledger.store)
    assert [c.token for c in store.due_checkouts(due)] == ["checkout-0000"]
    failed = [r for r in caplog.records if "checkout-0000" in r.getMessage()]
    assert len(failed) == 2  # once a run
    assert all("tried again on the next run" in r.getMessage() for r in failed)

    sql(database_url, mend)
    assert derive_all_abandoned(ledger, due, limit=1) == 1
    assert abandoned_tokens(ledger, account.id) == [f"checkout-{i:04d}" for i in range(4)]
    assert store.due_checkouts(due) == []


def test_the_checkouts_of_a_deleted_integration_are_never_abandoned_and_hold_back_none(
    ledger: Ledger,
) -> None:
    account = ledger.create_account("Loja")
    # The store the user disconnected had a page of checkouts due first.
    gone = save_checkouts(ledger, account.id, 3, T0 - timedelta(hours=1), prefix="gone")
    kept = save_checkouts(ledger, account.id, 2, updated_at=T0)
    assert Automations(ledger).store.delete_integration(account.id, gone)
    due = T0 + timedelta(minutes=30)

    assert derive_all_abandoned(ledger, due, limit=3) == 2

    found = ledger.list_events(EventQuery(account.id, metric_name="Checkout Abandoned"))
    assert sorted((e.integration_id, e.properties["checkout_token"]) for e in found) == [
        (kept, "checkout-0000"), (kept, "checkout-0001"),
    ]  # fmt: skip
    later = due + timedelta(days=1)
    assert cast(CommerceStore, ledger.store).due_checkouts(later) == []  # no longer due
    assert derive_all_abandoned(ledger, later, limit=3) == 0


def abandoned_tokens(ledger: Ledger, account_id: UUID) -> list[str]:
    found = ledger.list_events(EventQuery(account_id, metric_name="Checkout Abandoned"))
    return sorted(e.properties["checkout_token"] for e in found)


def test_a_housekeeping_pass_runs_on_the_ledgers_clock(ledger: Ledger) -> None:
    account = ledger.create_account("Loja")
    save_checkouts(ledger, account.id, 2, updated_at=T0)
    now = T0
    timed = Ledger(ledger.store, clock=lambda: now)
    dispatcher = Dispatcher(timed, DispatchSettings())
    try:
        assert dispatcher.housekeep() == 0  # no task failed
        assert abandoned_tokens(ledger, account.id) == []
        now = T0 + timedelta(minutes=30)
        assert dispatcher.housekeep() == 0
    finally:
        dispatcher.close()

    abandoned = ledger.list_events(EventQuery(account.id, metric_name="Checkout Abandoned"))
    assert len(abandoned) == 2
    assert {e.received_at for e in abandoned} == {now}


def test_a_housekeeping_pass_prunes_what_the_workers_settings_let_go_and_counts_it(
    ledger: Ledger, database_url: str
) -> None:
    account = ledger.create_account("Loja")
    for days in (OLD, OLD, OLD, YOUNG):
        age_rejection(database_url, reject(ledger, account.id), days)
    settings = dispatch_settings(Settings(rejections_retention_days=30))
    assert settings.retention == Retention(rejections=30)
    metrics = WorkerMetrics()
    dispatcher = Dispatcher(ledger, settings, metrics=metrics)
    try:
        assert dispatcher.housekeep() == 0  # no task failed
        assert dispatcher.housekeep() == 0  # nothing more to prune
    finally:
        dispatcher.close()

    assert count(database_url, "rejections") == 1
    pruned = metrics.registry.get_sample_value(
        "sinal_worker_rows_pruned_total", {"table": "rejections"}
    )
    assert pruned == 3
