"""Shopify and Yampi webhooks through HTTP, signed like the providers sign them, on both
backends: every mapped topic, redelivery storms, bad signatures, unknown integrations,
out-of-order deliveries, abandoned carts on a driven clock, and replay after a failure."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from typer.testing import CliRunner

from sinal import EmitEvent, webhooks
from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.catalog import METRIC_CHECKOUT_RECOVERED, METRIC_ORDER_CANCELLED
from sinal.cli import app as cli
from sinal.commerce import commerce_store, derive_abandoned
from sinal.config import Settings
from sinal.errors import StoreUnavailable
from sinal.integrations import shopify as shopify_hooks
from sinal.integrations import sign_shopify, sign_yampi, yampi
from sinal.ledger import Ledger
from sinal.store.automations import Advance
from sinal.store.base import EventQuery, StoredEvent
from sinal.store.commerce import STOPPED_BY_DISCONNECT, STOPPED_BY_ORDER, STOPPED_BY_RECOVERY
from sinal.store.sqlite import SQLiteStore
from sinal.worker import start_worker_thread
from tests.helpers import DrivenClock, count, settle, sql
from tests.integration.conftest import Api
from tests.integration.whatsapp import deferred, due_at, one_connection, statements
from tests.servers import whatsapp_server

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).parent.parent / "fixtures"
ANA_ORDER = "5829371002921"
PROTECTED_ORDER = "5829371068457"
NEIGHBOUR = "+55 21 99876-5432"  # receives a parcel for the buyer
CHECKOUT_TOKEN = "b7f3c1a9e2d54b8f9a0c6e1d2f3a4b5c"


def fixture(provider: str, name: str) -> dict[str, Any]:
    """A fresh copy of a realistic payload (tests may change it)."""
    data: dict[str, Any] = json.loads((FIXTURES / provider / f"{name}.json").read_text())
    return data


@dataclass
class Shop:
    """A connected store: posts webhooks as its provider would, with no API key."""

    api: Api
    client: httpx.AsyncClient
    kind: str
    id: str
    secret: str

    @property
    def path(self) -> str:
        return f"/webhooks/{self.kind}/{self.id}"

    async def send(
        self,
        payload: dict[str, Any] | bytes,
        topic: str | None = None,
        *,
        webhook_id: str | None = None,
        signature: str | None = None,
        path: str | None = None,
    ) -> httpx.Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self.kind == "shopify":
            headers["X-Shopify-Hmac-Sha256"] = (
                sign_shopify(self.secret, body) if signature is None else signature
            )
            headers["X-Shopify-Topic"] = topic or ""
            headers["X-Shopify-Webhook-Id"] = webhook_id or str(uuid4())
            headers["X-Shopify-Shop-Domain"] = "loja-da-ana.myshopify.com"
            headers["X-Shopify-API-Version"] = "2024-04"
        else:
            headers["X-Yampi-Hmac-SHA256"] = (
                sign_yampi(self.secret, body) if signature is None else signature
            )
        return await self.client.post(path or self.path, content=body, headers=headers)

    async def deliver(self, payload: dict[str, Any], topic: str | None = None) -> dict[str, Any]:
        """Send and expect the provider's 200."""
        response = await self.send(payload, topic)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer


@pytest.fixture
async def hooks(api: Api) -> AsyncIterator[httpx.AsyncClient]:
    """A client with no API key, as Shopify and Yampi call us."""
    transport = httpx.ASGITransport(app=api.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sinal.test") as client:
        yield client


async def connect(api: Api, hooks: httpx.AsyncClient, kind: str, **settings: Any) -> Shop:
    secret = f"{kind}-secret-{uuid4().hex}"
    response = await api.post("/v1/integrations", {"kind": kind, "secret": secret, **settings})
    assert response.status_code == 201, response.text
    made = response.json()
    assert made["webhook_url"].endswith(f"/webhooks/{kind}/{made['id']}")
    return Shop(api, hooks, kind, made["id"], secret)


@pytest.fixture
async def shopify(api: Api, hooks: httpx.AsyncClient) -> Shop:
    return await connect(api, hooks, "shopify", abandon_after_minutes=30)


@pytest.fixture
async def yampi_shop(api: Api, hooks: httpx.AsyncClient) -> Shop:
    return await connect(api, hooks, "yampi")


def events(api: Api, metric: str | None = None) -> list[StoredEvent]:
    found = api.ledger.list_events(
        EventQuery(account_id=api.account.id, metric_name=metric, limit=1000)
    )
    return sorted(found, key=lambda e: (e.occurred_at, e.metric_name))


def run_automations(api: Api) -> None:
    """Run the automations of every event recorded so far."""
    dispatcher = Dispatcher(api.ledger, DispatchSettings(http_timeout=1, retry=RetryPolicy(2)))
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.close()


def metrics(api: Api) -> dict[str, int]:
    counted: dict[str, int] = {}
    for event in events(api):
        counted[event.metric_name] = counted.get(event.metric_name, 0) + 1
    return counted


def order_row(api: Api, external_id: str) -> dict[str, Any]:
    [row] = sql(
        api.url,
        "SELECT status, total, refunded, currency, number, contact_id, checkout_token "
        "FROM orders WHERE account_id = ? AND external_id = ?",
        str(api.account.id),
        external_id,
    )
    status, total, refunded, currency, number, contact, token = row
    return {
        "status": status,
        "total": None if total is None else Decimal(str(total)),
        "refunded": Decimal(str(refunded)),
        "currency": currency,
        "number": number,
        "contact_id": str(contact),
        "checkout_token": token,
    }


def deliveries(api: Api) -> list[tuple[str, str | None]]:
    rows = sql(api.url, "SELECT status, reason FROM webhook_deliveries ORDER BY received_at")
    return [(r[0], r[1]) for r in rows]


def shipment(status: str | None) -> dict[str, Any]:
    update = fixture("shopify", "fulfillments_update")
    update["shipment_status"] = status
    update["updated_at"] = {
        "in_transit": "2024-05-13T07:41:12-03:00",
        "failure": "2024-05-14T09:12:00-03:00",
        "out_for_delivery": "2024-05-15T08:05:00-03:00",
        "delivered": "2024-05-15T15:47:30-03:00",
    }.get(status or "", "2024-05-13T06:00:00-03:00")
    return update


def refund(refund_id: int, amount: str) -> dict[str, Any]:
    """A refunds/create of the fixture order: `amount` paid back in one transaction."""
    payload = fixture("shopify", "refunds_create_partial_1")
    payload["id"] = refund_id
    payload["transactions"][0].update(id=refund_id + 1, amount=amount)
    return payload


# -- Shopify -----------------------------------------------------------------------------


async def test_shopify_order_lifecycle_records_every_topic_once(api: Api, shopify: Shop) -> None:
    sent = [
        ("orders/create", fixture("shopify", "orders_create")),
        ("orders/paid", fixture("shopify", "orders_paid")),
        ("orders/fulfilled", fixture("shopify", "orders_fulfilled")),
        ("fulfillments/create", fixture("shopify", "fulfillments_create")),
        ("fulfillments/update", shipment("in_transit")),
        ("fulfillments/update", shipment("failure")),
        ("fulfillments/update", shipment("out_for_delivery")),
        ("fulfillments/update", shipment("delivered")),
        ("fulfillments/update", shipment("label_printed")),  # tracked by no metric
        ("refunds/create", fixture("shopify", "refunds_create_partial_1")),
        ("refunds/create", fixture("shopify", "refunds_create_partial_2")),
    ]
    for topic, payload in sent:
        answer = await shopify.deliver(payload, topic)
        assert answer["status"] == "processed", (topic, answer)

    assert metrics(api) == {
        "Order Placed": 1, "Order Paid": 1, "Order Fulfilled": 1, "Shipment Created": 1,
        "Shipment In Transit": 1, "Shipment Exception": 1, "Shipment Out For Delivery": 1,
        "Shipment Delivered": 1, "Order Refunded": 2, "Contact Created": 1,
    }  # fmt: skip
    recorded = [e for e in events(api) if e.metric_name != "Contact Created"]
    assert {e.integration_id for e in recorded} == {UUID(shopify.id)}
    assert len({e.contact_id for e in recorded}) == 1  # shipments and refunds: the buyer
    assert {e.source for e in recorded} == {"shopify"}

    [placed] = events(api, "Order Placed")
    assert (placed.value, placed.currency) == (Decimal("297.90"), "BRL")
    assert placed.occurred_at == datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)
    assert placed.properties["order_id"] == ANA_ORDER
    assert placed.properties["order_name"] == "#1042"
    assert placed.properties["discount_codes"] == ["BEMVINDA10"]
    assert placed.properties["items"][0] == {
        "sku": "CAM-ORG-AZ-M", "product_id": "8471029384761", "variant_id": "45012938475102",
        "title": "Camiseta Algodão Orgânico", "quantity": 2, "price": "89.90",
    }  # fmt: skip
    assert "customer" not in placed.properties  # what automations need, not the payload

    refunds = events(api, "Order Refunded")
    assert [e.value for e in refunds] == [Decimal("80.91"), Decimal("117.98")]
    [created] = events(api, "Shipment Created")
    assert created.properties["tracking_number"]
    assert created.properties["tracking_url"].startswith("https://")

    contact = api.ledger.get_contact(api.account.id, placed.contact_id)
    assert contact is not None
    assert (contact.email, contact.phone) == ("ana.souza@exemplo.com.br", "+5511987654321")
    assert contact.external_id == "shopify:customer:7203918462249"

    row = order_row(api, ANA_ORDER)
    assert row["status"] == "partially_refunded"  # ahead of fulfilled and delivered
    assert (row["total"], row["refunded"], row["currency"]) == (
        Decimal("297.90"), Decimal("198.89"), "BRL",
    )  # fmt: skip
    assert row["number"] == "#1042"
    assert row["contact_id"] == str(placed.contact_id)
    assert [s for s, _ in deliveries(api)] == ["processed"] * len(sent)


async def test_shopify_checkout_and_customer_topics(api: Api, shopify: Shop) -> None:
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "customers_create"), "customers/create")

    [started] = events(api, "Checkout Started")
    assert started.properties["checkout_url"].endswith("/recover?key=8d2e6f0a1b9c4d7e")
    assert started.value == Decimal("310.89")
    assert started.integration_id == UUID(shopify.id)
    [customer] = events(api, "Customer Created")
    contact = api.ledger.get_contact(api.account.id, customer.contact_id)
    assert contact is not None
    assert contact.phone == "+5521976543210"  # "+55 21 7654-3210": the ninth digit added
    assert contact.external_id == "shopify:customer:7203918527785"


async def test_a_redelivered_payload_under_a_new_webhook_id_is_still_one_event(
    api: Api, shopify: Shop
) -> None:
    first = await shopify.deliver(fixture("shopify", "orders_paid"), "orders/paid")
    again = await shopify.deliver(fixture("shopify", "orders_paid"), "orders/paid")
    assert (first["status"], again["status"]) == ("processed", "processed")
    assert first["delivery_id"] != again["delivery_id"]  # two deliveries kept raw
    assert metrics(api) == {"Order Paid": 1, "Contact Created": 1}


async def test_protected_customer_data_records_against_the_store_customer_id(
    api: Api, shopify: Shop
) -> None:
    await shopify.deliver(fixture("shopify", "orders_create_protected_customer"), "orders/create")
    later = fixture("shopify", "fulfillments_create_without_tracking")  # no email, no phone
    await shopify.deliver(later, "fulfillments/create")

    [placed] = events(api, "Order Placed")
    [shipped] = events(api, "Shipment Created")
    assert shipped.contact_id == placed.contact_id
    contact = api.ledger.get_contact(api.account.id, placed.contact_id)
    assert contact is not None
    assert (contact.email, contact.phone) == (None, None)
    assert contact.external_id == "shopify:customer:7203918495017"
    assert placed.value == Decimal("108.00")
    assert "tracking_number" not in shipped.properties


async def test_payloads_with_nulls_where_shopify_allows_them(api: Api, shopify: Shop) -> None:
    order = fixture("shopify", "orders_create")
    for field in ("customer", "billing_address", "shipping_address", "discount_codes",
                  "current_subtotal_price", "total_shipping_price_set", "checkout_token",
                  "cart_token", "phone", "note", "order_status_url"):  # fmt: skip
        order[field] = None
    order["line_items"][0]["sku"] = None
    order["line_items"][1]["product_id"] = None
    answer = await shopify.deliver(order, "orders/create")
    refund = fixture("shopify", "refunds_create_without_transactions")
    refund["note"] = None
    refund_answer = await shopify.deliver(refund, "refunds/create")

    assert (answer["status"], refund_answer["status"]) == ("processed", "processed")
    [placed] = events(api, "Order Placed")
    assert "discount_codes" not in placed.properties
    assert "sku" not in placed.properties["items"][0]
    assert placed.properties["items"][1]["sku"] == "CAL-LIN-AR-40"
    [refunded] = events(api, "Order Refunded")
    assert refunded.properties["amount_source"] == "line_items"
    assert refunded.contact_id == placed.contact_id
    contact = api.ledger.get_contact(api.account.id, placed.contact_id)
    assert contact is not None
    assert (contact.email, contact.external_id) == ("ana.souza@exemplo.com.br", None)


async def test_an_order_cancelled_before_its_created_webhook_ends_cancelled_with_both_events(
    api: Api, shopify: Shop
) -> None:
    await shopify.deliver(fixture("shopify", "orders_cancelled"), "orders/cancelled")
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")
    await shopify.deliver(fixture("shopify", "orders_paid"), "orders/paid")  # late, too

    assert metrics(api) == {
        "Order Cancelled": 1, "Order Placed": 1, "Order Paid": 1, "Contact Created": 1,
    }  # fmt: skip
    [cancelled] = events(api, METRIC_ORDER_CANCELLED)
    assert cancelled.value == Decimal("297.90")  # what was ordered, not the 0.00 left
    row = order_row(api, ANA_ORDER)
    assert row["status"] == "cancelled"
    assert row["total"] == Decimal("297.90")  # what was ordered; Shopify's current total: 0.00


async def test_a_second_partial_refund_after_an_order_webhook_leaves_the_order_partly_refunded(
    api: Api, shopify: Shop
) -> None:
    placed = fixture("shopify", "orders_create")
    placed["total_price"] = placed["current_total_price"] = "100.00"
    fulfilled = fixture("shopify", "orders_fulfilled")
    fulfilled.update(
        total_price="100.00", current_total_price="50.00", financial_status="partially_refunded"
    )  # Shopify's current total has the first refund taken off already
    await shopify.deliver(placed, "orders/create")
    await shopify.deliver(refund(1, "50.00"), "refunds/create")
    await shopify.deliver(fulfilled, "orders/fulfilled")
    await shopify.deliver(refund(2, "10.00"), "refunds/create")

    row = order_row(api, ANA_ORDER)
    assert (row["status"], row["total"], row["refunded"]) == (
        "partially_refunded", Decimal("100.00"), Decimal("60.00"),
    )  # fmt: skip
    [done] = events(api, "Order Fulfilled")
    # what was ordered, like every order event: the refunds are events of their own
    assert (done.value, done.properties["total"]) == (Decimal("100.00"), "100.00")

    await shopify.deliver(refund(3, "40.00"), "refunds/create")  # the rest
    assert order_row(api, ANA_ORDER)["status"] == "refunded"


def delivered_to_a_neighbour() -> dict[str, Any]:
    """fulfillments/update "delivered" of the fixture order, its destination naming someone
    other than the buyer (and no email)."""
    delivered = shipment("delivered")
    delivered["destination"]["phone"] = NEIGHBOUR
    delivered["email"] = None
    return delivered


async def test_a_shipment_before_its_order_waits_and_is_the_buyers_once_the_order_arrives(
    api: Api, shopify: Shop
) -> None:
    early = await shopify.deliver(delivered_to_a_neighbour(), "fulfillments/update")
    assert early["status"] == "deferred"
    assert ANA_ORDER in early["reason"]
    assert (count(api.url, "events"), count(api.url, "contacts")) == (0, 0)
    due = due_at(api)
    assert due == deferred(api)[0].received_at + timedelta(seconds=60)  # the default grace
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")  # seconds later

    assert webhooks.process_deferred(api.ledger, due + timedelta(seconds=1)) == 1

    [placed] = events(api, "Order Placed")
    [arrived] = events(api, "Shipment Delivered")
    assert arrived.contact_id == placed.contact_id  # the buyer, not the neighbour
    assert count(api.url, "contacts") == 1
    assert order_row(api, ANA_ORDER)["status"] == "delivered"
    assert deliveries(api) == [("processed", None), ("processed", None)]


async def test_a_shipment_of_an_order_that_never_comes_is_the_recipients_after_the_grace(
    api: Api, shopify: Shop
) -> None:
    # a store connected mid-life: the order was placed before, its webhook will never come
    early = await shopify.deliver(delivered_to_a_neighbour(), "fulfillments/update")
    assert early["status"] == "deferred"

    assert webhooks.process_deferred(api.ledger, due_at(api) + timedelta(seconds=1)) == 1

    [arrived] = events(api, "Shipment Delivered")
    recipient = api.ledger.get_contact(api.account.id, arrived.contact_id)
    assert recipient is not None
    assert recipient.phone == "+5521998765432"
    assert arrived.properties["order_id"] == ANA_ORDER
    assert deliveries(api) == [("processed", None)]
    assert count(api.url, "orders") == 0  # no row to move, and none made up


# -- contacts first seen through a store ------------------------------------------------


def another_order(kind: str, n: int) -> tuple[dict[str, Any], str | None]:
    """Ana's fixture order under another id (the `n`th), with no checkout; its topic."""
    if kind == "shopify":
        order = fixture("shopify", "orders_create")
        order["id"], order["name"] = 6000 + n, f"#{6000 + n}"
        order["checkout_token"] = order["cart_token"] = None
        return order, "orders/create"
    order = fixture("yampi", "order_created")
    order["resource"]["id"] = order["resource"]["number"] = 6000 + n
    order["resource"]["cart_token"] = None
    return order, None


@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_a_customer_first_seen_through_an_order_gets_contact_created_once(
    api: Api, hooks: httpx.AsyncClient, kind: str
) -> None:
    shop = await connect(api, hooks, kind)
    welcome = await api.post("/v1/automations", {
        "name": "Boas-vindas", "trigger_type": "new_contact",
        "steps": [{"type": "add_tag", "tag": "boas-vindas"}],
    })  # fmt: skip
    assert welcome.status_code == 201, welcome.text
    first = another_order(kind, 1)
    await shop.deliver(*first)
    await shop.deliver(*first)  # sent again (Shopify: under a new webhook id)
    await shop.deliver(*another_order(kind, 2))  # her next order
    assert await asyncio.to_thread(webhooks.replay, api.ledger, ("processed",))

    [created] = events(api, "Contact Created")
    placed = events(api, "Order Placed")
    assert len(placed) == 2
    assert {e.contact_id for e in placed} == {created.contact_id}
    contact = api.ledger.get_contact(api.account.id, created.contact_id)
    assert contact is not None
    # as a contact first seen through WhatsApp or the API gets it, with the store as source
    assert (created.source, created.unique_event_id) == (kind, f"{kind}:contact:{contact.id}")
    assert (created.entity_type, created.entity_id) == ("contact", str(contact.id))
    assert created.properties["phone"] == contact.phone == "+5511987654321"
    assert created.properties["email"] == contact.email == "ana.souza@exemplo.com.br"
    run_automations(api)  # the new_contact automation runs for her, once
    assert api.ledger.list_tags(api.account.id, contact.id) == ["boas-vindas"]
    assert len(events(api, "Tag Added")) == 1


@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_a_customer_known_before_their_first_order_gets_no_second_contact_created(
    api: Api, hooks: httpx.AsyncClient, kind: str
) -> None:
    shop = await connect(api, hooks, kind)
    known = await api.post("/v1/contacts", {"phone": "+55 11 98765-4321", "name": "Ana"})
    assert known.status_code == 201, known.text

    await shop.deliver(*another_order(kind, 1))

    [placed] = events(api, "Order Placed")
    assert str(placed.contact_id) == known.json()["id"]
    assert [e.source for e in events(api, "Contact Created")] == ["api"]


async def test_a_customer_first_seen_by_email_gains_the_phone_their_order_names(
    api: Api, shopify: Shop
) -> None:
    # the checkout names her email alone; her order, her phone too
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")

    [created] = events(api, "Contact Created")
    assert created.properties.get("phone") is None
    [placed] = events(api, "Order Placed")
    assert placed.contact_id == created.contact_id
    contact = api.ledger.get_contact(api.account.id, placed.contact_id)
    assert contact is not None
    assert contact.phone == "+5511987654321"  # automations can message her now
    [updated] = events(api, "Contact Updated")
    assert (updated.contact_id, updated.source) == (contact.id, "shopify")
    assert updated.properties == {"phone": "+5511987654321", "changed": ["phone"]}
    # her WhatsApp number now finds her, not a second contact
    found, is_new = api.ledger.resolve_contact(api.account.id, phone="5511987654321")
    assert (found.id, is_new) == (contact.id, False)


@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_an_order_keeps_what_its_contact_has_and_leaves_anothers_email(
    api: Api, hooks: httpx.AsyncClient, kind: str
) -> None:
    shop = await connect(api, hooks, kind)
    known = await api.post("/v1/contacts", {"phone": "+55 11 98765-4321", "name": "Ana S."})
    other = await api.post("/v1/contacts", {"email": "ana.souza@exemplo.com.br", "name": "Bia"})
    assert (known.status_code, other.status_code) == (201, 201)

    await shop.deliver(*another_order(kind, 1))

    [placed] = events(api, "Order Placed")
    assert str(placed.contact_id) == known.json()["id"]  # found by her phone
    contact = api.ledger.get_contact(api.account.id, placed.contact_id)
    assert contact is not None
    assert (contact.name, contact.email) == ("Ana S.", None)  # the email is Bia's
    assert contact.external_id is not None  # the store's customer id was free: taken
    [updated] = events(api, "Contact Updated")
    assert updated.properties["changed"] == ["external_id"]


@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_concurrent_orders_of_a_new_customer_make_one_contact_and_one_contact_created(
    api: Api, hooks: httpx.AsyncClient, kind: str
) -> None:
    shop = await connect(api, hooks, kind)
    orders = [another_order(kind, n) for n in range(8)]

    answers = await asyncio.gather(*(shop.send(*order) for order in orders))

    assert {a.json()["status"] for a in answers} == {"processed"}
    assert len(events(api, "Order Placed")) == 8
    assert count(api.url, "contacts") == 1
    [created] = events(api, "Contact Created")
    assert created.source == kind


@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_an_order_no_event_validation_accepts_makes_no_contact_and_no_contact_created(
    api: Api, hooks: httpx.AsyncClient, kind: str
) -> None:
    shop = await connect(api, hooks, kind)
    order, topic = another_order(kind, 1)
    if kind == "shopify":
        order["created_at"] = "1999-12-01T10:00:00-03:00"
    else:
        order["resource"]["created_at"]["date"] = "1999-12-01 10:00:00.000000"

    answer = await shop.deliver(order, topic)

    assert answer["status"] == "unmappable"
    assert answer["reason"].startswith("invalid_event")
    # nothing half-written: no contact, so no Contact Created to fire new_contact
    assert count(api.url, "contacts") == 0
    assert count(api.url, "events") == 0
    assert count(api.url, "orders") == 0

    await shop.deliver(*another_order(kind, 2))  # a valid order of hers still makes her

    assert count(api.url, "contacts") == 1
    [created] = events(api, "Contact Created")
    [placed] = events(api, "Order Placed")
    assert (created.source, created.contact_id) == (kind, placed.contact_id)


# -- redeliveries, signatures, integrations ----------------------------------------------


@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_a_storm_of_20_concurrent_redeliveries_records_one_event(
    api: Api, hooks: httpx.AsyncClient, kind: str
) -> None:
    shop = await connect(api, hooks, kind)
    if kind == "shopify":
        payload, topic = fixture("shopify", "orders_create"), "orders/create"
    else:
        payload, topic = fixture("yampi", "order_created"), None
    body = json.dumps(payload).encode()
    webhook_id = str(uuid4())  # Shopify keeps the id across retries

    answers = await asyncio.gather(
        *(shop.send(body, topic, webhook_id=webhook_id) for _ in range(20))
    )

    assert [a.status_code for a in answers] == [200] * 20
    assert {a.json()["status"] for a in answers} <= {"processed", "duplicate"}
    assert len({a.json()["delivery_id"] for a in answers}) == 1
    assert metrics(api) == {"Order Placed": 1, "Contact Created": 1}
    assert count(api.url, "webhook_deliveries") == 1
    assert count(api.url, "orders") == 1
    assert count(api.url, "contacts") == 1
    summary = api.ledger.get_summary(api.account.id)
    assert sorted((s.metric_name, s.event_count) for s in summary) == [
        ("Contact Created", 1), ("Order Placed", 1),
    ]  # fmt: skip
    later = await shop.send(body, topic, webhook_id=webhook_id)
    assert later.json()["status"] == "duplicate"


@pytest.mark.parametrize(
    ("first_topic", "then", "changed"),
    [
        ("checkouts/create", "orders_create", "topic (checkouts/create) and body"),
        ("", "checkouts_create", "topic (none)"),
    ],
)
async def test_another_delivery_under_a_kept_webhook_id_is_not_processed_and_says_why(
    api: Api, shopify: Shop, first_topic: str, then: str, changed: str
) -> None:
    """The README's hand-made Shopify request has a fixed X-Shopify-Webhook-Id: an order
    sent next with it answered "duplicate" and recorded nothing, saying nothing of why;
    the checkout sent again with the topic it had lacked answered for the kept one,
    "unmappable: … no X-Shopify-Topic header"."""
    first = await shopify.send(fixture("shopify", "checkouts_create"), first_topic,
                               webhook_id="wh-readme")  # fmt: skip
    topic = "orders/create" if then == "orders_create" else "checkouts/create"
    second = await shopify.send(fixture("shopify", then), topic, webhook_id="wh-readme")

    assert second.status_code == 200
    answer = second.json()
    assert answer["status"] == "duplicate"
    assert answer["delivery_id"] == first.json()["delivery_id"]
    assert answer["reason"] == (
        f"delivery id wh-readme came before, as delivery {answer['delivery_id']}, with "
        f"another {changed}: this one was neither kept nor processed; give each delivery "
        "an id of its own"
    )
    assert events(api, "Order Placed") == []
    assert count(api.url, "webhook_deliveries") == 1
    assert deliveries(api) == [(first.json()["status"], first.json()["reason"])]


@pytest.mark.parametrize(
    "tamper",
    ["missing", "wrong_secret", "not_base64", "tampered_body", "other_integration_secret"],
)
@pytest.mark.parametrize("kind", ["shopify", "yampi"])
async def test_a_bad_signature_is_401_and_nothing_is_stored(
    api: Api, hooks: httpx.AsyncClient, kind: str, tamper: str
) -> None:
    shop = await connect(api, hooks, kind)
    other = await connect(api, hooks, kind)
    payload = fixture(kind, "orders_create" if kind == "shopify" else "order_created")
    body = json.dumps(payload).encode()
    sign = sign_shopify if kind == "shopify" else sign_yampi
    signature, sent = {
        "missing": ("", body),
        "wrong_secret": (sign("not-the-secret", body), body),
        "not_base64": ("%%%not-base64%%%", body),
        "tampered_body": (sign(shop.secret, body), body.replace(b"297.9", b"2.9")),
        "other_integration_secret": (sign(other.secret, body), body),
    }[tamper]

    response = await shop.send(sent, "orders/create", signature=signature)

    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "/problems/invalid-signature"
    assert "www-authenticate" not in response.headers  # no bearer token is expected here
    assert count(api.url, "webhook_deliveries") == 0
    assert count(api.url, "events") == 0
    assert count(api.url, "orders") == 0


@pytest.mark.parametrize("case", ["unknown", "malformed", "deleted", "other_kind"])
async def test_an_unknown_integration_is_404_and_nothing_is_stored(
    api: Api, hooks: httpx.AsyncClient, case: str
) -> None:
    shop = await connect(api, hooks, "shopify")
    yampi_shop = await connect(api, hooks, "yampi")
    if case == "deleted":
        deleted = await api.client.delete(f"/v1/integrations/{shop.id}")
        assert deleted.status_code == 204
    path = {
        "unknown": f"/webhooks/shopify/{uuid4()}",
        "malformed": "/webhooks/shopify/not-a-uuid",
        "deleted": shop.path,
        "other_kind": f"/webhooks/shopify/{yampi_shop.id}",  # a Yampi integration's id
    }[case]

    response = await shop.send(fixture("shopify", "orders_create"), "orders/create", path=path)

    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"
    assert count(api.url, "webhook_deliveries") == 0
    assert count(api.url, "events") == 0


async def test_a_body_over_2_mb_is_413_and_nothing_is_stored(api: Api, shopify: Shop) -> None:
    order = fixture("shopify", "orders_create")
    order["note"] = "x" * (2 * 1024 * 1024)
    response = await shopify.send(order, "orders/create")
    assert response.status_code == 413
    assert count(api.url, "webhook_deliveries") == 0


@pytest.mark.parametrize("grace", [-1, 3601, 1.5, True, "60"])
async def test_shopify_order_grace_must_be_whole_seconds_up_to_an_hour(
    api: Api, grace: Any
) -> None:
    answer = await api.post(
        "/v1/integrations", {"kind": "shopify", "secret": "s", "order_grace_seconds": grace}
    )
    assert answer.status_code == 422
    assert [e["field"] for e in answer.json()["errors"]] == ["order_grace_seconds"]


async def test_a_verified_unmappable_payload_is_200_and_kept_with_its_reason(
    api: Api, shopify: Shop
) -> None:
    unknown_topic = await shopify.deliver({"id": 1}, "app/uninstalled")
    not_json = await shopify.send(b"<xml/>", "orders/create")
    no_customer = fixture("shopify", "orders_create")
    for field in ("customer", "email", "contact_email", "billing_address", "shipping_address"):
        no_customer[field] = None
    nobody = await shopify.deliver(no_customer, "orders/create")

    assert unknown_topic["status"] == "unmappable"
    assert unknown_topic["reason"].startswith("unsupported_topic")
    assert (not_json.status_code, not_json.json()["status"]) == (200, "unmappable")
    assert nobody["reason"].startswith("no_contact")
    assert [s for s, _ in deliveries(api)] == ["unmappable"] * 3
    assert count(api.url, "events") == 0


async def test_metrics_count_webhook_deliveries_by_provider_and_outcome(
    api: Api, shopify: Shop, yampi_shop: Shop
) -> None:
    """/metrics showed a webhook only as a 200 of its route, whatever became of it: a
    store whose every delivery was unmappable or failed looked healthy."""
    order = fixture("shopify", "orders_create")
    assert (await shopify.deliver(order, "orders/create"))["status"] == "processed"
    webhook_id = str(uuid4())
    for _ in range(2):  # the provider's retry: the same id and body
        again = await shopify.send(order, "orders/create", webhook_id=webhook_id)
        assert again.status_code == 200, again.text
    assert (await shopify.deliver({"id": 1}, "app/uninstalled"))["status"] == "unmappable"
    assert (await shopify.send({"id": 2}, "orders/create", signature="bad")).status_code == 401
    assert (await yampi_shop.deliver({"event": "nope"}))["status"] == "unmappable"

    metrics = (await api.client.get("/metrics")).text
    counted = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in metrics.splitlines()
        if line.startswith("sinal_webhook_deliveries_total{")
    }
    assert counted == {
        'sinal_webhook_deliveries_total{provider="shopify",status="processed"}': 2.0,
        'sinal_webhook_deliveries_total{provider="shopify",status="duplicate"}': 1.0,
        'sinal_webhook_deliveries_total{provider="shopify",status="unmappable"}': 1.0,
        'sinal_webhook_deliveries_total{provider="yampi",status="unmappable"}': 1.0,
    }


async def test_a_signed_order_body_sent_again_under_another_topic_records_nothing(
    api: Api, shopify: Shop
) -> None:
    # The signature covers the body only: whoever holds one signed orders/create body
    # (a log, a proxy) can send it again with any X-Shopify-Topic and a new webhook id.
    order = fixture("shopify", "orders_create")
    order["token"] = "9a8b7c6d5e4f30211203f4e5d6c7b8a9"  # Shopify orders carry one
    body = json.dumps(order).encode()
    assert (await shopify.send(body, "orders/create")).json()["status"] == "processed"

    for topic in ("orders/paid", "orders/cancelled", "orders/fulfilled", "checkouts/create",
                  "customers/create"):  # fmt: skip
        answer = (await shopify.send(body, topic)).json()
        assert answer["status"] == "unmappable", topic
        assert answer["reason"].startswith("topic_mismatch"), topic

    assert metrics(api) == {"Order Placed": 1, "Contact Created": 1}
    assert order_row(api, ANA_ORDER)["status"] == "pending"
    assert count(api.url, "checkouts") == 0
    later = datetime(2024, 6, 1, tzinfo=UTC)
    assert derive_abandoned(api.ledger, now=later) == 0


async def test_a_signed_checkout_body_sent_again_under_another_topic_records_nothing(
    api: Api, shopify: Shop
) -> None:
    # A checkout carries no admin_graphql_api_id: its shape alone says what it is.
    body = json.dumps(fixture("shopify", "checkouts_create")).encode()
    for topic in sorted(shopify_hooks.TOPICS - {"checkouts/create", "checkouts/update"}):
        answer = (await shopify.send(body, topic)).json()
        assert answer["status"] == "unmappable", topic
        assert answer["reason"].startswith("topic_mismatch"), topic

    # nor does a body whose subscription left out every field that says what it is
    bare = fixture("shopify", "checkouts_create")
    del bare["abandoned_checkout_url"]
    answer = await shopify.deliver(bare, "orders/create")
    assert answer["status"] == "unmappable"
    assert answer["reason"] == (
        "topic_mismatch: the body shows no Order for orders/create"
        " (order_number or order_status_url)"
    )

    assert metrics(api) == {}
    assert count(api.url, "orders") == 0
    assert count(api.url, "checkouts") == 0


# -- abandoned carts ---------------------------------------------------------------------


async def test_an_abandoned_checkout_is_derived_once_on_a_driven_clock_and_then_recovered(
    api: Api, shopify: Shop
) -> None:
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "checkouts_update"), "checkouts/update")
    await shopify.deliver(fixture("shopify", "checkouts_create_anonymous"), "checkouts/create")
    last_update = datetime(2024, 5, 10, 17, 31, 47, tzinfo=UTC)  # 14:31:47-03:00
    due = last_update + timedelta(minutes=30)  # the integration's abandon_after_minutes

    assert derive_abandoned(api.ledger, now=due - timedelta(seconds=1)) == 0
    assert derive_abandoned(api.ledger, now=due) == 1
    assert derive_abandoned(api.ledger, now=due + timedelta(days=3)) == 0  # once per checkout

    [abandoned] = events(api, "Checkout Abandoned")
    assert abandoned.occurred_at == due
    assert abandoned.value == Decimal("297.90")  # the last update's total
    assert abandoned.properties["total"] == "297.90"  # as Checkout Started says it
    assert abandoned.integration_id == UUID(shopify.id)
    assert abandoned.properties["checkout_url"] == (
        "https://loja-da-ana.myshopify.com/68471930921/checkouts/ac/"
        "b7f3c1a9e2d54b8f9a0c6e1d2f3a4b5c/recover?key=8d2e6f0a1b9c4d7e"
    )
    assert abandoned.properties["items"][0]["sku"] == "CAM-ORG-AZ-M"
    assert abandoned.properties["recorded_after_order"] is False  # recorded by a pass

    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")
    await shopify.deliver(fixture("shopify", "orders_paid"), "orders/paid")

    [recovered] = events(api, "Checkout Recovered")
    assert recovered.value == Decimal("297.90")
    assert recovered.properties["order_id"] == ANA_ORDER
    assert recovered.contact_id == abandoned.contact_id
    assert metrics(api)["Checkout Recovered"] == 1
    assert derive_abandoned(api.ledger, now=due + timedelta(days=30)) == 0  # anonymous: never


CART_AUTOMATION = {
    "name": "Carrinho abandonado", "trigger_type": "cart_abandoned",
    "steps": [{"type": "wait", "seconds": 3600}, {"type": "add_tag", "tag": "lembrada"}],
}  # fmt: skip
DUE = datetime(2024, 5, 10, 18, 1, 47, tzinfo=UTC)  # the fixture checkout's update + 30 min


async def abandoned_with_automation(api: Api, shopify: Shop, *, dispatched: bool) -> StoredEvent:
    """The fixture checkout's Checkout Abandoned (at `DUE`), a cart automation listening;
    `dispatched`: its execution made, and waiting in its first step."""
    made = await api.post("/v1/automations", CART_AUTOMATION)
    assert made.status_code == 201, made.text
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "checkouts_update"), "checkouts/update")
    assert derive_abandoned(api.ledger, now=DUE) == 1
    if dispatched:
        run_automations(api)
        assert executions(api) == [("waiting", None)]
    [abandoned] = events(api, "Checkout Abandoned")
    return abandoned


def executions(api: Api) -> list[tuple[str, str | None]]:
    """The account's executions: (status, last_error)."""
    found = Automations(api.ledger).store.list_executions(api.account.id)
    return [(x.status, x.last_error) for x in found]


@pytest.mark.parametrize("dispatched", [True, False], ids=["executions-made", "not-yet"])
async def test_an_order_placed_in_time_but_delivered_after_the_abandonment_corrects_it(
    api: Api, shopify: Shop, dispatched: bool
) -> None:
    # placed at 17:32:10, before the checkout counted as abandoned (18:01:47), its webhook
    # comes after the worker recorded the abandonment (retried by Shopify, sinal was down)
    abandoned = await abandoned_with_automation(api, shopify, dispatched=dispatched)

    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")
    run_automations(api)

    [placed] = events(api, "Order Placed")
    [recovered] = events(api, "Checkout Recovered")
    assert placed.occurred_at < abandoned.occurred_at == DUE
    assert recovered.occurred_at == DUE  # not at the order's time: recovered before abandoned
    assert recovered.properties["ordered_before_abandonment"] is True
    assert (recovered.value, recovered.properties["order_id"]) == (Decimal("297.90"), ANA_ORDER)
    summary = {s.metric_name: s for s in api.ledger.get_summary(api.account.id, placed.contact_id)}
    assert summary["Checkout Recovered"].first_event_at == DUE
    assert summary["Checkout Abandoned"].last_event_at == DUE
    # the cart automation stops (or never starts) for a checkout that was never abandoned
    assert executions(api) == ([("stopped", STOPPED_BY_ORDER)] if dispatched else [])


@pytest.mark.parametrize("dispatched", [True, False], ids=["executions-made", "not-yet"])
async def test_the_trace_of_an_abandonment_an_order_predates_says_it_was_withdrawn(
    api: Api, shopify: Shop, dispatched: bool
) -> None:
    """Withdrawn before fan-out, the cart automation is not "triggered" (it never runs): the
    trace says why. Fanned out before, it says the same, with its execution, stopped."""
    abandoned = await abandoned_with_automation(api, shopify, dispatched=dispatched)

    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")  # placed in time
    run_automations(api)

    answer = await api.client.get(f"/v1/events/{abandoned.id}/trace")
    assert answer.status_code == 200, answer.text
    [traced] = answer.json()["automations"]
    assert traced["automation_name"] == "Carrinho abandonado"
    assert (traced["triggered"], traced["outcome"]) == (False, "withdrawn")
    assert traced["message"].endswith(STOPPED_BY_ORDER)
    if dispatched:  # made, then stopped by the order
        assert "after its execution was made" in traced["message"]
        assert traced["execution"]["status"] == "stopped"
    else:
        assert "before they ran" in traced["message"]
        assert "execution" not in traced


async def test_the_trace_finds_the_recovery_behind_a_thousand_later_ones_of_its_contact(
    api: Api, shopify: Shop
) -> None:
    # it read the contact's newest 1,000 Checkout Recovered since the abandonment and
    # looked for its own among them: one customer's later recoveries (other carts, or
    # events a client sent under the metric) hid it, and the trace said "triggered"
    abandoned = await abandoned_with_automation(api, shopify, dispatched=False)
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")  # placed in time
    run_automations(api)
    later = [
        EmitEvent(
            account_id=api.account.id, contact_id=abandoned.contact_id,
            metric_name=METRIC_CHECKOUT_RECOVERED, source="shopify", source_id=f"other-{n}",
            entity_type="checkout", occurred_at=DUE + timedelta(minutes=n + 1),
        )
        for n in range(1000)
    ]  # fmt: skip
    assert {r.status for r in api.ledger.emit_many(later)} == {"created"}

    [traced] = (await api.client.get(f"/v1/events/{abandoned.id}/trace")).json()["automations"]

    assert (traced["triggered"], traced["outcome"]) == (False, "withdrawn")
    assert traced["message"].endswith(STOPPED_BY_ORDER)


async def test_the_trace_of_a_withdrawn_abandonment_reads_its_recovery_once(
    api: Api, shopify: Shop
) -> None:
    """Three cart automations, all withdrawn: whether the abandonment was is one read of its
    recovery, not one per automation (PostgreSQL: 3 round trips, were 5)."""
    for n in range(2):
        made = await api.post("/v1/automations", {**CART_AUTOMATION, "name": f"Carrinho {n}"})
        assert made.status_code == 201, made.text
    abandoned = await abandoned_with_automation(api, shopify, dispatched=False)
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")  # placed in time
    run_automations(api)

    with one_connection(api) as ledger, statements(ledger) as sent:
        traced = Automations(ledger).trace(abandoned)

    assert [t["outcome"] for t in traced] == ["withdrawn"] * 3
    if isinstance(api.ledger.store, SQLiteStore):
        assert sum("FROM events" in s for s in sent) == 1
    else:  # the executions, the automations, the recovery
        assert sent == ["Bind"] * 3


async def test_a_cart_execution_a_worker_holds_starts_no_step_once_the_order_came_first(
    api: Api, shopify: Shop
) -> None:
    await abandoned_with_automation(api, shopify, dispatched=False)
    store = Automations(api.ledger).store
    store.fan_out(lambda event, listening: [a.id for a in listening], 10)
    [claim] = store.claim_executions("w1", 10, 60.0)  # a worker about to run its first step

    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")  # placed in time

    assert store.start_step(claim, 0, "wait") == "stopped"
    assert store.advance(claim, Advance("completed", 2))  # as the worker leaves it: it stays
    assert executions(api) == [("stopped", STOPPED_BY_ORDER)]


@pytest.mark.parametrize("dispatched", [True, False], ids=["executions-made", "not-yet"])
async def test_deleting_a_store_stops_the_cart_automations_its_abandonments_have_to_run(
    api: Api, shopify: Shop, yampi_shop: Shop, dispatched: bool
) -> None:
    """A disconnected store sends no order any more to stop a "wait 1 h, then message" for
    a customer who bought: its abandonments' executions still to run stop (or are never
    made), in the delete's transaction. Another store's go on."""
    abandoned = await abandoned_with_automation(api, shopify, dispatched=dispatched)
    await yampi_shop.deliver(fixture("yampi", "cart_reminder"))  # the other store's cart
    if dispatched:
        run_automations(api)

    deleted = await api.client.delete(f"/v1/integrations/{shopify.id}")
    run_automations(api)

    assert deleted.status_code == 204, deleted.text
    assert sorted(executions(api)) == [
        *([("stopped", STOPPED_BY_DISCONNECT)] if dispatched else []),
        ("waiting", None),  # Yampi's cart: its store is connected
    ]
    [traced] = (await api.client.get(f"/v1/events/{abandoned.id}/trace")).json()["automations"]
    assert (traced["triggered"], traced["outcome"]) == (False, "withdrawn")
    assert traced["message"].endswith(STOPPED_BY_DISCONNECT)
    assert ("execution" in traced) is dispatched


@pytest.mark.parametrize("dispatched", [True, False], ids=["executions-made", "not-yet"])
async def test_an_order_placed_after_the_abandonment_recovers_it_at_the_orders_time(
    api: Api, shopify: Shop, dispatched: bool
) -> None:
    abandoned = await abandoned_with_automation(api, shopify, dispatched=dispatched)
    order = fixture("shopify", "orders_create")
    order["created_at"] = "2024-05-10T15:40:00-03:00"  # 18:40 UTC: after the abandonment

    await shopify.deliver(order, "orders/create")
    run_automations(api)

    [recovered] = events(api, "Checkout Recovered")
    assert recovered.occurred_at == datetime(2024, 5, 10, 18, 40, tzinfo=UTC)
    assert recovered.properties["ordered_before_abandonment"] is False
    # abandoned indeed, but its customer bought: the cart message waiting goes out to no one
    assert executions(api) == ([("stopped", STOPPED_BY_RECOVERY)] if dispatched else [])
    [traced] = (await api.client.get(f"/v1/events/{abandoned.id}/trace")).json()["automations"]
    assert (traced["triggered"], traced["outcome"]) == (False, "withdrawn")
    assert traced["message"].endswith(STOPPED_BY_RECOVERY)
    assert ("execution" in traced) is dispatched


async def test_an_order_placed_after_the_due_time_but_before_a_pass_abandons_then_recovers(
    api: Api, shopify: Shop
) -> None:
    """The checkout counted as abandoned at 18:01:47 (sinal's definition), its order was
    placed at 18:40, and its webhook came before a worker's pass recorded the abandonment:
    both are counted, however often the workers look, and no cart message goes out to a
    customer who already bought."""
    made = await api.post("/v1/automations", CART_AUTOMATION)
    assert made.status_code == 201, made.text
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "checkouts_update"), "checkouts/update")
    order = fixture("shopify", "orders_create")
    order["created_at"] = "2024-05-10T15:40:00-03:00"  # 18:40 UTC: after it was due

    await shopify.deliver(order, "orders/create")
    run_automations(api)

    [abandoned] = events(api, "Checkout Abandoned")
    [recovered] = events(api, "Checkout Recovered")
    assert abandoned.occurred_at == DUE
    assert abandoned.properties["recorded_after_order"] is True
    assert abandoned.properties["checkout_url"].endswith("/recover?key=8d2e6f0a1b9c4d7e")
    assert recovered.occurred_at == datetime(2024, 5, 10, 18, 40, tzinfo=UTC)
    assert recovered.properties["ordered_before_abandonment"] is False
    assert executions(api) == []  # the customer bought: no cart automation runs
    [traced] = (await api.client.get(f"/v1/events/{abandoned.id}/trace")).json()["automations"]
    assert (traced["triggered"], traced["outcome"]) == (False, "withdrawn")
    assert "recorded_after_order" in traced["message"]
    assert "execution" not in traced
    # once: a later pass and a redelivery of the order record nothing more
    assert derive_abandoned(api.ledger, now=DUE + timedelta(days=3)) == 0
    await shopify.deliver(order, "orders/create")
    assert metrics(api) == {
        "Contact Created": 1, "Contact Updated": 1, "Checkout Started": 1,
        "Order Placed": 1, "Checkout Abandoned": 1, "Checkout Recovered": 1,
    }  # fmt: skip
    assert checkout_state(api) == (True, True)


async def test_a_checkout_its_customer_came_back_to_after_it_was_due_was_abandoned(
    api: Api, shopify: Shop
) -> None:
    """Due at 17:58:05 (its last update 17:28:05, 30 minutes), its customer came back at
    18:10, before a worker's pass recorded it: it was abandoned, as a pass would have said,
    and the order placed at 18:20, before the new due time (18:40), recovers it."""
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    came_back = fixture("shopify", "checkouts_update")
    came_back["updated_at"] = "2024-05-10T15:10:00-03:00"
    await shopify.deliver(came_back, "checkouts/update")
    order = fixture("shopify", "orders_create")
    order["created_at"] = "2024-05-10T15:20:00-03:00"

    await shopify.deliver(order, "orders/create")

    [abandoned] = events(api, "Checkout Abandoned")
    [recovered] = events(api, "Checkout Recovered")
    assert abandoned.occurred_at == datetime(2024, 5, 10, 17, 58, 5, tzinfo=UTC)
    assert abandoned.value == Decimal("310.89")  # the cart as it was left, before the update
    assert abandoned.properties["recorded_after_order"] is False
    assert recovered.occurred_at == datetime(2024, 5, 10, 18, 20, tzinfo=UTC)
    assert recovered.properties["ordered_before_abandonment"] is False
    assert derive_abandoned(api.ledger, now=datetime(2024, 6, 1, tzinfo=UTC)) == 0
    assert checkout_state(api) == (True, True)


async def test_a_checkout_updated_before_it_was_due_is_rescheduled_not_abandoned(
    api: Api, shopify: Shop
) -> None:
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "checkouts_update"), "checkouts/update")  # 17:31:47

    assert derive_abandoned(api.ledger, now=DUE - timedelta(seconds=1)) == 0
    assert [e.occurred_at for e in events(api, "Checkout Abandoned")] == []
    assert derive_abandoned(api.ledger, now=DUE) == 1


async def test_a_checkout_completed_before_it_is_due_is_never_abandoned(
    api: Api, shopify: Shop
) -> None:
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    order = fixture("shopify", "orders_create")  # carries the checkout's token
    await shopify.deliver(order, "orders/create")

    assert derive_abandoned(api.ledger, now=datetime(2024, 6, 1, tzinfo=UTC)) == 0
    assert "Checkout Abandoned" not in metrics(api)
    assert "Checkout Recovered" not in metrics(api)


async def test_an_order_webhook_racing_the_abandonment_wins_when_it_lands_first(
    api: Api, shopify: Shop
) -> None:
    # the order arrives after the due time but before the worker's pass
    await shopify.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")
    late = datetime(2024, 5, 10, 18, 30, tzinfo=UTC)
    assert derive_abandoned(api.ledger, now=late) == 0


async def test_the_default_delay_is_60_minutes(api: Api, hooks: httpx.AsyncClient) -> None:
    shop = await connect(api, hooks, "shopify")
    await shop.deliver(fixture("shopify", "checkouts_create"), "checkouts/create")
    updated = datetime(2024, 5, 10, 17, 28, 5, tzinfo=UTC)
    assert derive_abandoned(api.ledger, now=updated + timedelta(minutes=59)) == 0
    assert derive_abandoned(api.ledger, now=updated + timedelta(minutes=60)) == 1


@pytest.mark.parametrize("total", ["297.90001", "100000000000000.00"])
async def test_a_checkout_total_no_row_can_hold_is_unmappable_not_due_forever(
    api: Api, shopify: Shop, total: str
) -> None:
    update = fixture("shopify", "checkouts_update")
    update["total_price"] = total

    answer = await shopify.deliver(update, "checkouts/update")

    assert answer["status"] == "unmappable"
    assert answer["reason"].startswith("invalid_amount")
    later = datetime(2024, 6, 1, tzinfo=UTC)
    assert derive_abandoned(api.ledger, now=later) == 0
    assert commerce_store(api.ledger).due_checkouts(later) == []


async def test_an_order_total_no_row_can_hold_is_unmappable_on_both_backends(
    api: Api, yampi_shop: Shop
) -> None:
    invoiced = yampi_status("invoiced")  # moves the row only: no event checks the amount
    invoiced["resource"]["value_total"] = 123456789012345.67

    answer = await yampi_shop.deliver(invoiced)

    assert answer["status"] == "unmappable"
    assert answer["reason"].startswith("invalid_amount")
    assert count(api.url, "orders") == 0


async def test_the_worker_derives_the_abandonment_on_its_own_and_the_cart_automation_runs(
    api: Api, shopify: Shop
) -> None:
    clock = DrivenClock()
    checkout = fixture("shopify", "checkouts_create")
    checkout["updated_at"] = clock().isoformat()  # a live checkout: due in 30 minutes
    checkout["phone"] = "+55 11 98765-4321"
    worker_settings = Settings(database_url=api.url, housekeeping_interval=1,
                               worker_poll_interval=0.05, http_timeout=5,
                               allow_private_webhooks=True)  # fmt: skip
    with whatsapp_server() as (wa_url, wa):
        Automations(api.ledger).create_integration(api.account.id, {
            "kind": "whatsapp", "secret": "app-secret", "phone_number_id": "1234567890",
            "access_token": "EAAG-token", "api_base_url": wa_url,
        })  # fmt: skip
        made = await api.post("/v1/automations", {
            "name": "Carrinho abandonado", "trigger_type": "cart_abandoned",
            "steps": [{"type": "send_message", "text": "Oi {{ contact.name | first_name }}, "
                       "seu carrinho espera: {{ event.properties.checkout_url }}"}],
        })  # fmt: skip
        assert made.status_code == 201, made.text
        worker, stop = start_worker_thread(Ledger(api.ledger.store, clock=clock), worker_settings)
        try:
            await shopify.deliver(checkout, "checkouts/create")
            await asyncio.sleep(1.5)  # two housekeeping passes before it is due
            assert events(api, "Checkout Abandoned") == []

            clock.advance(timedelta(minutes=30))
            await settle(lambda: wa.bodies("/messages"))
            await asyncio.sleep(1.2)  # and another pass: still one
        finally:
            stop.set()
            worker.join(timeout=15)

    assert not worker.is_alive()
    [abandoned] = events(api, "Checkout Abandoned")
    url = abandoned.properties["checkout_url"]
    assert url.endswith(f"/checkouts/ac/{CHECKOUT_TOKEN}/recover?key=8d2e6f0a1b9c4d7e")
    [message] = wa.bodies("/1234567890/messages")
    assert message["to"] == "5511987654321"
    assert message["text"]["body"] == f"Oi Ana, seu carrinho espera: {url}"
    [execution] = Automations(api.ledger).store.list_executions(api.account.id)
    assert (execution.status, execution.event_id) == ("completed", abandoned.id)


# -- Yampi -------------------------------------------------------------------------------


def yampi_status(alias: str, *, time: str = "2024-05-13 09:00:00") -> dict[str, Any]:
    payload = fixture("yampi", "order_status_updated")
    payload["time"] = time
    payload["resource"]["status"]["data"]["alias"] = alias
    payload["resource"]["updated_at"]["date"] = f"{time}.000000"
    return payload


async def test_yampi_events_map_with_sao_paulo_times(api: Api, yampi_shop: Shop) -> None:
    second = fixture("yampi", "order_created")
    second["resource"]["id"] = 31874999
    second["resource"]["number"] = 1000420
    second["resource"]["cart_token"] = None
    sent = [
        fixture("yampi", "order_created"),
        fixture("yampi", "order_paid"),
        yampi_status("refunded"),
        second,
        {**yampi_status("cancelled"), "resource": {**yampi_status("cancelled")["resource"],
                                                   "id": 31874999}},
        fixture("yampi", "customer_created"),
    ]  # fmt: skip
    for payload in sent:
        answer = await yampi_shop.deliver(payload)
        assert answer["status"] == "processed", answer

    assert metrics(api) == {
        "Order Placed": 2, "Order Paid": 1, "Order Refunded": 1, "Order Cancelled": 1,
        "Customer Created": 1, "Contact Created": 2,  # Ana, then João
    }  # fmt: skip
    placed = events(api, "Order Placed")[0]
    # "2024-05-10 14:32:10" has no offset: America/Sao_Paulo (UTC-3)
    assert placed.occurred_at == datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)
    assert (placed.value, placed.currency) == (Decimal("297.90"), "BRL")
    assert placed.integration_id == UUID(yampi_shop.id)
    assert order_row(api, "31874526")["status"] == "refunded"
    assert order_row(api, "31874999")["status"] == "cancelled"
    [refund] = events(api, "Order Refunded")
    assert refund.occurred_at == datetime(2024, 5, 13, 12, 0, tzinfo=UTC)
    contact = api.ledger.get_contact(api.account.id, placed.contact_id)
    assert contact is not None
    assert (contact.phone, contact.email) == ("+5511987654321", "ana.souza@exemplo.com.br")


async def test_a_yampi_status_with_no_event_only_moves_the_order_row(
    api: Api, yampi_shop: Shop
) -> None:
    invoiced = await yampi_shop.deliver(yampi_status("invoiced"))  # before order.created
    await yampi_shop.deliver(fixture("yampi", "order_created"))

    assert invoiced["status"] == "processed"
    assert metrics(api) == {"Order Placed": 1, "Contact Created": 1}
    row = order_row(api, "31874526")
    assert (row["status"], row["total"], row["number"]) == ("paid", Decimal("297.90"), "1000417")
    assert row["contact_id"] == str(events(api, "Order Placed")[0].contact_id)


async def test_yampi_cart_reminder_is_the_abandonment_and_a_later_order_the_recovery(
    api: Api, yampi_shop: Shop
) -> None:
    reminder = fixture("yampi", "cart_reminder")
    order = fixture("yampi", "order_created")
    order["time"] = "2024-05-11 10:00:05"
    order["resource"]["created_at"]["date"] = "2024-05-11 10:00:00.000000"

    await yampi_shop.deliver(reminder)
    await yampi_shop.deliver(reminder)  # Yampi retries: the same body
    await yampi_shop.deliver(order)

    [abandoned] = events(api, "Checkout Abandoned")
    assert abandoned.properties["checkout_url"].startswith(
        "https://lojadaana.pay.yampi.com.br/cart/recover/"
    )
    assert abandoned.occurred_at == datetime(2024, 5, 10, 18, 5, 41, tzinfo=UTC)
    [recovered] = events(api, "Checkout Recovered")
    assert recovered.value == Decimal("297.90")
    assert recovered.contact_id == abandoned.contact_id
    assert recovered.properties["checkout_token"] == "c8a2f1e0-93b4-4d7c-8e5a-0b1c2d3e4f50"
    assert derive_abandoned(api.ledger, now=datetime(2024, 6, 1, tzinfo=UTC)) == 0


async def test_a_yampi_cart_reminder_after_its_order_records_no_abandonment(
    api: Api, yampi_shop: Shop
) -> None:
    await yampi_shop.deliver(fixture("yampi", "order_created"))  # 14:32, with the cart token
    late = await yampi_shop.deliver(fixture("yampi", "cart_reminder"))  # sent at 15:05
    await yampi_shop.deliver(fixture("yampi", "order_paid"))

    assert late["status"] == "processed"
    # nothing abandoned, nothing recovered
    assert metrics(api) == {"Order Placed": 1, "Order Paid": 1, "Contact Created": 1}
    assert checkout_state(api) == (True, False)


@pytest.mark.parametrize("first", ["order", "reminder"])
async def test_a_yampi_cart_reminded_before_its_order_is_abandoned_then_recovered_either_way(
    api: Api, yampi_shop: Shop, first: str
) -> None:
    """Yampi reminded of the cart at 15:05:41 (its time) and the customer ordered the next
    day: abandoned, then recovered, whichever webhook came first (a reminder retried, sinal
    down for a while). Its customer bought: no cart automation runs."""
    made = await api.post("/v1/automations", CART_AUTOMATION)
    assert made.status_code == 201, made.text
    sent = {
        "reminder": fixture("yampi", "cart_reminder"),
        "order": fixture("yampi", "order_created"),
    }
    sent["order"]["time"] = "2024-05-11 10:00:05"
    sent["order"]["resource"]["created_at"]["date"] = "2024-05-11 10:00:00.000000"
    second = "reminder" if first == "order" else "order"

    answers = [await yampi_shop.deliver(sent[first]), await yampi_shop.deliver(sent[second])]
    await yampi_shop.deliver(sent["reminder"])  # Yampi retries: the same body
    run_automations(api)

    assert [a["status"] for a in answers] == ["processed"] * 2
    [abandoned] = events(api, "Checkout Abandoned")
    [recovered] = events(api, "Checkout Recovered")
    assert abandoned.occurred_at == datetime(2024, 5, 10, 18, 5, 41, tzinfo=UTC)
    assert abandoned.properties["recorded_after_order"] is (first == "order")
    assert recovered.occurred_at == datetime(2024, 5, 11, 13, 0, tzinfo=UTC)  # when ordered
    assert recovered.contact_id == abandoned.contact_id
    said = recovered.properties
    assert (recovered.value, Decimal(said.pop("total"))) == (Decimal("297.90"),) * 2
    assert said == {
        "checkout_token": "c8a2f1e0-93b4-4d7c-8e5a-0b1c2d3e4f50", "order_id": "31874526",
        "order_number": "1000417", "ordered_before_abandonment": False,
    }  # fmt: skip
    assert executions(api) == []  # withdrawn: recorded with the order, or recovered unrun
    [traced] = (await api.client.get(f"/v1/events/{abandoned.id}/trace")).json()["automations"]
    assert (traced["triggered"], traced["outcome"]) == (False, "withdrawn")
    assert checkout_state(api) == (True, True)
    assert metrics(api) == {
        "Order Placed": 1, "Checkout Abandoned": 1, "Checkout Recovered": 1,
        "Contact Created": 1,
    }  # fmt: skip


@pytest.mark.parametrize("first", ["order", "reminder"])
async def test_a_yampi_order_racing_its_cart_reminder_ends_recovered_or_never_abandoned(
    api: Api, yampi_shop: Shop, monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    from sinal.store import postgres_commerce, sqlite_commerce

    backend = sqlite_commerce if api.url.startswith("sqlite") else postgres_commerce
    # The first pauses in its transaction after its write, before its commit (the order
    # having completed the checkouts it saw, the reminder having written the checkout row);
    # unserialized, the second would run to its end meanwhile.
    name = "_complete_checkouts" if first == "order" else "_write_checkout"
    write = getattr(backend, name)
    in_window, second_done = threading.Event(), threading.Event()

    def paused(*args: Any, **kwargs: Any) -> Any:
        done = write(*args, **kwargs)
        in_window.set()
        second_done.wait(timeout=0.5)
        return done

    monkeypatch.setattr(backend, name, paused)
    sent = {"order": fixture("yampi", "order_created")}
    sent["reminder"] = fixture("yampi", "cart_reminder")
    running = asyncio.create_task(yampi_shop.send(sent.pop(first)))
    assert await asyncio.to_thread(in_window.wait, 10)
    [second] = sent.values()
    answer = await yampi_shop.send(second)
    second_done.set()

    assert [(await running).json()["status"], answer.json()["status"]] == ["processed"] * 2
    if first == "order":  # the reminder waited for it, and saw it
        assert metrics(api) == {"Order Placed": 1, "Contact Created": 1}
        assert checkout_state(api) == (True, False)
    else:  # the order waited for the abandonment, and recovered it
        assert metrics(api) == {
            "Checkout Abandoned": 1, "Order Placed": 1, "Checkout Recovered": 1,
            "Contact Created": 1,
        }  # fmt: skip
        assert checkout_state(api) == (True, True)


@pytest.mark.parametrize(
    ("alias", "merchant", "status"),
    [
        ("outraloja", "lojadaana", "unmappable"),  # another store's body
        ("lojadaana", "lojadaana", "processed"),
        (" LojaDaAna ", "lojadaana", "processed"),  # as typed: trimmed, any case
        ("lojadaana", None, "processed"),  # the body names no store: no check
        (None, "outraloja", "processed"),  # no alias set: no check
    ],
)
async def test_a_yampi_body_naming_another_merchant_than_the_alias_set_records_nothing(
    api: Api, hooks: httpx.AsyncClient, alias: str | None, merchant: str | None, status: str
) -> None:
    shop = await connect(api, hooks, "yampi", **({} if alias is None else {"alias": alias}))
    order = fixture("yampi", "order_created")
    order["merchant"]["alias"] = merchant

    answer = await shop.deliver(order)

    assert answer["status"] == status
    if status == "unmappable":
        assert answer["reason"].startswith("merchant_mismatch")
        assert "'lojadaana'" in answer["reason"]
        assert [count(api.url, t) for t in ("events", "contacts", "orders", "checkouts")] == [
            0, 0, 0, 0,
        ]  # fmt: skip
    else:
        assert metrics(api) == {"Order Placed": 1, "Contact Created": 1}


def checkout_state(api: Api) -> tuple[bool, bool]:
    """The one checkout's (completed, abandoned)."""
    [(completed, abandoned)] = sql(
        api.url,
        "SELECT completed_at IS NOT NULL, abandoned_at IS NOT NULL FROM checkouts "
        "WHERE account_id = ?",
        str(api.account.id),
    )
    return bool(completed), bool(abandoned)


async def test_a_brazilian_phone_with_and_without_the_ninth_digit_is_one_contact(
    api: Api, shopify: Shop, yampi_shop: Shop
) -> None:
    customer = fixture("shopify", "customers_create")  # "+55 21 7654-3210"
    customer["email"] = None
    await shopify.deliver(customer, "customers/create")
    theirs = fixture("yampi", "customer_created")
    theirs["resource"]["email"] = "outro.email@exemplo.com.br"
    theirs["resource"]["phone"] = {"full_number": "21976543210"}  # with the ninth digit
    await yampi_shop.deliver(theirs)

    created = events(api, "Customer Created")
    assert len(created) == 2
    assert created[0].contact_id == created[1].contact_id
    assert count(api.url, "contacts") == 1


async def test_a_delivery_the_database_could_not_process_is_503_and_its_redelivery_processed(
    api: Api, shopify: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sinal import commerce

    process = commerce.process_shopify
    outages = [StoreUnavailable("terminating connection due to administrator command")]

    def flaky(*args: Any) -> None:
        if outages:  # the database goes away once, after the delivery was kept
            raise outages.pop()
        process(*args)

    monkeypatch.setattr(commerce, "process_shopify", flaky)
    order = fixture("shopify", "orders_create")
    first = await shopify.send(order, "orders/create", webhook_id="wh-1")
    kept = deliveries(api)
    again = await shopify.send(order, "orders/create", webhook_id="wh-1")  # Shopify retries

    assert first.status_code == 503  # not 200: Shopify delivers it again
    assert kept == [("received", None)]  # kept raw, not marked failed
    assert again.status_code == 200
    assert again.json()["status"] == "processed"
    assert deliveries(api) == [("processed", None)]
    assert len(events(api, "Order Placed")) == 1


# -- replay ------------------------------------------------------------------------------


async def test_a_refund_before_its_order_waits_then_is_kept_and_replayed_by_the_cli(
    api: Api, shopify: Shop
) -> None:
    early = await shopify.deliver(fixture("shopify", "refunds_create_partial_1"), "refunds/create")
    assert early["status"] == "deferred"  # its order may be seconds behind
    assert webhooks.process_deferred(api.ledger, due_at(api) + timedelta(seconds=1)) == 1
    [(status, reason)] = deliveries(api)  # it was not: a refund names no one to file it under
    assert status == "unmappable"
    assert str(reason).startswith("unknown_order")
    assert (count(api.url, "events"), count(api.url, "contacts")) == (0, 0)
    await shopify.deliver(fixture("shopify", "orders_create"), "orders/create")

    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["webhooks", "replay", "--status", "unmappable,failed", "--database-url", api.url],
    )

    assert result.exit_code == 0, result.output
    assert "1 processed" in result.output
    [refund] = events(api, "Order Refunded")
    assert refund.value == Decimal("80.91")
    assert refund.contact_id == events(api, "Order Placed")[0].contact_id
    row = order_row(api, ANA_ORDER)
    assert (row["status"], row["refunded"]) == ("partially_refunded", Decimal("80.91"))
    assert [s for s, _ in deliveries(api)] == ["processed", "processed"]
    again = CliRunner().invoke(cli, ["webhooks", "replay", "--database-url", api.url, "--json"])
    assert json.loads(again.output) == {"replayed": 0, "outcome": {}}


async def test_a_new_status_alias_is_kept_unmappable_and_replayed_after_the_mapping_is_fixed(
    api: Api, yampi_shop: Shop, monkeypatch: pytest.MonkeyPatch
) -> None:
    await yampi_shop.deliver(fixture("yampi", "order_created"))
    disputed = await yampi_shop.deliver(yampi_status("chargeback"))
    assert disputed["status"] == "unmappable"
    assert disputed["reason"].startswith("unknown_status_alias")

    # the fix: a release maps Yampi's new alias
    aliases = dict(yampi.STATUS_ALIASES)
    aliases["chargeback"] = ("cancelled", (METRIC_ORDER_CANCELLED,))
    monkeypatch.setattr(yampi, "STATUS_ALIASES", aliases)
    result = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["webhooks", "replay", "--account", str(api.account.id), "--database-url", api.url],
    )

    assert result.exit_code == 0, result.output
    [cancelled] = events(api, "Order Cancelled")
    assert cancelled.properties["status"] == "chargeback"
    assert order_row(api, "31874526")["status"] == "cancelled"
    assert [s for s, _ in deliveries(api)] == ["processed", "processed"]


async def test_replay_pages_through_every_kept_delivery_with_a_correct_progress(
    api: Api, hooks: httpx.AsyncClient
) -> None:
    shopify = await connect(api, hooks, "shopify", order_grace_seconds=0)  # kept at once
    orders = [str(7000 + i) for i in range(7)]
    for i, order_id in enumerate(orders):  # seven refunds, each before its order
        refund = fixture("shopify", "refunds_create_partial_1")
        refund["id"], refund["order_id"] = 9000 + i, int(order_id)
        assert (await shopify.deliver(refund, "refunds/create"))["status"] == "unmappable"
    for order_id in orders[:5]:  # five orders arrive; two are still unknown
        order = fixture("shopify", "orders_create")
        order["id"], order["name"] = int(order_id), f"#{order_id}"
        order["checkout_token"] = order["cart_token"] = None
        await shopify.deliver(order, "orders/create")
    seen: list[tuple[int, int]] = []

    outcome = await asyncio.to_thread(
        webhooks.replay, api.ledger, progress=lambda *p: seen.append(p), page_size=3
    )

    assert outcome == {"processed": 5, "unmappable": 2}  # each once, none skipped
    assert seen == [(done, 7) for done in range(1, 8)]
    assert len(events(api, "Order Refunded")) == 5
    assert sorted(s for s, _ in deliveries(api)) == ["processed"] * 10 + ["unmappable"] * 2
    again = await asyncio.to_thread(webhooks.replay, api.ledger, page_size=2)
    assert again == {"unmappable": 2}


async def test_replay_rejects_an_unknown_status(api: Api) -> None:
    result = CliRunner().invoke(
        cli, ["webhooks", "replay", "--status", "processed", "--database-url", api.url]
    )
    assert result.exit_code != 0


async def test_a_yampi_amount_with_binary_float_noise_is_read_at_four_places(
    api: Api, yampi_shop: Shop
) -> None:
    order = fixture("yampi", "order_created")
    order["resource"]["value_total"] = 0.1 + 0.2  # PHP's json_encode: 0.30000000000000004
    order["resource"]["value_products"] = 310.89000000000004

    answer = await yampi_shop.deliver(order)

    assert answer["status"] == "processed", answer
    [placed] = events(api, "Order Placed")
    assert placed.value == Decimal("0.30")
    assert placed.properties["subtotal"] == "310.89"
    assert order_row(api, "31874526")["total"] == Decimal("0.3")
