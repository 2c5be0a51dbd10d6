"""The catalog matches the seed: metric names, categories, trigger maps and labels."""

from __future__ import annotations

import pytest

from sinal import catalog
from sinal.catalog import (
    LOCALES,
    METRIC_CATEGORY_MAP,
    METRIC_LABELS,
    METRIC_TO_TRIGGER,
    SYSTEM_METRICS,
    TRIGGER_TO_METRIC,
    TRIGGER_TYPES,
    Category,
    Locale,
    get_metric_category,
    get_metric_label,
    get_trigger_metric,
    is_system_metric,
    match_locale,
    negotiate_locale,
)

# Copied from the seed's tables: (constant, value, category), in the seed's order.
SEED_METRICS: list[tuple[str, str, str]] = [
    ("METRIC_ORDER_PLACED", "Order Placed", "ecommerce"),
    ("METRIC_ORDER_PAID", "Order Paid", "ecommerce"),
    ("METRIC_ORDER_CANCELLED", "Order Cancelled", "ecommerce"),
    ("METRIC_ORDER_FULFILLED", "Order Fulfilled", "ecommerce"),
    ("METRIC_ORDER_REFUNDED", "Order Refunded", "ecommerce"),
    ("METRIC_CHECKOUT_STARTED", "Checkout Started", "ecommerce"),
    ("METRIC_CHECKOUT_ABANDONED", "Checkout Abandoned", "ecommerce"),
    ("METRIC_CHECKOUT_RECOVERED", "Checkout Recovered", "ecommerce"),
    ("METRIC_CUSTOMER_CREATED", "Customer Created", "ecommerce"),
    ("METRIC_MESSAGE_RECEIVED", "Message Received", "messaging"),
    ("METRIC_MESSAGE_SENT", "Message Sent", "messaging"),
    ("METRIC_MESSAGE_DELIVERED", "Message Delivered", "messaging"),
    ("METRIC_MESSAGE_READ", "Message Read", "messaging"),
    ("METRIC_MESSAGE_FAILED", "Message Failed", "messaging"),
    ("METRIC_TEMPLATE_SENT", "Template Sent", "messaging"),
    ("METRIC_TEMPLATE_DELIVERED", "Template Delivered", "messaging"),
    ("METRIC_TEMPLATE_READ", "Template Read", "messaging"),
    ("METRIC_CAMPAIGN_SENT", "Campaign Sent", "messaging"),
    ("METRIC_AI_RESPONSE_SENT", "AI Response Sent", "messaging"),
    ("METRIC_SHIPMENT_CREATED", "Shipment Created", "tracking"),
    ("METRIC_SHIPMENT_IN_TRANSIT", "Shipment In Transit", "tracking"),
    ("METRIC_SHIPMENT_OUT_FOR_DELIVERY", "Shipment Out For Delivery", "tracking"),
    ("METRIC_SHIPMENT_DELIVERED", "Shipment Delivered", "tracking"),
    ("METRIC_SHIPMENT_EXCEPTION", "Shipment Exception", "tracking"),
    ("METRIC_LINK_CLICKED", "Link Clicked", "engagement"),
    ("METRIC_CONTACT_CREATED", "Contact Created", "contact"),
    ("METRIC_CONTACT_UPDATED", "Contact Updated", "contact"),
    ("METRIC_TAG_ADDED", "Tag Added", "contact"),
    ("METRIC_TAG_REMOVED", "Tag Removed", "contact"),
    ("METRIC_CONVERSATION_OPENED", "Conversation Opened", "contact"),
    ("METRIC_CONVERSATION_CLOSED", "Conversation Closed", "contact"),
    ("METRIC_CONVERSATION_ASSIGNED", "Conversation Assigned", "contact"),
]

SEED_TRIGGER_TO_METRIC: dict[str, str] = {
    "order_created": "Order Placed",
    "order_paid": "Order Paid",
    "checkout_created": "Checkout Started",
    "cart_abandoned": "Checkout Abandoned",
    "tracking_updated": "Shipment In Transit",
    "message_received": "Message Received",
    "new_contact": "Contact Created",
    "tag_added": "Tag Added",
    "webhook": "__webhook__",
    "schedule": "__schedule__",
}

SEED_METRIC_TO_TRIGGER: dict[str, str] = {
    "Order Placed": "order_created",
    "Order Paid": "order_paid",
    "Checkout Started": "checkout_created",
    "Checkout Abandoned": "cart_abandoned",
    "Shipment In Transit": "tracking_updated",
    "Message Received": "message_received",
    "Contact Created": "new_contact",
    "Tag Added": "tag_added",
}


def test_catalog_has_exactly_the_32_seed_metrics_in_order() -> None:
    assert len(SYSTEM_METRICS) == 32
    assert list(SYSTEM_METRICS) == [value for _, value, _ in SEED_METRICS]


@pytest.mark.parametrize(("constant", "value", "category"), SEED_METRICS)
def test_metric_constant_has_seed_value_and_category(
    constant: str, value: str, category: str
) -> None:
    assert getattr(catalog, constant) == value
    assert get_metric_category(value) == category
    assert get_metric_category(value) is Category(category)
    assert is_system_metric(value)


def test_metric_constants_are_all_exported() -> None:
    exported = {name for name in catalog.__all__ if name.startswith("METRIC_")}
    constants = exported - {
        "METRIC_CATEGORY_MAP",
        "METRIC_LABELS",
        "METRIC_TO_TRIGGER",
    }
    assert constants == {constant for constant, _, _ in SEED_METRICS}


def test_all_names_resolve() -> None:
    for name in catalog.__all__:
        assert hasattr(catalog, name), name


def test_category_values_are_the_seed_categories() -> None:
    assert [c.value for c in Category] == [
        "ecommerce",
        "messaging",
        "tracking",
        "engagement",
        "contact",
        "custom",
    ]
    assert str(Category.ECOMMERCE) == "ecommerce"


def test_category_map_equals_seed_table_and_is_read_only() -> None:
    assert dict(METRIC_CATEGORY_MAP) == {value: Category(cat) for _, value, cat in SEED_METRICS}
    with pytest.raises(TypeError):
        METRIC_CATEGORY_MAP["Foo"] = Category.CUSTOM  # type: ignore[index]


@pytest.mark.parametrize(
    "name", ["Subscribed To Newsletter", "", "order placed", "Order Placed ", "__webhook__"]
)
def test_unknown_metric_is_custom(name: str) -> None:
    assert get_metric_category(name) is Category.CUSTOM
    assert not is_system_metric(name)


def test_trigger_to_metric_equals_seed() -> None:
    assert dict(TRIGGER_TO_METRIC) == SEED_TRIGGER_TO_METRIC
    assert list(TRIGGER_TO_METRIC) == list(SEED_TRIGGER_TO_METRIC)


def test_metric_to_trigger_equals_seed() -> None:
    assert dict(METRIC_TO_TRIGGER) == SEED_METRIC_TO_TRIGGER


def test_metric_to_trigger_is_inverse_without_webhook_and_schedule() -> None:
    inverse = {
        metric: trigger
        for trigger, metric in TRIGGER_TO_METRIC.items()
        if trigger not in {"webhook", "schedule"}
    }
    assert dict(METRIC_TO_TRIGGER) == inverse
    assert all(is_system_metric(metric) for metric in METRIC_TO_TRIGGER)


def test_trigger_maps_are_read_only() -> None:
    with pytest.raises(TypeError):
        TRIGGER_TO_METRIC["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        METRIC_TO_TRIGGER["x"] = "y"  # type: ignore[index]


def test_trigger_types_are_the_eight_event_triggers() -> None:
    assert TRIGGER_TYPES == (
        "order_created",
        "order_paid",
        "checkout_created",
        "cart_abandoned",
        "tracking_updated",
        "message_received",
        "new_contact",
        "tag_added",
    )


@pytest.mark.parametrize(
    ("trigger", "metric"),
    [*SEED_TRIGGER_TO_METRIC.items(), ("nope", None), ("", None), ("Order_Created", None)],
)
def test_get_trigger_metric(trigger: str, metric: str | None) -> None:
    assert get_trigger_metric(trigger) == metric


def test_seed_label_examples() -> None:
    assert get_metric_label("Order Placed", "pt-BR") == "Pedido Criado"
    assert get_metric_label("Order Placed", "en") == "Order Placed"
    assert get_metric_label("Order Placed", "es") == "Pedido Creado"


@pytest.mark.parametrize("locale", LOCALES)
def test_every_metric_has_a_distinct_label_in_each_locale(locale: Locale) -> None:
    labels = [get_metric_label(name, locale) for name in SYSTEM_METRICS]
    assert all(label.strip() == label and label for label in labels)
    assert len(set(labels)) == 32
    assert dict(METRIC_LABELS[locale]) == dict(zip(SYSTEM_METRICS, labels, strict=True))


def test_english_label_is_the_metric_name() -> None:
    assert all(get_metric_label(name) == name for name in SYSTEM_METRICS)


def test_translated_labels_differ_from_english_names() -> None:
    # "Checkout Iniciado" etc. are real translations; none is the untranslated English.
    for locale in ("pt-BR", "es"):
        assert all(get_metric_label(name, locale) != name for name in SYSTEM_METRICS)


@pytest.mark.parametrize(
    ("name", "pt_br", "es"),
    [
        ("Order Paid", "Pedido Pago", "Pedido Pagado"),
        ("Message Received", "Mensagem Recebida", "Mensaje Recibido"),
        ("Template Sent", "Template Enviado", "Plantilla Enviada"),
        ("Shipment In Transit", "Envio em Trânsito", "Envío en Tránsito"),
        ("AI Response Sent", "Resposta de IA Enviada", "Respuesta de IA Enviada"),
        ("Conversation Assigned", "Conversa Atribuída", "Conversación Asignada"),
    ],
)
def test_labels_sample(name: str, pt_br: str, es: str) -> None:
    assert get_metric_label(name, "pt-BR") == pt_br
    assert get_metric_label(name, "es") == es


@pytest.mark.parametrize("locale", [*LOCALES, None, "", "fr", "pt_BR", "es-MX"])
def test_custom_metric_label_is_its_own_name(locale: str | None) -> None:
    assert get_metric_label("Subscribed To Newsletter", locale) == "Subscribed To Newsletter"


def test_label_locale_is_negotiated() -> None:
    assert get_metric_label("Order Placed", "pt") == "Pedido Criado"
    assert get_metric_label("Order Placed", "es-AR") == "Pedido Creado"
    assert get_metric_label("Order Placed", "fr-FR, pt;q=0.5") == "Pedido Criado"
    assert get_metric_label("Order Placed", None) == "Order Placed"
    assert get_metric_label("Order Placed", "de") == "Order Placed"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("pt-BR", "pt-BR"),
        ("pt", "pt-BR"),
        ("pt_BR", "pt-BR"),
        ("pt-br", "pt-BR"),
        ("PT-BR", "pt-BR"),
        ("pt-PT", "pt-BR"),
        (" pt-BR ", "pt-BR"),
        ("es", "es"),
        ("es-MX", "es"),
        ("es_AR", "es"),
        ("ES", "es"),
        ("en", "en"),
        ("en-US", "en"),
        ("en_GB", "en"),
        (None, "en"),
        ("", "en"),
        ("   ", "en"),
        ("fr", "en"),
        ("zh-Hant-TW", "en"),
        ("portuguese", "en"),
        ("*", "en"),
    ],
)
def test_negotiate_locale_single_tag(value: str | None, expected: str) -> None:
    assert negotiate_locale(value) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("es-MX,es;q=0.9,en;q=0.8", "es"),
        ("fr-FR, pt;q=0.5", "pt-BR"),
        ("pt-BR,pt;q=0.9,en-US;q=0.8,en;q=0.7", "pt-BR"),
        ("en;q=0.5, es;q=0.8", "es"),
        ("de-DE, en;q=0.3, pt;q=0.3", "en"),  # tie: the earlier one wins
        ("es;q=0.7,pt;q=0.7", "es"),
        ("pt;q=0, es;q=0.1", "es"),  # q=0 means "not acceptable"
        ("pt;q=0", "en"),
        ("es;q=abc, pt;q=0.2", "pt-BR"),  # malformed weight is ignored
        ("es;q=2, pt;q=0.2", "pt-BR"),  # out-of-range weight is ignored
        ("es;q=nan, pt;q=0.2", "pt-BR"),
        ("fr-CH, fr;q=0.9, de;q=0.7, *;q=0.5", "en"),
        # "*" is any language the other items do not name (RFC 9110)
        ("en;q=0, *", "pt-BR"),
        ("*, en;q=0", "pt-BR"),
        ("en-US;q=0, *;q=0.5", "pt-BR"),
        ("en;q=0, pt;q=0, *", "es"),
        ("pt;q=0, *", "en"),
        ("es;q=0.9, *;q=0.1", "es"),
        ("*;q=0.5, es;q=0.1", "en"),
        ("*;q=0", "en"),
        ("en;q=0, pt;q=0, es;q=0, *", "en"),  # nothing acceptable: the default
        ("es-419; Q=0.9", "es"),
        (",,;", "en"),
    ],
)
def test_negotiate_locale_accept_language(header: str, expected: str) -> None:
    assert negotiate_locale(header) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("pt_BR", "pt-BR"), ("fr-CH, es;q=0.5", "es"), ("*", "en"), ("en;q=0, *", "pt-BR"),
     ("fr", None), ("", None), (None, None), ("pt;q=0", None), ("*;q=0", None)],
)  # fmt: skip
def test_match_locale_says_when_nothing_supported_is_accepted(
    value: str | None, expected: str | None
) -> None:
    assert match_locale(value) == expected
