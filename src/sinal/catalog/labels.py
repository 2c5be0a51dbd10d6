"""Display labels for metrics in pt-BR, en and es (the seed's ``metric-labels.ts``).

The English label is the metric name itself. A custom metric (not in the catalog) is
shown under its own name in every locale. Locale values are negotiated leniently: a
bare tag (``pt``, ``pt_BR``, ``es-MX``) or a whole HTTP ``Accept-Language`` header, whose
``*`` stands for the languages its other items do not name (``en;q=0, *`` is pt-BR).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Final, Literal

from sinal.catalog.metrics import (
    METRIC_AI_RESPONSE_SENT,
    METRIC_CAMPAIGN_SENT,
    METRIC_CHECKOUT_ABANDONED,
    METRIC_CHECKOUT_RECOVERED,
    METRIC_CHECKOUT_STARTED,
    METRIC_CONTACT_CREATED,
    METRIC_CONTACT_UPDATED,
    METRIC_CONVERSATION_ASSIGNED,
    METRIC_CONVERSATION_CLOSED,
    METRIC_CONVERSATION_OPENED,
    METRIC_CUSTOMER_CREATED,
    METRIC_LINK_CLICKED,
    METRIC_MESSAGE_DELIVERED,
    METRIC_MESSAGE_FAILED,
    METRIC_MESSAGE_READ,
    METRIC_MESSAGE_RECEIVED,
    METRIC_MESSAGE_SENT,
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
    METRIC_TAG_ADDED,
    METRIC_TAG_REMOVED,
    METRIC_TEMPLATE_DELIVERED,
    METRIC_TEMPLATE_READ,
    METRIC_TEMPLATE_SENT,
    SYSTEM_METRICS,
)

__all__ = [
    "DEFAULT_LOCALE",
    "LOCALES",
    "METRIC_LABELS",
    "Locale",
    "get_metric_label",
    "match_locale",
    "negotiate_locale",
]

Locale = Literal["pt-BR", "en", "es"]
"""A locale sinal has labels for."""

LOCALES: Final[tuple[Locale, ...]] = ("pt-BR", "en", "es")
"""The supported locales."""

DEFAULT_LOCALE: Final[Locale] = "en"
"""The locale used when none of the requested ones is supported."""

# metric name -> (pt-BR, es). Conventions kept across the table:
# pt-BR says "checkout" and "template" (as Brazilian e-commerce and WhatsApp CRMs do),
# "Envio ..." for shipments; es says "Plantilla", "Envío ...", "Etiqueta".
_TRANSLATIONS: Final[dict[str, tuple[str, str]]] = {
    METRIC_ORDER_PLACED: ("Pedido Criado", "Pedido Creado"),
    METRIC_ORDER_PAID: ("Pedido Pago", "Pedido Pagado"),
    METRIC_ORDER_CANCELLED: ("Pedido Cancelado", "Pedido Cancelado"),
    METRIC_ORDER_FULFILLED: ("Pedido Processado", "Pedido Preparado"),
    METRIC_ORDER_REFUNDED: ("Pedido Reembolsado", "Pedido Reembolsado"),
    METRIC_CHECKOUT_STARTED: ("Checkout Iniciado", "Checkout Iniciado"),
    METRIC_CHECKOUT_ABANDONED: ("Checkout Abandonado", "Checkout Abandonado"),
    METRIC_CHECKOUT_RECOVERED: ("Checkout Recuperado", "Checkout Recuperado"),
    METRIC_CUSTOMER_CREATED: ("Cliente Criado", "Cliente Creado"),
    METRIC_MESSAGE_RECEIVED: ("Mensagem Recebida", "Mensaje Recibido"),
    METRIC_MESSAGE_SENT: ("Mensagem Enviada", "Mensaje Enviado"),
    METRIC_MESSAGE_DELIVERED: ("Mensagem Entregue", "Mensaje Entregado"),
    METRIC_MESSAGE_READ: ("Mensagem Lida", "Mensaje Leído"),
    METRIC_MESSAGE_FAILED: ("Falha no Envio da Mensagem", "Error en el Envío del Mensaje"),
    METRIC_TEMPLATE_SENT: ("Template Enviado", "Plantilla Enviada"),
    METRIC_TEMPLATE_DELIVERED: ("Template Entregue", "Plantilla Entregada"),
    METRIC_TEMPLATE_READ: ("Template Lido", "Plantilla Leída"),
    METRIC_CAMPAIGN_SENT: ("Campanha Enviada", "Campaña Enviada"),
    METRIC_AI_RESPONSE_SENT: ("Resposta de IA Enviada", "Respuesta de IA Enviada"),
    METRIC_SHIPMENT_CREATED: ("Envio Criado", "Envío Creado"),
    METRIC_SHIPMENT_IN_TRANSIT: ("Envio em Trânsito", "Envío en Tránsito"),
    METRIC_SHIPMENT_OUT_FOR_DELIVERY: ("Saiu para Entrega", "En Reparto"),
    METRIC_SHIPMENT_DELIVERED: ("Envio Entregue", "Envío Entregado"),
    METRIC_SHIPMENT_EXCEPTION: ("Problema no Envio", "Incidencia en el Envío"),
    METRIC_LINK_CLICKED: ("Link Clicado", "Clic en Enlace"),
    METRIC_CONTACT_CREATED: ("Contato Criado", "Contacto Creado"),
    METRIC_CONTACT_UPDATED: ("Contato Atualizado", "Contacto Actualizado"),
    METRIC_TAG_ADDED: ("Tag Adicionada", "Etiqueta Agregada"),
    METRIC_TAG_REMOVED: ("Tag Removida", "Etiqueta Eliminada"),
    METRIC_CONVERSATION_OPENED: ("Conversa Aberta", "Conversación Abierta"),
    METRIC_CONVERSATION_CLOSED: ("Conversa Encerrada", "Conversación Cerrada"),
    METRIC_CONVERSATION_ASSIGNED: ("Conversa Atribuída", "Conversación Asignada"),
}

_LABELS_BY_TAG: Final[dict[str, Mapping[str, str]]] = {
    "pt-BR": MappingProxyType({name: _TRANSLATIONS[name][0] for name in SYSTEM_METRICS}),
    "en": MappingProxyType({name: name for name in SYSTEM_METRICS}),
    "es": MappingProxyType({name: _TRANSLATIONS[name][1] for name in SYSTEM_METRICS}),
}

METRIC_LABELS: Final[Mapping[Locale, Mapping[str, str]]] = MappingProxyType(
    {locale: _LABELS_BY_TAG[locale] for locale in LOCALES}
)
"""Read-only labels of every system metric, per locale."""

# Primary language subtag -> supported locale; any Portuguese reads pt-BR.
_LANGUAGES: Final[dict[str, Locale]] = {"pt": "pt-BR", "en": "en", "es": "es"}


def _match_tag(tag: str) -> Locale | None:
    """Map one language tag (``pt_BR``, ``es-MX``) to a supported locale."""
    primary = tag.strip().replace("_", "-").lower().partition("-")[0]
    return _LANGUAGES.get(primary)


def _parse_quality(params: list[str]) -> float:
    """Read the ``q`` weight of one Accept-Language item; malformed weights count as 0."""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                quality = float(value)
            except ValueError:
                return 0.0
            # NaN and out-of-range weights fail this test and are ignored.
            return quality if 0.0 <= quality <= 1.0 else 0.0
    return 1.0


@lru_cache(maxsize=512)
def _negotiate(value: str | None) -> Locale | None:
    """The best supported locale a tag or an Accept-Language value accepts, if any."""
    # Ranked by (weight, -position): the higher weight wins, and on equal ones the earlier.
    ranks: dict[Locale, tuple[float, int]] = {}
    anything: tuple[float, int] | None = None
    for position, item in enumerate((value or "").split(",")):
        tag, *params = item.split(";")
        rank = (_parse_quality(params), -position)
        if tag.strip() == "*":
            anything = rank if anything is None else max(anything, rank)
        elif (locale := _match_tag(tag)) is not None:
            ranks[locale] = max(ranks.get(locale, rank), rank)
    if anything is not None:
        # "*" is every language no other item names (RFC 9110): "en;q=0, *" refuses en.
        for locale in (DEFAULT_LOCALE, *LOCALES):
            ranks.setdefault(locale, anything)
    best = max(ranks, key=ranks.__getitem__, default=None)
    return best if best is not None and ranks[best][0] > 0 else None


def match_locale(value: str | None) -> Locale | None:
    """The supported locale that best matches a tag or Accept-Language value, or None
    when it accepts none of them (``fr``, ``pt;q=0``)."""
    return _negotiate(value)


def negotiate_locale(value: str | None) -> Locale:
    """Return the supported locale that best matches a tag or Accept-Language value."""
    return _negotiate(value) or DEFAULT_LOCALE


def get_metric_label(name: str, locale: str | None = DEFAULT_LOCALE) -> str:
    """Return the display label of a metric; custom metrics keep their own name."""
    # Exact locales skip negotiation: this runs once per metric row in listings.
    labels = _LABELS_BY_TAG.get(locale) if locale else None
    if labels is None:
        labels = METRIC_LABELS[negotiate_locale(locale)]
    return labels.get(name, name)
