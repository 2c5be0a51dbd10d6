"""Erasing a contact on both backends: every row of it goes, in one transaction, and
nothing of any other contact changes; on PostgreSQL an emit racing the erasure waits."""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar, cast

import psycopg
import pytest

import sinal
from sinal import Ledger, webhooks
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.commerce import derive_abandoned
from sinal.errors import ContactNotFound, InvalidLink
from sinal.events import EmitEvent, PreparedEvent, dumps_json, prepare
from sinal.integrations.base import OrderRef
from sinal.ledger import CHUNK
from sinal.links import create_link
from sinal.store.automations import Claim, Integration
from sinal.store.commerce import CheckoutUpdate, CommerceStore, OrderUpdate
from sinal.store.erasure import erase_in
from sinal.store.messaging import Link, MessageStatus, MessagingStore
from sinal.store.postgres_automations import _START_STEPS_SQL as START_STEPS
from sinal.store.postgres_erasure import _ERASE as ERASE
from sinal.store.postgres_erasure import LOCK_EVENTS
from sinal.store.sqlite_erasure import _ERASE as SQLITE_ERASE
from tests.helpers import count, sql, wait_until
from tests.integration.whatsapp import (
    APP_SECRET,
    PHONE_NUMBER_ID,
    meta_bytes,
    statuses,
    text_message,
)

SHOPIFY = Path(__file__).parent.parent / "fixtures" / "shopify"
PING = {"name": "ping", "trigger_metric": "Ping", "steps": [{"type": "add_tag", "tag": "p"}]}
WHEN = "2026-12-01T12:00:00+00:00"
T = TypeVar("T")


def ping(ledger: Ledger, contact: sinal.Contact, n: int) -> sinal.EmitResult:
    return ledger.emit_event(
        account_id=contact.account_id, contact_id=contact.id, metric_name="Ping",
        source="api", source_id=f"{contact.id}-{n}", value=Decimal("10.5"),
    )  # fmt: skip


def seed(ledger: Ledger, url: str, contact: sinal.Contact) -> None:
    """A row of `contact` in every table that can name it; its Ping automation has run
    once (a finished execution and its steps), and a second Ping waits to be dispatched."""
    account, ident = str(contact.account_id), str(contact.id)
    ping(ledger, contact, 1)
    ledger.add_tags(contact.account_id, contact.id, ["vip"])
    store = cast(MessagingStore, ledger.store)
    store.link_whatsapp_user(contact.account_id, f"wa-{ident}", contact.id)
    create_link(ledger, contact.account_id, url="https://loja.example/p", contact_id=contact.id)
    rows: list[tuple[str, tuple[Any, ...]]] = [
        ("INSERT INTO conversations (account_id, id, contact_id, status, opened_at) "
         "VALUES (?, ?, ?, 'open', ?)", (account, str(uuid.uuid4()), ident, WHEN)),
        ("INSERT INTO message_statuses (account_id, wamid, contact_id, status, status_at, "
         "updated_at) VALUES (?, ?, ?, 'read', ?, ?)", (account, f"wamid-{ident}", ident, WHEN,
                                                        WHEN)),
        ("INSERT INTO orders (account_id, id, provider, integration_id, external_id, status, "
         "total, contact_id, created_at, updated_at) VALUES (?, ?, 'shopify', ?, ?, 'paid', "
         "297.9, ?, ?, ?)", (account, str(uuid.uuid4()), str(uuid.uuid4()), f"o-{ident}", ident,
                             WHEN, WHEN)),
        ("INSERT INTO checkouts (account_id, integration_id, token, provider, contact_id, "
         "details, updated_at) VALUES (?, ?, ?, 'shopify', ?, ?, ?)",
         (account, str(uuid.uuid4()), f"t-{ident}", ident, '{"email": "a@example.com"}', WHEN)),
        ("INSERT INTO rejections (account_id, id, contact_id, reason, message, source, "
         "payload, created_at) VALUES (?, ?, ?, 'contact_not_found', 'm', 'api', ?, ?)",
         (account, str(uuid.uuid4()), ident, f'{{"contact_id": "{ident}"}}', WHEN)),
    ]  # fmt: skip
    for statement, params in rows:
        sql(url, statement, *params)


def rows_of(url: str, contact: sinal.Contact) -> dict[str, int]:
    """How many rows of each table name `contact` (outbox and steps through its events
    and executions, rejections through their input)."""
    c, a = str(contact.id), str(contact.account_id)
    of = "account_id = ? AND contact_id = ?"
    queries = {
        "contacts": ("SELECT count(*) FROM contacts WHERE account_id = ? AND id = ?", (a, c)),
        "outbox": ("SELECT count(*) FROM outbox WHERE account_id = ? AND event_id IN "
                   f"(SELECT id FROM events WHERE {of})", (a, a, c)),
        "execution_steps": ("SELECT count(*) FROM execution_steps WHERE account_id = ? AND "
                            f"execution_id IN (SELECT id FROM executions WHERE {of})",
                            (a, a, c)),
        "rejections": ("SELECT count(*) FROM rejections WHERE CAST(payload AS TEXT) LIKE ?",
                       (f"%{c}%",)),
    }  # fmt: skip
    for table in ("contact_identities", "contact_tags", "events", "contact_metrics_summary",
                  "executions", "conversations", "message_statuses", "whatsapp_users", "links",
                  "checkouts", "orders"):  # fmt: skip
        queries[table] = (f"SELECT count(*) FROM {table} WHERE {of}", (a, c))
    return {table: sql(url, q, *params)[0][0] for table, (q, params) in queries.items()}


def state_of(ledger: Ledger, url: str, contact: sinal.Contact) -> tuple[Any, ...]:
    events = sql(url, "SELECT id FROM events WHERE contact_id = ? ORDER BY id", str(contact.id))
    return events, ledger.get_summary(contact.account_id, contact.id), rows_of(url, contact)


def test_erasing_a_contact_deletes_all_of_it_and_nothing_else(
    ledger: Ledger, database_url: str
) -> None:
    account, other = ledger.create_account("Loja"), ledger.create_account("Outra Loja")
    ana = ledger.create_contact(account.id, phone="+55 11 98765-4321", email="ana@example.com")
    bia = ledger.create_contact(account.id, email="bia@example.com")
    stranger = ledger.create_contact(other.id, email="ana@example.com")
    automations = Automations(ledger)
    automations.create(account.id, PING)
    automations.create(other.id, PING)
    for contact in (ana, bia, stranger):
        seed(ledger, database_url, contact)
    dispatcher = Dispatcher(ledger, DispatchSettings())
    while dispatcher.run_once():
        pass
    for contact in (ana, bia, stranger):
        ping(ledger, contact, 2)
    automations.store.fan_out(lambda e, c: [a.id for a in c], 100)  # pending executions
    for contact in (ana, bia, stranger):
        ping(ledger, contact, 3)  # left in the outbox
    before = {c.id: state_of(ledger, database_url, c) for c in (bia, stranger)}
    assert all(n > 0 for n in rows_of(database_url, ana).values()), rows_of(database_url, ana)

    assert ledger.erase_contact(account.id, ana.id) is True
    others = {c.id: state_of(ledger, database_url, c) for c in (bia, stranger)}
    while dispatcher.run_once():  # the others' pending executions run; none of Ana's
        pass

    assert others == before
    assert set(rows_of(database_url, ana).values()) == {0}
    assert sql(database_url, "SELECT count(*) FROM orders WHERE contact_id IS NULL") == [(1,)]
    assert ledger.get_contact(account.id, ana.id) is None
    assert ledger.erase_contact(account.id, ana.id) is False
    after = ping(ledger, ana, 4)
    assert (after.status, after.reason) == ("rejected", "contact_not_found")


def test_erasing_another_accounts_contact_finds_nothing(ledger: Ledger, database_url: str) -> None:
    account, other = ledger.create_account("Loja"), ledger.create_account("Outra Loja")
    ana = ledger.create_contact(account.id, email="ana@example.com")
    ping(ledger, ana, 1)

    assert ledger.erase_contact(other.id, ana.id) is False
    assert ledger.erase_contact(account.id, uuid.uuid4()) is False
    assert rows_of(database_url, ana)["events"] == 1


# The races below are PostgreSQL's: on SQLite every write, an erasure too, holds the one
# write lock, so none can start while another runs.
postgres_only = pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def someone_waits(database_url: str) -> bool:
    """Whether a session of the test's database waits for a lock (other tests share the
    server)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return sql(database_url, query) != [(0,)]


def while_erased(database_url: str, contact: sinal.Contact, write: Callable[[], object]) -> Any:
    """What `write` answers when it starts while an erasure of `contact` has run its
    statements (`events` locked, the contact locked FOR UPDATE, all of it deleted) and that
    erasure commits once `write` waits for it (or has answered: it did not wait)."""
    answers: list[object] = []
    with psycopg.connect(database_url) as eraser:
        eraser.execute(LOCK_EVENTS)
        assert erase_in(eraser, ERASE, {"account": contact.account_id, "contact": contact.id})
        writer = threading.Thread(target=lambda: answers.append(write()))
        writer.start()
        wait_until(lambda: not writer.is_alive() or someone_waits(database_url))
        eraser.commit()
    writer.join()
    assert answers, "the write raised"
    return answers[0]


# One event (`sinal_record_event`), a batch of one statement (`_KNOWN`), a streamed one.
@postgres_only
@pytest.mark.parametrize("n", [1, 2, CHUNK + 1])
def test_an_emit_during_an_erasure_waits_then_finds_no_contact(
    ledger: Ledger, database_url: str, n: int
) -> None:
    """PostgreSQL: the emit must wait for the erasure, not store an event of no contact."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, email="ana@example.com")
    events = [EmitEvent(account_id=account.id, contact_id=ana.id, metric_name="Ping",
                        source="api", source_id=f"racing-{i}") for i in range(n)]  # fmt: skip

    answers = while_erased(
        database_url, ana, lambda: ledger.emit_many(events) if n > 1 else [ledger.emit(events[0])]
    )

    assert {(a.status, a.reason) for a in answers} == {("rejected", "contact_not_found")}
    assert sql(database_url, "SELECT count(*) FROM events WHERE contact_id = ?", str(ana.id)) == [
        (0,)
    ]


@postgres_only
def test_a_tag_or_a_change_during_an_erasure_finds_no_contact(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: answered as for an unknown contact (the API's 404), not a store error."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, email="ana@example.com")
    bia = ledger.create_contact(account.id, email="bia@example.com")

    tagged = while_erased(database_url, ana, lambda: ledger.add_tags(account.id, ana.id, ["x"]))
    changed = while_erased(
        database_url, bia, lambda: ledger.update_contact(account.id, bia.id, {"name": "Bia"})
    )

    assert (tagged, changed) == (None, None)


def whatsapp(ledger: Ledger, account: sinal.Account) -> Integration:
    data = {"kind": "whatsapp", "secret": APP_SECRET, "verify_token": "v",
            "phone_number_id": PHONE_NUMBER_ID, "access_token": "EAAG-test"}  # fmt: skip
    return Automations(ledger).create_integration(account.id, data)


def delivered(ledger: Ledger, integration: Integration, body: dict[str, Any]) -> webhooks.Received:
    return webhooks.receive(
        ledger, integration, topic=None, delivery_id=str(uuid.uuid4()), headers={},
        body=meta_bytes(body),
    )  # fmt: skip


@postgres_only
def test_a_link_during_an_erasure_finds_no_contact(ledger: Ledger, database_url: str) -> None:
    """PostgreSQL: refused as a link for an unknown contact is (the API's 422), not a store
    error from the link's foreign key."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, email="ana@example.com")

    def link() -> object:
        try:
            return create_link(ledger, account.id, url="https://loja.example/p", contact_id=ana.id)
        except InvalidLink as exc:
            return [(e.field, e.code) for e in exc.errors]

    assert while_erased(database_url, ana, link) == [("contact_id", "not_found")]
    assert sql(database_url, "SELECT count(*) FROM links") == [(0,)]


@postgres_only
def test_a_whatsapp_message_during_an_erasure_comes_from_a_new_contact(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: as a message after the erasure, its sender is created anew from the phone
    (and remembered by Meta's user id), not a failed delivery."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, phone="+55 11 98765-4321")
    integration = whatsapp(ledger, account)
    body = text_message("wamid.racing", "5511987654321", "Oi", name="Ana")
    value = body["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["user_id"] = value["messages"][0]["from_user_id"] = "BR.a1b2c3"

    received = while_erased(database_url, ana, lambda: delivered(ledger, integration, body))

    assert (received.status, received.reason) == ("processed", None)
    [(contact_id,)] = sql(database_url, "SELECT contact_id FROM whatsapp_users")
    assert str(contact_id) != str(ana.id)
    assert sql(
        database_url, "SELECT count(*) FROM events WHERE metric_name = 'Message Received' "
        "AND contact_id = ?", str(contact_id)
    ) == [(1,)]  # fmt: skip


@postgres_only
def test_a_whatsapp_message_of_a_known_user_id_during_an_erasure_comes_from_a_new_contact(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: the sender found by Meta's user id (remembered for the erased contact)
    is found again once the erasure has deleted it: by phone, a new contact, as after the
    erasure; the message is not kept as a rejection naming the erased contact."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, phone="+55 11 98765-4321")
    integration = whatsapp(ledger, account)
    cast(MessagingStore, ledger.store).link_whatsapp_user(account.id, "BR.a1b2c3", ana.id)
    body = text_message("wamid.racing", "5511987654321", "Oi", name="Ana")
    value = body["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["user_id"] = value["messages"][0]["from_user_id"] = "BR.a1b2c3"

    received = while_erased(database_url, ana, lambda: delivered(ledger, integration, body))

    assert (received.status, received.reason) == ("processed", None)
    [(contact_id,)] = sql(
        database_url, "SELECT contact_id FROM events WHERE metric_name = 'Message Received'"
    )
    assert contact_id != ana.id
    assert sql(database_url, "SELECT contact_id FROM whatsapp_users") == [(contact_id,)]
    assert count(database_url, "rejections") == 0


@postgres_only
def test_a_whatsapp_status_during_an_erasure_is_of_an_unknown_message(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: the status of a message sent to the contact, arriving during its erasure,
    waits as a status of a message sinal has no record of (the record went with the
    contact), not a failed delivery."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, phone="+55 11 98765-4321")
    integration = whatsapp(ledger, account)
    ledger.emit_event(
        account_id=account.id, contact_id=ana.id, metric_name="Message Sent", source="api",
        source_id="wamid.sent", entity_type="message", entity_id="wamid.sent",
    )  # fmt: skip
    body = statuses(("wamid.sent", "delivered", 1715360000))

    received = while_erased(database_url, ana, lambda: delivered(ledger, integration, body))

    assert received.status == "deferred", received.reason
    assert sql(database_url, "SELECT count(*) FROM message_statuses") == [(0,)]


def shopify_while_erased(ledger: Ledger, database_url: str, topic: str) -> sinal.Contact:
    """Ana, the buyer of the Shopify `topic` fixture, erased while that webhook is processed
    (which it was)."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, email="ana.souza@exemplo.com.br")
    shop = Automations(ledger).create_integration(account.id, {"kind": "shopify", "secret": "s"})
    body = (SHOPIFY / f"{topic.replace('/', '_')}.json").read_bytes()

    received = while_erased(database_url, ana, lambda: webhooks.receive(
        ledger, shop, topic=topic, delivery_id=topic, headers={}, body=body,
    ))  # fmt: skip

    assert received.status == "processed", received.reason
    return ana


@postgres_only
def test_an_order_during_an_erasure_keeps_no_contact(ledger: Ledger, database_url: str) -> None:
    """PostgreSQL: orders have no foreign key to contacts; one saved during the erasure of its
    buyer is detached as the erasure detaches the buyer's orders, not left naming the gone
    contact's id."""
    shopify_while_erased(ledger, database_url, "orders/create")

    assert sql(database_url, "SELECT contact_id FROM orders") == [(None,)]


def erased_around(database_url: str, contact: sinal.Contact, write: Callable[[], T]) -> T:
    """What `write` answers when it starts while an erasure of `contact` holds its first
    locks (`events`, then the contact's row) and that erasure runs the rest of its
    statements once `write` waits for it. A writer that locked a row of the contact before
    it waited would deadlock with them: the erasure's session reports it at once
    (`deadlock_timeout` 10 ms there) as `DeadlockDetected`, not the writer's after a second,
    which would roll back and retry unseen."""
    params = {"account": contact.account_id, "contact": contact.id}
    answers: list[T] = []
    writer = threading.Thread(target=lambda: answers.append(write()))
    try:
        with psycopg.connect(database_url) as eraser:  # commits as the block ends
            eraser.execute("SET deadlock_timeout = '10ms'")
            eraser.execute(LOCK_EVENTS)
            eraser.execute(ERASE[0], params)
            writer.start()
            wait_until(lambda: not writer.is_alive() or someone_waits(database_url))
            assert erase_in(eraser, ERASE, params)
    finally:
        if writer.ident is not None:
            writer.join()
    assert answers, "the write raised"
    return answers[0]


@postgres_only
@pytest.mark.parametrize("paid", [True, False], ids=["with-event", "status-only"])
def test_an_order_written_as_its_buyer_is_erased_waits_without_a_deadlock(
    ledger: Ledger, database_url: str, paid: bool
) -> None:
    """PostgreSQL: `save_order` takes `events` before the order's row, as the erasure takes
    `events` before the rows it detaches; the row first, it deadlocked with the erasure."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, email="ana@example.com")
    store, shop = cast(CommerceStore, ledger.store), uuid.uuid4()
    placed = OrderRef(
        provider="shopify", external_id="o-1", number="#1001", status="pending",
        provider_status="pending", total=Decimal("297.90"), currency="BRL",
    )  # fmt: skip
    store.save_order(OrderUpdate(account.id, shop, "shopify", "o-1", ana.id, placed), [], {})
    paid_event = EmitEvent(account_id=account.id, contact_id=ana.id, metric_name="Order Paid",
                           source="shopify", source_id="o-1")  # fmt: skip
    events = [prepare(paid_event, ledger.clock())] if paid else []
    update = OrderUpdate(account.id, shop, "shopify", "o-1", ana.id,
                         replace(placed, status="paid", provider_status="paid"))  # fmt: skip

    saved = erased_around(database_url, ana, lambda: store.save_order(update, events, {}))

    assert saved.order is not None
    assert sql(database_url, "SELECT contact_id, status FROM orders") == [(None, "paid")]
    assert count(database_url, "events") == 0


@postgres_only
def test_an_abandonment_derived_as_its_contact_is_erased_waits_without_a_deadlock(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: `abandon_checkout` takes `events` before the checkout's row, as the
    erasure takes `events` before the rows it deletes; the row first, it deadlocked with
    the erasure. After it, the checkout is gone with its contact: nothing is abandoned."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, email="ana@example.com")
    shop = Automations(ledger).create_integration(account.id, {"kind": "shopify", "secret": "s"})
    updated = datetime.fromisoformat(WHEN)
    cast(CommerceStore, ledger.store).save_checkout(CheckoutUpdate(
        account_id=account.id, integration_id=shop.id, provider="shopify", token="t-1",
        contact_id=ana.id, recovery_url=None, total=Decimal("99.90"), currency="BRL",
        details={"contact": {"email": "ana@example.com"}}, updated_at=updated,
        abandon_after=timedelta(minutes=30),
    ), [])  # fmt: skip

    due = updated + timedelta(minutes=30)
    recorded = erased_around(database_url, ana, lambda: derive_abandoned(ledger, now=due))

    assert recorded == 0
    assert [count(database_url, t) for t in ("checkouts", "events")] == [0, 0]


def claimed(ledger: Ledger) -> tuple[sinal.Contact, Claim]:
    """Ana, and the claim worker "w1" holds on her Ping automation's execution."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, phone="+55 11 98765-4321")
    automations = Automations(ledger)
    automations.create(account.id, PING)
    ping(ledger, ana, 1)
    automations.store.fan_out(lambda e, c: [a.id for a in c], 100)
    [claim] = automations.store.claim_executions("w1", 10, 60.0)
    return ana, claim


@postgres_only
def test_a_step_recorded_during_an_erasure_goes_with_its_execution(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: a worker's record of a step starting, committed while the erasure waits
    for the execution's row, is deleted with the execution, not left behind."""
    ana, claim = claimed(ledger)
    start = [{"ord": 0, "account_id": ana.account_id, "id": claim.execution.id, "worker": "w1",
              "lease": 60.0, "step_index": 0, "step_type": "add_tag"}]  # fmt: skip
    eraser = threading.Thread(target=ledger.erase_contact, args=(ana.account_id, ana.id))

    with psycopg.connect(database_url) as worker:  # the step's start, as `start_steps` runs it
        assert worker.execute(START_STEPS, {"req": dumps_json(start)}).fetchall()
        eraser.start()
        wait_until(lambda: someone_waits(database_url))
    eraser.join()

    assert [count(database_url, t) for t in ("executions", "execution_steps")] == [0, 0]


def sending(ledger: Ledger) -> tuple[sinal.Contact, Claim, PreparedEvent]:
    """Ana, whose automation's execution a worker holds, running its first step (a WhatsApp
    send in flight), and the event that step will emit."""
    ana, claim = claimed(ledger)
    assert Automations(ledger).store.start_step(claim, 0, "send_message") is not None
    sent = EmitEvent(
        account_id=ana.account_id, contact_id=ana.id, metric_name="Message Sent",
        source="automation", source_id="wamid.sent", automation_execution_id=claim.execution.id,
        properties={"phone": "+5511987654321", "text": "Oi Ana"},
    )  # fmt: skip
    return ana, claim, prepare(sent, ledger.clock())


def finished(ledger: Ledger, claim: Claim, sent: PreparedEvent) -> bool:
    """Whether the worker still held the execution when it recorded the step's end."""
    store = Automations(ledger).store
    return store.finish_step(claim, 0, "completed", result={"text": "Oi Ana"}, emit=sent)


# Nothing of the step, not even its event as a rejection (the message's text, the phone).
NOTHING_OF_THE_STEP = ("executions", "execution_steps", "events", "rejections")


def test_a_step_finishing_after_its_contacts_erasure_keeps_nothing(
    ledger: Ledger, database_url: str
) -> None:
    """A step running while its contact is erased finishes after its execution went with
    the contact: neither its record nor its event is kept, not even as a rejection."""
    ana, claim, sent = sending(ledger)

    assert ledger.erase_contact(ana.account_id, ana.id)

    assert finished(ledger, claim, sent) is False
    assert [count(database_url, t) for t in NOTHING_OF_THE_STEP] == [0, 0, 0, 0]


@postgres_only
def test_a_step_of_a_lost_claim_finishing_during_an_erasure_keeps_nothing(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: a worker whose claim expired (the finish locks no execution) finishes
    while the erasure runs: it waits for it, then finds the execution gone."""
    ana, claim, sent = sending(ledger)
    sql(database_url, "UPDATE executions SET claimed_until = now() - interval '1 second'")

    assert while_erased(database_url, ana, lambda: finished(ledger, claim, sent)) is False

    assert [count(database_url, t) for t in NOTHING_OF_THE_STEP] == [0, 0, 0, 0]


def plan_of(database_url: str, statement: str, params: dict[str, Any]) -> list[str]:
    """The lines of `statement`'s plan (PostgreSQL's with sequential scans priced out, as
    on a table too large to read: a small test table would be read whole anyway)."""
    if database_url.startswith("sqlite:"):
        with closing(sqlite3.connect(database_url.removeprefix("sqlite:///"))) as lite:
            return [r[-1] for r in lite.execute(f"EXPLAIN QUERY PLAN {statement}", params)]
    with psycopg.connect(database_url) as conn:  # one transaction: the setting holds
        conn.execute("SET LOCAL enable_seqscan = off")
        return [r[0] for r in conn.execute(f"EXPLAIN {statement}", params)]


# The tables migrations 0018 and 0020 index by contact (the others had such an index
# already).
INDEXED = ("executions", "contact_identities", "message_statuses", "whatsapp_users", "links",
           "checkouts", "rejections")  # fmt: skip


@pytest.mark.parametrize("table", INDEXED)
def test_an_erasure_finds_the_contacts_rows_by_index(
    ledger: Ledger, database_url: str, table: str
) -> None:
    """The erasure's delete reads the contact's rows through an index leading with
    (account_id, contact_id) (migrations 0018, 0020), not every row of the account while the
    contact is locked: a key on contact_id in its plan, and no table read whole."""
    params = {"account": uuid.uuid4(), "contact": uuid.uuid4()}
    [n] = [i for i, s in enumerate(ERASE) if s.startswith(f"DELETE FROM {table} WHERE")]
    if database_url.startswith("sqlite:"):
        plan = plan_of(database_url, SQLITE_ERASE[n], {k: str(v) for k, v in params.items()})
        assert any("contact_id=?" in line for line in plan), plan
        assert not any(line.startswith("SCAN ") for line in plan), plan
        return
    plan = plan_of(database_url, ERASE[n], params)
    assert any("Index Cond" in line and "contact_id =" in line for line in plan), plan
    assert not any("Seq Scan" in line for line in plan), plan


def test_a_rejection_keeps_the_contact_its_event_named(ledger: Ledger, database_url: str) -> None:
    """A kept rejection names its contact in `rejections.contact_id` (migration 0020), which
    the erasure deletes by: one event, a batch, a streamed batch."""
    account = ledger.create_account("Loja")
    unknown = uuid.uuid4()
    events = [EmitEvent(account_id=account.id, contact_id=unknown, metric_name="Ping",
                        source="api", source_id=f"r-{i}") for i in range(CHUNK + 4)]  # fmt: skip

    ledger.emit(events[0])
    ledger.emit_many(events[1:3])
    ledger.emit_many(events[3:])

    assert sql(database_url, "SELECT contact_id, count(*) FROM rejections GROUP BY 1") == [
        (str(unknown) if database_url.startswith("sqlite:") else unknown, CHUNK + 4)
    ]


def test_a_rejection_replayed_for_a_contact_goes_with_that_contact(
    ledger: Ledger, database_url: str
) -> None:
    """A rejection replayed naming the contact it lacked keeps that contact's event input:
    it is that contact's, and goes with its erasure."""
    account = ledger.create_account("Loja")
    kept = ledger.emit_event(account_id=account.id, contact_id=uuid.uuid4(), metric_name="Ping",
                             source="api", source_id="lost", properties={"cpf": "123"})  # fmt: skip
    bia = ledger.create_contact(account.id, email="bia@example.com")
    assert kept.rejection_id is not None
    replay = ledger.replay_rejection(account.id, kept.rejection_id, contact_id=bia.id)
    assert replay is not None
    assert replay.outcome is not None
    assert replay.outcome.kind == "created"

    assert ledger.erase_contact(account.id, bia.id)

    assert count(database_url, "rejections") == 0


# A writer finds (or creates) the contact in one transaction and writes its row in a later
# one: an erasure can commit in between. These call the writers' store methods with a
# contact erased since, as that writer then does, on both backends.


def erased(ledger: Ledger) -> sinal.Contact:
    """A contact found by a writer, then erased before the writer's own transaction."""
    account = ledger.create_account("Loja")
    ana = ledger.create_contact(account.id, phone="+55 11 98765-4321", email="ana@example.com")
    assert ledger.erase_contact(account.id, ana.id)
    return ana


def test_a_link_or_whatsapp_row_for_a_contact_erased_since_it_was_found_is_refused(
    ledger: Ledger, database_url: str
) -> None:
    """`ContactNotFound`, which each caller answers as for a contact that does not exist
    (not a store error from the foreign key), and nothing written: not an inbound message's
    rejection either, whose sender is found again instead."""
    ana = erased(ledger)
    store = cast(MessagingStore, ledger.store)
    now = datetime.now(UTC)
    link = Link(ana.account_id, uuid.uuid4(), "tok-erased", "https://loja.example/p", ana.id,
                None, None, now)  # fmt: skip
    status = MessageStatus(ana.account_id, "wamid.erased", ana.id, "delivered", False, None,
                           None, now, now)  # fmt: skip
    received = prepare(EmitEvent(account_id=ana.account_id, contact_id=ana.id,
                                 metric_name="Message Received", source="whatsapp",
                                 source_id="wamid.in", properties={"text": "Oi"}), now)  # fmt: skip

    with pytest.raises(ContactNotFound):
        store.save_link(link)
    with pytest.raises(ContactNotFound):
        store.link_whatsapp_user(ana.account_id, "BR.erased", ana.id)
    with pytest.raises(ContactNotFound):
        store.record_message_status(status, None)
    with pytest.raises(ContactNotFound):
        store.record_inbound_message(received, lambda c: pytest.fail("no conversation"))

    tables = ("links", "whatsapp_users", "message_statuses", "events", "rejections")
    assert [count(database_url, t) for t in tables] == [0, 0, 0, 0, 0]


def test_an_order_for_a_buyer_erased_since_it_was_found_keeps_no_contact(
    ledger: Ledger, database_url: str
) -> None:
    """Detached, as the erasure detaches the buyer's orders: not naming the erased id."""
    ana = erased(ledger)
    snapshot = OrderRef(
        provider="shopify",
        external_id="o-1",
        number="#1001",
        status="paid",
        provider_status="paid",
        total=Decimal("297.90"),
        currency="BRL",
    )
    update = OrderUpdate(ana.account_id, uuid.uuid4(), "shopify", "o-1", ana.id, snapshot)

    saved = cast(CommerceStore, ledger.store).save_order(update, [], {})

    assert saved.order is not None
    assert sql(database_url, "SELECT contact_id, status FROM orders") == [(None, "paid")]


def test_a_checkout_for_a_buyer_erased_since_it_was_found_is_not_written(
    ledger: Ledger, database_url: str
) -> None:
    """`ContactNotFound` and no row: a checkout's details hold the buyer's identities, which
    a row without its contact would keep after the erasure."""
    ana = erased(ledger)
    update = CheckoutUpdate(
        account_id=ana.account_id, integration_id=uuid.uuid4(), provider="shopify", token="t-1",
        contact_id=ana.id, recovery_url=None, total=Decimal("99.90"), currency="BRL",
        details={"contact": {"email": "ana@example.com"}}, updated_at=datetime.now(UTC),
        abandon_after=timedelta(minutes=30),
    )  # fmt: skip

    with pytest.raises(ContactNotFound):
        cast(CommerceStore, ledger.store).save_checkout(update, [])

    assert count(database_url, "checkouts") == 0


@postgres_only
def test_a_checkout_during_an_erasure_comes_from_a_new_contact(
    ledger: Ledger, database_url: str
) -> None:
    """PostgreSQL: checkouts have no foreign key to contacts; one saved during the erasure of
    its buyer is written for a contact created anew from the payload, as one after the
    erasure is, not left with the erased id and identities."""
    ana = shopify_while_erased(ledger, database_url, "checkouts/create")

    [(contact_id,)] = sql(database_url, "SELECT contact_id FROM checkouts")
    assert contact_id not in (None, ana.id)
    assert ledger.get_contact(ana.account_id, contact_id) is not None
    assert sql(database_url, "SELECT count(*) FROM rejections WHERE contact_id = ?",
               str(ana.id)) == [(0,)]  # fmt: skip
