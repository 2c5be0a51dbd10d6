"""The account's metrics and their time-bucketed aggregates."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import Response

from sinal.aggregates import Interval, naive_time
from sinal.api.cursors import Listing, decode_name_cursor, encode_name_cursor
from sinal.api.errors import NotFound, problem_responses
from sinal.api.models import AggregateOut, MetricList
from sinal.api.service import service
from sinal.api.views import (
    aggregate_view,
    json_response,
    keyset_page,
    locale_of,
    metric_view,
)
from sinal.errors import InvalidQuery
from sinal.events import normalize_metric_name
from sinal.store.base import Measurement

router = APIRouter(tags=["metrics"])


@router.get(
    "/v1/metrics",
    summary="The account's metrics",
    response_model=MetricList,
    responses=problem_responses(401, 403, 422, 503),
)
async def list_metrics(
    request: Request,
    locale: Annotated[str | None, Query(description="pt-BR, en or es")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
    accept_language: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Name, label, category, whether it is a catalog (system) metric, and its events; by
    name (as code points order it). Keyset pagination, as every list."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    listing = Listing.of("metrics", key.account_id)
    after = decode_name_cursor(cursor, listing)
    metrics = await svc.run(
        lambda: svc.ledger.list_metrics(key.account_id, after=after, limit=limit + 1)
    )
    lang = locale_of(locale, accept_language)
    return json_response(
        keyset_page(metrics, limit, lambda m: metric_view(m, lang),
                    lambda last: encode_name_cursor(last.name, listing))
    )  # fmt: skip


@router.get(
    "/v1/metrics/{name:path}/aggregates",
    summary="A metric per time bucket (and per property value)",
    response_model=AggregateOut,
    responses=problem_responses(401, 403, 404, 422, 503),
)
async def aggregates(
    request: Request,
    name: str,
    *,
    since: Annotated[datetime, Query(description="ISO 8601 with an offset; inclusive")],
    until: Annotated[datetime, Query(description="ISO 8601 with an offset; exclusive")],
    measurement: Annotated[Measurement, Query()] = "count",
    interval: Annotated[Interval, Query()] = "day",
    timezone: Annotated[
        str | None, Query(description="IANA zone; default: the account's (America/Sao_Paulo)")
    ] = None,
    by: Annotated[
        str | None,
        Query(description="Group by this property's value: its key, as total or properties.total"),
    ] = None,
    currency: Annotated[
        str | None,
        Query(
            description="ISO 4217: only events in this currency count; sum_value needs it "
            "when the range's values are in more than one"
        ),
    ] = None,
) -> Response:
    """Buckets follow the zone's calendar (days of 23 or 25 hours across DST, weeks from
    Monday); every bucket of [since, until) is listed, empty ones with 0. `since` and
    `until` may be at most a year apart. Sums are exact decimal strings, in one currency
    (`currency`): values in several, with no `currency` asked, are 422 mixed_currencies."""
    svc = service(request)
    key = await svc.authorize(request, "read")
    for field, when in (("since", since), ("until", until)):
        if when.utcoffset() is None:
            raise InvalidQuery([naive_time(field)])
    result = await svc.run(
        lambda: svc.ledger.aggregate(
            key.account_id, name, measurement=measurement, interval=interval,
            since=since, until=until, timezone=timezone, by=by, currency=currency,
        )
    )  # fmt: skip
    if result is None:
        raise NotFound(f"the account has no metric {name!r}")
    return json_response(
        aggregate_view(normalize_metric_name(name), measurement, interval, by, result)
    )
