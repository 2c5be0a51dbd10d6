"""Data retention on both backends: the finished rows past their period are deleted, in
bounded batches, safely from many workers at once; young and unfinished ones stay, and
nothing goes unless a period is set."""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import cast
from uuid import UUID, uuid4

import psycopg
import pytest

from sinal import Ledger, connect
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.ids import new_id
from sinal.retention import VERSION_GRACE, Retention, prune, prune_versions
from sinal.store.automations import AutomationStore
from sinal.store.postgres_retention import _BY_INDEX, _PRUNE_SQL
from sinal.store.retention import (
    PRUNABLE,
    Prunable,
    RetentionStore,
    expired_rows,
    expiry_index,
)
from sinal.store.sqlite import ts
from sinal.store.webhooks import DeliveryStatus, StoredDelivery
from sinal.webhooks import store_of
from tests.helpers import count, sql

PERIOD = 30  # days
INTEGRATION = uuid4()


def days_ago(days: float) -> datetime:
    return datetime.now(UTC) - timedelta(days=days)


OLD, YOUNG = 40, 20  # days: past the period, and within it


def reject(ledger: Ledger, account_id: UUID) -> UUID:
    """A kept rejection (an event for a contact that does not exist); its id."""
    result = ledger.emit_event(
        account_id=account_id, contact_id=uuid4(), metric_name="Order Paid", source="api"
    )
    assert result.rejection_id is not None
    return result.rejection_id


def receive(
    ledger: Ledger, account_id: UUID, delivery_id: str, received_days_ago: float = 0
) -> tuple[StoredDelivery, bool]:
    """A WhatsApp delivery with this provider's id, as the webhook route keeps it: (the
    kept row, whether it is new)."""
    return store_of(ledger).save_delivery(StoredDelivery(
        account_id=account_id, id=new_id(), integration_id=INTEGRATION, provider="whatsapp",
        topic="messages", delivery_id=delivery_id, headers={}, body=b'{"entry": []}',
        received_at=days_ago(received_days_ago), status="received", reason=None, attempts=0,
        processed_at=None,
    ))  # fmt: skip


def deliver(
    ledger: Ledger, account_id: UUID, status: DeliveryStatus, received_days_ago: float
) -> StoredDelivery:
    """A kept webhook delivery, received that long ago and left in `status`."""
    delivery, _ = receive(ledger, account_id, str(uuid4()), received_days_ago)
    if status != "received":
        due = datetime.now(UTC) + timedelta(minutes=1) if status == "deferred" else None
        store_of(ledger).finish_delivery(account_id, delivery.id, status, None, due)
    return delivery


def pay_and_dispatch(ledger: Ledger, account_id: UUID, n: int) -> None:
    """`n` paid orders of a new contact, dispatched until no work is left."""
    contact = ledger.create_contact(account_id, email=f"{uuid4().hex}@exemplo.com.br")
    for i in range(n):
        ledger.emit_event(account_id=account_id, contact_id=contact.id,
                          metric_name="Order Paid", source="api", source_id=str(i))  # fmt: skip
    dispatcher = Dispatcher(ledger, DispatchSettings(housekeeping_interval=0))
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.close()


def run_executions(ledger: Ledger, account_id: UUID, n: int) -> list[UUID]:
    """`n` executions run to completion, one step record each; their ids."""
    Automations(ledger).create(account_id, {
        "name": "tag", "trigger_metric": "Order Paid",
        "steps": [{"type": "add_tag", "tag": "comprou"}],
    })  # fmt: skip
    pay_and_dispatch(ledger, account_id, n)
    executions = cast(AutomationStore, ledger.store).list_executions(account_id, limit=n + 1)
    assert len(executions) == n
    assert {x.status for x in executions} == {"completed"}
    return [x.id for x in executions]


def age_execution(
    url: str, execution_id: UUID, status: str, created_days_ago: float, updated_days_ago: float
) -> None:
    """Leave an execution in `status`, made and last changed that long ago."""
    sql(url, "UPDATE executions SET status = ?, created_at = ?, updated_at = ? WHERE id = ?",
        status, ts(days_ago(created_days_ago)), ts(days_ago(updated_days_ago)),
        str(execution_id))  # fmt: skip


def age_rejection(url: str, rejection_id: UUID, days: float) -> None:
    sql(url, "UPDATE rejections SET created_at = ? WHERE id = ?", ts(days_ago(days)),
        str(rejection_id))  # fmt: skip


def old_rows(ledger: Ledger, url: str, kind: Prunable, n: int) -> list[UUID]:
    """`n` finished rows of `kind`, past the period; their ids."""
    account = ledger.create_account("Loja")
    if kind == "rejections":
        ids = [reject(ledger, account.id) for _ in range(n)]
        for rejection_id in ids:
            age_rejection(url, rejection_id, OLD)
        return ids
    if kind == "webhook_deliveries":
        return [deliver(ledger, account.id, "processed", OLD).id for _ in range(n)]
    ids = run_executions(ledger, account.id, n)
    for execution_id in ids:
        age_execution(url, execution_id, "completed", OLD, OLD)
    return ids


def test_prune_by_default_keeps_every_row_however_old(ledger: Ledger, database_url: str) -> None:
    for kind in PRUNABLE:
        old_rows(ledger, database_url, kind, 2)
    before = {table: count(database_url, table) for table in [*PRUNABLE, "execution_steps"]}

    assert prune(ledger, Retention()) == {}
    dispatcher = Dispatcher(ledger, DispatchSettings())  # what `sinal worker` runs
    try:
        assert dispatcher.housekeep() == 0
    finally:
        dispatcher.close()

    assert {table: count(database_url, table) for table in before} == before
    assert before == {"rejections": 2, "webhook_deliveries": 2, "executions": 2,
                      "execution_steps": 2}  # fmt: skip


def test_prune_deletes_the_rejections_past_their_period_replayed_or_not(
    ledger: Ledger, database_url: str
) -> None:
    account = ledger.create_account("Loja")
    old = [reject(ledger, account.id) for _ in range(3)]
    young = [reject(ledger, account.id) for _ in range(2)]
    for rejection_id in old:
        age_rejection(database_url, rejection_id, OLD)
    for rejection_id in young:
        age_rejection(database_url, rejection_id, YOUNG)
    # the contact came, and the first old one was replayed: it goes too
    contact = ledger.create_contact(account.id, email="ana@exemplo.com.br")
    replayed = ledger.replay_rejection(account.id, old[0], contact.id)
    assert replayed is not None
    assert replayed.outcome is not None
    assert replayed.outcome.event_id is not None
    delivery = deliver(ledger, account.id, "processed", OLD).id  # no period for deliveries

    assert prune(ledger, Retention(rejections=PERIOD)) == {"rejections": 3}

    assert {r.id for r in ledger.list_rejections(account.id)} == set(young)
    assert ledger.replay_rejection(account.id, old[1], contact.id) is None  # as if never kept
    assert [d.id for d in store_of(ledger).list_deliveries(("processed",))] == [delivery]
    assert ledger.get_event(account.id, replayed.outcome.event_id) is not None  # the ledger's


def test_prune_deletes_only_the_finished_deliveries_past_their_period(
    ledger: Ledger, database_url: str
) -> None:
    account = ledger.create_account("Loja")
    gone = [deliver(ledger, account.id, s, OLD) for s in ("processed", "unmappable", "failed")]
    kept = [
        deliver(ledger, account.id, "received", OLD),  # never finished
        deliver(ledger, account.id, "deferred", OLD),  # due to be processed again
        deliver(ledger, account.id, "processed", YOUNG),
    ]

    assert prune(ledger, Retention(webhook_deliveries=PERIOD)) == {"webhook_deliveries": 3}

    statuses: tuple[DeliveryStatus, ...] = ("received", "processed", "unmappable", "failed",
                                            "deferred")  # fmt: skip
    left = store_of(ledger).list_deliveries(statuses)
    assert sorted(d.id for d in left) == sorted(d.id for d in kept)
    # A provider's retry of a pruned delivery is no longer known by its id: it is kept
    # anew (and processed again, which records duplicates, never second events). A retry
    # of a kept one is still recognised.
    assert receive(ledger, account.id, gone[0].delivery_id)[1]
    assert not receive(ledger, account.id, kept[2].delivery_id)[1]


def test_prune_deletes_the_finished_executions_past_their_period_with_their_steps(
    ledger: Ledger, database_url: str
) -> None:
    account = ledger.create_account("Loja")
    ids = iter(run_executions(ledger, account.id, 8))
    gone = {next(ids): s for s in ("completed", "stopped", "dead", "unknown")}
    kept = {next(ids): s for s in ("pending", "waiting")}  # due, running, held or retrying
    young = next(ids)
    long_running = next(ids)  # made long ago, finished within the period
    for execution_id, status in [*gone.items(), *kept.items()]:
        age_execution(database_url, execution_id, status, OLD, OLD)
    age_execution(database_url, young, "completed", YOUNG, YOUNG)
    age_execution(database_url, long_running, "completed", OLD + 30, YOUNG)
    events = count(database_url, "events")

    assert prune(ledger, Retention(executions=PERIOD)) == {"executions": 4}

    store = cast(AutomationStore, ledger.store)
    for execution_id in gone:
        assert store.get_execution(account.id, execution_id) is None
    for execution_id in [*kept, young, long_running]:
        execution = store.get_execution(account.id, execution_id)
        assert execution is not None
        assert len(execution.steps) == 1
    assert count(database_url, "execution_steps") == 4  # none left without its execution
    assert count(database_url, "events") == events  # the ledger's: never pruned


@pytest.mark.parametrize("kind", PRUNABLE)
def test_prune_deletes_in_bounded_batches_and_leaves_the_rest_to_the_next_pass(
    ledger: Ledger, database_url: str, kind: Prunable
) -> None:
    old_rows(ledger, database_url, kind, 7)
    retention = Retention(**{kind: PERIOD})
    done: list[int] = []

    def progress(pruned: Prunable, deleted: int) -> None:
        assert pruned == kind
        done.append(deleted)

    assert prune(ledger, retention, limit=3, max_rounds=2, progress=progress) == {kind: 6}
    assert done == [3, 6]
    assert count(database_url, kind) == 1
    assert prune(ledger, retention, limit=3) == {kind: 1}  # the rest, next pass
    assert prune(ledger, retention, limit=3) == {kind: 0}
    assert count(database_url, kind) == 0


@pytest.mark.parametrize("kind", PRUNABLE)
def test_prune_from_many_workers_at_once_deletes_each_row_once(
    ledger: Ledger, database_url: str, kind: Prunable
) -> None:
    old_rows(ledger, database_url, kind, 40)
    store = cast(RetentionStore, ledger.store)
    before = days_ago(PERIOD)
    deleted: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker() -> None:
        try:
            start.wait()
            while n := store.prune(kind, before, 3):
                deleted.append(n)
        except BaseException as exc:  # reported below, with the rest
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sum(deleted) == 40
    assert count(database_url, kind) == 0
    assert count(database_url, "execution_steps") == 0


# Per kind, how to lock one of its rows as a writer would: a replay holds its rejection, a
# delivery's processing updates it, a revival of dead executions holds them.
_LOCK_ONE = {
    "rejections": "SELECT 1 FROM rejections WHERE id = %s FOR UPDATE",
    "webhook_deliveries": "UPDATE webhook_deliveries SET reason = 'replaying' WHERE id = %s",
    "executions": "UPDATE executions SET attempts = 0 WHERE id = %s",
}


@pytest.mark.postgres
@pytest.mark.parametrize("kind", PRUNABLE)
def test_prune_skips_a_row_a_writer_holds_instead_of_waiting_for_it(
    pg_url: str, kind: Prunable
) -> None:
    with connect(pg_url, wait=2) as ledger:  # a wait for the lock would fail in 2 s
        held, *_ = old_rows(ledger, pg_url, kind, 3)
        retention = Retention(**{kind: PERIOD})
        with psycopg.connect(pg_url) as writer:  # a transaction left open
            writer.execute(_LOCK_ONE[kind], (held,))

            assert prune(ledger, retention) == {kind: 2}

        assert prune(ledger, retention) == {kind: 1}  # once it let go
    assert count(pg_url, kind) == 0


@pytest.mark.parametrize("kind", PRUNABLE)
def test_prune_finds_its_rows_by_index_not_by_reading_the_table(
    database_url: str, kind: Prunable
) -> None:
    """A partial index serves a query only when the query's condition names the index's:
    these plans are how a difference between migration 0016 and the queries would show."""
    index = expiry_index(kind)
    params = {"before": ts(days_ago(PERIOD)), "limit": 500}
    if database_url.startswith("sqlite:"):
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as lite:
            statement = expired_rows(kind, ":before", ":limit", indexed_by=True)
            rows = lite.execute(f"EXPLAIN QUERY PLAN {statement}", params).fetchall()
        plan = "\n".join(r[-1] for r in rows)
        assert f"INDEX {index} (" in plan, plan  # a covering one, or one and the table
        assert "TEMP B-TREE" not in plan, plan  # read in order: no sort of every old row
        return
    with psycopg.connect(database_url) as conn:  # one transaction: the settings hold
        conn.execute(_BY_INDEX)
        rows = conn.execute(f"EXPLAIN {_PRUNE_SQL[kind]}", params).fetchall()
    plan = "\n".join(r[0] for r in rows)
    assert f"Index Scan using {index} on {kind}" in plan, plan
    assert "Sort" not in plan, plan
    assert "Seq Scan" not in plan, plan


@pytest.mark.postgres
def test_a_redelivery_racing_the_prune_of_its_first_copy_is_kept_anew(pg_url: str) -> None:
    """The delivery is deleted between the insert that found it and the read of it, as
    a prune committing then would: the redelivery was answered an AssertionError (500)."""
    sql(pg_url, "CREATE TABLE prune_next (delivery_id text)")
    sql(pg_url, "CREATE FUNCTION prune_between() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "DELETE FROM webhook_deliveries w USING prune_next p WHERE w.delivery_id = p.delivery_id; "
        "DELETE FROM prune_next; RETURN NULL; END $$")  # fmt: skip
    sql(pg_url, "CREATE TRIGGER prune_between AFTER INSERT ON webhook_deliveries "
        "FOR EACH STATEMENT EXECUTE FUNCTION prune_between()")  # fmt: skip
    with connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        first = deliver(ledger, account.id, "processed", OLD)
        sql(pg_url, "INSERT INTO prune_next VALUES (?)", first.delivery_id)

        again, is_new = receive(ledger, account.id, first.delivery_id)

    assert is_new
    assert sql(pg_url, "SELECT id, status FROM webhook_deliveries") == [(again.id, "received")]


def kept_versions(url: str) -> list[int]:
    return sorted(r[0] for r in sql(url, "SELECT version FROM automation_versions"))


def test_prune_versions_deletes_only_the_replaced_definitions_no_execution_may_run(
    ledger: Ledger, database_url: str
) -> None:
    """An automation edited twice while an execution made with its first version waits:
    the second version, which nothing runs, goes once `VERSION_GRACE` is over; the first
    stays while its execution may still run (waiting; dead or unknown, retried), and
    goes once it ended (stopped, by the automation's delete)."""
    account = ledger.create_account("Loja")
    automations = Automations(ledger)
    row = automations.create(account.id, {
        "name": "lembrete", "trigger_metric": "Order Paid",
        "steps": [{"type": "wait", "seconds": 3600}, {"type": "add_tag", "tag": "a"}],
    })  # fmt: skip
    pay_and_dispatch(ledger, account.id, 1)
    [waiting] = automations.store.list_executions(account.id)
    assert (waiting.status, waiting.automation_version) == ("waiting", 1)
    for tag in ("b", "c"):
        automations.update(account.id, row.id, {"steps": [{"type": "add_tag", "tag": tag}]})
    assert kept_versions(database_url) == [1, 2]

    assert prune_versions(ledger, ledger.clock()) == 0  # within the grace: both kept
    later = ledger.clock() + VERSION_GRACE + timedelta(minutes=1)
    assert prune_versions(ledger, later) == 1
    assert kept_versions(database_url) == [1]
    sql(database_url, "UPDATE executions SET status = 'dead'")  # may be retried: still kept
    assert prune_versions(ledger, later) == 0
    sql(database_url, "UPDATE executions SET status = 'waiting'")

    assert automations.store.delete_automation(account.id, row.id)  # stops it
    [stopped] = automations.store.list_executions(account.id)
    assert stopped.status == "stopped"
    assert prune_versions(ledger, later) == 1
    assert kept_versions(database_url) == []
