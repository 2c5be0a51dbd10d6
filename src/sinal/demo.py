"""`sinal demo`: a small, realistic day of a store, recorded and shown back."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal

from rich.console import Console
from rich.table import Table

from sinal import catalog as c
from sinal.automations.templates import format_money
from sinal.events import EmitEvent, EmitResult
from sinal.ledger import Ledger
from sinal.store.base import EventQuery, StoredEvent

# What a cell shows for an event, or a summary's total, with no value (a message): an
# empty cell read as a value missing from the output, and "R$ 0,00" as a free order.
NO_VALUE = "—"


def run_demo(ledger: Ledger, console: Console) -> None:
    """Emit checkout → order → payment → WhatsApp messages, a redelivered webhook and an
    event for an unknown contact; print events, duplicates, rejections and summaries."""
    account = ledger.create_account("Loja Exemplo")
    ana = ledger.create_contact(
        account.id, phone="+55 11 98765-4321", email="ana@example.com", name="Ana Souza"
    )
    bruno = ledger.create_contact(account.id, phone="(21) 99876-5432", name="Bruno Lima")
    console.print(f"[bold]account[/bold] {account.name} ({account.id})")
    console.print(f"[bold]contacts[/bold] Ana {ana.phone} · Bruno {bruno.phone}\n")

    results = [(event, ledger.emit(event)) for event in _day(account.id, ana.id, bruno.id)]
    _print_results(console, results)
    events = ledger.list_events(EventQuery(account.id))
    _print_events(console, events)
    _print_rejections(console, ledger, account.id)
    _print_summary(console, ledger, account.id, {ana.id: "Ana", bruno.id: "Bruno"})


def _day(account: uuid.UUID, ana: uuid.UUID, bruno: uuid.UUID) -> list[EmitEvent]:
    start = datetime.now().astimezone() - timedelta(hours=3)
    order = {"order_id": "1001", "order_number": "#1001", "total": "297.90"}
    wamid = "wamid.HBgMNTUxMTk4NzY1NDMyMRUCABEYEjQ2QkI5"

    def at(minutes: int) -> datetime:
        return start + timedelta(minutes=minutes)

    def ev(metric: str, contact: uuid.UUID | None, minutes: int, **kw: object) -> EmitEvent:
        return EmitEvent(
            account_id=account,
            contact_id=contact,
            metric_name=metric,
            occurred_at=at(minutes),
            **kw,  # type: ignore[arg-type]
        )

    paid = ev(c.METRIC_ORDER_PAID, ana, 12, source="shopify", source_id="1001",
              entity_type="order_paid", value=Decimal("297.90"), properties=order)  # fmt: skip
    return [
        ev(c.METRIC_CHECKOUT_STARTED, ana, 0, source="shopify", source_id="chk_7f3a",
           entity_type="checkout", value=Decimal("297.90"), properties={"checkout_id": "chk_7f3a"}),
        ev(c.METRIC_ORDER_PLACED, ana, 10, source="shopify", source_id="1001",
           entity_type="order", value=Decimal("297.90"), properties=order),
        paid,
        ev(c.METRIC_MESSAGE_SENT, ana, 13, source="automation", entity_type="message",
           entity_id=wamid, automation_execution_id=uuid.uuid4(),
           properties={"phone": "+5511987654321", "wa_message_id": wamid}),
        ev(c.METRIC_MESSAGE_DELIVERED, ana, 14, source="whatsapp", source_id=f"{wamid}:delivered",
           entity_type="message_status", properties={"wa_message_id": wamid}),
        ev(c.METRIC_MESSAGE_READ, ana, 20, source="whatsapp", source_id=f"{wamid}:read",
           entity_type="message_status", properties={"wa_message_id": wamid}),
        ev(c.METRIC_MESSAGE_RECEIVED, bruno, 30, source="whatsapp", source_id="wamid.IN.1",
           entity_type="message", properties={"message_type": "text", "text": "Oi! Tem frete?"}),
        paid,  # Shopify redelivers the webhook: a duplicate, not a second payment
        ev(c.METRIC_ORDER_PLACED, uuid.uuid4(), 40, source="yampi", source_id="Y-77",
           entity_type="order", value=Decimal("89.90"), properties={"order_id": "Y-77"}),
    ]  # fmt: skip


def _print_results(console: Console, results: list[tuple[EmitEvent, EmitResult]]) -> None:
    table = Table(title="emit_event, one call per activity")
    for column in ("metric", "source", "status", "detail"):
        table.add_column(column)
    style = {"created": "green", "duplicate": "yellow", "rejected": "red"}
    for event, result in results:
        detail = {
            "created": str(result.event_id),
            "duplicate": f"same as {result.event_id} (payload differs: {result.differs})",
            "rejected": f"{result.reason}: {result.message}",
        }[result.status]
        table.add_row(
            event.metric_name,
            event.source,
            f"[{style[result.status]}]{result.status}[/]",
            detail,
        )
    console.print(table)


def _print_events(console: Console, events: list[StoredEvent]) -> None:
    table = Table(title="events stored (newest first)")
    for column in ("occurred_at", "metric", "label (pt-BR)", "value", "unique_event_id"):
        table.add_column(column)
    for e in events:
        table.add_row(
            e.occurred_at.astimezone().strftime("%H:%M"),
            e.metric_name,
            c.get_metric_label(e.metric_name, "pt-BR"),
            NO_VALUE if e.value is None else format_money(e.value, e.currency),
            e.unique_event_id or "",
        )
    console.print(table)


def _print_rejections(console: Console, ledger: Ledger, account: uuid.UUID) -> None:
    table = Table(title="rejections kept for replay")
    for column in ("reason", "message", "metric"):
        table.add_column(column)
    for r in ledger.list_rejections(account):
        table.add_row(r.reason, r.message, str(r.payload.get("metric_name")))
    console.print(table)


def _print_summary(
    console: Console,
    ledger: Ledger,
    account: uuid.UUID,
    names: dict[uuid.UUID, str],
) -> None:
    table = Table(title="contact_metrics_summary (rótulos em pt-BR)")
    for column in ("contato", "métrica", "eventos", "valor total", "primeiro", "último"):
        table.add_column(column)
    for s in ledger.get_summary(account):
        table.add_row(
            names.get(s.contact_id, str(s.contact_id)),
            c.get_metric_label(s.metric_name, "pt-BR"),
            str(s.event_count),
            # no total: none of its events had a value (a message); a row per currency
            NO_VALUE if s.total_value is None else format_money(s.total_value, s.currency),
            s.first_event_at.astimezone().strftime("%H:%M"),
            s.last_event_at.astimezone().strftime("%H:%M"),
        )
    console.print(table)
