"""Group commit on both backends: every caller answered after its transaction committed,
with its own result; batches grow while the transactions in flight are busy."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

import sinal
from sinal import EmitEvent, EmitResult, InvalidEvent, Ledger
from sinal.group_commit import GroupCommitter
from sinal.ids import new_id
from tests.helpers import BAD_LIMITS, WatchedLedger, count, fail_recording, sql

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def paid(account: sinal.Account, contact: sinal.Contact, n: int) -> EmitEvent:
    return EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                     source="shopify", entity_type="order", source_id=str(n))  # fmt: skip


async def test_while_the_slot_is_busy_arrivals_wait_and_go_in_one_transaction(
    ledger: Ledger, account: sinal.Account, database_url: str
) -> None:
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    watched = WatchedLedger(ledger, hold=True)
    committer = GroupCommitter(watched, max_delay=0.001, max_inflight=1)

    first = asyncio.create_task(committer.emit(paid(account, contact, 0)))
    # the first transaction has started, and hangs
    assert await asyncio.to_thread(watched.started.wait, 10), "no transaction started"
    later = []
    for wave in range(4):  # arrivals over many timer periods
        later += [asyncio.create_task(committer.emit(paid(account, contact, 1 + wave * 10 + n)))
                  for n in range(10)]  # fmt: skip
        await asyncio.sleep(0.01)
    assert watched.sizes == [1]  # nothing else started meanwhile
    assert not first.done()
    watched.release.set()

    results = [await first, *[await task for task in later]]
    assert watched.sizes == [1, 40]
    assert [r.status for r in results] == ["created"] * 41
    assert len({r.event_id for r in results}) == 41
    assert count(database_url, "events") == 41
    await committer.drain()


async def test_a_batch_never_exceeds_max_batch(
    ledger: Ledger, account: sinal.Account, database_url: str
) -> None:
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    watched = WatchedLedger(ledger)
    committer = GroupCommitter(watched, max_batch=7, max_delay=0.001, max_inflight=2)

    results = await asyncio.gather(*(committer.emit(paid(account, contact, n)) for n in range(50)))

    assert sum(watched.sizes) == 50
    assert max(watched.sizes) <= 7
    assert [r.status for r in results] == ["created"] * 50
    assert count(database_url, "events") == 50


async def test_each_caller_gets_its_own_answer_in_a_shared_transaction(
    ledger: Ledger, account: sinal.Account
) -> None:
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    committer = GroupCommitter(ledger, max_delay=0.01)
    other = EmitEvent(account_id=account.id, contact_id=new_id(),
                      metric_name="Order Paid", source="shopify")  # fmt: skip

    created, again, unknown = await asyncio.gather(
        committer.emit(paid(account, contact, 1)),
        committer.emit(paid(account, contact, 1)),
        committer.emit(other),
    )

    assert created.status == "created"
    assert (again.status, again.event_id) == ("duplicate", created.event_id)
    assert (unknown.status, unknown.reason) == ("rejected", "contact_not_found")
    with pytest.raises(InvalidEvent):  # at once, alone, before any queue
        await committer.emit(replace(paid(account, contact, 2), metric_name=""))


async def test_a_failed_transaction_fails_every_caller_in_it(
    ledger: Ledger, account: sinal.Account, database_url: str
) -> None:
    """At once, without splitting it: a table missing is no one event's fault, and halves
    down to single events were 2N-1 failing transactions."""
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    watched = WatchedLedger(ledger)
    committer = GroupCommitter(watched, max_delay=0.05)
    cascade = "" if database_url.startswith("sqlite") else " CASCADE"
    sql(database_url, f"DROP TABLE outbox{cascade}")  # the transaction cannot commit now

    outcomes = await asyncio.gather(
        *(committer.emit(paid(account, contact, n)) for n in range(8)), return_exceptions=True
    )

    assert all(isinstance(o, sinal.SchemaViolation) for o in outcomes), outcomes
    assert watched.sizes == [8]  # one transaction, not tried again in halves
    assert count(database_url, "events") == 0  # and nothing of it was written


# A refusal no validation foresaw (a value, a text, a constraint): the database refuses
# any statement that inserts an event with source_id "13".
_REFUSE_13 = {
    "sqlite": "CREATE TRIGGER refuse_13 BEFORE INSERT ON events WHEN NEW.source_id = '13' "
              "BEGIN SELECT RAISE(ABORT, 'refused'); END",
    "postgres": "ALTER TABLE events ADD CONSTRAINT refuse_13 CHECK (source_id <> '13')",
}  # fmt: skip


async def test_an_event_the_database_refuses_is_rejected_alone(
    ledger: Ledger, account: sinal.Account, database_url: str
) -> None:
    """Its caller gets it rejected, reason "refused"; the others sharing its transaction
    are stored and answered as if it were not there, in that one transaction (the store
    records a refused batch again in parts)."""
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    sql(database_url, _REFUSE_13["sqlite" if database_url.startswith("sqlite") else "postgres"])
    watched = WatchedLedger(ledger)
    committer = GroupCommitter(watched, max_delay=0.05)

    answers = await asyncio.gather(
        *(committer.emit(paid(account, contact, n)) for n in range(20)),
        committer.emit(paid(account, contact, 5)),  # a repeat, in the other half
    )

    assert watched.sizes == [21]
    refused = answers.pop(13)
    assert (refused.status, refused.reason, refused.event_id) == ("rejected", "refused", None)
    assert [r.status for r in answers] == ["created"] * 19 + ["duplicate"], answers
    assert (answers[-1].event_id, answers[-1].differs) == (answers[5].event_id, False)
    assert count(database_url, "events") == 19
    assert sql(database_url, "SELECT event_count FROM contact_metrics_summary") == [(19,)]
    assert count(database_url, "rejections") == 0


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sqlstate", "error"),
    [
        ("0F000", sinal.StoreError),  # one sinal does not classify (locator exception)
        ("09000", sinal.StoreMisconfigured),  # a trigger set up wrong: it may judge the row
    ],
)
async def test_an_event_the_database_fails_otherwise_fails_its_caller_alone(
    pg_url: str, sqlstate: str, error: type[sinal.StoreError]
) -> None:
    """A statement failing for one event with an error raised by a trigger (a plain RAISE
    is the data's refusal): the transaction is tried again in halves, down to that event,
    whose caller gets it."""
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, phone="+5511987654321")
        sql(pg_url, "CREATE FUNCTION fail_13() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    "BEGIN IF NEW.source_id = '13' THEN "
                    f"RAISE EXCEPTION 'no 13' USING ERRCODE = '{sqlstate}'; END IF; "
                    "RETURN NEW; END $$")  # fmt: skip
        sql(pg_url, "CREATE TRIGGER fail_13 BEFORE INSERT ON events FOR EACH ROW "
                    "EXECUTE FUNCTION fail_13()")  # fmt: skip
        watched = WatchedLedger(ledger)
        committer = GroupCommitter(watched, max_delay=0.05)

        answers = await asyncio.gather(
            *(committer.emit(paid(account, contact, n)) for n in range(20)),
            committer.emit(paid(account, contact, 5)),  # a repeat, in the other half
            return_exceptions=True,
        )

        assert watched.sizes[0] == 21  # all in one transaction first, which failed
        assert len(watched.sizes) > 2  # then in halves
        failed = answers.pop(13)
        assert type(failed) is error, failed
        results = [a for a in answers if isinstance(a, EmitResult)]
        assert [r.status for r in results] == ["created"] * 19 + ["duplicate"], answers
        assert (results[-1].event_id, results[-1].differs) == (results[5].event_id, False)
        assert count(pg_url, "events") == 19


@pytest.mark.parametrize(("settings", "message"), BAD_LIMITS)
def test_limits_no_transaction_could_keep_are_refused(
    ledger: Ledger, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        GroupCommitter(ledger, **settings)


async def test_callers_sharing_a_failed_transaction_all_get_the_error_and_nothing_is_stored(
    ledger: Ledger, database_url: str, account: sinal.Account, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also when the failure comes recording a repeat whose first was rejected: the callers
    of events stored before it are not answered 503 for events committed."""
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    fail_recording(monkeypatch, ledger, lambda e: (e.source_id, e.contact_id) == ("K", contact.id))
    committer = GroupCommitter(ledger, max_delay=0.05)
    unknown = replace(paid(account, contact, 0), source_id="K", contact_id=new_id())
    answers = await asyncio.gather(
        committer.emit(paid(account, contact, 1)),
        committer.emit(unknown),
        committer.emit(replace(unknown, contact_id=contact.id)),
        return_exceptions=True,
    )
    assert [type(a) for a in answers] == [sinal.StoreUnavailable] * 3
    assert (count(database_url, "events"), count(database_url, "rejections")) == (0, 0)
