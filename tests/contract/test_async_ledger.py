"""`AsyncLedger` on both backends: concurrent single events share transactions, a lone
caller waits for nothing but its own, every caller is answered after its commit, and
one instance serves any number of event loops."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

import sinal
from sinal import AsyncLedger, EmitEvent, EmitResult, InvalidEvent, Ledger
from tests.helpers import BAD_LIMITS, WatchedLedger, count, sql


@pytest.fixture
def contact(ledger: Ledger, account: sinal.Account) -> sinal.Contact:
    return ledger.create_contact(account.id, phone="+5511987654321")


def paid(account: sinal.Account, contact: sinal.Contact, n: int) -> EmitEvent:
    return EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                     source="shopify", entity_type="order", source_id=str(n), value=n)  # fmt: skip


def test_concurrent_callers_share_one_transaction(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    watched = WatchedLedger(ledger)
    aledger = AsyncLedger(watched)

    async def main() -> list[EmitResult]:
        return await asyncio.gather(*(aledger.emit(paid(account, contact, n)) for n in range(200)))

    results = asyncio.run(main())

    assert watched.sizes == [200]  # all arrived in one turn of the loop
    assert [r.status for r in results] == ["created"] * 200
    assert len({r.event_id for r in results}) == 200
    assert count(database_url, "events") == 200
    assert count(database_url, "outbox") == 200
    [summary] = ledger.get_summary(account.id, contact.id)
    assert (summary.event_count, summary.total_value) == (200, Decimal(sum(range(200))))


def test_a_lone_caller_gets_its_own_transaction_and_is_answered_after_it_commits(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    watched = WatchedLedger(ledger)
    aledger = AsyncLedger(watched)
    seen: list[int] = []

    async def main() -> None:
        for n in range(5):
            result = await aledger.emit_event(
                account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                source="shopify", source_id=str(n),
            )  # fmt: skip
            assert result.status == "created"
            seen.append(count(database_url, "events"))  # another connection sees it

    asyncio.run(main())

    assert watched.sizes == [1, 1, 1, 1, 1]
    assert seen == [1, 2, 3, 4, 5]


def test_callers_arriving_while_transactions_are_in_flight_go_in_the_next(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    watched = WatchedLedger(ledger, hold=True)
    aledger = AsyncLedger(watched, max_inflight=1)

    async def main() -> list[EmitResult]:
        first = asyncio.create_task(aledger.emit(paid(account, contact, 0)))
        # the first transaction has started, and hangs
        assert await asyncio.to_thread(watched.started.wait, 10), "no transaction started"
        later = []
        for wave in range(3):  # over many turns of the loop
            later += [asyncio.create_task(aledger.emit(paid(account, contact, 1 + wave * 10 + n)))
                      for n in range(10)]  # fmt: skip
            await asyncio.sleep(0.01)
        assert watched.sizes == [1]
        watched.release.set()
        return [await first, *[await task for task in later]]

    results = asyncio.run(main())

    assert watched.sizes == [1, 30]
    assert [r.status for r in results] == ["created"] * 31
    assert count(database_url, "events") == 31


def test_with_max_delay_callers_of_separate_turns_share_a_transaction(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    watched = WatchedLedger(ledger)
    aledger = AsyncLedger(watched, max_delay=0.2)

    async def main() -> list[EmitResult]:
        tasks = []
        for n in range(5):  # one caller per turn of the loop
            tasks.append(asyncio.create_task(aledger.emit(paid(account, contact, n))))
            await asyncio.sleep(0.001)
        return [await task for task in tasks]

    results = asyncio.run(main())

    assert watched.sizes == [5]
    assert [r.status for r in results] == ["created"] * 5
    assert count(database_url, "events") == 5


def test_a_shared_transaction_never_exceeds_max_batch(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    watched = WatchedLedger(ledger)
    aledger = AsyncLedger(watched, max_batch=7, max_inflight=2)

    async def main() -> list[EmitResult]:
        return await asyncio.gather(*(aledger.emit(paid(account, contact, n)) for n in range(50)))

    results = asyncio.run(main())

    assert sum(watched.sizes) == 50
    assert max(watched.sizes) == 7
    assert [r.status for r in results] == ["created"] * 50
    assert count(database_url, "events") == 50


def test_a_malformed_event_fails_alone_and_others_in_its_turn_are_stored(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    aledger = AsyncLedger(ledger)
    bad = replace(paid(account, contact, 1), metric_name="")

    async def main() -> tuple[EmitResult | BaseException, ...]:
        return await asyncio.gather(
            aledger.emit(paid(account, contact, 0)),
            aledger.emit(bad),
            aledger.emit(paid(account, contact, 2)),
            return_exceptions=True,
        )

    first, error, last = asyncio.run(main())

    assert isinstance(error, InvalidEvent)
    assert [e.field for e in error.errors] == ["metric_name"]
    assert isinstance(first, EmitResult)
    assert isinstance(last, EmitResult)
    assert (first.status, last.status) == ("created", "created")
    assert count(database_url, "events") == 2


def test_a_failed_shared_transaction_fails_every_caller_in_it_and_stores_nothing(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    aledger = AsyncLedger(ledger)
    cascade = "" if database_url.startswith("sqlite") else " CASCADE"
    sql(database_url, f"DROP TABLE outbox{cascade}")  # the transaction cannot commit now

    async def main() -> list[EmitResult | BaseException]:
        return await asyncio.gather(
            *(aledger.emit(paid(account, contact, n)) for n in range(3)), return_exceptions=True
        )

    outcomes = asyncio.run(main())

    assert all(isinstance(o, sinal.StoreError) for o in outcomes), outcomes
    assert count(database_url, "events") == 0


def test_one_async_ledger_serves_loops_one_after_another_and_in_threads_at_once(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    aledger = AsyncLedger(ledger)

    async def emit(first: int, n: int) -> list[EmitResult]:
        return await asyncio.gather(
            *(aledger.emit(paid(account, contact, first + i)) for i in range(n))
        )

    assert [r.status for r in asyncio.run(emit(0, 10))] == ["created"] * 10
    assert [r.status for r in asyncio.run(emit(0, 10))] == ["duplicate"] * 10  # a new loop

    answers: list[list[EmitResult]] = []
    threads = [
        threading.Thread(target=lambda k=k: answers.append(asyncio.run(emit(100 * (k + 1), 25))))
        for k in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(r.status for answer in answers for r in answer) == ["created"] * 100
    assert count(database_url, "events") == 110


def test_drain_commits_the_events_of_cancelled_callers(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    aledger = AsyncLedger(ledger)

    async def main() -> None:
        caller = asyncio.create_task(aledger.emit(paid(account, contact, 0)))
        await asyncio.sleep(0)  # the event is handed over; its transaction not started
        caller.cancel()
        await aledger.drain()
        assert caller.cancelled()

    asyncio.run(main())

    assert count(database_url, "events") == 1


@pytest.mark.parametrize(("settings", "message"), BAD_LIMITS)
def test_bad_settings_are_refused(ledger: Ledger, settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AsyncLedger(ledger, **settings)
