"""Automation definitions: what `parse_automation` accepts, normalizes and rejects."""

from __future__ import annotations

import copy
import unicodedata
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinal.automations.model import (
    MAX_STEPS,
    OPERATORS,
    SECRET_MASK,
    STEP_TYPES,
    AddTag,
    AiRespond,
    AutomationSpec,
    CloseConversation,
    Condition,
    FilterStep,
    InvalidAutomation,
    RemoveTag,
    SendMessage,
    SendTemplate,
    Wait,
    Webhook,
    apply_patch,
    parse_automation,
    redact_secrets,
)
from sinal.catalog import TRIGGER_TYPES
from sinal.errors import SinalError
from sinal.events import dumps_json

SEND = {"type": "send_message", "text": "Olá {{ contact.name | first_name }}!"}


def definition(**changes: Any) -> dict[str, Any]:
    """A valid definition ("Pedido pago" → one message), with `changes` applied."""
    data: dict[str, Any] = {
        "name": "Pedido pago",
        "trigger_type": "order_paid",
        "steps": [SEND],
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not _DROP}


_DROP = object()


def is_sentence(message: str) -> bool:
    return message == message.strip() and len(message.split()) >= 3


def rejections(data: object) -> list[tuple[str, str]]:
    """The (field, code) pairs a user gets, after checking each message reads well."""
    with pytest.raises(InvalidAutomation) as excinfo:
        parse_automation(data)
    errors = excinfo.value.errors
    assert errors, "InvalidAutomation must list at least one field"
    for error in errors:
        assert is_sentence(error.message), error
    assert str(excinfo.value).startswith(f"{errors[0].field}: ")
    return [(error.field, error.code) for error in errors]


# --------------------------------------------------------------------------- accepted


def test_parse_automation_minimal_definition_gets_defaults() -> None:
    spec = parse_automation(definition())
    assert spec == AutomationSpec(
        name="Pedido pago",
        trigger_type="order_paid",
        steps=(SendMessage("Olá {{ contact.name | first_name }}!"),),
    )
    assert spec.status == "active"
    assert spec.is_active
    assert spec.filters == ()
    assert spec.metric_name == "Order Paid"


@pytest.mark.parametrize("trigger_type", TRIGGER_TYPES)
def test_parse_automation_accepts_every_event_trigger_type(trigger_type: str) -> None:
    assert parse_automation(definition(trigger_type=trigger_type)).trigger_type == trigger_type


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        ("Order Paid", "Order Paid"),
        ("Assinatura Renovada", "Assinatura Renovada"),  # custom metrics too
        ("  Lead Qualificado ", "Lead Qualificado"),
        ("x" * 128, "x" * 128),
    ],
)
def test_parse_automation_accepts_any_metric_name(raw: str, stored: str) -> None:
    spec = parse_automation(definition(trigger_type=_DROP, trigger_metric=raw))
    assert spec.trigger_metric == stored
    assert spec.trigger_type is None
    assert spec.metric_name == stored


MSG = {"type": "send_message"}
TPL = {"type": "send_template", "name": "pedido_pago", "language": "pt_BR"}
AI = {"type": "ai_respond"}
HOOK = {"type": "webhook", "url": "https://hooks.example.com/a"}
WAIT = {"type": "wait"}
TAG = {"type": "add_tag"}
BODY = {"type": "body", "parameters": [{"type": "text", "text": "{{ contact.name }}"}]}


def when(field: str, op: str, value: object) -> dict[str, object]:
    """A condition as a user writes it."""
    return {"field": field, "op": op, "value": value}


@pytest.mark.parametrize(
    ("step", "parsed"),
    [
        ({**MSG, "text": "Oi!\nTudo bem?"}, SendMessage("Oi!\nTudo bem?")),
        (TPL, SendTemplate("pedido_pago", "pt_BR")),
        (
            {**TPL, "language": "en", "parameters": ["{{ contact.name }}", "{{ event.value }}"]},
            SendTemplate("pedido_pago", "en", ("{{ contact.name }}", "{{ event.value }}")),
        ),
        ({**TPL, "components": [BODY]}, SendTemplate("pedido_pago", "pt_BR", (), (BODY,))),
        (
            {**MSG, "text": "Veja https://x.com", "track_links": False},
            SendMessage("Veja https://x.com"),
        ),
        ({**MSG, "text": "https://x.com", "track_links": True}, SendMessage("https://x.com", True)),
        (
            {**MSG, "text": "https://x.com", "track_links": True, "campaign": " Black  Friday "},
            SendMessage("https://x.com", True, "Black  Friday"),
        ),
        (
            {**TPL, "parameters": ["{{ event.properties.url }}"], "track_links": True},
            SendTemplate("pedido_pago", "pt_BR", ("{{ event.properties.url }}",), (), True),
        ),
        ({**AI, "track_links": True, "campaign": "ia"}, AiRespond(None, None, None, True, "ia")),
        (
            {**MSG, "text": "oi", "phone_number_id": " 106540352242922 "},
            SendMessage("oi", phone_number_id="106540352242922"),
        ),
        (
            {**TPL, "phone_number_id": "1"},
            SendTemplate("pedido_pago", "pt_BR", phone_number_id="1"),
        ),
        ({**AI, "phone_number_id": "1"}, AiRespond(phone_number_id="1")),
        ({**TAG, "tag": " vip "}, AddTag("vip")),
        ({"type": "remove_tag", "tag": "carrinho-aberto"}, RemoveTag("carrinho-aberto")),
        ({"type": "close_conversation"}, CloseConversation()),
        (AI, AiRespond()),
        (
            {**AI, "system_prompt": "Seja breve.", "prompt": "{{ event.source }}", "max_tokens": 9},
            AiRespond("Seja breve.", "{{ event.source }}", 9),
        ),
        (HOOK, Webhook("https://hooks.example.com/a")),
        (
            {**HOOK, "url": "http://10.0.0.5:8080/x?y=1", "headers": {"X-Token": "s"}},
            Webhook("http://10.0.0.5:8080/x?y=1", (("X-Token", "s"),)),
        ),
        ({**WAIT, "seconds": 1}, Wait(seconds=1)),
        ({**WAIT, "seconds": 30 * 86400}, Wait(seconds=30 * 86400)),
        (
            {**WAIT, "until": "2026-12-01T10:00:00-03:00"},
            Wait(until=datetime(2026, 12, 1, 13, 0, tzinfo=UTC)),
        ),
        (
            {"type": "filter", "conditions": [when("contact.tags", "contains", "vip")]},
            FilterStep((Condition("contact.tags", "contains", "vip"),)),
        ),
    ],
)
def test_parse_automation_parses_each_step_type(step: dict[str, Any], parsed: object) -> None:
    spec = parse_automation(definition(steps=[step]))
    assert spec.steps == (parsed,)
    assert spec.steps[0].type == step["type"]
    again = parse_automation(definition(steps=[spec.steps[0].to_dict()]))
    assert again.steps == (parsed,)


def test_parse_automation_every_step_type_is_covered() -> None:
    assert set(STEP_TYPES) == {
        "send_message",
        "send_template",
        "add_tag",
        "remove_tag",
        "close_conversation",
        "ai_respond",
        "webhook",
        "wait",
        "filter",
    }


def test_parse_automation_send_template_components_are_copied() -> None:
    image = {"type": "image", "image": {"link": "https://cdn.example.com/y.png"}}
    button = {"type": "button", "sub_type": "url", "index": 0, "parameters": [{"type": "text"}]}
    components: list[dict[str, Any]] = [
        {"type": "header", "parameters": [image]},
        copy.deepcopy(BODY),
        button,
    ]
    original = copy.deepcopy(components)
    spec = parse_automation(definition(steps=[{**TPL, "components": components}]))
    components[1]["parameters"][0]["text"] = "changed after parsing"
    parsed = spec.steps[0]
    assert isinstance(parsed, SendTemplate)
    assert list(parsed.components) == original


@pytest.mark.parametrize(
    ("condition", "stored"),
    [
        (when("value", "gte", 100), Condition("value", "gte", 100)),
        (when("value", "lt", "297.90"), Condition("value", "lt", "297.90")),
        (when("currency", "eq", "usd"), Condition("currency", "eq", "USD")),
        (when("currency", "in", ["brl", "USD"]), Condition("currency", "in", ("BRL", "USD"))),
        (when("source", "in", ["shopify"]), Condition("source", "in", ("shopify",))),
        (
            when("properties.items[0].sku", "eq", "ABC-1"),
            Condition("properties.items[0].sku", "eq", "ABC-1"),
        ),
        (when("properties.gift", "eq", True), Condition("properties.gift", "eq", True)),
        (
            when("properties.paid_at", "gte", "2026-11-29"),
            Condition("properties.paid_at", "gte", "2026-11-29"),
        ),
        (
            when("properties.paid_at", "lt", "2026-11-29T10:00:00Z"),
            Condition("properties.paid_at", "lt", "2026-11-29T10:00:00Z"),
        ),
        (when("properties.note", "contains", "a"), Condition("properties.note", "contains", "a")),
        (
            when("properties.coupon", "exists", False),
            Condition("properties.coupon", "exists", False),
        ),
        # Decimals become the JSON number they equal (as JSON text they would compare as text).
        (
            when("properties.total", "eq", Decimal("297.90")),
            Condition("properties.total", "eq", 297.9),
        ),
        (when("value", "gte", Decimal("1E+2")), Condition("value", "gte", 100)),
        (
            when("value", "in", [Decimal("100.00"), "99.90"]),
            Condition("value", "in", (100, "99.90")),
        ),
    ],
)
def test_parse_automation_accepts_filters(condition: dict[str, Any], stored: Condition) -> None:
    assert parse_automation(definition(filters=[condition])).filters == (stored,)


def test_parse_automation_every_operator_is_accepted_on_properties() -> None:
    values: dict[str, object] = {"in": [1, "a"], "exists": True, "contains": "x"}
    filters = [when("properties.x", op, values.get(op, 1)) for op in OPERATORS]
    spec = parse_automation(definition(filters=filters))
    assert [c.op for c in spec.filters] == list(OPERATORS)


def test_parse_automation_accepts_fifty_steps() -> None:
    spec = parse_automation(definition(steps=[SEND] * MAX_STEPS))
    assert len(spec.steps) == MAX_STEPS


# --------------------------------------------------------------------------- rejected

NO_TYPE = {"trigger_type": _DROP}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (None, [("$", "invalid_type")]),
        ([], [("$", "invalid_type")]),
        ("automação", [("$", "invalid_type")]),
        (definition(name=_DROP), [("name", "required")]),
        (definition(name=""), [("name", "empty")]),
        (definition(name="   "), [("name", "empty")]),
        (definition(name=7), [("name", "invalid_type")]),
        (definition(name="x" * 201), [("name", "too_long")]),
        (definition(name="a\x00b"), [("name", "control_characters")]),
        (definition(name="linha\nnova"), [("name", "control_characters")]),
        (definition(status="stopped"), [("status", "invalid_choice")]),
        (definition(status=None), [("status", "invalid_choice")]),
        (definition(trigger_type=_DROP), [("trigger_metric", "required")]),
        (definition(trigger_metric="Order Paid"), [("trigger_type", "conflict")]),
        (definition(trigger_type="webhook"), [("trigger_type", "not_event_trigger")]),
        (definition(trigger_type="schedule"), [("trigger_type", "not_event_trigger")]),
        (definition(trigger_type="order_shipped"), [("trigger_type", "unknown_trigger")]),
        (definition(trigger_type="Order Paid"), [("trigger_type", "unknown_trigger")]),
        (definition(trigger_type=3), [("trigger_type", "invalid_type")]),
        (definition(**NO_TYPE, trigger_metric=""), [("trigger_metric", "empty")]),
        (definition(**NO_TYPE, trigger_metric=["x"]), [("trigger_metric", "invalid_type")]),
        (definition(**NO_TYPE, trigger_metric="x" * 129), [("trigger_metric", "too_long")]),
        (definition(**NO_TYPE, trigger_metric="__webhook__"), [("trigger_metric", "reserved")]),
        (  # it would listen to a custom metric no system event is recorded as
            definition(**NO_TYPE, trigger_metric="order paid"),
            [("trigger_metric", "misspelt_system_metric")],
        ),
        (
            definition(**NO_TYPE, trigger_metric="order_paid"),
            [("trigger_metric", "misspelt_system_metric")],
        ),
        (
            definition(**NO_TYPE, trigger_metric="a\tb"),
            [("trigger_metric", "control_characters")],
        ),
        (definition(steps=_DROP), [("steps", "required")]),
        (definition(steps=[]), [("steps", "empty")]),
        (definition(steps={"type": "send_message"}), [("steps", "invalid_type")]),
        (definition(steps=[SEND] * (MAX_STEPS + 1)), [("steps", "too_many")]),
        (definition(filters={"field": "value"}), [("filters", "invalid_type")]),
        (definition(filters=[when("value", "exists", True)] * 21), [("filters", "too_many")]),
        (definition(trigger="order_paid"), [("trigger", "unknown_field")]),
        (definition(filter=[]), [("filter", "unknown_field")]),
    ],
)
def test_parse_automation_rejects_top_level_fields(
    data: object, expected: list[tuple[str, str]]
) -> None:
    assert rejections(data) == expected


def headers(**values: object) -> dict[str, object]:
    return {**HOOK, "headers": {name.replace("_", "-"): v for name, v in values.items()}}


def components(*items: object) -> dict[str, object]:
    return {**TPL, "components": list(items)}


@pytest.mark.parametrize(
    ("step", "field", "code"),
    [
        ("send_message", "", "invalid_type"),
        ({"text": "oi"}, ".type", "required"),
        ({"type": "send_sms", "text": "oi"}, ".type", "invalid_choice"),
        ({"type": 1}, ".type", "invalid_choice"),
        (MSG, ".text", "required"),
        ({**MSG, "text": ""}, ".text", "empty"),
        ({**MSG, "text": 5}, ".text", "invalid_type"),
        ({**MSG, "text": "x" * 4097}, ".text", "too_long"),
        ({**MSG, "text": "a\x07b"}, ".text", "control_characters"),
        ({**MSG, "text": "oi", "txt": "x"}, ".txt", "unknown_field"),
        ({**MSG, "text": "Olá {{ nome }}"}, ".text", "unknown_variable"),
        ({**MSG, "text": "Pedido de {{ event.total }}"}, ".text", "unknown_variable"),
        ({**MSG, "text": "Olá {{ contact.nome | default:'x' }}"}, ".text", "unknown_variable"),
        ({**MSG, "text": "{{ event[0] }}"}, ".text", "unknown_variable"),
        ({**MSG, "text": "{{ contact.attributes.plano }}"}, ".text", "unknown_variable"),
        ({**TPL, "parameters": ["{{ event.order_number }}"]}, ".parameters[0]", "unknown_variable"),
        ({**MSG, "text": "Olá {{ contact.name"}, ".text", "unterminated_tag"),
        ({**MSG, "text": "{{ event.value | reais }}"}, ".text", "unknown_filter"),
        ({**TPL, "name": None}, ".name", "required"),
        ({**TPL, "name": "Pedido Pago"}, ".name", "invalid_format"),
        ({**TPL, "language": None}, ".language", "required"),
        ({**TPL, "language": "pt-BR"}, ".language", "invalid_format"),
        ({**TPL, "language": "portuguese"}, ".language", "invalid_format"),
        ({**TPL, "parameters": "a"}, ".parameters", "invalid_type"),
        ({**TPL, "parameters": ["ok", 2]}, ".parameters[1]", "invalid_type"),
        ({**TPL, "parameters": ["a\nb"]}, ".parameters[0]", "control_characters"),
        ({**TPL, "parameters": ["{{ x }}"]}, ".parameters[0]", "unknown_variable"),
        ({**TPL, "parameters": [], "components": []}, ".components", "conflict"),
        (components({"parameters": []}), ".components[0]", "invalid_type"),
        (
            components({"type": "body", "parameters": [{"type": "text", "text": "{{ x.y }}"}]}),
            ".components[0].parameters[0].text",
            "unknown_variable",
        ),
        (components({"type": "body", "n": float("nan")}), ".components[0].n", "invalid_type"),
        (components({"type": "body", "n": 2**64}), ".components[0].n", "out_of_range"),
        (components({"type": "body", "n": [-(10**15)]}), ".components[0].n[0]", "out_of_range"),
        (TAG, ".tag", "required"),
        ({**MSG, "text": "oi", "track_links": "yes"}, ".track_links", "invalid_type"),
        ({**MSG, "text": "oi", "track_links": 1}, ".track_links", "invalid_type"),
        ({**MSG, "text": "oi", "campaign": "bf"}, ".campaign", "conflict"),
        (
            {**MSG, "text": "oi", "phone_number_id": 106540352242922},
            ".phone_number_id",
            "invalid_type",
        ),
        ({**TPL, "phone_number_id": " "}, ".phone_number_id", "empty"),
        ({**MSG, "text": "oi", "track_links": True, "campaign": ""}, ".campaign", "empty"),
        (
            {**MSG, "text": "oi", "track_links": True, "campaign": "x" * 201},
            ".campaign",
            "too_long",
        ),
        (
            {**MSG, "text": "oi", "track_links": True, "campaign": "a\tb"},
            ".campaign",
            "control_characters",
        ),
        ({**TPL, "components": [BODY], "track_links": True}, ".track_links", "conflict"),
        ({**AI, "track_links": "true"}, ".track_links", "invalid_type"),
        ({**AI, "campaign": "ia", "track_links": False}, ".campaign", "conflict"),
        ({**TAG, "tag": "vip", "track_links": True}, ".track_links", "unknown_field"),
        ({**TAG, "tag": " "}, ".tag", "empty"),
        ({"type": "remove_tag", "tag": "x" * 65}, ".tag", "too_long"),
        ({"type": "remove_tag", "tag": ["vip"]}, ".tag", "invalid_type"),
        ({"type": "close_conversation", "reason": "x"}, ".reason", "unknown_field"),
        ({**AI, "max_tokens": 0}, ".max_tokens", "out_of_range"),
        ({**AI, "max_tokens": 40000}, ".max_tokens", "out_of_range"),
        ({**AI, "max_tokens": "300"}, ".max_tokens", "invalid_type"),
        ({**AI, "max_tokens": True}, ".max_tokens", "invalid_type"),
        ({**AI, "prompt": "{{ event.x | upper:'a' }}"}, ".prompt", "unexpected_argument"),
        ({**AI, "system_prompt": ""}, ".system_prompt", "empty"),
        ({"type": "webhook"}, ".url", "required"),
        ({**HOOK, "url": "ftp://example.com/x"}, ".url", "unsupported_scheme"),
        ({**HOOK, "url": "javascript:alert(1)"}, ".url", "unsupported_scheme"),
        ({**HOOK, "url": "/relative/path"}, ".url", "unsupported_scheme"),
        ({**HOOK, "url": "https://"}, ".url", "invalid_url"),
        ({**HOOK, "url": "https://exa mple.com"}, ".url", "invalid_url"),
        ({**HOOK, "url": "https://example.com:99999/"}, ".url", "invalid_url"),
        ({**HOOK, "url": "https://example.com:0/"}, ".url", "invalid_url"),
        ({**HOOK, "url": "https://user:pw@example.com/"}, ".url", "invalid_url"),
        ({**HOOK, "url": "https://example.com/" + "a" * 2048}, ".url", "too_long"),
        ({**HOOK, "url": "https://a..b/h"}, ".url", "invalid_url"),  # an empty label
        ({**HOOK, "url": f"https://{'a' * 64}.com/h"}, ".url", "invalid_url"),  # over 63
        ({**HOOK, "url": "https://☃.net/h"}, ".url", "invalid_url"),  # not in IDNA 2008
        ({**HOOK, "url": "https://999.1.1.1/h"}, ".url", "invalid_url"),
        (headers(X_Token="senha-ção"), ".headers.X-Token", "invalid_header"),
        ({**HOOK, "headers": ["X-A: b"]}, ".headers", "invalid_type"),
        ({**HOOK, "headers": {"X A": "b"}}, ".headers.X A", "invalid_header"),
        (headers(X_A="b\r\nX-B: c"), ".headers.X-A", "invalid_header"),
        (headers(X_A=1), ".headers.X-A", "invalid_header"),
        (headers(Host="evil.example.com"), ".headers.Host", "forbidden_header"),
        (headers(Content_Length="1"), ".headers.Content-Length", "forbidden_header"),
        ({**HOOK, "headers": {"X-A": "1", "x-a": "2"}}, ".headers.x-a", "duplicate_header"),
        (headers(**{f"X{i}": "v" for i in range(21)}), ".headers", "too_many"),
        (WAIT, ".seconds", "required"),
        ({**WAIT, "seconds": 0}, ".seconds", "out_of_range"),
        ({**WAIT, "seconds": 30 * 86400 + 1}, ".seconds", "out_of_range"),
        ({**WAIT, "seconds": 1.5}, ".seconds", "invalid_type"),
        ({**WAIT, "seconds": "60"}, ".seconds", "invalid_type"),
        ({**WAIT, "seconds": 60, "until": "2026-12-01T10:00:00Z"}, ".until", "conflict"),
        ({**WAIT, "until": "amanhã"}, ".until", "invalid_value"),
        ({**WAIT, "until": "2026-12-01"}, ".until", "invalid_value"),
        ({**WAIT, "until": "2026-12-01T10:00:00"}, ".until", "naive_datetime"),
        ({**WAIT, "until": "0001-01-01T00:00:00+01:00"}, ".until", "out_of_range"),
        ({**WAIT, "until": "9999-12-31T23:59:59-01:00"}, ".until", "out_of_range"),
        ({"type": "filter"}, ".conditions", "required"),
        ({"type": "filter", "conditions": []}, ".conditions", "empty"),
        (
            {"type": "filter", "conditions": [when("contact.age", "gt", 1)]},
            ".conditions[0].field",
            "invalid_field",
        ),
        (
            {"type": "filter", "conditions": [when("contact.tags", "eq", "vip")]},
            ".conditions[0].op",
            "unsupported_operator",
        ),
    ],
)
def test_parse_automation_rejects_step_fields(step: object, field: str, code: str) -> None:
    step = {k: v for k, v in step.items() if v is not None} if isinstance(step, dict) else step
    assert rejections(definition(steps=[SEND, step])) == [(f"steps[1]{field}", code)]


def test_contact_attributes_are_refused_until_contacts_have_them() -> None:
    """Contacts hold no custom attributes yet: a filter on one could never hold."""
    step = {"type": "filter", "conditions": [when("contact.attributes.plan", "eq", "gold")]}
    with pytest.raises(InvalidAutomation) as caught:
        parse_automation(definition(steps=[step]))
    [error] = caught.value.errors
    assert (error.field, error.code) == ("steps[0].conditions[0].field", "invalid_field")
    assert "contacts have no custom attributes" in error.message


@pytest.mark.parametrize(
    "host",
    [
        "hooks.example.com", "ação.com.br", "xn--ao-siap.com.br", "a_b.example.com",
        "example.com.", "-a.example.com", "127.0.0.1", "[::1]", "a..b", ".a.com",
        f"{'a' * 64}.com", f"{'é' * 64}.com", "☃.net", "ß.de", "999.1.1.1",
    ],
)  # fmt: skip
def test_webhook_hosts_accepted_are_those_http_clients_can_connect_to(host: str) -> None:
    """What httpx makes of the host, and then the resolver (`socket.getaddrinfo` encodes a
    name with Python's IDNA codec): a host either refuses raises a step's error at run
    time, so the definition is refused when it is saved."""
    url = f"https://{host}/hook"
    data = definition(steps=[{**HOOK, "url": url}])
    try:
        httpx.URL(url).raw_host.decode("ascii").encode("idna")
    except (httpx.InvalidURL, UnicodeError):
        assert rejections(data) == [("steps[0].url", "invalid_url")]
    else:
        assert parse_automation(data).steps[0] == Webhook(url)


@pytest.mark.parametrize(
    ("condition", "field", "code"),
    [
        ("value >= 100", "", "invalid_type"),
        ({"op": "eq", "value": 1}, ".field", "required"),
        ({"field": 1, "op": "eq", "value": 1}, ".field", "invalid_type"),
        (when("total", "eq", 1), ".field", "invalid_field"),
        (when("properties", "exists", True), ".field", "invalid_field"),
        (when("properties.", "eq", 1), ".field", "invalid_field"),
        (when("properties.items[x]", "eq", 1), ".field", "invalid_field"),
        (when("properties.a b", "eq", 1), ".field", "invalid_field"),
        (when("value.amount", "eq", 1), ".field", "invalid_field"),
        (when("contact.email", "eq", "a@b.c"), ".field", "invalid_field"),  # filter steps only
        ({"field": "value", "value": 1}, ".op", "required"),
        (when("value", ">=", 1), ".op", "invalid_choice"),
        (when("value", "GTE", 1), ".op", "invalid_choice"),
        ({"field": "value", "op": "gte"}, ".value", "required"),
        (when("value", "contains", 1), ".op", "unsupported_operator"),
        (when("currency", "gt", "BRL"), ".op", "unsupported_operator"),
        (when("source", "lt", "a"), ".op", "unsupported_operator"),
        (when("value", "gte", "cem"), ".value", "invalid_value"),
        # numbers as text are written as JSON numbers, as an event's value is
        (when("value", "gte", "1_000"), ".value", "invalid_value"),
        (when("value", "gte", "+.5"), ".value", "invalid_value"),
        (when("value", "eq", " 5 "), ".value", "invalid_value"),
        (when("value", "in", [1, "\u0661\u0660\u0660"]), ".value[1]", "invalid_value"),
        (when("properties.x", "gt", "1_000"), ".value", "invalid_value"),
        (when("value", "eq", True), ".value", "invalid_value"),
        (when("value", "eq", float("nan")), ".value", "invalid_value"),
        (when("value", "lt", "Infinity"), ".value", "invalid_value"),
        (when("value", "lt", 10**15), ".value", "out_of_range"),
        (when("value", "lt", "-1e15"), ".value", "out_of_range"),
        (when("value", "gt", "2026-11-29"), ".value", "invalid_value"),
        (when("currency", "eq", "REAIS"), ".value", "invalid_value"),
        (when("currency", "in", ["BRL", "XYZ"]), ".value[1]", "invalid_value"),
        (when("source", "eq", 1), ".value", "invalid_value"),
        (when("source", "eq", "x" * 1025), ".value", "too_long"),
        (when("properties.x", "eq", Decimal("0.12345678901234567890")), ".value", "invalid_value"),
        (when("properties.x", "eq", None), ".value", "invalid_value"),
        (when("properties.x", "eq", [1]), ".value", "invalid_value"),
        (when("properties.x", "eq", {"a": 1}), ".value", "invalid_value"),
        (when("properties.x", "in", "a"), ".value", "invalid_value"),
        (when("properties.x", "in", []), ".value", "invalid_value"),
        (when("properties.x", "in", [1, None]), ".value[1]", "invalid_value"),
        (when("properties.x", "in", list(range(101))), ".value", "too_many"),
        (when("properties.x", "exists", "yes"), ".value", "invalid_value"),
        (when("properties.x", "exists", 1), ".value", "invalid_value"),
        (when("properties.x", "gt", "ontem"), ".value", "invalid_value"),
        (when("properties.x", "gt", True), ".value", "invalid_value"),
        (when("properties.x", "gt", "2026-02-30"), ".value", "invalid_value"),
        (when("properties.x", "lte", "2026-11-29T10:00:00"), ".value", "naive_datetime"),
        (when("properties.x", "contains", None), ".value", "invalid_value"),
        ({**when("value", "eq", 1), "negate": True}, ".negate", "unknown_field"),
    ],
)
def test_parse_automation_rejects_filter_fields(condition: object, field: str, code: str) -> None:
    assert rejections(definition(filters=[condition])) == [(f"filters[0]{field}", code)]


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (date(2026, 1, 1), "2026-01-01"),
        (datetime(2026, 1, 1, 9, 30, tzinfo=UTC), "2026-01-01T09:30:00+00:00"),
        (
            datetime(2026, 1, 1, 9, 30, tzinfo=timezone(timedelta(hours=-3))),
            "2026-01-01T09:30:00-03:00",
        ),
    ],
)
def test_parse_automation_takes_python_dates_in_ordered_filters_as_iso_text(
    value: date, stored: str
) -> None:
    spec = parse_automation(definition(filters=[when("properties.paid_at", "gte", value)]))
    assert spec.filters == (Condition("properties.paid_at", "gte", stored),)
    assert parse_automation(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("condition", "stored"),
    [
        (when("contact.email", "eq", " Ana@Loja.COM "), "ana@loja.com"),
        (when("contact.email", "neq", "ana@café.com.br"), "ana@xn--caf-dma.com.br"),
        (when("contact.email", "contains", "@Loja"), "@Loja"),  # a substring, any case
        (when("contact.phone", "eq", "+55 11 98765-4321"), "+5511987654321"),
        (when("contact.phone", "in", ["11987654321", "(21) 3333-4444"]),
         ("+5511987654321", "+552133334444")),
        (when("contact.phone", "contains", "98765-4321"), "987654321"),
        (when("contact.tags", "contains", "  promoc\u0327a\u0303o "), "promoção"),
        (when("contact.name", "eq", " Ana "), " Ana "),
    ],
)  # fmt: skip
def test_parse_automation_compares_contact_fields_as_contacts_store_them(
    condition: dict[str, Any], stored: object
) -> None:
    spec = parse_automation(definition(steps=[{"type": "filter", "conditions": [condition]}]))
    step = spec.steps[0]
    assert isinstance(step, FilterStep)
    assert step.conditions[0].value == stored


@pytest.mark.parametrize(
    ("condition", "field", "code"),
    [
        (when("contact.email", "eq", "ana@"), ".value", "invalid_value"),
        (when("contact.phone", "in", ["11987654321", "123"]), ".value[1]", "invalid_value"),
        (when("contact.phone", "contains", "-"), ".value", "invalid_value"),
        (when("contact.tags", "contains", " "), ".value", "empty"),
        (when("contact.tags", "contains", 1), ".value", "invalid_type"),
    ],
)
def test_parse_automation_refuses_contact_values_no_contact_can_have(
    condition: dict[str, Any], field: str, code: str
) -> None:
    data = definition(steps=[{"type": "filter", "conditions": [condition]}])
    assert rejections(data) == [(f"steps[0].conditions[0]{field}", code)]


def test_parse_automation_refuses_a_naive_python_datetime_in_a_filter() -> None:
    data = definition(filters=[when("properties.paid_at", "lt", datetime(2026, 1, 1, 9, 30))])
    assert rejections(data) == [("filters[0].value", "naive_datetime")]


def test_parse_automation_checks_field_and_op_together() -> None:
    data = definition(filters=[when("nope", "nope", 1)])
    assert rejections(data) == [
        ("filters[0].field", "invalid_field"),
        ("filters[0].op", "invalid_choice"),
    ]


def test_parse_automation_reports_every_bad_field_at_once() -> None:
    data = {
        "name": "",
        "status": "on",
        "trigger_type": "webhook",
        "filters": [{"field": "properties.total", "op": "gte", "value": "cem"}],
        "steps": [
            {"type": "send_message", "text": "{{ contact.name | mony }}"},
            {"type": "wait", "seconds": 0},
            {"type": "webhook", "url": "ftp://x"},
        ],
    }
    assert rejections(data) == [
        ("name", "empty"),
        ("status", "invalid_choice"),
        ("trigger_type", "not_event_trigger"),
        ("filters[0].value", "invalid_value"),
        ("steps[0].text", "unknown_filter"),
        ("steps[1].seconds", "out_of_range"),
        ("steps[2].url", "unsupported_scheme"),
    ]


def test_templates_reach_every_field_a_step_renders() -> None:
    fields = [
        "event.id", "event.metric_name", "event.value", "event.currency", "event.source",
        "event.occurred_at", "event.properties.items[0].sku", "event", "contact.id",
        "contact.name", "contact.email", "contact.phone", "contact.tags[0]",
    ]  # fmt: skip
    text = " ".join(f"{{{{ {f} }}}}" for f in fields)
    parse_automation(definition(steps=[{"type": "send_message", "text": text}]))


def test_a_template_field_the_event_lacks_names_the_ones_it_has() -> None:
    text = "Oi! Seu pedido de {{ event.total | money }} foi pago"
    with pytest.raises(InvalidAutomation) as excinfo:
        parse_automation(definition(steps=[{"type": "send_message", "text": text}]))
    message = excinfo.value.errors[0].message
    assert "event has no field 'total'" in message
    assert "properties" in message
    assert "position 18" in message


def test_invalid_automation_is_a_sinal_value_error_naming_the_field() -> None:
    with pytest.raises(InvalidAutomation) as excinfo:
        parse_automation(definition(steps=[{"type": "send_message", "text": "{{ x }}"}]))
    error = excinfo.value
    assert isinstance(error, SinalError)
    assert isinstance(error, ValueError)
    assert error.field == "steps[0].text"
    assert error.reason == "unknown_variable"
    assert "position 3" in error.errors[0].message
    assert error.errors[0].as_dict()["field"] == "steps[0].text"


def test_parse_automation_explains_non_event_triggers() -> None:
    with pytest.raises(InvalidAutomation) as excinfo:
        parse_automation(definition(trigger_type="webhook"))
    message = excinfo.value.errors[0].message
    assert "not started by events" in message
    assert "order_paid" in message


# --------------------------------------------------------------------------- round trip


FULL = definition(
    status="paused",
    filters=[
        when("value", "gte", 100),
        when("properties.items[0].sku", "in", ["A", "B"]),
        when("currency", "eq", "BRL"),
    ],
    steps=[
        SEND,
        {**WAIT, "until": "2026-12-01T10:00:00-03:00"},
        {"type": "filter", "conditions": [when("contact.email", "exists", True)]},
        components(BODY),
        headers(X_Token="s"),
        {**AI, "prompt": "Responda: {{ event.properties.text }}", "max_tokens": 200},
        {**TAG, "tag": "vip"},
        {"type": "remove_tag", "tag": "lead"},
        {"type": "close_conversation"},
    ],
)


def test_to_dict_is_json_and_parses_back_equal() -> None:
    spec = parse_automation(FULL)
    data = orjson.loads(dumps_json(spec.to_dict()))
    assert parse_automation(data) == spec
    assert data["steps"][1] == {"type": "wait", "until": "2026-12-01T13:00:00Z"}
    assert "trigger_metric" not in data


# --------------------------------------------------------------------------- patch


def test_apply_patch_changes_only_what_it_names() -> None:
    spec = parse_automation(FULL)
    paused = apply_patch(spec, {"status": "active"})
    assert paused.status == "active"
    assert paused.steps == spec.steps
    assert paused.filters == spec.filters


def test_apply_patch_null_removes_a_field() -> None:
    spec = parse_automation(FULL)
    assert apply_patch(spec, {"filters": None}).filters == ()


@pytest.mark.parametrize(
    ("patch", "metric", "trigger_type"),
    [
        ({"trigger_metric": "Lead Qualificado"}, "Lead Qualificado", None),
        ({"trigger_type": "cart_abandoned"}, "Checkout Abandoned", "cart_abandoned"),
        ({"trigger_type": None, "trigger_metric": "Order Paid"}, "Order Paid", None),
    ],
)
def test_apply_patch_switches_the_trigger(
    patch: dict[str, Any], metric: str, trigger_type: str | None
) -> None:
    spec = parse_automation(FULL)
    patched = apply_patch(spec, patch)
    assert patched.metric_name == metric
    assert patched.trigger_type == trigger_type


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ([], [("$", "invalid_type")]),
        ({"name": None}, [("name", "required")]),
        ({"steps": []}, [("steps", "empty")]),
        ({"trigger_metric": "X", "trigger_type": "order_paid"}, [("trigger_type", "conflict")]),
        ({"trigger_type": None}, [("trigger_metric", "required")]),
        ({"id": "0192f5d0"}, [("id", "unknown_field")]),
        ({"steps": [{"type": "wait", "seconds": -1}]}, [("steps[0].seconds", "out_of_range")]),
    ],
)
def test_apply_patch_rejects_a_result_that_is_not_valid(
    patch: object, expected: list[tuple[str, str]]
) -> None:
    spec = parse_automation(FULL)
    with pytest.raises(InvalidAutomation) as excinfo:
        apply_patch(spec, patch)
    assert [(e.field, e.code) for e in excinfo.value.errors] == expected


A_KEY, B_KEY = "whsec_" + "A" * 32, "whsec_" + "B" * 32  # 24 bytes each


def _hooks(*steps: tuple[str, str | None]) -> list[dict[str, Any]]:
    return [
        {"type": "webhook", "url": f"https://hooks.example.com/{url}"}
        | ({} if secret is None else {"secret": secret})
        for url, secret in steps
    ]


@pytest.mark.parametrize(
    ("stored", "sent_back", "kept"),
    [
        # as shown, unchanged; moved behind another step; swapped; its url changed
        ([("a", A_KEY)], [("a", SECRET_MASK)], [A_KEY]),
        ([("a", A_KEY)], [("new", None), ("a", SECRET_MASK)], [None, A_KEY]),
        ([("a", A_KEY), ("b", B_KEY)], [("b", SECRET_MASK), ("a", SECRET_MASK)],
         [B_KEY, A_KEY]),
        ([("a", A_KEY)], [("moved", SECRET_MASK)], [A_KEY]),
        # sent without it: the step is given as it is to be
        ([("a", A_KEY)], [("a", None)], [None]),
    ],
)  # fmt: skip
def test_a_webhook_secret_sent_back_masked_keeps_the_one_stored_for_the_step(
    stored: list[tuple[str, str | None]],
    sent_back: list[tuple[str, str | None]],
    kept: list[str | None],
) -> None:
    spec = parse_automation({"name": "n", "trigger_metric": "M", "steps": _hooks(*stored)})
    assert redact_secrets(spec.to_dict())["steps"] == _hooks(
        *((url, None if s is None else SECRET_MASK) for url, s in stored)
    )
    patched = apply_patch(spec.to_dict(), {"steps": _hooks(*sent_back)})
    assert [getattr(step, "secret", None) for step in patched.steps] == kept


def test_a_masked_webhook_secret_with_no_secret_to_keep_is_refused() -> None:
    spec = parse_automation({"name": "n", "trigger_metric": "M", "steps": _hooks(("a", None))})
    with pytest.raises(InvalidAutomation) as excinfo:
        apply_patch(spec, {"steps": _hooks(("a", SECRET_MASK))})
    assert [(e.field, e.code) for e in excinfo.value.errors] == [
        ("steps[0].secret", "invalid_value")
    ]


TOKEN = {"Authorization": "Bearer s3cr3t", "X-Source": "sinal"}


def test_webhook_header_values_are_shown_masked_and_kept_when_sent_back_so() -> None:
    """As a secret is: each value shows as ********, which a PATCH sends back to keep it
    (found by the step's url, the name in any case); a value given replaces it, and a
    header left out is gone."""
    spec = parse_automation({"name": "n", "trigger_metric": "M",
                             "steps": [{**HOOK, "headers": TOKEN}]})  # fmt: skip
    assert redact_secrets(spec.to_dict())["steps"][0]["headers"] == {
        "Authorization": "********", "X-Source": "********",
    }  # fmt: skip
    assert "s3cr3t" not in repr(spec)

    sent_back = {**HOOK, "headers": {"authorization": "********", "X-New": "v"}}
    patched = apply_patch(spec.to_dict(), {"steps": [TAG | {"tag": "x"}, sent_back]})

    assert patched.steps[1] == Webhook(HOOK["url"], (("authorization", "Bearer s3cr3t"),
                                                     ("X-New", "v")))  # fmt: skip


def test_a_masked_header_value_with_no_value_to_keep_is_refused_naming_it() -> None:
    spec = parse_automation({"name": "n", "trigger_metric": "M",
                             "steps": [{**HOOK, "headers": TOKEN}]})  # fmt: skip
    with pytest.raises(InvalidAutomation) as excinfo:
        apply_patch(spec, {"steps": [{**HOOK, "headers": {"X-Api-Key": "********"}}]})
    [error] = excinfo.value.errors
    assert (error.field, error.code) == ("steps[0].headers.X-Api-Key", "invalid_value")
    assert "keeps the value this header already has" in error.message


# --------------------------------------------------------------------------- wait until

SAVED_AT = datetime(2026, 12, 7, 13, 0, tzinfo=UTC)
PAST, AHEAD = "2026-12-07T09:59:59-03:00", "2026-12-07T10:00:01-03:00"  # 13:00 UTC ± 1 s


def _waits(*untils: str) -> dict[str, Any]:
    return definition(steps=[SEND, *({**WAIT, "until": u} for u in untils)])


def test_a_wait_until_already_past_when_saved_is_refused_naming_it() -> None:
    """It would not wait at all: almost surely a mistake (a year or a month typed wrong)."""
    with pytest.raises(InvalidAutomation) as excinfo:
        parse_automation(_waits(AHEAD, PAST), now=SAVED_AT)
    [error] = excinfo.value.errors
    assert (error.field, error.code) == ("steps[2].until", "in_the_past")
    assert "2026-12-07T12:59:59Z is in the past (now: 2026-12-07T13:00:00Z)" in error.message
    assert parse_automation(_waits(AHEAD), now=SAVED_AT).steps[1] == Wait(
        until=SAVED_AT + timedelta(seconds=1)
    )


def test_a_stored_wait_until_that_has_passed_still_reads_and_patches() -> None:
    """Saved while it was ahead: read back (no `now`) it runs, past meaning at once, and a
    patch keeping it (other fields, or the steps sent back) is not refused for it."""
    stored = parse_automation(_waits(PAST), now=SAVED_AT - timedelta(days=1)).to_dict()
    assert parse_automation(stored).steps[1] == Wait(until=SAVED_AT - timedelta(seconds=1))
    assert apply_patch(stored, {"status": "paused"}, now=SAVED_AT).status == "paused"
    resent = [*stored["steps"], {**TAG, "tag": "vip"}]
    assert len(apply_patch(stored, {"steps": resent}, now=SAVED_AT).steps) == 3
    other_past = {**WAIT, "until": "2026-12-07T09:59:58-03:00"}
    with pytest.raises(InvalidAutomation) as excinfo:
        apply_patch(stored, {"steps": [*stored["steps"], other_past]}, now=SAVED_AT)
    assert [(e.field, e.code) for e in excinfo.value.errors] == [("steps[2].until", "in_the_past")]


# --------------------------------------------------------------------------- properties

_texts = st.text(
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="{}"),
    min_size=1,
    max_size=40,
).filter(lambda s: s.strip() != "")
_numbers = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(min_value=-1e12, max_value=1e12),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=4, max_value=10**9, min_value=-(10**9)
    ),
)
_keys = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=8)
_property_field = st.builds(
    lambda ks: "properties." + ".".join(ks), st.lists(_keys, min_size=1, max_size=3)
)
_scalars = st.one_of(_texts, _numbers, st.booleans())
_conditions = st.one_of(
    st.builds(when, _property_field, st.sampled_from(["eq", "neq"]), _scalars),
    st.builds(when, st.just("value"), st.sampled_from(["gt", "gte", "lt", "lte"]), _numbers),
    st.builds(when, _property_field, st.just("in"), st.lists(_scalars, min_size=1, max_size=4)),
    st.builds(when, _property_field, st.just("exists"), st.booleans()),
    st.builds(when, st.just("currency"), st.just("eq"), st.sampled_from(["brl", "USD", "EUR"])),
)
_contact_conditions = st.one_of(
    _conditions,
    st.builds(
        when,
        st.just("contact.tags"),
        st.just("contains"),
        _texts.filter(lambda s: len(" ".join(unicodedata.normalize("NFC", s).split())) <= 64),
    ),
    st.builds(when, st.just("contact.email"), st.just("contains"), _texts),
    st.builds(  # compared as stored: valid addresses only
        when,
        st.just("contact.email"),
        st.just("eq"),
        st.sampled_from(["ana@loja.com", " Bia@Loja.COM ", "caio@café.com.br"]),
    ),
)
_steps = st.one_of(
    st.builds(lambda t: {"type": "send_message", "text": t}, _texts),
    st.builds(
        lambda t, c: {"type": "send_message", "text": t, "track_links": True, "campaign": c},
        _texts,
        _texts.filter(lambda s: len(s.strip()) <= 200),
    ),
    st.builds(
        lambda t: {"type": "add_tag", "tag": t}, _texts.filter(lambda s: len(s.strip()) <= 64)
    ),
    st.builds(lambda n: {"type": "wait", "seconds": n}, st.integers(1, 30 * 86400)),
    st.builds(
        lambda d: {"type": "wait", "until": d.isoformat()}, st.datetimes(timezones=st.just(UTC))
    ),
    st.builds(lambda n: {"type": "ai_respond", "max_tokens": n}, st.integers(1, 32768)),
    st.just({"type": "close_conversation"}),
    st.builds(
        lambda cs: {"type": "filter", "conditions": cs},
        st.lists(_contact_conditions, min_size=1, max_size=3),
    ),
    st.builds(
        lambda ps: {**TPL, "parameters": ps},
        st.lists(_texts.filter(lambda s: len(s) <= 1024), max_size=3),
    ),
    st.builds(
        lambda hs: {**HOOK, "headers": hs},
        st.dictionaries(
            st.sampled_from(["X-Token", "X-Loja", "Authorization"]),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1).filter(
                lambda s: s.strip() != ""
            ),  # header values are ASCII
        ),
    ),
)
_definitions = st.fixed_dictionaries(
    {
        "name": _texts,
        "status": st.sampled_from(["active", "paused"]),
        "filters": st.lists(_conditions, max_size=4),
        "steps": st.lists(_steps, min_size=1, max_size=6),
    }
).flatmap(
    lambda d: st.one_of(
        st.builds(lambda t: {**d, "trigger_type": t}, st.sampled_from(TRIGGER_TYPES)),
        st.builds(
            lambda m: {**d, "trigger_metric": m},
            _texts.filter(lambda s: not s.strip().startswith("__")),
        ),
    )
)


@settings(database=None, max_examples=200)  # no .hypothesis/ directory: unit tests do no I/O
@given(_definitions)
def test_parse_automation_round_trips_through_to_dict(data: dict[str, Any]) -> None:
    spec = parse_automation(data)
    assert parse_automation(spec.to_dict()) == spec
    assert parse_automation(orjson.loads(dumps_json(spec.to_dict()))).to_dict() == spec.to_dict()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(database=None, max_examples=300)
@given(_json)
def test_parse_automation_rejects_garbage_with_field_errors_only(data: object) -> None:
    errors: tuple[object, ...] = ("accepted",)
    try:
        parse_automation(data)
    except InvalidAutomation as exc:
        errors = exc.errors
    assert errors
