"""System metrics and their categories (the seed's ``constants.ts``).

The seed says "33 métricas" but its tables list 32; sinal implements the 32 listed.
Any metric name outside the catalog is a custom metric.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "METRIC_AI_RESPONSE_SENT",
    "METRIC_CAMPAIGN_SENT",
    "METRIC_CATEGORY_MAP",
    "METRIC_CHECKOUT_ABANDONED",
    "METRIC_CHECKOUT_RECOVERED",
    "METRIC_CHECKOUT_STARTED",
    "METRIC_CONTACT_CREATED",
    "METRIC_CONTACT_UPDATED",
    "METRIC_CONVERSATION_ASSIGNED",
    "METRIC_CONVERSATION_CLOSED",
    "METRIC_CONVERSATION_OPENED",
    "METRIC_CUSTOMER_CREATED",
    "METRIC_LINK_CLICKED",
    "METRIC_MESSAGE_DELIVERED",
    "METRIC_MESSAGE_FAILED",
    "METRIC_MESSAGE_READ",
    "METRIC_MESSAGE_RECEIVED",
    "METRIC_MESSAGE_SENT",
    "METRIC_ORDER_CANCELLED",
    "METRIC_ORDER_FULFILLED",
    "METRIC_ORDER_PAID",
    "METRIC_ORDER_PLACED",
    "METRIC_ORDER_REFUNDED",
    "METRIC_SHIPMENT_CREATED",
    "METRIC_SHIPMENT_DELIVERED",
    "METRIC_SHIPMENT_EXCEPTION",
    "METRIC_SHIPMENT_IN_TRANSIT",
    "METRIC_SHIPMENT_OUT_FOR_DELIVERY",
    "METRIC_TAG_ADDED",
    "METRIC_TAG_REMOVED",
    "METRIC_TEMPLATE_DELIVERED",
    "METRIC_TEMPLATE_READ",
    "METRIC_TEMPLATE_SENT",
    "SYSTEM_METRICS",
    "Category",
    "get_metric_category",
    "is_system_metric",
    "misspelt_system_metric",
]


class Category(StrEnum):
    """The category a metric belongs to; ``custom`` is the fallback."""

    ECOMMERCE = "ecommerce"
    MESSAGING = "messaging"
    TRACKING = "tracking"
    ENGAGEMENT = "engagement"
    CONTACT = "contact"
    CUSTOM = "custom"


# E-commerce
METRIC_ORDER_PLACED: Final = "Order Placed"
METRIC_ORDER_PAID: Final = "Order Paid"
METRIC_ORDER_CANCELLED: Final = "Order Cancelled"
METRIC_ORDER_FULFILLED: Final = "Order Fulfilled"
METRIC_ORDER_REFUNDED: Final = "Order Refunded"
METRIC_CHECKOUT_STARTED: Final = "Checkout Started"
METRIC_CHECKOUT_ABANDONED: Final = "Checkout Abandoned"
METRIC_CHECKOUT_RECOVERED: Final = "Checkout Recovered"
METRIC_CUSTOMER_CREATED: Final = "Customer Created"

# Messaging
METRIC_MESSAGE_RECEIVED: Final = "Message Received"
METRIC_MESSAGE_SENT: Final = "Message Sent"
METRIC_MESSAGE_DELIVERED: Final = "Message Delivered"
METRIC_MESSAGE_READ: Final = "Message Read"
METRIC_MESSAGE_FAILED: Final = "Message Failed"
METRIC_TEMPLATE_SENT: Final = "Template Sent"
METRIC_TEMPLATE_DELIVERED: Final = "Template Delivered"
METRIC_TEMPLATE_READ: Final = "Template Read"
METRIC_CAMPAIGN_SENT: Final = "Campaign Sent"
METRIC_AI_RESPONSE_SENT: Final = "AI Response Sent"

# Tracking
METRIC_SHIPMENT_CREATED: Final = "Shipment Created"
METRIC_SHIPMENT_IN_TRANSIT: Final = "Shipment In Transit"
METRIC_SHIPMENT_OUT_FOR_DELIVERY: Final = "Shipment Out For Delivery"
METRIC_SHIPMENT_DELIVERED: Final = "Shipment Delivered"
METRIC_SHIPMENT_EXCEPTION: Final = "Shipment Exception"

# Engagement
METRIC_LINK_CLICKED: Final = "Link Clicked"

# Contact
METRIC_CONTACT_CREATED: Final = "Contact Created"
METRIC_CONTACT_UPDATED: Final = "Contact Updated"
METRIC_TAG_ADDED: Final = "Tag Added"
METRIC_TAG_REMOVED: Final = "Tag Removed"
METRIC_CONVERSATION_OPENED: Final = "Conversation Opened"
METRIC_CONVERSATION_CLOSED: Final = "Conversation Closed"
METRIC_CONVERSATION_ASSIGNED: Final = "Conversation Assigned"

_BY_CATEGORY: Final[dict[Category, tuple[str, ...]]] = {
    Category.ECOMMERCE: (
        METRIC_ORDER_PLACED,
        METRIC_ORDER_PAID,
        METRIC_ORDER_CANCELLED,
        METRIC_ORDER_FULFILLED,
        METRIC_ORDER_REFUNDED,
        METRIC_CHECKOUT_STARTED,
        METRIC_CHECKOUT_ABANDONED,
        METRIC_CHECKOUT_RECOVERED,
        METRIC_CUSTOMER_CREATED,
    ),
    Category.MESSAGING: (
        METRIC_MESSAGE_RECEIVED,
        METRIC_MESSAGE_SENT,
        METRIC_MESSAGE_DELIVERED,
        METRIC_MESSAGE_READ,
        METRIC_MESSAGE_FAILED,
        METRIC_TEMPLATE_SENT,
        METRIC_TEMPLATE_DELIVERED,
        METRIC_TEMPLATE_READ,
        METRIC_CAMPAIGN_SENT,
        METRIC_AI_RESPONSE_SENT,
    ),
    Category.TRACKING: (
        METRIC_SHIPMENT_CREATED,
        METRIC_SHIPMENT_IN_TRANSIT,
        METRIC_SHIPMENT_OUT_FOR_DELIVERY,
        METRIC_SHIPMENT_DELIVERED,
        METRIC_SHIPMENT_EXCEPTION,
    ),
    Category.ENGAGEMENT: (METRIC_LINK_CLICKED,),
    Category.CONTACT: (
        METRIC_CONTACT_CREATED,
        METRIC_CONTACT_UPDATED,
        METRIC_TAG_ADDED,
        METRIC_TAG_REMOVED,
        METRIC_CONVERSATION_OPENED,
        METRIC_CONVERSATION_CLOSED,
        METRIC_CONVERSATION_ASSIGNED,
    ),
}

SYSTEM_METRICS: Final[tuple[str, ...]] = tuple(
    name for names in _BY_CATEGORY.values() for name in names
)
"""The 32 system metric names, in the seed's order."""

METRIC_CATEGORY_MAP: Final[Mapping[str, Category]] = MappingProxyType(
    {name: category for category, names in _BY_CATEGORY.items() for name in names}
)
"""Read-only map from each system metric name to its category."""


def get_metric_category(name: str) -> Category:
    """Return the category of a metric; names outside the catalog are ``custom``."""
    return METRIC_CATEGORY_MAP.get(name, Category.CUSTOM)


def is_system_metric(name: str) -> bool:
    """Tell whether ``name`` is one of the 32 system metrics (exact, case-sensitive)."""
    return name in METRIC_CATEGORY_MAP


# A name that differs from a system metric's only in case, spaces, "_" or "-" ("order paid",
# "ORDER_PAID") is that metric mistyped: stored as a custom metric of its own, it would be
# counted apart and trigger none of the system metric's automations.
_SEPARATORS: Final = re.compile(r"[\s_-]+")
_SYSTEM_BY_SPELLING: Final[Mapping[str, str]] = MappingProxyType(
    {_SEPARATORS.sub(" ", name).casefold(): name for name in SYSTEM_METRICS}
)


def misspelt_system_metric(name: str) -> str | None:
    """The system metric ``name`` spells differently (``"order_paid"`` -> ``"Order Paid"``),
    or None when ``name`` is a system metric or like none."""
    if name in METRIC_CATEGORY_MAP:
        return None
    return _SYSTEM_BY_SPELLING.get(_SEPARATORS.sub(" ", name.strip()).casefold())


def misspelt_metric_message(name: str, system: str) -> str:
    """Why ``name``, spelt like the system metric ``system``, is refused."""
    return (
        f"{name!r} is the system metric {system!r} spelt otherwise: send {system!r} "
        "(metric names are case-sensitive; a custom metric needs a name unlike a system one's)"
    )
