"""Matching: which events an automation's filters accept, and why an automation did not run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinal.automations.matching import (
    ContactData,
    EventData,
    FilterResult,
    evaluate_condition,
    evaluate_filters,
    explain_match,
    resolve_trigger_metric,
    template_context,
)
from sinal.automations.model import OPERATORS, Condition, parse_automation
from sinal.automations.templates import MISSING, render_text
from sinal.catalog import TRIGGER_TO_METRIC, TRIGGER_TYPES
from sinal.store.base import StoredEvent

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
EXECUTION = UUID("0192f5d0-1a2b-7c3d-8e4f-0000000000e1")

ORDER = {
    "order_number": "#1001",
    "total": "297.90",  # Shopify sends amounts as text
    "subtotal": 297.9,
    "items": [{"sku": "CAMISA-P", "qty": 2}, {"sku": "MEIA", "qty": 1}],
    "tags": ["primeira-compra", "VIP"],
    "note": "Presente para a Ana",
    "gift": True,
    "coupon": None,
    "paid_at": "2026-11-29T10:15:00-03:00",
    "ship_by": "2026-12-02",
    "zip": "01310100",
    "naive_at": "2026-11-29T10:15:00",
}


def event(**changes: Any) -> EventData:
    fields: dict[str, Any] = {
        "metric_name": "Order Paid",
        "value": Decimal("297.90"),
        "currency": "BRL",
        "source": "shopify",
        "properties": ORDER,
        "occurred_at": T0,
        "received_at": T0,
    }
    return EventData(**{**fields, **changes})


def holds(field: str, op: str, value: Any, ev: EventData | None = None) -> bool:
    """Whether one filter, checked as a user would write it, holds for the event."""
    spec = parse_automation(
        {
            "name": "t",
            "trigger_metric": "Order Paid",
            "filters": [{"field": field, "op": op, "value": value}],
            "steps": [{"type": "close_conversation"}],
        }
    )
    return evaluate_filters(spec.filters, ev or event()).matched


@pytest.mark.parametrize(
    ("field", "op", "value", "expected"),
    [
        # eq / neq, decimal-exact: the event value is Decimal("297.90")
        ("value", "eq", 297.9, True),
        ("value", "eq", "297.9", True),
        ("value", "eq", "297.900", True),
        ("value", "eq", 297.91, False),
        ("value", "neq", 297.91, True),
        ("value", "neq", "297.90", False),
        ("properties.total", "eq", 297.9, True),  # text in the event, number in the filter
        ("properties.total", "eq", "297.90", True),
        ("properties.total", "eq", "297.9", False),  # text against text is compared as text
        ("properties.subtotal", "eq", "297.90", True),  # number in the event
        ("properties.subtotal", "eq", 297.90, True),
        ("properties.order_number", "eq", "#1001", True),
        ("properties.order_number", "eq", 1001, False),  # not a number: false, not an error
        ("properties.zip", "eq", "01310100", True),
        ("properties.zip", "eq", "1310100", False),
        ("properties.zip", "eq", 1310100, True),  # a number asks for a numeric comparison
        ("properties.gift", "eq", True, True),
        ("properties.gift", "eq", 1, False),  # booleans only equal booleans
        ("properties.items[1].qty", "eq", 1, True),
        ("properties.items[0].qty", "eq", True, False),
        ("properties.items[0].sku", "eq", "CAMISA-P", True),
        ("properties.items[0].sku", "eq", "camisa-p", False),  # eq is exact
        ("properties.items", "eq", "CAMISA-P", False),  # a list never equals a scalar
        ("properties.items", "neq", "CAMISA-P", True),
        ("currency", "eq", "brl", True),  # currency codes are normalized when saved
        ("currency", "neq", "USD", True),
        ("source", "eq", "shopify", True),
        ("source", "eq", "Shopify", False),
        # gt / gte / lt / lte
        ("value", "gt", 297.89, True),
        ("value", "gt", 297.9, False),
        ("value", "gte", "297.90", True),
        ("value", "gte", 297.9000001, False),
        ("value", "lt", 300, True),
        ("value", "lte", 297.9, True),
        ("value", "lt", -1, False),
        ("properties.total", "gte", 100, True),
        ("properties.total", "lt", "297.91", True),
        ("properties.subtotal", "gt", 0.1, True),
        ("properties.order_number", "gt", 0, False),  # "#1001" is no number
        ("properties.gift", "gt", 0, False),
        ("properties.items", "gt", 0, False),
        ("properties.paid_at", "gte", "2026-11-29", True),  # by calendar date
        ("properties.paid_at", "gt", "2026-11-29", False),
        ("properties.paid_at", "lt", "2026-11-29T13:15:01Z", True),  # by instant
        ("properties.paid_at", "lt", "2026-11-29T13:15:00Z", False),
        ("properties.paid_at", "lte", "2026-11-29T13:15:00+00:00", True),
        ("properties.ship_by", "lt", "2026-12-03", True),
        ("properties.ship_by", "gt", "2026-11-29T00:00:00Z", False),  # a date has no instant
        ("properties.naive_at", "gt", "2026-01-01T00:00:00Z", False),  # naive never matches
        ("properties.naive_at", "gt", "2026-01-01", True),  # but has a calendar date
        ("properties.note", "gt", "2026-01-01", False),
        ("properties.note", "gt", 1, False),
        # contains
        ("properties.note", "contains", "ana", True),  # case-insensitive on text
        ("properties.note", "contains", "PRESENTE", True),
        ("properties.note", "contains", "Pedro", False),
        ("properties.tags", "contains", "VIP", True),  # list element, exact
        ("properties.tags", "contains", "vip", False),
        ("properties.items", "contains", "MEIA", False),  # elements are objects
        ("properties.total", "contains", "297", True),
        ("properties.subtotal", "contains", "297", False),  # a number is not text
        ("properties.gift", "contains", "t", False),
        ("source", "contains", "shop", True),
        # in
        ("value", "in", [100, 297.9], True),
        ("value", "in", ["100", "297.90"], True),
        ("value", "in", [100, 200], False),
        ("currency", "in", ["USD", "BRL"], True),
        ("source", "in", ["yampi", "nuvemshop"], False),
        ("properties.items[0].sku", "in", ["MEIA", "CAMISA-P"], True),
        ("properties.gift", "in", [1, "true"], False),
        ("properties.gift", "in", [True], True),
        # exists: JSON null counts as absent
        ("properties.coupon", "exists", False, True),
        ("properties.coupon", "exists", True, False),
        ("properties.note", "exists", True, True),
        ("properties.nothing", "exists", False, True),
        ("properties.items[5]", "exists", False, True),
        ("properties.items[0].sku", "exists", True, True),
        ("value", "exists", True, True),
    ],
)
def test_evaluate_filters_operators(field: str, op: str, value: Any, expected: bool) -> None:
    assert holds(field, op, value) is expected


@pytest.mark.parametrize("text", ["1_000", " 1000 ", "+1000", "\u0661\u0660\u0660\u0660"])
def test_evaluate_filters_text_not_written_as_a_number_is_no_number(text: str) -> None:
    ev = event(properties={**ORDER, "total": text})
    assert holds("properties.total", "eq", 1000, ev) is False
    assert holds("properties.total", "gte", 1, ev) is False
    assert holds("properties.total", "eq", text, ev) is True  # text against text


@pytest.mark.parametrize("op", [op for op in OPERATORS if op != "exists"])
@pytest.mark.parametrize(
    "field",
    ["properties.missing", "properties.coupon", "properties.items[9].sku", "properties.note.x"],
)
def test_evaluate_filters_absent_field_is_false_for_every_operator(field: str, op: str) -> None:
    value: Any = {"in": ["a"], "contains": "a", "gt": 1, "gte": 1, "lt": 1, "lte": 1}.get(op, "a")
    assert holds(field, op, value) is False


def test_evaluate_filters_absent_value_is_false_except_exists_false() -> None:
    no_value = event(value=None)
    assert holds("value", "gte", 0, no_value) is False
    assert holds("value", "neq", 1, no_value) is False
    assert holds("value", "exists", False, no_value) is True


def test_evaluate_filters_reports_the_first_false_condition() -> None:
    filters = [
        Condition("value", "gte", 100),
        Condition("properties.coupon_code", "eq", "BLACK"),
        Condition("value", "gte", 1000),
    ]
    result = evaluate_filters(filters, event())
    assert result == FilterResult(False, 1, filters[1], missing=True)
    assert not result
    assert result.message == "filter 1 (properties.coupon_code eq 'BLACK') is false: " + (
        "properties.coupon_code is absent"
    )
    assert evaluate_filters(filters[2:], event()).message == ("filter 0 (value gte 1000) is false")


def test_evaluate_filters_empty_filters_match() -> None:
    result = evaluate_filters([], event())
    assert result.matched
    assert bool(result)
    assert result.message == "all conditions hold"


CONTACT = ContactData(
    id=UUID("0192f5d0-1a2b-7c3d-8e4f-000000000002"),
    name="Ana Souza",
    email="ana@example.com",
    phone="+5511987654321",
    tags=("vip", "newsletter"),
    attributes={"plan": {"tier": "gold"}, "orders": 3},
)


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (Condition("contact.tags", "contains", "vip"), True),
        (Condition("contact.tags", "contains", "VIP"), False),
        (Condition("contact.tags", "exists", True), True),
        (Condition("contact.email", "contains", "@EXAMPLE.com"), True),
        (Condition("contact.phone", "eq", "+5511987654321"), True),
        (Condition("contact.name", "in", ("Ana Souza", "Ana")), True),
        (Condition("contact.attributes.plan.tier", "eq", "gold"), True),
        (Condition("contact.attributes.orders", "gte", 3), True),
        (Condition("contact.attributes.orders", "gt", 3), False),
        (Condition("contact.attributes.missing", "exists", False), True),
    ],
)
def test_evaluate_filters_reads_contact_fields(condition: Condition, expected: bool) -> None:
    assert evaluate_filters([condition], event(), CONTACT).matched is expected


@pytest.mark.parametrize(
    "condition",
    [
        Condition("contact.tags", "contains", "vip"),
        Condition("contact.name", "eq", "Ana"),
        Condition("contact.email", "exists", True),
    ],
)
def test_evaluate_filters_contact_fields_without_a_contact_are_absent(
    condition: Condition,
) -> None:
    result = evaluate_filters([condition], event())
    assert not result.matched
    assert result.missing


def test_evaluate_filters_contact_without_tags_or_email() -> None:
    bare = ContactData(name="Ana")
    assert evaluate_filters([Condition("contact.email", "exists", False)], event(), bare).matched
    assert not evaluate_filters([Condition("contact.tags", "contains", "vip")], event(), bare)


# --------------------------------------------------------------------------- explain_match


def automation(**changes: Any) -> Any:
    data: dict[str, Any] = {
        "name": "Pedido pago acima de 100",
        "trigger_type": "order_paid",
        "filters": [{"field": "value", "op": "gte", "value": 100}],
        "steps": [{"type": "send_message", "text": "Obrigado!"}],
    }
    return parse_automation({**data, **changes})


@pytest.mark.parametrize(
    ("spec_changes", "event_changes", "created_at", "outcome"),
    [
        ({}, {}, T0 - timedelta(days=1), "triggered"),
        ({}, {}, T0, "triggered"),  # created the instant the event arrived
        ({"trigger_type": "order_created"}, {}, T0, "other_metric"),
        ({}, {"metric_name": "Order Placed"}, T0, "other_metric"),
        ({}, {"automation_execution_id": EXECUTION}, T0, "from_automation"),
        ({"status": "paused"}, {}, T0, "paused"),
        ({}, {}, T0 + timedelta(seconds=1), "created_after_event"),
        ({}, {"value": Decimal("99.99")}, T0, "filter_false"),
        ({}, {"value": None}, T0, "filter_false"),
        # the first reason wins: other metric before everything else
        ({"status": "paused"}, {"metric_name": "Order Placed",
                                "automation_execution_id": EXECUTION}, T0, "other_metric"),
        ({"status": "paused"}, {"automation_execution_id": EXECUTION}, T0, "from_automation"),
        ({"status": "paused"}, {"value": Decimal(1)}, T0 + timedelta(days=1), "paused"),
        ({}, {"value": Decimal(1)}, T0 + timedelta(days=1), "created_after_event"),
    ],
)  # fmt: skip
def test_explain_match_outcomes(
    spec_changes: dict[str, Any],
    event_changes: dict[str, Any],
    created_at: datetime,
    outcome: str,
) -> None:
    decision = explain_match(automation(**spec_changes), event(**event_changes), created_at)
    assert decision.outcome == outcome
    assert decision.triggered is (outcome == "triggered")
    assert len(decision.message.split()) >= 3


def test_explain_match_own_message_only_for_the_automation_that_sent_it() -> None:
    sender, other = uuid4(), uuid4()
    status = event(properties={"sent_by_automation_id": str(sender)})
    decision = explain_match(automation(), status, T0, sender)
    assert decision.outcome == "own_message"
    assert "this automation sent" in decision.message
    assert explain_match(automation(), status, T0, other).triggered
    assert explain_match(automation(), status, T0).triggered  # no id given: not known as own
    assert explain_match(automation(), event(), T0, sender).triggered  # a status of no step


def test_explain_match_own_message_comes_after_from_automation_before_paused() -> None:
    sender = uuid4()
    status = {"properties": {"sent_by_automation_id": str(sender)}}
    from_step = explain_match(automation(), event(automation_execution_id=EXECUTION, **status),
                              T0, sender)  # fmt: skip
    assert from_step.outcome == "from_automation"
    paused = explain_match(automation(status="paused"), event(**status), T0, sender)
    assert paused.outcome == "own_message"
    late = explain_match(automation(), event(**status), T0 + timedelta(days=1), sender)
    assert late.outcome == "own_message"


def test_explain_match_names_the_false_filter() -> None:
    spec = automation(
        filters=[
            {"field": "currency", "op": "eq", "value": "BRL"},
            {"field": "properties.items[0].qty", "op": "gte", "value": 3},
        ]
    )
    decision = explain_match(spec, event(), T0)
    assert decision.outcome == "filter_false"
    assert decision.filter_index == 1
    assert decision.filter_field == "properties.items[0].qty"
    assert decision.as_dict() == {
        "outcome": "filter_false",
        "message": "filter 1 (properties.items[0].qty gte 3) is false",
        "filter_index": 1,
        "filter_field": "properties.items[0].qty",
    }


def test_explain_match_compares_creation_with_arrival_not_occurrence() -> None:
    imported = event(occurred_at=T0 - timedelta(days=365), received_at=T0)
    assert explain_match(automation(), imported, T0 - timedelta(days=1)).triggered
    late = explain_match(automation(), imported, T0 + timedelta(minutes=1))
    assert late.outcome == "created_after_event"
    assert late.as_dict() == {"outcome": "created_after_event", "message": late.message}


def test_explain_match_falls_back_to_occurred_at_without_received_at() -> None:
    ev = event(received_at=None)
    assert explain_match(automation(), ev, T0).triggered
    assert explain_match(automation(), ev, T0 + timedelta(1)).outcome == "created_after_event"


def test_explain_match_from_automation_message_names_the_execution() -> None:
    decision = explain_match(automation(), event(automation_execution_id=EXECUTION), T0)
    assert str(EXECUTION) in decision.message


def test_explain_match_accepts_stored_events() -> None:
    stored = StoredEvent(
        account_id=UUID(int=1),
        id=UUID(int=2),
        contact_id=UUID(int=3),
        metric_name="Order Paid",
        properties={"total": "297.90"},
        value=Decimal("297.90"),
        currency="BRL",
        source="shopify",
        source_id="1001",
        integration_id=None,
        unique_event_id="shopify:order:1001",
        entity_type="order",
        entity_id="1001",
        automation_execution_id=None,
        occurred_at=T0,
        received_at=T0,
        schema_version=1,
    )
    assert explain_match(automation(), stored, T0).triggered


@pytest.mark.parametrize("trigger_type", TRIGGER_TYPES)
def test_resolve_trigger_metric_maps_trigger_types(trigger_type: str) -> None:
    spec = automation(trigger_type=trigger_type)
    assert resolve_trigger_metric(spec) == TRIGGER_TO_METRIC[trigger_type]


def test_resolve_trigger_metric_keeps_custom_metrics() -> None:
    spec = parse_automation(
        {"name": "x", "trigger_metric": "Assinatura Renovada", "steps": [{"type": "add_tag",
                                                                         "tag": "assinante"}]}
    )  # fmt: skip
    assert resolve_trigger_metric(spec) == "Assinatura Renovada"
    ev = event(metric_name="Assinatura Renovada")
    assert explain_match(spec, ev, T0).triggered


# --------------------------------------------------------------------------- templates


def test_template_context_renders_event_and_contact_fields() -> None:
    context = template_context(event(id=UUID(int=7)), CONTACT)
    text = (
        "Olá {{ contact.name | first_name }}, seu pedido {{ event.properties.order_number }} "
        "de {{ event.value | money }} foi pago! ({{ contact.tags[0] }}, {{ event.id }})"
    )
    assert render_text(text, context) == (
        "Olá Ana, seu pedido #1001 de R$ 297,90 foi pago! "
        "(vip, 00000000-0000-0000-0000-000000000007)"
    )


def test_template_context_without_contact_renders_defaults() -> None:
    context = template_context(event())
    assert render_text('Oi {{ contact.name | default:"cliente" }}', context) == "Oi cliente"


# --------------------------------------------------------------------------- properties

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.decimals()
    | st.text(max_size=12)
    | st.datetimes().map(str),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
_condition_values = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.booleans(),
    st.sampled_from(["2026-11-29", "2026-11-29T10:00:00Z", "297.90", "-0"]),
)


@settings(database=None, max_examples=500)
@given(
    actual=st.one_of(_json, st.just(MISSING)),
    op=st.sampled_from(OPERATORS),
    value=_condition_values,
    items=st.lists(_condition_values, min_size=1, max_size=3),
)
def test_evaluate_condition_never_raises(
    actual: object, op: Any, value: Any, items: list[Any]
) -> None:
    expected = tuple(items) if op == "in" else value
    if op == "exists":
        expected = bool(value)
    result = evaluate_condition(Condition("properties.x", op, expected), actual)
    assert isinstance(result, bool)
    if op == "neq" and actual is not MISSING and actual is not None:
        assert result is not evaluate_condition(Condition("properties.x", "eq", expected), actual)


@settings(database=None, max_examples=100)
@given(st.dictionaries(st.text(max_size=6), _json, max_size=6))
def test_evaluate_filters_never_raises_on_any_properties(properties: dict[str, Any]) -> None:
    filters = [Condition("properties." + key, "exists", True) for key in ("a", "b")]
    filters += [Condition("properties.a.b[0]", "gte", "2026-11-29")]
    assert isinstance(evaluate_filters(filters, event(properties=properties)), FilterResult)
