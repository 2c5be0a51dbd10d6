"""Summaries are derived data: any sequence of emits leaves them equal to a GROUP BY
over the events by contact, metric and currency."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinal import EmitEvent, Ledger
from sinal.store.base import EventQuery

T0 = datetime(2026, 6, 1, tzinfo=UTC)

emit = st.fixed_dictionaries(
    {
        "contact": st.integers(0, 2),
        "metric": st.sampled_from(["Order Paid", "Message Read", "Quiz Answered"]),
        "source_id": st.none() | st.integers(0, 6).map(str),  # small pool: many duplicates
        "value": st.none() | st.decimals(-1000, 1000, places=4, allow_nan=False),
        "currency": st.sampled_from([None, "BRL", "USD"]),  # None: BRL, the default
        "minutes": st.integers(-100_000, 100_000),  # out of order, both ways
    }
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=st.lists(st.lists(emit, min_size=1, max_size=8), min_size=1, max_size=5))
def test_summaries_equal_group_by_over_events(
    ledger: Ledger, batches: list[list[dict[str, object]]]
) -> None:
    account = ledger.create_account("Property")
    contacts = [ledger.create_contact(account.id, external_id=f"c{i}") for i in range(3)]
    stored: dict[str, dict[str, object]] = {}  # unique id -> the payload that won
    expected_count = 0
    for batch in batches:
        events = [
            EmitEvent(
                account_id=account.id,
                contact_id=contacts[int(str(e["contact"]))].id,
                metric_name=str(e["metric"]),
                source="prop",
                source_id=e["source_id"],  # type: ignore[arg-type]
                value=e["value"],  # type: ignore[arg-type]
                currency=e["currency"],  # type: ignore[arg-type]
                occurred_at=T0 + timedelta(minutes=int(str(e["minutes"]))),
            )
            for e in batch
        ]
        # single events one at a time, bigger batches through emit_many
        results = [ledger.emit(events[0])] if len(events) == 1 else ledger.emit_many(events)
        for event, e, result in zip(events, batch, results, strict=True):
            if result.status == "created":
                expected_count += 1
                if event.source_id is not None:
                    stored[str(event.source_id)] = e

    # the oracle: a GROUP BY over what the events table says, computed independently
    in_table = ledger.list_events(EventQuery(account.id, limit=10_000))
    assert len(in_table) == expected_count
    # SQL's SUM(value): None while no event of the key has a value; never two currencies
    truth: dict[tuple[UUID, str, str], tuple[int, Decimal | None, datetime, datetime]] = {}
    for ev in in_table:
        key = (ev.contact_id, ev.metric_name, ev.currency)
        n, total, first, last = truth.get(key, (0, None, ev.occurred_at, ev.occurred_at))
        if ev.value is not None:
            total = ev.value if total is None else total + ev.value
        truth[key] = (n + 1, total, min(first, ev.occurred_at), max(last, ev.occurred_at))
    summary = {
        (s.contact_id, s.metric_name, s.currency):
            (s.event_count, s.total_value, s.first_event_at, s.last_event_at)
        for s in ledger.get_summary(account.id)
    }  # fmt: skip
    assert summary == truth
    # ...and the store's own GROUP BY agrees: rebuilding finds no drift
    [report] = ledger.rebuild_summaries(account.id)
    assert report.drift == 0
