"""`last_inbound_number`: the business number a contact last wrote to, which an account
with several WhatsApp numbers replies from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import pytest

import sinal
from sinal import EmitEvent, Ledger
from sinal.messaging import messaging_store
from sinal.store.sqlite import SQLiteStore

T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)


def _received(account: sinal.Account, contact: UUID, wamid: str, at: datetime,
              number: str | None) -> EmitEvent:  # fmt: skip
    properties: dict[str, Any] = {"text": "Oi"}
    if number is not None:
        properties["phone_number_id"] = number
    return EmitEvent(
        account_id=account.id, contact_id=contact, metric_name=sinal.METRIC_MESSAGE_RECEIVED,
        source="whatsapp", source_id=wamid, entity_type="message", properties=properties,
        occurred_at=at,
    )  # fmt: skip


def _others(account: sinal.Account, contact: UUID, n: int, after: datetime) -> list[EmitEvent]:
    """`n` events of other metrics (clicks, orders, reads) newer than `after`."""
    metrics = (sinal.METRIC_LINK_CLICKED, sinal.METRIC_ORDER_PAID, "Message Read")
    return [
        EmitEvent(account_id=account.id, contact_id=contact, metric_name=metrics[i % 3],
                  source="api", source_id=f"{after:%H%M%S}-{i}",
                  occurred_at=after + timedelta(seconds=i + 1))
        for i in range(n)
    ]  # fmt: skip


def test_the_number_a_contact_last_wrote_to_is_its_newest_message_naming_one(
    ledger: Ledger, account: sinal.Account
) -> None:
    """The newest Message Received naming a number, whatever came after it; one delivered
    late (older) does not win; one naming no number is passed over; another contact's
    messages are not this contact's; a contact who never wrote has none."""
    store = messaging_store(ledger)
    bia = ledger.create_contact(account.id, phone="+55 21 91234-5678").id
    caio = ledger.create_contact(account.id, phone="+55 21 97654-3210").id
    dora = ledger.create_contact(account.id, phone="+55 21 90000-0000").id
    assert store.last_inbound_number(account.id, bia) is None

    ledger.emit_many([_received(account, bia, "wamid.A1", T0, "111"),
                      *_others(account, bia, 30, T0)])  # fmt: skip
    assert store.last_inbound_number(account.id, bia) == "111"

    later = T0 + timedelta(hours=1)
    ledger.emit_many([
        _received(account, bia, "wamid.B1", later, "222"),
        _received(account, bia, "wamid.A0", T0 - timedelta(hours=1), "111"),  # late
        _received(account, caio, "wamid.C1", later + timedelta(minutes=1), "111"),
        _received(account, bia, "wamid.X1", later + timedelta(minutes=2), None),  # no number
        *_others(account, bia, 30, later + timedelta(minutes=2)),
        *_others(account, dora, 30, later),
    ])  # fmt: skip

    assert store.last_inbound_number(account.id, bia) == "222"
    assert store.last_inbound_number(account.id, caio) == "111"
    assert store.last_inbound_number(account.id, dora) is None
    other = ledger.create_account("Outra loja")
    assert store.last_inbound_number(other.id, bia) is None


def test_the_number_a_contact_last_wrote_to_is_found_without_reading_its_newer_events(
    tmp_path: Any,
) -> None:
    """SQLite: neither the contact's 2,000 events of other metrics newer than its last
    message nor the account's 2,000 messages from others (older and newer) are read (nor, for a
    contact who never wrote, any of its events): the work stays that of an empty account.
    Measured in SQLite virtual machine instructions, not time; walking the events took
    thousands. (PostgreSQL: EXPLAIN ANALYZE, in the report of the change.)"""
    with sinal.connect(f"sqlite:///{tmp_path / 'inbound.db'}") as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        store = ledger.store
        assert isinstance(store, SQLiteStore)
        wrote = ledger.create_contact(account.id, phone="+55 21 91234-5678").id
        silent = ledger.create_contact(account.id, phone="+55 21 97654-3210").id
        ledger.emit_many([_received(account, wrote, "wamid.A1", T0, "111")])

        def work(contact: UUID) -> int:
            steps = [0]

            def count() -> int:
                steps[0] += 1
                return 0

            conn = store._conn()
            conn.set_progress_handler(count, 1)
            try:
                messaging_store(ledger).last_inbound_number(account.id, contact)
            finally:
                conn.set_progress_handler(None, 1)
            return steps[0]

        alone = work(wrote), work(silent)
        others = [ledger.create_contact(account.id, email=f"c{i}@example.com").id
                  for i in range(20)]  # fmt: skip
        for contact in (wrote, silent):
            for start in (T0, T0 + timedelta(hours=1)):
                ledger.emit_many(_others(account, contact, 1000, start))
        for n, other in enumerate(others):  # older and newer than its message
            ledger.emit_many([_received(account, other, f"wamid.{n}.{i}",
                                        T0 + timedelta(seconds=i - 50), "222")
                              for i in range(100)])  # fmt: skip

        assert work(wrote) <= alone[0] + 10
        assert work(silent) <= alone[1] + 10
        assert messaging_store(ledger).last_inbound_number(account.id, wrote) == "111"


@pytest.mark.parametrize("rebuilt", [False, True])
def test_the_number_a_contact_last_wrote_to_survives_a_summary_rebuild(
    ledger: Ledger, account: sinal.Account, rebuilt: bool
) -> None:
    """The answer reads the contact's Message Received summary: rebuilt from events, it
    still names the newest message."""
    bia = ledger.create_contact(account.id, phone="+55 21 91234-5678").id
    ledger.emit_many([_received(account, bia, "wamid.A1", T0, "111"),
                      _received(account, bia, "wamid.B1", T0 + timedelta(seconds=1), "222"),
                      *_others(account, bia, 5, T0 + timedelta(seconds=1))])  # fmt: skip
    if rebuilt:
        ledger.rebuild_summaries(account.id)
    assert messaging_store(ledger).last_inbound_number(account.id, bia) == "222"
