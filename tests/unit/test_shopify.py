"""Shopify webhooks into events: every topic, dedup ids, nulls, checkouts, bad payloads."""

from __future__ import annotations

import contextlib
import copy
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sinal.catalog import (
    METRIC_CHECKOUT_ABANDONED,
    METRIC_CHECKOUT_RECOVERED,
    METRIC_CHECKOUT_STARTED,
    METRIC_CUSTOMER_CREATED,
    METRIC_ORDER_CANCELLED,
    METRIC_ORDER_FULFILLED,
    METRIC_ORDER_PAID,
    METRIC_ORDER_PLACED,
    METRIC_ORDER_REFUNDED,
    METRIC_SHIPMENT_CREATED,
    METRIC_SHIPMENT_DELIVERED,
    METRIC_SHIPMENT_EXCEPTION,
    METRIC_SHIPMENT_IN_TRANSIT,
    METRIC_SHIPMENT_OUT_FOR_DELIVERY,
)
from sinal.events import prepare
from sinal.integrations import (
    UnmappablePayload,
    abandoned_checkout,
    abandonment_due,
    map_shopify,
    merge_order_status,
    normalize_shopify,
    parse_body,
    recovered_checkout,
    shopify_checkout,
    shopify_delivery,
)
from sinal.integrations.base import Mapped
from sinal.integrations.shopify import TOPICS

FIXTURES = Path(__file__).parent.parent / "fixtures" / "shopify"
ACCOUNT = "0192f5d0-1a2b-7c3d-8e4f-000000000001"
CONTACT = "0192f5d0-1a2b-7c3d-8e4f-000000000002"
NOW = datetime(2024, 6, 1, tzinfo=UTC)
ORDER_ID = "5829371002921"
CHECKOUT_TOKEN = "b7f3c1a9e2d54b8f9a0c6e1d2f3a4b5c"


def load(name: str) -> dict[str, Any]:
    """A fixture payload, parsed the way the HTTP edge parses it."""
    return dict(parse_body((FIXTURES / f"{name}.json").read_bytes()))


def one(topic: str, payload: dict[str, Any]) -> Mapped:
    events = map_shopify(topic, payload)
    assert len(events) == 1
    return events[0]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# --- every topic -------------------------------------------------------------------------

TOPIC_TABLE = [
    # fixture, topic, metric, entity_type, source_id, value, occurred_at
    ("orders_create", "orders/create", METRIC_ORDER_PLACED, "order_placed", ORDER_ID,
     "297.90", "2024-05-10T14:32:10-03:00"),
    ("orders_paid", "orders/paid", METRIC_ORDER_PAID, "order_paid", ORDER_ID,
     "297.90", "2024-05-10T14:41:37-03:00"),
    ("orders_cancelled", "orders/cancelled", METRIC_ORDER_CANCELLED, "order_cancelled",
     ORDER_ID, "297.90", "2024-05-11T09:15:02-03:00"),
    ("orders_fulfilled", "orders/fulfilled", METRIC_ORDER_FULFILLED, "order_fulfilled",
     ORDER_ID, "297.90", "2024-05-12T10:03:44-03:00"),
    ("refunds_create_partial_1", "refunds/create", METRIC_ORDER_REFUNDED, "refund",
     "929361462121", "80.91", "2024-05-15T11:20:00-03:00"),
    ("checkouts_create", "checkouts/create", METRIC_CHECKOUT_STARTED, "checkout_started",
     CHECKOUT_TOKEN, "310.89", "2024-05-10T14:28:03-03:00"),
    ("customers_create", "customers/create", METRIC_CUSTOMER_CREATED, "customer",
     "7203918527785", None, "2024-05-11T08:02:17-03:00"),
    ("fulfillments_create", "fulfillments/create", METRIC_SHIPMENT_CREATED, "shipment_created",
     "5120398476201", None, "2024-05-12T10:03:41-03:00"),
    ("fulfillments_update", "fulfillments/update", METRIC_SHIPMENT_IN_TRANSIT,
     "shipment_in_transit", "5120398476201", None, "2024-05-13T07:41:12-03:00"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fixture", "topic", "metric", "entity_type", "source_id", "value", "occurred_at"),
    TOPIC_TABLE,
    ids=[row[1] for row in TOPIC_TABLE],
)
def test_map_shopify_maps_each_topic(
    *,
    fixture: str,
    topic: str,
    metric: str,
    entity_type: str,
    source_id: str,
    value: str | None,
    occurred_at: str,
) -> None:
    event = one(topic, load(fixture))
    assert event.metric_name == metric
    assert event.source == "shopify"
    assert (event.entity_type, event.source_id) == (entity_type, source_id)
    assert event.unique_event_id == f"shopify:{entity_type}:{source_id}"
    assert event.value == (None if value is None else Decimal(value))
    assert event.occurred_at == utc(occurred_at)
    assert event.occurred_at.tzinfo is UTC


def test_every_mapped_topic_has_a_test_row() -> None:
    tested = {row[1] for row in TOPIC_TABLE} | {"checkouts/update"}
    assert tested == TOPICS


@pytest.mark.parametrize("row", TOPIC_TABLE, ids=[row[1] for row in TOPIC_TABLE])
def test_mapped_events_pass_the_ledgers_validation(row: tuple[Any, ...]) -> None:
    event = one(row[1], load(row[0]))
    prepared = prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)
    assert prepared.unique_event_id == event.unique_event_id
    assert prepared.occurred_at == event.occurred_at
    assert prepared.currency == "BRL"
    assert prepared.value == event.value


def test_order_placed_carries_what_automations_need_and_not_the_payload() -> None:
    event = one("orders/create", load("orders_create"))
    props = event.properties
    assert props["order_id"] == ORDER_ID
    assert props["order_number"] == "1042"
    assert props["order_name"] == "#1042"
    assert props["items"] == [
        {"sku": "CAM-ORG-AZ-M", "product_id": "8471029384761", "variant_id": "45012938475102",
         "title": "Camiseta Algodão Orgânico", "quantity": 2, "price": "89.90"},
        {"sku": "CAL-LIN-AR-40", "product_id": "8471029417529", "variant_id": "45012938507870",
         "title": "Calça Linho", "quantity": 1, "price": "131.09"},
    ]  # fmt: skip
    assert props["discount_codes"] == ["BEMVINDA10"]
    assert props["total"] == "297.90"
    assert props["checkout_token"] == CHECKOUT_TOKEN
    for raw_key in ("customer", "billing_address", "shipping_address", "browser_ip", "line_items"):
        assert raw_key not in props
    assert len(json.dumps(props)) < len(json.dumps(load("orders_create"))) / 4


def test_order_contact_is_normalized_from_the_customer() -> None:
    contact = one("orders/create", load("orders_create")).contact
    assert contact.phone == "+5511987654321"
    assert contact.email == "ana.souza@exemplo.com.br"
    assert contact.external_id == "shopify:customer:7203918462249"
    assert contact.name == "Ana Souza"


def test_customer_created_adds_the_ninth_digit_to_a_legacy_mobile() -> None:
    event = one("customers/create", load("customers_create"))
    assert event.contact.phone == "+5521976543210"  # sent as "+55 21 7654-3210"
    assert event.properties == {
        "customer_id": "7203918527785",
        "email_marketing": "subscribed",
        "sms_marketing": "subscribed",
        "tags": ["vip", "instagram"],
        "verified_email": True,
    }


def test_order_with_protected_customer_data_is_recorded_against_the_store_id() -> None:
    event = one("orders/create", load("orders_create_protected_customer"))
    assert event.contact.phone is None
    assert event.contact.email is None
    assert event.contact.external_id == "shopify:customer:7203918495017"
    assert event.value == Decimal("108.00")
    assert "discount_codes" not in event.properties  # none used: not an empty list


def test_order_with_no_way_to_reach_anyone_is_unmappable() -> None:
    payload = load("orders_create_protected_customer")
    payload["customer"] = None
    with pytest.raises(UnmappablePayload) as caught:
        map_shopify("orders/create", payload)
    assert caught.value.reason == "no_contact"


def test_invalid_phone_or_email_falls_back_to_the_next_one() -> None:
    payload = load("orders_create")
    payload["customer"]["phone"] = "n/a"
    payload["email"] = "not an email"
    payload["billing_address"]["phone"] = "(11) 3333-4444"
    contact = one("orders/create", payload).contact
    assert contact.phone == "+551133334444"
    assert contact.email == "ana.souza@exemplo.com.br"


# --- dedup ids ---------------------------------------------------------------------------


def test_placed_and_paid_for_the_same_order_are_two_events() -> None:
    placed = one("orders/create", load("orders_create"))
    paid = one("orders/paid", load("orders_paid"))
    assert placed.entity_id == paid.entity_id == ORDER_ID
    assert placed.unique_event_id != paid.unique_event_id


def test_a_redelivery_maps_to_the_same_event() -> None:
    first = map_shopify("orders/paid", load("orders_paid"))
    again = map_shopify("orders/paid", load("orders_paid"))
    assert first == again


def test_two_partial_refunds_are_two_events_with_their_own_amounts() -> None:
    first = one("refunds/create", load("refunds_create_partial_1"))
    second = one("refunds/create", load("refunds_create_partial_2"))
    assert first.unique_event_id == "shopify:refund:929361462121"
    assert second.unique_event_id == "shopify:refund:929361494889"
    assert (first.value, second.value) == (Decimal("80.91"), Decimal("117.98"))
    assert first.entity_id == second.entity_id == first.order_id == ORDER_ID
    assert first.properties["items"][0]["sku"] == "CAM-ORG-AZ-M"


def test_refund_contact_is_resolved_through_the_order() -> None:
    event = one("refunds/create", load("refunds_create_partial_1"))
    assert event.contact.is_empty
    assert event.order_id == ORDER_ID
    assert event.currency == "BRL"


def test_refund_without_transactions_uses_the_line_item_subtotals() -> None:
    event = one("refunds/create", load("refunds_create_without_transactions"))
    assert event.value == Decimal("80.91")
    assert event.properties["amount_source"] == "line_items"
    assert event.currency == "BRL"


def test_refund_counts_only_successful_refund_transactions() -> None:
    payload = load("refunds_create_partial_1")
    success = payload["transactions"][0]
    pending = {**success, "id": 1, "status": "pending", "amount": "500.00"}
    failed = {**success, "id": 2, "status": "failure", "amount": "400.00"}
    sale = {**success, "id": 3, "kind": "sale", "amount": "300.00"}
    second = {**success, "id": 4, "amount": "10.00"}
    payload["transactions"] = [pending, success, failed, sale, second]
    event = one("refunds/create", payload)
    assert event.value == Decimal("90.91")
    assert event.properties["amount_source"] == "transactions"


# --- shipments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shipment_status", "metric"),
    [
        ("in_transit", METRIC_SHIPMENT_IN_TRANSIT),
        ("out_for_delivery", METRIC_SHIPMENT_OUT_FOR_DELIVERY),
        ("delivered", METRIC_SHIPMENT_DELIVERED),
        ("attempted_delivery", METRIC_SHIPMENT_EXCEPTION),
        ("failure", METRIC_SHIPMENT_EXCEPTION),
    ],
)
def test_fulfillment_update_maps_shipment_status(shipment_status: str, metric: str) -> None:
    payload = load("fulfillments_update")
    payload["shipment_status"] = shipment_status
    event = one("fulfillments/update", payload)
    assert event.metric_name == metric
    assert event.unique_event_id == f"shopify:shipment_{shipment_status}:5120398476201"
    assert event.properties["tracking_number"] == "QB123456789BR"
    assert event.properties["tracking_url"].endswith("objeto=QB123456789BR")
    assert event.properties["shipment_status"] == shipment_status


def test_each_shipment_status_of_one_fulfillment_is_its_own_event() -> None:
    ids = set()
    for status in ("in_transit", "out_for_delivery", "attempted_delivery", "failure", "delivered"):
        payload = load("fulfillments_update")
        payload["shipment_status"] = status
        ids.add(one("fulfillments/update", payload).unique_event_id)
    assert len(ids) == 5


@pytest.mark.parametrize(
    ("shipment_status", "reason"),
    [
        (None, "no_shipment_status"),
        ("confirmed", "shipment_status_not_tracked"),
        ("label_printed", "shipment_status_not_tracked"),
        ("label_purchased", "shipment_status_not_tracked"),
        ("ready_for_pickup", "shipment_status_not_tracked"),
        ("teleported", "shipment_status_not_tracked"),
    ],
)
def test_fulfillment_update_without_a_tracked_status_records_nothing(
    shipment_status: str | None, reason: str
) -> None:
    payload = load("fulfillments_update")
    payload["shipment_status"] = shipment_status
    assert map_shopify("fulfillments/update", payload) == []
    assert normalize_shopify("fulfillments/update", payload).ignored == reason


def test_fulfillment_without_tracking_or_contact_still_maps() -> None:
    event = one("fulfillments/create", load("fulfillments_create_without_tracking"))
    assert event.metric_name == METRIC_SHIPMENT_CREATED
    assert event.contact.is_empty
    assert event.order_id == "5829371068457"
    assert not {"tracking_number", "tracking_url", "tracking_company"} & event.properties.keys()


def test_order_fulfilled_carries_its_tracking_numbers() -> None:
    event = one("orders/fulfilled", load("orders_fulfilled"))
    assert event.properties["tracking_numbers"] == ["QB123456789BR"]
    assert event.properties["fulfillment_status"] == "fulfilled"


# --- orders as rows ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "topic", "status", "total"),
    [
        ("orders_create", "orders/create", "pending", "297.90"),
        ("orders_paid", "orders/paid", "paid", "297.90"),
        ("orders_fulfilled", "orders/fulfilled", "fulfilled", "297.90"),
        ("orders_cancelled", "orders/cancelled", "cancelled", "297.90"),  # not the 0.00 left
    ],
)
def test_order_row_follows_the_payload(fixture: str, topic: str, status: str, total: str) -> None:
    order = normalize_shopify(topic, load(fixture)).order
    assert order is not None
    assert (order.provider, order.external_id, order.number) == ("shopify", ORDER_ID, "#1042")
    assert order.status == status
    assert order.total == Decimal(total)
    assert order.currency == "BRL"
    assert order.checkout_tokens == (CHECKOUT_TOKEN, "Z2NwLXVzLWVhc3QxOjAxSFg3UTJNNkI0")


def test_cancelled_order_event_reports_what_was_ordered() -> None:
    event = one("orders/cancelled", load("orders_cancelled"))
    assert event.value == Decimal("297.90")  # current_total_price is already 0.00
    assert event.properties["total"] == "297.90"
    assert event.properties["cancel_reason"] == "customer"


def test_cancelled_before_created_still_ends_cancelled() -> None:
    status: str | None = None
    arrivals = [("orders_cancelled", "orders/cancelled"), ("orders_create", "orders/create")]
    for fixture, topic in arrivals:
        order = normalize_shopify(topic, load(fixture)).order
        assert order is not None
        status = merge_order_status(status, order.status)
    assert status == "cancelled"


@pytest.mark.parametrize(
    ("current", "new", "expected"),
    [
        (None, "pending", "pending"),
        ("pending", "paid", "paid"),
        ("paid", "pending", "paid"),
        ("fulfilled", "paid", "fulfilled"),
        ("partially_refunded", "refunded", "refunded"),
        ("refunded", "cancelled", "cancelled"),
        ("cancelled", "paid", "cancelled"),
        ("paid", "mystery", "paid"),
        ("mystery", "paid", "paid"),
    ],
)
def test_merge_order_status_only_moves_up(current: str | None, new: str, expected: str) -> None:
    assert merge_order_status(current, new) == expected


# --- checkouts and abandonment -----------------------------------------------------------


def test_checkout_update_records_nothing_but_exposes_the_checkout() -> None:
    result = normalize_shopify("checkouts/update", load("checkouts_update"))
    assert result.events == ()
    assert result.ignored == "checkout_updated"
    checkout = result.checkout
    assert checkout is not None
    assert checkout.token == CHECKOUT_TOKEN
    assert checkout.updated_at == utc("2024-05-10T14:31:47-03:00")
    assert checkout.recovery_url is not None
    assert checkout.recovery_url.endswith("/recover?key=8d2e6f0a1b9c4d7e")
    assert checkout.total == Decimal("297.90")
    assert checkout.contact.phone == "+5511987654321"
    assert checkout.discount_codes == ("BEMVINDA10",)


def test_abandonment_is_due_after_the_delay_from_the_last_update() -> None:
    checkout = shopify_checkout(load("checkouts_update"))
    assert abandonment_due(checkout) == utc("2024-05-10T15:31:47-03:00")
    assert abandonment_due(checkout, timedelta(minutes=15)) == utc("2024-05-10T14:46:47-03:00")


def test_completed_or_anonymous_checkouts_are_never_abandoned() -> None:
    completed = load("checkouts_update")
    completed["completed_at"] = "2024-05-10T14:32:09-03:00"
    assert abandonment_due(shopify_checkout(completed)) is None
    assert abandonment_due(shopify_checkout(load("checkouts_create_anonymous"))) is None


def test_anonymous_checkout_start_records_nothing_with_a_reason() -> None:
    result = normalize_shopify("checkouts/create", load("checkouts_create_anonymous"))
    assert result.events == ()
    assert result.ignored == "anonymous_checkout"
    assert result.checkout is not None


def test_abandoned_checkout_event_has_the_recovery_url() -> None:
    checkout = shopify_checkout(load("checkouts_update"))
    due = abandonment_due(checkout)
    assert due is not None
    event = abandoned_checkout(checkout, occurred_at=due)
    assert event.metric_name == METRIC_CHECKOUT_ABANDONED
    assert event.unique_event_id == f"shopify:checkout_abandoned:{CHECKOUT_TOKEN}"
    assert event.properties["checkout_url"] == checkout.recovery_url
    assert event.properties["discount_codes"] == ["BEMVINDA10"]
    assert [i["sku"] for i in event.properties["items"]] == ["CAM-ORG-AZ-M", "CAL-LIN-AR-40"]
    assert (event.value, event.currency, event.occurred_at) == (Decimal("297.90"), "BRL", due)
    prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)


def test_abandoned_checkout_needs_a_contact() -> None:
    checkout = shopify_checkout(load("checkouts_create_anonymous"))
    with pytest.raises(UnmappablePayload) as caught:
        abandoned_checkout(checkout, occurred_at=NOW)
    assert caught.value.reason == "no_contact"


def test_order_from_an_abandoned_checkout_is_its_recovery() -> None:
    checkout = shopify_checkout(load("checkouts_update"))
    placed = one("orders/create", load("orders_create"))
    assert placed.order is not None
    assert checkout.token in placed.order.checkout_tokens
    event = recovered_checkout(placed, checkout.token)
    assert event.metric_name == METRIC_CHECKOUT_RECOVERED
    assert event.unique_event_id == f"shopify:checkout_recovered:{CHECKOUT_TOKEN}"
    assert (event.value, event.currency) == (Decimal("297.90"), "BRL")
    assert event.contact == placed.contact
    assert event.properties["order_id"] == ORDER_ID
    # as the order's events say them: a template or filter on order_number reads alike
    assert (event.properties["order_number"], event.properties["order_name"]) == ("1042", "#1042")
    assert placed.properties["order_number"] == "1042"
    prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)


def test_recovered_checkout_needs_an_order_event() -> None:
    refund = one("refunds/create", load("refunds_create_partial_1"))
    with pytest.raises(ValueError, match="order event"):
        recovered_checkout(refund, CHECKOUT_TOKEN)


# --- malformed payloads ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "topic", "change", "reason"),
    [
        ("orders_create", "orders/create", {"id": None}, "missing_field"),
        ("orders_create", "orders/create", {"id": ""}, "missing_field"),
        ("orders_create", "orders/create", {"total_price": "R$ 10", "current_total_price": None}, "invalid_amount"),  # noqa: E501
        ("orders_create", "orders/create", {"current_total_price": "NaN"}, "invalid_amount"),
        # amounts as text are written as JSON numbers, as an event's value is
        ("orders_create", "orders/create", {"total_price": "1_000"}, "invalid_amount"),
        ("orders_create", "orders/create", {"total_price": "+.5"}, "invalid_amount"),
        ("orders_create", "orders/create", {"total_price": " 5 "}, "invalid_amount"),
        ("orders_create", "orders/create", {"total_price": "\u0661\u0660\u0660"}, "invalid_amount"),
        ("orders_create", "orders/create", {"currency": "REAL"}, "invalid_currency"),
        ("orders_create", "orders/create", {"created_at": "yesterday"}, "invalid_timestamp"),
        ("orders_create", "orders/create", {"created_at": "2024-05-10T14:32:10"}, "invalid_timestamp"),  # noqa: E501
        ("orders_create", "orders/create", {"created_at": None}, "missing_field"),
        ("refunds_create_partial_1", "refunds/create", {"order_id": None}, "missing_field"),
        ("checkouts_update", "checkouts/update", {"token": None}, "missing_field"),
        ("fulfillments_update", "fulfillments/update", {"id": None}, "missing_field"),
        ("customers_create", "customers/create", {"id": []}, "missing_field"),
        ("orders_create", "orders/edited", {}, "unsupported_topic"),
    ],
)  # fmt: skip
def test_malformed_payloads_are_unmappable_with_a_reason(
    fixture: str, topic: str, change: dict[str, Any], reason: str
) -> None:
    payload = load(fixture)
    payload.update(change)
    with pytest.raises(UnmappablePayload) as caught:
        normalize_shopify(topic, payload)
    assert caught.value.reason == reason
    assert str(caught.value).startswith(reason)


@pytest.mark.parametrize(
    ("fixture", "topic", "change"),
    [
        # X-Shopify-Topic is not signed: a captured body sent again under another topic
        ("orders_create", "orders/paid", {}),  # financial_status "pending"
        ("orders_create", "orders/paid", {"financial_status": "authorized"}),
        ("orders_create", "orders/cancelled", {}),  # cancelled_at null
        ("orders_create", "orders/fulfilled", {}),  # fulfillment_status null
        ("orders_create", "checkouts/create", {"token": "a1b2c3"}),  # orders carry a token too
        ("orders_create", "checkouts/update", {"token": "a1b2c3"}),
        ("orders_create", "customers/create", {}),
        ("customers_create", "orders/create", {}),
        ("fulfillments_create", "orders/create", {}),
        ("refunds_create_partial_1", "orders/paid", {}),
        ("orders_paid", "refunds/create", {"order_id": ORDER_ID}),
        ("orders_paid", "fulfillments/update", {"order_id": ORDER_ID}),
        # a checkout has no admin_graphql_api_id: its fields say what it is
        ("checkouts_create", "orders/create", {}),
        ("checkouts_update", "orders/paid", {}),
        ("checkouts_update", "orders/cancelled", {}),
        ("checkouts_update", "orders/fulfilled", {}),
        ("checkouts_create", "customers/create", {}),
        ("checkouts_create", "refunds/create", {"order_id": ORDER_ID}),
        ("checkouts_update", "fulfillments/update", {"order_id": ORDER_ID}),
        # and so do the others' when their admin_graphql_api_id was left out
        ("orders_create", "checkouts/create", {"token": "a1b2c3", "admin_graphql_api_id": None}),
        ("refunds_create_partial_1", "fulfillments/create", {"admin_graphql_api_id": None}),
        ("fulfillments_create", "refunds/create", {"admin_graphql_api_id": None}),
        ("customers_create", "checkouts/update", {"token": "a1b2c3", "admin_graphql_api_id": None}),
    ],
)  # fmt: skip
def test_a_body_that_cannot_be_its_topics_is_unmappable(
    fixture: str, topic: str, change: dict[str, Any]
) -> None:
    payload = load(fixture)
    payload.update(change)
    with pytest.raises(UnmappablePayload) as caught:
        normalize_shopify(topic, payload)
    assert caught.value.reason == "topic_mismatch"


@pytest.mark.parametrize(
    ("fixture", "topic", "left_out", "named"),
    [
        ("checkouts_create", "orders/create", ("abandoned_checkout_url",),
         "order_number or order_status_url"),
        ("checkouts_update", "customers/create", ("abandoned_checkout_url",),
         "verified_email or addresses"),
        ("orders_create", "checkouts/create",
         ("admin_graphql_api_id", "order_number", "order_status_url"), "abandoned_checkout_url"),
    ],
)  # fmt: skip
def test_a_body_that_shows_no_resource_of_its_topics_is_unmappable(
    fixture: str, topic: str, left_out: tuple[str, ...], named: str
) -> None:
    # A field list that leaves out every field of a resource cannot prove the topic.
    payload = load(fixture) | {"token": "a1b2c3"}
    for field in left_out:
        del payload[field]
    with pytest.raises(UnmappablePayload) as caught:
        normalize_shopify(topic, payload)
    assert caught.value.reason == "topic_mismatch"
    assert str(caught.value).endswith(f"({named})")


def test_a_body_without_the_fields_a_topic_check_reads_still_maps() -> None:
    # A subscription may leave fields out (its `fields` list): one field of its resource
    # is enough, and an order state is checked only when the body names it.
    payload = load("orders_paid")
    for field in ("admin_graphql_api_id", "order_status_url", "financial_status"):
        del payload[field]
    assert one("orders/paid", payload).metric_name == METRIC_ORDER_PAID
    paid_back = load("orders_paid") | {"financial_status": "partially_refunded"}
    assert one("orders/paid", paid_back).metric_name == METRIC_ORDER_PAID


def test_a_blank_amount_is_absent_as_blank_text_is() -> None:
    payload = load("orders_create")
    payload["current_total_price"] = "   "
    assert one("orders/create", payload).value == Decimal("297.90")  # total_price's
    payload["total_price"] = " "
    assert one("orders/create", payload).value is None


def test_a_time_with_a_lowercase_z_is_utc_as_rfc_3339_allows() -> None:
    payload = load("orders_create")
    payload["created_at"] = "2024-05-10t17:32:10z"
    assert one("orders/create", payload).occurred_at == datetime(
        2024, 5, 10, 17, 32, 10, tzinfo=UTC
    )


def test_a_non_object_payload_is_unmappable() -> None:
    with pytest.raises(UnmappablePayload) as caught:
        normalize_shopify("orders/create", [1, 2, 3])  # type: ignore[arg-type]
    assert caught.value.reason == "invalid_json"


@pytest.mark.parametrize("body", [b"", b"not json", b"[1]", b'"text"', b"{"])
def test_parse_body_rejects_what_is_not_a_json_object(body: bytes) -> None:
    with pytest.raises(UnmappablePayload) as caught:
        parse_body(body)
    assert caught.value.reason == "invalid_json"


FUZZ_CASES = [
    ("orders_create", "orders/create"),
    ("orders_cancelled", "orders/cancelled"),
    ("refunds_create_partial_1", "refunds/create"),
    ("checkouts_update", "checkouts/update"),
    ("checkouts_create", "checkouts/create"),
    ("customers_create", "customers/create"),
    ("fulfillments_update", "fulfillments/update"),
]


@pytest.mark.parametrize(("fixture", "topic"), FUZZ_CASES)
@pytest.mark.parametrize("junk", [None, "", "x", 0, True, [], {}, [None], -1.5])
def test_any_field_null_missing_or_mistyped_never_crashes(
    fixture: str, topic: str, junk: object
) -> None:
    original = load(fixture)
    for path in _paths(original):
        payload = copy.deepcopy(original)
        _set(payload, path, junk)
        with contextlib.suppress(UnmappablePayload):
            normalize_shopify(topic, payload)


def _paths(data: dict[str, Any]) -> list[tuple[str, ...]]:
    """Every key of the payload, and the keys of its nested objects (one level down)."""
    paths: list[tuple[str, ...]] = []
    for key, value in data.items():
        paths.append((key,))
        if isinstance(value, dict):
            paths.extend((key, inner) for inner in value)
        if isinstance(value, list) and value and isinstance(value[0], dict):
            paths.extend((key, "0", inner) for inner in value[0])
    return paths


def _set(data: Any, path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        data = data[int(key)] if isinstance(data, list) else data[key]
    data[path[-1]] = value


# --- deliveries --------------------------------------------------------------------------

HEADERS = {
    "X-Shopify-Topic": "orders/paid",
    "X-Shopify-Hmac-Sha256": "ignored-here",
    "X-Shopify-Shop-Domain": "loja-da-ana.myshopify.com",
    "X-Shopify-Webhook-Id": "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043",
    "X-Shopify-Event-Id": "98880550-7158-44d4-b7cd-2c97c8a091b5",
    "X-Shopify-Triggered-At": "2024-05-10T17:41:37.814912Z",
    "X-Shopify-API-Version": "2024-04",
}


def test_shopify_delivery_reads_the_headers() -> None:
    delivery = shopify_delivery(HEADERS, b"{}")
    assert delivery.provider == "shopify"
    assert delivery.topic == "orders/paid"
    assert delivery.delivery_id == "b54557e4-bdd9-4b37-8a5f-bf7d70bcd043"
    assert delivery.origin == "loja-da-ana.myshopify.com"
    assert delivery.occurred_at == datetime(2024, 5, 10, 17, 41, 37, 814912, tzinfo=UTC)


def test_shopify_delivery_headers_match_case_insensitively() -> None:
    lowered = {k.lower(): v for k, v in HEADERS.items()}
    assert shopify_delivery(lowered, b"{}") == shopify_delivery(HEADERS, b"{}")


def test_shopify_delivery_id_falls_back_to_the_event_id_then_the_body() -> None:
    headers = {k: v for k, v in HEADERS.items() if k != "X-Shopify-Webhook-Id"}
    assert shopify_delivery(headers, b"{}").delivery_id == HEADERS["X-Shopify-Event-Id"]
    bare = {"X-Shopify-Topic": "orders/paid", "X-Shopify-Triggered-At": "garbage"}
    first = shopify_delivery(bare, b'{"id": 1}')
    assert first.delivery_id.startswith("sha256:")
    assert first.occurred_at is None
    assert shopify_delivery(bare, b'{"id": 1}').delivery_id == first.delivery_id
    assert shopify_delivery(bare, b'{"id": 2}').delivery_id != first.delivery_id
