"""Helpers for the WhatsApp tests: a connected integration and signed Meta deliveries."""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from psycopg import pq

from sinal import webhooks
from sinal.automations.service import Automations
from sinal.integrations.signatures import sign_whatsapp
from sinal.ledger import Ledger, connect
from sinal.store.automations import Integration
from sinal.store.base import EventQuery, StoredEvent
from sinal.store.postgres import PostgresStore
from sinal.store.sqlite import SQLiteStore
from sinal.store.webhooks import StoredDelivery
from tests.integration.conftest import Api

FIXTURES = Path(__file__).parent.parent / "fixtures" / "whatsapp"
APP_SECRET = "5f0c1d2e3a4b6c7d8e9f0a1b2c3d4e5f"
VERIFY_TOKEN = "sinal-verify-8f2c1a"
PHONE_NUMBER_ID = "106540352242922"
WABA_ID = "102290129340398"


def connect_whatsapp(api: Api, account_id: Any = None, **overrides: Any) -> Integration:
    """The account's WhatsApp Cloud API connection, as `POST /v1/integrations` makes it."""
    data = {
        "kind": "whatsapp", "secret": APP_SECRET, "verify_token": VERIFY_TOKEN,
        "phone_number_id": PHONE_NUMBER_ID, "access_token": "EAAG-test",
        "api_base_url": "https://graph.example.test/v21.0", **overrides,
    }  # fmt: skip
    return Automations(api.ledger).create_integration(account_id or api.account.id, data)


def fixture_body(name: str) -> bytes:
    """A fixture's bytes exactly as stored (Meta's escaping included)."""
    return (FIXTURES / f"{name}.json").read_bytes()


def meta_bytes(payload: Any) -> bytes:
    """JSON as Meta sends it: compact, non-ASCII escaped as \\uXXXX."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def envelope(value: dict[str, Any]) -> dict[str, Any]:
    """A `messages` change around `value`."""
    metadata = {"display_phone_number": "551140028922", "phone_number_id": PHONE_NUMBER_ID}
    return {
        "object": "whatsapp_business_account",
        "entry": [{"id": WABA_ID, "changes": [{"field": "messages", "value": {
            "messaging_product": "whatsapp", "metadata": metadata, **value}}]}],
    }  # fmt: skip


def text_message(
    wamid: str, wa_id: str, text: str, *, name: str | None = None, timestamp: int = 1715360000
) -> dict[str, Any]:
    """A body with one inbound text message."""
    contacts = [{"profile": {"name": name}, "wa_id": wa_id}] if name else []
    message = {"from": wa_id, "id": wamid, "timestamp": str(timestamp), "type": "text",
               "text": {"body": text}}  # fmt: skip
    return envelope({"contacts": contacts, "messages": [message]})


def statuses(
    *items: tuple[str, str, int], recipient: str = "5511987654321", callback: str | None = None
) -> dict[str, Any]:
    """A body with (wamid, status, timestamp) statuses, carrying only the recipient id (and
    the `biz_opaque_callback_data` the message was sent with, if any)."""
    echoed = {} if callback is None else {"biz_opaque_callback_data": callback}
    return envelope(
        {"statuses": [{"id": wamid, "status": status, "timestamp": str(when),
                       "recipient_id": recipient, **echoed} for wamid, status, when in items]}
    )  # fmt: skip


async def deliver(
    api: Api,
    integration: Integration,
    body: bytes,
    *,
    signature: str | None = None,
    secret: str = APP_SECRET,
) -> httpx.Response:
    """POST a delivery signed as Meta signs it (or with the `signature` given)."""
    header = sign_whatsapp(secret, body) if signature is None else signature
    return await api.client.post(
        f"/webhooks/whatsapp/{integration.id}",
        content=body,
        headers={"Content-Type": "application/json", "X-Hub-Signature-256": header},
    )


def events(api: Api, metric: str | None = None, account_id: Any = None) -> list[StoredEvent]:
    """The account's events (of one metric), oldest first."""
    query = EventQuery(account_id or api.account.id, metric_name=metric, limit=1000)
    return list(reversed(api.ledger.list_events(query)))


def deferred(api: Api) -> list[StoredDelivery]:
    """The deliveries kept as deferred, oldest first."""
    return webhooks.store_of(api.ledger).list_deliveries(("deferred",), api.account.id)


def due_at(api: Api) -> datetime:
    """When the one deferred delivery is due."""
    [delivery] = deferred(api)
    assert delivery.due_at is not None
    return delivery.due_at


def receive(ledger: Ledger, integration: Integration, body: bytes) -> webhooks.Received:
    """A delivery kept and processed in this thread, as the route does."""
    return webhooks.receive(ledger, integration, topic=None, delivery_id=str(uuid.uuid4()),
                            headers={}, body=body)  # fmt: skip


@contextmanager
def one_connection(api: Api) -> Iterator[Ledger]:
    """A ledger on the api's database whose statements `statements` sees: SQLite's of this
    thread, PostgreSQL's through a store of one connection."""
    if isinstance(api.ledger.store, SQLiteStore):
        yield api.ledger
        return
    with traced_ledger(api.url) as ledger:
        yield ledger


@contextmanager
def traced_ledger(url: str) -> Iterator[Ledger]:
    """A ledger on `url` whose statements `statements` sees (PostgreSQL: a pool of one
    connection)."""
    if url.startswith("sqlite:"):
        with connect(url) as ledger:
            yield ledger
        return
    with Ledger(PostgresStore(url, max_size=1)) as ledger:
        yield ledger


@contextmanager
def statements(ledger: Ledger) -> Iterator[list[str]]:
    """The statements a `one_connection` ledger sends meanwhile, as its driver traces them:
    SQLite's trace callback; libpq's trace, a simple Query's text or "Bind" for each
    statement with parameters (one round trip each, BEGIN and COMMIT included)."""
    sent: list[str] = []
    store = ledger.store
    if isinstance(store, SQLiteStore):
        conn = store._conn()
        conn.set_trace_callback(sent.append)
        try:
            yield sent
        finally:
            conn.set_trace_callback(None)
        return
    assert isinstance(store, PostgresStore)
    with _libpq_trace(store) as messages:
        yield sent
    for direction, _, kind, *rest in messages:
        if direction == "F" and kind == "Query":
            sent.append(rest[0].strip(' "'))
        elif direction == "F" and kind == "Bind":
            sent.append(kind)


@contextmanager
def rows_received(ledger: Ledger) -> Iterator[list[int]]:
    """PostgreSQL: the size in bytes of each row a `one_connection` ledger receives
    meanwhile (libpq's DataRow messages)."""
    sizes: list[int] = []
    assert isinstance(ledger.store, PostgresStore)
    with _libpq_trace(ledger.store) as messages:
        yield sizes
    sizes += [int(length) for direction, length, kind, *_ in messages
              if direction == "B" and kind == "DataRow"]  # fmt: skip


@contextmanager
def _libpq_trace(store: PostgresStore) -> Iterator[list[list[str]]]:
    """The messages the store's one connection exchanges meanwhile, as libpq traces them:
    direction ("F": sent, "B": received), length, kind, then the message's fields."""
    messages: list[list[str]] = []
    with store._conn() as checked_out:  # the store's one connection, whoever uses it
        pgconn = checked_out.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield messages
        finally:
            pgconn.untrace()
            os.fsync(trace.fileno())
            trace.seek(0)
            messages += [line.rstrip("\n").split("\t") for line in trace]
