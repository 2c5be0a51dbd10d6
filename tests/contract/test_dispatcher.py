"""The dispatcher on both backends, against local WhatsApp / AI / webhook servers."""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from email.utils import format_datetime
from typing import Any

import orjson
import psycopg
import pytest

import sinal
from sinal import Ledger
from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings, choose, spec_of
from sinal.automations.model import InvalidAutomation
from sinal.automations.service import Automations
from sinal.automations.steps import MAX_ANSWER, refuse_private_target
from sinal.errors import InvalidIntegration, StoreError
from sinal.events import EmitEvent, prepare, utcnow
from sinal.store.automations import (
    STEP_EVENT_REFUSED,
    Advance,
    Claim,
    Integration,
    StepFinish,
    StepStart,
    too_deep,
)
from sinal.store.base import EventQuery
from sinal.store.postgres import PostgresStore
from tests.helpers import count, cut_connections, free_port, sql, wait_until
from tests.integration.whatsapp import rows_received, statements, traced_ledger
from tests.servers import (
    Recorder,
    ai_server,
    meta_error,
    verify_signature,
    webhook_receiver,
    whatsapp_server,
)


@dataclass
class World:
    ledger: Ledger
    automations: Automations
    account: sinal.Account
    contact: sinal.Contact
    whatsapp: Recorder
    url: str

    def dispatcher(self, **settings: Any) -> Dispatcher:
        base: dict[str, Any] = {
            "http_timeout": 0.5,
            "allow_private_webhooks": True,
            "retry": RetryPolicy(max_attempts=3, base=0.01, cap=0.02),
        }
        return Dispatcher(self.ledger, DispatchSettings(**{**base, **settings}))

    def order_paid(self, total: str = "297.90", source_id: str = "1001") -> sinal.EmitResult:
        return self.ledger.emit_event(
            account_id=self.account.id, contact_id=self.contact.id,
            metric_name=sinal.METRIC_ORDER_PAID, source="shopify", source_id=source_id,
            entity_type="order_paid", value=Decimal(total),
            properties={"order_id": source_id, "order_number": f"#{source_id}", "total": total},
        )  # fmt: skip

    def claim_thanks(self, worker: str, lease: float) -> Claim:
        """THANKS's execution for a paid order, claimed by `worker` for `lease` seconds."""
        self.automations.create(self.account.id, THANKS)
        self.order_paid()
        store = self.automations.store
        store.fan_out(lambda e, c: [a.id for a in c], 10)
        [claim] = store.claim_executions(worker, 10, lease)
        return claim

    def executions(self) -> list[Any]:
        return self.automations.store.list_executions(self.account.id)

    def drain(self, dispatcher: Dispatcher, rounds: int = 20) -> None:
        for _ in range(rounds):
            if not dispatcher.run_once():
                return


@pytest.fixture
def world(ledger: Ledger, database_url: str) -> Iterator[World]:
    account = ledger.create_account("Loja Exemplo")
    contact = ledger.create_contact(account.id, phone="+55 11 98765-4321", name="Ana Souza")
    automations = Automations(ledger)
    with whatsapp_server() as (wa_url, recorder):
        automations.create_integration(account.id, {
            "kind": "whatsapp", "secret": "app-secret", "verify_token": "v",
            "phone_number_id": "1234567890", "access_token": "EAAG-token",
            "api_base_url": wa_url,
        })  # fmt: skip
        yield World(ledger, automations, account, contact, recorder, database_url)


THANKS = {
    "name": "Obrigado pelo pedido",
    "trigger_type": "order_paid",
    "filters": [{"field": "properties.total", "op": "gte", "value": 100}],
    "steps": [
        {"type": "send_message",
         "text": "Olá {{ contact.name | first_name }}, o pedido {{ event.properties.order_number }}"
                 " de {{ event.value | money }} foi pago!"},
        {"type": "add_tag", "tag": "comprou"},
    ],
}  # fmt: skip


def test_matching_automation_runs_once_and_its_events_carry_the_execution(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    event = world.order_paid()
    dispatcher = world.dispatcher()

    world.drain(dispatcher)
    world.drain(dispatcher)

    [message] = world.whatsapp.bodies("/1234567890/messages")
    assert message["to"] == "5511987654321"
    assert message["text"]["body"] == "Olá Ana, o pedido #1001 de R$ 297,90 foi pago!"
    assert world.whatsapp.requests[0]["headers"]["Authorization"] == "Bearer EAAG-token"
    [execution] = world.executions()
    assert (execution.status, execution.event_id) == ("completed", event.event_id)
    emitted = world.ledger.list_events(EventQuery(world.account.id, metric_name="Message Sent"))
    assert [e.automation_execution_id for e in emitted] == [execution.id]
    assert emitted[0].entity_id == "wamid.LOCAL00000000"
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]
    assert count(world.url, "outbox") == 0  # events from steps never enter the outbox


def test_events_no_automation_listens_to_leave_the_outbox_without_executions(
    world: World,
) -> None:
    """A fan-out batch mixing metrics with and without listeners: every row leaves the
    outbox, and only the listened-to event gets an execution."""
    world.automations.create(world.account.id, THANKS)
    unheard = []
    for n in range(5):
        unheard.append(world.ledger.emit_event(
            account_id=world.account.id, contact_id=world.contact.id,
            metric_name=sinal.METRIC_MESSAGE_SENT, source="whatsapp", source_id=f"wamid.{n}",
            entity_type="message", properties={"text": "oi"},
        ))  # fmt: skip
    heard = world.order_paid()
    assert all(r.status == "created" for r in [*unheard, heard])

    world.dispatcher().store.fan_out(lambda event, candidates: [a.id for a in candidates], 50)

    assert count(world.url, "outbox") == 0
    [execution] = world.executions()
    assert execution.event_id == heard.event_id


def test_redelivered_outbox_row_does_not_run_the_automation_twice(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    event = world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)
    sql(world.url, "INSERT INTO outbox (account_id, event_id, metric_name, created_at, "
        "available_at) VALUES (?, ?, 'Order Paid', '2026-01-01T00:00:00.000000Z', "
        "'2026-01-01T00:00:00.000000Z')", str(world.account.id), str(event.event_id))  # fmt: skip

    world.drain(dispatcher)

    assert len(world.executions()) == 1
    assert len(world.whatsapp.bodies()) == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"filters": [{"field": "properties.total", "op": "gte", "value": 1000}]}, "filter_false"),
        ({"status": "paused"}, "paused"),
        ({"trigger_type": None, "trigger_metric": "Order Placed"}, "other_metric"),
    ],
)
def test_trace_says_why_an_automation_did_not_run(
    world: World, change: dict[str, Any], reason: str
) -> None:
    row = world.automations.create(world.account.id, THANKS)
    world.automations.update(world.account.id, row.id, change)
    event = world.order_paid()
    world.drain(world.dispatcher())

    assert world.executions() == []
    assert event.event_id is not None
    assert event.event_id is not None
    stored = world.ledger.get_event(world.account.id, event.event_id)
    assert stored is not None
    [trace] = world.automations.trace(stored)
    assert (trace["triggered"], trace["outcome"]) == (False, reason)


def test_trace_names_the_execution_of_every_automation_an_event_triggered(world: World) -> None:
    """More automations than a page of executions (100): the trace names each one's."""
    tagging = {"name": "marca", "trigger_type": "order_paid",
               "steps": [{"type": "add_tag", "tag": "comprou"}]}  # fmt: skip
    rows = [world.automations.create(world.account.id, tagging) for _ in range(105)]
    event = world.order_paid()
    assert event.event_id is not None
    world.automations.store.fan_out(lambda e, c: [a.id for a in c], 10)

    stored = world.ledger.get_event(world.account.id, event.event_id)
    assert stored is not None
    traced = world.automations.trace(stored)

    assert len(traced) == len(rows) == 105
    assert all(t["triggered"] and "execution" in t for t in traced)


def test_automation_created_after_the_event_does_not_fire(world: World) -> None:
    event = world.order_paid()
    world.automations.create(world.account.id, THANKS)
    world.drain(world.dispatcher())
    assert world.executions() == []
    assert event.event_id is not None
    assert event.event_id is not None
    stored = world.ledger.get_event(world.account.id, event.event_id)
    assert stored is not None
    assert world.automations.trace(stored)[0]["outcome"] == "created_after_event"


def _traced_by(world: World, event: sinal.EmitResult, ledger: Ledger | None = None) -> Any:
    """The trace of `event` (made through `ledger`, when given)."""
    assert event.event_id is not None
    stored = world.ledger.get_event(world.account.id, event.event_id)
    assert stored is not None
    return Automations(ledger or world.ledger).trace(stored)


def test_trace_says_of_every_automation_what_it_said_reading_every_definition(
    world: World,
) -> None:
    """Reading only the definitions of the automations listening to the event's metric, the
    trace gives every outcome as before, in the same order (by id), with each execution:
    one listening to another metric now, which ran before its trigger was changed, too."""
    names = ["corre", "caro", "pausada", "outra 1", "outra 2", "mudou", "antiga", "apagada"]
    changes: list[dict[str, Any]] = [
        {}, {"filters": [{"field": "properties.total", "op": "gte", "value": 1000}]},
        {"status": "paused"}, {"trigger_type": None, "trigger_metric": "Order Placed"},
        {"trigger_type": None, "trigger_metric": "Cart Abandoned"}, {}, {}, {},
    ]  # fmt: skip
    a = world.automations
    rows = [
        a.create(world.account.id, {**THANKS, "name": name, **change})
        for name, change in zip(names, changes, strict=True)
    ]
    by_name = {row.name: row for row in rows}
    assert a.store.update_automation(  # stored before a check it fails (no steps)
        world.account.id, by_name["antiga"].id, lambda r: replace(r, spec={**r.spec, "steps": []})
    )
    event = world.order_paid()
    a.store.fan_out(choose, 10)  # "corre" and "mudou" run
    a.update(world.account.id, by_name["mudou"].id, {"trigger_type": None,
                                                   "trigger_metric": "Order Placed"})  # fmt: skip
    assert a.store.delete_automation(world.account.id, by_name["apagada"].id)
    a.create(world.account.id, {**THANKS, "name": "nova"})

    traced = _traced_by(world, event)

    ran = {x.automation_id: str(x.id) for x in world.executions()}
    assert [(t["automation_name"], t["triggered"], t["outcome"], t.get("execution", {}).get("id"))
            for t in traced] == [
        ("corre", True, "triggered", ran[by_name["corre"].id]),
        ("caro", False, "filter_false", None),
        ("pausada", False, "paused", None),
        ("outra 1", False, "other_metric", None),
        ("outra 2", False, "other_metric", None),
        ("mudou", False, "other_metric", ran[by_name["mudou"].id]),
        ("antiga", False, "invalid_definition", None),
        ("nova", False, "created_after_event", None),
    ]  # fmt: skip
    assert [t["automation_id"] for t in traced[:-1]] == [
        str(r.id) for r in rows if r.name != "apagada"
    ]
    said = {t["automation_name"]: t["message"] for t in traced}
    assert said["outra 2"] == "listens to 'Cart Abandoned', not 'Order Paid'"
    assert said["mudou"] == "listens to 'Order Placed', not 'Order Paid'"
    assert said["caro"] == "filter 0 (properties.total gte 1000) is false"
    assert (traced[1]["filter_index"], traced[1]["filter_field"]) == (0, "properties.total")
    assert said["antiga"].startswith("the automation's definition fails today's checks: ")


def test_trace_of_an_automation_listening_to_another_metric_reads_not_its_definition(
    world: World,
) -> None:
    """Its stored trigger says enough, as it does to the dispatcher: even a definition that
    fails today's checks is not read (the traces of its own metric's events say so)."""
    other = world.automations.create(world.account.id, {**THANKS, "trigger_type": "order_created"})
    assert world.automations.store.update_automation(
        world.account.id, other.id, lambda r: replace(r, spec={**r.spec, "steps": []})
    )

    [traced] = _traced_by(world, world.order_paid())

    assert (traced["triggered"], traced["outcome"], traced["message"]) == (
        False, "other_metric", "listens to 'Order Placed', not 'Order Paid'"
    )  # fmt: skip


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_trace_reads_less_than_one_definition_of_the_automations_of_other_metrics(
    world: World,
) -> None:
    """PostgreSQL: 30 automations of another metric, each of 50 long steps; the trace's two
    statements (the event's executions, the account's automations) bring less than one of
    those definitions (it read all 30: 30 times as much)."""
    step = {"type": "send_message", "text": "Olá {{ contact.name }}! " + "x" * 1000}
    long = {**THANKS, "trigger_type": "order_created", "steps": [step] * 50}
    for n in range(30):
        world.automations.create(world.account.id, {**long, "name": f"longa {n}"})
    world.automations.create(world.account.id, THANKS)
    event = world.order_paid()

    with traced_ledger(world.url) as ledger:
        with statements(ledger) as sent:
            traced = _traced_by(world, event, ledger)
        with rows_received(ledger) as rows:
            assert _traced_by(world, event, ledger) == traced

    assert [t["outcome"] for t in traced] == ["other_metric"] * 30 + ["triggered"]
    assert sent == ["Bind", "Bind"]
    assert len(rows) == 31
    assert sum(rows) < len(orjson.dumps(long["steps"]))


def test_events_emitted_by_steps_never_trigger_automations(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.automations.create(world.account.id, {
        "name": "loop?", "trigger_metric": "Message Sent",
        "steps": [{"type": "send_message", "text": "again"}],
    })  # fmt: skip
    world.order_paid()
    world.drain(world.dispatcher())
    assert len(world.whatsapp.bodies()) == 1
    assert len(world.executions()) == 1


def test_a_chain_continues_only_from_an_execution_of_the_events_own_account(
    world: World,
) -> None:
    """An event names the execution whose message it is a status of (any event may: a
    library caller sets any properties; the HTTP API refuses this one). Naming one of its
    account's executions, it continues that one's chain (here too deep: stopped); naming
    another account's execution, or anything else, it starts a chain and runs. None of
    them stops the fan-out."""
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    world.drain(world.dispatcher())
    [deep] = world.executions()
    sql(world.url, "UPDATE executions SET chain_depth = 20 WHERE id = ?", str(deep.id))
    other = world.ledger.create_account("Outra Loja")
    contact = world.ledger.create_contact(other.id, external_id="c1")
    named: dict[str, Any] = {"own": str(deep.id), "uuid": str(uuid.uuid4()),
                             "text": "not-an-id", "number": 5, "null": None}  # fmt: skip
    ping = {"name": "ping", "trigger_metric": "Ping", "steps": [{"type": "add_tag", "tag": "p"}]}
    for account, contact_id, names in ((world.account, world.contact.id, named),
                                       (other, contact.id, {"other": str(deep.id)})):  # fmt: skip
        world.automations.create(account.id, ping)
        for key, value in names.items():
            world.ledger.emit_event(
                account_id=account.id, contact_id=contact_id, metric_name="Ping",
                source="api", source_id=key,
                properties={"sent_by_automation_execution_id": value},
            )  # fmt: skip

    world.drain(world.dispatcher())

    store = world.automations.store
    statuses = {}
    for account in (world.account, other):
        for x in store.list_executions(account.id):
            event = world.ledger.get_event(account.id, x.event_id)
            assert event is not None
            statuses[event.source_id] = (x.status, x.last_error)
    assert statuses.pop("own") == ("stopped", too_deep(21))
    assert statuses.pop("1001") == ("completed", None)  # the order's
    assert statuses == dict.fromkeys(["uuid", "text", "number", "null", "other"],
                                     ("completed", None))  # fmt: skip


def test_transient_failures_retry_with_backoff_then_succeed(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.fail_times = 2  # Meta's throughput limit: refused, not sent
    world.whatsapp.behaviour.fail_status = 400
    world.whatsapp.behaviour.fail_body = meta_error(130429, "Rate limit hit")
    world.order_paid()
    dispatcher = world.dispatcher()

    for _ in range(50):
        dispatcher.run_once()
        if world.executions()[0].status == "completed":
            break
        time.sleep(0.02)

    [execution] = world.executions()
    assert execution.status == "completed"
    assert len(world.whatsapp.requests) == 3  # two refusals, one success
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    assert detail.steps[0].attempts == 3


def test_permanent_failure_is_dead_with_its_error_and_can_be_retried(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.status = 400
    world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)

    [execution] = world.executions()
    assert execution.status == "dead"
    assert execution.last_error is not None
    assert "refused the message (400, error 400): refused" in execution.last_error

    world.whatsapp.behaviour.status = 200
    assert world.automations.store.retry_dead(world.account.id) == 1
    world.drain(dispatcher)
    assert world.executions()[0].status == "completed"


def test_send_that_times_out_is_unknown_and_never_resent(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.delay = 1.0  # past the 0.5 s client timeout
    world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)
    world.whatsapp.behaviour.delay = 0
    world.drain(dispatcher)

    [execution] = world.executions()
    assert execution.status == "unknown"
    assert "did not answer in time" in (execution.last_error or "")
    assert len(world.whatsapp.requests) == 1


def test_step_interrupted_mid_send_is_unknown_after_the_lease_expires(world: World) -> None:
    claim = world.claim_thanks("doomed-worker", 0.2)
    dispatcher = world.dispatcher(lease=0.2)
    store = world.automations.store
    assert isinstance(store.start_step(claim, 0, "send_message"), tuple)  # ...and it dies
    time.sleep(0.3)

    world.drain(dispatcher)

    [execution] = world.executions()
    assert execution.status == "unknown"
    assert world.whatsapp.requests == []


def test_completed_step_is_not_repeated_when_the_execution_resumes(world: World) -> None:
    # a lease long enough for step 0 to finish on a loaded machine, short enough to expire
    claim = world.claim_thanks("doomed-worker", 2.0)
    doomed = world.dispatcher()
    doomed.settings = replace(doomed.settings, worker_id="doomed-worker")
    outcome = doomed._run_step(claim, 0, spec_of(claim.automation), claim.tags)
    assert outcome is not None  # step 0 sent and recorded; the worker dies before step 1
    time.sleep(2.2)

    world.drain(world.dispatcher())

    [execution] = world.executions()
    assert execution.status == "completed"
    assert len(world.whatsapp.bodies()) == 1
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]


@pytest.mark.parametrize("loop", ["run_once", "run"])
def test_a_step_slower_than_the_lease_keeps_its_execution(world: World, loop: str) -> None:
    # The send takes 1.5 s, three leases: the worker renews its claim meanwhile, so a rival
    # polling all along never takes the execution over (it would find the send started and
    # call it unknown).
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    sending = threading.Event()
    world.whatsapp.behaviour.before_answer = lambda body, n: sending.set()
    world.whatsapp.behaviour.delay = 1.5
    worker = world.dispatcher(lease=0.5, http_timeout=5.0, poll_interval=0.05)
    rival = world.dispatcher(lease=0.5, http_timeout=5.0)
    stop = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        working = pool.submit(worker.run_once if loop == "run_once" else lambda: worker.run(stop))
        assert sending.wait(10)  # the worker holds the execution; the rival starts now
        taken = 0
        deadline = time.monotonic() + 10
        while world.executions()[0].status != "completed" and time.monotonic() < deadline:
            taken += rival.run_once()
            time.sleep(0.05)
        stop.set()
        working.result()

    assert taken == 0
    [execution] = world.executions()
    assert execution.status == "completed"
    assert len(world.whatsapp.requests) == 1
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]


def test_renewal_extends_a_held_claim_and_never_revives_a_lost_one(world: World) -> None:
    claim = world.claim_thanks("worker-a", 1.0)
    store = world.automations.store
    time.sleep(0.5)
    assert store.renew_claims([claim]) == {claim.execution.id}  # held until ~1.5 s
    time.sleep(0.7)  # past the claim's first expiry
    assert store.claim_executions("worker-b", 10, 10.0) == []

    time.sleep(0.5)  # past the renewed one: worker-a is taken for dead
    [taken] = store.claim_executions("worker-b", 10, 10.0)
    assert store.renew_claims([claim]) == set()
    assert store.renew_claims([taken, claim]) == {taken.execution.id}
    assert store.renew_claims([]) == set()
    assert not store.advance(claim, Advance("completed", 2))  # still worker-b's


@pytest.mark.postgres
def test_steps_find_their_executions_by_key_once_the_table_has_grown(pg_url: str) -> None:
    """A worker's claims and fenced writes (a step's start and finish, a lease's renewal)
    look each execution up by its key, whatever the statistics: planned while `executions`
    was small and kept, they read the whole table for every statement until the next
    ANALYZE."""
    store = PostgresStore(pg_url, max_size=1)  # one connection: its statements stay prepared
    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        Automations(ledger).create(account.id, {
            "name": "no-op", "trigger_metric": "Ping",
            "steps": [{"type": "filter", "conditions": [
                {"field": "source", "op": "eq", "value": "test"}]}],
        })  # fmt: skip
        sql(pg_url, "ALTER TABLE executions SET (autovacuum_enabled = off)")
        sql(pg_url, "ANALYZE executions")

        def one_execution(n: int) -> tuple[bool, bool, bool]:
            ledger.emit_event(account_id=account.id, contact_id=contact.id,
                              metric_name="Ping", source="test", source_id=str(n))  # fmt: skip
            store.fan_out(lambda e, c: [a.id for a in c], 10)
            [claim] = store.claim_executions("worker-a", 10, 30.0)
            [start] = store.start_steps([StepStart(claim, 0, "filter")])
            renewed = store.renew_claims([claim])
            [held] = store.finish_steps(
                [StepFinish(claim, 0, "completed", then=Advance("completed", 1))]
            )
            return isinstance(start, tuple) and start[1], renewed == {claim.execution.id}, held

        small = [one_execution(n) for n in range(16)]  # prepared, planned on a small table
        [(automation,)] = sql(pg_url, "SELECT id FROM automations")
        sql(pg_url, "INSERT INTO executions (account_id, id, automation_id, event_id, "
            "contact_id, status) SELECT ?, gen_random_uuid(), ?, gen_random_uuid(), ?, "
            "'completed' FROM generate_series(1, 50000)",
            account.id, automation, contact.id)  # fmt: skip
        grown = [one_execution(n) for n in range(16, 20)]
    # the server's counters, flushed as the store's connection ended
    others = (
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid()"
    )
    wait_until(lambda: not sql(pg_url, others))
    [(read,)] = sql(pg_url, "SELECT seq_tup_read FROM pg_stat_user_tables "
                    "WHERE relname = 'executions'")  # fmt: skip

    assert small + grown == [(True, True, True)] * 20  # started, renewed, held
    assert read < 50_000  # no statement read the grown table through


def test_a_stuck_step_is_renewed_no_longer(world: World, caplog: pytest.LogCaptureFixture) -> None:
    claim = world.claim_thanks("worker-a", 30.0)
    dispatcher = world.dispatcher(worker_id="worker-a", lease=30.0, http_timeout=1.0)
    dispatcher._held.begin(claim)
    assert dispatcher.renew_leases() == 1

    # its step began 36 s ago: a lease and five HTTP timeouts are 35 s
    dispatcher._held._claims[claim.execution.id] = (claim, time.monotonic() - 36)
    assert dispatcher.renew_leases() == 0
    assert f"execution {claim.execution.id}: a step has run for over 35 s" in caplog.text
    assert _counted(dispatcher, "sinal_worker_steps_stuck_total") == 1
    caplog.clear()
    assert dispatcher.renew_leases() == 0  # said once
    assert caplog.text == ""

    dispatcher._held.begin(claim)  # its next step begins: renewed again
    assert dispatcher.renew_leases() == 1


def test_the_end_of_a_claim_leaves_a_new_claim_of_its_execution_renewed(world: World) -> None:
    """A thread settles its execution (a retry due at once) and, before it ends its claim,
    the worker claims the execution again for another thread: ending the first claim
    leaves the new one held, its lease renewed while its step runs."""
    first = world.claim_thanks("worker-a", 30.0)
    dispatcher = world.dispatcher(worker_id="worker-a", lease=30.0)
    dispatcher._held.begin(first)
    store = world.automations.store
    assert store.advance(first, Advance("pending", 0, run_at=utcnow() - timedelta(seconds=1)))
    [second] = store.claim_executions("worker-a", 10, 30.0)
    dispatcher._held.begin(second)

    dispatcher._held.end(first)

    assert dispatcher.renew_leases() == 1
    dispatcher._held.end(second)
    assert dispatcher.renew_leases() == 0


def _counted(dispatcher: Dispatcher, name: str, **labels: str) -> float:
    """A worker metric's value (0 when it was never counted)."""
    value = dispatcher.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_the_worker_counts_what_it_does(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    world.order_paid(total="50.00", source_id="1002")  # filtered out: no execution
    dispatcher = world.dispatcher()

    world.drain(dispatcher)

    def counted(name: str, **labels: str) -> float:
        return _counted(dispatcher, name, **labels)

    assert counted("sinal_worker_events_fanned_out_total") == 2
    assert counted("sinal_worker_executions_created_total") == 1
    assert counted("sinal_worker_executions_claimed_total") == 1
    assert counted("sinal_worker_steps_total", type="send_message", status="completed") == 1
    assert counted("sinal_worker_steps_total", type="add_tag", status="completed") == 1
    assert counted("sinal_worker_step_duration_seconds_count", type="send_message") == 1
    assert counted("sinal_worker_executions_settled_total", status="completed") == 1
    assert counted("sinal_worker_executions_in_hand") == 0
    assert counted("sinal_worker_claims_lost_total") == 0


def test_the_worker_counts_retries_and_dead_executions(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.status = 429  # retried: three attempts, then dead
    world.order_paid()
    dispatcher = world.dispatcher()

    for _ in range(50):
        dispatcher.run_once()
        if world.executions()[0].status == "dead":
            break
        time.sleep(0.02)

    assert world.executions()[0].status == "dead"
    failed = {"type": "send_message", "status": "failed"}
    assert _counted(dispatcher, "sinal_worker_steps_total", **failed) == 3
    assert _counted(dispatcher, "sinal_worker_executions_settled_total", status="pending") == 2
    assert _counted(dispatcher, "sinal_worker_executions_settled_total", status="dead") == 1
    assert _counted(dispatcher, "sinal_worker_executions_claimed_total") == 3


def test_the_worker_logs_an_execution_left_dead_or_unknown_once(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """An execution left dead (its attempts spent) or unknown (a send that timed out)
    waits for a person, and the worker said nothing of either: counted only."""
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.status = 429  # retried: three attempts, then dead
    world.order_paid()
    dispatcher = world.dispatcher()
    with caplog.at_level(logging.INFO, logger="sinal"):
        for _ in range(50):
            dispatcher.run_once()
            if world.executions()[0].status == "dead":
                break
            time.sleep(0.02)
        world.whatsapp.behaviour.status = 200
        world.whatsapp.behaviour.delay = 1.0  # past the 0.5 s client timeout: unknown
        world.order_paid(source_id="1002")
        world.drain(dispatcher)
    world.whatsapp.behaviour.delay = 0

    dead, unknown = sorted(world.executions(), key=lambda e: e.status)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (dead.status, unknown.status) == ("dead", "unknown")
    assert [r.getMessage().split(": ")[0] for r in said] == [
        f"execution {dead.id} (automation {dead.automation_id}, account {world.account.id}) "
        "is dead at step 0",
        f"execution {unknown.id} (automation {unknown.automation_id}, account "
        f"{world.account.id}) is unknown at step 0",
    ]
    assert "429" in said[0].getMessage()
    assert "did not answer in time" in said[1].getMessage()


def test_the_worker_counts_a_claim_it_lost(world: World) -> None:
    claim = world.claim_thanks("worker-a", 0.2)
    time.sleep(0.3)  # worker-a is taken for dead, and worker-b takes the execution over
    assert len(world.automations.store.claim_executions("worker-b", 10, 10.0)) == 1
    dispatcher = world.dispatcher(worker_id="worker-a")

    dispatcher.run_claim(claim)

    assert _counted(dispatcher, "sinal_worker_claims_lost_total") == 1
    assert _counted(dispatcher, "sinal_worker_steps_total", type="send_message",
                    status="completed") == 0  # fmt: skip
    assert world.whatsapp.requests == []


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_worker_whose_connections_are_cut_counts_the_errors_and_carries_on(
    world: World,
) -> None:
    world.automations.create(world.account.id, THANKS)
    # the worker's own pool, as in a process of its own: the test's calls cannot be the
    # ones that meet its cut connections
    worker_ledger = sinal.connect(world.url)
    settings = DispatchSettings(poll_interval=0.05, http_timeout=0.5, allow_private_webhooks=True)
    dispatcher = Dispatcher(worker_ledger, settings)
    stop = threading.Event()
    worker = threading.Thread(target=dispatcher.run, args=(stop,))
    worker.start()
    try:
        time.sleep(0.3)  # the worker has polled: its connections are open
        assert cut_connections(world.url) >= 3  # the worker's pool and listener, the test's
        for _ in range(50):  # the test's pool lost its connection too
            try:
                world.order_paid()
                break
            except StoreError:
                time.sleep(0.05)
        wait_until(lambda: world.executions() and world.executions()[0].status == "completed")
        wait_until(lambda: _counted(dispatcher, "sinal_worker_listening") == 1)
        listening = _counted(dispatcher, "sinal_worker_listening")
    finally:
        stop.set()
        worker.join(timeout=10)
        dispatcher.close()
        worker_ledger.close()

    assert world.executions()[0].status == "completed"
    assert len(world.whatsapp.requests) == 1
    assert _counted(dispatcher, "sinal_worker_errors_total", kind="database") >= 1
    assert _counted(dispatcher, "sinal_worker_errors_total", kind="unexpected") == 0
    assert _counted(dispatcher, "sinal_worker_listener_outages_total") == 1
    assert listening == 1  # listening again
    assert _counted(dispatcher, "sinal_worker_listening") == 0  # stopped


def _hold_step_records(url: str, seconds: float) -> None:
    """Keep the worker from writing step records for `seconds`, from another connection,
    as a long writer (a migration, a bulk job) does: SQLite's writer lock, PostgreSQL's
    lock on `execution_steps`. Returns once it is held."""
    held = threading.Event()

    def hold() -> None:
        if url.startswith("sqlite:"):
            import fcntl

            with open(f"{url.removeprefix('sqlite:///')}-lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                held.set()
                time.sleep(seconds)
                fcntl.flock(lock, fcntl.LOCK_UN)
            return
        with psycopg.connect(url) as conn:
            conn.execute("LOCK TABLE execution_steps IN ACCESS EXCLUSIVE MODE")
            held.set()
            time.sleep(seconds)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)


def _assert_sent_once_and_completed(world: World) -> None:
    """THANKS ran whole: its message sent once, its Message Sent recorded, the tag added."""
    [execution] = world.executions()
    assert execution.status == "completed"
    assert len(world.whatsapp.requests) == 1
    sent = world.ledger.list_events(EventQuery(world.account.id, metric_name="Message Sent"))
    assert [e.entity_id for e in sent] == ["wamid.LOCAL00000000"]
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]


def test_a_send_whose_record_meets_a_busy_database_is_recorded_once_it_is_free(
    world: World,
) -> None:
    """The database stops taking writes while a message is being sent (locked past the
    worker's wait): its record, which failed, used to be left to the lease, and the send
    resumed as interrupted, `unknown`, its Message Sent and wamid lost though it went out.
    The worker tries again until the database takes it."""
    world.automations.create(world.account.id, THANKS)
    worker_ledger = sinal.connect(world.url, wait=0.3)  # the lock outlasts its wait
    settings = DispatchSettings(poll_interval=0.05, http_timeout=2.0, lease=4.0,
                                housekeeping_interval=0, allow_private_webhooks=True)  # fmt: skip
    dispatcher = Dispatcher(worker_ledger, settings)
    world.whatsapp.behaviour.before_answer = lambda body, n: _hold_step_records(world.url, 1.5)
    world.order_paid()
    stop = threading.Event()
    worker = threading.Thread(target=dispatcher.run, args=(stop,))
    worker.start()
    try:
        wait_until(lambda: world.executions() and world.executions()[0].status not in
                   ("pending", "waiting"), timeout=30)  # fmt: skip
    finally:
        stop.set()
        worker.join(timeout=10)
        dispatcher.close()
        worker_ledger.close()

    _assert_sent_once_and_completed(world)
    assert _counted(dispatcher, "sinal_worker_errors_total", kind="database") >= 1


@pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_send_whose_record_meets_a_revoked_privilege_is_recorded_once_it_is_granted(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator revokes UPDATE on execution_steps from the worker's role while a message
    is being sent: its record, refused (`StoreMisconfigured`), was left to the lease, and
    the send resumed as interrupted, `unknown`, though it went out. The worker waits for
    the grant, its claim renewed, logging what to fix, then records it: sent once."""
    role = f"sinal_worker_{os.getpid()}"
    sql(world.url, f'CREATE ROLE "{role}" LOGIN')
    try:
        sql(world.url, f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public '
            f'TO "{role}"')  # fmt: skip
        world.automations.create(world.account.id, THANKS)
        worker_ledger = sinal.connect(world.url.replace("postgres@", f"{role}@", 1))
        settings = DispatchSettings(
            poll_interval=0.05, http_timeout=2.0, lease=1.0, housekeeping_interval=0,
            allow_private_webhooks=True,
        )  # fmt: skip
        dispatcher = Dispatcher(worker_ledger, settings)
        revoke = f'REVOKE UPDATE ON execution_steps FROM "{role}"'

        def revoke_first(body: Any, n: int) -> None:
            sql(world.url, revoke)

        world.whatsapp.behaviour.before_answer = revoke_first
        world.order_paid()
        stop = threading.Event()
        worker = threading.Thread(target=dispatcher.run, args=(stop,))
        with caplog.at_level(logging.WARNING, logger="sinal.dispatcher"):
            worker.start()
            try:
                wait_until(lambda: _counted(dispatcher, "sinal_worker_errors_total",
                                            kind="database") >= 1)  # fmt: skip
                time.sleep(3 * settings.lease)  # the operator takes a while: leases run out
                sql(world.url, f'GRANT UPDATE ON execution_steps TO "{role}"')
                wait_until(lambda: world.executions()[0].status not in ("pending", "waiting"))
            finally:
                stop.set()
                worker.join(timeout=10)
                dispatcher.close()
                worker_ledger.close()
    finally:
        sql(world.url, f'DROP OWNED BY "{role}"')
        sql(world.url, f'DROP ROLE "{role}"')

    _assert_sent_once_and_completed(world)
    waits = [r.getMessage() for r in caplog.records if "database's operator" in r.getMessage()]
    assert len(waits) == 1  # throttled: one line, naming the fix
    assert "permission denied for table execution_steps" in waits[0]
    assert "grant the role sinal connects as" in waits[0]


def test_wait_step_resumes_later(world: World) -> None:
    world.automations.create(world.account.id, {
        "name": "lembrete", "trigger_type": "order_paid",
        "steps": [{"type": "wait", "seconds": 1}, {"type": "send_message", "text": "Oi!"}],
    })  # fmt: skip
    world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)
    assert world.executions()[0].status == "waiting"
    assert world.whatsapp.requests == []

    time.sleep(1.1)
    world.drain(dispatcher)
    assert world.executions()[0].status == "completed"
    assert len(world.whatsapp.bodies()) == 1


def test_filter_step_stops_the_execution(world: World) -> None:
    world.automations.create(world.account.id, {
        "name": "vip", "trigger_type": "order_paid",
        "steps": [{"type": "filter", "conditions": [
            {"field": "contact.tags", "op": "contains", "value": "vip"}]},
            {"type": "send_message", "text": "Oi VIP!"}],
    })  # fmt: skip
    world.order_paid()
    world.drain(world.dispatcher())
    [execution] = world.executions()
    assert execution.status == "stopped"
    assert world.whatsapp.requests == []


def test_a_filter_sees_the_tags_earlier_steps_of_its_run_added_or_removed(world: World) -> None:
    world.ledger.add_tags(world.account.id, world.contact.id, ["vip"])
    marks = world.automations.create(world.account.id, {
        "name": "marca e filtra", "trigger_type": "order_paid",
        "steps": [{"type": "add_tag", "tag": "comprou"},
                  {"type": "filter", "conditions": [
                      {"field": "contact.tags", "op": "contains", "value": "comprou"}]},
                  {"type": "send_message", "text": "Obrigado!"}],
    })  # fmt: skip
    unmarks = world.automations.create(world.account.id, {
        "name": "desmarca e filtra", "trigger_type": "order_paid",
        "steps": [{"type": "remove_tag", "tag": "vip"},
                  {"type": "filter", "conditions": [
                      {"field": "contact.tags", "op": "contains", "value": "vip"}]},
                  {"type": "send_message", "text": "Oi VIP!"}],
    })  # fmt: skip
    world.order_paid()
    world.drain(world.dispatcher())

    outcomes = {e.automation_id: e.status for e in world.executions()}
    assert outcomes == {marks.id: "completed", unmarks.id: "stopped"}
    assert [m["text"]["body"] for m in world.whatsapp.bodies()] == ["Obrigado!"]


def test_ai_respond_asks_the_model_and_sends_its_answer(world: World) -> None:
    with ai_server() as (ai_url, ai):
        world.automations.create_integration(
            world.account.id,
            {"kind": "ai", "base_url": ai_url, "model": "gpt-test", "api_key": "sk-test"},
        )
        world.automations.create(world.account.id, {
            "name": "ia", "trigger_type": "order_paid",
            "steps": [{"type": "ai_respond", "system_prompt": "Seja breve.",
                       "prompt": "Agradeça o pedido {{ event.properties.order_number }}"}],
        })  # fmt: skip
        world.order_paid()
        world.drain(world.dispatcher())

    [question] = ai.bodies("/chat/completions")
    assert question["model"] == "gpt-test"
    assert question["messages"][-1]["content"] == "Agradeça o pedido #1001"
    [sent] = world.whatsapp.bodies()
    assert sent["text"]["body"] == "Resposta: Agradeça o pedido #1001"
    assert world.ledger.list_events(EventQuery(world.account.id, metric_name="AI Response Sent"))


def test_webhook_step_posts_the_event_with_an_idempotency_key(world: World) -> None:
    with webhook_receiver() as (hook_url, hook):
        world.automations.create(world.account.id, {
            "name": "crm", "trigger_type": "order_paid",
            "steps": [{"type": "webhook", "url": f"{hook_url}/hook"}],
        })  # fmt: skip
        event = world.order_paid()
        world.drain(world.dispatcher())
    [request] = hook.requests
    assert request["body"]["event"]["id"] == str(event.event_id)
    assert request["body"]["event"]["value"] == "297.90"
    assert event.event_id is not None
    stored = world.ledger.get_event(world.account.id, event.event_id)
    assert stored is not None
    sent_at = request["body"]["event"]["occurred_at"]  # written as the API writes times
    assert (sent_at[-1], datetime.fromisoformat(sent_at)) == ("Z", stored.occurred_at)
    assert request["headers"]["Idempotency-Key"].endswith(":0")
    # no secret, no signature: as before secrets existed
    assert not [k for k in request["headers"] if k.lower().startswith("webhook-")]


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the spec's example: 24 bytes


def test_signed_webhook_is_verified_by_its_receiver_with_one_id_and_a_fresh_timestamp(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """With a secret, each attempt is signed over the bytes sent (Standard Webhooks): its
    webhook-id is the Idempotency-Key, the same when the step is retried, and its timestamp
    the moment of that attempt; the secret shows in no log and no error."""

    def slow_refusal_first(body: Any, n: int) -> None:
        if n == 0:
            time.sleep(1.1)  # the retry goes out in a later second
        hook.behaviour.status = 503 if n == 0 else 200

    caplog.set_level("DEBUG")
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.before_answer = slow_refusal_first
        _hook(world, f"{hook_url}/hook", secret=SECRET, headers={"webhook-id": "mine"})
        world.order_paid()
        execution = _until_settled(world, world.dispatcher(http_timeout=5))

    assert execution.status == "completed"
    first, second = hook.requests
    (id_1, at_1), (id_2, at_2) = verify_signature(SECRET, first), verify_signature(SECRET, second)
    assert id_1 == id_2 == first["headers"]["Idempotency-Key"] == f"{execution.id}:0"
    assert int(first["received_at"]) - 1 <= at_1 <= first["received_at"]
    assert int(second["received_at"]) - 1 <= at_2 <= second["received_at"]
    assert at_2 > at_1
    assert [k.lower() for k in second["raw_headers"]].count("webhook-id") == 1  # not "mine"
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    secret_text = SECRET.removeprefix("whsec_")
    assert secret_text not in caplog.text
    assert secret_text not in str([detail.last_error, detail.steps[0].error])


def test_signed_webhook_whose_body_changed_on_the_way_fails_verification(world: World) -> None:
    """The signature covers the body's exact bytes: the receiver's check is no formality."""
    with webhook_receiver() as (hook_url, hook):
        _hook(world, f"{hook_url}/hook", secret=SECRET)
        world.order_paid()
        _until_settled(world, world.dispatcher())

    [request] = hook.requests
    verify_signature(SECRET, request)
    with pytest.raises(AssertionError):
        verify_signature(SECRET, {**request, "raw": request["raw"].replace(b"297.90", b"2.90")})


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "[::ffff:127.0.0.1]",
        # IPv6 reaching IPv4 through a translator: NAT64 (to the metadata service, to a
        # private address), local-use NAT64, 6to4, IPv4-compatible
        "[64:ff9b::a9fe:a9fe]",
        "[64:ff9b::a00:5]",
        "[64:ff9b:1::a00:5]",
        "[2002:7f00:1::]",
        "[::7f00:1]",
    ],
)
def test_webhook_to_a_private_address_is_refused_by_default(world: World, host: str) -> None:
    world.automations.create(world.account.id, {
        "name": "crm", "trigger_type": "order_paid",
        "steps": [{"type": "webhook", "url": f"http://{host}:9/hook"}],
    })  # fmt: skip
    world.order_paid()
    world.drain(world.dispatcher(allow_private_webhooks=False))
    [execution] = world.executions()
    assert execution.status == "dead"
    assert "private or local address" in (execution.last_error or "")


@pytest.mark.parametrize("kind", ["whatsapp", "ai"])
def test_a_connection_to_a_private_address_is_refused_by_default(world: World, kind: str) -> None:
    """A connection's base URL is the account's to set, as a webhook's URL is: one on a
    loopback address (the local servers here) is refused as the step runs, unless allowed,
    and nothing reaches it."""
    with ai_server() as (ai_url, ai):
        world.automations.create_integration(
            world.account.id, {"kind": "ai", "base_url": ai_url, "model": "m", "api_key": "k"}
        )
        step = {"type": "ai_respond"} if kind == "ai" else THANKS["steps"][0]
        world.automations.create(world.account.id, {
            "name": kind, "trigger_type": "order_paid", "steps": [step],
        })  # fmt: skip
        world.order_paid()
        world.drain(world.dispatcher(allow_private_webhooks=False))
    assert (ai.requests, world.whatsapp.requests) == ([], [])
    [execution] = world.executions()
    assert execution.status == "dead"
    assert "127.0.0.1, a private or local address" in (execution.last_error or "")


def _hook(world: World, url: str, **step: Any) -> None:
    world.automations.create(world.account.id, {
        "name": "crm", "trigger_type": "order_paid",
        "steps": [{"type": "webhook", "url": url, **step}],
    })  # fmt: skip


def _until_settled(world: World, dispatcher: Dispatcher) -> Any:
    """The one execution, once it is neither pending nor running (retries come due)."""
    for _ in range(100):
        dispatcher.run_once()
        [execution] = world.executions()
        if execution.status not in ("pending", "running"):
            return execution
        time.sleep(0.02)
    raise AssertionError(f"the execution is still {execution.status}")


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_webhook_answered_with_a_redirect_was_not_delivered(world: World, status: int) -> None:
    """Redirects are not followed (their target was never checked), so the receiver did not
    take the event: the step fails saying so, not completed with {"status": 30x}."""
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.status = status
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        execution = _until_settled(world, world.dispatcher())

    assert execution.status == "dead"
    assert f"answered {status}, a redirect" in (execution.last_error or "")
    assert len(hook.requests) == 1  # never retried: it would be redirected again


def test_webhook_answered_408_is_retried(world: World) -> None:
    """408 Request Timeout: the receiver (or its proxy) gave up waiting for the request and
    did not take it, so a retry may succeed; it ended the execution dead."""

    def first_408(body: Any, n: int) -> None:
        hook.behaviour.status = 408 if n == 0 else 200

    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.before_answer = first_408
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        execution = _until_settled(world, world.dispatcher())

    assert execution.status == "completed"
    assert len(hook.requests) == 2


def test_webhook_answered_409_on_its_idempotency_key_is_sent_again_with_the_same_key(
    world: World,
) -> None:
    """409 Conflict to a request carrying an Idempotency-Key: one with that key is still
    being processed (the IETF draft, Stripe), say an attempt that timed out here; the same
    request goes again later, and completes once the receiver answers 2xx. It was dead."""

    def conflict_first(body: Any, n: int) -> None:
        hook.behaviour.status = 409 if n == 0 else 200

    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.before_answer = conflict_first
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        execution = _until_settled(world, world.dispatcher())

    assert execution.status == "completed"
    first, second = hook.requests
    assert first["headers"]["Idempotency-Key"] == second["headers"]["Idempotency-Key"]
    assert first["raw"] == second["raw"]


def test_webhook_answered_409_until_the_last_attempt_ends_dead_saying_why(world: World) -> None:
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.status = 409
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        execution = _until_settled(world, world.dispatcher())

    assert (execution.status, len(hook.requests)) == ("dead", 3)  # max_attempts=3
    assert (
        "answered 409 Conflict: a request with this Idempotency-Key is still being "
        "processed there; sent again later with the same key" in (execution.last_error or "")
    )


IN_5_MINUTES = object()  # a Retry-After of an HTTP-date 300 s ahead


@pytest.mark.parametrize(
    ("status", "retry_after", "waits"),
    [
        (429, "120", 120.0),
        (503, IN_5_MINUTES, 300.0),
        (409, "90", 90.0),
        (429, "86400", 3600.0),  # a day: cut to the policy's cap
        (503, "9" * 40, 3600.0),
        # neither delta-seconds nor an HTTP-date: ignored, the backoff's draw stands
        (429, "soon", None),
        (503, "-5", None),
        (429, "1.5", None),
        (503, "Mon, 32 Dec 2026 10:00:00 GMT", None),
    ],
)
def test_webhook_retry_waits_as_the_receivers_retry_after_asks_within_the_cap(
    world: World, status: int, retry_after: object, waits: float | None
) -> None:
    """A 429, 503 (or 409) with `Retry-After` is retried no sooner than it asks, nor than
    the backoff's draw (here 30 to 60 s), and no later than the retry policy's cap; the
    draw alone was used, whatever the header said."""
    before = utcnow()
    is_date = retry_after is IN_5_MINUTES
    if is_date:
        retry_after = format_datetime(before + timedelta(seconds=301), usegmt=True)
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.status = status
        hook.behaviour.answer_headers = {"Retry-After": str(retry_after)}
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        dispatcher = world.dispatcher(retry=RetryPolicy(max_attempts=3, base=60, cap=3600))
        world.drain(dispatcher)  # one attempt: the next is not due before the wait
        after = utcnow()

    [execution] = world.executions()
    assert (execution.status, len(hook.requests)) == ("pending", 1)
    waited = (execution.run_at - before).total_seconds()
    elapsed = (after - before).total_seconds()  # the clock moved on while the step ran
    if waits is None:
        assert 30.0 <= waited <= 60.0 + elapsed
        assert "Retry-After" not in (execution.last_error or "")
    else:  # an HTTP-date has whole seconds: 300 to 301 s
        assert waits <= waited <= waits + elapsed + (1.0 if is_date else 0.0)
        assert "(Retry-After: " in (execution.last_error or "")


@pytest.mark.parametrize(
    ("status", "retry_after", "waits"), [(503, "120", 120.0), (429, "86400", 3600.0)]
)
def test_ai_endpoint_retry_waits_as_its_retry_after_asks_within_the_cap(
    world: World, status: int, retry_after: str, waits: float
) -> None:
    """An AI endpoint's 5xx is asked again (only the send is a side effect), as a webhook's
    is: its `Retry-After` is honoured alike, within the policy's cap. The 5xx's was dropped,
    the draw alone used."""
    before = utcnow()
    with ai_server() as (ai_url, ai):
        ai.behaviour.status = status
        ai.behaviour.answer_headers = {"Retry-After": retry_after}
        world.automations.create_integration(
            world.account.id, {"kind": "ai", "base_url": ai_url, "model": "m", "api_key": "k"}
        )
        world.automations.create(world.account.id, {
            "name": "ia", "trigger_type": "order_paid", "steps": [{"type": "ai_respond"}],
        })  # fmt: skip
        world.order_paid()
        world.drain(world.dispatcher(retry=RetryPolicy(max_attempts=3, base=60, cap=3600)))
        after = utcnow()

    [execution] = world.executions()
    assert (execution.status, len(ai.requests)) == ("pending", 1)
    waited = (execution.run_at - before).total_seconds()
    assert waits <= waited <= waits + (after - before).total_seconds()
    assert f"(Retry-After: {retry_after} s)" in (execution.last_error or "")
    assert world.whatsapp.bodies() == []


@pytest.mark.parametrize("delay", [86400.0, 1e12, float("inf")])
def test_a_retry_later_delay_is_cut_to_the_policys_cap(world: World, delay: float) -> None:
    """A step's `RetryLater` asking a long wait is honoured as a server's Retry-After is:
    at most the retry policy's cap. It was taken as given (a day; and past
    `timedelta`'s range, an OverflowError out of the worker)."""
    claim = world.claim_thanks("w1", 60)
    dispatcher = world.dispatcher(retry=RetryPolicy(max_attempts=3, base=60, cap=3600))
    before = utcnow()

    advance = dispatcher._retry(claim, 0, sinal.RetryLater("the provider asked", delay=delay))
    elapsed = (utcnow() - before).total_seconds()

    assert advance.status == "pending"
    assert advance.run_at is not None
    assert 3600.0 <= (advance.run_at - before).total_seconds() <= 3600.0 + elapsed


def test_a_retry_later_delay_shorter_than_the_backoff_waits_the_backoff(world: World) -> None:
    """Within the policy's bounds the other way too: no sooner than the backoff's draw
    (here 30 to 60 s), so the attempts still span the policy's window."""
    claim = world.claim_thanks("w1", 60)
    dispatcher = world.dispatcher(retry=RetryPolicy(max_attempts=3, base=60, cap=3600))
    before = utcnow()

    advance = dispatcher._retry(claim, 0, sinal.RetryLater("soon", delay=1.0))
    elapsed = (utcnow() - before).total_seconds()

    assert advance.run_at is not None
    assert 30.0 <= (advance.run_at - before).total_seconds() <= 60.0 + elapsed


def test_webhook_that_times_out_is_sent_again_with_the_same_idempotency_key(
    world: World,
) -> None:
    """Unlike a message, a webhook carries the key its receiver dedupes on, so one that
    may or may not have arrived is retried, as one interrupted by its worker's death is."""
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.before_answer = lambda body, n: time.sleep(1.0 if n == 0 else 0)
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        execution = _until_settled(world, world.dispatcher())

    assert execution.status == "completed"
    first, second = hook.requests
    assert first["headers"]["Idempotency-Key"] == second["headers"]["Idempotency-Key"]
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    assert detail.steps[0].attempts == 2  # the first timed out


def test_webhook_answer_trickling_in_holds_the_step_no_longer_than_the_timeout(
    world: World,
) -> None:
    """The client's timeout bounds each read, not their sum: an answer whose body comes a
    byte every 50 ms for 5 s held the step (and a worker thread) for those 5 s."""
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.trickle = 5.0
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        began = time.monotonic()
        execution = _until_settled(world, world.dispatcher())
        took = time.monotonic() - began

    assert (execution.status, len(hook.requests)) == ("completed", 1)
    assert took < 3.0


def test_send_whose_answer_trickles_in_is_unknown(world: World) -> None:
    """The WhatsApp API's answer is read for at most the timeout once it began: past it,
    whether the message left is unknown (it was not known for 5 s before either)."""
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.trickle = 5.0
    world.order_paid()
    began = time.monotonic()
    execution = _until_settled(world, world.dispatcher())

    assert time.monotonic() - began < 3.0
    assert execution.status == "unknown"
    assert "too slowly" in (execution.last_error or "")


def test_send_whose_answer_is_larger_than_any_of_the_apis_is_unknown(world: World) -> None:
    """At most `MAX_ANSWER` bytes of an answer are read: a server answering without end
    never fills the worker's memory."""
    world.automations.create(world.account.id, THANKS)
    world.whatsapp.behaviour.answer = lambda body, n: {
        "messages": [{"id": f"wamid.{n}"}], "padding": "x" * MAX_ANSWER,
    }  # fmt: skip
    world.order_paid()
    execution = _until_settled(world, world.dispatcher())

    assert execution.status == "unknown"
    assert f"more than {MAX_ANSWER} bytes" in (execution.last_error or "")


def test_webhook_header_named_like_sinals_own_is_sent_once_as_sinal_sets_it(
    world: World,
) -> None:
    """Header names are case-insensitive: an `idempotency-key` of the step's own went out
    beside sinal's `Idempotency-Key` (a receiver reading the first deduped every event of
    the automation as one), and a `content-type` beside sinal's `Content-Type`."""
    with webhook_receiver() as (hook_url, hook):
        _hook(
            world,
            f"{hook_url}/hook",
            headers={"idempotency-key": "fixo", "content-type": "application/json"},
        )
        world.order_paid()
        _until_settled(world, world.dispatcher())

    [request] = hook.requests
    keys = [k for k in request["raw_headers"] if k.lower() == "idempotency-key"]
    types = [k for k in request["raw_headers"] if k.lower() == "content-type"]
    assert (len(keys), len(types)) == (1, 1)
    assert request["headers"]["Idempotency-Key"].endswith(":0")


@pytest.mark.parametrize("host", ["8.8.8.8", "[2606:4700::1111]", "[64:ff9b::808:808]"])
def test_webhook_to_a_public_address_is_let_through(host: str) -> None:
    """NAT64 to a public IPv4 address is public (an IPv6-only network reaches the web so)."""
    assert refuse_private_target(f"http://{host}/hook") == [host.strip("[]")]


PUBLIC = "8.8.8.8"  # global, as `ipaddress` sees it; nothing of this test listens there


def rebinding_resolver(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """A DNS server rebinding `name` (TTL 0): its first lookup answers a public address, the
    next ones 127.0.0.1. The addresses connected to (by the real `socket.create_connection`)."""
    lookups = itertools.chain([PUBLIC], itertools.repeat("127.0.0.1"))
    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.create_connection
    connected: list[Any] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != name:
            return real_getaddrinfo(host, port, *args, **kwargs)
        address = next(lookups)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port or 0))]

    def create_connection(address: Any, *args: Any, **kwargs: Any) -> Any:
        connected.append(address)
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return connected


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_webhook_to_a_name_rebinding_to_a_private_address_connects_to_the_address_checked(
    world: World, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """The host is resolved once and checked, and the connection goes to that address: a
    second lookup answering 127.0.0.1 never reaches the receiver listening there."""
    with webhook_receiver() as (hook_url, hook):
        port = int(hook_url.rsplit(":", 1)[1])
        connected = rebinding_resolver(monkeypatch, "hooks.example.com")
        world.automations.create(world.account.id, {
            "name": "crm", "trigger_type": "order_paid",
            "steps": [{"type": "webhook", "url": f"{scheme}://hooks.example.com:{port}/hook"}],
        })  # fmt: skip
        world.order_paid()
        once = RetryPolicy(max_attempts=1)
        world.drain(world.dispatcher(allow_private_webhooks=False, retry=once))
    assert hook.requests == []
    assert connected == [(PUBLIC, port)]  # the one attempt, to the address checked
    [execution] = world.executions()
    assert execution.status == "dead"
    assert f"could not connect to hooks.example.com:{port}" in (execution.last_error or "")


def test_close_conversation_closes_the_open_one_and_records_it(world: World) -> None:
    conversation = uuid.uuid4()
    sql(world.url, "INSERT INTO conversations (account_id, id, contact_id, status, opened_at) "
        "VALUES (?, ?, ?, 'open', '2026-11-01T00:00:00.000000Z')",
        str(world.account.id), str(conversation), str(world.contact.id))  # fmt: skip
    world.automations.create(world.account.id, {
        "name": "fechar", "trigger_type": "order_paid",
        "steps": [{"type": "close_conversation"}, {"type": "close_conversation"}],
    })  # fmt: skip
    world.order_paid()
    world.drain(world.dispatcher())
    closed = world.ledger.list_events(
        EventQuery(world.account.id, metric_name="Conversation Closed")
    )
    assert [e.entity_id for e in closed] == [str(conversation)]
    assert world.executions()[0].status == "completed"


def test_invalid_definitions_name_the_field(world: World) -> None:
    with pytest.raises(InvalidAutomation) as caught:
        world.automations.create(world.account.id, {"name": "x", "trigger_type": "nope",
                                                     "steps": []})  # fmt: skip
    assert {e.field for e in caught.value.errors} >= {"trigger_type", "steps"}
    with pytest.raises(InvalidIntegration) as bad:
        world.automations.create_integration(world.account.id, {"kind": "whatsapp"})
    assert {e.field for e in bad.value.errors} == {"phone_number_id", "secret", "access_token"}


def _unknown_send(world: World) -> Claim:
    """THANKS's execution, its send started and settled `unknown` (the worker timed out)."""
    claim = world.claim_thanks("worker-a", 30.0)
    store = world.automations.store
    assert isinstance(store.start_step(claim, 0, "send_message"), tuple)
    assert store.finish_step(claim, 0, "unknown", error="timed out",
                             then=Advance("unknown", 0, last_error="timed out"))  # fmt: skip
    return claim


_REFUSE_STEP_UPDATES = {
    "sqlite": ["CREATE TRIGGER refuse_step_updates BEFORE UPDATE ON execution_steps "
               "BEGIN SELECT RAISE(ABORT, 'step updates refused'); END"],
    "postgres": ["CREATE FUNCTION refuse_step_updates() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN RAISE EXCEPTION 'step updates refused'; END $$",
                 "CREATE TRIGGER refuse_step_updates BEFORE UPDATE ON execution_steps "
                 "FOR EACH ROW EXECUTE FUNCTION refuse_step_updates()"],
}  # fmt: skip


def test_retry_dead_revives_an_execution_with_its_steps_or_not_at_all(world: World) -> None:
    """Reviving an unknown execution resets its step records in the same transaction: were
    the execution pending before they are reset, a worker claiming it in between would find
    the send still unknown and settle it so again (the retry silently doing nothing)."""
    claim = _unknown_send(world)
    backend = "sqlite" if world.url.startswith("sqlite") else "postgres"
    for statement in _REFUSE_STEP_UPDATES[backend]:
        sql(world.url, statement)

    with pytest.raises(StoreError):
        world.automations.store.retry_dead(world.account.id, claim.execution.id)

    [execution] = world.executions()
    assert execution.status == "unknown"  # not pending with its send still unknown
    sql(world.url, "DROP TRIGGER refuse_step_updates" + (
        "" if backend == "sqlite" else " ON execution_steps"))  # fmt: skip
    assert world.automations.store.retry_dead(world.account.id, claim.execution.id) == 1
    world.drain(world.dispatcher())
    assert world.executions()[0].status == "completed"
    assert len(world.whatsapp.bodies()) == 1


def test_retry_dead_resets_the_steps_of_its_own_account_only(world: World) -> None:
    """An execution id of another account (ids are unique per account only) keeps its
    step records when this account's execution of that id is revived."""
    claim = _unknown_send(world)
    other = world.ledger.create_account("Outra Loja")
    contact = world.ledger.create_contact(other.id, phone="+55 11 91234-5678")
    automation = world.automations.create(other.id, THANKS)
    x = str(claim.execution.id)
    sql(world.url, "INSERT INTO executions (account_id, id, automation_id, event_id, "
        "contact_id, status, run_at, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'unknown', "
        "'2026-01-01T00:00:00.000000Z', '2026-01-01T00:00:00.000000Z', "
        "'2026-01-01T00:00:00.000000Z')",
        str(other.id), x, str(automation.id), str(uuid.uuid4()), str(contact.id))  # fmt: skip
    sql(world.url, "INSERT INTO execution_steps (account_id, execution_id, step_index, "
        "step_type, status, started_at) VALUES (?, ?, 0, 'send_message', 'unknown', "
        "'2026-01-01T00:00:00.000000Z')", str(other.id), x)  # fmt: skip

    assert world.automations.store.retry_dead(world.account.id, claim.execution.id) == 1

    steps = sql(world.url, "SELECT account_id, status FROM execution_steps "
                "WHERE execution_id = ? ORDER BY status", x)  # fmt: skip
    assert [(str(a), s) for a, s in steps] == [
        (str(world.account.id), "failed"),
        (str(other.id), "unknown"),
    ]


def test_a_refusal_whose_text_holds_a_nul_is_recorded_with_it_replaced(world: World) -> None:
    """A receiver's answer goes into the step's error: a NUL in it (which PostgreSQL's text
    refuses) is stored as U+FFFD on both backends, and the execution is dead as it should."""
    with webhook_receiver() as (hook_url, hook):
        hook.behaviour.status = 400
        hook.behaviour.refusal = b'{"error": "campo\x00inv\xe1lido"}'  # a NUL, bad UTF-8
        world.automations.create(world.account.id, {
            "name": "crm", "trigger_type": "order_paid",
            "steps": [{"type": "webhook", "url": f"{hook_url}/hook"}],
        })  # fmt: skip
        world.order_paid()
        world.drain(world.dispatcher())

    [execution] = world.executions()
    assert execution.status == "dead"
    assert execution.last_error is not None
    assert execution.last_error.endswith('(400): {"error": "campo\ufffdinv\ufffdlido"}')
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    assert detail.steps[0].error == execution.last_error


def test_a_step_record_that_cannot_be_stored_as_given_fails_no_other(world: World) -> None:
    """Step records share a statement (`finish_steps`): one whose texts hold what a
    database refuses is stored cleaned, and never fails the others."""
    world.automations.create(world.account.id, THANKS)
    world.order_paid(source_id="1001")
    world.order_paid(source_id="1002")
    store = world.automations.store
    store.fan_out(lambda e, c: [a.id for a in c], 10)
    claims = store.claim_executions("worker-a", 10, 30.0)
    starts = store.start_steps([StepStart(c, 0, "send_message") for c in claims])
    assert all(isinstance(s, tuple) for s in starts)
    bad, good = claims
    refused = "x\x00y\ud800z"
    held = store.finish_steps([
        StepFinish(bad, 0, "failed", result={"text": refused, refused: [refused]},
                   error=refused, then=Advance("dead", 0, last_error=refused)),
        StepFinish(good, 0, "completed", result={"wamid": "wamid.1"}),
    ])  # fmt: skip

    assert held == [True, True]
    dead = store.get_execution(world.account.id, bad.execution.id)
    assert dead is not None
    cleaned = "x\ufffdy\ufffdz"
    assert (dead.status, dead.last_error, dead.steps[0].error) == ("dead", cleaned, cleaned)
    assert dead.steps[0].result == {"text": cleaned, cleaned: [cleaned]}
    going = store.get_execution(world.account.id, good.execution.id)
    assert going is not None
    assert going.steps[0].result == {"wamid": "wamid.1"}


_REFUSE_COMPLETIONS = {
    "sqlite": ["CREATE TRIGGER refuse_completions BEFORE UPDATE ON execution_steps "
               "WHEN NEW.status = 'completed' BEGIN SELECT RAISE(ABORT, 'refused'); END"],
    "postgres": ["CREATE FUNCTION refuse_completions() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN IF NEW.status = 'completed' THEN RAISE EXCEPTION 'refused'; END IF; "
                 "RETURN NEW; END $$",
                 "CREATE TRIGGER refuse_completions BEFORE UPDATE ON execution_steps "
                 "FOR EACH ROW EXECUTE FUNCTION refuse_completions()"],
}  # fmt: skip


def _open_conversation(world: World, opened_at: str) -> uuid.UUID:
    conversation = uuid.uuid4()
    sql(world.url, "INSERT INTO conversations (account_id, id, contact_id, status, opened_at) "
        "VALUES (?, ?, ?, 'open', ?)",
        str(world.account.id), str(conversation), str(world.contact.id), opened_at)  # fmt: skip
    return conversation


def test_close_conversation_resumed_after_a_crash_records_its_close_once(world: World) -> None:
    """The close and its Conversation Closed event commit together; a worker that dies
    before the step's record leaves a step that, run again, finds what it closed (and
    leaves alone a conversation opened since)."""
    first = _open_conversation(world, "2026-11-01T00:00:00.000000Z")
    world.automations.create(world.account.id, {
        "name": "fechar", "trigger_type": "order_paid",
        "steps": [{"type": "close_conversation"}],
    })  # fmt: skip
    world.order_paid()
    backend = "sqlite" if world.url.startswith("sqlite") else "postgres"
    for statement in _REFUSE_COMPLETIONS[backend]:
        sql(world.url, statement)
    with pytest.raises(StoreError):  # the step's record fails: as if the worker died there
        world.drain(world.dispatcher(lease=0.3))
    sql(world.url, "DROP TRIGGER refuse_completions" + (
        "" if backend == "sqlite" else " ON execution_steps"))  # fmt: skip
    second = _open_conversation(world, "2026-11-02T00:00:00.000000Z")
    time.sleep(0.4)  # the dead worker's lease expires

    _run_until(world, world.dispatcher(), "completed", "dead")  # the step, taken over, again

    closed = world.ledger.list_events(
        EventQuery(world.account.id, metric_name="Conversation Closed")
    )
    assert [e.entity_id for e in closed] == [str(first)]
    [execution] = world.executions()
    assert execution.status == "completed"
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    assert (detail.steps[0].result, detail.steps[0].event_id) == (
        {"closed": str(first)},
        closed[0].id,
    )
    statuses = sql(world.url, "SELECT id, status FROM conversations ORDER BY opened_at")
    assert [(str(i), s) for i, s in statuses] == [(str(first), "closed"), (str(second), "open")]


def _connect_whatsapp(world: World, **changes: str) -> None:
    """Replace the account's WhatsApp connection by one with `changes`, stored as given
    (as one made before its values were checked when a connection is made)."""
    store = world.automations.store
    [old] = store.list_integrations(world.account.id, "whatsapp")
    store.delete_integration(world.account.id, old.id)
    settings = {k: changes.pop(k, v) for k, v in old.settings.items()}
    secrets = {k: changes.pop(k, v) for k, v in old.secrets.items()}
    store.create_integration(Integration(world.account.id, uuid.uuid4(), "whatsapp", None,
                                         settings, secrets, old.created_at))  # fmt: skip


def _run_until(world: World, dispatcher: Dispatcher, *statuses: str) -> None:
    for _ in range(100):
        dispatcher.run_once()
        if world.executions()[0].status in statuses:
            return
        time.sleep(0.02)


@pytest.mark.parametrize(
    "changes",
    [
        {"api_base_url": "http://a..b"},  # a host IDNA refuses: UnicodeError, not OSError
        {"api_base_url": "http://☃.net"},  # one httpx refuses: InvalidURL, not an HTTPError
        {"access_token": "EAAG-ção"},  # no header value: UnicodeEncodeError
    ],
)
def test_a_send_that_cannot_leave_is_retried_then_dead_never_unknown(
    world: World, changes: dict[str, str]
) -> None:
    """A request that fails before it could leave is a failed attempt like a refused
    connection: retried, then dead once the attempts are spent, never "may have been sent"
    (nor retried for ever)."""
    _connect_whatsapp(world, **changes)
    world.automations.create(world.account.id, THANKS)
    world.order_paid()

    _run_until(world, world.dispatcher(), "dead", "unknown")

    [execution] = world.executions()
    assert (execution.status, execution.attempts) == ("dead", 3)
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    assert [(s.status, s.attempts) for s in detail.steps] == [("failed", 3)]
    assert world.whatsapp.requests == []


def test_a_database_error_finding_the_connection_is_a_failed_attempt(world: World) -> None:
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    sql(world.url, "ALTER TABLE integrations RENAME TO integrations_away")
    dispatcher = world.dispatcher()

    dispatcher.run_once()

    [execution] = world.executions()
    assert (execution.status, execution.attempts) == ("pending", 1)  # not unknown
    assert "integrations" in (execution.last_error or "")
    sql(world.url, "ALTER TABLE integrations_away RENAME TO integrations")
    _run_until(world, dispatcher, "completed", "dead", "unknown")
    assert world.executions()[0].status == "completed"
    assert len(world.whatsapp.bodies()) == 1


def test_an_ai_answer_holding_a_nul_is_sent_and_recorded_without_it(world: World) -> None:
    with ai_server() as (ai_url, ai):
        ai.behaviour.answer = lambda body, n: {
            "choices": [{"message": {"role": "assistant", "content": "Olá\x00 Ana!"}}]
        }
        world.automations.create_integration(
            world.account.id, {"kind": "ai", "base_url": ai_url, "model": "m", "api_key": "k"}
        )
        world.automations.create(world.account.id, {
            "name": "ia", "trigger_type": "order_paid", "steps": [{"type": "ai_respond"}],
        })  # fmt: skip
        world.order_paid()
        world.drain(world.dispatcher())

    [sent] = world.whatsapp.bodies()
    assert sent["text"]["body"] == "Olá Ana!"
    [event] = world.ledger.list_events(EventQuery(world.account.id, metric_name="AI Response Sent"))
    assert (event.entity_id, event.properties["text"]) == ("wamid.LOCAL00000000", "Olá Ana!")
    assert world.executions()[0].status == "completed"


def test_an_ai_endpoint_that_does_not_answer_in_time_is_asked_again(world: World) -> None:
    """Only the send is a side effect: a question the AI endpoint did not answer in time is
    a failed attempt, asked again, never "may have been sent" (nothing went to the contact)."""
    with ai_server() as (ai_url, ai):
        ai.behaviour.before_answer = lambda body, n: time.sleep(1.0) if n == 0 else None
        world.automations.create_integration(
            world.account.id, {"kind": "ai", "base_url": ai_url, "model": "m", "api_key": "k"}
        )
        world.automations.create(world.account.id, {
            "name": "ia", "trigger_type": "order_paid", "steps": [{"type": "ai_respond"}],
        })  # fmt: skip
        world.order_paid()
        _run_until(world, world.dispatcher(), "completed", "dead", "unknown")

    [execution] = world.executions()
    assert (execution.status, execution.attempts) == ("completed", 1)
    assert len(ai.requests) == 2
    assert len(world.whatsapp.bodies()) == 1


def test_a_sent_message_whose_event_is_refused_keeps_its_wamid(world: World) -> None:
    """After the send nothing may lose it: a WAMID no event can carry (an entity id is at
    most 255 characters) still completes the step, its result holding the WAMID, and the
    step's error says why its event is missing."""
    wamid = "wamid." + "A" * 300
    world.whatsapp.behaviour.answer = lambda body, n: {"messages": [{"id": wamid}]}
    world.automations.create(world.account.id, THANKS)
    world.order_paid()

    world.drain(world.dispatcher())

    assert len(world.whatsapp.bodies()) == 1
    [execution] = world.executions()
    assert execution.status == "completed"  # the next step ran
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    sent = detail.steps[0]
    assert (sent.status, sent.result["wamid"] if sent.result else None) == ("completed", wamid)
    assert "entity_id" in (sent.error or "")
    assert sent.event_id is None
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]


# What the database refuses of a step's event of one metric that no validation foresaw:
# its data (a constraint), sinal's own statement (a schema changed under it: a trigger
# naming a column that is not there, or leaving a NOT NULL column empty), or its
# configuration (PostgreSQL: a trigger set up wrong, 09000, as contrib's fail).
_REFUSE_METRIC = {
    ("sqlite", "data"): ["CREATE TRIGGER refuse_metric BEFORE INSERT ON events "
                         "WHEN NEW.metric_name = '{metric}' "
                         "BEGIN SELECT RAISE(ABORT, 'refused'); END"],
    ("sqlite", "schema"): ["CREATE TABLE audit (note TEXT NOT NULL)",
                           "CREATE TRIGGER refuse_metric BEFORE INSERT ON events "
                           "WHEN NEW.metric_name = '{metric}' "
                           "BEGIN INSERT INTO audit VALUES (NULL); END"],
    ("postgres", "data"): ["ALTER TABLE events ADD CONSTRAINT refuse_metric "
                           "CHECK (metric_name <> '{metric}') NOT VALID"],
    ("postgres", "schema"): ["CREATE FUNCTION refuse_metric() RETURNS trigger LANGUAGE plpgsql "
                             "AS $$ BEGIN IF NEW.metric_name = '{metric}' THEN "
                             "RAISE EXCEPTION 'no column x' USING ERRCODE = 'undefined_column';"
                             " END IF; RETURN NEW; END $$",
                             "CREATE TRIGGER refuse_metric BEFORE INSERT ON events "
                             "FOR EACH ROW EXECUTE FUNCTION refuse_metric()"],
    ("postgres", "config"): ["CREATE FUNCTION refuse_metric() RETURNS trigger LANGUAGE plpgsql "
                             "AS $$ BEGIN IF NEW.metric_name = '{metric}' THEN "
                             "RAISE EXCEPTION 'set up wrong' USING ERRCODE = "
                             "'triggered_action_exception'; END IF; RETURN NEW; END $$",
                             "CREATE TRIGGER refuse_metric BEFORE INSERT ON events "
                             "FOR EACH ROW EXECUTE FUNCTION refuse_metric()"],
}  # fmt: skip
_ALLOW_METRIC = {
    "sqlite": ["DROP TRIGGER refuse_metric"],
    "postgres": ["ALTER TABLE events DROP CONSTRAINT IF EXISTS refuse_metric",
                 "DROP TRIGGER IF EXISTS refuse_metric ON events"],
}  # fmt: skip


def _backend(world: World) -> str:
    return "sqlite" if world.url.startswith("sqlite") else "postgres"


def _refuse_metric(world: World, metric: str, refusal: str = "data") -> None:
    """Have the world's database refuse every event of `metric` (see `_REFUSE_METRIC`)."""
    for statement in _REFUSE_METRIC[_backend(world), refusal]:
        sql(world.url, statement.replace("{metric}", metric))


# A trigger set up wrong (`config`) is a SQLSTATE of PostgreSQL's: SQLite has none.
@pytest.mark.parametrize(
    ("database_url", "refusal"),
    [("sqlite", "data"), ("sqlite", "schema")]
    + [
        pytest.param("postgres", r, marks=pytest.mark.postgres)
        for r in ("data", "schema", "config")
    ],
    indirect=["database_url"],
)
def test_a_sent_message_whose_event_the_database_refuses_is_recorded_and_kept(
    world: World, refusal: str
) -> None:
    """The database refuses the Message Sent of a message that went out: the step is
    recorded completed all the same, its WAMID kept, its error saying where the event
    went; the event is kept as a rejection (reason "refused") and the execution goes on
    (the tag step runs). Nothing is sent twice, and replaying the rejection once the cause
    is fixed records the event, still marked as the execution's. (A trigger set up wrong,
    `StoreMisconfigured`, failed the step's record, its send left unknown.)"""
    _refuse_metric(world, "Message Sent", refusal)
    world.automations.create(world.account.id, THANKS)
    world.order_paid()

    world.drain(world.dispatcher())
    world.drain(world.dispatcher())

    assert len(world.whatsapp.bodies()) == 1
    [execution] = world.executions()
    assert (execution.status, execution.last_error) == ("completed", None)
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    sent = detail.steps[0]
    assert (sent.status, sent.event_id) == ("completed", None)
    assert sent.result is not None
    assert sent.result["wamid"] == "wamid.LOCAL00000000"
    [rejection] = world.ledger.list_rejections(world.account.id)
    assert (rejection.reason, rejection.message) == ("refused", STEP_EVENT_REFUSED)
    assert sent.error == (
        "the step's Message Sent event was not recorded (the database refused it); kept as "
        f"rejection {rejection.id}, to replay once the cause is fixed"
    )
    assert rejection.payload["entity_id"] == "wamid.LOCAL00000000"
    assert rejection.payload["automation_execution_id"] == str(execution.id)
    query = EventQuery(world.account.id, metric_name="Message Sent")
    assert world.ledger.list_events(query) == []

    for statement in _ALLOW_METRIC[_backend(world)]:
        sql(world.url, statement)
    replay = world.ledger.replay_rejection(world.account.id, rejection.id)

    assert replay is not None
    assert replay.outcome is not None
    [event] = world.ledger.list_events(query)
    assert (event.id, event.entity_id) == (replay.outcome.event_id, "wamid.LOCAL00000000")
    assert event.automation_execution_id == execution.id
    assert count(world.url, "outbox") == 0  # a step's event, replayed, triggers nothing


@pytest.mark.parametrize("refusal", ["data", "schema"])
def test_a_batch_of_step_records_keeps_only_the_event_the_database_refuses(
    world: World, refusal: str
) -> None:
    """Step records share a transaction (`finish_steps`): of six steps' events, the one the
    database refuses (a Message Sent among Tag Addeds) is kept as a rejection and its step
    says so; each other step names its event, recorded (one of them a repeat of an event
    recorded before: that event), and the summaries count them."""
    world.automations.create(world.account.id, THANKS)
    for n in range(6):
        world.order_paid(source_id=str(1001 + n))
    store = world.automations.store
    store.fan_out(lambda e, c: [a.id for a in c], 10)
    claims = store.claim_executions("worker-a", 10, 30.0)
    assert len(claims) == 6
    assert all(isinstance(s, tuple) for s in store.start_steps(
        [StepStart(c, 0, "add_tag") for c in claims]))  # fmt: skip
    emitted = [
        EmitEvent(account_id=world.account.id, contact_id=world.contact.id,
                  metric_name="Message Sent" if i == 2 else "Tag Added", source="automation",
                  source_id=f"step-{i}", automation_execution_id=c.execution.id)
        for i, c in enumerate(claims)
    ]  # fmt: skip
    before = world.ledger.emit(replace(emitted[4], automation_execution_id=None))
    assert before.event_id is not None
    emits = [prepare(e, world.ledger.clock()) for e in emitted]
    _refuse_metric(world, "Message Sent", refusal)

    held = store.finish_steps(
        [StepFinish(c, 0, "completed", {"n": i}, emit=e)
         for i, (c, e) in enumerate(zip(claims, emits, strict=True))]
    )  # fmt: skip

    assert held == [True] * 6
    steps = []
    for claim in claims:
        detail = store.get_execution(world.account.id, claim.execution.id)
        assert detail is not None
        steps.append(detail.steps[0])
    [rejection] = world.ledger.list_rejections(world.account.id)
    assert (rejection.id, rejection.reason, rejection.message) == (
        emits[2].id, "refused", STEP_EVENT_REFUSED,
    )  # fmt: skip
    expected: list[uuid.UUID | None] = [e.id for e in emits]
    expected[2], expected[4] = None, before.event_id
    assert [s.event_id for s in steps] == expected
    assert [s.error for s in steps] == [None, None, (
        "the step's Message Sent event was not recorded (the database refused it); kept as "
        f"rejection {rejection.id}, to replay once the cause is fixed"
    ), None, None, None]  # fmt: skip
    assert [s.status for s in steps] == ["completed"] * 6
    tagged = world.ledger.list_events(EventQuery(world.account.id, metric_name="Tag Added"))
    assert sorted(e.id for e in tagged) == sorted(x for x in expected if x is not None)
    assert world.ledger.list_events(EventQuery(world.account.id, metric_name="Message Sent")) == []
    summaries = {
        s.metric_name: s for s in world.ledger.get_summary(world.account.id, world.contact.id)
    }
    assert summaries["Tag Added"].event_count == 5
    assert "Message Sent" not in summaries


def test_a_tag_step_whose_event_the_database_refuses_ends_dead_at_once(world: World) -> None:
    """The database refuses a tag step's Tag Added, written with the tag in one transaction:
    nothing was written, and nothing would be on another attempt. The step fails for good
    at its first attempt (dead, saying why), the message before it sent once."""
    _refuse_metric(world, "Tag Added")
    world.automations.create(world.account.id, THANKS)
    world.order_paid()

    world.drain(world.dispatcher())

    [execution] = world.executions()
    assert (execution.status, execution.attempts, execution.next_step) == ("dead", 1, 1)
    assert (execution.last_error or "").startswith("the database refused what the step records")
    assert world.ledger.list_tags(world.account.id, world.contact.id) == []
    assert len(world.whatsapp.bodies()) == 1


def test_a_tag_step_whose_schema_fault_is_retried_and_runs_once_the_schema_is_fixed(
    world: World,
) -> None:
    """The database refuses a tag step's Tag Added for sinal's own statement (a schema
    changed under it: `SchemaViolation`), not for its data: the step is retried with
    backoff, not dead, and once an operator fixes the schema its next attempt tags the
    contact, with no revival; the message before it sent once."""
    _refuse_metric(world, "Tag Added", "schema")
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    dispatcher = world.dispatcher(retry=RetryPolicy(max_attempts=3, base=60, cap=3600))

    world.drain(dispatcher)

    [execution] = world.executions()
    assert (execution.status, execution.attempts, execution.next_step) == ("pending", 1, 1)
    assert world.ledger.list_tags(world.account.id, world.contact.id) == []
    for statement in _ALLOW_METRIC[_backend(world)]:  # the operator's fix
        sql(world.url, statement)
    sql(world.url, "UPDATE executions SET run_at = created_at")  # its backoff over
    world.drain(dispatcher)

    [execution] = world.executions()
    assert execution.status == "completed"
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]
    assert len(world.whatsapp.bodies()) == 1


@pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_tag_step_the_operators_configuration_refuses_waits_uncounted_for_the_fix(
    world: World,
) -> None:
    """The database refuses a tag step for its operator's configuration (a trigger set up
    wrong, `StoreMisconfigured`): the step was retried as any failure, and ended dead once
    the policy's attempts were spent, however soon the operator fixed it. It waits,
    pending, no attempt counted, and runs once the fix is made; the message sent once."""
    _refuse_metric(world, "Tag Added", "config")
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    dispatcher = world.dispatcher(retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02))

    for _ in range(10):  # far more tries than the policy's attempts
        world.drain(dispatcher)
        time.sleep(0.03)

    [execution] = world.executions()
    assert (execution.status, execution.attempts, execution.next_step) == ("pending", 0, 1)
    assert execution.last_error is not None
    assert execution.last_error.startswith("set up wrong; fix or drop the trigger")
    assert world.ledger.list_tags(world.account.id, world.contact.id) == []
    for statement in _ALLOW_METRIC[_backend(world)]:  # the operator's fix
        sql(world.url, statement)
    sql(world.url, "UPDATE executions SET run_at = created_at")
    world.drain(dispatcher)

    [execution] = world.executions()
    assert execution.status == "completed"
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]
    assert len(world.whatsapp.bodies()) == 1


def test_a_step_whose_worker_dies_every_time_ends_dead(world: World) -> None:
    """A step taken over from a worker that stopped inside it counts as a failed attempt,
    so a step that kills its worker every time (a poison pill) ends dead instead of taking
    down one worker after another for ever."""
    with webhook_receiver() as (hook_url, hook):
        world.automations.create(world.account.id, {
            "name": "crm", "trigger_type": "order_paid",
            "steps": [{"type": "webhook", "url": f"{hook_url}/hook"}],
        })  # fmt: skip
        world.order_paid()
        store = world.automations.store
        store.fan_out(lambda e, c: [a.id for a in c], 10)
        dispatcher = world.dispatcher(lease=0.2)
        for attempt in range(1, 4):
            claims: list[Claim] = []
            while not claims:  # once its retry is due
                claims = store.claim_executions("doomed", 1, 0.2)
            assert isinstance(store.start_step(claims[0], 0, "webhook"), tuple)  # ...and it dies
            time.sleep(0.3)
            dispatcher.run_once()  # takes the execution over
            [execution] = world.executions()
            assert execution.attempts == attempt
        assert hook.requests == []

    assert execution.status == "dead"
    assert "interrupted" in (execution.last_error or "")


def test_a_stored_definition_failing_todays_checks_stops_nothing_else(world: World) -> None:
    """A definition stored before a check it fails was added (here: it has no steps) no
    longer runs, and stops nothing else: the other automations run, an execution of it made
    before ends dead saying why, the trace says why, and a PATCH still repairs it."""
    world.automations.create(world.account.id, THANKS)
    old = world.automations.create(world.account.id, {
        "name": "antiga", "trigger_type": "order_paid",
        "steps": [{"type": "add_tag", "tag": "antiga"}],
    })  # fmt: skip
    world.order_paid(source_id="1001")
    store = world.automations.store
    store.fan_out(choose, 10)  # its execution is made while its definition passes
    assert store.update_automation(
        world.account.id, old.id, lambda row: replace(row, spec={**row.spec, "steps": []})
    )
    dispatcher = world.dispatcher()

    world.drain(dispatcher)
    second = world.order_paid(source_id="1002")
    world.drain(dispatcher)

    by_automation = sorted((x.automation_id == old.id, x.status) for x in world.executions())
    assert by_automation == [(False, "completed"), (False, "completed"), (True, "dead")]
    [dead] = [x for x in world.executions() if x.automation_id == old.id]
    assert "steps" in (dead.last_error or "")
    assert len(world.whatsapp.bodies()) == 2
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["comprou"]
    assert second.event_id is not None
    stored = world.ledger.get_event(world.account.id, second.event_id)
    assert stored is not None
    [traced] = [t for t in world.automations.trace(stored) if t["automation_id"] == str(old.id)]
    assert (traced["triggered"], traced["outcome"]) == (False, "invalid_definition")
    assert "steps" in traced["message"]

    repaired = world.automations.update(world.account.id, old.id, {
        "steps": [{"type": "add_tag", "tag": "antiga"}],
    })  # fmt: skip
    assert repaired is not None
    assert repaired.spec["steps"] == [{"type": "add_tag", "tag": "antiga"}]


# -- pausing and deleting an automation with executions in flight --------------------------

HELD = "the automation is paused: held until it is active again"
DELETED = "the automation was deleted"

REMINDER = {
    "name": "lembrete", "trigger_type": "order_paid",
    "steps": [{"type": "send_message", "text": "primeira"}, {"type": "wait", "seconds": 1},
              {"type": "send_message", "text": "segunda"}, {"type": "add_tag", "tag": "lembrado"}],
}  # fmt: skip


def _detail(world: World) -> Any:
    [execution] = world.executions()
    return world.automations.store.get_execution(world.account.id, execution.id)


def _texts(world: World) -> list[str]:
    return [b["text"]["body"] for b in world.whatsapp.bodies("/1234567890/messages")]


def _hook_then_message(world: World, hook_url: str) -> Any:
    """An automation posting a webhook, then sending a message."""
    return world.automations.create(world.account.id, {
        "name": "crm", "trigger_type": "order_paid",
        "steps": [{"type": "webhook", "url": f"{hook_url}/hook"},
                  {"type": "send_message", "text": "Oi!"}],
    })  # fmt: skip


def test_a_waiting_execution_of_a_paused_automation_is_held_then_runs_once_resumed(
    world: World,
) -> None:
    """A paused automation's execution in a `wait` step sends nothing when the wait is
    over: it is held (its completed steps stay completed), and resuming the automation
    lets it go on at once, each step having run exactly once."""
    row = world.automations.create(world.account.id, REMINDER)
    world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)
    assert (_detail(world).status, _texts(world)) == ("waiting", ["primeira"])

    world.automations.update(world.account.id, row.id, {"status": "paused"})
    time.sleep(1.1)  # the wait is over
    world.drain(dispatcher)
    world.drain(dispatcher)

    held = _detail(world)
    assert _texts(world) == ["primeira"]
    assert (held.status, held.next_step, held.last_error) == ("waiting", 2, HELD)
    assert [(s.status, s.attempts) for s in held.steps] == [("completed", 1), ("completed", 1)]
    assert world.ledger.list_tags(world.account.id, world.contact.id) == []

    world.automations.update(world.account.id, row.id, {"status": "active"})
    resumed = _detail(world)
    assert resumed.last_error is None
    world.drain(dispatcher)  # at once: resuming moved it up

    done = _detail(world)
    assert _texts(world) == ["primeira", "segunda"]
    assert (done.status, done.last_error) == ("completed", None)
    assert [(s.status, s.attempts) for s in done.steps] == [("completed", 1)] * 4
    assert world.ledger.list_tags(world.account.id, world.contact.id) == ["lembrado"]


def test_a_pending_execution_of_a_paused_automation_is_held_then_runs_once_resumed(
    world: World,
) -> None:
    row = world.automations.create(world.account.id, THANKS)
    world.order_paid()
    world.automations.store.fan_out(choose, 10)  # its execution is pending, then it is paused
    world.automations.update(world.account.id, row.id, {"status": "paused"})
    dispatcher = world.dispatcher()
    world.drain(dispatcher)

    held = _detail(world)
    assert world.whatsapp.requests == []
    assert (held.status, held.next_step, held.last_error, held.steps) == ("waiting", 0, HELD, ())

    world.automations.update(world.account.id, row.id, {"status": "active"})
    world.drain(dispatcher)

    done = _detail(world)
    assert done.status == "completed"
    assert len(world.whatsapp.bodies()) == 1
    assert [(s.status, s.attempts) for s in done.steps] == [("completed", 1)] * 2


def test_a_held_execution_runs_after_the_hold_even_if_its_resume_was_missed(
    world: World,
) -> None:
    """Resuming moves held executions up; one it missed (a worker held it on a view of the
    automation from before the resume) runs within `hold_interval` all the same."""
    row = world.automations.create(world.account.id, THANKS)
    world.order_paid()
    world.automations.update(world.account.id, row.id, {"status": "paused"})
    world.automations.store.fan_out(lambda e, c: [row.id], 10)  # made before the pause
    dispatcher = world.dispatcher(hold_interval=0.5)
    world.drain(dispatcher)
    assert _detail(world).last_error == HELD
    sql(world.url, "UPDATE automations SET status = 'active' WHERE id = ?", str(row.id))

    time.sleep(0.6)
    world.drain(dispatcher)

    assert _detail(world).status == "completed"
    assert len(world.whatsapp.bodies()) == 1


def test_racing_patches_of_different_fields_each_keep_the_others_change(world: World) -> None:
    """Two PATCHes of one automation at once, a rename and a pause (or a resume): both
    changes survive, every time. In the held rounds the first one's clock (read between
    its read of the row and its write) waits for the second to finish, at most 0.3 s: the
    second waits for the first's write instead, so it cannot have finished by then; a
    PATCH read before another committed and written after it would undo it."""
    row = world.automations.create(world.account.id, THANKS)
    second_done, first_read = threading.Event(), threading.Event()
    finished_under_hold: list[bool] = []

    def clock() -> datetime:
        if threading.current_thread().name == "first":
            first_read.set()
            finished_under_hold.append(second_done.wait(0.3))
        return utcnow()

    automations = Automations(Ledger(world.ledger.store, clock=clock))

    def patch(patch: dict[str, Any]) -> None:
        automations.update(world.account.id, row.id, patch)
        if threading.current_thread().name != "first":
            second_done.set()

    for n in range(30):
        rename, status = {"name": f"nome {n}"}, {"status": ("paused", "active")[n % 2]}
        held = n < 6
        first, second = (rename, status) if n % 2 else (status, rename)
        second_done.clear()
        first_read.clear()
        threads = [threading.Thread(target=patch, args=(first,), name="first" if held else "a"),
                   threading.Thread(target=patch, args=(second,), name="second")]  # fmt: skip
        threads[0].start()
        assert not held or first_read.wait(10)
        threads[1].start()
        for thread in threads:
            thread.join(10)

        stored = world.automations.store.get_automation(world.account.id, row.id)
        assert stored is not None
        assert (stored.name, stored.status) == (rename["name"], status["status"]), n
    assert finished_under_hold == [False] * 6


def test_a_step_running_when_its_automation_is_paused_finishes_and_the_next_waits(
    world: World,
) -> None:
    """The pause commits while step 0 (a webhook) is in flight: that step finishes and is
    recorded, the next one does not start until the automation is resumed."""
    with webhook_receiver() as (hook_url, hook):
        row = _hook_then_message(world, hook_url)
        pause = {"status": "paused"}
        hook.behaviour.before_answer = lambda body, n: world.automations.update(
            world.account.id, row.id, pause
        )
        world.order_paid()
        dispatcher = world.dispatcher()
        world.drain(dispatcher)

        held = _detail(world)
        assert world.whatsapp.requests == []
        assert (held.status, held.next_step, held.last_error) == ("waiting", 1, HELD)
        assert [(s.step_type, s.status) for s in held.steps] == [("webhook", "completed")]

        hook.behaviour.before_answer = None
        world.automations.update(world.account.id, row.id, {"status": "active"})
        world.drain(dispatcher)

    assert _detail(world).status == "completed"
    assert len(hook.requests) == 1
    assert _texts(world) == ["Oi!"]


@pytest.mark.parametrize(("change", "status", "reason"),
                         [("pause", "waiting", HELD), ("delete", "stopped", DELETED)])  # fmt: skip
def test_a_claim_racing_a_pause_or_delete_runs_no_step(
    world: World, change: str, status: str, reason: str
) -> None:
    """A worker claimed the execution, then the pause or delete committed: its first step
    does not start; the execution is held, or stopped."""
    claim = world.claim_thanks("worker-a", 30.0)
    automation = claim.automation.id
    if change == "pause":
        world.automations.update(world.account.id, automation, {"status": "paused"})
    else:
        assert world.automations.store.delete_automation(world.account.id, automation)
    world.dispatcher(worker_id="worker-a").run_claim(claim)

    after = _detail(world)
    assert world.whatsapp.requests == []
    assert (after.status, after.last_error, after.steps) == (status, reason, ())


def test_deleting_an_automation_stops_its_unfinished_executions_with_the_reason(
    world: World,
) -> None:
    """Deleted: its waiting and pending executions are stopped at once, saying why, and
    send nothing when they would have been due; its finished ones stay as they were."""
    row = world.automations.create(world.account.id, REMINDER)
    world.order_paid(source_id="1001")
    dispatcher = world.dispatcher()
    world.drain(dispatcher)  # 1001: first message sent, waiting
    world.order_paid(source_id="1002")
    world.automations.store.fan_out(choose, 10)  # 1002: pending

    assert world.automations.store.delete_automation(world.account.id, row.id)

    stopped = world.executions()
    assert [(x.status, x.last_error) for x in stopped] == [("stopped", DELETED)] * 2
    time.sleep(1.1)  # the wait is over
    world.drain(dispatcher)
    assert [(x.status, x.last_error) for x in world.executions()] == [("stopped", DELETED)] * 2
    assert _texts(world) == ["primeira"]
    assert world.ledger.list_tags(world.account.id, world.contact.id) == []


def test_a_step_running_when_its_automation_is_deleted_finishes_and_no_other_runs(
    world: World,
) -> None:
    with webhook_receiver() as (hook_url, hook):
        row = _hook_then_message(world, hook_url)
        hook.behaviour.before_answer = lambda body, n: world.automations.store.delete_automation(
            world.account.id, row.id
        )
        world.order_paid()
        world.drain(world.dispatcher())

    stopped = _detail(world)
    assert world.whatsapp.requests == []
    assert (stopped.status, stopped.last_error) == ("stopped", DELETED)
    [webhook] = stopped.steps  # recorded as it finished, with its result
    assert (webhook.status, webhook.result) == ("completed", {"status": 200})


def test_an_execution_the_delete_did_not_reach_ends_stopped_without_running(
    world: World,
) -> None:
    """An execution the delete's own transaction did not stop (made by a fan-out that read
    the automation before the delete, or locked by a worker at that instant) is stopped by
    the worker, whether it finds the automation deleted as it claims it or as the step
    starts."""
    claim = world.claim_thanks("worker-a", 30.0)
    world.order_paid(source_id="1002")
    world.automations.store.fan_out(choose, 10)
    sql(world.url, "UPDATE automations SET deleted_at = created_at WHERE id = ?",
        str(claim.automation.id))  # fmt: skip
    dispatcher = world.dispatcher(worker_id="worker-a")

    dispatcher.run_claim(claim)  # claimed before: finds it as step 0 starts
    world.drain(dispatcher)  # claims the other

    assert world.whatsapp.requests == []
    assert [(x.status, x.last_error) for x in world.executions()] == [("stopped", DELETED)] * 2


def test_a_stopping_worker_starts_no_step_and_gives_back_the_rest_at_once(world: World) -> None:
    """Told to stop while a webhook step runs: that step finishes and is recorded, the next
    one does not start, and the execution queued behind it for the one thread never starts
    either; both are released (claimed by no one, due now), not left to a lease that
    lasts ten minutes, so another worker goes on with them at once."""
    with webhook_receiver() as (hook_url, hook):
        _hook_then_message(world, hook_url)
        world.order_paid(source_id="1")
        world.order_paid(source_id="2")
        sending = threading.Event()
        hook.behaviour.before_answer = lambda body, n: sending.set()
        hook.behaviour.delay = 0.5
        worker = world.dispatcher(concurrency=1, lease=600, http_timeout=5.0, poll_interval=0.05)
        stop = threading.Event()
        thread = threading.Thread(target=worker.run, args=(stop,))
        thread.start()
        assert sending.wait(10)
        stop.set()
        thread.join(timeout=15)
        assert not thread.is_alive()
        worker.close()

        rows = sql(world.url, "SELECT status, next_step, claimed_by FROM executions "
                              "ORDER BY next_step DESC")  # fmt: skip
        assert rows == [("pending", 1, None), ("pending", 0, None)]
        steps = {e.next_step: [(s.step_type, s.status) for s in _steps(world, e.id)]
                 for e in world.executions()}  # fmt: skip
        assert steps == {1: [("webhook", "completed")], 0: []}
        assert len(hook.requests) == 1
        assert world.whatsapp.requests == []

        hook.behaviour.delay = 0
        world.drain(world.dispatcher(lease=600))  # no lease to wait for
        assert [e.status for e in world.executions()] == ["completed", "completed"]
        assert len(hook.requests) == 2  # each webhook once
        assert len(world.whatsapp.requests) == 2


def _steps(world: World, execution_id: uuid.UUID) -> Any:
    execution = world.automations.store.get_execution(world.account.id, execution_id)
    assert execution is not None
    return execution.steps


def test_an_unexpected_error_in_the_worker_loop_is_logged_and_the_worker_goes_on(
    world: World, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that fails a turn of the loop (here the fan-out, once) is logged with its
    traceback and counted; the worker tries again after a pause instead of ending, which,
    inside `sinal serve`, left automations stopped while /readyz said ready."""
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    dispatcher = world.dispatcher(poll_interval=0.05)
    fan_out = dispatcher.store.fan_out
    failures = iter([RuntimeError("a bug")])

    def flaky(*args: Any) -> Any:
        for exc in failures:
            raise exc
        return fan_out(*args)

    monkeypatch.setattr(dispatcher.store, "fan_out", flaky)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: world.executions() and world.executions()[0].status == "completed")
    finally:
        stop.set()
        thread.join(timeout=15)
        dispatcher.close()

    assert world.executions()[0].status == "completed"
    assert _counted(dispatcher, "sinal_worker_errors_total", kind="unexpected") == 1
    [record] = [r for r in caplog.records if "dispatch failed" in r.getMessage()]
    assert record.exc_info is not None


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_a_closed_postgres_store_stays_closed(world: World) -> None:
    """A worker thread still running after its process closed the store used to open a new
    pool, which nothing ever closed."""
    store = PostgresStore(world.url)
    assert store.get_account(world.account.id) is not None
    store.close()
    for _ in range(2):  # the first call after close made a new pool, the second used it
        with pytest.raises(StoreError, match="the PostgreSQL store is closed"):
            store.get_account(world.account.id)


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
def test_step_records_are_planned_for_the_table_as_it_is(world: World) -> None:
    """A step's start and finish (and the claim) are planned each time, on the size of
    `executions` then: a plan PostgreSQL kept from their first runs, on a table of a few
    rows, found the execution through `executions_contact` by account, and read every
    execution of the account at each step once it had grown (bench/README.md, Dispatch:
    one worker fell behind 1,000 events/s)."""
    world.automations.create(world.account.id, {
        "name": "ping", "trigger_metric": "Ping",
        "steps": [{"type": "filter", "conditions": [
            {"field": "source", "op": "eq", "value": "test"}]}],
    })  # fmt: skip
    store = PostgresStore(world.url, max_size=1)  # one connection: the one looked at below
    try:
        # psycopg prepares a statement on its 6th run; PostgreSQL then plans it for its
        # parameters 5 times before it may keep a generic plan
        for n in range(15):
            world.ledger.emit_event(account_id=world.account.id, contact_id=world.contact.id,
                                    metric_name="Ping", source="test",
                                    source_id=str(n))  # fmt: skip
            store.fan_out(choose, 10)
            [claim] = store.claim_executions("w", 10, 60)
            assert store.start_steps([StepStart(claim, 0, "filter")])[0] is not None
            done = StepFinish(claim, 0, "completed", then=Advance("completed", 1))
            assert store.finish_steps([done]) == [True]
        with store._conn() as conn:
            plans = conn.execute(
                "SELECT left(statement, 60), generic_plans, custom_plans "
                "FROM pg_prepared_statements WHERE statement ~ 'json_to_recordset|claimed AS'"
            ).fetchall()
    finally:
        store.close()
    assert len(plans) == 3, plans  # start, finish, claim: each prepared
    assert all(generic == 0 for _, generic, _ in plans), plans


# -- editing an automation with executions in flight ------------------------------------------

SEQUENCE = {
    "name": "sequência", "trigger_type": "order_paid",
    "steps": [{"type": "send_message", "text": "A"}, {"type": "wait", "seconds": 1},
              {"type": "send_message", "text": "B"}],
}  # fmt: skip
EDITED = [{"type": "send_message", "text": "X"}, {"type": "wait", "seconds": 1},
          {"type": "send_message", "text": "A"}, {"type": "send_message", "text": "B"}]  # fmt: skip


def test_an_execution_under_way_runs_the_steps_it_was_made_with_after_an_edit(
    world: World,
) -> None:
    """Steps are tracked by position: an execution waiting at step 2 when a step was put
    before it resumed on the new definition and sent A again. It runs the version it was
    made with; one made after the edit runs the new one."""
    row = world.automations.create(world.account.id, SEQUENCE)
    world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)
    assert (_detail(world).status, _texts(world)) == ("waiting", ["A"])

    world.automations.update(world.account.id, row.id, {"steps": EDITED})
    time.sleep(1.1)  # the wait is over
    world.drain(dispatcher)

    old = _detail(world)
    assert _texts(world) == ["A", "B"]
    assert (old.status, old.automation_version) == ("completed", 1)
    assert [(s.step_type, s.status) for s in old.steps] == [
        ("send_message", "completed"),
        ("wait", "completed"),
        ("send_message", "completed"),
    ]

    world.order_paid(source_id="1002")  # an execution made after the edit
    world.drain(dispatcher)
    time.sleep(1.1)
    world.drain(dispatcher)

    new, _ = world.executions()  # newest first
    assert (new.status, new.automation_version) == ("completed", 2)
    assert _texts(world) == ["A", "B", "X", "A", "B"]


def test_an_edit_that_leaves_the_steps_makes_no_version(world: World) -> None:
    row = world.automations.create(world.account.id, SEQUENCE)
    renamed = world.automations.update(world.account.id, row.id, {"name": "outro nome"})
    paused = world.automations.update(world.account.id, row.id, {"status": "paused"})

    assert renamed is not None
    assert paused is not None
    assert (renamed.version, paused.version) == (1, 1)
    assert count(world.url, "automation_versions") == 0


def test_pausing_and_deleting_act_on_an_edited_automations_earlier_executions_too(
    world: World,
) -> None:
    """Paused and deleted are the automation's, whatever the version its executions run."""
    row = world.automations.create(world.account.id, SEQUENCE)
    world.order_paid()
    dispatcher = world.dispatcher()
    world.drain(dispatcher)
    world.automations.update(world.account.id, row.id, {"steps": EDITED, "status": "paused"})
    time.sleep(1.1)
    world.drain(dispatcher)

    held = _detail(world)
    assert (held.status, held.last_error, _texts(world)) == ("waiting", HELD, ["A"])
    assert world.automations.store.delete_automation(world.account.id, row.id)
    world.drain(dispatcher)

    stopped = _detail(world)
    assert (stopped.status, stopped.last_error, _texts(world)) == ("stopped", DELETED, ["A"])


# -- a send's outcome: sent again only when it certainly did not leave ------------------------

UNDELIVERABLE = meta_error(
    131026, "Message undeliverable",
    "Unable to deliver the message. Reasons can include: the recipient phone number is not a "
    "WhatsApp phone number.",
)  # fmt: skip


@pytest.mark.parametrize(
    ("behaviour", "status", "requests", "said"),
    [
        # refused for now (Meta's rate limits, 429): nothing left; sent again, and it goes
        (
            {"fail_times": 1, "fail_status": 400,
             "fail_body": meta_error(130429, "Rate limit hit")},
            "completed", 2, None,
        ),
        (
            {"fail_times": 1, "fail_status": 400, "fail_body": meta_error(
                131056, "(Business Account, Consumer Account) pair rate limit hit")},
            "completed", 2, None,
        ),
        ({"fail_times": 1, "fail_status": 429}, "completed", 2, None),
        # refused for good: nothing left, and would not as configured; dead, with Meta's reason
        (
            {"status": 400, "refusal": UNDELIVERABLE}, "dead", 1,
            "refused the message (400, error 131026): (#131026) Message undeliverable: Unable "
            "to deliver the message.",
        ),
        (
            {"status": 401, "refusal": meta_error(190, "Access token has expired")}, "dead", 1,
            "refused the message (401, error 190): (#190) Access token has expired",
        ),
        (
            {"status": 400, "refusal": meta_error(131047, "Re-engagement message")}, "dead", 1,
            "(400, error 131047)",
        ),
        # may have left: unknown, never sent again (the next attempt would have gone through)
        (
            {"fail_times": 1, "fail_status": 500,
             "fail_body": meta_error(131000, "Something went wrong")},
            "unknown", 1, "answered 500, a server error: the request may or may not have been "
            'carried out: {"error": {"message": "(#131000) Something went wrong"',
        ),
        ({"fail_times": 1, "fail_status": 503}, "unknown", 1, "answered 503, a server error"),
        (
            {"fail_times": 1, "fail_status": 502, "fail_body": b"<html>Bad Gateway</html>"},
            "unknown", 1, "answered 502, a server error",
        ),
        ({"hang_up_times": 1}, "unknown", 1, "broke off"),
        ({"delay": 1.0}, "unknown", 1, "did not answer in time"),
    ],
    ids=[
        "rate-limit-130429", "pair-rate-limit-131056", "http-429", "undeliverable-131026",
        "token-expired-190", "re-engagement-131047", "500", "503", "502-html", "hang-up",
        "read-timeout",
    ],
)  # fmt: skip
def test_a_whatsapp_sends_outcome_settles_its_execution(
    world: World, behaviour: dict[str, Any], status: str, requests: int, said: str | None
) -> None:
    """Each outcome of a send to the Cloud API, from a real server: refused for now (sent
    again), refused for good (dead), or maybe sent (unknown, and never sent again: the
    Cloud API has no idempotency key, and a retry would send the contact a duplicate)."""
    for name, value in behaviour.items():
        setattr(world.whatsapp.behaviour, name, value)
    world.automations.create(world.account.id, THANKS)
    world.order_paid()

    execution = _until_settled(world, world.dispatcher())
    world.drain(world.dispatcher())  # later workers: nothing is due

    assert (execution.status, len(world.whatsapp.requests)) == (status, requests)
    detail = world.automations.store.get_execution(world.account.id, execution.id)
    assert detail is not None
    send = detail.steps[0]
    assert send.status == {"completed": "completed", "dead": "failed", "unknown": "unknown"}[status]
    assert send.attempts == requests
    if said is not None:
        assert said in (detail.last_error or ""), detail.last_error
        assert send.error == detail.last_error
    if status == "unknown":  # and says so
        assert (detail.last_error or "").endswith("so the contact gets no duplicate")
    sent = world.ledger.list_events(EventQuery(world.account.id, metric_name="Message Sent"))
    assert len(sent) == (1 if status == "completed" else 0)


def test_a_send_whose_connection_is_refused_goes_once_the_api_listens(world: World) -> None:
    """Refused at connect, the request never left: the step is tried again, and sent once."""
    port = free_port()
    _connect_whatsapp(world, api_base_url=f"http://127.0.0.1:{port}")
    world.automations.create(world.account.id, THANKS)
    world.order_paid()
    dispatcher = world.dispatcher()

    dispatcher.run_once()
    [execution] = world.executions()
    assert (execution.status, execution.attempts) == ("pending", 1)
    assert f"could not connect to 127.0.0.1:{port}" in (execution.last_error or "")

    with whatsapp_server(port) as (_url, meta):
        execution = _until_settled(world, dispatcher)
    assert execution.status == "completed"
    assert len(meta.requests) == 1


def test_a_send_whose_api_name_does_not_resolve_is_retried_never_unknown(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name the DNS does not know: nothing was sent, so it is a failed attempt, tried
    again until the attempts are spent, never "may have been sent"."""
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "graph.down.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    _connect_whatsapp(world, api_base_url="http://graph.down.example/v21.0")
    world.automations.create(world.account.id, THANKS)
    world.order_paid()

    execution = _until_settled(world, world.dispatcher())

    assert (execution.status, execution.attempts) == ("dead", 3)
    assert "could not connect to graph.down.example" in (execution.last_error or "")


@pytest.mark.parametrize(
    ("behaviour", "status", "requests"),
    [
        ({"fail_times": 1, "fail_status": 500}, "completed", 2),
        ({"fail_times": 1, "fail_status": 503}, "completed", 2),
        ({"hang_up_times": 1}, "completed", 2),
        ({"fail_times": 1, "fail_status": 429}, "completed", 2),
        ({"status": 400}, "dead", 1),
    ],
    ids=["500", "503", "hang-up", "429", "400"],
)
def test_a_webhooks_outcome_settles_its_execution_as_a_sends_would_but_resent_when_unsure(
    world: World, behaviour: dict[str, Any], status: str, requests: int
) -> None:
    """The same outcomes sorted the same way; what differs is the one a send stops at: a
    webhook that may have arrived is sent again, since its receiver dedupes on the
    Idempotency-Key, the same on every attempt."""
    with webhook_receiver() as (hook_url, hook):
        for name, value in behaviour.items():
            setattr(hook.behaviour, name, value)
        _hook(world, f"{hook_url}/hook")
        world.order_paid()
        execution = _until_settled(world, world.dispatcher())

    assert (execution.status, len(hook.requests)) == (status, requests)
    keys = {r["headers"]["Idempotency-Key"] for r in hook.requests}
    assert keys == {f"{execution.id}:0"}
