"""A summary's total_value tells "no event of this metric carried a value" (None, as
SUM(value) over the events says) apart from "its values added up to 0", on every write
path of both backends: one event at a time (PostgreSQL: `sinal_record_event`), a batch
(the record statement) and a batch of more than 64 events (PostgreSQL: streamed)."""

from __future__ import annotations

from decimal import Decimal

import pytest

import sinal
from sinal import EmitEvent, Ledger
from tests.helpers import sql

# How each path is taken: the ledger streams a batch of more than CHUNK (64) events.
PATHS = {"one at a time": 1, "batch": 8, "streamed": 100}


def _events(
    account: sinal.Account,
    contact: sinal.Contact,
    round_: int,
    values: dict[str, list[Decimal | None]],
) -> list[EmitEvent]:
    """One event per value listed for each metric, and messages (no value) up to 100."""
    events = [
        EmitEvent(account_id=account.id, contact_id=contact.id, metric_name=metric,
                  source="test", source_id=f"{round_}:{metric}:{i}", value=value)
        for metric, listed in values.items()
        for i, value in enumerate(listed)
    ]  # fmt: skip
    return events + [
        EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="Message Read",
                  source="whatsapp", source_id=f"{round_}:read:{i}")
        for i in range(100 - len(events))
    ]  # fmt: skip


def _emit(ledger: Ledger, events: list[EmitEvent], size: int) -> None:
    for start in range(0, len(events), size):
        part = events[start : start + size]
        results = [ledger.emit(part[0])] if size == 1 else ledger.emit_many(part)
        assert {r.status for r in results} == {"created"}


def _totals(ledger: Ledger, account: sinal.Account) -> dict[str, Decimal | None]:
    return {s.metric_name: s.total_value for s in ledger.get_summary(account.id)}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_summary_total_value_is_none_until_an_event_of_the_metric_has_a_value(
    ledger: Ledger, account: sinal.Account, path: str
) -> None:
    contact = ledger.create_contact(account.id, external_id="ana")
    first: dict[str, list[Decimal | None]] = {
        "Order Paid": [Decimal("5"), Decimal("-5")],  # values adding up to 0
        "Order Placed": [Decimal("10")],
        "Quiz Answered": [None, None],
        "Order Refunded": [None],
    }
    _emit(ledger, _events(account, contact, 1, first), PATHS[path])

    assert _totals(ledger, account) == {
        "Order Paid": Decimal(0),
        "Order Placed": Decimal(10),
        "Quiz Answered": None,
        "Order Refunded": None,
        "Message Read": None,
    }

    # Onto the rows now there: a value onto none, none onto a value, values onto values.
    then: dict[str, list[Decimal | None]] = {
        "Order Paid": [None],
        "Order Placed": [Decimal("2.5"), None],
        "Quiz Answered": [None, Decimal("0.00"), None],
        "Order Refunded": [Decimal("1.50")],
    }
    _emit(ledger, _events(account, contact, 2, then), PATHS[path])

    assert _totals(ledger, account) == {
        "Order Paid": Decimal(0),
        "Order Placed": Decimal("12.5"),
        "Quiz Answered": Decimal(0),
        "Order Refunded": Decimal("1.50"),
        "Message Read": None,
    }
    [report] = ledger.rebuild_summaries(account.id)
    assert report.drift == 0


def test_rebuild_summaries_gives_a_metric_without_values_no_total(
    ledger: Ledger, account: sinal.Account, database_url: str
) -> None:
    """A total of 0 where no event carried a value (as sinal wrote before) is drift."""
    contact = ledger.create_contact(account.id, external_id="ana")
    _emit(ledger, _events(account, contact, 1, {"Order Paid": [Decimal(0)]})[:3], 3)
    sql(database_url, "UPDATE contact_metrics_summary SET total_value = '0'")

    [report] = ledger.rebuild_summaries(account.id)

    assert (report.changed, report.details) == (1, [f"wrong figures: contact {contact.id}, "
                                                    "Message Read in BRL"])  # fmt: skip
    assert _totals(ledger, account) == {"Order Paid": Decimal(0), "Message Read": None}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_summary_never_adds_values_of_two_currencies(
    ledger: Ledger, account: sinal.Account, path: str
) -> None:
    """Order Paid 100 BRL and 50 USD are a row each, not a total of 150: a row per
    currency, with its own count, total, first and last occurrence."""
    contact = ledger.create_contact(account.id, external_id="ana")
    paid = [("BRL", "100", 1), ("USD", "50", 2), ("USD", None, 3), ("BRL", "0.10", 4)]
    events = [
        EmitEvent(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                  source="test", source_id=f"paid:{day}", currency=currency, value=value,
                  occurred_at=f"2026-11-0{day}T12:00:00Z")
        for currency, value, day in paid
    ]  # fmt: skip
    _emit(ledger, [*events, *_events(account, contact, 1, {})[4:]], PATHS[path])

    rows = [
        (s.currency, s.event_count, s.total_value, s.first_event_at.day, s.last_event_at.day)
        for s in ledger.get_summary(account.id, contact.id)
        if s.metric_name == "Order Paid"
    ]
    assert rows == [("BRL", 2, Decimal("100.10"), 1, 4), ("USD", 2, Decimal(50), 2, 3)]
    [report] = ledger.rebuild_summaries(account.id)
    assert report.drift == 0
