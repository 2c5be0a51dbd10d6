"""Abandoned carts under concurrency, both backends: an order's webhook, a checkout's update
and the workers' housekeeping pass racing for the same due checkout in threads of their own
(each with its own connection), against the real database. Whoever wins, a checkout is
abandoned once and recovered once, the recovery never dated before the abandonment, and no
cart automation is left to run for a customer who bought."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from sinal import Ledger, connect, webhooks
from sinal.automations.service import Automations
from sinal.commerce import _abandonment_of, commerce_store, derive_all_abandoned
from sinal.events import PreparedEvent
from sinal.store.automations import Advance, Claim, Integration, StepFinish, StepStart
from sinal.store.commerce import (
    STOPPED_BY_DISCONNECT,
    STOPPED_BY_RECOVERY,
    BuildCheckoutEvent,
    Checkout,
    CheckoutUpdate,
)
from sinal.store.erasure import erase_in
from sinal.store.postgres_erasure import _ERASE as ERASE
from sinal.store.postgres_erasure import LOCK_EVENTS, WRITE_EVENTS
from tests.contract.test_erasure import erased_around
from tests.helpers import sql, wait_until

pytestmark = pytest.mark.slow

SHOPIFY = Path(__file__).parent.parent / "fixtures" / "shopify"
CART = {
    "name": "Carrinho abandonado", "trigger_type": "cart_abandoned",
    "steps": [{"type": "wait", "seconds": 3600}, {"type": "add_tag", "tag": "lembrada"}],
}  # fmt: skip
DUE = datetime(2024, 5, 10, 18, 1, 47, tzinfo=UTC)  # the fixture checkout's update + 30 min
PLACED = "2024-05-10T15:40:00-03:00"  # 18:40 UTC: an order placed after the checkout was due
ROUNDS = 12
YAMPI_CART = "c8a2f1e0-93b4-4d7c-8e5a-0b1c2d3e4f50"  # the Yampi fixtures' cart token
postgres_only = pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
# What tells one round's checkout, order and buyer from another's in the fixtures' text.
_FIXED = {
    "b7f3c1a9e2d54b8f9a0c6e1d2f3a4b5c": "tok{:04d}",  # the checkout's token
    "Z2NwLXVzLWVhc3QxOjAxSFg3UTJNNkI0": "cart{:04d}",  # its cart's
    "5829371002921": "58293710{:05d}",  # the order's id
    "36741928370217": "367419283{:05d}",  # the checkout's id
    "7203918462249": "72039184{:05d}",  # the customer's id
    "ana.souza@exemplo.com.br": "ana{:04d}@exemplo.com.br",
    "+5511987654321": "+55119876{:05d}",
    "+55 11 98765-4321": "+55 11 9876{:05d}",
}


def body(name: str, n: int, **changes: str) -> bytes:
    """The Shopify fixture `name` as round `n`'s checkout, order and buyer send it."""
    text = (SHOPIFY / f"{name}.json").read_text()
    for fixed, per_round in _FIXED.items():
        text = text.replace(fixed, per_round.format(n))
    return json.dumps({**json.loads(text), **changes}).encode()


def token(n: int) -> str:
    """Round `n`'s checkout token."""
    return f"tok{n:04d}"


@pytest.fixture
def ledgers(database_url: str) -> Iterator[list[Ledger]]:
    """Three ledgers on the test's database, each with connections of its own."""
    with ExitStack() as stack:
        yield [stack.enter_context(connect(database_url)) for _ in range(3)]


@pytest.fixture
def shop(ledgers: list[Ledger]) -> Integration:
    """A Shopify store (checkouts abandoned 30 minutes after their last update) whose
    account has a cart automation: wait an hour, then tag."""
    account = ledgers[0].create_account("Loja")
    automations = Automations(ledgers[0])
    automations.create(account.id, CART)
    return automations.create_integration(
        account.id, {"kind": "shopify", "secret": "s", "abandon_after_minutes": 30}
    )


def deliver(ledger: Ledger, shop: Integration, topic: str, delivery: str, data: bytes) -> str:
    """Receive one Shopify delivery; its status."""
    received = webhooks.receive(
        ledger, shop, topic=topic, delivery_id=delivery, headers={}, body=data
    )
    assert received.status in ("processed", "duplicate"), received.reason
    return received.status


def delivering(
    shop: Integration, topic: str, delivery: str, data: bytes
) -> Callable[[Ledger], object]:
    """A call of `deliver` for `race`, on the ledger it is given."""
    return lambda ledger: deliver(ledger, shop, topic, delivery, data)


def race(ledgers: list[Ledger], *calls: Callable[[Ledger], object]) -> list[object]:
    """Run each call in a thread of its own, on a ledger of its own, released together."""
    start = threading.Barrier(len(calls))
    answers: list[object] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int, call: Callable[[Ledger], object]) -> None:
        try:
            start.wait()
            answers[i] = call(ledgers[i])
        except BaseException as exc:  # the test's thread re-raises it
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return answers


def a_pass(ledger: Ledger) -> int:
    """A worker's housekeeping pass, a day after the checkouts were due."""
    return derive_all_abandoned(ledger, DUE + timedelta(days=1))


def fan_out(ledger: Ledger) -> int:
    """A worker fanning the outbox out into executions, all of it."""
    store = Automations(ledger).store
    made = 0
    while (report := store.fan_out(lambda e, c: [a.id for a in c], 100)).events:
        made += report.executions
    return made


def cart_events(url: str, metric: str) -> dict[str, list[tuple[Any, ...]]]:
    """The `metric` events (Checkout Abandoned / Recovered) by checkout token: their id,
    occurred_at (as text, ISO) and properties."""
    rows = sql(url, "SELECT id, occurred_at, properties FROM events WHERE metric_name = ?", metric)
    found: dict[str, list[tuple[Any, ...]]] = {}
    for ident, at, properties in rows:
        props = json.loads(properties) if isinstance(properties, str) else properties
        when = at if isinstance(at, datetime) else datetime.fromisoformat(at)
        found.setdefault(props["checkout_token"], []).append((str(ident), when, props))
    return found


def assert_once_each(url: str, tokens: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """One Checkout Abandoned and one Checkout Recovered per token, the recovery not dated
    before the abandonment; the abandonments, by token."""
    abandoned = cart_events(url, "Checkout Abandoned")
    recovered = cart_events(url, "Checkout Recovered")
    assert sorted(abandoned) == sorted(recovered) == sorted(tokens)
    for t in tokens:
        [(_, abandoned_at, _)] = abandoned[t]
        [(_, recovered_at, _)] = recovered[t]
        assert recovered_at >= abandoned_at, t
    return abandoned


def assert_no_cart_message(url: str) -> None:
    """No Checkout Abandoned left in the outbox, and none of its executions left to run."""
    of_abandonments = "SELECT id FROM events WHERE metric_name = 'Checkout Abandoned'"
    assert sql(url, f"SELECT count(*) FROM outbox WHERE event_id IN ({of_abandonments})") == [(0,)]
    assert (
        sql(
            url,
            f"SELECT status, count(*) FROM executions WHERE event_id IN ({of_abandonments}) "
            "AND status <> 'stopped' GROUP BY status",
        )
        == []
    )


def orders_racing_passes(ledgers: list[Ledger], shop: Integration, **changes: str) -> None:
    """Round after round, a due checkout's order (the fixture's, with `changes`), a pass
    and a worker fanning the outbox out, released together; then the outbox fanned out."""
    for n in range(ROUNDS):
        deliver(ledgers[0], shop, "checkouts/update", f"checkout-{n}", body("checkouts_update", n))
        order = body("orders_create", n, **changes)
        race(ledgers, delivering(shop, "orders/create", f"o-{n}", order), a_pass, fan_out)
    fan_out(ledgers[0])


def test_an_order_and_a_pass_racing_for_a_due_checkout_abandon_and_recover_it_once(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """The order placed at 18:40, after its checkout was due (18:01:47): whether its webhook
    or a worker's pass records the abandonment, with a worker fanning the outbox out at the
    same moment, it is recorded once, recovered once at the order's time, and no cart
    automation runs (withdrawn, or its execution stopped)."""
    tokens = [token(n) for n in range(ROUNDS)]
    orders_racing_passes(ledgers, shop, created_at=PLACED)

    abandoned = assert_once_each(database_url, tokens)
    recovered = cart_events(database_url, "Checkout Recovered")
    for t in tokens:
        assert abandoned[t][0][1] == DUE
        assert recovered[t][0][1] == datetime(2024, 5, 10, 18, 40, tzinfo=UTC)
        assert recovered[t][0][2]["ordered_before_abandonment"] is False
    assert_no_cart_message(database_url)
    assert sql(database_url, "SELECT count(*) FROM checkouts WHERE recovered_at IS NULL") == [(0,)]


def test_an_order_placed_in_time_racing_a_pass_is_never_abandoned(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """The order placed at 17:32:10, before the checkout was due: a pass that won records an
    abandonment the order corrects (dated at it, `ordered_before_abandonment`); one that lost
    records none. Either way, no cart automation runs."""
    orders_racing_passes(ledgers, shop)

    abandoned = cart_events(database_url, "Checkout Abandoned")
    recovered = cart_events(database_url, "Checkout Recovered")
    assert sorted(abandoned) == sorted(recovered)
    for t, [(_, at, _)] in abandoned.items():
        [(_, recovered_at, properties)] = recovered[t]
        assert (recovered_at, properties["ordered_before_abandonment"]) == (at, True)
    assert_no_cart_message(database_url)


def test_an_update_after_the_due_time_and_a_pass_racing_abandon_the_checkout_once(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """The customer came back at 18:30 to a checkout due at 18:01:47: the update and a pass
    racing record one abandonment (dated when due), and the checkout is abandoned, not due
    again."""
    tokens = [token(n) for n in range(ROUNDS)]
    for n in range(ROUNDS):
        deliver(ledgers[0], shop, "checkouts/update", f"checkout-{n}", body("checkouts_update", n))
        back = body("checkouts_update", n, updated_at="2024-05-10T15:30:00-03:00")
        race(
            ledgers,
            delivering(shop, "checkouts/update", f"back-{n}", back),
            lambda led: derive_all_abandoned(led, DUE + timedelta(minutes=10)),
        )

    abandoned = cart_events(database_url, "Checkout Abandoned")
    assert sorted(abandoned) == tokens
    assert all(found[0][1] == DUE and len(found) == 1 for found in abandoned.values())
    assert sql(database_url, "SELECT count(*) FROM checkouts WHERE abandoned_at IS NULL") == [(0,)]


def test_deliveries_of_the_same_order_racing_abandon_and_recover_once(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """orders/create twice under one delivery id (Shopify's retry) and orders/paid, all at
    once, for an order placed after its checkout was due: one abandonment, one recovery."""
    tokens = [token(n) for n in range(ROUNDS)]
    for n in range(ROUNDS):
        deliver(ledgers[0], shop, "checkouts/update", f"checkout-{n}", body("checkouts_update", n))
        order = body("orders_create", n, created_at=PLACED)
        paid = body("orders_paid", n, created_at=PLACED, processed_at=PLACED,
                    updated_at="2024-05-10T15:41:00-03:00")  # fmt: skip
        race(
            ledgers,
            delivering(shop, "orders/create", f"o-{n}", order),
            delivering(shop, "orders/create", f"o-{n}", order),  # Shopify's retry
            delivering(shop, "orders/paid", f"p-{n}", paid),
        )

    fan_out(ledgers[0])
    abandoned = assert_once_each(database_url, tokens)
    assert all(found[0][2]["recorded_after_order"] is True for found in abandoned.values())
    assert_no_cart_message(database_url)
    assert a_pass(ledgers[0]) == 0


def abandoned_and_claimed(ledger: Ledger, shop: Integration) -> Claim:
    """Round 0's checkout abandoned by a pass, its cart automation's execution made and
    claimed by worker "w1"."""
    deliver(ledger, shop, "checkouts/update", "checkout-0", body("checkouts_update", 0))
    assert a_pass(ledger) == 1
    assert fan_out(ledger) == 1
    [claim] = Automations(ledger).store.claim_executions("w1", 10, 60.0)
    return claim


def test_a_step_running_as_the_order_stops_its_execution_is_recorded_and_none_follows(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """A worker runs the abandonment's first step (a wait) when the order, placed after the
    checkout was due, arrives: the step is recorded as it ended, the execution stays
    stopped (the worker's advance does not move it on), and no worker claims it again."""
    store = Automations(ledgers[0]).store
    claim = abandoned_and_claimed(ledgers[0], shop)
    started = store.start_step(claim, 0, "wait")
    assert isinstance(started, tuple)
    assert started[1]  # the step runs now

    order = body("orders_create", 0, created_at=PLACED)
    deliver(ledgers[1], shop, "orders/create", "o-0", order)
    held = store.finish_step(
        claim, 0, "completed", result={}, then=Advance("waiting", 1, run_at=DUE)
    )

    assert held  # recorded: the step did run
    execution = store.get_execution(claim.execution.account_id, claim.execution.id)
    assert execution is not None
    assert (execution.status, execution.last_error) == ("stopped", STOPPED_BY_RECOVERY)
    assert [(s.step_index, s.status) for s in execution.steps] == [(0, "completed")]
    assert store.claim_executions("w2", 10, 60.0) == []
    assert_once_each(database_url, [token(0)])


@postgres_only
def test_an_order_stopping_executions_as_a_worker_records_a_step_and_an_erasure_waits(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """PostgreSQL: the order's transaction (holding `events`) waits for the execution's row,
    which a worker recording its step holds; an erasure of the buyer then waits for `events`;
    the worker's record then needs `events` too. Every session reports a deadlock at once
    (`deadlock_timeout` 10 ms): there is none, and all three commit, the erasure last."""
    claim = abandoned_and_claimed(ledgers[0], shop)
    e = claim.execution
    order = body("orders_create", 0, created_at=PLACED)
    params = {"account": e.account_id, "contact": e.contact_id}
    done: list[object] = []
    with psycopg.connect(database_url) as worker:
        worker.execute("SET deadlock_timeout = '10ms'")
        worker.execute(
            "SELECT 1 FROM executions WHERE account_id = %s AND id = %s FOR UPDATE",
            (e.account_id, e.id),
        )
        buy = delivering(shop, "orders/create", "o-0", order)
        buyer = threading.Thread(target=lambda: done.append(buy(ledgers[1])))
        buyer.start()
        wait_until(lambda: waiting(database_url) == 1)
        assert waiting(database_url) == 1  # the order, for the execution's row

        def erase() -> None:
            with psycopg.connect(database_url) as eraser:
                eraser.execute("SET deadlock_timeout = '10ms'")
                eraser.execute(LOCK_EVENTS)
                done.append(erase_in(eraser, ERASE, params))

        eraser = threading.Thread(target=erase)
        eraser.start()
        wait_until(lambda: waiting(database_url) == 2)
        assert waiting(database_url) == 2  # and the erasure, for `events`
        worker.execute(WRITE_EVENTS)  # as the step's record does before it inserts its event
        worker.execute(
            "UPDATE executions SET status = 'waiting', next_step = 1, claimed_by = NULL, "
            "claimed_until = NULL WHERE account_id = %s AND id = %s",
            (e.account_id, e.id),
        )
    buyer.join()
    eraser.join()

    assert done == ["processed", True]
    assert sql(database_url, "SELECT count(*) FROM events WHERE contact_id = ?", e.contact_id) == [
        (0,)
    ]
    assert sql(database_url, "SELECT count(*) FROM executions") == [(0,)]
    assert sql(database_url, "SELECT contact_id FROM orders") == [(None,)]


@postgres_only
@pytest.mark.parametrize("record", ["start", "finish"])
def test_an_order_stopping_executions_a_worker_records_in_a_batch_does_not_deadlock(
    database_url: str, ledgers: list[Ledger], shop: Integration, record: str
) -> None:
    """PostgreSQL: a worker records steps of three executions in one statement (a batch of
    starts, or of finishes), two of them the abandonment's that an order then stops, listed
    in the reverse of the order a scan of the table finds them; another session holds the
    third, so that the order comes between the worker's first row and its last. The
    worker's session reports a deadlock at once (`deadlock_timeout` 10 ms): there is none,
    the order waits for the worker, and both commit, the abandonment's executions stopped
    with the worker's records kept."""
    Automations(ledgers[0]).create(shop.account_id, {**CART, "name": "Carrinho 2"})
    for n in range(2):  # the second checkout's executions made after (UUIDv7: later ids)
        deliver(ledgers[0], shop, "checkouts/update", f"checkout-{n}", body("checkouts_update", n))
        assert a_pass(ledgers[0]) == 1
        assert fan_out(ledgers[0]) == 2
    claims = {c.execution.id: c for c in Automations(ledgers[0]).store.claim_executions(
        "w1", 10, 60.0)}  # fmt: skip
    [abandonment] = cart_events(database_url, "Checkout Abandoned")[token(0)]
    scanned = [UUID(str(r[0])) for r in sql(
        database_url, "SELECT id FROM executions WHERE event_id = ? "
        "AND status IN ('pending', 'waiting')", abandonment[0])]  # fmt: skip
    other = min(i for i in claims if i not in scanned)
    batch = [claims[scanned[1]], claims[other], claims[scanned[0]]]
    buy = delivering(shop, "orders/create", "o-0", body("orders_create", 0, created_at=PLACED))

    done = batch_racing(database_url, batch, record, lambda: buy(ledgers[1]))

    assert done["racer"] == "processed"
    assert_batch_recorded(database_url, done["record"], batch, record)
    executions = {e.id: e for e in Automations(ledgers[0]).store.list_executions(shop.account_id)}
    for ident in scanned:
        assert (executions[ident].status, executions[ident].last_error) == (
            "stopped", STOPPED_BY_RECOVERY)  # fmt: skip
    assert executions[other].status == ("pending" if record == "start" else "waiting")


def batch_racing(
    database_url: str, batch: list[Claim], record: str, racer: Callable[[], object]
) -> dict[str, object]:
    """PostgreSQL: worker "w1" records step 0 of `batch` in one statement (`record`: a batch
    of starts; or of finishes, once they started), in a session that reports a deadlock at
    once (`deadlock_timeout` 10 ms), while another session holds the row of the batch's
    second execution; once the worker waits for it, `racer` runs in a thread and waits for
    a row the worker holds; then the holder commits. What the worker's statement and
    `racer` returned or raised ("record", "racer")."""
    sep = "&" if "?" in database_url else "?"
    done: dict[str, object] = {}
    quick = f"{database_url}{sep}options=-c%20deadlock_timeout%3D10ms"
    held = batch[1].execution
    with ExitStack() as stack:
        store = Automations(stack.enter_context(connect(quick))).store
        if record == "finish":
            assert all(isinstance(s, tuple) for s in store.start_steps(
                [StepStart(c, 0, "wait") for c in batch]))  # fmt: skip
        holder = stack.enter_context(psycopg.connect(database_url))
        holder.execute("SELECT 1 FROM executions WHERE account_id = %s AND id = %s FOR UPDATE",
                       (held.account_id, held.id))  # fmt: skip

        def run() -> object:
            if record == "start":
                return store.start_steps([StepStart(c, 0, "wait") for c in batch])
            then = Advance("waiting", 1, run_at=DUE)
            return store.finish_steps([StepFinish(c, 0, "completed", {}, then=then)
                                       for c in batch])  # fmt: skip

        threads = [threading.Thread(target=_outcome, args=(done, name, call))
                   for name, call in (("record", run), ("racer", racer))]  # fmt: skip
        threads[0].start()
        wait_until(lambda: waiting(database_url) == 1)  # for the held execution's row
        threads[1].start()
        wait_until(lambda: waiting(database_url) == 2)
        assert waiting(database_url) == 2  # the racer, for a row the worker holds
        holder.commit()
        for thread in threads:
            thread.join()
    return done


def assert_batch_recorded(
    database_url: str, recorded: object, batch: list[Claim], record: str
) -> None:
    """The worker's statement of `batch_racing` recorded every step of its batch."""
    if record == "start":
        assert isinstance(recorded, list)
        assert all(isinstance(s, tuple) and s[1] for s in recorded)
    else:
        assert recorded == [True, True, True]
    steps = sql(database_url, "SELECT execution_id, status FROM execution_steps")
    expected = "started" if record == "start" else "completed"
    assert sorted(str(i) for i, s in steps if s == expected) == sorted(
        str(c.execution.id) for c in batch)  # fmt: skip


def _outcome(done: dict[str, object], name: str, call: Callable[[], object]) -> None:
    """Keep what `call` returns, or the exception it raises, as `done[name]`."""
    try:
        done[name] = call()
    except Exception as exc:  # the test asserts on it
        done[name] = exc


def waiting(url: str) -> int:
    """How many sessions of the test's database wait for a lock."""
    query = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return int(sql(url, query)[0][0])


@postgres_only
def test_an_order_abandoning_and_recovering_a_checkout_as_its_buyer_is_erased_waits(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """PostgreSQL: an order placed after its checkout was due, delivered while an erasure of
    its buyer holds its first locks, waits for it without a deadlock (the erasure's session
    would report one at once); the checkout gone with the buyer, nothing is abandoned."""
    deliver(ledgers[0], shop, "checkouts/update", "checkout-0", body("checkouts_update", 0))
    [(contact_id,)] = sql(database_url, "SELECT contact_id FROM checkouts")
    ana = ledgers[0].get_contact(shop.account_id, str(contact_id))
    assert ana is not None
    order = body("orders_create", 0, created_at=PLACED)

    buy = delivering(shop, "orders/create", "o-0", order)
    status = erased_around(database_url, ana, lambda: buy(ledgers[1]))

    assert status == "processed"
    assert cart_events(database_url, "Checkout Abandoned") == {}
    assert cart_events(database_url, "Checkout Recovered") == {}
    assert sql(database_url, "SELECT count(*) FROM checkouts") == [(0,)]


@pytest.mark.parametrize("first", ["orders/create", "orders/paid"])
def test_an_order_placed_in_time_and_paid_after_the_due_time_abandons_nothing(
    database_url: str, ledgers: list[Ledger], shop: Integration, first: str
) -> None:
    """Placed at 17:32:10, before its checkout was due (18:01:47), paid at 18:30 (a PIX paid
    later): whichever of its two webhooks sinal processes first, the checkout was completed
    in time, never abandoned. orders/paid first, its payment time was taken for the order's:
    an abandonment and a recovery were recorded, or not, as the deliveries raced."""
    deliver(ledgers[0], shop, "checkouts/update", "checkout-0", body("checkouts_update", 0))
    sent = {
        "orders/create": body("orders_create", 0),
        "orders/paid": body("orders_paid", 0, updated_at="2024-05-10T15:30:00-03:00"),
    }
    second = "orders/paid" if first == "orders/create" else "orders/create"

    for topic in (first, second):
        deliver(ledgers[0], shop, topic, topic, sent[topic])

    assert cart_events(database_url, "Checkout Abandoned") == {}
    assert cart_events(database_url, "Checkout Recovered") == {}
    assert a_pass(ledgers[0]) == 0


def yampi(event: str, **changes: Any) -> bytes:
    """The Yampi fixture `event`, its payload's `changes` made."""
    payload = json.loads((SHOPIFY.parent / "yampi" / f"{event}.json").read_text())
    return json.dumps({**payload, **changes}).encode()


@pytest.mark.parametrize("first", ["order_created", "order_paid"])
def test_a_yampi_order_placed_before_its_reminder_is_dated_so_whichever_comes_first(
    database_url: str, ledgers: list[Ledger], first: str
) -> None:
    """Yampi reminded at 18:05:41 of a cart whose order was placed at 17:32:10 and paid at
    18:20: the reminder recorded first, the order's recovery says it was placed before the
    abandonment (dated at it), whether order.created or order.paid comes first. order.paid
    first, its payment time was taken for the order's: a recovery proper."""
    account = ledgers[0].create_account("Loja")
    shop = Automations(ledgers[0]).create_integration(account.id, {"kind": "yampi", "secret": "s"})
    sent = {"order_created": yampi("order_created"),
            "order_paid": yampi("order_paid", time="2024-05-10 15:20:00")}  # fmt: skip
    second = "order_paid" if first == "order_created" else "order_created"

    deliver(ledgers[0], shop, "", "reminder", yampi("cart_reminder"))
    for event in (first, second):
        deliver(ledgers[0], shop, "", event, sent[event])

    [(_, abandoned_at, _)] = cart_events(database_url, "Checkout Abandoned")[YAMPI_CART]
    [(_, recovered_at, properties)] = cart_events(database_url, "Checkout Recovered")[YAMPI_CART]
    assert abandoned_at == datetime(2024, 5, 10, 18, 5, 41, tzinfo=UTC)
    assert (recovered_at, properties["ordered_before_abandonment"]) == (abandoned_at, True)


def yampi_order(event: str, *, placed: str, time: str) -> bytes:
    """The Yampi order fixture `event`, for an order placed at `placed` (São Paulo time)
    whose webhook was sent at `time`."""
    payload = json.loads((SHOPIFY.parent / "yampi" / f"{event}.json").read_text())
    payload["time"] = time
    payload["resource"]["created_at"]["date"] = f"{placed}.000000"
    return json.dumps(payload).encode()


@pytest.mark.parametrize("first", ["order_created", "order_paid"])
def test_a_yampi_reminder_after_an_order_placed_after_it_abandons_then_recovers_the_cart(
    database_url: str, ledgers: list[Ledger], first: str
) -> None:
    """Yampi reminded at 18:05:41 of a cart whose order was placed at 18:40 and paid at
    18:45, and the order's webhook (order.created, or order.paid alone) came before the
    reminder's: the cart was abandoned, recorded with the order (no cart automation runs
    for a customer who bought), and recovered when the order was placed. Before, such a
    reminder recorded nothing: the count hung on which webhook came first."""
    account = ledgers[0].create_account("Loja")
    automations = Automations(ledgers[0])
    automations.create(account.id, CART)
    shop = automations.create_integration(account.id, {"kind": "yampi", "secret": "s"})
    placed = "2024-05-10 15:40:00"  # 18:40 UTC
    paid_at = "2024-05-10 15:45:00"
    sent = {"order_created": yampi_order("order_created", placed=placed, time=placed),
            "order_paid": yampi_order("order_paid", placed=placed, time=paid_at)}  # fmt: skip

    deliver(ledgers[0], shop, "", first, sent[first])
    deliver(ledgers[0], shop, "", "reminder", yampi("cart_reminder"))
    fan_out(ledgers[0])

    [(_, abandoned_at, abandoned)] = cart_events(database_url, "Checkout Abandoned")[YAMPI_CART]
    [(_, recovered_at, recovered)] = cart_events(database_url, "Checkout Recovered")[YAMPI_CART]
    assert (abandoned_at, abandoned["recorded_after_order"]) == (
        datetime(2024, 5, 10, 18, 5, 41, tzinfo=UTC), True,
    )  # fmt: skip
    assert recovered_at == datetime(2024, 5, 10, 18, 40, tzinfo=UTC)
    assert recovered["ordered_before_abandonment"] is False
    assert_no_cart_message(database_url)
    assert sql(database_url, "SELECT count(*) FROM executions") == [(0,)]


@postgres_only
def test_a_store_deleted_as_a_pass_abandons_its_checkout_waits_and_withdraws_it(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """PostgreSQL: the store is deleted while a worker's pass records one of its checkouts'
    abandonment (after the pass found the store connected, before it commits). The delete
    waits for the pass, then withdraws the abandonment from automations: no cart message.
    It did not wait: the abandonment, committed after it, fanned out to the automation."""
    deliver(ledgers[0], shop, "checkouts/update", "checkout-0", body("checkouts_update", 0))
    now = DUE + timedelta(days=1)
    carts = commerce_store(ledgers[1])

    deleted_while_abandoning(
        database_url, ledgers, shop,
        lambda build: carts.abandon_checkout(shop.account_id, shop.id, token(0), now, build),
    )  # fmt: skip


def deleted_while_abandoning(
    database_url: str,
    ledgers: list[Ledger],
    shop: Integration,
    write: Callable[[BuildCheckoutEvent], object],
) -> None:
    """PostgreSQL: `write(build)` runs in a thread, on `ledgers[1]`, until it builds round
    0's abandonment; the store is deleted then, on `ledgers[2]`, and the write is let go
    once the delete waits for it (or ended). Recorded once, its automation did not run."""
    build = _abandonment_of(ledgers[1])
    building, release = threading.Event(), threading.Event()

    def paused(checkout: Checkout) -> PreparedEvent | None:
        building.set()
        release.wait(10)
        return build(checkout)

    writing = threading.Thread(target=lambda: write(paused))
    writing.start()
    assert building.wait(10)
    store = Automations(ledgers[2]).store
    deleting = threading.Thread(target=lambda: store.delete_integration(shop.account_id, shop.id))
    deleting.start()
    wait_until(lambda: waiting(database_url) == 1 or not deleting.is_alive())
    release.set()
    writing.join()
    deleting.join()
    fan_out(ledgers[0])

    assert len(cart_events(database_url, "Checkout Abandoned")[token(0)]) == 1
    assert_no_cart_message(database_url)
    assert sql(database_url, "SELECT count(*) FROM executions") == [(0,)]


# The executions a store's delete stops (`DISCONNECT_EXECUTIONS_SQL`), in the order a scan
# of the table finds them.
_DISCONNECT_SCAN = (
    "SELECT x.id FROM executions x WHERE x.account_id = ? AND x.status IN ('pending', "
    "'waiting') AND EXISTS (SELECT 1 FROM events e WHERE e.account_id = x.account_id "
    "AND e.id = x.event_id AND e.integration_id = ? AND e.metric_name = 'Checkout Abandoned')"
)


@postgres_only
@pytest.mark.parametrize("record", ["start", "finish"])
def test_a_store_deleted_as_a_worker_records_its_executions_in_a_batch_does_not_deadlock(
    database_url: str, ledgers: list[Ledger], shop: Integration, record: str
) -> None:
    """PostgreSQL: a worker records steps of three executions in one statement: the first
    and last (by id) of the store's abandonments, and between them one of another store's,
    which another session holds, so the delete comes between the worker's first row and its
    last. A scan finds the store's last execution before its first (its row version is the
    newest). The worker's session reports a deadlock at once (`deadlock_timeout` 10 ms):
    there is none, the delete waits for the worker, and both commit, the store's executions
    stopped with the worker's records kept, the other store's going on."""
    automations = Automations(ledgers[0])
    automations.create(shop.account_id, {**CART, "name": "Carrinho 2"})
    other_shop = automations.create_integration(shop.account_id, {"kind": "yampi", "secret": "s"})
    carts = commerce_store(ledgers[0])
    for n in range(2):
        deliver(ledgers[0], shop, "checkouts/update", f"checkout-{n}", body("checkouts_update", n))
    cart = carts.get_checkout(shop.account_id, shop.id, token(1))
    assert cart is not None
    built = _abandonment_of(ledgers[0])(cart)  # by a pass that records it last
    now = DUE + timedelta(days=1)
    carts.abandon_checkout(shop.account_id, shop.id, token(0), now, _abandonment_of(ledgers[0]))
    assert fan_out(ledgers[0]) == 2
    deliver(ledgers[0], other_shop, "", "reminder", yampi("cart_reminder"))
    assert fan_out(ledgers[0]) == 2
    carts.abandon_checkout(shop.account_id, shop.id, token(1), now, lambda _: built)
    assert fan_out(ledgers[0]) == 2
    claims = {c.execution.id: c for c in automations.store.claim_executions("w1", 10, 60.0)}
    scanned = [UUID(str(r[0])) for r in sql(database_url, _DISCONNECT_SCAN, shop.account_id,
                                               shop.id)]  # fmt: skip
    first, last = min(scanned), max(scanned)
    other = min(i for i in claims if i not in scanned)
    assert first < other < last
    assert scanned.index(last) < scanned.index(first)  # its abandonment's id is the smaller
    batch = [claims[first], claims[other], claims[last]]
    delete = Automations(ledgers[1]).store.delete_integration

    done = batch_racing(database_url, batch, record, lambda: delete(shop.account_id, shop.id))

    assert done["racer"] is True
    assert_batch_recorded(database_url, done["record"], batch, record)
    executions = {e.id: e for e in automations.store.list_executions(shop.account_id)}
    for ident in scanned:
        assert (executions[ident].status, executions[ident].last_error) == (
            "stopped", STOPPED_BY_DISCONNECT)  # fmt: skip
    assert executions[other].status == ("pending" if record == "start" else "waiting")


@pytest.mark.parametrize("delivery", ["yampi-reminder", "shopify-lapsed"])
def test_a_delivery_whose_store_is_deleted_before_its_write_abandons_nothing(
    database_url: str, ledgers: list[Ledger], shop: Integration, delivery: str
) -> None:
    """A webhook found its store connected, then the store was deleted, then the webhook's
    write came (a Yampi cart.reminder, or a Shopify checkouts/update after its checkout was
    due): no cart automation runs for the disconnected store. Before, the abandonment the
    write recorded fanned out to the automation, the delete having withdrawn only the
    abandonments before it."""
    store = Automations(ledgers[0])
    if delivery == "yampi-reminder":
        found = store.create_integration(shop.account_id, {"kind": "yampi", "secret": "s"})
        topic, data = "", yampi("cart_reminder")
    else:
        found = shop
        deliver(ledgers[0], shop, "checkouts/update", "checkout-0", body("checkouts_update", 0))
        topic, data = "checkouts/update", body("checkouts_update", 0, updated_at=PLACED)

    assert store.store.delete_integration(found.account_id, found.id)
    deliver(ledgers[1], found, topic, "late", data)  # `found`: as the route read it
    fan_out(ledgers[0])

    assert_no_cart_message(database_url)
    assert sql(database_url, "SELECT count(*) FROM executions") == [(0,)]
    assert a_pass(ledgers[0]) == 0


@postgres_only
def test_a_store_deleted_as_a_checkout_update_abandons_its_checkout_waits_and_withdraws_it(
    database_url: str, ledgers: list[Ledger], shop: Integration
) -> None:
    """PostgreSQL: the store is deleted while a checkouts/update, come after its checkout
    was due, records the abandonment (after its transaction found the store connected,
    before it commits). The delete waits for the write, then withdraws the abandonment from
    automations: no cart message. It did not wait: the abandonment, committed after it,
    fanned out to the automation."""
    deliver(ledgers[0], shop, "checkouts/update", "checkout-0", body("checkouts_update", 0))
    carts = commerce_store(ledgers[1])
    current = carts.get_checkout(shop.account_id, shop.id, token(0))
    assert current is not None
    later = replace(_update_of(current), updated_at=DUE + timedelta(hours=1))

    deleted_while_abandoning(
        database_url, ledgers, shop, lambda build: carts.save_checkout(later, [], build)
    )


def _update_of(checkout: Checkout) -> CheckoutUpdate:
    """A Shopify update of `checkout` as it is stored (30 minutes to abandonment)."""
    c = checkout
    return CheckoutUpdate(
        account_id=c.account_id, integration_id=c.integration_id, provider=c.provider,
        token=c.token, contact_id=c.contact_id, recovery_url=c.recovery_url, total=c.total,
        currency=c.currency, details=c.details, updated_at=c.updated_at,
        abandon_after=timedelta(minutes=30),
    )  # fmt: skip
