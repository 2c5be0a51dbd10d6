"""GET /v1/metrics and aggregates: timezone buckets, empty buckets, exact sums, groups."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sinal.errors import InvalidQuery
from tests.integration.conftest import Api

pytestmark = pytest.mark.anyio
AGG = "/v1/metrics/Order Paid/aggregates"


async def emit(api: Api, contact: str, when: str, value: str, n: str, **props: Any) -> None:
    response = await api.post("/v1/events", {
        "metric": "Order Paid", "contact_id": contact, "value": value, "source": "shopify",
        "source_id": n, "occurred_at": when, "properties": props,
    })  # fmt: skip
    assert response.status_code == 201, response.text


@pytest.fixture
async def ana(api: Api) -> str:
    return str(api.ledger.create_contact(api.account.id, email="ana@example.com").id)


async def test_a_purchase_at_01_utc_on_the_2nd_counts_on_the_1st_in_sao_paulo(
    api: Api, ana: str
) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "297.90", "1")
    params = {"since": "2026-11-01T00:00:00-03:00", "until": "2026-11-04T00:00:00-03:00"}

    local = (await api.client.get(AGG, params=params)).json()
    utc = (await api.client.get(AGG, params=params | {"timezone": "UTC"})).json()

    assert local["timezone"] == "America/Sao_Paulo"
    assert local["data"] == [
        {"bucket": "2026-11-01T00:00:00-03:00", "value": 1},
        {"bucket": "2026-11-02T00:00:00-03:00", "value": 0},
        {"bucket": "2026-11-03T00:00:00-03:00", "value": 0},
    ]
    assert [(b["bucket"][:10], b["value"]) for b in utc["data"]] == [
        ("2026-11-01", 0), ("2026-11-02", 1), ("2026-11-03", 0), ("2026-11-04", 0),
    ]  # fmt: skip


async def test_sum_is_exact_and_unique_contacts_counts_people(api: Api, ana: str) -> None:
    bia = str(api.ledger.create_contact(api.account.id, email="bia@example.com").id)
    for n, (who, value) in enumerate([(ana, "0.1"), (ana, "0.2"), (bia, "1234567890.1234")]):
        await emit(api, who, "2026-11-10T12:00:00Z", value, str(n))
    params = {"since": "2026-11-01T00:00:00Z", "until": "2026-12-01T00:00:00Z",
              "interval": "month"}  # fmt: skip

    total = (await api.client.get(AGG, params=params | {"measurement": "sum_value"})).json()
    people = await api.client.get(AGG, params=params | {"measurement": "unique_contacts"})

    # Month buckets in São Paulo: Oct 31 21:00 UTC falls in October.
    assert [(b["bucket"], b["value"]) for b in total["data"]] == [
        ("2026-10-01T00:00:00-03:00", "0.00"),
        ("2026-11-01T00:00:00-03:00", "1234567890.4234"),
    ]
    assert [b["value"] for b in people.json()["data"]] == [0, 2]


async def test_by_groups_every_bucket_per_property_value(api: Api, ana: str) -> None:
    await emit(api, ana, "2026-11-02T12:00:00Z", "1", "1", payment_method="pix")
    await emit(api, ana, "2026-11-02T13:00:00Z", "1", "2", payment_method="pix")
    await emit(api, ana, "2026-11-03T12:00:00Z", "1", "3", payment_method="boleto")
    await emit(api, ana, "2026-11-03T13:00:00Z", "1", "4")
    params = {"since": "2026-11-02T00:00:00-03:00", "until": "2026-11-04T00:00:00-03:00",
              "by": "payment_method"}  # fmt: skip

    rows = (await api.client.get(AGG, params=params)).json()["data"]

    assert [(r["bucket"][8:10], r["group"], r["value"]) for r in rows] == [
        ("02", "pix", 2), ("02", "boleto", 0), ("02", None, 0),
        ("03", "pix", 0), ("03", "boleto", 1), ("03", None, 1),
    ]  # fmt: skip


async def test_by_takes_a_property_as_automation_filters_name_it(api: Api, ana: str) -> None:
    # by=properties.payment_method, as a filter's field, was 422 "String should match
    # pattern '^[\\w\\-]{1,64}$'"
    await emit(api, ana, "2026-11-02T12:00:00Z", "1", "1", payment_method="pix")
    params = {"since": "2026-11-02T00:00:00Z", "until": "2026-11-03T00:00:00Z", "timezone": "UTC"}

    named = await api.client.get(AGG, params=params | {"by": "properties.payment_method"})
    nested = await api.client.get(AGG, params=params | {"by": "properties.items.sku"})

    assert named.status_code == 200, named.text
    assert [(r["group"], r["value"]) for r in named.json()["data"]] == [("pix", 1)]
    assert nested.status_code == 422, nested.text
    [error] = nested.json()["errors"]
    assert (error["field"], error["code"]) == ("by", "invalid_property")
    assert "as total or properties.total" in error["message"]
    assert "a nested path is not grouped by" in error["message"]


async def test_buckets_follow_dst_in_the_zone(api: Api, ana: str) -> None:
    # New York leaves DST at 2026-11-01 02:00 local: that day has 25 hours.
    await emit(api, ana, "2026-11-01T05:30:00Z", "1", "1")  # 01:30 EDT, the first 01:30
    await emit(api, ana, "2026-11-01T06:30:00Z", "1", "2")  # 01:30 EST, the second
    tz = {"timezone": "America/New_York"}

    days = (
        await api.client.get(
            AGG,
            params=tz
            | {"since": "2026-10-31T00:00:00-04:00", "until": "2026-11-03T00:00:00-05:00"},
        )
    ).json()
    hours = (await api.client.get(AGG, params=tz | {
        "interval": "hour", "since": "2026-11-01T05:00:00Z", "until": "2026-11-01T07:00:00Z",
    })).json()  # fmt: skip

    assert [(b["bucket"], b["value"]) for b in days["data"]] == [
        ("2026-10-31T00:00:00-04:00", 0),
        ("2026-11-01T00:00:00-04:00", 2),
        ("2026-11-02T00:00:00-05:00", 0),
    ]
    assert [(b["bucket"], b["value"]) for b in hours["data"]] == [
        ("2026-11-01T01:00:00-04:00", 1),
        ("2026-11-01T01:00:00-05:00", 1),
    ]


async def test_weeks_start_on_monday(api: Api, ana: str) -> None:
    await emit(api, ana, "2026-11-29T12:00:00Z", "1", "1")  # a Sunday
    params = {"interval": "week", "since": "2026-11-25T00:00:00Z",
              "until": "2026-12-01T00:00:00Z"}  # fmt: skip
    rows = (await api.client.get(AGG, params=params)).json()["data"]
    assert [(r["bucket"], r["value"]) for r in rows] == [
        ("2026-11-23T00:00:00-03:00", 1),
        ("2026-11-30T00:00:00-03:00", 0),
    ]


async def test_the_accounts_timezone_is_the_default(api: Api, ana: str) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    patched = await api.client.patch("/v1/account", json={"timezone": "Europe/Lisbon"})
    params = {"since": "2026-11-01T00:00:00Z", "until": "2026-11-03T00:00:00Z"}

    rows = (await api.client.get(AGG, params=params)).json()

    assert patched.json()["timezone"] == "Europe/Lisbon"
    assert rows["timezone"] == "Europe/Lisbon"
    assert [(r["bucket"], r["value"]) for r in rows["data"]] == [
        ("2026-11-01T00:00:00Z", 0),
        ("2026-11-02T00:00:00Z", 1),
    ]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"until": "2026-11-02T00:00:00Z"}, {("since", "missing")}),
        ({"since": "2026-11-01T00:00:00Z", "until": "2027-11-03T00:00:00Z"},
         {("until", "range_too_long")}),
        ({"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"},
         {("until", "before_since")}),
        ({"since": "2026-11-01T00:00:00", "until": "2026-11-02T00:00:00Z"},
         {("since", "naive_datetime")}),
        ({"since": "2026-11-01T00:00:00Z", "until": "2026-11-02T00:00:00Z",
          "timezone": "Mars/Olympus"}, {("timezone", "invalid_timezone")}),
        ({"since": "2026-11-01T00:00:00Z", "until": "2026-11-02T00:00:00Z",
          "interval": "fortnight"}, {("interval", "literal_error")}),
        ({"since": "2026-11-01T00:00:00Z", "until": "2026-11-02T00:00:00Z",
          "measurement": "avg"}, {("measurement", "literal_error")}),
        ({"since": "2026-11-01T00:00:00Z", "until": "2026-11-02T00:00:00Z",
          "by": "a b"}, {("by", "invalid_property")}),
    ],
)  # fmt: skip
async def test_bad_aggregate_parameters_are_422(
    api: Api, ana: str, params: dict[str, str], expected: set[tuple[str, str]]
) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    response = await api.client.get(AGG, params=params)
    assert response.status_code == 422, response.text
    assert {(e["field"], e["code"]) for e in response.json()["errors"]} == expected


@pytest.mark.parametrize("path", [AGG, "/v1/events"])
async def test_a_time_whose_plus_arrived_as_a_space_says_to_send_it_as_2b(
    api: Api, ana: str, path: str
) -> None:
    """`since=…T00:00:00+03:00` typed in a URL arrives as "…T00:00:00 03:00" (a '+' in a
    query is a space): the answer said only "unexpected extra characters at the end of the
    input", of a time that looks right in the request."""
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    until = "until=2026-11-03T00:00:00-03:00"

    typed = await api.client.get(f"{path}?since=2026-11-01T00:00:00+03:00&{until}")
    fixed = await api.client.get(f"{path}?since=2026-11-01T00:00:00%2B03:00&{until}")

    assert typed.status_code == 422, typed.text
    [error] = typed.json()["errors"]
    assert error["field"] == "since"
    assert error["message"].endswith(
        "; a '+' in a URL's query reads as a space: send +03:00 as %2B03:00, "
        "or the time in UTC with Z"
    )
    assert fixed.status_code == 200, fixed.text


@pytest.mark.parametrize("path", [AGG, "/v1/events"])
async def test_a_date_without_a_time_says_how_to_write_one(api: Api, path: str) -> None:
    # since=2026-11-01 said only "since must carry a timezone offset or Z"
    answer = await api.client.get(f"{path}?since=2026-11-01&until=2026-11-03T00:00:00Z")

    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert (error["field"], error["code"]) == ("since", "naive_datetime")
    assert error["message"].endswith("as 2026-12-01T00:00:00Z or 2026-12-01T00:00:00-03:00")


async def test_metrics_list_and_another_accounts_metric_is_404(api: Api, ana: str) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    await api.post("/v1/events", {"metric": "Quiz Answered", "contact_id": ana})
    other = api.ledger.create_account("Outra Loja")
    their_key = await api.key_for("read", account=other)
    params = {"since": "2026-11-01T00:00:00Z", "until": "2026-11-03T00:00:00Z"}

    metrics = await api.client.get("/v1/metrics", params={"locale": "es"})
    theirs = await api.client.get(AGG, params=params, headers=api.auth(their_key))
    unknown = await api.client.get("/v1/metrics/Nope/aggregates", params=params)

    assert metrics.json()["data"] == [
        {"name": "Order Paid", "label": "Pedido Pagado", "category": "ecommerce",
         "is_system": True, "count": 1},
        {"name": "Quiz Answered", "label": "Quiz Answered", "category": "custom",
         "is_system": False, "count": 1},
    ]  # fmt: skip
    assert (theirs.status_code, unknown.status_code) == (404, 404)


async def test_metrics_page_by_name_with_limit_and_cursor(api: Api, ana: str) -> None:
    """An account with many custom metrics got every one in one answer: the list pages as
    every list does, by name (code point order, alike on both backends), and a name
    holding the "|" between a cursor's parts pages on as any other."""
    names = ["Quiz Answered", "A|B", "Avaliação Enviada", "zeta", "Order Paid", "A|A"]
    for n, name in enumerate(names):
        sent = await api.post(
            "/v1/events", {"metric": name, "contact_id": ana, "source_id": str(n)}
        )
        assert sent.status_code == 201, sent.text

    pages, cursor = [], None
    while True:
        params = {"limit": 2, **({} if cursor is None else {"cursor": cursor})}
        page = await api.client.get("/v1/metrics", params=params)
        assert page.status_code == 200, page.text
        pages.append([m["name"] for m in page.json()["data"]])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    whole = (await api.client.get("/v1/metrics")).json()

    # code point order: "v" < "|"; the first page's cursor is "A|A"'s
    assert pages == [["Avaliação Enviada", "A|A"], ["A|B", "Order Paid"], ["Quiz Answered", "zeta"]]
    assert ([m["name"] for m in whole["data"]], whole["next_cursor"]) == (sorted(names), None)
    assert {m["count"] for m in whole["data"]} == {1}


@pytest.mark.parametrize(
    ("limit", "code"),
    [("0", "greater_than_equal"), ("1001", "less_than_equal"), ("many", "int_parsing")],
)
async def test_metrics_limit_out_of_range_is_422_as_every_lists(
    api: Api, limit: str, code: str
) -> None:
    answer = await api.client.get("/v1/metrics", params={"limit": limit})

    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert (error["field"], error["code"]) == ("limit", code)  # not unknown_parameter


@pytest.mark.parametrize(
    ("params", "fields"),
    [
        ({"since": "9999-12-31T00:00:00-10:00", "until": "9999-12-31T23:00:00-10:00"},
         {"since", "until"}),
        ({"since": "9999-12-01T00:00:00Z", "until": "9999-12-30T00:00:00Z",
          "interval": "month"}, {"since", "until"}),
        ({"since": "9998-12-31T00:00:00Z", "until": "9999-01-01T00:00:01Z",
          "interval": "hour"}, {"until"}),
        ({"since": "0001-01-01T00:00:00+01:00", "until": "0001-01-02T00:00:00+01:00"},
         {"since", "until"}),
        ({"since": "0001-12-31T23:59:59Z", "until": "0002-01-05T00:00:00Z",
          "interval": "week"}, {"since"}),
    ],
)  # fmt: skip
@pytest.mark.parametrize("timezone", ["Pacific/Kiritimati", "Pacific/Pago_Pago", "UTC"])
async def test_aggregates_at_the_edges_of_the_datetime_range_are_422(
    api: Api, ana: str, params: dict[str, str], fields: set[str], timezone: str
) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    response = await api.client.get(AGG, params=params | {"timezone": timezone})
    assert response.status_code == 422, response.text
    assert {(e["field"], e["code"]) for e in response.json()["errors"]} == {
        (f, "out_of_range") for f in fields
    }


@pytest.mark.parametrize("interval", ["hour", "day", "week", "month"])
@pytest.mark.parametrize("timezone", ["Pacific/Kiritimati", "Pacific/Pago_Pago"])
async def test_aggregates_at_the_ends_of_the_accepted_range_answer(
    api: Api, ana: str, interval: str, timezone: str
) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    early = {"since": "0002-01-01T00:00:00Z", "until": "0002-01-02T00:00:00Z"}
    late = {"since": "9998-12-31T00:00:00Z", "until": "9999-01-01T00:00:00Z"}
    for params in (early, late):
        extra = {"interval": interval, "timezone": timezone}
        response = await api.client.get(AGG, params=params | extra)
        assert response.status_code == 200, response.text
        assert {r["value"] for r in response.json()["data"]} == {0}


async def test_aggregates_of_a_name_with_a_nul_are_404(api: Api, ana: str) -> None:
    await emit(api, ana, "2026-11-02T01:00:00Z", "1", "1")
    params = {"since": "2026-11-01T00:00:00Z", "until": "2026-11-03T00:00:00Z"}
    response = await api.client.get("/v1/metrics/Order%00Paid/aggregates", params=params)
    assert response.status_code == 404, response.text


async def test_a_metric_with_a_slash_in_its_name_has_aggregates(api: Api, ana: str) -> None:
    await api.post("/v1/events", {"metric": "Pedido/Entregue", "contact_id": ana,
                                  "occurred_at": "2026-11-02T12:00:00Z"})  # fmt: skip
    params = {"since": "2026-11-02T00:00:00Z", "until": "2026-11-03T00:00:00Z",
              "timezone": "UTC"}  # fmt: skip

    encoded = await api.client.get("/v1/metrics/Pedido%2FEntregue/aggregates", params=params)
    plain = await api.client.get("/v1/metrics/Pedido/Entregue/aggregates", params=params)
    unknown = await api.client.get("/v1/metrics/Pedido%2FNada/aggregates", params=params)

    assert encoded.status_code == 200, encoded.text
    assert encoded.json()["metric"] == "Pedido/Entregue"
    assert [r["value"] for r in encoded.json()["data"]] == [1]
    assert plain.json() == encoded.json()
    assert unknown.status_code == 404
    assert unknown.json()["detail"] == "the account has no metric 'Pedido/Nada'"


async def test_by_labels_groups_alike_on_both_backends(api: Api, ana: str) -> None:
    values = ['1e20', '1.0E+20', '1.5e-7', '1', '1.0', '"1"', '2.50', '-0.0',
              'true', '"vip"', 'null', '{"bb": [1, 2.50, 1e2], "a": 1, "c": true}',
              '[1, "x", {"y": "a\\nb"}]', '{}']  # fmt: skip
    for n, value in enumerate(values):
        body = (f'{{"metric": "Order Paid", "contact_id": "{ana}", "source": "shopify", '
                f'"source_id": "{n}", "occurred_at": "2026-11-02T12:00:00Z", '
                f'"properties": {{"k": {value}}}}}')  # fmt: skip
        response = await api.raw("/v1/events", body)
        assert response.status_code == 201, response.text
    params = {"since": "2026-11-02T00:00:00Z", "until": "2026-11-03T00:00:00Z",
              "timezone": "UTC", "by": "k"}  # fmt: skip

    counts = (await api.client.get(AGG, params=params)).json()["data"]
    people = await api.client.get(AGG, params=params | {"measurement": "unique_contacts"})

    # Numbers by their value in plain notation (1 and 1.0 alike), strings unquoted, the
    # number 1 and the string "1" one group; objects and arrays as PostgreSQL prints jsonb.
    assert {r["group"]: r["value"] for r in counts} == {
        "100000000000000000000": 2, "0.00000015": 1, "1": 3, "2.5": 1, "0": 1,
        "true": 1, "vip": 1, None: 1, '{"a": 1, "c": true, "bb": [1, 2.5, 100.0]}': 1,
        '[1, "x", {"y": "a\\nb"}]': 1, "{}": 1,
    }  # fmt: skip
    assert {r["group"]: r["value"] for r in people.json()["data"]}["1"] == 1


@pytest.mark.parametrize("by", ['a"b', "a.b", "", "x" * 65, "a b"])
async def test_by_a_key_no_store_can_address_is_invalid_from_the_library_too(
    api: Api, ana: str, by: str
) -> None:
    await emit(api, ana, "2026-11-02T12:00:00Z", "10", "1", g="x")
    with pytest.raises(InvalidQuery) as raised:
        api.ledger.aggregate(
            api.account.id, "Order Paid", measurement="count", interval="day",
            since=datetime(2026, 11, 1, tzinfo=UTC), until=datetime(2026, 11, 3, tzinfo=UTC),
            by=by,
        )  # fmt: skip
    assert [(e.field, e.code) for e in raised.value.errors] == [("by", "invalid_property")]


async def test_sum_value_never_adds_two_currencies(api: Api, ana: str) -> None:
    """100 BRL and 50 USD in a range: a sum asked in no currency is 422 naming both, not
    150; asked in one, only its values count, and the answer says which."""
    for n, (currency, value) in enumerate([("BRL", "100"), ("USD", "50"), ("BRL", "0.5")]):
        response = await api.post("/v1/events", {
            "metric": "Order Paid", "contact_id": ana, "value": value, "currency": currency,
            "source": "shopify", "source_id": str(n), "occurred_at": "2026-11-10T12:00:00Z",
        })  # fmt: skip
        assert response.status_code == 201, response.text
    params = {"since": "2026-11-01T00:00:00Z", "until": "2026-12-01T00:00:00Z",
              "interval": "month", "timezone": "UTC", "measurement": "sum_value"}  # fmt: skip

    mixed = await api.client.get(AGG, params=params)
    brl = (await api.client.get(AGG, params=params | {"currency": "brl"})).json()
    usd = (await api.client.get(AGG, params=params | {"currency": "USD"})).json()
    count = (await api.client.get(AGG, params=params | {"measurement": "count"})).json()
    bad = await api.client.get(AGG, params=params | {"currency": "R$"})

    assert mixed.status_code == 422, mixed.text
    [error] = mixed.json()["errors"]
    assert (error["field"], error["code"]) == ("currency", "mixed_currencies")
    assert "BRL, USD" in error["message"]
    assert (brl["currency"], [b["value"] for b in brl["data"]]) == ("BRL", ["100.50"])
    assert (usd["currency"], [b["value"] for b in usd["data"]]) == ("USD", ["50.00"])
    assert (count["currency"], [b["value"] for b in count["data"]]) == (None, [3])
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["code"] == "invalid_currency"


async def test_sum_value_in_one_currency_says_it(api: Api, ana: str) -> None:
    """Values all in USD: the sum needs no currency asked, and names USD; a metric whose
    events carry no value sums to 0 in no currency."""
    await api.post(
        "/v1/events",
        {
            "metric": "Order Paid",
            "contact_id": ana,
            "value": "7",
            "currency": "USD",
            "occurred_at": "2026-11-10T12:00:00Z",
        },
    )
    await api.post("/v1/events", {"metric": "Message Read", "contact_id": ana,
                                  "occurred_at": "2026-11-10T12:00:00Z"})  # fmt: skip
    params = {"since": "2026-11-01T00:00:00Z", "until": "2026-12-01T00:00:00Z",
              "interval": "month", "timezone": "UTC", "measurement": "sum_value"}  # fmt: skip

    paid = (await api.client.get(AGG, params=params)).json()
    read = (await api.client.get("/v1/metrics/Message Read/aggregates", params=params)).json()

    assert (paid["currency"], [b["value"] for b in paid["data"]]) == ("USD", ["7.00"])
    assert (read["currency"], [b["value"] for b in read["data"]]) == (None, ["0.00"])
