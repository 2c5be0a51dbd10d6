"""Rejections: listed with their reason, replayed once their cause is fixed, never twice."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.helpers import count
from tests.integration.conftest import Api

pytestmark = pytest.mark.anyio


async def reject(api: Api, contact_id: object | None, n: str = "1") -> str:
    body = {"metric": "Order Paid", "value": "10", "source": "shopify", "source_id": n}
    if contact_id is not None:
        body["contact_id"] = str(contact_id)
    response = await api.post("/v1/events", body)
    assert response.status_code == 422
    rejection_id: str = response.json()["rejection_id"]
    return rejection_id


async def test_replay_after_the_contact_exists_stores_the_event_once(api: Api) -> None:
    rejection = await reject(api, None)
    path = f"/v1/rejections/{rejection}/replay"

    still = await api.client.post(path)
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    replayed = await api.post(path, {"contact_id": str(contact.id)})
    again = await api.post(path, {"contact_id": str(contact.id)})

    assert still.status_code == 422
    assert still.json()["reason"] == "contact_required"
    assert replayed.status_code == 201, replayed.text
    assert again.status_code == 200
    assert again.json() == replayed.json() | {"status": "already_replayed"}
    [kept] = (await api.client.get("/v1/rejections")).json()["data"]
    assert kept["replayed_event_id"] == replayed.json()["event_id"]
    event = (await api.client.get(f"/v1/events/{kept['replayed_event_id']}")).json()
    assert (event["contact_id"], event["unique_event_id"]) == (
        str(contact.id),
        "shopify:event:1",
    )
    assert count(api.url, "events") == 1


async def test_replay_without_a_contact_answers_the_reason_it_was_kept_for(api: Api) -> None:
    none = await api.client.post(f"/v1/rejections/{await reject(api, None)}/replay")
    unknown = await api.client.post(f"/v1/rejections/{await reject(api, uuid.uuid4(), '2')}/replay")

    assert (none.status_code, none.json()["reason"]) == (422, "contact_required")
    assert none.json()["errors"] == [
        {
            "field": "contact_id",
            "code": "contact_required",
            "message": "the event names no contact: give contact_id in the replay request",
        }
    ]
    assert (unknown.status_code, unknown.json()["reason"]) == (422, "contact_not_found")
    assert [e["code"] for e in unknown.json()["errors"]] == ["contact_not_found"]
    assert count(api.url, "events") == 0


async def test_concurrent_replays_store_one_event(api: Api) -> None:
    missing = uuid.uuid4()
    rejection = await reject(api, missing)
    # The contact now exists under the id the source used (e.g. created by a later sync).
    api.ledger.create_contact(api.account.id, email="ana@example.com")
    contact = api.ledger.create_contact(api.account.id, email="bia@example.com")

    responses = await asyncio.gather(*(
        api.post(f"/v1/rejections/{rejection}/replay", {"contact_id": str(contact.id)})
        for _ in range(12)
    ))  # fmt: skip

    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 11 + [201]
    assert len({r.json()["event_id"] for r in responses}) == 1
    assert count(api.url, "events") == 1


async def test_rejections_page_newest_first(api: Api) -> None:
    ids = [await reject(api, uuid.uuid4(), str(n)) for n in range(3)]

    first = (await api.client.get("/v1/rejections", params={"limit": 2})).json()
    rest = (await api.client.get("/v1/rejections", params={"cursor": first["next_cursor"]})).json()

    assert [r["id"] for r in first["data"] + rest["data"]] == ids[::-1]
    assert first["data"][0]["reason"] == "contact_not_found"


async def test_another_accounts_rejection_is_404(api: Api) -> None:
    rejection = await reject(api, None)
    other = api.ledger.create_account("Outra Loja")
    their_key = await api.key_for("ingest", "read", account=other)

    replay = await api.client.post(f"/v1/rejections/{rejection}/replay",
                                   headers=api.auth(their_key))  # fmt: skip
    listing = await api.client.get("/v1/rejections", headers=api.auth(their_key))
    malformed = await api.client.post("/v1/rejections/nope/replay")

    assert (replay.status_code, malformed.status_code) == (404, 404)
    assert listing.json()["data"] == []


async def test_replay_body_is_checked(api: Api) -> None:
    rejection = await reject(api, None)
    response = await api.post(f"/v1/rejections/{rejection}/replay", {"contact_id": "x"})
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "contact_id"


async def test_a_rejection_shows_its_event_under_the_api_names(api: Api) -> None:
    """What a client sent is what it reads back: `metric`, as POST /v1/events takes it and
    GET /v1/events shows it; it read the ledger's names (`metric_name`, and the key's own
    `account_id`). One kept from the Python API (`emit_event(metric_name=)`) reads alike."""
    sent = {"metric": "Order Paid", "contact_id": str(uuid.uuid4()), "value": "10.50",
            "source": "shopify", "source_id": "1", "entity_type": "order",
            "properties": {"order_id": "1"},
            "occurred_at": "2026-11-01T10:00:00-03:00"}  # fmt: skip
    assert (await api.post("/v1/events", sent)).status_code == 422
    api.ledger.emit_event(account_id=api.account.id, contact_id=None,
                          metric_name="Quiz Answered", source="quiz", source_id="7")  # fmt: skip
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")

    python, http = (await api.client.get("/v1/rejections")).json()["data"]  # newest first
    replayed = await api.post(f"/v1/rejections/{http['id']}/replay",
                              {"contact_id": str(contact.id)})  # fmt: skip
    event = (await api.client.get(f"/v1/events/{replayed.json()['event_id']}")).json()

    assert http["payload"] == {
        "metric": "Order Paid", "contact_id": sent["contact_id"],
        "properties": {"order_id": "1"}, "value": "10.50", "currency": "BRL",
        "source": "shopify", "source_id": "1", "integration_id": None,
        "entity_type": "order", "entity_id": None, "occurred_at": "2026-11-01T13:00:00Z",
        "automation_execution_id": None,
    }  # fmt: skip
    # every field read as the event it became shows it (but its contact, given at replay)
    assert {k: event[k] for k in http["payload"]} == http["payload"] | {
        "contact_id": str(contact.id)
    }
    assert python["payload"]["metric"] == "Quiz Answered"
    assert set(python["payload"]) == set(http["payload"])
