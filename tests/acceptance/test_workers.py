"""Workers as real processes on PostgreSQL: many at once, killed with -9, database restarts."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import sinal
from sinal import EmitEvent, Ledger, connect
from sinal.automations.service import Automations
from sinal.errors import StoreError
from tests.helpers import count, free_port, sql
from tests.servers import Recorder, webhook_receiver, whatsapp_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


class Workers:
    """`sinal worker` processes on one database."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []

    def start(self, n: int = 1, **env: str) -> list[subprocess.Popen[bytes]]:
        started = []
        for _ in range(n):
            environ = {
                **os.environ,
                "SINAL_DATABASE_URL": self.url,
                "SINAL_ALLOW_PRIVATE_WEBHOOKS": "true",
                "SINAL_WORKER_POLL_INTERVAL": "0.2",
                "SINAL_RETRY_BASE": "0.05",
                "SINAL_FAILPOINT_DIR": str(self.tmp),
                **env,
            }
            log = (self.tmp / f"worker-{len(self.procs)}.log").open("wb")
            self.logs.append(log)
            proc = subprocess.Popen(
                [sys.executable, "-m", "sinal", "worker"], env=environ, stdout=log, stderr=log
            )
            self.procs.append(proc)
            started.append(proc)
        return started

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


@pytest.fixture
def workers(pg_url: str, tmp_path: Path) -> Iterator[Workers]:
    pool = Workers(pg_url, tmp_path)
    yield pool
    pool.stop_all()


@pytest.fixture
def shop(pg_url: str) -> Iterator[tuple[Ledger, Automations, sinal.Account, Recorder]]:
    with connect(pg_url) as ledger, whatsapp_server() as (wa_url, recorder):
        account, automations = _open_shop(ledger, wa_url)
        yield ledger, automations, account, recorder


def _open_shop(ledger: Ledger, wa_url: str) -> tuple[sinal.Account, Automations]:
    """An account whose WhatsApp integration sends to `wa_url`."""
    account = ledger.create_account("Loja")
    automations = Automations(ledger)
    automations.create_integration(account.id, {
        "kind": "whatsapp", "secret": "s", "phone_number_id": "555",
        "access_token": "t", "api_base_url": wa_url,
    })  # fmt: skip
    return account, automations


def wait_for(condition: Callable[[], bool], timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def settled(url: str) -> bool:
    """Nothing in the outbox and no execution left to run, seen in one snapshot: a fan-out
    moves an event from the outbox to a pending execution in one transaction, and two
    statements (the executions read before the outbox) could see it in neither."""
    [(waiting,)] = sql(
        url,
        "SELECT (SELECT count(*) FROM outbox) + (SELECT count(*) FROM executions "
        "WHERE status IN ('pending', 'waiting'))",
    )
    return bool(waiting == 0)


def message(text: str) -> dict[str, Any]:
    return {"type": "send_message", "text": text}


def test_four_workers_run_every_matching_automation_exactly_once(
    pg_url: str, workers: Workers, shop: tuple[Ledger, Automations, sinal.Account, Recorder]
) -> None:
    ledger, automations, account, wa = shop
    contacts = [
        ledger.create_contact(account.id, phone=f"+55 11 9{7000_0000 + i:08d}") for i in range(20)
    ]
    automations.create(account.id, {
        "name": "big orders", "trigger_metric": "Order Paid",
        "filters": [{"field": "value", "op": "gte", "value": 500}],
        "steps": [message("A1 {{ event.id }}")],
    })  # fmt: skip
    automations.create(account.id, {
        "name": "pix", "trigger_metric": "Order Paid",
        "filters": [{"field": "properties.payment", "op": "eq", "value": "pix"}],
        "steps": [message("A2 {{ event.id }}"), {"type": "add_tag", "tag": "pix"}],
    })  # fmt: skip
    automations.create(account.id, {
        "name": "hello", "trigger_type": "message_received",
        "filters": [{"field": "properties.text", "op": "contains", "value": "oi"}],
        "steps": [message("A3 {{ event.id }}")],
    })  # fmt: skip
    rng = random.Random(7)
    batch: list[EmitEvent] = []
    workers.start(4)
    for i in range(10_000):
        contact = contacts[rng.randrange(20)]
        if rng.random() < 0.6:
            payment = rng.choice(["pix", "card", "boleto"])
            batch.append(EmitEvent(account_id=account.id, contact_id=contact.id,
                                   metric_name="Order Paid", source="shop", source_id=str(i),
                                   value=Decimal(rng.randrange(1, 1000)),
                                   properties={"payment": payment}))  # fmt: skip
        else:
            text = rng.choice(["oi, tudo bem?", "qual o prazo?", "Oi!"])
            batch.append(EmitEvent(account_id=account.id, contact_id=contact.id,
                                   metric_name="Message Received", source="whatsapp",
                                   source_id=str(i), properties={"text": text}))  # fmt: skip
        if len(batch) == 500:
            assert {r.status for r in ledger.emit_many(batch)} == {"created"}
            batch = []

    wait_for(lambda: settled(pg_url), timeout=300, what="all executions to settle")

    runs = sql(
        pg_url,
        "SELECT a.name, e.event_id FROM executions e "
        "JOIN automations a ON a.account_id = e.account_id AND a.id = e.automation_id",
    )
    prefixes = {"big orders": "A1", "pix": "A2", "hello": "A3"}
    expected_texts = sorted(f"{prefixes[name]} {event_id}" for name, event_id in runs)
    sent = sorted(body["text"]["body"] for body in wa.bodies("/555/messages"))
    assert sent == expected_texts  # every execution sent once, none twice
    orders = sql(pg_url, "SELECT value, properties->>'payment' FROM events "
                 "WHERE metric_name = 'Order Paid' AND source = 'shop'")  # fmt: skip
    greetings = sql(pg_url, "SELECT properties->>'text' FROM events "
                    "WHERE metric_name = 'Message Received'")  # fmt: skip
    assert len(runs) == (
        sum(value >= 500 for value, _ in orders)
        + sum(payment == "pix" for _, payment in orders)
        + sum("oi" in text.lower() for (text,) in greetings)
    )
    done = sql(pg_url, "SELECT count(*) FROM executions WHERE status = 'completed'")
    assert done[0][0] == len(runs)


def _one_order(ledger: Ledger, account: sinal.Account, phone: str) -> None:
    contact = ledger.create_contact(account.id, phone=phone)
    result = ledger.emit_event(account_id=account.id, contact_id=contact.id,
                               metric_name="Order Paid", source="shop", source_id="1",
                               value=Decimal(900))  # fmt: skip
    assert result.status == "created"


def test_worker_killed_after_claiming_loses_nothing(
    pg_url: str, workers: Workers, tmp_path: Path,
    shop: tuple[Ledger, Automations, sinal.Account, Recorder],
) -> None:  # fmt: skip
    ledger, automations, account, wa = shop
    automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                     "steps": [message("obrigado")]})  # fmt: skip
    [doomed] = workers.start(1, SINAL_FAILPOINTS="after_claim", SINAL_WORKER_LEASE="2")
    _one_order(ledger, account, "+5511990000001")
    wait_for((tmp_path / "after_claim").exists, what="the worker to claim")
    workers.kill(doomed)

    workers.start(1, SINAL_WORKER_LEASE="2")
    wait_for(lambda: settled(pg_url), what="the execution to complete")

    assert len(wa.bodies()) == 1
    assert sql(pg_url, "SELECT status FROM executions") == [("completed",)]


def test_worker_killed_inside_a_send_never_sends_twice(
    pg_url: str, workers: Workers, shop: tuple[Ledger, Automations, sinal.Account, Recorder]
) -> None:
    ledger, automations, account, wa = shop
    automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                     "steps": [message("obrigado")]})  # fmt: skip
    wa.behaviour.delay = 5.0  # the send is in flight when the worker dies
    [doomed] = workers.start(1, SINAL_WORKER_LEASE="2")
    _one_order(ledger, account, "+5511990000002")
    wait_for(lambda: len(wa.requests) == 1, what="the send to leave")
    workers.kill(doomed)

    wa.behaviour.delay = 0
    workers.start(1, SINAL_WORKER_LEASE="2")
    wait_for(lambda: settled(pg_url), what="the execution to settle")

    assert len(wa.requests) == 1
    [(status, error)] = sql(pg_url, "SELECT status, last_error FROM executions")
    assert status == "unknown"
    assert "may or may not have been sent" in error


def test_steps_slower_than_the_lease_are_never_taken_over(
    pg_url: str, workers: Workers, shop: tuple[Ledger, Automations, sinal.Account, Recorder]
) -> None:
    # Two workers with a 1 s lease; a webhook and a send that each take 3 s. Before leases
    # were renewed, the idle worker took the execution over mid-step: it sent the webhook
    # again on every takeover (an idempotent step), then found the send started and called
    # it unknown.
    ledger, automations, account, wa = shop
    with webhook_receiver() as (hook_url, hooks):
        hooks.behaviour.delay = wa.behaviour.delay = 3.0
        automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                         "steps": [{"type": "webhook", "url": hook_url},
                                                   message("obrigado")]})  # fmt: skip
        workers.start(2, SINAL_WORKER_LEASE="1")
        _one_order(ledger, account, "+5511990000004")
        wait_for(lambda: settled(pg_url), what="the execution to complete")

    assert len(hooks.requests) == 1
    assert len(wa.requests) == 1
    assert sql(pg_url, "SELECT status FROM executions") == [("completed",)]
    workers.stop_all()
    logs = b"".join((workers.tmp / f"worker-{i}.log").read_bytes() for i in range(2))
    assert b"lost the claim" not in logs


def test_a_worker_serves_its_metrics(
    pg_url: str, workers: Workers, shop: tuple[Ledger, Automations, sinal.Account, Recorder]
) -> None:
    ledger, automations, account, wa = shop
    automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                     "steps": [message("obrigado")]})  # fmt: skip
    port = free_port()
    workers.start(1, SINAL_WORKER_METRICS_PORT=str(port))
    _one_order(ledger, account, "+5511990000006")
    wait_for(lambda: settled(pg_url), what="the execution to complete")

    def scrape() -> dict[str, float]:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        except httpx.TransportError:  # not listening yet
            return {}
        samples = (line.rpartition(" ") for line in text.splitlines() if line[:1] != "#")
        return {name: float(value) for name, _, value in samples}

    step = 'sinal_worker_steps_total{status="completed",type="send_message"}'
    wait_for(lambda: scrape().get(step) == 1, timeout=30, what="the step to be counted")
    figures = scrape()
    assert figures["sinal_worker_events_fanned_out_total"] == 1
    assert figures['sinal_worker_executions_settled_total{status="completed"}'] == 1
    assert figures["sinal_worker_executions_in_hand"] == 0
    assert (figures["sinal_outbox_rows"], figures["sinal_executions_due"]) == (0, 0)
    assert len(wa.requests) == 1


def test_a_worker_started_before_its_database_exists_works_once_it_does(
    pg_template: str, tmp_path: Path
) -> None:
    from tests.conftest import PG_URL

    name = f"sinal_late_{os.getpid()}"
    url = PG_URL.rsplit("/", 1)[0] + "/" + name
    pool = Workers(url, tmp_path)
    try:
        pool.start(1)
        log = tmp_path / "worker-0.log"
        wait_for(lambda: b"cannot connect to PostgreSQL" in log.read_bytes(), timeout=30,
                 what="the worker to say it cannot connect")  # fmt: skip
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        with connect(url) as ledger, whatsapp_server() as (wa_url, wa):
            account, automations = _open_shop(ledger, wa_url)
            automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                             "steps": [message("obrigado")]})  # fmt: skip
            _one_order(ledger, account, "+5511990000007")
            wait_for(lambda: settled(url), what="the execution to complete")

            assert len(wa.requests) == 1
        assert pool.procs[0].poll() is None  # it waited, and works
    finally:
        pool.stop_all()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_worker_killed_between_steps_resumes_without_repeating(
    pg_url: str, workers: Workers, tmp_path: Path,
    shop: tuple[Ledger, Automations, sinal.Account, Recorder],
) -> None:  # fmt: skip
    ledger, automations, account, wa = shop
    automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                     "steps": [message("obrigado"),
                                               {"type": "add_tag", "tag": "cliente"}]})  # fmt: skip
    [doomed] = workers.start(1, SINAL_FAILPOINTS="after_step", SINAL_WORKER_LEASE="2")
    _one_order(ledger, account, "+5511990000003")
    wait_for((tmp_path / "after_step").exists, what="the first step to complete")
    workers.kill(doomed)

    workers.start(1, SINAL_WORKER_LEASE="2")
    wait_for(lambda: settled(pg_url), what="the execution to complete")

    assert len(wa.bodies()) == 1
    assert sql(pg_url, "SELECT status FROM executions") == [("completed",)]
    assert sql(pg_url, "SELECT tag FROM contact_tags") == [("cliente",)]
    assert count(pg_url, "events") == 3  # the order, Message Sent, Tag Added


def _restart_postgres() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip


def _emit_retrying(ledger: Ledger, events: list[EmitEvent]) -> None:
    for _ in range(60):
        try:
            ledger.emit_many(events)
            return
        except StoreError:
            time.sleep(0.5)  # the server is coming back; same source ids: a retry is safe
    raise AssertionError("PostgreSQL did not come back")


@pytest.mark.skipif(not Path("/etc/postgresql").exists(), reason="needs a local PostgreSQL")
def test_workers_reconnect_after_postgresql_restarts(
    pg_url: str, workers: Workers, shop: tuple[Ledger, Automations, sinal.Account, Recorder]
) -> None:
    ledger, automations, account, wa = shop
    contact = ledger.create_contact(account.id, phone="+5511990000004")
    automations.create(account.id, {"name": "a", "trigger_metric": "Order Paid",
                                     "steps": [message("{{ event.properties.n }}")]})  # fmt: skip

    def orders(start: int) -> list[EmitEvent]:
        return [EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                          source="shop", source_id=str(n), properties={"n": n})
                for n in range(start, start + 300)]  # fmt: skip

    workers.start(2)
    _emit_retrying(ledger, orders(0))
    _restart_postgres()
    _emit_retrying(ledger, orders(300))

    wait_for(lambda: _settled_retrying(pg_url), timeout=180, what="workers to finish")
    sent = sorted(int(body["text"]["body"]) for body in wa.bodies())
    assert sent == list(range(600))


def _settled_retrying(url: str) -> bool:
    try:
        return settled(url)
    except Exception:  # the server may still be starting
        return False
