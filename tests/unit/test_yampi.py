"""Yampi webhooks into events: every event, the status alias table, São Paulo times."""

from __future__ import annotations

import contextlib
import copy
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sinal.catalog import (
    METRIC_CHECKOUT_ABANDONED,
    METRIC_CHECKOUT_RECOVERED,
    METRIC_CUSTOMER_CREATED,
    METRIC_ORDER_CANCELLED,
    METRIC_ORDER_FULFILLED,
    METRIC_ORDER_PAID,
    METRIC_ORDER_PLACED,
    METRIC_ORDER_REFUNDED,
    METRIC_SHIPMENT_CREATED,
    METRIC_SHIPMENT_DELIVERED,
    METRIC_SHIPMENT_IN_TRANSIT,
)
from sinal.events import prepare
from sinal.integrations import (
    UnmappablePayload,
    map_yampi,
    normalize_yampi,
    parse_body,
    recovered_checkout,
    yampi_delivery,
)
from sinal.integrations.base import Mapped
from sinal.integrations.yampi import EVENTS, STATUS_ALIASES

FIXTURES = Path(__file__).parent.parent / "fixtures" / "yampi"
ACCOUNT = "0192f5d0-1a2b-7c3d-8e4f-000000000001"
CONTACT = "0192f5d0-1a2b-7c3d-8e4f-000000000002"
NOW = datetime(2024, 6, 1, tzinfo=UTC)
ORDER_ID = "31874526"
CART_TOKEN = "c8a2f1e0-93b4-4d7c-8e5a-0b1c2d3e4f50"


def load(name: str) -> dict[str, Any]:
    """A fixture payload, parsed the way the HTTP edge parses it."""
    return dict(parse_body((FIXTURES / f"{name}.json").read_bytes()))


def one(payload: dict[str, Any]) -> Mapped:
    events = map_yampi(payload)
    assert len(events) == 1
    return events[0]


def with_status(alias: str) -> dict[str, Any]:
    payload = load("order_status_updated")
    payload["resource"]["status"]["data"]["alias"] = alias
    return payload


# --- every event -------------------------------------------------------------------------

EVENT_TABLE = [
    # fixture, metric, entity_type, source_id, value, occurred_at (UTC)
    ("order_created", METRIC_ORDER_PLACED, "order_placed", ORDER_ID, "297.90",
     datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)),
    ("order_paid", METRIC_ORDER_PAID, "order_paid", ORDER_ID, "297.90",
     datetime(2024, 5, 10, 17, 36, 5, tzinfo=UTC)),
    ("cart_reminder", METRIC_CHECKOUT_ABANDONED, "checkout_abandoned", CART_TOKEN, "328.99",
     datetime(2024, 5, 10, 18, 5, 41, tzinfo=UTC)),
    ("customer_created", METRIC_CUSTOMER_CREATED, "customer", "12877512", None,
     datetime(2024, 5, 11, 11, 2, 17, tzinfo=UTC)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fixture", "metric", "entity_type", "source_id", "value", "occurred_at"),
    EVENT_TABLE,
    ids=[row[0] for row in EVENT_TABLE],
)
def test_map_yampi_maps_each_event(
    *,
    fixture: str,
    metric: str,
    entity_type: str,
    source_id: str,
    value: str | None,
    occurred_at: datetime,
) -> None:
    event = one(load(fixture))
    assert event.metric_name == metric
    assert event.source == "yampi"
    assert event.unique_event_id == f"yampi:{entity_type}:{source_id}"
    assert event.value == (None if value is None else Decimal(value))
    assert event.occurred_at == occurred_at
    prepared = prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)
    assert prepared.unique_event_id == event.unique_event_id
    assert prepared.currency == "BRL"


def test_order_placed_carries_items_discounts_and_the_cart_token() -> None:
    event = one(load("order_created"))
    props = event.properties
    assert props["order_id"] == ORDER_ID
    assert props["order_number"] == "1000417"
    assert props["items"][0] == {
        "sku": "CAM-ORG-AZ-M",
        "product_id": "9120381",
        "sku_id": "33102938",
        "title": "Camiseta Algodão Orgânico Azul M",
        "quantity": 2,
        "price": "89.90",
    }
    assert props["discount_codes"] == ["BEMVINDA10"]
    assert (props["total"], props["shipping"], props["discount"]) == ("297.90", "18.10", "31.09")
    assert props["cart_token"] == CART_TOKEN
    assert "customer" not in props
    assert "123.456.789-09" not in str(props)  # no CPF


def test_order_contact_is_normalized() -> None:
    contact = one(load("order_created")).contact
    assert contact.phone == "+5511987654321"
    assert contact.email == "ana.souza@exemplo.com.br"  # sent as Ana.Souza@Exemplo.com.br
    assert contact.external_id == "yampi:customer:12877409"
    assert contact.name == "Ana Souza"


@pytest.mark.parametrize(
    "phone",
    [
        {"full_number": "11987654321"},
        {"full_number": "1187654321"},  # without the ninth digit
        {"full_number": "5511987654321"},
        {"full_number": None, "formated_number": "(11) 8765-4321"},
        {"full_number": "junk", "formated_number": "(11) 98765-4321"},
        "(11) 98765-4321",
        "+55 11 8765-4321",
    ],
)
def test_brazilian_phones_with_and_without_ninth_digit_are_one_person(phone: object) -> None:
    payload = load("order_created")
    payload["resource"]["customer"]["data"]["phone"] = phone
    assert one(payload).contact.phone == "+5511987654321"


def test_customer_created_maps_a_legacy_mobile_and_keeps_no_cpf() -> None:
    event = one(load("customer_created"))
    assert event.contact.phone == "+5521976543210"  # sent as (21) 7654-3210
    assert event.contact.external_id == "yampi:customer:12877512"
    assert event.properties == {"customer_id": "12877512"}


# --- dedup ids ---------------------------------------------------------------------------


def test_placed_and_paid_are_two_events_and_paid_twice_is_one() -> None:
    placed = one(load("order_created"))
    paid = one(load("order_paid"))
    paid_by_status = [
        e for e in map_yampi(with_status("paid")) if e.metric_name == METRIC_ORDER_PAID
    ]
    assert placed.unique_event_id != paid.unique_event_id
    assert [e.unique_event_id for e in paid_by_status] == [paid.unique_event_id]


def test_a_redelivery_maps_to_the_same_events() -> None:
    assert map_yampi(load("order_status_updated")) == map_yampi(load("order_status_updated"))


# --- order.status.updated ----------------------------------------------------------------

ALIAS_TABLE = [
    ("waiting_payment", "pending", []),
    ("paid", "paid", [METRIC_ORDER_PAID]),
    ("invoiced", "paid", []),
    ("handling_products", "paid", []),
    ("shipped", "fulfilled", [METRIC_ORDER_FULFILLED, METRIC_SHIPMENT_CREATED]),
    ("on_carriage", "fulfilled", [METRIC_SHIPMENT_IN_TRANSIT]),
    ("delivered", "delivered", [METRIC_SHIPMENT_DELIVERED]),
    ("cancelled", "cancelled", [METRIC_ORDER_CANCELLED]),
    ("refused", "cancelled", [METRIC_ORDER_CANCELLED]),
    ("refunded", "refunded", [METRIC_ORDER_REFUNDED]),
]


@pytest.mark.parametrize(("alias", "status", "metrics"), ALIAS_TABLE)
def test_status_update_maps_by_alias(alias: str, status: str, metrics: list[str]) -> None:
    result = normalize_yampi(with_status(alias))
    assert [e.metric_name for e in result.events] == metrics
    assert result.order is not None
    assert (result.order.status, result.order.provider_status) == (status, alias)
    assert result.ignored == (None if metrics else "status_without_event")
    for event in result.events:
        prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)


def test_the_alias_table_is_fully_tested() -> None:
    assert {row[0] for row in ALIAS_TABLE} == set(STATUS_ALIASES)


def test_status_alias_is_read_case_insensitively() -> None:
    assert [e.metric_name for e in map_yampi(with_status("CANCELLED"))] == [METRIC_ORDER_CANCELLED]


@pytest.mark.parametrize(
    ("alias", "reason"), [("in_dispute", "unknown_status_alias"), ("", "no_status_alias")]
)
def test_an_unknown_alias_records_nothing_with_a_reason(alias: str, reason: str) -> None:
    result = normalize_yampi(with_status(alias))
    assert result.events == ()
    assert result.ignored == reason


def test_shipped_order_carries_tracking_and_no_value_on_the_shipment() -> None:
    fulfilled, shipment = map_yampi(load("order_status_updated"))
    assert fulfilled.value == Decimal("297.90")
    assert (shipment.value, shipment.currency) == (None, None)
    assert shipment.unique_event_id == f"yampi:shipment_created:{ORDER_ID}"
    assert shipment.properties["tracking_number"] == "QB123456789BR"
    assert shipment.properties["tracking_url"].endswith("objeto=QB123456789BR")
    assert shipment.properties["tracking_company"] == "Correios - SEDEX"


def test_refused_payment_is_a_cancellation_with_its_reason() -> None:
    (event,) = map_yampi(with_status("refused"))
    assert event.properties["cancel_reason"] == "payment_refused"
    (cancelled,) = map_yampi(with_status("cancelled"))
    assert "cancel_reason" not in cancelled.properties
    assert event.unique_event_id == cancelled.unique_event_id  # one cancellation per order


def test_status_update_time_is_the_event_time() -> None:
    payload = load("order_status_updated")
    assert one(with_status("delivered")).occurred_at == datetime(2024, 5, 12, 13, 3, 45, tzinfo=UTC)
    del payload["time"]
    payload["resource"]["status"]["data"]["alias"] = "delivered"
    assert one(payload).occurred_at == datetime(2024, 5, 12, 13, 3, 41, tzinfo=UTC)


# --- Yampi times are America/Sao_Paulo ---------------------------------------------------


@pytest.mark.parametrize(
    ("created_at", "expected"),
    [
        (
            {
                "date": "2024-05-10 14:32:10.000000",
                "timezone_type": 3,
                "timezone": "America/Sao_Paulo",
            },
            datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC),
        ),
        ("2024-05-10 14:32:10", datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)),
        ("2024-05-10 14:32:10.250000", datetime(2024, 5, 10, 17, 32, 10, 250000, tzinfo=UTC)),
        ("2024-05-10T14:32:10-03:00", datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)),
        ("2024-05-10T17:32:10Z", datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)),
        # Brazil still had daylight saving time in December 2018: UTC-2.
        ("2018-12-01 12:00:00", datetime(2018, 12, 1, 14, 0, tzinfo=UTC)),
        (
            {"date": "2024-05-10 14:32:10.000000", "timezone": "America/Manaus"},
            datetime(2024, 5, 10, 18, 32, 10, tzinfo=UTC),
        ),
        ({"date": "2024-05-10 14:32:10.000000"}, datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC)),
        # PHP's timezone_type 1, a DateTime built with an offset: "+HH:MM"
        (
            {"date": "2024-05-10 14:32:10.000000", "timezone_type": 1, "timezone": "-03:00"},
            datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC),
        ),
        (
            {"date": "2024-05-10 14:32:10.000000", "timezone_type": 1, "timezone": "+05:30"},
            datetime(2024, 5, 10, 9, 2, 10, tzinfo=UTC),
        ),
        (
            {"date": "2024-05-10 14:32:10", "timezone": "-0300"},
            datetime(2024, 5, 10, 17, 32, 10, tzinfo=UTC),
        ),
        (
            {"date": "2024-05-10 14:32:10", "timezone": "+00:00"},
            datetime(2024, 5, 10, 14, 32, 10, tzinfo=UTC),
        ),
    ],
)
def test_yampi_times_are_read_in_sao_paulo(created_at: object, expected: datetime) -> None:
    payload = load("order_created")
    payload["resource"]["created_at"] = created_at
    occurred_at = one(payload).occurred_at
    assert occurred_at == expected
    assert occurred_at.tzinfo is UTC


# --- carts and recovery ------------------------------------------------------------------


def test_cart_reminder_is_the_abandonment_with_its_recovery_url() -> None:
    result = normalize_yampi(load("cart_reminder"))
    (event,) = result.events
    assert event.properties["checkout_url"].startswith(
        "https://lojadaana.pay.yampi.com.br/cart/recover/"
    )
    assert event.properties["checkout_token"] == CART_TOKEN
    assert [i["sku"] for i in event.properties["items"]] == ["CAM-ORG-AZ-M", "CAL-LIN-AR-40"]
    assert event.contact.phone == "+5511987654321"
    assert result.checkout is not None
    assert result.checkout.updated_at == datetime(2024, 5, 10, 17, 5, 41, tzinfo=UTC)


def test_a_later_order_with_the_cart_token_is_the_recovery() -> None:
    placed = one(load("order_created"))
    assert placed.order is not None
    assert CART_TOKEN in placed.order.checkout_tokens
    event = recovered_checkout(placed, CART_TOKEN)
    assert event.metric_name == METRIC_CHECKOUT_RECOVERED
    assert event.unique_event_id == f"yampi:checkout_recovered:{CART_TOKEN}"
    assert event.value == Decimal("297.90")
    assert event.properties["order_number"] == placed.properties["order_number"] == "1000417"


def test_cart_without_totalizers_uses_value_total() -> None:
    payload = load("cart_reminder")
    payload["resource"]["totalizers"] = None
    payload["resource"]["value_total"] = "310.89"
    assert one(payload).value == Decimal("310.89")


# --- malformed payloads ------------------------------------------------------------------


ON_MARS = {"date": "2024-05-10 14:32:10", "timezone": "Mars/Olympus"}


@pytest.mark.parametrize(
    "zone",
    [
        "localtime",  # the host's own zone: the time would depend on the machine
        "Factory",
        "posixrules",
        "right/UTC",
        "posix/UTC",
        "America",  # a directory
        "-24:00",
        "+03:60",
        "-3:00",
        "+03:00:00",
    ],
)
def test_a_yampi_time_in_a_zone_that_is_no_iana_zone_nor_offset_is_unmappable(zone: str) -> None:
    payload = load("order_created")
    payload["resource"]["created_at"] = {"date": "2024-05-10 14:32:10", "timezone": zone}
    with pytest.raises(UnmappablePayload) as caught:
        normalize_yampi(payload)
    assert caught.value.reason == "invalid_timestamp"


@pytest.mark.parametrize(
    ("fixture", "path", "value", "reason"),
    [
        ("order_created", ("event",), None, "missing_field"),
        ("order_created", ("event",), "order.exploded", "unsupported_event"),
        ("order_created", ("resource",), None, "missing_field"),
        ("order_created", ("resource",), [1], "missing_field"),
        ("order_created", ("resource", "id"), None, "missing_field"),
        ("order_created", ("resource", "value_total"), "R$ 297,90", "invalid_amount"),
        ("order_created", ("resource", "customer"), None, "no_contact"),
        ("order_created", ("resource", "created_at"), "ontem", "invalid_timestamp"),
        ("order_created", ("resource", "created_at"), ON_MARS, "invalid_timestamp"),
        ("order_paid", ("time",), None, "missing_field"),
        ("cart_reminder", ("resource", "customer"), None, "no_contact"),
        ("customer_created", ("resource", "id"), None, "missing_field"),
    ],
)  # fmt: skip
def test_malformed_payloads_are_unmappable_with_a_reason(
    fixture: str, path: tuple[str, ...], value: object, reason: str
) -> None:
    payload = load(fixture)
    if path == ("time",):  # order.paid with no time at all
        payload["time"] = None
        payload["resource"]["updated_at"] = None
        payload["resource"]["created_at"] = None
    else:
        _set(payload, path, value)
    with pytest.raises(UnmappablePayload) as caught:
        normalize_yampi(payload)
    assert caught.value.reason == reason


def test_cart_token_falls_back_to_the_cart_id() -> None:
    payload = load("cart_reminder")
    payload["resource"]["token"] = None
    payload["resource"]["id"] = None
    with pytest.raises(UnmappablePayload):
        normalize_yampi(payload)
    payload["resource"]["id"] = 20931877
    assert one(payload).source_id == "20931877"


@pytest.mark.parametrize(
    "fixture", ["order_created", "order_paid", "order_status_updated", "cart_reminder"]
)
@pytest.mark.parametrize("junk", [None, "", "x", 0, True, [], {}, [None], 1.5])
def test_any_field_null_or_mistyped_never_crashes(fixture: str, junk: object) -> None:
    original = load(fixture)
    for path in _paths(original):
        payload = copy.deepcopy(original)
        _set(payload, path, junk)
        with contextlib.suppress(UnmappablePayload):
            normalize_yampi(payload)


def _paths(
    data: dict[str, Any], prefix: tuple[str, ...] = (), depth: int = 3
) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for key, value in data.items():
        paths.append((*prefix, key))
        if isinstance(value, dict) and depth > 1:
            paths.extend(_paths(value, (*prefix, key), depth - 1))
    return paths


def _set(data: Any, path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def test_every_event_has_a_fixture() -> None:
    events = {
        load(name)["event"]
        for name in (
            "order_created",
            "order_paid",
            "order_status_updated",
            "cart_reminder",
            "customer_created",
        )
    }
    assert events == EVENTS


# --- deliveries --------------------------------------------------------------------------


def test_yampi_delivery_reads_the_body() -> None:
    body = (FIXTURES / "order_paid.json").read_bytes()
    delivery = yampi_delivery({"X-Yampi-Hmac-SHA256": "x"}, body)
    assert delivery.provider == "yampi"
    assert delivery.topic == "order.paid"
    assert delivery.origin == "lojadaana"
    assert delivery.occurred_at == datetime(2024, 5, 10, 17, 36, 5, tzinfo=UTC)
    assert delivery.delivery_id.startswith("sha256:")
    assert yampi_delivery({}, body) == delivery  # a redelivery: same id


def test_yampi_delivery_survives_a_body_that_is_not_json() -> None:
    delivery = yampi_delivery({}, b"<html>oops</html>")
    assert delivery.topic is None
    assert delivery.occurred_at is None
    assert delivery.delivery_id.startswith("sha256:")


def test_a_cart_or_customer_without_any_time_is_unmappable() -> None:
    cart = load("cart_reminder")
    cart["time"] = cart["resource"]["created_at"] = cart["resource"]["updated_at"] = None
    customer = load("customer_created")
    customer["time"] = customer["resource"]["created_at"] = None
    for payload in (cart, customer):
        with pytest.raises(UnmappablePayload) as caught:
            normalize_yampi(payload)
        assert caught.value.reason == "missing_field"


def test_a_non_object_payload_is_unmappable() -> None:
    with pytest.raises(UnmappablePayload) as caught:
        normalize_yampi("order.paid")  # type: ignore[arg-type]
    assert caught.value.reason == "invalid_json"
