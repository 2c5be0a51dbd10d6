"""Automation trigger types and the metrics they listen to (the seed's ``metric-mapping.ts``).

``webhook`` and ``schedule`` are not driven by events: they map to the sentinels
``"__webhook__"`` and ``"__schedule__"``, which no metric uses, so they have no inverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from sinal.catalog.metrics import (
    METRIC_CHECKOUT_ABANDONED,
    METRIC_CHECKOUT_STARTED,
    METRIC_CONTACT_CREATED,
    METRIC_MESSAGE_RECEIVED,
    METRIC_ORDER_PAID,
    METRIC_ORDER_PLACED,
    METRIC_SHIPMENT_IN_TRANSIT,
    METRIC_TAG_ADDED,
)

__all__ = [
    "METRIC_TO_TRIGGER",
    "TRIGGER_TO_METRIC",
    "TRIGGER_TYPES",
    "get_trigger_metric",
]

_EVENT_TRIGGERS: Final[dict[str, str]] = {
    "order_created": METRIC_ORDER_PLACED,
    "order_paid": METRIC_ORDER_PAID,
    "checkout_created": METRIC_CHECKOUT_STARTED,
    "cart_abandoned": METRIC_CHECKOUT_ABANDONED,
    "tracking_updated": METRIC_SHIPMENT_IN_TRANSIT,
    "message_received": METRIC_MESSAGE_RECEIVED,
    "new_contact": METRIC_CONTACT_CREATED,
    "tag_added": METRIC_TAG_ADDED,
}

TRIGGER_TO_METRIC: Final[Mapping[str, str]] = MappingProxyType(
    {**_EVENT_TRIGGERS, "webhook": "__webhook__", "schedule": "__schedule__"}
)
"""Read-only map from trigger type to metric name, exactly as the seed (10 entries)."""

METRIC_TO_TRIGGER: Final[Mapping[str, str]] = MappingProxyType(
    {metric: trigger for trigger, metric in _EVENT_TRIGGERS.items()}
)
"""Read-only inverse of ``TRIGGER_TO_METRIC`` without ``webhook``/``schedule`` (8 entries)."""

TRIGGER_TYPES: Final[tuple[str, ...]] = tuple(_EVENT_TRIGGERS)
"""The 8 trigger types that map to real metrics, in the seed's order."""


def get_trigger_metric(trigger_type: str) -> str | None:
    """Return the metric name a trigger type listens to, or ``None`` if it is unknown."""
    return TRIGGER_TO_METRIC.get(trigger_type)
