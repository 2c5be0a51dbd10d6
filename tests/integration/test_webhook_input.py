"""Malformed values in verified webhooks, through HTTP on both backends: the provider gets a
clear answer, the raw body is kept (unless the answer says it was refused), the parts that
can be recorded are, and SQLite and PostgreSQL end alike."""

from __future__ import annotations

import json
import secrets
from typing import Any
from uuid import uuid4

import httpx
import pytest

from sinal import webhooks
from sinal.automations.service import Automations
from sinal.integrations import sign_shopify, sign_yampi
from sinal.integrations.whatsapp import sent_callback_data
from sinal.store.automations import Integration
from tests.helpers import count, sql
from tests.integration.conftest import Api
from tests.integration.test_commerce_webhooks import fixture
from tests.integration.whatsapp import (
    connect_whatsapp,
    deliver,
    events,
    meta_bytes,
    text_message,
)

pytestmark = pytest.mark.anyio

SECRET = "shop-secret-3f9a"
PHONE = "5511987654321"
TEXT = "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABIYFDNBMDJCMEI1RjE4QzFEMUQ4RjNBAA=="
FAILED = "wamid.HBgNNTUxMjE5NzY1NDMyMTAVAgARGBJCNkE5QzJEMEU4RjdBNjU0MzIA"
NUL = "\x00"


def _kept(api: Api) -> list[tuple[str | None, str, str | None, bytes]]:
    """Every kept delivery's (topic, status, reason, body), oldest first."""
    rows = sql(
        api.url, "SELECT topic, status, reason, body FROM webhook_deliveries ORDER BY received_at"
    )
    return [(topic, status, reason, bytes(body)) for topic, status, reason, body in rows]


def _shop(api: Api, kind: str) -> Integration:
    return Automations(api.ledger).create_integration(
        api.account.id, {"kind": kind, "secret": SECRET}
    )


async def _shopify(
    api: Api, shop: Integration, body: bytes, topic: str = "orders/create", **headers: str
) -> httpx.Response:
    sent = {
        "Content-Type": "application/json",
        "X-Shopify-Hmac-Sha256": sign_shopify(SECRET, body),
        "X-Shopify-Topic": topic,
        "X-Shopify-Webhook-Id": str(uuid4()),
        "X-Shopify-Shop-Domain": "loja-da-ana.myshopify.com",
        **headers,
    }
    return await api.client.post(f"/webhooks/shopify/{shop.id}", content=body, headers=sent)


async def _yampi(api: Api, shop: Integration, body: bytes) -> httpx.Response:
    sent = {"Content-Type": "application/json", "X-Yampi-Hmac-SHA256": sign_yampi(SECRET, body)}
    return await api.client.post(f"/webhooks/yampi/{shop.id}", content=body, headers=sent)


def _with_status(status: dict[str, Any]) -> bytes:
    """One valid inbound text message and `status`, in one body."""
    body = text_message(TEXT, PHONE, "Oi, tudo bem?", name="Ana")
    body["entry"][0]["changes"][0]["value"]["statuses"] = [status]
    return meta_bytes(body)


def _failed_status(**fields: Any) -> dict[str, Any]:
    status = {"id": FAILED, "status": "failed", "timestamp": "1715360100", "recipient_id": PHONE,
              "errors": [{"code": 131026, "title": "Message undeliverable"}]}  # fmt: skip
    return {**status, **fields}


# --- one malformed number in a WhatsApp batch --------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"errors": [{"code": "²", "title": "Message undeliverable"}]},
        {"errors": [{"code": "¹²"}]},
        {"errors": [{"code": "9" * 5000}]},
        {"errors": [{"code": 2**40}]},  # beyond message_statuses.error_code (integer)
        {"errors": [{"code": -1}]},
        {"timestamp": "¹²"},
        {"timestamp": "9" * 5000},
    ],
    ids=["superscript-2", "superscript-12", "5000-digits", "2^40", "negative",
         "superscript-time", "5000-digit-time"],
)  # fmt: skip
async def test_whatsapp_a_malformed_number_skips_its_status_and_records_the_rest(
    api: Api, bad: dict[str, Any]
) -> None:
    wa = connect_whatsapp(api)
    # The status names a contact sinal sent to: without the bad number, it would be recorded.
    ana = api.ledger.create_contact(api.account.id, phone="+55 11 98765-4321")
    callback = sent_callback_data(ana.id, is_template=False)
    body = _with_status(_failed_status(biz_opaque_callback_data=callback, **bad))

    answer = await deliver(api, wa, body)

    assert answer.status_code == 200
    assert answer.json()["status"] == "unmappable"
    assert f"status {FAILED}: invalid_" in answer.json()["reason"]
    assert [e.entity_id for e in events(api, "Message Received")] == [TEXT]
    assert events(api, "Message Failed") == []
    assert count(api.url, "message_statuses") == 0
    [(_, status, _, kept)] = _kept(api)
    assert (status, kept) == ("unmappable", body)
    # A replay ends alike, and records nothing twice.
    assert webhooks.replay(api.ledger) == {"unmappable": 1}
    assert len(events(api, "Message Received")) == 1


# --- dates, timezones and amounts beyond what Python computes ----------------------------


async def test_shopify_a_triggered_at_header_near_year_9999_does_not_stop_the_delivery(
    api: Api,
) -> None:
    shop = _shop(api, "shopify")
    body = json.dumps(fixture("shopify", "orders_create")).encode()
    # X-Shopify-Triggered-At is not covered by the signature, and only informational.
    answer = await _shopify(
        api, shop, body, **{"X-Shopify-Triggered-At": "9999-12-31T23:59:59-01:00"}
    )
    assert (answer.status_code, answer.json()["status"]) == (200, "processed")
    assert _kept(api) == [("orders/create", "processed", None, body)]
    assert len(events(api, "Order Placed")) == 1


async def test_yampi_a_time_near_year_9999_is_kept_and_unmappable(api: Api) -> None:
    shop = _shop(api, "yampi")
    payload = fixture("yampi", "order_status_updated")
    payload["time"] = "9999-12-31 23:59:59"  # in UTC, past the last day datetime holds
    body = json.dumps(payload).encode()
    answer = await _yampi(api, shop, body)
    assert answer.status_code == 200
    assert answer.json()["status"] == "unmappable"
    assert answer.json()["reason"].startswith("invalid_timestamp")
    [(topic, status, _, kept)] = _kept(api)
    assert (topic, status, kept) == ("order.status.updated", "unmappable", body)
    assert events(api) == []


def _yampi_created_in(zone: str) -> dict[str, Any]:
    payload = fixture("yampi", "order_created")
    payload["resource"]["created_at"]["timezone"] = zone
    return payload


def _yampi_total(total: str) -> dict[str, Any]:
    payload = fixture("yampi", "order_created")
    payload["resource"]["value_total"] = total
    return payload


def _shopify_payload(name: str, **fields: Any) -> dict[str, Any]:
    return {**fixture("shopify", name), **fields}


@pytest.mark.parametrize(
    ("topic", "payload", "reason"),
    [
        (None, _yampi_created_in("America"), "invalid_timestamp"),  # a directory
        (None, _yampi_created_in("x" * 300), "invalid_timestamp"),  # a name too long
        (None, _yampi_total("1e999999999"), "invalid_amount"),  # decimal.Overflow
        ("orders/create", _shopify_payload("orders_create", created_at="0001-01-01T00:00:00+01:00"),
         "invalid_timestamp"),
        ("orders/create", _shopify_payload("orders_create", total_price="1e999999999"),
         "invalid_amount"),
        # No event checks these: 30 minutes later is past year 9999, and PostgreSQL's
        # numeric(18, 4) total refuses what SQLite keeps.
        ("checkouts/update", _shopify_payload("checkouts_update",
                                              updated_at="9999-12-31T23:30:00Z"),
         "invalid_timestamp"),
        ("checkouts/update", _shopify_payload("checkouts_update", total_price="1e15"),
         "invalid_amount"),
    ],
    ids=["zone-directory", "zone-too-long", "yampi-amount", "shopify-year-1", "shopify-amount",
         "checkout-year-9999", "checkout-total-1e15"],
)  # fmt: skip
async def test_a_time_zone_or_amount_python_cannot_compute_is_unmappable_not_failed(
    api: Api, topic: str | None, payload: dict[str, Any], reason: str
) -> None:
    shop = _shop(api, "yampi" if topic is None else "shopify")
    body = json.dumps(payload).encode()
    answer = await (_yampi(api, shop, body) if topic is None else _shopify(api, shop, body, topic))
    assert answer.status_code == 200
    assert answer.json()["status"] == "unmappable"
    assert answer.json()["reason"].startswith(reason)
    [(_, status, _, kept)] = _kept(api)
    assert (status, kept) == ("unmappable", body)
    assert events(api) == []
    assert count(api.url, "orders") + count(api.url, "checkouts") == 0


# --- values one backend would store and the other refuse ---------------------------------


async def test_shopify_an_over_long_webhook_id_is_400_and_nothing_is_stored(api: Api) -> None:
    shop = _shop(api, "shopify")
    body = json.dumps(fixture("shopify", "orders_create")).encode()
    # Random: PostgreSQL compresses a key before its ~2.7 kB limit applies.
    webhook_id = secrets.token_urlsafe(4000)
    answer = await _shopify(api, shop, body, **{"X-Shopify-Webhook-Id": webhook_id})
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.json()["type"] == "/problems/invalid-header"
    assert "X-Shopify-Webhook-Id" in answer.json()["detail"]
    assert count(api.url, "webhook_deliveries") == 0
    # Shopify's own ids (UUIDs) go through.
    again = await _shopify(api, shop, body, **{"X-Shopify-Webhook-Id": str(uuid4())})
    assert (again.status_code, again.json()["status"]) == (200, "processed")


@pytest.mark.parametrize(
    "change",
    [
        {"number": f"1000{NUL}417"},
        {"cart_token": f"c8a2{NUL}f1e0"},
        # Random: PostgreSQL compresses an index key before its ~2.7 kB limit applies.
        {"cart_token": secrets.token_urlsafe(4000)},
    ],
    ids=["nul-number", "nul-token", "4000-character-token"],
)
async def test_yampi_a_status_with_no_event_ends_alike_with_texts_no_row_can_keep(
    api: Api, change: dict[str, Any]
) -> None:
    shop = _shop(api, "yampi")
    payload = fixture("yampi", "order_status_updated")
    payload["resource"]["status"]["data"]["alias"] = "invoiced"  # moves the order row only
    payload["resource"].update(change)
    answer = await _yampi(api, shop, json.dumps(payload).encode())
    assert (answer.status_code, answer.json()["status"]) == (200, "processed")
    [(status, number, cart_token)] = sql(api.url, "SELECT status, number, cart_token FROM orders")
    assert status == "paid"
    # read as ids: a number or token no id can be is none (a cart's token is an id)
    assert {"number": number, "cart_token": cart_token}[next(iter(change))] is None


def _checkout_update(**fields: Any) -> dict[str, Any]:
    update = fixture("shopify", "checkouts_update")
    if "title" in fields:
        update["line_items"][0]["title"] = fields.pop("title")
    if "items" in fields:
        line = update["line_items"][0]
        update["line_items"] = [{**line, "title": f"{i:04d} " + "x" * 200} for i in range(400)]
        del fields["items"]
    return {**update, **fields}


@pytest.mark.parametrize(
    "update",
    [
        _checkout_update(title=f"Camiseta{NUL}"),
        _checkout_update(abandoned_checkout_url=f"https://loja.example/r{NUL}"),
        _checkout_update(items=True),  # past the 64 kB of an event's properties
        _checkout_update(updated_at="1999-12-01T10:00:00Z"),  # abandoned before 2000
    ],
    ids=["nul-in-an-item", "nul-in-the-recovery-url", "400-long-items", "updated-in-1999"],
)
async def test_shopify_a_checkout_no_abandonment_could_say_is_unmappable_on_both_backends(
    api: Api, update: dict[str, Any]
) -> None:
    shop = _shop(api, "shopify")
    body = json.dumps(update).encode()
    answer = await _shopify(api, shop, body, "checkouts/update")
    assert (answer.status_code, answer.json()["status"]) == (200, "unmappable")
    assert answer.json()["reason"].startswith("invalid_event")
    [(_, status, _, kept)] = _kept(api)
    assert (status, kept) == ("unmappable", body)
    assert count(api.url, "checkouts") == 0  # nothing due that no pass could abandon


async def test_whatsapp_a_nul_in_a_change_field_is_kept_with_the_nul_escaped(api: Api) -> None:
    wa = connect_whatsapp(api)
    payload = text_message(TEXT, PHONE, "Oi")
    payload["entry"][0]["changes"].append({"field": f"messages{NUL}", "value": {}})
    body = meta_bytes(payload)
    answer = await deliver(api, wa, body)
    assert (answer.status_code, answer.json()["status"]) == (200, "processed")
    assert _kept(api) == [("messages,messages\\x00", "processed", None, body)]
    assert [e.entity_id for e in events(api, "Message Received")] == [TEXT]


@pytest.mark.parametrize(
    ("event", "topic"),
    [(f"order.paid{NUL}", "order.paid\\x00"), ("a" * 1000, "a" * 254 + "…")],
    ids=["nul", "1000-characters"],
)
async def test_yampi_an_event_name_no_topic_can_be_is_kept_cleaned_and_unmappable(
    api: Api, event: str, topic: str
) -> None:
    shop = _shop(api, "yampi")
    payload = fixture("yampi", "order_paid")
    payload["event"] = event
    body = json.dumps(payload).encode()
    answer = await _yampi(api, shop, body)
    assert (answer.status_code, answer.json()["status"]) == (200, "unmappable")
    [(kept_topic, status, reason, kept)] = _kept(api)
    assert (kept_topic, status, kept) == (topic, "unmappable", body)
    assert reason is not None
    assert NUL not in reason
    assert events(api) == []


@pytest.mark.parametrize("where", ["message id", "status id", "phone number id"])
async def test_whatsapp_a_nul_in_an_item_id_is_reported_with_the_nul_escaped(
    api: Api, where: str
) -> None:
    wa = connect_whatsapp(api)
    bad = f"wamid.{NUL}X"
    payload = text_message(TEXT, PHONE, "Oi")
    value = payload["entry"][0]["changes"][0]["value"]
    if where == "message id":
        value["messages"].append({**value["messages"][0], "id": bad})
    elif where == "status id":
        value["statuses"] = [_failed_status(id=bad)]
    else:  # a second change, of another number: never recorded here
        other = text_message("wamid.other", PHONE, "Oi")["entry"][0]["changes"][0]
        other["value"]["metadata"]["phone_number_id"] = f"10654{NUL}"
        payload["entry"][0]["changes"].append(other)
    body = meta_bytes(payload)
    answer = await deliver(api, wa, body)
    assert (answer.status_code, answer.json()["status"]) == (200, "unmappable")
    reason = answer.json()["reason"]
    assert "\\x00" in reason
    assert NUL not in reason
    [(_, status, kept_reason, kept)] = _kept(api)
    assert (status, kept_reason, kept) == ("unmappable", reason, body)
    assert [e.entity_id for e in events(api, "Message Received")] == [TEXT]


async def test_whatsapp_a_nul_in_a_user_id_reads_as_no_user_id(api: Api) -> None:
    wa = connect_whatsapp(api)
    payload = text_message(TEXT, PHONE, "Oi", name="Ana")
    value = payload["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["user_id"] = f"BR.{NUL}1"
    value["messages"][0]["from_user_id"] = f"BR.{NUL}1"
    answer = await deliver(api, wa, meta_bytes(payload))
    assert (answer.status_code, answer.json()["status"]) == (200, "processed")
    [received] = events(api, "Message Received")
    assert received.properties["phone"] == "+5511987654321"
    assert "user_id" not in received.properties
    assert count(api.url, "whatsapp_users") == 0


@pytest.mark.postgres
async def test_shopify_a_delivery_the_operators_configuration_refuses_stays_to_process(
    pg_api: Api,
) -> None:
    """A trigger someone added to events fails (`StoreMisconfigured`, an operator's to
    fix): the delivery was kept `failed` and answered 200, so Shopify never sent it again
    and only a replay by hand recorded the order. It is answered 503 and stays
    `received`; the provider's redelivery once the trigger is fixed records it."""
    api = pg_api
    sql(
        api.url,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'set up wrong' USING ERRCODE = 'triggered_action_exception'; END $$",
    )
    sql(api.url, "CREATE TRIGGER refuse BEFORE INSERT ON events "
        "FOR EACH ROW EXECUTE FUNCTION refuse()")  # fmt: skip
    shop = _shop(api, "shopify")
    body = json.dumps(fixture("shopify", "orders_create")).encode()
    webhook_id = str(uuid4())

    refused = await _shopify(api, shop, body, **{"X-Shopify-Webhook-Id": webhook_id})
    kept = _kept(api)
    sql(api.url, "DROP TRIGGER refuse ON events")
    again = await _shopify(api, shop, body, **{"X-Shopify-Webhook-Id": webhook_id})

    assert refused.status_code == 503, refused.text
    assert refused.json()["type"] == "/problems/database-misconfigured"
    assert kept == [("orders/create", "received", None, body)]
    assert (again.status_code, again.json()["status"]) == (200, "processed")
    assert _kept(api) == [("orders/create", "processed", None, body)]
    assert len(events(api, "Order Placed")) == 1
