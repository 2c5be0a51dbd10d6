"""POST /v1/events, /v1/events/batch, GET /v1/events: what a caller sees, on both backends."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import unicodedata
import uuid
from typing import Any

import pytest

from sinal.api.routes import events as events_routes
from sinal.ledger import CHUNK
from tests.helpers import count, refuse_13, sql
from tests.integration.conftest import Api
from tests.integration.test_commerce_webhooks import run_automations

pytestmark = pytest.mark.anyio
PROBLEM = "application/problem+json"


def order(contact_id: object, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metric": "Order Paid",
        "contact_id": str(contact_id),
        "value": "297.90",
        "source": "shopify",
        "source_id": "1001",
        "entity_type": "order",
        "properties": {"order_id": "1001", "items": [{"sku": "A", "price": 19.9}]},
        "occurred_at": "2026-11-01T10:00:00-03:00",
    }
    body.update(overrides)
    if contact_id is None:
        del body["contact_id"]
    return body


@pytest.fixture
def contact_id(api: Api) -> uuid.UUID:
    return api.ledger.create_contact(api.account.id, phone="+55 11 98765-4321").id


def field_codes(response: Any) -> set[tuple[str, str]]:
    assert response.headers["content-type"] == PROBLEM, response.text
    return {(e["field"], e["code"]) for e in response.json()["errors"]}


async def test_event_is_created_then_read_back_with_its_label(
    api: Api, contact_id: uuid.UUID
) -> None:
    created = await api.post("/v1/events", order(contact_id))

    assert created.status_code == 201, created.text
    body = created.json()
    assert body["status"] == "created"
    assert body["unique_event_id"] == "shopify:order:1001"
    assert body["contact_id"] == str(contact_id)
    got = await api.client.get(f"/v1/events/{body['event_id']}", params={"locale": "pt-BR"})
    event = got.json()
    assert event["label"] == "Pedido Pago"
    assert event["value"] == "297.90"
    assert event["occurred_at"] == "2026-11-01T13:00:00Z"
    assert event["properties"]["items"][0]["price"] == 19.9  # a float stays a number


async def test_duplicate_answers_200_with_the_first_id_and_whether_it_differs(
    api: Api, contact_id: uuid.UUID
) -> None:
    first = (await api.post("/v1/events", order(contact_id))).json()
    same = await api.post("/v1/events", order(contact_id, value=297.9))
    changed = await api.post("/v1/events", order(contact_id, value="1.00"))

    assert same.status_code == 200
    assert same.json() | {"differs": None} == first | {"status": "duplicate", "differs": None}
    assert same.json()["differs"] is False
    assert (changed.status_code, changed.json()["differs"]) == (200, True)
    assert count(api.url, "events") == 1


async def test_contact_identifiers_create_the_contact_once_with_contact_created(
    api: Api,
) -> None:
    ref = {"phone": "(11) 98765-4321", "email": "Ana@Example.com", "name": "Ana"}
    first = await api.post("/v1/events", order(None, contact=ref))
    again = await api.post(
        "/v1/events", order(None, contact={"phone": "5511987654321"},
                            source_id="1002")
    )  # fmt: skip

    assert first.status_code == 201, first.text
    assert again.status_code == 201
    assert first.json()["contact_id"] == again.json()["contact_id"]
    rows = sql(api.url, "SELECT metric_name, source FROM events ORDER BY metric_name")
    assert rows == [
        ("Contact Created", "api"),
        ("Order Paid", "shopify"),
        ("Order Paid", "shopify"),
    ]
    contact = (await api.client.get(f"/v1/contacts/{first.json()['contact_id']}")).json()
    assert (contact["phone"], contact["email"], contact["name"]) == (
        "+5511987654321",
        "ana@example.com",
        "Ana",
    )


async def test_unknown_contact_is_422_and_kept_for_replay(api: Api) -> None:
    stranger = uuid.uuid4()
    response = await api.post("/v1/events", order(stranger))

    assert response.status_code == 422
    problem = response.json()
    assert problem["type"] == "/problems/event-rejected"
    assert problem["reason"] == "contact_not_found"
    assert field_codes(response) == {("contact_id", "contact_not_found")}
    kept = (await api.client.get("/v1/rejections")).json()["data"]
    assert [r["id"] for r in kept] == [problem["rejection_id"]]
    assert kept[0]["payload"]["contact_id"] == str(stranger)


# The HTTP API takes a contact by id or by its identities: the message names both.
NO_CONTACT = (
    "an event needs a contact: give contact_id (or, over HTTP, a contact object with a "
    "phone, email or external_id)"
)


async def test_event_without_any_contact_is_rejected_as_contact_required(api: Api) -> None:
    response = await api.post("/v1/events", {"metric": "Link Clicked"})
    batch = await api.post("/v1/events/batch", {"events": [{"metric": "Link Clicked"}]})

    assert response.status_code == 422
    assert response.json()["reason"] == "contact_required"
    assert response.json()["errors"] == [
        {"field": "contact_id", "code": "contact_required", "message": NO_CONTACT}
    ]
    [item] = batch.json()["results"]
    assert (item["reason"], item["message"]) == ("contact_required", NO_CONTACT)
    kept = (await api.client.get("/v1/rejections")).json()["data"]
    assert [r["message"] for r in kept] == [NO_CONTACT, NO_CONTACT]


async def test_event_cannot_be_written_against_another_accounts_contact(api: Api) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = api.ledger.create_contact(other.id, email="bia@example.com")

    response = await api.post("/v1/events", order(theirs.id))

    assert (response.status_code, response.json()["reason"]) == (422, "contact_not_found")
    assert count(api.url, "events") == 0


INVALID: list[tuple[str, dict[str, Any], set[tuple[str, str]]]] = [
    ("missing metric", {"metric": None}, {("metric", "string_type")}),
    ("empty metric", {"metric": " "}, {("metric", "empty")}),
    ("numeric metric", {"metric": 7}, {("metric", "string_type")}),
    ("reserved metric", {"metric": "__x"}, {("metric", "reserved")}),
    ("system metric mistyped", {"metric": "order paid"}, {("metric", "misspelt_system_metric")}),
    ("value text", {"value": "abc"}, {("value", "not_a_number")}),
    ("value bool", {"value": True}, {("value", "not_a_number")}),
    ("value huge", {"value": 1e20}, {("value", "out_of_range")}),
    ("value precise", {"value": 1.23456}, {("value", "too_precise")}),
    ("value past Decimal's exponents", {"value": "1E1000000"}, {("value", "out_of_range")}),
    ("currency", {"currency": "REAIS"}, {("currency", "invalid_currency")}),
    ("occurred_at text", {"occurred_at": "yesterday"}, {("occurred_at", "invalid_datetime")}),
    ("occurred_at naive", {"occurred_at": "2026-11-01T10:00:00"},
     {("occurred_at", "naive_datetime")}),
    ("occurred_at old", {"occurred_at": "1999-01-01T00:00:00Z"},
     {("occurred_at", "out_of_window")}),
    ("source colon", {"source": "shop:ify"}, {("source", "invalid_format")}),
    ("entity_type long", {"entity_type": "x" * 65}, {("entity_type", "too_long")}),
    ("source_id list", {"source_id": [1]}, {("source_id", "invalid_type")}),
    ("contact_id", {"contact_id": "nope"}, {("contact_id", "invalid_uuid")}),
    ("properties list", {"properties": []}, {("properties", "dict_type")}),
    ("deep property int", {"properties": {"a": {"b": 2**70}}},
     {("properties.a.b", "out_of_range")}),
    ("unknown field", {"contactId": "x"}, {("contactId", "extra_forbidden")}),
    ("two errors at once", {"currency": "?", "value": "x"},
     {("currency", "invalid_currency"), ("value", "not_a_number")}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "change", "expected"), INVALID, ids=[c for c, _, _ in INVALID])
async def test_every_bad_field_is_a_422_naming_it_and_nothing_is_written(
    api: Api, contact_id: uuid.UUID, case: str, change: dict[str, Any],
    expected: set[tuple[str, str]],
) -> None:  # fmt: skip
    body = order(contact_id) | change
    if change.get("metric", "") is None:
        del body["metric"]
        expected = {("metric", "missing")}
    response = await api.post("/v1/events", body)

    assert response.status_code == 422, response.text
    assert field_codes(response) == expected
    assert count(api.url, "events") == 0
    assert count(api.url, "rejections") == 0


RAW: list[tuple[str, str, set[tuple[str, str]]]] = [
    ("NaN", '"value": NaN', {("value", "not_finite")}),
    ("value past Decimal's exponents", '"value": 1E1000000', {("value", "out_of_range")}),
    ("Infinity in properties", '"properties": {"x": -Infinity}', {("properties.x", "not_finite")}),
    ("duplicate key", '"currency": "BRL", "currency": "USD"', {("currency", "duplicate_key")}),
    ("nested duplicate key", '"properties": {"a": {"b": 1, "b": 2}}',
     {("properties.a.b", "duplicate_key")}),
    ("lone surrogate", '"properties": {"name": "Ana \\ud83d"}',
     {("properties.name", "lone_surrogate")}),
    ("lone surrogate in a key", '"properties": {"\\udc00": 1}',
     {("properties.\\udc00", "lone_surrogate")}),
    ("NUL", '"properties": {"items": [{"price": 1, "sku": "a\\u0000"}]}',
     {("properties.items[0].sku", "nul_character")}),
    ("NUL in metric", '"source": "api\\u0000"', {("source", "nul_character")}),
]  # fmt: skip


async def test_a_system_metric_mistyped_is_422_naming_the_metric_meant(
    api: Api, contact_id: uuid.UUID
) -> None:
    # "order paid" was stored as a custom metric beside "Order Paid": counted apart, and no
    # order_paid automation ran for it
    answer = await api.post("/v1/events", order(contact_id, metric="order paid"))

    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert (error["field"], error["code"]) == ("metric", "misspelt_system_metric")
    assert "send 'Order Paid'" in error["message"]
    metrics = await api.client.get("/v1/metrics")
    assert [m["name"] for m in metrics.json()["data"]] == []


@pytest.mark.parametrize(("case", "fragment", "expected"), RAW, ids=[c for c, _, _ in RAW])
async def test_json_oddities_are_422_naming_the_path(
    api: Api, contact_id: uuid.UUID, case: str, fragment: str, expected: set[tuple[str, str]]
) -> None:
    text = f'{{"metric": "Order Paid", "contact_id": "{contact_id}", {fragment}}}'
    response = await api.raw("/v1/events", text)

    assert response.status_code == 422, response.text
    assert field_codes(response) == expected
    assert count(api.url, "events") == 0


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
async def test_occurred_at_beyond_years_1_to_9999_in_utc_is_422_out_of_window(
    api: Api, contact_id: uuid.UUID, when: str
) -> None:
    by_id = await api.post("/v1/events", order(contact_id, occurred_at=when))
    by_identifiers = await api.post(
        "/v1/events", order(None, contact={"email": "new@example.com"}, occurred_at=when)
    )

    assert (by_id.status_code, by_identifiers.status_code) == (422, 422), by_id.text
    assert field_codes(by_id) == field_codes(by_identifiers) == {("occurred_at", "out_of_window")}
    assert count(api.url, "events") == 0
    assert count(api.url, "contacts") == 1  # contact_id's: none was created for the event


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
@pytest.mark.parametrize("size", [3, CHUNK + 1], ids=["one statement", "streamed"])
async def test_batch_item_beyond_years_1_to_9999_in_utc_is_rejected_alone(
    api: Api, contact_id: uuid.UUID, when: str, size: int
) -> None:
    items = [order(contact_id, source_id=str(i)) for i in range(size)]
    items[0]["occurred_at"] = when
    items[1] = order(None, contact={"email": "new@example.com"}, occurred_at=when)
    response = await api.post("/v1/events/batch", {"events": items})

    assert response.status_code == 200, response.text
    results = response.json()["results"]
    for i in (0, 1):
        assert [(e["field"], e["code"]) for e in results[i]["errors"]] == [
            (f"events[{i}].occurred_at", "out_of_window")
        ]
    assert {r["status"] for r in results[2:]} == {"created"}
    assert count(api.url, "events") == size - 2


async def test_properties_nested_too_deep_are_422(api: Api, contact_id: uuid.UUID) -> None:
    nested: Any = 1
    for _ in range(20):
        nested = [nested]
    response = await api.post("/v1/events", order(contact_id, properties={"a": nested}))
    [(field, code)] = field_codes(response)
    assert (field[:13], code) == ("properties.a[", "too_deep")


async def test_invalid_event_with_new_identifiers_creates_no_contact(api: Api) -> None:
    body = order(None, contact={"email": "new@example.com"}, currency="XX")
    response = await api.post("/v1/events", body)

    assert field_codes(response) == {("currency", "invalid_currency")}
    assert count(api.url, "contacts") == 0


async def test_a_bad_event_and_bad_contact_identifiers_are_answered_together(api: Api) -> None:
    body = order(None, contact={"phone": "x", "name": "Ana"}, metric="", currency="XX")
    response = await api.post("/v1/events", body)

    assert response.status_code == 422, response.text
    assert response.json()["type"] == "/problems/invalid-event"
    assert field_codes(response) == {
        ("metric", "empty"), ("currency", "invalid_currency"), ("contact.phone", "invalid_phone"),
    }  # fmt: skip
    batch = await api.post("/v1/events/batch", {"events": [body]})
    [item] = batch.json()["results"]
    assert {(e["field"], e["code"]) for e in item["errors"]} == {
        ("events[0].metric", "empty"), ("events[0].currency", "invalid_currency"),
        ("events[0].contact.phone", "invalid_phone"),
    }  # fmt: skip
    assert count(api.url, "contacts") == 0


@pytest.mark.parametrize(
    ("contact", "expected"),
    [
        ({"phone": "abc", "email": "nope"},
         {("contact.phone", "invalid_phone"), ("contact.email", "invalid_email")}),
        ({}, {("contact", "identity_required")}),
        ({"phone": 11}, {("contact.phone", "string_type")}),
    ],
)  # fmt: skip
async def test_bad_contact_identifiers_are_422_per_field(
    api: Api, contact: dict[str, Any], expected: set[tuple[str, str]]
) -> None:
    response = await api.post("/v1/events", order(None, contact=contact))
    assert response.status_code == 422
    assert field_codes(response) == expected
    assert count(api.url, "contacts") == 0


WRONG_TYPES: list[tuple[str, Any, dict[str, Any], tuple[str, str, str]]] = [
    ("/v1/events", None, {"occurred_at": 1764417600},
     ("occurred_at", "string_type", "expected a string, got a number")),
    ("/v1/events", None, {"contact": "ana@example.com"},
     ("contact", "model_type", "expected an object, got a string")),
    ("/v1/events", None, {"contact": {"phone": 11987654321}},
     ("contact.phone", "string_type", "expected a string, got a number")),
    ("/v1/events", None, {"properties": ["a"]},
     ("properties", "dict_type", "expected an object, got an array")),
    ("/v1/events/batch", {"events": {"metric": "Order Paid"}}, {},
     ("events", "list_type", "expected an array, got an object")),
    ("/v1/contacts", {"email": None, "name": False}, {},
     ("name", "string_type", "expected a string, got false")),
    ("/v1/events", [1], {}, ("body", "model_type", "expected an object, got an array")),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "change", "expected"), WRONG_TYPES)
async def test_a_value_of_the_wrong_json_type_is_named_in_jsons_words(
    api: Api, contact_id: uuid.UUID, *, path: str, body: Any, change: dict[str, Any],
    expected: tuple[str, str, str],
) -> None:  # fmt: skip
    # pydantic said "Input should be a valid dictionary or instance of ContactIdentities"
    sent = order(None if "contact" in change else contact_id, **change) if body is None else body
    response = await api.post(path, sent)

    assert response.status_code == 422, response.text
    assert [(e["field"], e["code"], e["message"]) for e in response.json()["errors"]] == [expected]
    assert count(api.url, "events") == 0
    assert count(api.url, "contacts") == 1  # contact_id's


async def test_contact_id_and_contact_together_are_refused(api: Api, contact_id: uuid.UUID) -> None:
    response = await api.post("/v1/events", order(contact_id, contact={"phone": "11987654321"}))
    assert field_codes(response) == {("contact", "ambiguous_contact")}


@pytest.mark.parametrize(
    ("content", "headers", "status", "slug"),
    [
        (b"{not json", {}, 400, "malformed-json"),
        (b"", {}, 400, "malformed-json"),
        (b'{"metric": "\xff"}', {}, 400, "malformed-json"),
        (b"[" * 100_000, {}, 422, "invalid-input"),
        (b'{"metric": "x"}', {"Content-Type": "text/plain"}, 415, "unsupported-media-type"),
        (b'{"metric": "x"}', {"Content-Type": "application/json; charset=latin-1"}, 415,
         "unsupported-media-type"),
        (b"1" * 4500, {}, 400, "malformed-json"),
        (b"[1, 2]", {}, 422, "invalid-input"),
    ],
)  # fmt: skip
async def test_bodies_that_are_not_json_objects_get_a_clear_4xx(
    api: Api, content: bytes, headers: dict[str, str], status: int, slug: str
) -> None:
    response = await api.raw("/v1/events", content, **headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["type"] == f"/problems/{slug}"


@pytest.mark.parametrize(
    ("coding", "compress"),
    [("gzip", gzip.compress), ("br", lambda body: body), (" GZIP ", gzip.compress)],
    ids=["gzip", "says-br-but-plain", "spaced"],
)
@pytest.mark.parametrize("path", ["/v1/events", "/v1/events/batch", "/v1/contacts"])
async def test_a_compressed_body_is_415_naming_content_encoding_and_nothing_is_written(
    api: Api, contact_id: uuid.UUID, coding: str, compress: Any, path: str
) -> None:
    body = {"events": [order(contact_id)]} if path.endswith("batch") else order(contact_id)
    if path == "/v1/contacts":
        body = {"email": "bia@example.com"}
    sent = compress(json.dumps(body).encode())

    # gzip was answered 400 "the body is not valid UTF-8 (byte 1)"; a plain body said to
    # be br was read as if it had not said so
    response = await api.raw(path, sent, **{"Content-Encoding": coding})

    assert response.status_code == 415, response.text
    assert response.json()["type"] == "/problems/unsupported-media-type"
    assert response.json()["detail"] == (
        f"send the body uncompressed: Content-Encoding {coding.strip()} is not supported"
    )
    assert count(api.url, "events") == 0
    assert count(api.url, "contacts") == 1  # contact_id's
    plain = await api.raw(path, json.dumps(body), **{"Content-Encoding": "identity"})
    assert plain.status_code in (200, 201), plain.text


async def test_body_over_the_limit_is_413(api: Api, contact_id: uuid.UUID) -> None:
    big = order(contact_id, properties={"blob": "x" * 1_100_000})
    response = await api.post("/v1/events", big)
    assert response.status_code == 413
    assert response.json()["type"] == "/problems/payload-too-large"


async def test_properties_over_64_kib_are_422(api: Api, contact_id: uuid.UUID) -> None:
    response = await api.post("/v1/events", order(contact_id, properties={"x": "y" * 70_000}))
    assert field_codes(response) == {("properties", "too_large")}


async def test_concurrent_single_events_are_all_committed(api: Api, contact_id: uuid.UUID) -> None:
    bodies = [order(contact_id, source_id=str(i % 40)) for i in range(120)]
    responses = await asyncio.gather(*(api.post("/v1/events", b) for b in bodies))

    assert sorted(r.status_code for r in responses).count(201) == 40
    assert {r.status_code for r in responses} == {200, 201}
    assert count(api.url, "events") == 40


# -- batch --------------------------------------------------------------------------------


async def test_a_body_that_is_not_an_object_says_so_naming_no_class_of_ours(
    api: Api, contact_id: uuid.UUID
) -> None:
    # it said "Input should be a valid dictionary or instance of BatchIn" (or EventIn)
    events = [order(contact_id)]

    bare = await api.post("/v1/events/batch", events)
    single = await api.post("/v1/events", events)
    nested = await api.post("/v1/events", order(None, contact="ana@loja.com"))

    assert bare.status_code == 422, bare.text
    assert bare.json()["errors"] == [{
        "field": "body", "code": "model_type",
        "message": 'the body is an object holding the list: {"events": [...]}',
    }]  # fmt: skip
    assert single.json()["errors"] == [
        {"field": "body", "code": "model_type", "message": "expected an object, got an array"}
    ]
    assert nested.json()["errors"] == [
        {"field": "contact", "code": "model_type", "message": "expected an object, got a string"}
    ]
    assert count(api.url, "events") == 0


async def test_batch_answers_each_item_in_order_and_stores_the_valid_ones(
    api: Api, contact_id: uuid.UUID
) -> None:
    items: list[Any] = [
        order(contact_id, source_id="1"),
        order(contact_id, source_id="2", currency="??"),
        order(contact_id, source_id="1", value="5"),
        order(uuid.uuid4(), source_id="3"),
        {"metric": 5},
        "not an object",
        order(None, contact={"email": "bia@example.com"}, source_id="4"),
        order(None, contact={"email": "@"}, source_id="5"),
    ]
    response = await api.post("/v1/events/batch", {"events": items})

    assert response.status_code == 200, response.text
    body = response.json()
    results = body["results"]
    assert [r["status"] for r in results] == [
        "created", "rejected", "duplicate", "rejected", "rejected", "rejected", "created",
        "rejected",
    ]  # fmt: skip
    assert results[2]["event_id"] == results[0]["event_id"]
    assert results[2]["differs"] is True
    assert results[1]["errors"] == [
        {"field": "events[1].currency", "code": "invalid_currency",
         "message": "currency must be an ISO 4217 code, got '??'"}
    ]  # fmt: skip
    assert results[3]["reason"] == "contact_not_found"
    assert {e["field"] for e in results[4]["errors"]} == {"events[4].metric"}
    assert results[5]["errors"][0]["field"] == "events[5]"
    assert results[7]["errors"][0]["field"] == "events[7].contact.email"
    assert (body["created"], body["duplicate"], body["rejected"]) == (2, 1, 5)
    assert count(api.url, "events") == 3  # two orders and bia's Contact Created


async def test_error_messages_name_the_apis_fields_not_the_ledgers(
    api: Api, contact_id: uuid.UUID
) -> None:
    """The field was `metric`, but its message said `metric_name` (the ledger's name)."""
    empty = {"field": "metric", "code": "empty", "message": "metric must not be empty"}
    by_contact = order(None, metric="", contact={"email": "bia@example.com"})
    for body in (order(contact_id, metric=""), by_contact):
        response = await api.post("/v1/events", body)
        assert response.status_code == 422, response.text
        assert response.json()["errors"] == [empty]
        assert response.json()["detail"] == "metric: metric must not be empty"

    batch = await api.post("/v1/events/batch", {"events": [order(contact_id, metric=""),
                                                           by_contact]})  # fmt: skip
    assert batch.status_code == 200, batch.text
    for i, item in enumerate(batch.json()["results"]):
        assert item["errors"] == [empty | {"field": f"events[{i}].metric"}]
        assert item["message"] == f"events[{i}].metric: metric must not be empty"


async def test_batch_of_more_than_1000_is_422(api: Api, contact_id: uuid.UUID) -> None:
    items = [order(contact_id, source_id=str(i)) for i in range(1001)]
    response = await api.post("/v1/events/batch", {"events": items})
    assert field_codes(response) == {("events", "too_many")}
    assert count(api.url, "events") == 0


async def test_batch_json_oddity_names_the_item(api: Api, contact_id: uuid.UUID) -> None:
    text = json.dumps({"events": [order(contact_id)]}).replace('"value": "297.90"', '"value": NaN')
    response = await api.raw("/v1/events/batch", text)
    assert field_codes(response) == {("events[0].value", "not_finite")}


async def test_batch_value_as_a_json_number_is_read_exactly_like_a_single_events(
    api: Api, contact_id: uuid.UUID
) -> None:
    def item(source_id: str, number: str) -> str:
        body = json.dumps(order(contact_id, source_id=source_id))
        return body.replace('"value": "297.90"', f'"value": {number}')

    single = await api.raw("/v1/events", item("1", "12345678901234.5678"))
    single_precise = await api.raw("/v1/events", item("2", "1234567890123.45678"))
    batch = await api.raw(
        "/v1/events/batch",
        f'{{"events": [{item("3", "12345678901234.5678")}, {item("4", "1234567890123.45678")}]}}',
    )

    assert single.status_code == 201, single.text
    assert field_codes(single_precise) == {("value", "too_precise")}
    assert batch.status_code == 200, batch.text
    stored, too_precise = batch.json()["results"]
    assert [(e["field"], e["code"]) for e in too_precise["errors"]] == [
        ("events[1].value", "too_precise")
    ]
    for event_id in (single.json()["event_id"], stored["event_id"]):
        got = await api.client.get(f"/v1/events/{event_id}")
        assert got.json()["value"] == "12345678901234.5678"
        assert got.json()["properties"]["items"] == [{"sku": "A", "price": 19.9}]


# Texts the schema's pattern for value (a JSON number's form) refuses: Decimal() took them.
@pytest.mark.parametrize("text", ["1_000", "\u0661\u0660", " 5 ", "+5", ".5", "5.", "1e"])
async def test_value_text_outside_the_schemas_pattern_is_422_single_and_batch(
    api: Api, contact_id: uuid.UUID, text: str
) -> None:
    single = await api.post("/v1/events", order(contact_id, value=text))
    batch = await api.post("/v1/events/batch", {"events": [order(contact_id, value=text)]})

    assert field_codes(single) == {("value", "not_a_number")}
    [item] = batch.json()["results"]
    errors = [(e["field"], e["code"]) for e in item["errors"]]
    assert errors == [("events[0].value", "not_a_number")]
    assert count(api.url, "events") == 0


async def test_value_as_a_json_number_may_have_an_exponent_and_is_replayed_alike(
    api: Api, contact_id: uuid.UUID
) -> None:
    body = json.dumps(order(uuid.uuid4(), source_id="7")).replace('"297.90"', "1.5e2")
    rejected = await api.raw("/v1/events", body)
    replayed = await api.post(
        f"/v1/rejections/{rejected.json()['rejection_id']}/replay", {"contact_id": str(contact_id)}
    )

    assert replayed.status_code == 201, replayed.text
    event = (await api.client.get(f"/v1/events/{replayed.json()['event_id']}")).json()
    assert event["value"] == "150.00"


async def test_value_with_zeros_past_the_fourth_place_is_stored_single_and_batch(
    api: Api, contact_id: uuid.UUID
) -> None:
    single = await api.post("/v1/events", order(contact_id, source_id="1", value="297.9000000"))
    batch = await api.post(
        "/v1/events/batch", {"events": [order(contact_id, source_id="2", value="0.12340000")]}
    )

    assert single.status_code == 201, single.text
    assert batch.json()["created"] == 1, batch.text
    ids = [single.json()["event_id"], batch.json()["results"][0]["event_id"]]
    values = [(await api.client.get(f"/v1/events/{i}")).json()["value"] for i in ids]
    assert values == ["297.90", "0.1234"]


async def test_batch_of_a_thousand_is_stored_in_one_go(api: Api, contact_id: uuid.UUID) -> None:
    items = [order(contact_id, source_id=str(i)) for i in range(1000)]
    response = await api.post("/v1/events/batch", {"events": items})
    assert response.json()["created"] == 1000
    assert count(api.url, "events") == 1000


async def test_an_event_the_database_refuses_is_422_refused_never_503(
    api: Api, contact_id: uuid.UUID
) -> None:
    refuse_13(api.url)

    response = await api.post("/v1/events", order(contact_id, value="13.00"))

    assert response.status_code == 422, response.text
    body = response.json()
    assert (body["type"], body["reason"]) == ("/problems/event-rejected", "refused")
    assert field_codes(response) == {("body", "refused")}
    assert "rejection_id" not in body  # not kept: the data the database refused is in it
    assert "Retry-After" not in response.headers
    for table in ("events", "outbox", "contact_metrics_summary", "metrics", "rejections"):
        assert count(api.url, table) == 0, table


@pytest.mark.parametrize("size", [3, CHUNK + 1], ids=["one statement", "streamed"])
async def test_batch_item_the_database_refuses_is_rejected_alone(
    api: Api, contact_id: uuid.UUID, size: int
) -> None:
    refuse_13(api.url)
    items = [order(contact_id, source_id=str(i)) for i in range(size)]
    items[1]["value"] = 13

    response = await api.post("/v1/events/batch", {"events": items})

    assert response.status_code == 200, response.text
    body = response.json()
    refused = body["results"][1]
    assert (refused["status"], refused["reason"], refused["event_id"]) == (
        "rejected", "refused", None,
    )  # fmt: skip
    assert refused["unique_event_id"] == "shopify:order:1"
    assert (body["created"], body["rejected"]) == (size - 1, 1)
    assert count(api.url, "events") == count(api.url, "outbox") == size - 1
    assert count(api.url, "rejections") == 0
    summary = sql(api.url, "SELECT event_count FROM contact_metrics_summary")
    assert summary == [(size - 1,)]


# -- listing ------------------------------------------------------------------------------


async def test_events_page_newest_first_with_a_cursor_and_filters(
    api: Api, contact_id: uuid.UUID
) -> None:
    for day in range(1, 6):
        metric = "Link Clicked" if day % 2 else "Order Paid"
        await api.post("/v1/events", order(contact_id, metric=metric, source_id=str(day),
                       occurred_at=f"2026-11-0{day}T12:00:00Z"))  # fmt: skip

    first = (await api.client.get("/v1/events", params={"limit": 2})).json()
    rest = (await api.client.get("/v1/events", params={"cursor": first["next_cursor"]})).json()
    clicks = await api.client.get("/v1/events", params={"metric": "Link Clicked"})
    window = await api.client.get(
        "/v1/events",
        params={"since": "2026-11-02T00:00:00Z", "until": "2026-11-04T00:00:00Z"},
    )

    days = [e["occurred_at"][8:10] for e in first["data"] + rest["data"]]
    assert days == ["05", "04", "03", "02", "01"]
    assert rest["next_cursor"] is None
    assert [e["occurred_at"][8:10] for e in clicks.json()["data"]] == ["05", "03", "01"]
    assert [e["occurred_at"][8:10] for e in window.json()["data"]] == ["03", "02"]


# A cursor's form ("<occurred_at>|<id>", base64) with a time that is in year 0 in UTC.
YEAR_0_CURSOR = base64.urlsafe_b64encode(
    f"0001-01-01T00:00:00+01:00|{uuid.UUID(int=1)}".encode()
).decode()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"cursor": "garbage"}, {("cursor", "invalid_cursor")}),
        ({"since": "2026-11-01T00:00:00"}, {("since", "naive_datetime")}),
        ({"since": "soon"}, {("since", "datetime_from_date_parsing")}),
        ({"limit": 0}, {("limit", "greater_than_equal")}),
        ({"contact_id": "x"}, {("contact_id", "invalid_uuid")}),
        # PostgreSQL answered 503 (psycopg refused to send it), SQLite 200
        ({"metric": "Order\x00Paid"}, {("metric", "nul_character")}),
        # Beyond years 1 to 9999 once in UTC (SQLite's store answered 500, PostgreSQL 200)
        ({"since": "0001-01-01T00:00:00+01:00"}, {("since", "out_of_range")}),
        ({"until": "9999-12-31T23:59:59-01:00"}, {("until", "out_of_range")}),
        ({"cursor": YEAR_0_CURSOR}, {("cursor", "invalid_cursor")}),
    ],
)
async def test_bad_query_parameters_are_422(
    api: Api, params: dict[str, Any], expected: set[tuple[str, str]]
) -> None:
    response = await api.client.get("/v1/events", params=params)
    assert response.status_code == 422
    assert field_codes(response) == expected


async def test_a_nul_the_database_refuses_is_422_never_a_503_to_retry(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The net under the routes' checks: a text filter a route let through.
    monkeypatch.setattr(events_routes, "_query_text", lambda name, raw: raw)
    response = await api.client.get("/v1/events", params={"metric": "Order\x00Paid"})

    if api.url.startswith("postgresql"):
        assert response.status_code == 422, response.text
        assert response.json()["type"] == "/problems/unstorable-text"
        assert "retry-after" not in response.headers
    else:
        assert (response.status_code, response.json()["data"]) == (200, [])


# -- the change feed (`after`) ---------------------------------------------------------------


async def read_feed(api: Api, after: str, want: int, limit: int = 100) -> tuple[list[Any], str]:
    """Read the feed from `after` until it has given `want` events (a minute at most: on
    PostgreSQL the feed holds back what other sessions' open transactions may precede);
    the events and the last `next_cursor`."""
    got: list[Any] = []
    for _ in range(6000):
        response = await api.client.get("/v1/events", params={"after": after, "limit": limit})
        assert response.status_code == 200, response.text
        page = response.json()
        got += page["data"]
        after = page["next_cursor"]
        if len(got) >= want:
            break
        if not page["has_more"]:
            await asyncio.sleep(0.01)
    return got, after


async def test_events_feed_gives_each_event_once_in_arrival_order_late_ones_too(
    api: Api, contact_id: uuid.UUID
) -> None:
    """`after` reads events in the order they were stored, whatever their occurred_at:
    one that arrives late, dated a year back, comes after the cursor a poller holds."""
    for n, day in enumerate(["05", "01", "03"]):
        await api.post("/v1/events", order(contact_id, source_id=str(n),
                       occurred_at=f"2026-11-{day}T12:00:00Z"))  # fmt: skip

    got, cursor = await read_feed(api, "start", want=3, limit=2)
    first = (await api.client.get("/v1/events", params={"after": "start", "limit": 1})).json()
    idle = (await api.client.get("/v1/events", params={"after": cursor})).json()
    await api.post("/v1/events", order(contact_id, source_id="late",
                   occurred_at="2025-11-01T12:00:00Z"))  # fmt: skip
    late, _ = await read_feed(api, cursor, want=1)

    assert [e["occurred_at"][:10] for e in got] == ["2026-11-05", "2026-11-01", "2026-11-03"]
    assert (first["data"], first["has_more"]) == (got[:1], True)
    assert idle == {"data": [], "next_cursor": cursor, "has_more": False}
    assert [(e["source_id"], e["occurred_at"]) for e in late] == [("late", "2025-11-01T12:00:00Z")]


def feed_cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "after",
    [
        "garbage",
        "",
        "START",
        YEAR_0_CURSOR,  # a cursor of the newest-first list, not of the feed
        feed_cursor(f"feed|-1|{uuid.UUID(int=1)}"),
        feed_cursor(f"feed|{2**63}|{uuid.UUID(int=1)}"),  # past SQLite's integers
        feed_cursor(f"feed|\u0663|{uuid.UUID(int=1)}"),  # a digit, but not an ASCII one
        feed_cursor("feed|1|not-a-uuid"),
        feed_cursor(f"feed|1|{uuid.UUID(int=1)}|more"),
    ],
)
async def test_events_feed_refuses_an_after_that_is_not_ours_naming_it(
    api: Api, after: str
) -> None:
    response = await api.client.get("/v1/events", params={"after": after})
    assert response.status_code == 422, response.text
    assert field_codes(response) == {("after", "invalid_cursor")}


async def test_events_feed_refuses_the_lists_filters_naming_them(api: Api) -> None:
    params = {"after": "start", "metric": "Order Paid", "since": "2026-11-01T00:00:00Z",
              "cursor": "x"}  # fmt: skip
    response = await api.client.get("/v1/events", params=params)
    assert response.status_code == 422, response.text
    assert field_codes(response) == {
        ("metric", "not_with_after"), ("since", "not_with_after"), ("cursor", "not_with_after")
    }  # fmt: skip


async def test_timeline_cursor_beyond_years_1_to_9999_in_utc_is_422(
    api: Api, contact_id: uuid.UUID
) -> None:
    response = await api.client.get(
        f"/v1/contacts/{contact_id}/timeline", params={"cursor": YEAR_0_CURSOR}
    )
    assert response.status_code == 422, response.text
    assert field_codes(response) == {("cursor", "invalid_cursor")}


async def test_another_accounts_event_is_404_like_a_missing_one(
    api: Api, contact_id: uuid.UUID
) -> None:
    event_id = (await api.post("/v1/events", order(contact_id))).json()["event_id"]
    other = api.ledger.create_account("Outra Loja")
    their_key = await api.key_for("read", account=other)

    theirs = await api.client.get(f"/v1/events/{event_id}", headers=api.auth(their_key))
    missing = await api.client.get(f"/v1/events/{uuid.uuid4()}")
    malformed = await api.client.get("/v1/events/not-a-uuid")
    listing = await api.client.get("/v1/events", headers=api.auth(their_key))

    assert theirs.status_code == missing.status_code == malformed.status_code == 404
    assert theirs.json()["detail"].replace(event_id, "?") == "no event ?"
    assert listing.json()["data"] == []


@pytest.mark.parametrize("name", ["sent_by_automation_id", "sent_by_automation_execution_id"])
async def test_properties_only_sinal_sets_are_422_naming_them_and_nothing_is_written(
    api: Api, name: str
) -> None:
    """sinal names the automation and execution that sent a message on its statuses: the
    first never runs for them, and the second's chain depth carries on. From a client, the
    real ids of its account would keep an automation from running for the event (or stop
    them all), so the API refuses them, in a batch too; the ledger's own callers set them."""
    ping = {"name": "ping", "trigger_metric": "Ping", "steps": [{"type": "add_tag", "tag": "p"}]}
    automation = (await api.post("/v1/automations", ping)).json()
    event = {"metric": "Ping", "contact": {"phone": "+55 11 98765-4321"},
             "properties": {name: automation["id"], "order_id": "1001"}}  # fmt: skip
    ingest = api.auth(await api.key_for("ingest"))

    single = await api.post("/v1/events", event, headers=ingest)
    batch = await api.post("/v1/events/batch", {"events": [event]}, headers=ingest)

    assert single.status_code == 422, single.text
    assert single.json()["errors"] == [{
        "field": f"properties.{name}", "code": "reserved",
        "message": f"properties.{name} is set by sinal alone, on the status of a message an "
                   "automation sent",
    }]  # fmt: skip
    assert batch.status_code == 200, batch.text
    [item] = batch.json()["results"]
    assert (item["status"], item["reason"]) == ("rejected", "invalid")
    assert [(e["field"], e["code"]) for e in item["errors"]] == [
        (f"events[0].properties.{name}", "reserved")
    ]
    assert (count(api.url, "events"), count(api.url, "contacts")) == (0, 0)


EVENT_FIELDS = (
    "metric, contact_id, contact, properties, value, currency, source, source_id, "
    "entity_type, entity_id, occurred_at"
)


async def test_an_unknown_body_field_is_named_with_the_fields_its_object_takes(api: Api) -> None:
    """As an unknown query parameter's answer names the ones the route takes: a client
    that misspelt `contact_id` as `contactId` learns the spelling from the answer."""
    one = await api.post("/v1/events", {"metric": "Link Clicked", "contactId": "x"})
    nested = await api.post("/v1/events", {"metric": "Link Clicked", "contact": {"cpf": "1"}})
    batch = await api.post("/v1/events/batch", {"events": [{"metric": "X", "contactId": "x"}],
                                                "event": []})  # fmt: skip

    assert one.status_code == nested.status_code == 422
    assert one.json()["errors"] == [{
        "field": "contactId", "code": "extra_forbidden",
        "message": f"unknown field 'contactId'; the body takes {EVENT_FIELDS}",
    }]  # fmt: skip
    assert nested.json()["errors"] == [{
        "field": "contact.cpf", "code": "extra_forbidden",
        "message": "unknown field 'cpf'; contact takes phone, email, external_id, name",
    }]  # fmt: skip
    assert batch.json()["errors"] == [{
        "field": "event", "code": "extra_forbidden",
        "message": "unknown field 'event'; the body takes events",
    }]  # fmt: skip
    fixed = {"metric": "X", "contact": {"email": "ana@example.com"}}
    items = await api.post("/v1/events/batch", {"events": [fixed, {"metric": "X", "contactId": 1}]})
    assert items.json()["results"][1]["errors"] == [{
        "field": "events[1].contactId", "code": "extra_forbidden",
        "message": f"unknown field 'contactId'; events[1] takes {EVENT_FIELDS}",
    }]  # fmt: skip
    assert [r["status"] for r in items.json()["results"]] == ["created", "rejected"]


# -- metric names compared as stored ----------------------------------------------------------

COMPOSED = "Avaliação Enviada"  # NFC: ç and ã one code point each
DECOMPOSED = unicodedata.normalize("NFD", COMPOSED)  # c + U+0327, a + U+0303


async def test_a_metric_name_decomposed_or_padded_is_the_same_metric_everywhere(
    api: Api, contact_id: uuid.UUID
) -> None:
    # The decomposed name made a second metric that printed as the first: its events were
    # not counted with the first's, and an automation on the one never ran for the other.
    automation = await api.post("/v1/automations", {
        "name": "Obrigado", "trigger_metric": f" {DECOMPOSED}",
        "steps": [{"type": "add_tag", "tag": "avaliou"}],
    })  # fmt: skip
    assert automation.status_code == 201, automation.text
    assert automation.json()["trigger_metric"] == COMPOSED

    for i, name in enumerate((COMPOSED, DECOMPOSED, f"{DECOMPOSED} ")):
        sent = await api.post("/v1/events", {"metric": name, "contact_id": str(contact_id),
                                             "source_id": str(i)})  # fmt: skip
        assert sent.status_code == 201, sent.text
    batch = await api.post("/v1/events/batch", {"events": [
        {"metric": DECOMPOSED, "contact_id": str(contact_id), "source_id": "3"}]})  # fmt: skip
    assert batch.json()["created"] == 1

    [metric] = [m for m in (await api.client.get("/v1/metrics")).json()["data"]
                if m["category"] == "custom"]  # fmt: skip
    assert (metric["name"], metric["count"]) == (COMPOSED, 4)
    listed = await api.client.get("/v1/events", params={"metric": f" {DECOMPOSED}"})
    assert {e["metric"] for e in listed.json()["data"]} == {COMPOSED}
    assert len(listed.json()["data"]) == 4
    window = {"since": "2026-01-01T00:00:00Z", "until": "2027-01-01T00:00:00Z",
              "interval": "month"}  # fmt: skip
    summed = await api.client.get(f"/v1/metrics/{DECOMPOSED}/aggregates", params=window)
    assert summed.status_code == 200, summed.text
    assert summed.json()["metric"] == COMPOSED
    assert sum(bucket["value"] for bucket in summed.json()["data"]) == 4
    [summary] = (await api.client.get(f"/v1/contacts/{contact_id}/metrics")).json()["data"]
    assert (summary["metric"], summary["count"]) == (COMPOSED, 4)

    run_automations(api)
    runs = await api.client.get(f"/v1/automations/{automation.json()['id']}/executions")
    assert len(runs.json()["data"]) == 4
