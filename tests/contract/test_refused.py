"""Events the database refuses for their data, where no validation foresaw it (here a
constraint each test adds: no value of 13), on both backends: each comes back rejected,
reason "refused", with nothing of it written; the others of its batch are stored in the
batch's one transaction, alone, in a batch and in a streamed batch."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from decimal import Decimal

import psycopg
import pytest

import sinal
from sinal import EmitEvent, Ledger
from sinal.ids import new_id
from sinal.store.base import REFUSED_MESSAGE
from tests.helpers import count, refuse_13, sql

_TABLES = ("events", "outbox", "contact_metrics_summary", "metrics", "rejections")


def paid(
    account: sinal.Account, contact: sinal.Contact, n: int, value: int | None = None
) -> EmitEvent:
    return EmitEvent(
        account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
        source="shopify", entity_type="order", source_id=str(n),
        value=Decimal(n if value is None else value),
    )  # fmt: skip


def rows(url: str) -> dict[str, int]:
    return {table: count(url, table) for table in _TABLES}


@pytest.fixture
def contact(ledger: Ledger, account: sinal.Account) -> sinal.Contact:
    return ledger.create_contact(account.id, phone="+5511987654321")


def test_an_event_the_database_refuses_is_rejected_and_nothing_of_it_is_written(
    ledger: Ledger,
    account: sinal.Account,
    contact: sinal.Contact,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    refuse_13(database_url)

    with caplog.at_level(logging.WARNING, logger="sinal.store"):
        result = ledger.emit(paid(account, contact, 13))

    assert (result.status, result.reason, result.message) == (
        "rejected",
        "refused",
        REFUSED_MESSAGE,
    )
    assert (result.event_id, result.rejection_id) == (None, None)
    assert result.unique_event_id == "shopify:order:13"
    assert rows(database_url) == dict.fromkeys(_TABLES, 0)
    # the database's reason, for an operator: a check validation lacks
    [logged] = [r.getMessage() for r in caplog.records if r.name == "sinal.store"]
    assert "shopify:order:13" in logged
    assert ("refuse_13" if database_url.startswith("postgres") else "refused") in logged
    assert ledger.emit(paid(account, contact, 12)).status == "created"  # the next one goes in


@pytest.mark.parametrize("size", [6, 200], ids=["statement", "streamed"])
def test_a_batch_stores_all_but_the_events_the_database_refuses(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str, size: int
) -> None:
    """Two refused among `size` (a batch over 64 events is streamed on PostgreSQL), with a
    repeat of each kind, an invalid item and one of an unknown contact."""
    refuse_13(database_url)
    events = [paid(account, contact, n) for n in range(20, 20 + size)]
    events[1] = paid(account, contact, 1, value=13)
    events[size // 2] = paid(account, contact, 2, value=13)
    stranger = EmitEvent(account_id=account.id, contact_id=new_id(), metric_name="Order Paid",
                         source="shopify", source_id="x")  # fmt: skip
    events += [
        paid(account, contact, 1, value=14),  # repeats a refused key: takes over
        paid(account, contact, 2, value=13),  # refused again
        paid(account, contact, 20),  # repeats a stored one
        EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="", source="api"),
        stranger,
    ]

    results = ledger.emit_many(events)

    statuses = [(r.status, r.reason) for r in results]
    refused = ("rejected", "refused")
    assert statuses[1] == statuses[size // 2] == statuses[size + 1] == refused
    assert results[size + 1].unique_event_id == "shopify:order:2"
    assert statuses[size] == ("created", None)  # the repeat of a refused first
    assert statuses[size + 2] == ("duplicate", None)
    assert results[size + 2].event_id == results[0].event_id
    assert statuses[size + 3] == ("rejected", "invalid")
    assert statuses[size + 4] == ("rejected", "contact_not_found")
    others = [s for i, s in enumerate(statuses) if i not in (1, size // 2) and i < size]
    assert others == [("created", None)] * (size - 2)
    stored = size - 2 + 1
    assert rows(database_url) == {
        "events": stored, "outbox": stored, "contact_metrics_summary": 1, "metrics": 1,
        "rejections": 1,
    }  # fmt: skip
    values = [Decimal(20 + i) for i in range(size) if i not in (1, size // 2)]
    [summary] = ledger.get_summary(account.id, contact.id)
    assert summary.event_count == stored
    assert summary.total_value == sum(values, Decimal(14))
    assert all(r.event_id is None for r in results if r.reason == "refused")


@pytest.mark.parametrize("size", [6, 200], ids=["statement", "streamed"])
def test_a_batch_the_database_fails_for_another_reason_fails_whole(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str, size: int
) -> None:
    """Not a refusal of some events' data: nothing is answered refused, nothing written."""
    cascade = "" if database_url.startswith("sqlite") else " CASCADE"
    sql(database_url, f"DROP TABLE outbox{cascade}")  # no transaction can commit now

    with pytest.raises(sinal.StoreError) as failed:
        ledger.emit_many([paid(account, contact, n) for n in range(size)])

    assert not isinstance(failed.value, sinal.UnstorableInput)
    assert count(database_url, "events") == 0


def test_a_batch_item_of_an_integer_too_long_to_write_is_invalid_alone(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    """str() of an int of more than 4,300 digits raises ValueError: the whole batch raised
    it, from the first look at its items' dedup keys."""
    events = [paid(account, contact, n) for n in range(3)]
    events[1] = EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                          source="shopify", source_id=10**5000)  # type: ignore[arg-type]  # fmt: skip

    results = ledger.emit_many(events)

    assert [(r.status, r.reason) for r in results] == [
        ("created", None), ("rejected", "invalid"), ("created", None),
    ]  # fmt: skip
    assert [(e.field, e.code) for e in results[1].errors] == [("source_id", "too_long")]
    assert count(database_url, "events") == 2


# A row sinal writes beside every event, with a NOT NULL column left empty, as code out of
# step with its schema would: refused whatever the event holds.
_OWN_FAULT = {
    "sqlite": ["CREATE TABLE audit (note TEXT NOT NULL)",
               "CREATE TRIGGER audit AFTER INSERT ON events "
               "BEGIN INSERT INTO audit VALUES (NULL); END"],
    "postgres": ["CREATE TABLE audit (note text NOT NULL)",
                 "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS "
                 "$$ BEGIN INSERT INTO audit VALUES (NULL); RETURN NEW; END $$",
                 "CREATE TRIGGER audit AFTER INSERT ON events "
                 "FOR EACH ROW EXECUTE FUNCTION audit()"],
}  # fmt: skip


@pytest.mark.parametrize("size", [6, 200], ids=["statement", "streamed"])
def test_a_row_sinal_writes_wrong_is_its_fault_not_the_events(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str, size: int
) -> None:
    """A `SchemaViolation` (the API's 500), alone or in a batch: not events rejected as
    "refused", which tells their sender to change an input that is fine; nothing written."""
    for statement in _OWN_FAULT["sqlite" if database_url.startswith("sqlite") else "postgres"]:
        sql(database_url, statement)

    with pytest.raises(sinal.SchemaViolation, match="audit") as alone:
        ledger.emit(paid(account, contact, 1))
    with pytest.raises(sinal.SchemaViolation):
        ledger.emit_many([paid(account, contact, n) for n in range(2, 2 + size)])

    assert not isinstance(alone.value, sinal.UnstorableInput)
    assert rows(database_url) == dict.fromkeys(_TABLES, 0)


def test_a_statement_the_driver_refuses_before_sending_it_is_sinals_fault(
    database_url: str,
) -> None:
    """Parameters not matching the placeholders (psycopg's `ProgrammingError` with no
    SQLSTATE, `sqlite3.ProgrammingError`): sinal's SQL, a `SchemaViolation` (the API's 500),
    not a `StoreError` answered 503 "retry", which fails alike every time."""
    if database_url.startswith("sqlite"):
        from sinal.store.sqlite import translated_errors as sqlite_errors

        with (
            pytest.raises(sinal.SchemaViolation, match="bindings"),
            sqlite_errors(),
            closing(sqlite3.connect(":memory:")) as conn,
        ):
            conn.execute("SELECT ?", (1, 2))
    else:
        from sinal.store.postgres import translated_errors as postgres_errors

        with (
            psycopg.connect(database_url) as conn,
            pytest.raises(sinal.SchemaViolation, match="placeholder"),
            postgres_errors(),
        ):
            conn.execute("SELECT %s", (1, 2))


@pytest.mark.postgres
@pytest.mark.parametrize("sqlstate", ["P0001", "44000"])
def test_a_trigger_raising_on_an_event_refuses_it_alone(pg_url: str, sqlstate: str) -> None:
    """A trigger someone added (sinal's raise nothing) judging a row, plpgsql's class P0:
    the data's refusal, as a SQLite trigger's RAISE is; it was a 503 "retry" before. So is
    a view's WITH CHECK OPTION (class 44, raised here by the trigger): a row outside the
    view's condition, as a CHECK's refusal is (it was a 503 too)."""
    sql(pg_url, "CREATE FUNCTION no_13() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.value = 13 THEN "
                f"RAISE EXCEPTION 'no 13' USING ERRCODE = '{sqlstate}'; END IF; "
                "RETURN NEW; END $$")  # fmt: skip
    sql(pg_url, "CREATE TRIGGER no_13 BEFORE INSERT ON events FOR EACH ROW "
                "EXECUTE FUNCTION no_13()")  # fmt: skip
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, phone="+5511987654321")

        results = ledger.emit_many([paid(account, contact, n) for n in (12, 13, 14)])

    assert [(r.status, r.reason) for r in results] == [
        ("created", None), ("rejected", "refused"), ("created", None)
    ]  # fmt: skip
    assert count(pg_url, "events") == 2
