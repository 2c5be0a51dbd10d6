"""Turning ledger values into JSON answers (dicts for orjson)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol, TypeVar
from uuid import UUID

import orjson
from starlette.responses import Response

from sinal.aggregates import Aggregate
from sinal.api.cursors import Listing, encode_feed_cursor
from sinal.catalog import get_metric_category, get_metric_label, match_locale, negotiate_locale
from sinal.events import decimal_text, stamp
from sinal.store.base import (
    Account,
    Contact,
    FeedPage,
    MetricInfo,
    Rejection,
    StoredEvent,
    SummaryRow,
)


def json_response(body: Any, status: int = 200) -> Response:
    """A JSON answer serialized by orjson (a UUID as its text, as `str` writes it)."""
    return Response(
        orjson.dumps(body, default=_uuid_text), status_code=status, media_type="application/json"
    )


def _uuid_text(value: object) -> str:
    """What orjson does not write itself: a UUID subclass (it writes a UUID at C speed)."""
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def opt_str(value: object | None) -> str | None:
    """str(value), keeping None."""
    return None if value is None else str(value)


def locale_of(locale: str | None, accept_language: str | None) -> str:
    """?locale= when it names a supported locale, else Accept-Language; the catalog's
    default when neither does (?locale=fr with Accept-Language: pt-BR is pt-BR)."""
    return match_locale(locale) or negotiate_locale(accept_language)


def event_view(event: StoredEvent, locale: str) -> dict[str, Any]:
    """A stored event as the API shows it."""
    return {
        "id": str(event.id),
        "contact_id": str(event.contact_id),
        "metric": event.metric_name,
        "label": get_metric_label(event.metric_name, locale),
        "properties": event.properties,
        "value": None if event.value is None else decimal_text(event.value),
        "currency": event.currency,
        "source": event.source,
        "source_id": event.source_id,
        "unique_event_id": event.unique_event_id,
        "entity_type": event.entity_type,
        "entity_id": event.entity_id,
        "integration_id": opt_str(event.integration_id),
        "automation_execution_id": opt_str(event.automation_execution_id),
        "occurred_at": stamp(event.occurred_at),
        "received_at": stamp(event.received_at),
    }


def contact_view(contact: Contact, tags: Sequence[str]) -> dict[str, Any]:
    """A contact as the API shows it."""
    return {
        "id": str(contact.id),
        "name": contact.name,
        "phone": contact.phone,
        "email": contact.email,
        "external_id": contact.external_id,
        "tags": list(tags),
        "created_at": stamp(contact.created_at),
        "updated_at": stamp(contact.updated_at),
    }


def summary_views(rows: Iterable[SummaryRow], locale: str) -> list[dict[str, Any]]:
    """A contact's summary rows, one item per metric (its rows, one per currency, are
    by contact, metric and currency, as `get_summary` gives them)."""
    return [
        _metric_view(list(same), locale)
        for _, same in itertools.groupby(rows, key=lambda r: (r.contact_id, r.metric_name))
    ]


def _metric_view(rows: list[SummaryRow], locale: str) -> dict[str, Any]:
    """A contact's totals for one metric: its count, first and last occurrence over its
    rows, a total per currency with a value, and the one total when there is one."""
    totals = [
        {"currency": r.currency, "total_value": decimal_text(r.total_value)}
        for r in rows
        if r.total_value is not None
    ]
    only = totals[0] if len(totals) == 1 else None  # no total, or several currencies'
    return {
        "metric": rows[0].metric_name,
        "label": get_metric_label(rows[0].metric_name, locale),
        "count": sum(r.event_count for r in rows),
        "total_value": None if only is None else only["total_value"],
        "currency": None if only is None else only["currency"],
        "totals": totals,
        "first_event_at": stamp(min(r.first_event_at for r in rows)),
        "last_event_at": stamp(max(r.last_event_at for r in rows)),
    }


def metric_view(metric: MetricInfo, locale: str) -> dict[str, Any]:
    """One of the account's metrics."""
    return {
        "name": metric.name,
        "label": get_metric_label(metric.name, locale),
        "category": str(metric.category or get_metric_category(metric.name)),
        "is_system": metric.is_system,
        "count": metric.event_count,
    }


def aggregate_view(
    metric: str, measurement: str, interval: str, by: str | None, result: Aggregate
) -> dict[str, Any]:
    """An aggregate's answer; sums as exact decimal text; `group` on each row with `by`."""
    data = []
    for row in result.rows:
        value = decimal_text(row.value) if isinstance(row.value, Decimal) else row.value
        item: dict[str, Any] = {"bucket": zone_stamp(row.bucket), "value": value}
        if by is not None:
            item["group"] = row.group
        data.append(item)
    return {
        "metric": metric,
        "measurement": measurement,
        "interval": interval,
        "timezone": result.timezone,
        "currency": result.currency,
        "data": data,
        "groups_truncated": result.groups_truncated,
    }


def zone_stamp(when: datetime) -> str:
    """A bucket's start with its zone's offset (its calendar is what was asked for), which
    `stamp`'s "Z" spells when that offset is UTC's: "2026-11-01T00:00:00-03:00"."""
    text = when.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# The ledger's field names -> the API's: as POST /v1/events takes them and GET /v1/events
# shows them.
API_NAMES = {"metric_name": "metric"}
# A kept input's fields the API never shows: its account is the API key's (an event
# shows none either).
_UNSHOWN = frozenset({"account_id"})


def rejection_view(rejection: Rejection) -> dict[str, Any]:
    """A kept rejection; its input (`payload`) under the API's field names, whatever sent
    it (an HTTP request, a webhook, the Python API, an automation step): the ledger keeps
    it under its own, which a replay reads."""
    payload = {API_NAMES.get(k, k): v for k, v in rejection.payload.items() if k not in _UNSHOWN}
    return {
        "id": str(rejection.id),
        "reason": rejection.reason,
        "message": rejection.message,
        "payload": payload,
        "created_at": stamp(rejection.created_at),
        "replayed_event_id": opt_str(rejection.replayed_event_id),
    }


def account_view(account: Account) -> dict[str, Any]:
    """The key's account."""
    return {
        "id": str(account.id),
        "name": account.name,
        "timezone": account.timezone,
        "created_at": stamp(account.created_at),
    }


def feed_view(page: FeedPage, account_id: UUID, locale: str) -> dict[str, Any]:
    """A page of the account's change feed: its events and the cursor to read on from
    (never null)."""
    return {
        "data": [event_view(e, locale) for e in page.events],
        "next_cursor": encode_feed_cursor(page.next, account_id),
        "has_more": page.has_more,
    }


class _Identified(Protocol):
    @property
    def id(self) -> UUID: ...


_T = TypeVar("_T", bound=_Identified)
_Row = TypeVar("_Row")


def id_page(
    rows: Sequence[_T], limit: int, view: Callable[[_T], Any], listing: Listing
) -> dict[str, Any]:
    """A page of `listing`'s list read by id (newest first, or oldest first), `limit + 1`
    rows asked for: its first `limit` rows as `view` shows them, and the cursor to the
    rest, its last row's id (null when none is left; `decode_id_cursor` reads it back)."""
    return keyset_page(rows, limit, view, lambda last: listing.encode(str(last.id)))


def keyset_page(
    rows: Sequence[_Row], limit: int, view: Callable[[_Row], Any], cursor: Callable[[_Row], str]
) -> dict[str, Any]:
    """A page of a list read by keyset, `limit + 1` rows asked for: its first `limit` rows
    as `view` shows them, and `cursor(its last row)` to the rest (null when none is left)."""
    page = rows[:limit]
    return {
        "data": [view(r) for r in page],
        "next_cursor": cursor(page[-1]) if len(rows) > limit else None,
    }


def parse_path_id(raw: str) -> UUID | None:
    """A UUID from a path segment, or None (the route answers 404, as for an unknown id)."""
    try:
        return UUID(raw)
    except ValueError:
        return None
