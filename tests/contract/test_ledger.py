"""The ledger's contract, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import TransactionStatus

import sinal
from sinal import EmitEvent, InvalidEvent, Ledger, connect
from sinal.errors import InvalidQuery
from sinal.store.base import EventQuery, Outcome, read_migrations
from sinal.store.postgres import OPEN_RETRY, PostgresStore
from tests.conftest import IN_CI
from tests.helpers import count, cut_connections, fail_recording, sql, wait_until
from tests.integration.whatsapp import statements, traced_ledger

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def account(ledger: Ledger) -> sinal.Account:
    return ledger.create_account("Loja Exemplo")


@pytest.fixture
def contact(ledger: Ledger, account: sinal.Account) -> sinal.Contact:
    return ledger.create_contact(account.id, phone="+55 11 98765-4321", email="ana@example.com")


def order_paid(account: sinal.Account, contact: sinal.Contact, **overrides: object) -> EmitEvent:
    params: dict[str, object] = {
        "account_id": account.id,
        "contact_id": contact.id,
        "metric_name": sinal.METRIC_ORDER_PAID,
        "properties": {"order_id": "1001", "total": "297.90"},
        "value": Decimal("297.90"),
        "source": "shopify",
        "source_id": "1001",
        "entity_type": "order",
    }
    params.update(overrides)
    return EmitEvent(**params)  # type: ignore[arg-type]


def test_migrate_is_idempotent_and_reports_version(database_url: str) -> None:
    with sinal.connect(database_url) as ledger:
        backend = "sqlite" if database_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == []
        assert ledger.schema_version() == read_migrations(backend)[-1][0]


@pytest.mark.parametrize(
    "zone", ["America", "Etc", "Nowhere/City", "a" * 300], ids=["dir", "etc", "unknown", "long"]
)
def test_create_account_with_a_zone_that_is_not_iana_is_invalid_and_writes_nothing(
    ledger: Ledger, zone: str
) -> None:
    # "America" is a directory of zone files and 300 characters a file name too long:
    # both escaped as OSError
    with pytest.raises(sinal.InvalidAccount) as caught:
        ledger.create_account("Loja", timezone=zone)

    assert [e.as_dict() for e in caught.value.errors] == [
        {"field": "timezone", "code": "invalid_timezone",
         "message": f"{zone!r} is not an IANA time zone"}
    ]  # fmt: skip
    assert ledger.list_accounts() == []


def test_create_account_with_a_name_too_long_is_invalid_account(ledger: Ledger) -> None:
    with pytest.raises(sinal.InvalidAccount) as caught:  # was InvalidIdentity, unlike PATCH
        ledger.create_account("a" * 201)

    assert caught.value.field == "name"
    assert caught.value.reason == "too_long"
    assert ledger.list_accounts() == []


def test_connect_creates_a_sqlite_file_unless_told_not_to(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sinal.db'}"
    with pytest.raises(sinal.ConfigurationError, match=r"no SQLite database at .*sinal\.db"):
        sinal.connect(url, create=False).schema_version()
    assert list(tmp_path.iterdir()) == []

    with sinal.connect(url) as ledger:
        ledger.migrate()
    with sinal.connect(url, create=False) as ledger:
        assert ledger.list_accounts() == []


def test_emit_event_stores_event_metric_summary_and_outbox(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    result = ledger.emit(order_paid(account, contact))

    assert result.status == "created"
    assert result.unique_event_id == "shopify:order:1001"
    [event] = ledger.list_events(EventQuery(account.id))
    assert event.id == result.event_id
    assert event.value == Decimal("297.90")
    assert event.currency == "BRL"
    assert event.properties == {"order_id": "1001", "total": "297.90"}
    assert event.occurred_at.tzinfo is not None
    assert event.schema_version == 1
    [summary] = ledger.get_summary(account.id, contact.id)
    assert (summary.metric_name, summary.event_count, summary.total_value) == (
        "Order Paid",
        1,
        Decimal("297.90"),
    )
    assert sql(database_url, "SELECT name, category, is_system, display_name FROM metrics") == [
        ("Order Paid", "ecommerce", True, "Order Paid")
    ]
    assert count(database_url, "outbox") == 1


def test_duplicate_returns_existing_id_and_whether_payload_differs(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    first = ledger.emit(order_paid(account, contact))
    same = ledger.emit(order_paid(account, contact, value=Decimal("297.9")))
    changed = ledger.emit(order_paid(account, contact, properties={"order_id": "1001"}))

    assert (same.status, same.event_id, same.differs) == ("duplicate", first.event_id, False)
    assert (changed.status, changed.event_id, changed.differs) == (
        "duplicate",
        first.event_id,
        True,
    )
    [summary] = ledger.get_summary(account.id)
    assert summary.event_count == 1


@pytest.mark.parametrize("batch_size", [1, 2, 70])  # the function, the statement, a stream
def test_a_duplicate_whose_boolean_became_a_number_differs(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, batch_size: int
) -> None:
    stored = {"paid": True, "flags": [False], "n": 1}
    ledger.emit(order_paid(account, contact, properties=stored))
    others = [order_paid(account, contact, source_id=f"o{i}") for i in range(batch_size - 2)]

    def answers(properties: dict[str, Any]) -> list[sinal.EmitResult]:
        dup = order_paid(account, contact, properties=properties)
        if batch_size == 1:
            return [ledger.emit(dup)]
        repeat = order_paid(account, contact, source_id="new", properties=properties)
        first = order_paid(account, contact, source_id="new", properties=stored)
        return ledger.emit_many([dup, first, repeat, *others])[:3:2]

    for properties, expected in [
        ({"paid": 1, "flags": [False], "n": 1}, True),
        ({"paid": True, "flags": [0], "n": 1}, True),
        ({"paid": True, "flags": [False], "n": 1.0}, False),
    ]:
        results = answers(properties)
        assert [(r.status, r.differs) for r in results] == [("duplicate", expected)] * len(
            results
        ), properties


def test_custom_metric_is_created_as_custom(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    ledger.emit_event(
        account_id=account.id, contact_id=contact.id, metric_name="Quiz Answered", source="app"
    )
    assert sql(database_url, "SELECT name, category, is_system, source FROM metrics") == [
        ("Quiz Answered", "custom", False, "app")
    ]


def test_a_metric_is_created_by_the_first_event_of_it_whatever_the_contact(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    """One event at a time, a new metric appears with the first event that names it, also
    when that event's contact already has summaries of other metrics; the events that
    start another contact's summary of it, or add to one, leave it as it is."""
    other = ledger.create_contact(account.id, external_id="other")

    def metrics() -> list[tuple[str, str, bool]]:
        return sql(database_url, "SELECT name, category, is_system FROM metrics ORDER BY name")

    ledger.emit(order_paid(account, contact, source_id="1"))
    assert metrics() == [("Order Paid", "ecommerce", True)]
    ledger.emit_event(
        account_id=account.id, contact_id=contact.id, metric_name="Quiz Answered", source="app"
    )
    assert metrics() == [("Order Paid", "ecommerce", True), ("Quiz Answered", "custom", False)]
    ledger.emit(order_paid(account, other, source_id="2"))  # another contact's first
    ledger.emit(order_paid(account, contact, source_id="3"))  # adds to a summary
    assert metrics() == [("Order Paid", "ecommerce", True), ("Quiz Answered", "custom", False)]
    counts = "SELECT metric_name, event_count FROM contact_metrics_summary WHERE contact_id = ?"
    assert sorted(sql(database_url, counts, str(contact.id))) == [
        ("Order Paid", 2),
        ("Quiz Answered", 1),
    ]
    assert sql(database_url, counts, str(other.id)) == [("Order Paid", 1)]


@pytest.mark.parametrize("batch_size", [1, 2, 70])  # the function, the statement, a stream
def test_a_metric_is_made_only_by_an_event_stored(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, batch_size: int
) -> None:
    """Not by a duplicate naming another metric, nor by a rejected event."""
    ledger.emit(order_paid(account, contact, source_id="dup"))
    others = [order_paid(account, contact, source_id=f"o{i}") for i in range(batch_size - 1)]
    for unsaved in (
        order_paid(account, contact, source_id="dup", metric_name="Order Cancelled"),
        order_paid(account, contact, source_id="r", metric_name="Quiz", contact_id=uuid.uuid4()),
        order_paid(account, contact, source_id="n", metric_name="Quiz", contact_id=None),
    ):
        if batch_size == 1:
            [result] = [ledger.emit(unsaved)]
        else:
            [result, *_] = ledger.emit_many([unsaved, *others])
        assert result.status in ("duplicate", "rejected")
        assert [m.name for m in ledger.list_metrics(account.id)] == ["Order Paid"], unsaved
    stored = order_paid(account, contact, source_id="new", metric_name="Order Cancelled")
    ledger.emit_many([stored, *others]) if batch_size > 1 else ledger.emit(stored)
    assert sorted(m.name for m in ledger.list_metrics(account.id)) == [
        "Order Cancelled",
        "Order Paid",
    ]


def test_missing_contact_is_rejected_and_kept(
    ledger: Ledger, database_url: str, account: sinal.Account
) -> None:
    result = ledger.emit_event(
        account_id=account.id, contact_id=None, metric_name="Order Paid", source="shopify"
    )

    assert (result.status, result.reason, result.event_id) == ("rejected", "contact_required", None)
    [kept] = ledger.list_rejections(account.id)
    assert kept.id == result.rejection_id
    assert kept.reason == "contact_required"
    # one text, whichever backend and path wrote it (PostgreSQL's record statement too)
    no_contact = (
        "an event needs a contact: give contact_id (or, over HTTP, a contact object with a "
        "phone, email or external_id)"
    )
    assert result.message == kept.message == no_contact
    assert kept.payload["metric_name"] == "Order Paid"
    assert count(database_url, "events") == 0
    assert count(database_url, "outbox") == 0


@pytest.mark.parametrize("zone", [None, "America/Sao_Paulo"])  # the database's TimeZone
def test_a_rejection_keeps_its_input_alike_on_both_backends(
    database_url: str, zone: str | None
) -> None:
    """Each way in (the one-event path, the record statement, a streamed batch) keeps the
    input as `PreparedEvent.as_input` writes it, whatever the database's time zone."""
    if zone is not None and database_url.startswith("postgresql:"):
        name = database_url.rsplit("/", 1)[1]
        sql(database_url, f"ALTER DATABASE \"{name}\" SET timezone = '{zone}'")
    with sinal.connect(database_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, phone="+55 11 98765-4321")
        unknown = uuid.uuid4()
        times = [
            ("2026-12-01T10:00:00.12Z", "2026-12-01T10:00:00.120000Z"),
            ("2026-12-01T07:00:00-03:00", "2026-12-01T10:00:00Z"),
            ("2026-12-01T10:00:00.000001+00:00", "2026-12-01T10:00:00.000001Z"),
        ]
        for n in (1, 2, 70):
            for sent, kept_as in times:
                rejected = order_paid(
                    account, contact, contact_id=unknown, source_id=f"r{n}{sent}",
                    occurred_at=sent, properties={"a": 1, "zz": "x"},
                )  # fmt: skip
                others = [order_paid(account, contact, source_id=f"{n}:{i}") for i in range(n - 1)]
                [result, *_] = (
                    [ledger.emit(rejected)] if n == 1 else ledger.emit_many([rejected, *others])
                )
                [kept] = [
                    k for k in ledger.list_rejections(account.id) if k.id == result.rejection_id
                ]
                assert kept.payload == {
                    "account_id": str(account.id), "contact_id": str(unknown),
                    "metric_name": "Order Paid", "properties": {"a": 1, "zz": "x"},
                    "value": "297.90", "currency": "BRL", "source": "shopify",
                    "source_id": f"r{n}{sent}", "integration_id": None, "entity_type": "order",
                    "entity_id": None, "occurred_at": kept_as, "automation_execution_id": None,
                }, (n, sent)  # fmt: skip
        if isinstance(ledger.store, PostgresStore):  # every connection in UTC, whatever the zone
            with ledger.store._conn() as conn:
                assert conn.execute("SHOW timezone").fetchone() == ("UTC",)
            [stored, *_] = ledger.list_events(EventQuery(account.id))
            assert stored.occurred_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("batch_size", [1, 2, 70])  # the function, the statement, a stream
def test_an_event_of_an_account_that_does_not_exist_is_rejected_and_kept_nowhere(
    ledger: Ledger,
    database_url: str,
    account: sinal.Account,
    contact: sinal.Contact,
    batch_size: int,
) -> None:
    """Its rejection under that account could be listed by no one (a key is of an account
    that exists): it says the account is missing, not the contact, and writes nothing;
    the batch's other events are stored."""
    nowhere = uuid.uuid4()
    strays = [
        order_paid(account, contact, account_id=nowhere, source_id="stray"),
        order_paid(account, contact, account_id=nowhere, contact_id=None, source_id="none"),
    ]
    ours = [order_paid(account, contact, source_id=str(i)) for i in range(batch_size - 1)]

    if batch_size == 1:
        results = [ledger.emit(strays[0]), ledger.emit(strays[1])]
    else:
        results = ledger.emit_many([strays[0], *ours, strays[1]])
        assert [r.status for r in results[1:-1]] == ["created"] * len(ours)
        results = [results[0], results[-1]]

    message = f"account {nowhere} does not exist"
    assert [(r.status, r.reason, r.message, r.rejection_id) for r in results] == [
        ("rejected", "account_not_found", message, None)
    ] * 2
    assert count(database_url, "rejections") == 0
    assert count(database_url, "events") == len(ours)


def test_contact_of_another_account_is_not_found(
    ledger: Ledger, database_url: str, contact: sinal.Contact
) -> None:
    other = ledger.create_account("Outra Loja")
    stranger = ledger.emit_event(
        account_id=other.id, contact_id=contact.id, metric_name="Order Paid", source="shopify"
    )
    unknown = ledger.emit_event(
        account_id=other.id, contact_id=uuid.uuid4(), metric_name="Order Paid", source="shopify"
    )

    assert (stranger.status, stranger.reason) == ("rejected", "contact_not_found")
    assert (unknown.status, unknown.reason) == ("rejected", "contact_not_found")
    assert ledger.get_contact(other.id, contact.id) is None
    assert count(database_url, "events") == 0
    assert len(ledger.list_rejections(other.id)) == 2


def test_invalid_event_raises_and_writes_nothing(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    with pytest.raises(InvalidEvent) as caught:
        ledger.emit(order_paid(account, contact, value=float("nan"), currency="REAIS"))

    assert {(e.field, e.code) for e in caught.value.errors} == {
        ("value", "not_finite"),
        ("currency", "invalid_currency"),
    }
    for table in ("events", "metrics", "contact_metrics_summary", "outbox", "rejections"):
        assert count(database_url, table) == 0


def test_events_from_automations_write_no_outbox_row(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    execution = uuid.uuid4()
    result = ledger.emit_event(
        account_id=account.id,
        contact_id=contact.id,
        metric_name=sinal.METRIC_MESSAGE_SENT,
        source="automation",
        automation_execution_id=execution,
    )

    [event] = ledger.list_events(EventQuery(account.id))
    assert event.id == result.event_id
    assert event.automation_execution_id == execution
    assert count(database_url, "outbox") == 0


def test_summary_keeps_min_and_max_with_out_of_order_events(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    for days, value in [(5, "10"), (1, None), (9, "2.5"), (3, "0.0001")]:
        ledger.emit_event(
            account_id=account.id,
            contact_id=contact.id,
            metric_name="Order Placed",
            source="api",
            value=value,
            occurred_at=T0 - timedelta(days=days),
        )

    [summary] = ledger.get_summary(account.id, contact.id)
    assert summary.event_count == 4
    assert summary.total_value == Decimal("12.5001")
    assert summary.first_event_at == T0 - timedelta(days=9)
    assert summary.last_event_at == T0 - timedelta(days=1)


@pytest.mark.postgres
def test_migrate_refuses_a_database_that_does_not_store_utf8(non_utf8_url: str) -> None:
    """A LATIN1 database would fail on text it cannot hold, long after setup, and a
    SQL_ASCII one keeps bytes unchecked: `migrate` says so at once, names the encoding,
    and creates nothing."""
    with sinal.connect(non_utf8_url) as ledger:
        with pytest.raises(
            sinal.ConfigurationError, match=r"needs a UTF8 database.*(LATIN1|SQL_ASCII)"
        ):
            ledger.migrate()
        assert ledger.schema_version() == 0


@pytest.mark.postgres
def test_text_goes_as_utf8_whatever_the_default_client_encoding(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sinal's connections speak UTF-8 even where libpq would pick another encoding
    (PGCLIENTENCODING here): a streamed batch's metric names, keys and properties, written
    by sinal's own dumpers, are stored as given, and add up with a lone event's."""
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    name, properties = "Avaliação Concluída", {"nome": "João", "nota": "✓ ótimo"}
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        batch = [
            order_paid(
                account, contact, metric_name=name, source_id=f"ação-{i}", properties=properties
            )
            for i in range(100)
        ]
        assert {r.status for r in ledger.emit_many(batch)} == {"created"}
        one = order_paid(account, contact, metric_name=name, source_id="só", properties=properties)
        assert ledger.emit(one).status == "created"
        assert [r.status for r in ledger.emit_many(batch[:70])] == ["duplicate"] * 70
        assert not any(r.differs for r in ledger.emit_many(batch[:70]))
        [summary] = ledger.get_summary(account.id, contact.id)
        stored = ledger.list_events(EventQuery(account.id, limit=200))

    assert (summary.metric_name, summary.event_count) == (name, 101)
    assert {(e.metric_name, (e.source_id or "")[:4]) for e in stored} == {
        (name, "ação"),
        (name, "só"),
    }
    assert all(e.properties == properties for e in stored)
    rows = sql(pg_url, "SELECT DISTINCT metric_name FROM outbox")
    assert rows == [(name,)]


def test_a_big_batchs_summaries_add_every_value_exactly(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    """A batch big enough to be streamed on PostgreSQL adds its values to the summary to
    the last place, whatever their form: exponents, four places, negatives, the largest
    allowed, none."""
    values = ["1E+3", "0.0001", "-99999999999999.9999", "99999999999999.9999", None, "297.90"]
    batch = [
        order_paid(account, contact, source_id=f"v-{i}", value=values[i % len(values)])
        for i in range(300)
    ]
    assert {r.status for r in ledger.emit_many(batch)} == {"created"}

    [summary] = ledger.get_summary(account.id, contact.id)
    assert summary.event_count == 300
    assert summary.total_value == 50 * (Decimal("1000") + Decimal("0.0001") + Decimal("297.90"))


def test_a_summary_row_takes_the_id_of_an_event_that_created_it(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    """Each way a summary row is made (one event; a small batch, one statement; a big
    batch, streamed on PostgreSQL) gives it the id of one of its events; later events
    leave it."""
    first = ledger.emit(order_paid(account, contact))
    ledger.emit(order_paid(account, contact, source_id="1002"))
    others = [ledger.create_contact(account.id, external_id=f"c{i}") for i in range(3)]
    small = [
        order_paid(account, c, metric_name=m, source_id=f"s-{c.id}-{m}")
        for c in others
        for m in (sinal.METRIC_ORDER_PLACED, sinal.METRIC_LINK_CLICKED)
    ]
    big = [
        order_paid(account, others[i % 3], metric_name=f"Custom {i % 40}", source_id=f"b-{i}")
        for i in range(600)
    ]
    for batch in (small, big):
        assert {r.status for r in ledger.emit_many(batch)} == {"created"}

    rows = sql(
        database_url,
        "SELECT s.contact_id, s.metric_name, s.id, e.contact_id, e.metric_name "
        "FROM contact_metrics_summary s LEFT JOIN events e "
        "ON e.account_id = s.account_id AND e.id = s.id WHERE s.account_id = ?",
        str(account.id) if database_url.startswith("sqlite:") else account.id,
    )
    assert len(rows) == 1 + 3 * 2 + 3 * 40
    assert all(r[3:] == r[:2] for r in rows)  # an event of the row's contact and metric
    assert len({r[2] for r in rows}) == len(rows)
    [own] = [r[2] for r in rows if r[1] == sinal.METRIC_ORDER_PAID]
    assert str(own) == str(first.event_id)


def test_a_big_batch_answers_every_kind_of_contact(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    """A batch big enough to be streamed on PostgreSQL, where contacts are looked up once
    for the batch: events of the account's contacts are stored; those of an unknown
    contact, of another account's contact and of none are rejected and kept, and so are
    their repeats."""
    other_account = ledger.create_account(name="Outra Loja")
    theirs = ledger.create_contact(other_account.id, external_id="theirs")
    ours = [contact, *(ledger.create_contact(account.id, external_id=f"c{i}") for i in range(4))]
    # Every 10th event has no contact of the account, by turns: (its contact, the answer).
    odd = [(uuid.uuid4(), "contact_not_found"), (theirs.id, "contact_not_found"),
           (None, "contact_required")]  # fmt: skip
    batch: list[EmitEvent] = []
    expected: list[str] = []
    for i in range(200):
        first = i % 180  # the last 20 repeat the first 20, payload and all
        contact_id, answer = odd[first // 10 % 3] if first % 10 == 0 else (ours[i % 5].id, None)
        batch.append(order_paid(account, contact, contact_id=contact_id, source_id=str(first)))
        repeat = i >= 180
        expected.append(answer or ("duplicate" if repeat else "created"))

    results = ledger.emit_many(batch)

    # A repeat of a rejected event is recorded again, and rejected alike.
    assert [r.reason if r.status == "rejected" else r.status for r in results] == expected
    assert [r.event_id for r in results[180:] if r.status == "duplicate"] == [
        r.event_id for r in results[:20] if r.status == "created"
    ]
    assert not any(r.differs for r in results)
    assert count(database_url, "events") == 162
    assert count(database_url, "outbox") == 162
    assert sum(s.event_count for s in ledger.get_summary(account.id)) == 162
    assert len(ledger.list_rejections(account.id)) == 18 + 2


def test_emit_many_answers_in_order_and_first_duplicate_wins(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    results = ledger.emit_many(
        [
            order_paid(account, contact, source_id="1", value=1),
            order_paid(account, contact, source_id="2", value=2),
            order_paid(account, contact, source_id="1", value=3),  # same id, other payload
            order_paid(account, contact, metric_name="", source_id="3"),
            order_paid(account, contact, contact_id=uuid.uuid4(), source_id="4"),
            order_paid(account, contact, source_id="1", value=1),  # same id, same payload
        ]
    )

    assert [r.status for r in results] == [
        "created",
        "created",
        "duplicate",
        "rejected",
        "rejected",
        "duplicate",
    ]
    assert results[2].event_id == results[0].event_id
    assert results[2].differs is True
    assert results[5].differs is False
    assert results[3].reason == "invalid"
    assert results[3].errors[0].field == "metric_name"
    assert results[4].reason == "contact_not_found"
    assert count(database_url, "events") == 2
    [summary] = ledger.get_summary(account.id)
    assert (summary.event_count, summary.total_value) == (2, Decimal(3))


def test_emit_many_retries_a_repeat_whose_first_was_rejected(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    results = ledger.emit_many(
        [
            order_paid(account, contact, contact_id=uuid.uuid4()),
            order_paid(account, contact),
        ]
    )
    assert [r.status for r in results] == ["rejected", "created"]


@pytest.mark.parametrize("batch_size", [3, 70])  # one statement, a streamed batch
def test_a_repeat_whose_first_was_rejected_commits_with_its_batch_or_not_at_all(
    ledger: Ledger,
    database_url: str,
    account: sinal.Account,
    monkeypatch: pytest.MonkeyPatch,
    batch_size: int,
) -> None:
    """The repeat is recorded in the batch's transaction: when writing it fails, the call
    raises and nothing of the batch is stored, not even the rejection of its first."""
    contact = ledger.create_contact(account.id, phone="+5511987654321")
    batch = [
        order_paid(account, contact, source_id="A"),
        order_paid(account, contact, source_id="K", contact_id=uuid.uuid4()),
        order_paid(account, contact, source_id="K"),
        *(order_paid(account, contact, source_id=f"o{i}") for i in range(batch_size - 3)),
    ]
    fail_recording(monkeypatch, ledger, lambda e: (e.source_id, e.contact_id) == ("K", contact.id))

    with pytest.raises(sinal.StoreUnavailable):
        ledger.emit_many(batch)
    for table in ("events", "rejections", "outbox", "contact_metrics_summary", "metrics"):
        assert count(database_url, table) == 0, table

    monkeypatch.undo()
    results = ledger.emit_many(batch)
    assert [r.status for r in results[:3]] == ["created", "rejected", "created"]
    assert count(database_url, "events") == batch_size - 1
    assert [k.id for k in ledger.list_rejections(account.id)] == [results[1].rejection_id]


def test_emit_many_refuses_more_than_a_thousand(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    with pytest.raises(InvalidEvent) as caught:
        ledger.emit_many([order_paid(account, contact, source_id=str(i)) for i in range(1001)])
    assert caught.value.errors[0].code == "too_many"


def test_emit_many_with_nothing_valid_writes_nothing(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    results = ledger.emit_many([order_paid(account, contact, currency="??")])
    assert results[0].reason == "invalid"
    assert count(database_url, "events") == 0


def test_same_source_id_in_two_accounts_is_two_events(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    other = ledger.create_account("Outra Loja")
    other_contact = ledger.create_contact(other.id, email="ana@example.com")
    a = ledger.emit(order_paid(account, contact))
    b = ledger.emit(order_paid(other, other_contact))
    assert (a.status, b.status) == ("created", "created")
    assert other_contact.id != contact.id


def test_an_event_is_found_by_its_unique_event_id_in_its_account_alone(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    other = ledger.create_account("Outra Loja")
    ours = ledger.emit(order_paid(account, contact)).event_id
    theirs = ledger.emit(order_paid(other, ledger.create_contact(other.id, email="a@b.com")))
    assert ours is not None
    assert theirs.event_id is not None

    found = ledger.find_event(account.id, "shopify:order:1001")

    assert found is not None
    assert found == ledger.get_event(account.id, ours)  # the whole event, as read by id
    assert found.unique_event_id == "shopify:order:1001"
    assert ledger.find_event(other.id, "shopify:order:1001") == ledger.get_event(
        other.id, theirs.event_id
    )
    assert ledger.find_event(account.id, "shopify:order:1002") is None
    assert ledger.find_event(uuid.uuid4(), "shopify:order:1001") is None


def test_contact_is_matched_by_phone_without_the_ninth_digit(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    same, created = ledger.upsert_contact(account.id, phone="551187654321")
    by_email, _ = ledger.upsert_contact(account.id, email=" ANA@Example.com ")
    assert not created
    assert same.id == by_email.id == contact.id
    assert contact.phone == "+5511987654321"


def test_invalid_contact_identities_are_reported_per_field(
    ledger: Ledger, account: sinal.Account
) -> None:
    with pytest.raises(sinal.InvalidContact) as caught:
        ledger.create_contact(account.id, phone="abc", email="not-an-email")
    assert {(e.field, e.code) for e in caught.value.errors} == {
        ("phone", "invalid_phone"),
        ("email", "invalid_email"),
    }


_BAD_FIELDS = {"phone": "abc", "email": "not-an-email", "name": "x" * 201}
_BAD_FIELD_ERRORS = [
    ("phone", "invalid_phone"),
    ("email", "invalid_email"),
    ("name", "too_long"),
]


def test_contact_create_reports_every_bad_field_name_included(
    ledger: Ledger, account: sinal.Account
) -> None:
    with pytest.raises(sinal.InvalidContact) as caught:
        ledger.create_contact(account.id, **_BAD_FIELDS)
    assert [(e.field, e.code) for e in caught.value.errors] == _BAD_FIELD_ERRORS


def test_contact_update_reports_every_bad_field_and_changes_nothing(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    # Whatever order the fields come in, one InvalidContact names them all in one order.
    for changes in (_BAD_FIELDS, dict(reversed(_BAD_FIELDS.items()))):
        with pytest.raises(sinal.InvalidContact) as caught:
            ledger.update_contact(account.id, contact.id, changes)
        assert [(e.field, e.code) for e in caught.value.errors] == _BAD_FIELD_ERRORS
    with pytest.raises(sinal.InvalidContact) as caught:
        ledger.update_contact(account.id, contact.id, {"nickname": "Ana", "phone": "abc"})
    assert [(e.field, e.code) for e in caught.value.errors] == [
        ("phone", "invalid_phone"),
        ("nickname", "unknown_field"),
    ]
    assert ledger.get_contact(account.id, contact.id) == contact


def test_contact_with_a_lone_surrogate_in_its_email_is_an_invalid_contact(
    ledger: Ledger, account: sinal.Account
) -> None:
    with pytest.raises(sinal.InvalidContact) as caught:
        ledger.create_contact(account.id, email="ana\ud800@loja.com.br")
    assert [(e.field, e.code) for e in caught.value.errors] == [("email", "invalid_email")]


def test_contact_fields_that_are_not_text_are_invalid_contact_naming_each(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    # a phone read from a spreadsheet as a number: a TypeError from unicodedata, no field
    bad: dict[str, Any] = {"phone": 11987654321, "email": ["ana@example.com"], "name": 7}
    expected = [("phone", "invalid_type"), ("email", "invalid_type"), ("name", "invalid_type")]
    for write in (
        lambda: ledger.create_contact(account.id, **bad),
        lambda: ledger.resolve_contact(account.id, **bad),
        lambda: ledger.update_contact(account.id, contact.id, bad),
    ):
        with pytest.raises(sinal.InvalidContact) as caught:
            write()
        assert [(e.field, e.code) for e in caught.value.errors] == expected
        assert caught.value.errors[0].message == "phone must be a string"
    assert count(database_url, "contacts") == 1
    assert ledger.get_contact(account.id, contact.id) == contact


def test_a_malformed_id_is_an_error_naming_its_parameter(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact, database_url: str
) -> None:
    """Python's ValueError "badly formed hexadecimal UUID string" named no parameter."""
    a, c = account.id, contact.id
    number: Any = 42  # not a str either
    calls: list[tuple[Any, type[sinal.SinalError], str]] = [
        (lambda: ledger.get_account("loja-1"), sinal.InvalidAccount, "account_id"),
        (lambda: ledger.create_api_key("loja-1"), sinal.InvalidAccount, "account_id"),
        (lambda: ledger.create_contact("loja-1", phone="+5511987654321"), sinal.InvalidContact,
         "account_id"),
        (lambda: ledger.resolve_contact("loja-1", phone="+5511987654321"), sinal.InvalidContact,
         "account_id"),
        (lambda: ledger.get_contact(a, "ana"), sinal.InvalidContact, "contact_id"),
        (lambda: ledger.update_contact(a, "ana", {"name": "Ana"}), sinal.InvalidContact,
         "contact_id"),
        (lambda: ledger.add_tags(a, "ana", ["vip"]), sinal.InvalidContact, "contact_id"),
        (lambda: ledger.erase_contact("loja-1", c), sinal.InvalidContact, "account_id"),
        (lambda: ledger.list_rejections("loja-1"), InvalidQuery, "account_id"),
        (lambda: ledger.get_summary(a, number), InvalidQuery, "contact_id"),
        (lambda: ledger.replay_rejection(a, "r-1"), InvalidQuery, "rejection_id"),
    ]  # fmt: skip
    for call, error, name in calls:
        with pytest.raises(error) as caught:
            call()
        [problem] = caught.value.errors  # type: ignore[attr-defined]
        assert (problem.field, problem.code) == (name, "invalid_uuid"), name
        assert problem.message.startswith(f"{name} must be a UUID, got ")
    assert count(database_url, "contacts") == 1
    assert ledger.list_tags(a, c) == []


def test_tags_given_as_one_string_are_invalid_not_tagged_letter_by_letter(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    for change in (ledger.add_tags, ledger.remove_tags):
        with pytest.raises(sinal.InvalidContact) as caught:
            change(account.id, contact.id, "vip")  # a str is a Sequence[str]: mypy lets it by
        [error] = caught.value.errors
        assert (error.field, error.code) == ("tags", "invalid_type")
        assert error.message == "tags must be a list of tags, not one string: ['vip']"
    assert ledger.list_tags(account.id, contact.id) == []  # it was ["i", "p", "v"]
    assert ledger.add_tags(account.id, contact.id, ["vip"]) == ["vip"]


def test_contact_in_unknown_account_is_refused(ledger: Ledger) -> None:
    with pytest.raises(sinal.AccountNotFound):
        ledger.create_contact(uuid.uuid4(), email="ana@example.com")


def _contact_updates(ledger: Ledger, account: sinal.Account) -> list[tuple[str, dict[str, Any]]]:
    query = EventQuery(account.id, metric_name=sinal.METRIC_CONTACT_UPDATED)
    return [(e.source, e.properties) for e in ledger.list_events(query)]


def test_filling_a_contact_gives_what_it_lacks_but_no_one_elses_identity(
    ledger: Ledger, account: sinal.Account
) -> None:
    ana = ledger.create_contact(account.id, email="ana@example.com", name="Ana")
    bia = ledger.create_contact(account.id, phone="+55 11 91234-5678")

    filled = ledger.fill_contact(
        account.id, ana.id, phone="(11) 91234-5678", external_id="crm:7", name="Ana Souza",
        source="whatsapp",
    )  # fmt: skip

    assert filled is not None
    assert (filled.name, filled.phone, filled.external_id) == ("Ana", None, "crm:7")
    assert ledger.get_contact(account.id, bia.id) == bia
    assert _contact_updates(ledger, account) == [
        ("whatsapp", {"external_id": "crm:7", "changed": ["external_id"]})
    ]
    assert ledger.fill_contact(account.id, ana.id, name="Outra") == filled  # nothing to give
    other = ledger.create_account("Outra Loja")
    assert ledger.fill_contact(other.id, ana.id, name="X") is None
    assert ledger.fill_contact(account.id, uuid.uuid4(), name="X") is None
    with pytest.raises(sinal.InvalidContact) as caught:
        ledger.fill_contact(account.id, ana.id, phone="abc")
    assert [(e.field, e.code) for e in caught.value.errors] == [("phone", "invalid_phone")]
    assert len(_contact_updates(ledger, account)) == 1


def test_filling_a_contact_given_as_read_writes_without_reading_it_again(
    database_url: str,
) -> None:
    """The contact a caller has just read (a WhatsApp user's, read with it) is filled with
    no read of it first: the write transaction alone (PostgreSQL: it began with a read of
    the contact). Another account's contact is none, as its id is."""
    with traced_ledger(database_url) as ledger:
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, email="ana@example.com")

        with statements(ledger) as sent:
            filled = ledger.fill_contact(account.id, ana, name="Ana", source="whatsapp")

        assert filled is not None
        assert filled.name == "Ana"
        first_write = "BEGIN IMMEDIATE" if database_url.startswith("sqlite:") else "BEGIN"
        assert sent[0] == first_write
        assert ledger.fill_contact(ledger.create_account("Outra").id, ana, name="X") is None
        assert _contact_updates(ledger, account) == [
            ("whatsapp", {"name": "Ana", "changed": ["name"]})
        ]


@pytest.mark.parametrize("fill_missing", [False, True], ids=["found", "fill_missing"])
def test_resolving_a_contact_that_lacks_nothing_is_one_read(
    database_url: str, fill_missing: bool
) -> None:
    """A contact found with nothing to give it (its email is another contact's) is one read:
    no write transaction, so no writer's lock. PostgreSQL: 1 round trip (it was 5: the
    account, then BEGIN, the identity, the contact, COMMIT; 7 with the failed fill)."""
    with traced_ledger(database_url) as ledger:
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, phone="+55 11 98765-4321", name="Ana")
        bia = ledger.create_contact(account.id, email="bia@example.com")

        with statements(ledger) as sent:
            found, is_new = ledger.resolve_contact(
                account.id, phone="(11) 98765-4321", email="bia@example.com", name="Outra",
                source="shopify", fill_missing=fill_missing,
            )  # fmt: skip

        assert (found, is_new) == (ana, False)
        if database_url.startswith("sqlite:"):  # one read: BEGIN (deferred), SELECTs, COMMIT
            assert [s for s in sent if not s.startswith("SELECT")] == ["BEGIN", "COMMIT"]
        else:
            assert sent == ["Bind"]
        assert ledger.get_contact(account.id, bia.id) == bia
        assert _contact_updates(ledger, account) == []


def test_resolving_a_new_contact_is_one_read_and_one_write_transaction(
    database_url: str,
) -> None:
    """A contact not found is created with its Contact Created in one transaction after the
    one read that found nothing; its account is not read apart (the contact's insert says
    when there is none). PostgreSQL: 7 round trips (8 with the account's read); SQLite: 18
    statements (21)."""
    with traced_ledger(database_url) as ledger:
        account = ledger.create_account("Loja")

        with statements(ledger) as sent:
            bia, is_new = ledger.resolve_contact(
                account.id, phone="+55 21 91234-5678", name="Bia", source="whatsapp"
            )

        assert is_new
        if database_url.startswith("sqlite:"):  # the read, then the write transaction
            read = sent[: sent.index("BEGIN IMMEDIATE")]
            assert [s for s in read if not s.startswith("SELECT")] == ["BEGIN", "COMMIT"]
            assert not any("FROM accounts" in s for s in sent)
            assert len(sent) == 18
        else:  # the read; BEGIN, the identities, the contact, its identities, the event, COMMIT
            assert sent == ["Bind", "BEGIN", "Bind", "Bind", "Bind", "Bind", "COMMIT"]
        created = EventQuery(account.id, metric_name=sinal.METRIC_CONTACT_CREATED)
        assert [e.contact_id for e in ledger.list_events(created)] == [bia.id]


def test_resolving_a_contact_in_an_account_that_does_not_exist_writes_nothing(
    database_url: str,
) -> None:
    """An account id no account has is `AccountNotFound` naming it, as before the contact's
    insert told it; no contact, identity or event is written."""
    with sinal.connect(database_url) as ledger:
        account = ledger.create_account("Loja")
        ana, _ = ledger.resolve_contact(account.id, phone="+55 21 91234-5678")
        missing = uuid.uuid4()

        with pytest.raises(sinal.AccountNotFound) as raised:
            ledger.resolve_contact(missing, phone="+55 21 91234-5678", source="whatsapp")

        assert str(raised.value) == f"account {missing} does not exist"
        assert ledger.resolve_contact(account.id, phone="21 91234-5678") == (ana, False)
    assert count(database_url, "contacts") == 1
    assert count(database_url, "contact_identities") == 1
    assert count(database_url, "events") == 1  # ana's Contact Created


@pytest.mark.parametrize("existing", [False, True], ids=["new", "found"])
def test_upserting_a_contact_is_one_write_transaction_without_reading_the_account(
    database_url: str, existing: bool
) -> None:
    """`upsert_contact` (and `create_contact`) do not read the account apart: the contact's
    insert tells a missing one (`AccountNotFound`, same message), a contact found proves it.
    PostgreSQL: BEGIN, the identities, the contact, its identities, COMMIT (6 with the
    account's read); BEGIN, the identities, COMMIT when found."""
    with traced_ledger(database_url) as ledger:
        account = ledger.create_account("Loja")
        if existing:
            ana = ledger.create_contact(account.id, phone="+55 11 98765-4321")

        with statements(ledger) as sent:
            contact, is_new = ledger.upsert_contact(account.id, phone="(11) 98765-4321")

        assert is_new is not existing
        if existing:
            assert contact == ana
        assert not any("FROM accounts" in s for s in sent)
        if database_url.startswith("sqlite:"):  # the write transaction alone
            assert sent[0] == "BEGIN IMMEDIATE"
        elif existing:
            assert sent == ["BEGIN", "Bind", "COMMIT"]
        else:
            assert sent == ["BEGIN", "Bind", "Bind", "Bind", "COMMIT"]
        missing = uuid.uuid4()
        with pytest.raises(sinal.AccountNotFound) as raised:
            ledger.create_contact(missing, phone="+55 11 98765-4321")
        assert str(raised.value) == f"account {missing} does not exist"
    assert count(database_url, "contacts") == 1


def test_resolving_a_contact_fills_what_it_lacks_and_creates_one_once(
    ledger: Ledger, account: sinal.Account
) -> None:
    """A contact found that lacks an identity it is given gains it (Contact Updated); an
    unknown one is created once (Contact Created), and found after."""
    ana = ledger.create_contact(account.id, email="ana@example.com")

    found, is_new = ledger.resolve_contact(
        account.id, email="ana@example.com", phone="(11) 98765-4321", name="Ana",
        source="shopify", fill_missing=True,
    )  # fmt: skip
    assert (found.id, found.phone, found.name, is_new) == (ana.id, "+5511987654321", "Ana", False)
    assert _contact_updates(ledger, account) == [
        ("shopify", {"name": "Ana", "phone": "+5511987654321", "changed": ["name", "phone"]})
    ]
    bia, is_new = ledger.resolve_contact(account.id, phone="+55 21 91234-5678", source="whatsapp")
    assert is_new
    assert ledger.resolve_contact(account.id, phone="21 91234-5678") == (bia, False)
    created = EventQuery(account.id, metric_name=sinal.METRIC_CONTACT_CREATED)
    assert [e.contact_id for e in ledger.list_events(created)] == [bia.id]
    with pytest.raises(sinal.AccountNotFound):
        ledger.resolve_contact(uuid.uuid4(), phone="+55 21 91234-5678")


def test_concurrent_first_resolutions_of_a_phone_make_one_contact(database_url: str) -> None:
    """Eight threads finding no contact for a new phone at once: the read finds none for
    each, and the transaction each falls back to makes one contact, with one Contact
    Created, that all of them answer."""
    with sinal.connect(database_url) as ledger:
        account = ledger.create_account("Loja")
        start = threading.Barrier(8)
        answers: list[tuple[sinal.Contact, bool]] = []

        def resolve() -> None:
            start.wait()
            answers.append(
                ledger.resolve_contact(account.id, phone="+55 21 91234-5678", name="Bia",
                                       source="whatsapp", fill_missing=True)
            )  # fmt: skip

        threads = [threading.Thread(target=resolve) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        assert len({contact for contact, _ in answers}) == 1
        assert sorted(is_new for _, is_new in answers) == [False] * 7 + [True]
        created = EventQuery(account.id, metric_name=sinal.METRIC_CONTACT_CREATED)
        assert len(ledger.list_events(created)) == 1
        assert _contact_updates(ledger, account) == []
    assert count(database_url, "contacts") == 1


@pytest.mark.postgres
@pytest.mark.parametrize("entry", ["resolve_contact", "fill_contact"])
def test_a_fill_keeps_what_a_concurrent_writer_gave_the_contact(pg_url: str, entry: str) -> None:
    """PostgreSQL: a phone another transaction gives the contact while a fill that read it
    phoneless waits for its lock stays; the fill gives only what it still lacks."""
    given = {"phone": "+55 21 91234-5678", "name": "Ana"}
    waiting = (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, email="ana@example.com")

        def fill() -> sinal.Contact | None:
            if entry == "fill_contact":
                return ledger.fill_contact(account.id, ana.id, source="whatsapp", **given)
            found, _ = ledger.resolve_contact(
                account.id, email="ana@example.com", source="shopify", fill_missing=True, **given
            )
            return found

        answers: list[sinal.Contact | None] = []
        with psycopg.connect(pg_url) as writer:
            writer.execute(
                "UPDATE contacts SET phone = '+5511987654321' WHERE account_id = %s AND id = %s",
                (account.id, ana.id),
            )
            writer.execute(
                "INSERT INTO contact_identities (account_id, kind, value, contact_id) "
                "VALUES (%s, 'phone', '+5511987654321', %s)",
                (account.id, ana.id),
            )
            filler = threading.Thread(target=lambda: answers.append(fill()))
            filler.start()
            wait_until(lambda: not filler.is_alive() or sql(pg_url, waiting) != [(0,)])
            writer.commit()
        filler.join()

        [answer] = answers
        assert answer is not None
        assert (answer.phone, answer.name) == ("+5511987654321", "Ana")
        assert ledger.get_contact(account.id, ana.id) == answer
        assert [p for _, p in _contact_updates(ledger, account)] == [
            {"name": "Ana", "changed": ["name"]}
        ]
    phones = sql(pg_url, "SELECT value, contact_id FROM contact_identities WHERE kind = 'phone'")
    assert phones == [("+5511987654321", ana.id)]


def test_list_events_pages_newest_first(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    for day in range(5):
        ledger.emit_event(
            account_id=account.id,
            contact_id=contact.id,
            metric_name="Link Clicked",
            source="tracking",
            occurred_at=T0 + timedelta(days=day),
        )
    first = ledger.list_events(EventQuery(account.id, limit=2))
    cursor = (first[-1].occurred_at, first[-1].id)
    rest = ledger.list_events(EventQuery(account.id, before=cursor, limit=10))
    assert [e.occurred_at.day for e in first + rest] == [5, 4, 3, 2, 1]


def test_a_nul_in_a_text_filter_is_the_inputs_fault_never_an_outage(
    ledger: Ledger, account: sinal.Account
) -> None:
    query = EventQuery(account.id, metric_name="Order\x00Paid")
    if isinstance(ledger.store, PostgresStore):  # psycopg refuses to send it
        with pytest.raises(sinal.UnstorableText) as refused:
            ledger.list_events(query)
        assert not isinstance(refused.value, sinal.StoreUnavailable)
    else:  # SQLite compares it, and no stored name holds one
        assert ledger.list_events(query) == []


def test_rebuild_summaries_fixes_drift(
    ledger: Ledger, database_url: str, account: sinal.Account, contact: sinal.Contact
) -> None:
    ledger.emit(order_paid(account, contact))
    ledger.emit(order_paid(account, contact, source_id="2", metric_name="Order Placed"))
    sql(database_url, "UPDATE contact_metrics_summary SET event_count = 7 WHERE metric_name = ?",
        "Order Paid")  # fmt: skip
    sql(database_url, "DELETE FROM contact_metrics_summary WHERE metric_name = ?", "Order Placed")

    [report] = ledger.rebuild_summaries(account.id)
    assert (report.changed, report.inserted, report.deleted) == (1, 1, 0)
    assert [s.event_count for s in ledger.get_summary(account.id)] == [1, 1]
    [again] = ledger.rebuild_summaries()
    assert again.drift == 0


def test_async_ledger_does_not_block_the_loop(
    ledger: Ledger, account: sinal.Account, contact: sinal.Contact
) -> None:
    async def main() -> list[sinal.EmitResult]:
        aledger = sinal.AsyncLedger(ledger)
        return await asyncio.gather(
            *(aledger.emit(order_paid(account, contact, source_id=str(i % 3))) for i in range(9))
        )

    results = asyncio.run(main())
    assert sorted(r.status for r in results).count("created") == 3


def test_module_level_emit_event_uses_sinal_database_url(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SINAL_DATABASE_URL", database_url)
    monkeypatch.setattr(sinal, "_default", None)
    ledger = sinal.default_ledger()
    try:
        account = ledger.create_account("Default")
        contact = ledger.create_contact(account.id, email="x@example.com")
        result = sinal.emit_event(
            account_id=account.id, contact_id=contact.id, metric_name="Tag Added", source="api"
        )
        assert result.status == "created"
    finally:
        ledger.close()
        monkeypatch.setattr(sinal, "_default", None)


def test_module_level_emit_event_on_no_database_says_to_migrate(
    empty_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # sinal.emit_event in a fresh directory made an empty sinal.db and raised
    # SchemaViolation "no such table: rejections"
    monkeypatch.setattr(sinal, "_default", None)
    event = {"account_id": uuid.uuid4(), "contact_id": None, "metric_name": "X", "source": "api"}
    monkeypatch.setenv("SINAL_DATABASE_URL", empty_url)  # SQLite: a path with no file

    with pytest.raises((sinal.SchemaOutOfDate, sinal.ConfigurationError), match="sinal migrate"):
        sinal.emit_event(**event)
    assert sinal._default is None
    assert list(tmp_path.iterdir()) == []


def _mixed_batch(
    account: sinal.Account, contacts: list[sinal.Contact], extra_metric: str | None
) -> list[EmitEvent]:
    """400-odd events of every kind, deterministic: new, repeated (same and other
    payload), keyless, invalid, of an unknown contact or none, emitted by an automation (no
    outbox row), and a repeat whose first is rejected (in a batch, a repeat is answered like its
    first: an unknown contact comes first)."""
    rng = random.Random(7)
    metrics = [sinal.METRIC_ORDER_PAID, sinal.METRIC_MESSAGE_SENT, sinal.METRIC_LINK_CLICKED]
    if extra_metric is not None:
        metrics.append(extra_metric)
    events, retried = [], []
    for i in range(400):
        uid = rng.randrange(150)  # about one in three repeats an earlier id
        event = EmitEvent(
            account_id=account.id,
            contact_id=contacts[uid % len(contacts)].id,
            metric_name=metrics[uid % len(metrics)],
            properties={"n": uid, "variant": rng.randrange(2)},
            value=Decimal(uid) / 4,
            source="test",
            source_id=None if i % 17 == 0 else f"id-{uid}",
            occurred_at=T0 + timedelta(minutes=rng.randrange(-500, 500)),
        )
        if i % 13 == 0:
            event = replace(event, automation_execution_id=uuid.UUID(int=i))
        if i % 23 == 0:
            event = replace(event, currency="??")  # invalid
        elif i % 29 == 0:  # unknown contact; a valid repeat of it comes last
            event = replace(event, contact_id=uuid.uuid4(), source_id=f"lost-{i}")
            retried.append(replace(event, contact_id=contacts[0].id))
        elif i % 31 == 0:  # no contact at all
            event = replace(event, contact_id=None, source_id=f"anonymous-{i}")
        events.append(event)
    return events + retried


def _answers(results: list[sinal.EmitResult]) -> list[tuple[object, ...]]:
    """What a result says, with event ids replaced by the index of their first answer."""
    first: dict[object, int] = {}
    return [
        (
            r.status, r.reason, r.differs, r.unique_event_id,
            None if r.event_id is None else first.setdefault(r.event_id, i),
        )
        for i, r in enumerate(results)
    ]  # fmt: skip


@pytest.mark.parametrize("new_metric", [False, True], ids=["known-metrics", "new-metric"])
def test_a_batch_of_many_chunks_answers_like_one_event_at_a_time(
    ledger: Ledger, database_url: str, monkeypatch: pytest.MonkeyPatch, new_metric: bool
) -> None:
    """emit_many sends a big batch in chunks (on PostgreSQL, its new events by COPY); its
    answers, rows, metrics and summaries match emitting each event in turn."""
    copied: list[object] = []  # what the COPY path answered (nothing when it failed)
    if not database_url.startswith("sqlite:"):
        from sinal.store import postgres

        real = postgres._record_copied

        def record_copied(*args: Any) -> Any:
            copied.append(real(*args))
            return copied[-1]

        monkeypatch.setattr(postgres, "_record_copied", record_copied)
    tenants = []
    for name in ("Lote", "Um a um"):
        account = ledger.create_account(name)
        contacts = [ledger.create_contact(account.id, external_id=f"c{i}") for i in range(12)]
        # Earlier events: the batch repeats some of them, and the metrics become known.
        ledger.emit_many(_mixed_batch(account, contacts, None)[:40])
        tenants.append((account, contacts))
    extra = "Quiz Answered" if new_metric else None

    batched = ledger.emit_many(_mixed_batch(*tenants[0], extra))
    in_turn = []
    for event in _mixed_batch(*tenants[1], extra):
        try:
            in_turn.append(ledger.emit(event))
        except InvalidEvent as exc:
            in_turn.append(sinal.EmitResult("rejected", reason="invalid", errors=exc.errors))

    assert _answers(batched) == _answers(in_turn)
    assert {r.status for r in batched} == {"created", "duplicate", "rejected"}
    for table in ("events", "outbox", "rejections"):
        statement = f"SELECT count(*) FROM {table} WHERE account_id = ?"
        counts = [sql(database_url, statement, str(account.id)) for account, _ in tenants]
        assert counts[0] == counts[1], table
    [(stored, automated)] = sql(
        database_url,
        "SELECT count(*), count(automation_execution_id) FROM events WHERE account_id = ?",
        str(tenants[0][0].id),
    )
    outboxed = sql(
        database_url, "SELECT count(*) FROM outbox WHERE account_id = ?", str(tenants[0][0].id)
    )
    assert automated > 0
    assert outboxed == [(stored - automated,)]
    metrics = [
        sql(
            database_url,
            "SELECT name, display_name, category, is_system FROM metrics "
            "WHERE account_id = ? ORDER BY name",
            str(account.id),
        )
        for account, _ in tenants
    ]
    assert metrics[0] == metrics[1]
    assert (extra in {m[0] for m in metrics[0]}) is new_metric

    def summary(account: sinal.Account, contacts: list[sinal.Contact]) -> set[tuple[object, ...]]:
        index = {c.id: i for i, c in enumerate(contacts)}
        return {
            (index[s.contact_id], s.metric_name, s.event_count, s.total_value,
             s.first_event_at, s.last_event_at)
            for s in ledger.get_summary(account.id)
        }  # fmt: skip

    assert summary(*tenants[0]) == summary(*tenants[1])
    [report] = ledger.rebuild_summaries(tenants[0][0].id)
    assert not report.drift
    if not database_url.startswith("sqlite:"):
        assert copied


class _ShownTooEarly:
    """A real store whose `record_chunks`, before it answers, shows the ledger outcomes
    that are not the ones it returns: what the ledger sees when a batch it was shown early
    (while PostgreSQL committed) failed to commit and was redone."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.shown = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def record_chunks(
        self, chunks: Any, keys: Any, early: Any = None, settle: Any = None
    ) -> list[Outcome]:
        outcomes: list[Outcome] = self.store.record_chunks(chunks, keys, early, settle)
        assert early is not None
        early([Outcome("rejected", reason="contact_not_found") for _ in outcomes])
        self.shown += 1
        return outcomes


def test_a_batch_is_answered_from_the_outcomes_the_store_returns(
    ledger: Ledger, database_url: str
) -> None:
    """The store may show emit_many a batch's outcomes while the transaction commits (the
    answers are built meanwhile); when it then returns others (the batch redone), the
    answers follow the returned ones, repeats and their retries included."""
    shown = _ShownTooEarly(ledger.store)
    early = Ledger(shown)
    tenants = []
    for name in ("Mostrado cedo", "Direto"):
        account = ledger.create_account(name)
        contacts = [ledger.create_contact(account.id, external_id=f"c{i}") for i in range(12)]
        tenants.append((account, contacts))

    answered = early.emit_many(_mixed_batch(*tenants[0], None))
    direct = ledger.emit_many(_mixed_batch(*tenants[1], None))

    assert shown.shown == 1
    assert _answers(answered) == _answers(direct)
    assert {r.status for r in answered} == {"created", "duplicate", "rejected"}


@pytest.mark.postgres
def test_a_streamed_batch_is_shown_to_the_ledger_while_it_commits(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the COPY path hands the ledger its outcomes inside the pipeline that
    carries the closing statements and the COMMIT, before the commit's answer is read:
    the events are written, the transaction is still open on the server's side of the
    pipeline, and the answers returned are the outcomes shown."""
    from sinal.store import postgres

    seen: list[tuple[list[Outcome], str]] = []
    real = postgres._record_copied

    def spied(conn: Any, keys: Any, chunks: Any, early: Any, settle: Any) -> list[Outcome]:
        def look(outcomes: list[Outcome]) -> None:
            seen.append((outcomes, TransactionStatus(conn.pgconn.transaction_status).name))
            early(outcomes)

        return real(conn, keys, chunks, look, settle)

    monkeypatch.setattr(postgres, "_record_copied", spied)
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        batch = [order_paid(account, contact, source_id=str(i % 150)) for i in range(200)]
        results = ledger.emit_many(batch)

    [(outcomes, status)] = seen
    assert status == "ACTIVE"  # the pipeline's results, the COMMIT's included, not yet read
    assert [o.kind for o in outcomes] == ["created"] * 150
    assert [r.status for r in results] == ["created"] * 150 + ["duplicate"] * 50
    assert {r.event_id for r in results} == {o.event_id for o in outcomes}
    assert count(pg_url, "events") == count(pg_url, "outbox") == 150


@pytest.mark.postgres
def test_a_streamed_batch_builds_its_closing_statements_before_its_copy_ends(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outbox's, summaries' and metrics' parameters are built once the COPY's last rows
    are sent and before the COPY ends, so PostgreSQL inserts those rows meanwhile: seen
    from another connection, the COPY is still in progress then."""
    from sinal.store import postgres

    seen: list[int] = []
    real = postgres._summary_params

    def watched(created: Any) -> Any:
        [(copies,)] = sql(pg_url, "SELECT count(*) FROM pg_stat_progress_copy")
        seen.append(copies)
        return real(created)

    monkeypatch.setattr(postgres, "_summary_params", watched)
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        results = ledger.emit_many(
            [order_paid(account, contact, source_id=str(i)) for i in range(300)]
        )

    assert [r.status for r in results] == ["created"] * 300
    assert seen == [1]  # one COPY, not yet ended
    assert count(pg_url, "events") == count(pg_url, "outbox") == 300


@pytest.mark.postgres
@pytest.mark.parametrize("n", [0, 1, 2, 500])
def test_the_stores_own_array_dumpers_send_what_psycopg_would(pg_url: str, n: int) -> None:
    """The uuid[] and text[] parameters of a streamed batch are written by sinal's own
    binary dumpers: PostgreSQL reads them as the very arrays psycopg's list dumper sends,
    element for element and in order, multi-byte text and the empty array included."""
    from sinal.store import postgres

    ids = [uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), *(uuid.uuid4() for _ in range(n))][:n]
    texts = ["", "São Paulo ✓ 🎉", "x" * 10_000, *(f"whatsapp:message:wamid.{i}" for i in range(n))]
    texts = texts[:n]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        postgres._configure(conn)
        ours = (postgres._UuidArray(ids), postgres._TextArray(texts))
        row = conn.execute(
            "SELECT %b::uuid[], %b::text[], %b::uuid[] = %b::uuid[], %b::text[] = %b::text[], "
            "cardinality(%b::uuid[]), array_ndims(%b::text[])",
            (*ours, ours[0], ids, ours[1], texts, *ours),
        ).fetchone()

    assert row == (ids, texts, True, True, n, 1 if n else None)
    # ... and they are the ones used, not psycopg's list dumper for a list subclass.
    with psycopg.connect(pg_url) as conn:
        postgres._configure(conn)
        adapt = Transformer(conn)
        assert isinstance(adapt.get_dumper(ours[0], PyFormat.BINARY), postgres._UuidArrayDumper)
        assert isinstance(adapt.get_dumper(ours[1], PyFormat.BINARY), postgres._TextArrayDumper)


@pytest.mark.postgres
@pytest.mark.parametrize("nulls", [[0], [1], [2], [0, 1, 2]])
def test_the_stores_own_array_dumpers_send_nulls_as_psycopg_would(
    pg_url: str, nulls: list[int]
) -> None:
    """A group commit's nullable uuid and text columns (contact_id, source_id, ...) go by
    sinal's own dumpers too: a None, first, inside, last or everywhere, is read as NULL
    where psycopg's list dumper puts one, and the others keep their places."""
    from sinal.store import postgres

    ids: list[uuid.UUID | None] = [uuid.uuid4(), uuid.uuid4(), uuid.uuid4()]
    texts: list[str | None] = ["shopify", "São Paulo ✓", ""]
    for i in nulls:
        ids[i] = texts[i] = None
    with psycopg.connect(pg_url, autocommit=True) as conn:
        postgres._configure(conn)
        # typed without None (the arrays of ids and keys never hold one), yet dumped as NULL
        ours = (postgres._UuidArray(ids), postgres._TextArray(texts))  # type: ignore[arg-type]
        row = conn.execute(
            "SELECT %b::uuid[], %b::text[], %b::uuid[] IS NOT DISTINCT FROM %b::uuid[], "
            "%b::text[] IS NOT DISTINCT FROM %b::text[]",
            (*ours, ours[0], ids, ours[1], texts),
        ).fetchone()

    assert row == (ids, texts, True, True)


@pytest.mark.postgres
def test_a_streamed_batch_that_fails_as_its_copy_ends_leaves_nothing(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should building the closing statements fail while the COPY ends, the COPY is
    abandoned and the transaction rolled back: nothing of the batch stays, the error
    reaches the caller, and the ledger records the batch next time."""
    from sinal.store import postgres

    real = postgres._summary_params

    def broken(created: Any) -> Any:
        raise RuntimeError("summaries (on purpose)")

    monkeypatch.setattr(postgres, "_summary_params", broken)
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        batch = [order_paid(account, contact, source_id=str(i)) for i in range(200)]
        with pytest.raises(RuntimeError, match="on purpose"):
            ledger.emit_many(batch)
        assert count(pg_url, "events") == count(pg_url, "outbox") == 0
        assert count(pg_url, "contact_metrics_summary") == 0
        monkeypatch.setattr(postgres, "_summary_params", real)
        results = ledger.emit_many(batch)

    assert [r.status for r in results] == ["created"] * 200
    assert count(pg_url, "events") == count(pg_url, "outbox") == 200


@pytest.mark.postgres
def test_a_streamed_batch_survives_a_metric_deleted_by_hand(pg_url: str) -> None:
    """A metric deleted behind the ledger's back is created again by the next big batch
    that names it, with everything else the batch records."""
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        ledger.emit_many([order_paid(account, contact, source_id="0")])
        for table in ("outbox", "contact_metrics_summary", "events", "metrics"):
            sql(pg_url, f"DELETE FROM {table} WHERE account_id = ?", str(account.id))

        results = ledger.emit_many(
            [order_paid(account, contact, source_id=str(i)) for i in range(200)]
        )

    assert {r.status for r in results} == {"created"}
    assert count(pg_url, "events") == 200
    assert sql(pg_url, "SELECT name FROM metrics") == [(sinal.METRIC_ORDER_PAID,)]


@pytest.mark.postgres
def test_a_streamed_batchs_lookups_are_planned_for_each_batch(pg_url: str) -> None:
    """The lookups of a streamed batch (its stored keys, its missing contacts) are never
    kept as prepared statements, whose plan would outlive the table's statistics: planned
    while `events` was empty after a purge and a VACUUM, it read the whole table for each
    key of every later batch, until the next ANALYZE. psycopg prepares what runs five
    times, as the batch's closing statements show; the answers stay right throughout."""
    store = PostgresStore(pg_url, max_size=1)  # one connection: the one asked below
    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        stranger = uuid.uuid4()  # no contact of the account

        def batch(first: int) -> list[EmitEvent]:
            events = [order_paid(account, contact, source_id=str(first + i)) for i in range(80)]
            events[-1] = order_paid(account, contact, source_id=str(first))  # a repeat
            events[-2] = order_paid(account, contact, contact_id=stranger, source_id="x")
            return events

        answers = [ledger.emit_many(batch(100 * n)) for n in range(8)]
        for table in ("outbox", "contact_metrics_summary", "events", "rejections"):
            sql(pg_url, f"DELETE FROM {table}")
        sql(pg_url, "VACUUM events")
        answers += [ledger.emit_many(batch(100 * n)) for n in range(8)]
        with store._pool.connection() as conn:
            kept = [r[0] for r in conn.execute("SELECT statement FROM pg_prepared_statements")]

    assert any("INSERT INTO contact_metrics_summary" in s for s in kept)
    assert not [s for s in kept if "WITH ORDINALITY AS k(" in s]
    for results in answers:
        assert [r.status for r in results[:78]] == ["created"] * 78
        assert (results[78].status, results[78].reason) == ("rejected", "contact_not_found")
        assert (results[79].status, results[79].event_id) == ("duplicate", results[0].event_id)
    assert count(pg_url, "events") == 8 * 78


@pytest.mark.postgres
@pytest.mark.parametrize("where", ["copy", "tail"])
def test_a_streamed_batch_aborted_by_a_deadlock_is_redone_whole(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """PostgreSQL aborts a big batch's transaction (a deadlock, raised here on purpose at
    the end of the COPY or in the closing statements): nothing of it stays, and the batch
    is recorded again through the one-statement path, which retries."""
    from sinal.store import postgres

    sql(
        pg_url,
        "CREATE FUNCTION sinal_test_deadlock(VARIADIC anyarray) RETURNS boolean "
        "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'deadlock (on purpose)' "
        "USING ERRCODE = 'deadlock_detected'; END $$",
    )
    if where == "copy":  # the first statement to insert events fails, after its rows went in
        sql(pg_url, "CREATE SEQUENCE sinal_test_inserts")
        sql(
            pg_url,
            "CREATE FUNCTION sinal_test_first_fails() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN IF nextval('sinal_test_inserts') = 1 THEN PERFORM sinal_test_deadlock(1); "
            "END IF; RETURN NULL; END $$",
        )
        sql(
            pg_url,
            "CREATE TRIGGER sinal_test_first_fails AFTER INSERT ON events "
            "FOR EACH STATEMENT EXECUTE FUNCTION sinal_test_first_fails()",
        )
    else:  # the metrics' statement, after the COPY, the outbox and the summaries
        monkeypatch.setattr(
            postgres,
            "_METRICS_SQL",
            "SELECT sinal_test_deadlock(1) FROM (SELECT %b::text[], %b::text[], %b::text[], "
            "%b::text[], %b::text[], %b::text[], %b::text[]) AS params",
        )
        monkeypatch.setattr(
            postgres,
            "_metric_params",
            lambda created: tuple([str(len(created))] for _ in range(7)),
        )
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contacts = [ledger.create_contact(account.id, external_id=f"c{i}") for i in range(5)]
        batch = [
            order_paid(account, contacts[i % 5], source_id=str(i), value=Decimal(i))
            for i in range(300)
        ]
        results = ledger.emit_many(batch)

    assert [r.status for r in results] == ["created"] * 300
    assert count(pg_url, "events") == count(pg_url, "outbox") == 300
    assert sql(
        pg_url, "SELECT sum(event_count), sum(total_value) FROM contact_metrics_summary"
    ) == [(300, sum(range(300)))]
    assert sql(pg_url, "SELECT name FROM metrics") == [(sinal.METRIC_ORDER_PAID,)]
    if where == "copy":  # the COPY's statement failed, the record statement's went through
        assert sql(pg_url, "SELECT last_value FROM sinal_test_inserts") == [(2,)]


@pytest.mark.postgres
def test_a_streamed_batch_holds_each_key_as_soon_as_postgresql_reads_its_row(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A big batch's COPY inserts each row as PostgreSQL reads it, while the ledger still
    validates the rows after it. (PostgreSQL would otherwise keep a binary COPY's rows and
    insert them all at its end, the client idle meanwhile: bench/HISTORY.md.) Seen from
    another transaction: once PostgreSQL has read the batch's first row, and before the
    ledger hands over its second chunk, an insert of that row's key waits on the batch."""
    from sinal.events import prepare
    from sinal.store import postgres
    from sinal.store.postgres import _record_in

    copying = (
        "SELECT tuples_processed FROM pg_stat_progress_copy WHERE datname = current_database()"
    )
    probes: list[str] = []
    with sinal.connect(pg_url) as ledger, psycopg.connect(pg_url) as other:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        note = "x" * 500  # the first chunk's rows fill more than psycopg's 32 kB buffer
        batch = [
            order_paid(account, contact, source_id=f"{i:03d}", properties={"note": note})
            for i in range(300)
        ]  # the first row copied is the smallest key's, batch[0]'s

        def probe() -> str:
            wait_until(lambda: (sql(pg_url, copying) or [(0,)])[0][0] >= 1, timeout=5)
            other.execute("SET lock_timeout = '1s'")
            try:
                _record_in(other, [prepare(batch[0], ledger.clock())])
            except psycopg.errors.LockNotAvailable:
                return "waited"
            finally:
                other.rollback()
            return "inserted"

        real = postgres._pulling

        def pulling(chunks: Any, pulled: Any) -> Any:
            for n, chunk in enumerate(real(chunks, pulled)):
                if n == 1:  # the first chunk's rows are written, the COPY asks for more
                    probes.append(probe())
                yield chunk

        monkeypatch.setattr(postgres, "_pulling", pulling)
        results = ledger.emit_many(batch)

    assert probes == ["waited"]
    assert [r.status for r in results] == ["created"] * 300
    assert count(pg_url, "events") == count(pg_url, "outbox") == 300


@pytest.mark.postgres
@pytest.mark.parametrize("setting", ["as migrated", "without it"])
def test_the_one_event_function_finds_rows_by_index_on_tables_that_look_tiny(
    pg_url: str, setting: str
) -> None:
    """`sinal_record_event`'s statements are planned once per session and the plans kept:
    planned on tables the planner thinks hold a page (a new install), its summary update
    and metric lookup became sequential scans, and stayed so as the tables grew. The
    function prices sequential scans out (migration 0011); without that setting they come
    back, which shows this test sees them (PostgreSQL's `auto_explain`, nested statements,
    its plans sent to the client)."""
    from sinal.events import prepare
    from sinal.store.postgres import _record_in

    if setting == "without it":
        [(signature,)] = sql(
            pg_url, "SELECT oid::regprocedure::text FROM pg_proc WHERE proname = ?",
            "sinal_record_event",
        )  # fmt: skip
        sql(pg_url, f"ALTER FUNCTION {signature} RESET enable_seqscan")
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contacts = [ledger.create_contact(account.id, external_id=f"c{i}") for i in range(9)]
        ledger.emit(order_paid(account, contacts[0], source_id="0"))
        now = ledger.clock()
    sql(pg_url, "VACUUM ANALYZE contacts, metrics, contact_metrics_summary")
    plans: list[str] = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
        for statement in (
            "LOAD 'auto_explain'",
            "SET auto_explain.log_min_duration = 0",
            "SET auto_explain.log_nested_statements = on",
            "SET client_min_messages = log",
        ):
            conn.execute(statement)
        # Past PL/pgSQL's five custom plans (the generic one is kept), each event its
        # contact's first: the summary row is created, so the metric is looked for too.
        for i in range(1, 9):
            event = order_paid(account, contacts[i], source_id=str(i))
            _record_in(conn, [prepare(event, now)])

    explained = "\n".join(plans)
    assert "Update on contact_metrics_summary" in explained
    seq_scans = {
        table
        for table in ("contacts", "metrics", "contact_metrics_summary", "events")
        if f"Seq Scan on {table}" in explained
    }
    if setting == "as migrated":
        assert seq_scans == set()
    else:
        assert {"metrics", "contact_metrics_summary"} <= seq_scans
    assert count(pg_url, "events") == 9


@pytest.mark.postgres
def test_one_event_calls_keep_a_cursor_that_outlives_errors(pg_url: str) -> None:
    """Each pooled connection keeps the cursor of the one-event statement, for the calls
    that go through psycopg (here: after psycopg's `DEALLOCATE ALL` took the directly run
    statement away): later events go through it, also after a statement on it failed,
    and a closed one is made again."""
    from sinal.store.postgres import PostgresStore

    store = PostgresStore(pg_url, max_size=1)
    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        first = ledger.emit(order_paid(account, contact, source_id="1"))
        with store._pool.connection() as conn:
            kept = conn.one_event_cursor()
            with pytest.raises(psycopg.errors.DivisionByZero):
                kept.execute("SELECT 1 / 0")
            conn.execute("DEALLOCATE ALL")
        second = ledger.emit(order_paid(account, contact, source_id="2"))
        with store._pool.connection() as conn:
            assert conn.one_event_cursor() is kept
            assert kept.description is not None  # the record's answer, read through it
            assert [column.name for column in kept.description][1:3] == ["created", "known"]
            kept.close()
        again = ledger.emit(order_paid(account, contact, source_id="2"))
        unknown = ledger.emit(order_paid(account, contact, contact_id=uuid.uuid4()))
        with store._pool.connection() as conn:
            assert conn.one_event_cursor() is not kept

    assert [first.status, second.status, again.status] == ["created", "created", "duplicate"]
    assert again.event_id == second.event_id
    assert (unknown.status, unknown.reason) == ("rejected", "contact_not_found")
    assert count(pg_url, "events") == 2
    assert count(pg_url, "rejections") == 1


def _prepared_directly(conn: psycopg.Connection[Any]) -> bool:
    return bool(
        conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name = 'sinal_record_event'"
        ).fetchone()[0]  # type: ignore[index]
    )


@pytest.mark.postgres
def test_one_event_goes_through_libpq_directly_and_back_to_psycopg_when_it_cannot(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A lone event on an idle pooled connection runs the function prepared by name, its
    answers the same as through psycopg (created, a duplicate with its stored payload, an
    unknown contact); inside a transaction, or when the direct call fails, psycopg runs
    it, and what it raises is what the caller gets."""
    from sinal.events import prepare
    from sinal.store import postgres
    from sinal.store.postgres import PostgresStore

    direct: list[bool] = []
    real = postgres._PooledConnection.record_one

    def spy(self: postgres._PooledConnection, params: Any) -> Any:
        answer = real(self, params)
        direct.append(answer is not None)
        return answer

    monkeypatch.setattr(postgres._PooledConnection, "record_one", spy)
    store = PostgresStore(pg_url, max_size=1)
    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        created = ledger.emit(order_paid(account, contact))
        same = ledger.emit(order_paid(account, contact))
        other = ledger.emit(order_paid(account, contact, properties={"order_id": "1002"}))
        lost = ledger.emit(order_paid(account, contact, source_id="9", contact_id=uuid.uuid4()))
        assert direct == [True, True, True, True]
        with store._pool.connection() as conn:
            assert _prepared_directly(conn)

        # In the caller's transaction: through psycopg (a failed call would abort it).
        with store._conn() as conn, conn.transaction():
            [outcome] = postgres._record_in(
                conn, [prepare(order_paid(account, contact, source_id="2"), ledger.clock())]
            )
        assert outcome.kind == "created"
        assert direct[-1] is False

        # A failing call: psycopg runs it again, and PostgreSQL's refusal of its data
        # makes it rejected, "refused" (`Store.record`), with the database's reason logged.
        sql(pg_url, "ALTER TABLE events ADD CONSTRAINT no_more CHECK (source <> 'x') NOT VALID")
        with caplog.at_level(logging.WARNING, logger="sinal.store"):
            refused = ledger.emit(order_paid(account, contact, source="x", source_id="3"))
        assert (refused.status, refused.reason) == ("rejected", "refused")
        assert "no_more" in caplog.text
        assert direct[-1] is False
        sql(pg_url, "ALTER TABLE events DROP CONSTRAINT no_more")
        after = ledger.emit(order_paid(account, contact, source_id="4"))
        assert direct[-1] is True

    assert (created.status, same.status, other.status) == ("created", "duplicate", "duplicate")
    assert same.event_id == other.event_id == created.event_id
    assert (same.differs, other.differs) == (False, True)
    assert (lost.status, lost.reason) == ("rejected", "contact_not_found")
    assert after.status == "created"
    assert count(pg_url, "events") == 3
    assert count(pg_url, "outbox") == 3


@pytest.mark.postgres
def test_a_checked_out_connection_goes_back_clean_and_fails_with_sinals_errors(
    pg_url: str,
) -> None:
    """The store's checkout (the pool's `connection()` without its generators): psycopg's
    errors and the pool's (a timeout, a closed pool) come out as sinal's, and a
    connection given back inside a transaction, or after a failed statement, is rolled
    back before its next use."""
    from sinal.errors import DuplicateKey, StoreError
    from sinal.store.postgres import PostgresStore

    store = PostgresStore(pg_url, max_size=1)

    def run(statement: str, *params: object) -> None:
        with store._conn() as conn:
            conn.execute(statement, params)

    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        with store._conn() as conn:
            conn.execute("BEGIN")
            conn.execute("UPDATE accounts SET name = 'abandoned' WHERE id = %s", (account.id,))
        with store._conn() as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        copy_account = (
            "INSERT INTO accounts (id, name, timezone, created_at) "
            "SELECT id, name, timezone, created_at FROM accounts WHERE id = %s"
        )
        with pytest.raises(DuplicateKey) as duplicate:
            run(copy_account, account.id)
        assert isinstance(duplicate.value.__cause__, psycopg.errors.UniqueViolation)
        with pytest.raises(StoreError, match="division by zero"):
            run("SELECT 1 / 0")
        store._pool.timeout = 0.2
        with store._conn(), pytest.raises(StoreError, match="couldn't get a connection"):
            run("SELECT 1")  # the pool's one connection is taken
        assert ledger.get_account(account.id).name == "Loja"  # type: ignore[union-attr]
        contact = ledger.create_contact(account.id, external_id="c1")
        assert ledger.emit(order_paid(account, contact)).status == "created"
        store._pool.close()  # as by another thread, after this one found the pool open
        with pytest.raises(StoreError, match="closed"):
            run("SELECT 1")


def test_the_record_statements_stay_within_psycopgs_cache_limit() -> None:
    """Longer than 4,096 characters, psycopg converts a query's placeholders anew on every
    call (~50 µs for these): the statements are kept under that limit."""
    from sinal.store import postgres

    statements = (postgres._RECORD_SQL, postgres._RECORD_ONE_SQL, postgres._RECORD_EVENT_SQL)
    for statement in statements:
        assert len(statement) <= 4096


@pytest.fixture
def looked_up(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the PostgreSQL store's second queries for duplicates' payloads."""
    from sinal.store import postgres

    sizes: list[int] = []
    real = postgres._stored_payloads

    def stored_payloads(conn: Any, events: Any) -> Any:
        sizes.append(len(events))
        return real(conn, events)

    monkeypatch.setattr(postgres, "_stored_payloads", stored_payloads)
    return sizes


@pytest.mark.postgres
def test_a_duplicate_is_answered_by_the_record_statement_alone(
    pg_url: str, looked_up: list[int]
) -> None:
    """The record statement returns a duplicate's stored event and payload: no second
    query when the stored event was committed before the statement began."""
    with sinal.connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        first = ledger.emit(order_paid(account, contact))
        again = ledger.emit(order_paid(account, contact, value=Decimal("1.00")))
        batch = ledger.emit_many(
            [order_paid(account, contact), order_paid(account, contact, source_id="1002")]
        )

    assert (again.status, again.event_id, again.differs) == ("duplicate", first.event_id, True)
    assert [(r.status, r.differs) for r in batch] == [("duplicate", False), ("created", None)]
    assert batch[0].event_id == first.event_id
    assert not any(looked_up)


@pytest.mark.postgres
@pytest.mark.parametrize("theirs", ["committed", "rolled back"])
@pytest.mark.parametrize("size", [1, 2, 200], ids=["one event", "in a batch", "by COPY"])
def test_a_key_another_transaction_holds_while_the_insert_waits(
    pg_url: str, looked_up: list[int], size: int, theirs: str
) -> None:
    """A concurrent transaction has inserted the same unique id, not committed, so the
    insert waits on it. When it commits, the answer is a duplicate of its event: one event
    (`sinal_record_event`) reads the stored event in a statement of its own, which sees
    that commit; a small batch's record statement does not, and the ledger reads the
    stored event with a second query; a big batch's COPY fails on the key, and the batch
    is redone by the record statement, which then sees it. When it rolls back, the event
    is stored. Either way the rest of the batch is stored."""
    import psycopg

    from sinal.events import prepare
    from sinal.store.postgres import _record_in

    with sinal.connect(pg_url) as ledger, psycopg.connect(pg_url) as other:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        event = order_paid(account, contact)
        [held] = _record_in(other, [prepare(event, ledger.clock())])  # not committed yet
        answers: list[sinal.EmitResult] = []
        batch = [event] + [order_paid(account, contact, source_id=f"x{i}") for i in range(1, size)]
        racer = threading.Thread(target=lambda: answers.extend(ledger.emit_many(batch)))
        racer.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        wait_until(lambda: sql(pg_url, waiting)[0][0], timeout=5)
        assert racer.is_alive()  # waiting on the key
        other.commit() if theirs == "committed" else other.rollback()
        racer.join(10)

    answer = answers[0]
    if theirs == "committed":
        assert (answer.status, answer.event_id, answer.differs) == (
            "duplicate", held.event_id, False,
        )  # fmt: skip
        assert (1 in looked_up) is (size == 2)  # a second query, for the one event
    else:
        assert (answer.status, answer.differs) == ("created", None)
        assert answer.event_id != held.event_id
    assert [a.status for a in answers[1:]] == ["created"] * (size - 1)
    assert count(pg_url, "events") == len(batch)
    assert sql(pg_url, "SELECT sum(event_count) FROM contact_metrics_summary") == [(size,)]


def test_sqlite_writers_queue_on_the_lock_file(sqlite_url: str) -> None:
    """Every SQLite writer, of any process or thread, waits for `<database>-lock` before
    it takes SQLite's write lock (no sleeping and polling in SQLite's busy handler)."""
    import fcntl

    path = sqlite_url.removeprefix("sqlite:///")
    with sinal.connect(sqlite_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        with open(f"{path}-lock", "a") as held:  # another process's writer, say
            fcntl.flock(held, fcntl.LOCK_EX)
            answers: list[sinal.EmitResult] = []

            def emit() -> None:
                answers.append(ledger.emit(order_paid(account, contact)))

            writer = threading.Thread(target=emit)
            writer.start()
            writer.join(0.5)
            assert writer.is_alive()  # waiting for the lock file
            assert not answers
            fcntl.flock(held, fcntl.LOCK_UN)
        writer.join(10)

    assert [a.status for a in answers] == ["created"]


def test_a_sqlite_writer_waits_for_its_turn_at_most_the_busy_timeout(sqlite_url: str) -> None:
    """A writer whose turn does not come within the busy timeout gets `StoreError` (the
    API answers 503, retry) and writes nothing; its next attempts wait on the same waiting
    thread, not one more each; once the lock file is free, writes go through, and the
    abandoned wait gives back the lock it got in the meantime; its thread is kept for the
    next wait, and ends with the store."""
    import fcntl

    from sinal.store.sqlite import SQLiteStore

    def lock_waits() -> int:
        return sum(t.name == "sinal-sqlite-lock" for t in threading.enumerate())

    path = sqlite_url.removeprefix("sqlite:///")
    store = SQLiteStore(path, busy_timeout=0.2)
    with Ledger(store) as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        errors: list[Exception] = []

        def emit_thrice() -> None:
            for _ in range(3):
                try:
                    ledger.emit(order_paid(account, contact))
                except sinal.StoreError as exc:
                    errors.append(exc)

        waits_before = lock_waits()
        with open(f"{path}-lock", "a") as held:  # a writer of another process, stuck
            fcntl.flock(held, fcntl.LOCK_EX)
            writer = threading.Thread(target=emit_thrice, daemon=True)
            writer.start()
            writer.join(10)
            assert not writer.is_alive()  # it stopped waiting
            assert lock_waits() == waits_before + 1  # one waiting thread for three attempts
            fcntl.flock(held, fcntl.LOCK_UN)
        wait_until(lambda: store._waiters._idle)  # the abandoned wait took the lock, gave it back
        answer = ledger.emit(order_paid(account, contact))
        assert lock_waits() == waits_before + 1  # kept for the next wait
    wait_until(lambda: lock_waits() == waits_before, timeout=5)  # ended by the close

    with open(f"{path}-lock", "a") as later:  # would wait forever if a wait kept the lock
        taker = threading.Thread(target=fcntl.flock, args=(later, fcntl.LOCK_EX), daemon=True)
        taker.start()
        taker.join(10)
        assert not taker.is_alive()
    assert [str(e) for e in errors] == [
        f"the database is busy: no writer's turn within 0.2 s (another writer holds {path}-lock)"
    ] * 3
    assert all(isinstance(e, sinal.StoreUnavailable) for e in errors)  # worth a retry
    assert answer.status == "created"
    assert count(sqlite_url, "events") == 1
    assert count(sqlite_url, "rejections") == 0


def test_sqlite_threads_of_one_process_wait_for_the_lock_file_one_at_a_time(
    sqlite_url: str,
) -> None:
    """While another process holds `<database>-lock`, the threads of this one queue on a
    lock of the process: one of them waits for the file (in one waiting thread), not
    each in a thread of its own; once the file is free, every write goes through."""
    import fcntl

    def lock_waits() -> int:
        return sum(t.name == "sinal-sqlite-lock" for t in threading.enumerate())

    path = sqlite_url.removeprefix("sqlite:///")
    with sinal.connect(sqlite_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        store = ledger.store
        waits_before = lock_waits()
        answers: list[sinal.EmitResult] = []
        with open(f"{path}-lock", "a") as held:  # another process's writer, say
            fcntl.flock(held, fcntl.LOCK_EX)
            writers = [
                threading.Thread(
                    target=lambda n=n: answers.append(
                        ledger.emit(order_paid(account, contact, source_id=str(n)))
                    )
                )
                for n in range(8)
            ]
            for writer in writers:
                writer.start()
            wait_until(lambda: store._users == 8)  # type: ignore[attr-defined]
            time.sleep(0.2)  # time enough for any of them to start a waiting thread
            assert lock_waits() == waits_before + 1
            assert not answers
            fcntl.flock(held, fcntl.LOCK_UN)
        for writer in writers:
            writer.join(10)

    assert sorted(a.status for a in answers) == ["created"] * 8
    assert count(sqlite_url, "events") == 8


def test_sqlite_writers_of_one_process_take_turns_in_the_order_they_came() -> None:
    """The process's turn goes to the thread that has waited longest: a thread that
    writes back to back (`rebuild-summaries`, chunk after chunk) cannot take it again
    while another waits, nor can a thread that asks later; one that gives up leaves the
    line."""
    from sinal.store.sqlite import _Turns

    turns = _Turns()
    order: list[str] = []

    def take(name: str, timeout: float = 10) -> None:
        if turns.acquire(timeout):
            order.append(name)
            turns.release()
        else:
            order.append(f"{name} gave up")

    assert turns.acquire(1)  # the writer writing back to back
    first = threading.Thread(target=take, args=("first",))
    first.start()
    wait_until(lambda: len(turns._waiting) == 1)
    quitter = threading.Thread(target=take, args=("quitter", 0.05))
    quitter.start()
    quitter.join(10)
    second = threading.Thread(target=take, args=("second",))
    second.start()
    wait_until(lambda: len(turns._waiting) == 2)
    turns.release()
    assert turns.acquire(10)  # at once again: after the two that wait
    order.append("again")
    turns.release()
    first.join(10)
    second.join(10)

    assert order == ["quitter gave up", "first", "second", "again"]


def test_a_sqlite_waiting_thread_waits_again_for_the_next_writer(sqlite_url: str) -> None:
    """The thread that waited for the lock file for one write waits for the next one too
    (starting a thread per wait cost each write that found the file taken ~100 µs)."""
    import fcntl

    from sinal.store.sqlite import SQLiteStore

    def lock_waits() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "sinal-sqlite-lock"]

    path = sqlite_url.removeprefix("sqlite:///")
    store = SQLiteStore(path)
    seen: list[threading.Thread] = []
    with Ledger(store) as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        for n in range(2):
            with open(f"{path}-lock", "a") as held:  # another process's writer, say
                fcntl.flock(held, fcntl.LOCK_EX)
                event = order_paid(account, contact, source_id=str(n))
                writer = threading.Thread(target=ledger.emit, args=(event,))
                writer.start()
                # Waiting: a waiting thread exists, and none is idle.
                wait_until(lambda: lock_waits() and not store._waiters._idle)
                seen.extend(lock_waits())
                fcntl.flock(held, fcntl.LOCK_UN)
            writer.join(10)

    assert len(seen) == 2
    assert seen[0] is seen[1]
    assert count(sqlite_url, "events") == 2


def test_sqlite_threads_waiting_for_their_process_turn_give_up_at_the_busy_timeout(
    sqlite_url: str,
) -> None:
    """Threads queued behind another thread of their process wait at most the busy
    timeout in all, and get the same `StoreUnavailable`; nothing of theirs is written."""
    import fcntl

    from sinal.store.sqlite import SQLiteStore

    path = sqlite_url.removeprefix("sqlite:///")
    with Ledger(SQLiteStore(path, busy_timeout=0.3)) as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        errors: list[Exception] = []
        waited: list[float] = []

        def emit(n: int) -> None:
            started = time.monotonic()
            try:
                ledger.emit(order_paid(account, contact, source_id=str(n)))
            except sinal.StoreError as exc:
                errors.append(exc)
            waited.append(time.monotonic() - started)

        with open(f"{path}-lock", "a") as held:  # a writer of another process, stuck
            fcntl.flock(held, fcntl.LOCK_EX)
            writers = [threading.Thread(target=emit, args=(n,)) for n in range(4)]
            for writer in writers:
                writer.start()
            for writer in writers:
                writer.join(10)
            fcntl.flock(held, fcntl.LOCK_UN)
        after = ledger.emit(order_paid(account, contact, source_id="after"))

    busy = f"the database is busy: no writer's turn within 0.3 s (another writer holds {path}-lock)"
    assert [str(e) for e in errors] == [busy] * 4
    assert all(isinstance(e, sinal.StoreUnavailable) for e in errors)
    assert all(0.25 < w < 2.0 for w in waited), waited  # each about the timeout, not 4 times it
    assert after.status == "created"
    assert count(sqlite_url, "events") == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB file system of its own (tmpfs, as root), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(disk)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        problem = f"cannot mount a small file system (root): {made.stderr.strip()}"
        if IN_CI:
            pytest.fail(f"{problem} (CI=true: this test may not be skipped)")
        pytest.skip(problem)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_is_unavailable_keeps_every_answer_true_and_passes(small_disk: Path) -> None:
    # SQLite on a disk that fills up: the write that does not fit is StoreUnavailable
    # (HTTP 503, worth a retry; it was StoreError, logged with a traceback per call),
    # nothing of it is written, and once there is room the same event goes in.
    url = f"sqlite:///{small_disk}/sinal.db"
    with sinal.connect(url) as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        stored: list[sinal.EmitResult] = []

        def fill() -> None:
            for n in range(10_000):
                big = {"order_id": str(n), "note": "x" * 4000}
                stored.append(ledger.emit(order_paid(account, contact, source_id=str(n),
                                                     properties=big)))  # fmt: skip

        with pytest.raises(sinal.StoreUnavailable, match="database or disk is full"):
            fill()
        assert stored
        assert all(r.status == "created" for r in stored)
        assert count(url, "events") == count(url, "outbox") == len(stored)
        [(events, total)] = sql(url, "SELECT event_count, total_value FROM contact_metrics_summary")
        assert events == len(stored)
        assert Decimal(str(total)) == Decimal("297.90") * len(stored)

        remount = ["mount", "-o", "remount,size=8M", str(small_disk)]
        subprocess.run(remount, check=True)
        retried = ledger.emit(order_paid(account, contact, source_id=str(len(stored))))
        assert retried.status == "created"
    assert count(url, "events") == len(stored) + 1


def test_closing_a_sqlite_store_waits_for_the_writes_in_progress(sqlite_url: str) -> None:
    """`close()` while another thread's write waits for its turn: the store closes once
    the write has ended (stored); no thread is left with a connection closed under it."""
    import fcntl

    from sinal.store.sqlite import SQLiteStore

    path = sqlite_url.removeprefix("sqlite:///")
    store = SQLiteStore(path)
    ledger = Ledger(store)
    account = ledger.create_account("Loja")
    contact = ledger.create_contact(account.id, external_id="c1")
    answers: list[sinal.EmitResult] = []
    with open(f"{path}-lock", "a") as held:  # the write waits for its turn meanwhile
        fcntl.flock(held, fcntl.LOCK_EX)
        writer = threading.Thread(
            target=lambda: answers.append(ledger.emit(order_paid(account, contact)))
        )
        writer.start()
        wait_until(lambda: store._users)  # the write is under way
        closer = threading.Thread(target=ledger.close)
        closer.start()
        closer.join(0.3)
        assert closer.is_alive()  # waiting for the write
        fcntl.flock(held, fcntl.LOCK_UN)
    writer.join(10)
    closer.join(10)

    assert not closer.is_alive()
    assert [a.status for a in answers] == ["created"]
    assert count(sqlite_url, "events") == 1


@pytest.mark.postgres
def test_the_pool_hands_out_the_connection_returned_last(pg_url: str) -> None:
    """After a burst opened several connections, a sequential caller keeps getting the one
    returned last (one warm backend), not each in turn; the others stay idle for the pool
    to close."""
    from sinal.store.postgres import PostgresStore

    store = PostgresStore(pg_url, min_size=1, max_size=4)
    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, external_id="c1")
        held = [store._pool.getconn() for _ in range(4)]  # the burst: four at once
        pids = [conn.info.backend_pid for conn in held]
        for conn in held:
            store._pool.putconn(conn)
        assert len(set(pids)) == 4

        used = []
        for n in range(6):
            ledger.emit(order_paid(account, contact, source_id=str(n)))
            with store._pool.connection() as conn:
                used.append(conn.info.backend_pid)

    assert used == [pids[-1]] * 6
    assert count(pg_url, "events") == 6


@pytest.mark.postgres
def test_a_ledger_opened_before_its_database_exists_works_once_it_does(pg_template: str) -> None:
    # A server or worker started before PostgreSQL (or its database) is up: each call
    # answers StoreError with the reason, and the first call after it is up goes through.
    from tests.conftest import PG_URL

    name = f"sinal_late_{uuid.uuid4().hex[:12]}"
    url = PG_URL.rsplit("/", 1)[0] + "/" + name
    with sinal.connect(url) as ledger:
        for _ in range(2):  # the pool's failed opening did not leave it closed for good
            with pytest.raises(sinal.StoreError, match=f'database "{name}" does not exist'):
                ledger.create_account("Loja")
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        try:
            time.sleep(OPEN_RETRY)  # before that, a call answers the last attempt's reason
            account = ledger.create_account("Loja")
            assert ledger.get_account(account.id) == account
        finally:
            ledger.close()
            with psycopg.connect(PG_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_callers_meeting_a_postgresql_that_does_not_answer_share_one_attempt() -> None:
    # A server that takes the connection and never answers (a host gone silent): every
    # caller used to wait its turn for its own attempt, one timeout each.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = (f"postgresql://postgres@127.0.0.1:{port}/test"
               "?connect_timeout=2&sslmode=disable&gssencmode=disable")  # fmt: skip
        errors: list[str] = []

        def call() -> None:
            with pytest.raises(sinal.StoreError) as raised:
                ledger.get_account(uuid.uuid4())
            errors.append(str(raised.value))

        with sinal.connect(url) as ledger:
            callers = [threading.Thread(target=call) for _ in range(8)]
            for caller in callers:
                caller.start()
            for caller in callers:
                caller.join(timeout=60)
        silent.setblocking(False)
        attempts = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                silent.accept()[0].close()
                attempts += 1

    assert attempts == 1
    assert len(errors) == 8
    assert len(set(errors)) == 1
    assert errors[0].startswith("cannot connect to PostgreSQL: ")


@pytest.mark.postgres
def test_idle_connections_their_server_ended_are_replaced_before_use(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A restart or a failover ends every connection the pool holds idle; the first call
    # on each used to fail with StoreUnavailable (a 503) before the pool replaced it.
    monkeypatch.setattr("sinal.store.postgres.ALIVE_BYPASS", 0.0)  # every one idle long
    store = PostgresStore(pg_url, min_size=1, max_size=4)
    with Ledger(store) as ledger:
        account = ledger.create_account("Loja")
        held = [store._pool.getconn() for _ in range(4)]  # four idle connections
        for conn in held:
            store._pool.putconn(conn)
        assert cut_connections(pg_url) == 4

        answers = [ledger.get_account(account.id) for _ in range(6)]
        made = ledger.create_contact(account.id, external_id="c1")

    assert answers == [account] * 6
    assert made.account_id == account.id


@pytest.mark.postgres
def test_postgresql_errors_say_whether_trying_again_may_succeed(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sinal.store.postgres.ALIVE_BYPASS", 3600.0)  # handed out untried
    with sinal.connect(pg_url) as ledger:
        ledger.create_account("Loja")  # the pool holds a connection
        cut_connections(pg_url)

        with pytest.raises(sinal.StoreUnavailable, match="terminating connection"):
            ledger.list_accounts()
        assert len(ledger.list_accounts()) == 1  # the pool connected again
        store: Any = ledger.store
        # a statement PostgreSQL refuses: a bug of ours, not an outage
        with (
            pytest.raises(sinal.StoreError, match="division by zero") as refused,
            store._conn() as conn,
        ):
            conn.execute("SELECT 1 / 0")
        assert not isinstance(refused.value, sinal.StoreUnavailable)


def test_a_contacts_summary_rows_come_in_code_point_order_of_metric_on_both_backends(
    linguistic_url: str,
) -> None:
    """`get_summary` (and GET /v1/contacts/{id}/metrics) lists a contact's rows by metric
    name in code point order, as the metrics list does, whatever the database's collation:
    on a PostgreSQL database collating by language, "abc" came before "Zeta" and "Émile"
    before "Zeta", where SQLite put "Zeta" first and "Émile" last."""
    names = ["abc", "Zeta", "Émile", "Order Paid"]
    with connect(linguistic_url) as ledger:
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, external_id="ana")
        for currency in ("USD", "BRL"):
            ledger.emit_many(
                [EmitEvent(account_id=account.id, contact_id=ana.id, metric_name=name,
                           source="api", source_id=f"{name}:{currency}", currency=currency)
                 for name in names]
            )  # fmt: skip
        rows = [(s.metric_name, s.currency) for s in ledger.get_summary(account.id, ana.id)]
    assert rows == sorted((name, currency) for name in names for currency in ("BRL", "USD"))
