"""Conversations through HTTP, on both backends: opened by an inbound message, listed,
closed and assigned (each change with its event), behind the tenant wall."""

from __future__ import annotations

from typing import Any
from uuid import uuid4

import pytest

from tests.helpers import count
from tests.integration.conftest import Api
from tests.integration.whatsapp import (
    connect_whatsapp,
    deliver,
    events,
    fixture_body,
    meta_bytes,
    text_message,
)

pytestmark = pytest.mark.anyio


async def _opened(api: Api) -> dict[str, Any]:
    """The conversation an inbound message opens."""
    wa = connect_whatsapp(api)
    assert (await deliver(api, wa, fixture_body("text_message"))).status_code == 200
    [conversation] = (await api.client.get("/v1/conversations")).json()["data"]
    return dict(conversation)


async def test_conversation_opened_by_a_message_is_listed_for_its_contact(api: Api) -> None:
    conversation = await _opened(api)
    [opened] = events(api, "Conversation Opened")
    assert conversation["id"] == opened.entity_id == opened.properties["conversation_id"]
    assert conversation["contact_id"] == str(opened.contact_id)
    assert (conversation["status"], conversation["assigned_to"]) == ("open", None)
    assert conversation["opened_at"] == "2024-05-10T16:53:20Z"  # the message's time
    assert conversation["closed_at"] is None

    mine = await api.client.get("/v1/conversations", params={"contact_id": str(opened.contact_id)})
    assert [c["id"] for c in mine.json()["data"]] == [conversation["id"]]
    one = await api.client.get(f"/v1/conversations/{conversation['id']}")
    assert one.json() == conversation


async def test_conversation_close_records_conversation_closed_once(api: Api) -> None:
    conversation = await _opened(api)
    path = f"/v1/conversations/{conversation['id']}/close"
    closed = await api.client.post(path)
    assert closed.status_code == 200, closed.text
    assert closed.json()["status"] == "closed"
    assert closed.json()["closed_at"] is not None
    again = await api.client.post(path)
    assert again.json() == closed.json()

    [event] = events(api, "Conversation Closed")
    assert (event.source, event.entity_type, event.entity_id) == (
        "api", "conversation", conversation["id"]
    )  # fmt: skip
    assert str(event.contact_id) == conversation["contact_id"]

    # The contact writes again: a new conversation opens.
    wa = connect_whatsapp(api)
    await deliver(api, wa, meta_bytes(text_message("wamid.AGAIN", "5511987654321", "Oi")))
    listing = (await api.client.get("/v1/conversations")).json()["data"]
    assert [c["status"] for c in listing] == ["open", "closed"]
    assert len(events(api, "Conversation Opened")) == 2
    assert len(events(api, "Conversation Closed")) == 1


async def test_conversation_assign_records_each_change_of_agent(api: Api) -> None:
    conversation = await _opened(api)
    path = f"/v1/conversations/{conversation['id']}/assign"
    first = await api.post(path, {"agent": "  Joana   Prado "})
    assert first.status_code == 200, first.text
    assert first.json()["assigned_to"] == "Joana Prado"
    same = await api.post(path, {"agent": "Joana Prado"})
    assert same.json() == first.json()
    second = await api.post(path, {"agent": "carlos@lojadaana.com.br"})
    assert second.json()["assigned_to"] == "carlos@lojadaana.com.br"

    assigned = events(api, "Conversation Assigned")
    assert [(e.properties["agent"], e.properties["previous_agent"]) for e in assigned] == [
        ("Joana Prado", None),
        ("carlos@lojadaana.com.br", "Joana Prado"),
    ]
    assert {e.entity_id for e in assigned} == {conversation["id"]}


async def test_conversation_closed_cannot_be_assigned(api: Api) -> None:
    conversation = await _opened(api)
    await api.client.post(f"/v1/conversations/{conversation['id']}/close")
    answer = await api.post(f"/v1/conversations/{conversation['id']}/assign", {"agent": "Joana"})
    assert answer.status_code == 409
    assert answer.json()["type"] == "/problems/conversation-closed"
    assert events(api, "Conversation Assigned") == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent": ""}, "agent"),
        ({"agent": "   "}, "agent"),
        ({"agent": "a\x07b"}, "agent"),
        ({"agent": "x" * 201}, "agent"),
        ({"agent": 7}, "agent"),
        ({}, "agent"),
        ({"agent": "Joana", "team": "vendas"}, "team"),
    ],
)
async def test_conversation_assign_refuses_a_bad_agent(
    api: Api, body: dict[str, Any], field: str
) -> None:
    conversation = await _opened(api)
    answer = await api.post(f"/v1/conversations/{conversation['id']}/assign", body)
    assert answer.status_code == 422
    assert [e["field"] for e in answer.json()["errors"]] == [field]


async def test_conversation_assign_measures_the_agent_after_normalization(api: Api) -> None:
    conversation = await _opened(api)
    path = f"/v1/conversations/{conversation['id']}/assign"
    # U+FB2C is one character that NFC turns into three: 200 of them are 600.
    answer = await api.post(path, {"agent": "\ufb2c" * 200})
    assert answer.status_code == 422, answer.text
    assert [(e["field"], e["code"]) for e in answer.json()["errors"]] == [("agent", "too_long")]
    assert events(api, "Conversation Assigned") == []
    fits = await api.post(path, {"agent": "\ufb2c" * 66 + "ab"})  # 200 once normalized
    assert fits.status_code == 200, fits.text
    assert len(fits.json()["assigned_to"]) == 200


async def test_conversation_of_another_account_is_404(api: Api) -> None:
    conversation = await _opened(api)
    other = api.ledger.create_account("Outra Loja")
    key = api.auth(await api.key_for("ingest", "read", account=other))
    ident = conversation["id"]
    for answer in (
        await api.client.get(f"/v1/conversations/{ident}", headers=key),
        await api.client.post(f"/v1/conversations/{ident}/close", headers=key),
        await api.client.post(f"/v1/conversations/{ident}/assign", json={"agent": "x"},
                              headers=key),
        await api.client.get(f"/v1/conversations/{uuid4()}"),
        await api.client.post("/v1/conversations/not-an-id/close"),
    ):  # fmt: skip
        assert answer.status_code == 404, answer.text
        assert answer.json()["type"] == "/problems/not-found"
    theirs = await api.client.get(
        "/v1/conversations", params={"contact_id": conversation["contact_id"]}, headers=key
    )
    assert theirs.json()["data"] == []
    still = (await api.client.get(f"/v1/conversations/{ident}")).json()
    assert (still["status"], still["assigned_to"]) == ("open", None)
    assert events(api, "Conversation Closed") == []


async def test_conversation_changes_need_the_ingest_scope(api: Api) -> None:
    conversation = await _opened(api)
    reader = api.auth(await api.key_for("read"))
    answer = await api.client.post(f"/v1/conversations/{conversation['id']}/close", headers=reader)
    assert answer.status_code == 403
    assert (await api.client.get("/v1/conversations", headers=reader)).status_code == 200


async def test_conversations_page_newest_first_with_a_cursor(api: Api) -> None:
    wa = connect_whatsapp(api)
    for i in range(3):
        phone = f"55119876500{i:02d}"
        await deliver(api, wa, meta_bytes(text_message(f"wamid.P{i}", phone, "oi")))
    first = (await api.client.get("/v1/conversations", params={"limit": 2})).json()
    assert len(first["data"]) == 2
    assert first["next_cursor"]
    rest = await api.client.get(
        "/v1/conversations", params={"limit": 2, "cursor": first["next_cursor"]}
    )
    assert len(rest.json()["data"]) == 1
    assert rest.json()["next_cursor"] is None
    ids = [c["id"] for c in first["data"] + rest.json()["data"]]
    assert ids == sorted(ids, reverse=True)
    assert count(api.url, "conversations") == 3
    bad = await api.client.get("/v1/conversations", params={"contact_id": "nope"})
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "contact_id"
