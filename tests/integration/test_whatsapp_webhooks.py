"""WhatsApp Cloud API webhooks through HTTP, on both backends: the handshake, signatures,
inbound messages, statuses (in and out of order, duplicated, of messages sinal sent)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from sinal import webhooks
from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.config import Settings
from sinal.integrations.signatures import sign_whatsapp
from sinal.integrations.whatsapp import sent_callback_data, whatsapp_delivery
from sinal.ledger import Ledger
from sinal.messaging import messaging_store
from sinal.store.automations import MAX_CHAIN_DEPTH, Integration, too_deep
from sinal.worker import start_worker_thread
from tests.helpers import DrivenClock, count, settle, sql
from tests.integration.conftest import Api
from tests.integration.whatsapp import (
    APP_SECRET,
    PHONE_NUMBER_ID,
    VERIFY_TOKEN,
    connect_whatsapp,
    deferred,
    deliver,
    due_at,
    events,
    fixture_body,
    meta_bytes,
    one_connection,
    receive,
    statements,
    statuses,
    text_message,
)
from tests.servers import whatsapp_server

pytestmark = pytest.mark.anyio

SENT = "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEkE3QjNDMDk4RDY1RTQzMjEwRgA="
OTHER = "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEjFDMkQzRTRGNUE2QjdDOEQ5RQA="
FAILED = "wamid.HBgNNTUxMjE5NzY1NDMyMTAVAgARGBJCNkE5QzJEMEU4RjdBNjU0MzIA"
TEXT = "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABIYFDNBMDJCMEI1RjE4QzFEMUQ4RjNBAA=="


def _at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _props(api: Api, metric: str) -> dict[str, Any]:
    [event] = events(api, metric)
    return event.properties


# --- the subscription handshake ----------------------------------------------------------


async def test_whatsapp_handshake_echoes_the_challenge_for_the_right_token(api: Api) -> None:
    wa = connect_whatsapp(api)
    params = {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN,
              "hub.challenge": "1158201444"}  # fmt: skip
    answer = await api.client.get(f"/webhooks/whatsapp/{wa.id}", params=params)
    assert answer.status_code == 200
    assert answer.text == "1158201444"
    assert answer.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize(
    "params",
    [
        {"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1"},
        {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN.upper(), "hub.challenge": "1"},
        {"hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1"},
        {"hub.mode": "subscribe", "hub.challenge": "1"},
        {},
    ],
)
async def test_whatsapp_handshake_with_a_wrong_token_is_403(
    api: Api, params: dict[str, str]
) -> None:
    wa = connect_whatsapp(api)
    answer = await api.client.get(f"/webhooks/whatsapp/{wa.id}", params=params)
    assert answer.status_code == 403
    assert answer.json()["type"] == "/problems/verification-failed"
    assert "1" not in answer.json()["detail"]


@pytest.mark.parametrize("name", ["hub.mode", "hub.verify_token", "hub.challenge"])
async def test_whatsapp_handshake_with_a_repeated_hub_parameter_is_403_naming_it(
    api: Api, name: str
) -> None:
    wa = connect_whatsapp(api)
    right = {"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "11"}
    wrong = {"hub.mode": "unsubscribe", "hub.verify_token": "wrong", "hub.challenge": "22"}
    # a wrong value first, the right one last: read by its last value, this passed
    query = ((name, wrong[name]), *right.items())
    answer = await api.client.get(f"/webhooks/whatsapp/{wa.id}", params=query)
    assert answer.status_code == 403
    assert answer.json()["type"] == "/problems/verification-failed"
    assert answer.json()["detail"] == f"{name} given more than once; give each once"


async def test_whatsapp_webhook_of_an_unknown_or_other_integration_is_404(api: Api) -> None:
    shopify = await api.post("/v1/integrations", {"kind": "shopify", "secret": "s"})
    wa = connect_whatsapp(api)
    body = fixture_body("text_message")
    for ident in (str(uuid4()), "not-a-uuid", shopify.json()["id"]):
        assert (await api.client.get(f"/webhooks/whatsapp/{ident}")).status_code == 404
        signed = {"X-Hub-Signature-256": sign_whatsapp("s", body)}
        posted = await api.client.post(f"/webhooks/whatsapp/{ident}", content=body, headers=signed)
        assert posted.status_code == 404
    assert (await api.client.delete(f"/v1/integrations/{wa.id}")).status_code == 204
    assert (await deliver(api, wa, body)).status_code == 404
    assert count(api.url, "webhook_deliveries") == 0


# --- signatures --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signature",
    [
        "",
        "sha256=",
        "sha256=zz",
        "sha1=" + "0" * 40,
        sign_whatsapp("another-app-secret", fixture_body("text_message")),
        sign_whatsapp(APP_SECRET, fixture_body("text_message") + b" "),
        sign_whatsapp(APP_SECRET, fixture_body("text_message")).upper().replace("SHA256", "md5"),
    ],
)
async def test_whatsapp_bad_signature_is_401_and_nothing_is_stored(
    api: Api, signature: str
) -> None:
    wa = connect_whatsapp(api)
    answer = await deliver(api, wa, fixture_body("text_message"), signature=signature)
    assert answer.status_code == 401
    assert answer.json()["type"] == "/problems/invalid-signature"
    assert "www-authenticate" not in answer.headers  # no bearer token is expected here
    assert count(api.url, "webhook_deliveries") == 0
    assert events(api) == []


async def test_whatsapp_signature_is_checked_over_the_bytes_as_meta_sent_them(api: Api) -> None:
    wa = connect_whatsapp(api)
    as_sent = fixture_body("text_message")
    assert b"Ol\\u00e1" in as_sent
    assert "Olá".encode() not in as_sent
    # The same JSON re-serialized with raw UTF-8 is other bytes: its signature cannot pass
    # for the escaped body, and the escaped body's signature cannot pass for it.
    reencoded = json.dumps(json.loads(as_sent), ensure_ascii=False).encode()
    forged = await deliver(api, wa, as_sent, signature=sign_whatsapp(APP_SECRET, reencoded))
    assert forged.status_code == 401
    answer = await deliver(api, wa, as_sent)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "processed"
    props = _props(api, "Message Received")
    assert props["text"].startswith("Olá! Vocês têm a camiseta azul")
    [(kept,)] = sql(api.url, "SELECT body FROM webhook_deliveries")
    assert bytes(kept) == as_sent


async def test_whatsapp_body_over_the_limit_is_413(api: Api) -> None:
    wa = connect_whatsapp(api)
    body = meta_bytes(text_message("wamid.big", "5511987654321", "x" * (1024 * 1024)))
    assert (await deliver(api, wa, body)).status_code == 413
    assert count(api.url, "webhook_deliveries") == 0


# --- inbound messages --------------------------------------------------------------------

MESSAGES: list[tuple[str, str, dict[str, Any]]] = [
    ("text_message", "text", {"text": "Olá! Vocês têm a camiseta azul no tamanho M? Preciso "
                                      "até sexta 🙏 https://lojadaana.com.br/p/camiseta"}),
    ("image_caption", "image", {"caption": "Essa aqui, é de algodão?",
                                "media_id": "1482937461029384"}),
    ("interactive_button_reply", "interactive", {"reply_type": "button_reply",
                                                 "reply_id": "confirmar_pedido_1042"}),
    ("interactive_list_reply", "interactive", {"reply_type": "list_reply",
                                               "reply_id": "tamanho_m", "reply_title": "M"}),
    ("template_quick_reply", "button", {"reply_type": "quick_reply",
                                        "reply_id": "RASTREAR_PEDIDO_1042"}),
    ("reaction_added", "reaction", {"reaction_emoji": "❤️", "reaction_removed": False}),
    ("reaction_removed", "reaction", {"reaction_emoji": "", "reaction_removed": True}),
    ("location", "location", {"latitude": -23.5558, "location_name": "Conjunto Nacional"}),
]  # fmt: skip


@pytest.mark.parametrize(("fixture", "message_type", "expected"), MESSAGES,
                         ids=[m[0] for m in MESSAGES])  # fmt: skip
async def test_whatsapp_inbound_message_is_message_received(
    api: Api, fixture: str, message_type: str, expected: dict[str, Any]
) -> None:
    wa = connect_whatsapp(api)
    raw = json.loads(fixture_body(fixture))["entry"][0]["changes"][0]["value"]["messages"][0]
    answer = await deliver(api, wa, fixture_body(fixture))
    assert answer.json()["status"] == "processed", answer.text

    [event] = events(api, "Message Received")
    assert event.unique_event_id == f"whatsapp:message:{raw['id']}"
    assert (event.source, event.entity_type, event.entity_id) == ("whatsapp", "message", raw["id"])
    assert event.occurred_at == _at(int(raw["timestamp"]))
    assert event.integration_id == wa.id
    assert event.properties["message_type"] == message_type
    assert event.properties["wa_message_id"] == raw["id"]
    assert event.properties.items() >= expected.items()
    contact = api.ledger.get_contact(api.account.id, event.contact_id)
    assert contact is not None
    assert contact.phone == event.properties["phone"]
    [created] = events(api, "Contact Created")
    assert (created.contact_id, created.source) == (event.contact_id, "whatsapp")
    [opened] = events(api, "Conversation Opened")
    assert opened.contact_id == event.contact_id
    assert opened.properties["opened_by_message_id"] == raw["id"]


async def test_whatsapp_new_contact_gets_its_profile_name_and_e164_phone(api: Api) -> None:
    wa = connect_whatsapp(api)
    await deliver(api, wa, fixture_body("text_message"))
    [event] = events(api, "Message Received")
    contact = api.ledger.get_contact(api.account.id, event.contact_id)
    assert contact is not None
    assert (contact.phone, contact.name) == ("+5511987654321", "Conceição Araújo")


async def test_whatsapp_numbers_with_and_without_the_ninth_digit_are_one_person(
    api: Api,
) -> None:
    wa = connect_whatsapp(api)
    known = await api.post("/v1/contacts", {"phone": "(11) 98765-4329", "name": "Marcos Lima"})
    await deliver(api, wa, fixture_body("interactive_button_reply"))  # wa_id 551187654329
    later = text_message("wamid.NINE", "5511987654329", "Com o nove", name="Marcos")
    await deliver(api, wa, meta_bytes(later))
    received = events(api, "Message Received")
    assert len(received) == 2
    assert {str(e.contact_id) for e in received} == {known.json()["id"]}
    assert [e.source for e in events(api, "Contact Created")] == ["api"]
    assert len(events(api, "Conversation Opened")) == 1


async def test_whatsapp_foreign_senders_keep_their_own_international_numbers(api: Api) -> None:
    wa = connect_whatsapp(api)
    peru = text_message("wamid.PERU", "51987654321", "Hola", name="Lucía Quispe")
    singapore = text_message("wamid.SG", "6591234567", "Hello", name="Wei Ling")
    for body in (peru, singapore):
        assert (await deliver(api, wa, meta_bytes(body))).json()["status"] == "processed"
    received = {e.properties["wa_message_id"]: e for e in events(api, "Message Received")}
    phones = {}
    for wamid, event in received.items():
        contact = api.ledger.get_contact(api.account.id, event.contact_id)
        assert contact is not None
        phones[wamid] = (contact.phone, event.properties["phone"])
    assert phones == {
        "wamid.PERU": ("+51987654321", "+51987654321"),
        "wamid.SG": ("+6591234567", "+6591234567"),
    }
    # A Porto Alegre mobile with the same digits is someone else.
    porto_alegre = await api.post("/v1/contacts", {"phone": "+55 51 98765-4321"})
    assert porto_alegre.status_code == 201, porto_alegre.text
    assert porto_alegre.json()["phone"] == "+5551987654321"
    assert porto_alegre.json()["id"] != str(received["wamid.PERU"].contact_id)
    assert len(events(api, "Contact Created")) == 3


async def test_whatsapp_user_hiding_their_number_is_kept_by_the_business_scoped_id(
    api: Api,
) -> None:
    wa = connect_whatsapp(api)
    await deliver(api, wa, fixture_body("user_id_only"))
    [first] = events(api, "Message Received")
    contact = api.ledger.get_contact(api.account.id, first.contact_id)
    assert contact is not None
    assert (contact.phone, contact.name) == (None, "Bia")
    assert contact.external_id == "whatsapp:user:BR.1a2b3c4d5e6f7a8b9c0d"
    # The same user later shows a number: still the same person, no second contact.
    payload = text_message("wamid.SHOWN", "5521912345678", "Agora com número", name="Bia")
    value = payload["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["user_id"] = "BR.1a2b3c4d5e6f7a8b9c0d"
    value["messages"][0]["from_user_id"] = "BR.1a2b3c4d5e6f7a8b9c0d"
    await deliver(api, wa, meta_bytes(payload))
    assert {e.contact_id for e in events(api, "Message Received")} == {first.contact_id}
    assert len(events(api, "Contact Created")) == 1


BIA = "BR.1a2b3c4d5e6f7a8b9c0d"  # the user id of the user_id_only fixture


def _from_user(body: dict[str, Any], user_id: str) -> dict[str, Any]:
    """`body`'s message and contact, also carrying Meta's user id."""
    value = body["entry"][0]["changes"][0]["value"]
    value["contacts"][0]["user_id"] = value["messages"][0]["from_user_id"] = user_id
    return body


async def test_whatsapp_user_first_seen_without_a_number_gains_it_once_meta_shows_it(
    api: Api,
) -> None:
    wa = connect_whatsapp(api)
    await deliver(api, wa, fixture_body("user_id_only"))
    shown = text_message("wamid.SHOWN", "5521912345678", "Agora com número", name="Bia")
    await deliver(api, wa, meta_bytes(_from_user(shown, BIA)))

    [first, _] = events(api, "Message Received")
    contact = api.ledger.get_contact(api.account.id, first.contact_id)
    assert contact is not None
    assert (contact.phone, contact.name) == ("+5521912345678", "Bia")  # automations reach her
    assert contact.external_id == f"whatsapp:user:{BIA}"
    [updated] = events(api, "Contact Updated")
    assert (updated.contact_id, updated.source) == (contact.id, "whatsapp")
    assert updated.properties == {"phone": "+5521912345678", "changed": ["phone"]}
    # a later number or profile name does not replace what she has
    moved = text_message("wamid.MOVED", "5521987650000", "Número novo", name="Beatriz")
    await deliver(api, wa, meta_bytes(_from_user(moved, BIA)))
    assert api.ledger.get_contact(api.account.id, contact.id) == contact
    assert len(events(api, "Contact Updated")) == 1
    assert {e.contact_id for e in events(api, "Message Received")} == {contact.id}


async def test_whatsapp_contact_found_by_phone_gains_the_profile_name_it_lacks(
    api: Api,
) -> None:
    wa = connect_whatsapp(api)
    nameless = (await api.post("/v1/contacts", {"phone": "+55 11 98765-4321"})).json()["id"]
    named = await api.post("/v1/contacts", {"phone": "+55 11 91234-5678", "name": "Rui Costa"})
    await deliver(api, wa, fixture_body("text_message"))  # "Conceição Araújo", 5511987654321
    await deliver(api, wa, meta_bytes(text_message("wamid.RUI", "5511912345678", "Oi", name="Rui")))

    received = {e.properties["wa_message_id"]: str(e.contact_id)
                for e in events(api, "Message Received")}  # fmt: skip
    assert received == {TEXT: nameless, "wamid.RUI": named.json()["id"]}
    names = [api.ledger.get_contact(api.account.id, c) for c in (nameless, named.json()["id"])]
    assert [c.name for c in names if c is not None] == ["Conceição Araújo", "Rui Costa"]
    [updated] = events(api, "Contact Updated")  # a name the contact has stays
    assert (str(updated.contact_id), updated.source) == (nameless, "whatsapp")
    assert updated.properties == {"name": "Conceição Araújo", "changed": ["name"]}
    assert [e.source for e in events(api, "Contact Created")] == ["api", "api"]


async def test_whatsapp_user_gains_no_phone_another_contact_has(api: Api) -> None:
    wa = connect_whatsapp(api)
    hidden = json.loads(fixture_body("user_id_only"))
    del hidden["entry"][0]["changes"][0]["value"]["contacts"][0]["profile"]  # and no name
    await deliver(api, wa, meta_bytes(hidden))
    other = await api.post("/v1/contacts", {"phone": "+55 21 91234-5678", "name": "Beatriz"})
    shown = text_message("wamid.SHOWN", "5521912345678", "Agora com número", name="Bia")
    await deliver(api, wa, meta_bytes(_from_user(shown, BIA)))

    received = events(api, "Message Received")
    assert len({e.contact_id for e in received}) == 1  # still the user id's contact
    contact = api.ledger.get_contact(api.account.id, received[0].contact_id)
    assert contact is not None
    assert (contact.phone, contact.name) == (None, "Bia")  # the number is the other's
    assert str(contact.id) != other.json()["id"]
    [updated] = events(api, "Contact Updated")
    assert (updated.contact_id, updated.properties) == (
        contact.id, {"name": "Bia", "changed": ["name"]}
    )  # fmt: skip
    again = api.ledger.get_contact(api.account.id, other.json()["id"])
    assert again is not None
    assert (again.phone, again.name) == ("+5521912345678", "Beatriz")


def _message_costs(api: Api, wa: Integration, body: dict[str, Any]) -> list[str]:
    """The statements the processing of one delivery sends, once it is kept (`statements`)."""
    with one_connection(api) as ledger:
        kept = webhooks.store_of(ledger).save_delivery(
            replace(receive(ledger, wa, b"{}").delivery, id=uuid4(), delivery_id=str(uuid4()),
                    body=meta_bytes(body), status="received")
        )[0]  # fmt: skip
        with statements(ledger) as sent:
            webhooks.process(ledger, wa, kept)
    return sent


def _reads_before_writing(sent: list[str]) -> int:
    """The round trips that read before a delivery's first write: SQLite's reads are BEGIN …
    COMMIT blocks (a write begins IMMEDIATE), PostgreSQL's single statements (a write
    begins with BEGIN)."""
    if "BEGIN IMMEDIATE" in sent:
        return sent[: sent.index("BEGIN IMMEDIATE")].count("BEGIN")
    return sent.index("BEGIN")


async def test_whatsapp_a_known_users_message_reads_its_contact_once(api: Api) -> None:
    """A message from a user Meta names by user id, whose contact lacks nothing: the user's
    contact is one read (it was two: the user id, then the contact), and nothing is written
    for the contact."""
    wa = connect_whatsapp(api)
    first = text_message("wamid.FIRST", "5521912345678", "Oi", name="Bia")
    receive(api.ledger, wa, meta_bytes(_from_user(first, BIA)))
    again = _from_user(text_message("wamid.AGAIN", "5521912345678", "De novo", name="Bia"), BIA)

    sent = _message_costs(api, wa, again)

    assert _reads_before_writing(sent) == 1
    assert "ROLLBACK" not in sent
    assert [e.properties["wa_message_id"] for e in events(api, "Message Received")] == [
        "wamid.FIRST",
        "wamid.AGAIN",
    ]


async def test_whatsapp_a_known_users_contact_gaining_its_phone_is_read_once(api: Api) -> None:
    """A message from a user first seen with the number hidden, now showing it: the
    contact read with the user id is the one the phone is given to, not read again before
    the write (it was: the user id with its contact, then the contact)."""
    wa = connect_whatsapp(api)
    receive(api.ledger, wa, fixture_body("user_id_only"))
    shown = text_message("wamid.SHOWN", "5521912345678", "Agora com número", name="Bia")

    sent = _message_costs(api, wa, _from_user(shown, BIA))

    assert _reads_before_writing(sent) == 1
    [updated] = events(api, "Contact Updated")
    assert updated.properties["phone"] == "+5521912345678"
    [first, second] = events(api, "Message Received")
    assert first.contact_id == second.contact_id == updated.contact_id


async def test_whatsapp_a_known_phones_message_finds_its_contact_in_one_read(api: Api) -> None:
    """A message from a contact known by phone alone, which lacks nothing: its contact is one
    read and no write transaction (it was a read of the account, then a write transaction
    taking the writer's lock); the message's write and the delivery's are the only ones."""
    wa = connect_whatsapp(api)
    receive(api.ledger, wa, meta_bytes(text_message("wamid.FIRST", "5521912345678", "Oi",
                                                    name="Bia")))  # fmt: skip
    again = text_message("wamid.AGAIN", "5521912345678", "De novo", name="Bia")

    sent = _message_costs(api, wa, again)

    assert _reads_before_writing(sent) == 1
    if "BEGIN IMMEDIATE" in sent:  # SQLite: the message's write, the delivery's (were 3)
        assert sent.count("BEGIN IMMEDIATE") == 2
    else:  # PostgreSQL: the contact, the message's transaction, the delivery (were 10)
        assert sent == ["Bind", "BEGIN", "Bind", "Bind", "COMMIT", "Bind"]
    [contact] = {e.contact_id for e in events(api, "Message Received")}
    assert [e.contact_id for e in events(api, "Contact Created")] == [contact]


async def test_whatsapp_a_user_whose_phone_is_anothers_costs_no_failed_write(api: Api) -> None:
    """The phone Meta shows for a user id's contact is another contact's: no write is tried
    for it (it would fail, again on every message), and the contact keeps its own."""
    wa = connect_whatsapp(api)
    receive(api.ledger, wa, fixture_body("user_id_only"))  # Bia, her number hidden
    await api.post("/v1/contacts", {"phone": "+55 21 91234-5678", "name": "Beatriz"})
    shown = _from_user(text_message("wamid.SHOWN", "5521912345678", "Oi", name="Bia"), BIA)

    sent = _message_costs(api, wa, shown)

    assert "ROLLBACK" not in sent  # no write begun to fail
    assert _reads_before_writing(sent) == 1
    received = events(api, "Message Received")
    contact = api.ledger.get_contact(api.account.id, received[-1].contact_id)
    assert contact is not None
    assert (contact.phone, contact.name) == (None, "Bia")


async def test_whatsapp_redelivery_records_nothing_twice(api: Api) -> None:
    wa = connect_whatsapp(api)
    body = fixture_body("text_message")
    first = await deliver(api, wa, body)
    again = await deliver(api, wa, body)
    assert (first.json()["status"], again.json()["status"]) == ("processed", "duplicate")
    assert first.json()["delivery_id"] == again.json()["delivery_id"]
    assert count(api.url, "webhook_deliveries") == 1
    metrics = sorted(e.metric_name for e in events(api))
    assert metrics == ["Contact Created", "Conversation Opened", "Message Received"]
    # `sinal webhooks replay` of a processed delivery: duplicates only.
    assert webhooks.replay(api.ledger, ("processed",)) == {"processed": 1}
    assert sorted(e.metric_name for e in events(api)) == metrics
    assert count(api.url, "conversations") == 1


async def test_whatsapp_message_resent_after_its_conversation_closed_opens_none(
    api: Api,
) -> None:
    wa = connect_whatsapp(api)
    await deliver(api, wa, fixture_body("text_message"))
    [conversation] = (await api.client.get("/v1/conversations")).json()["data"]
    closed = await api.client.post(f"/v1/conversations/{conversation['id']}/close")
    assert closed.json()["status"] == "closed"
    # Meta sends the same message again inside another batch (other bytes, other digest).
    payload = json.loads(fixture_body("text_message"))
    payload["entry"][0]["changes"][0]["value"]["messages"].append(
        text_message("wamid.NEXT", "5511987654321", "Oi de novo", timestamp=1715370000)[
            "entry"][0]["changes"][0]["value"]["messages"][0]
    )  # fmt: skip
    answer = await deliver(api, wa, meta_bytes(payload))
    assert answer.json()["status"] == "processed"
    assert len(events(api, "Message Received")) == 2
    opened = events(api, "Conversation Opened")
    assert [e.properties["opened_by_message_id"] for e in opened] == [TEXT, "wamid.NEXT"]
    listing = (await api.client.get("/v1/conversations", params={"status": "open"})).json()
    assert len(listing["data"]) == 1


# --- statuses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "metric", "wamid"),
    [
        ("status_delivered", "Message Delivered", SENT),
        ("status_read", "Message Read", SENT),
        ("status_failed", "Message Failed", FAILED),
    ],
)
async def test_whatsapp_status_of_an_unknown_message_is_recorded_once_after_the_grace(
    api: Api, fixture: str, metric: str, wamid: str
) -> None:
    wa = connect_whatsapp(api)
    raw = json.loads(fixture_body(fixture))["entry"][0]["changes"][0]["value"]["statuses"][0]
    answer = (await deliver(api, wa, fixture_body(fixture))).json()
    # sinal has no record of this wamid: its send may still be committing, so it waits
    assert answer["status"] == "deferred"
    assert wamid in answer["reason"]
    assert events(api) == []  # not even a contact for the recipient, yet
    due = due_at(api)
    assert due == deferred(api)[0].received_at + timedelta(seconds=60)
    redelivered = await deliver(api, wa, fixture_body(fixture))
    assert redelivered.json()["status"] == "deferred"  # not processed early
    assert webhooks.process_deferred(api.ledger, due - timedelta(seconds=1)) == 0
    assert events(api) == []

    assert webhooks.process_deferred(api.ledger, due) == 1
    assert webhooks.process_deferred(api.ledger, due + timedelta(days=1)) == 0
    assert (await deliver(api, wa, fixture_body(fixture))).json()["status"] == "duplicate"
    [(status, reason)] = sql(api.url, "SELECT status, reason FROM webhook_deliveries")
    assert (status, reason) == ("processed", None)
    [event] = events(api, metric)
    assert event.unique_event_id == f"whatsapp:message_{raw['status']}:{wamid}"
    assert event.occurred_at == _at(int(raw["timestamp"]))
    assert event.properties["wa_message_id"] == wamid
    row = messaging_store(api.ledger).get_message_status(api.account.id, wamid)
    assert row is not None
    assert (row.status, row.contact_id, row.is_template) == (raw["status"], event.contact_id, False)
    contact = api.ledger.get_contact(api.account.id, event.contact_id)
    assert contact is not None
    assert contact.phone == "+" + raw["recipient_id"]  # unknown message: the recipient


async def test_whatsapp_sent_status_is_no_event_but_moves_the_status(api: Api) -> None:
    wa = connect_whatsapp(api, status_grace_seconds=0)  # records unknown messages at once
    await deliver(api, wa, fixture_body("status_sent"))
    assert [e.metric_name for e in events(api)] == ["Contact Created"]
    row = messaging_store(api.ledger).get_message_status(api.account.id, SENT)
    assert row is not None
    assert (row.status, row.status_at) == ("sent", _at(1715362200))


async def test_whatsapp_failed_status_keeps_metas_error(api: Api) -> None:
    wa = connect_whatsapp(api, status_grace_seconds=0)
    await deliver(api, wa, fixture_body("status_failed"))
    props = _props(api, "Message Failed")
    assert (props["error_code"], props["error_title"]) == (131026, "Message undeliverable")
    assert props["error_details"] == "Message Undeliverable."
    row = messaging_store(api.ledger).get_message_status(api.account.id, FAILED)
    assert row is not None
    assert (row.status, row.error_code, row.error_title) == (
        "failed", 131026, "Message undeliverable"
    )  # fmt: skip


def _sent_by_automation(api: Api, wamid: str, metric: str, **identity: str) -> Any:
    """A contact and the send event an automation step records for `wamid`."""
    contact = api.ledger.create_contact(api.account.id, **identity)
    result = api.ledger.emit_event(
        account_id=api.account.id, contact_id=contact.id, metric_name=metric,
        source="automation", source_id=f"{uuid4()}:0", entity_type="message", entity_id=wamid,
        automation_execution_id=uuid4(), occurred_at=_at(1715362100),
        properties={"wa_message_id": wamid, "template_name": "pedido_enviado"},
    )  # fmt: skip
    assert result.status == "created"
    return contact


async def test_whatsapp_statuses_out_of_order_only_move_forward(api: Api) -> None:
    wa = connect_whatsapp(api)
    contact = _sent_by_automation(api, SENT, "Template Sent", email="ana@example.com")
    other = _sent_by_automation(api, OTHER, "Message Sent", email="bia@example.com")
    # read before delivered (SENT); failed, then an earlier delivered (OTHER)
    answer = await deliver(api, wa, fixture_body("statuses_out_of_order"))
    assert answer.json()["status"] == "processed", answer.text

    got = {(e.entity_id, e.metric_name): e for e in events(api) if e.source == "whatsapp"}
    assert set(got) == {
        (SENT, "Template Read"), (SENT, "Template Delivered"),
        (OTHER, "Message Failed"), (OTHER, "Message Delivered"),
    }  # fmt: skip
    assert got[(SENT, "Template Read")].occurred_at == _at(1715362290)
    assert got[(SENT, "Template Delivered")].occurred_at == _at(1715362203)
    assert got[(OTHER, "Message Delivered")].occurred_at == _at(1715362450)
    assert {got[(SENT, m)].contact_id for m in ("Template Read", "Template Delivered")} == {
        contact.id
    }
    assert got[(OTHER, "Message Failed")].contact_id == other.id
    assert count(api.url, "contacts") == 2  # the recipient's number made no new contact

    store = messaging_store(api.ledger)
    template = store.get_message_status(api.account.id, SENT)
    failed = store.get_message_status(api.account.id, OTHER)
    assert template is not None
    assert failed is not None
    assert (template.status, template.is_template, template.status_at) == (
        "read", True, _at(1715362290)
    )  # fmt: skip
    assert (failed.status, failed.error_code, failed.error_title) == (
        "failed", 131047, "Re-engagement message"
    )  # fmt: skip

    # Late and repeated statuses, in deliveries of their own: nothing moves back.
    for late in ("status_delivered", "status_sent", "status_read"):
        assert (await deliver(api, wa, fixture_body(late))).status_code == 200
    late_other = statuses((OTHER, "delivered", 1715362450), (OTHER, "read", 1715362600))
    await deliver(api, wa, meta_bytes(late_other))
    assert store.get_message_status(api.account.id, SENT) == template
    after = store.get_message_status(api.account.id, OTHER)
    assert after is not None
    assert (after.status, after.error_code) == ("failed", 131047)
    whatsapp = [e for e in events(api) if e.source == "whatsapp"]
    assert len(whatsapp) == 5  # only OTHER's read is new: every status once per wamid
    assert {(e.entity_id, e.metric_name) for e in whatsapp} - set(got) == {(OTHER, "Message Read")}


async def _template_automation(api: Api) -> UUID:
    """An automation sending template pedido_enviado on Order Fulfilled, and that event for
    Caio (+55 21 97654-3210); his contact id."""
    automation = await api.post("/v1/automations", {
        "name": "Pedido enviado", "trigger_metric": "Order Fulfilled",
        "steps": [{"type": "send_template", "name": "pedido_enviado", "language": "pt_BR",
                   "parameters": ["{{ contact.name | first_name }}"]}],
    })  # fmt: skip
    assert automation.status_code == 201, automation.text
    order = await api.post("/v1/events", {
        "metric": "Order Fulfilled", "source": "shopify", "source_id": "5001",
        "entity_type": "order", "contact": {"phone": "+55 21 97654-3210", "name": "Caio"},
    })  # fmt: skip
    assert order.status_code == 201, order.text
    return UUID(order.json()["contact_id"])


def _dispatch(api: Api) -> None:
    settings = DispatchSettings(http_timeout=5, retry=RetryPolicy(2), allow_private_webhooks=True)
    dispatcher = Dispatcher(api.ledger, settings)
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.close()


SECOND_NUMBER = "106540352249999"  # the account's second WhatsApp number


def _to_number(number: str, body: dict[str, Any]) -> bytes:
    """`body` as Meta delivers it for business number `number`."""
    body["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] = number
    return meta_bytes(body)


async def test_whatsapp_a_reply_goes_out_from_the_number_the_contact_last_wrote_to(
    api: Api,
) -> None:
    """An account with two numbers: a WhatsApp conversation is per business number, so a
    message to the contact goes from the one it last wrote to, not from the oldest."""
    with whatsapp_server() as (wa_url, server):
        first = connect_whatsapp(api, api_base_url=wa_url)
        second = connect_whatsapp(api, api_base_url=wa_url, phone_number_id=SECOND_NUMBER)
        reply = {"name": "Resposta", "trigger_type": "message_received",
                 "steps": [{"type": "send_message", "text": "Recebido!"}]}  # fmt: skip
        assert (await api.post("/v1/automations", reply)).status_code == 201
        oi = text_message("wamid.B1", "5521912345678", "Oi", name="Bia", timestamp=1715360000)
        await deliver(api, second, _to_number(SECOND_NUMBER, oi))
        _dispatch(api)
        again = text_message("wamid.A1", "5521912345678", "Oi de novo", timestamp=1715360100)
        await deliver(api, first, meta_bytes(again))
        _dispatch(api)
        # a message to the second number written before A1, delivered late: A1 is newer
        late = text_message("wamid.B0", "5521912345678", "Antes", timestamp=1715359000)
        await deliver(api, second, _to_number(SECOND_NUMBER, late))
        _dispatch(api)
        paths = [r["path"] for r in server.requests]
    first_path, second_path = f"/{PHONE_NUMBER_ID}/messages", f"/{SECOND_NUMBER}/messages"
    assert paths == [second_path, first_path, first_path]
    sent = events(api, "Message Sent")
    assert [e.properties["phone_number_id"] for e in sent] == [
        SECOND_NUMBER, PHONE_NUMBER_ID, PHONE_NUMBER_ID]  # fmt: skip


async def test_whatsapp_a_contact_who_never_wrote_gets_the_steps_number_else_the_oldest(
    api: Api,
) -> None:
    """The step's `phone_number_id` for a contact who has written to none of the numbers,
    else the oldest connection; a step naming a number disconnected since fails, dead,
    saying so (nothing sent from another number)."""
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        second = connect_whatsapp(api, api_base_url=wa_url, phone_number_id=SECOND_NUMBER)
        for template, chosen in (("oferta_b", {"phone_number_id": SECOND_NUMBER}),
                                 ("oferta_a", {})):  # fmt: skip
            step = {"type": "send_template", "name": template, "language": "pt_BR", **chosen}
            answer = await api.post("/v1/automations", {"name": template,
                                                        "trigger_metric": "Ping",
                                                        "steps": [step]})  # fmt: skip
            assert answer.status_code == 201, answer.text
        ping = {"metric": "Ping", "source": "api", "contact": {"phone": "+55 21 91234-5678"}}
        assert (await api.post("/v1/events", {**ping, "source_id": "1"})).status_code == 201
        _dispatch(api)
        sent = {r["path"]: r["body"]["template"]["name"] for r in server.requests}
        assert sent == {f"/{SECOND_NUMBER}/messages": "oferta_b",
                        f"/{PHONE_NUMBER_ID}/messages": "oferta_a"}  # fmt: skip

        assert (await api.client.delete(f"/v1/integrations/{second.id}")).status_code == 204
        assert (await api.post("/v1/events", {**ping, "source_id": "2"})).status_code == 201
        _dispatch(api)
        later = [r["body"]["template"]["name"] for r in server.requests[2:]]
    assert later == ["oferta_a"]
    store = Automations(api.ledger).store
    [dead] = [x for x in store.list_executions(api.account.id) if x.status == "dead"]
    assert f"phone_number_id {SECOND_NUMBER} is none of the account's" in (dead.last_error or "")


async def test_whatsapp_statuses_of_a_template_an_automation_sent_reach_its_contact(
    api: Api,
) -> None:
    with whatsapp_server() as (wa_url, _server):
        wa = connect_whatsapp(api, api_base_url=wa_url)
        await _template_automation(api)
        _dispatch(api)
    [sent] = events(api, "Template Sent")
    wamid = sent.entity_id
    assert wamid is not None
    assert wamid.startswith("wamid.")
    # Meta's statuses carry only the recipient's id, here without the ninth digit.
    body = statuses((wamid, "sent", 1715362200), (wamid, "read", 1715362290),
                    (wamid, "delivered", 1715362203), recipient="552176543210")  # fmt: skip
    assert (await deliver(api, wa, meta_bytes(body))).json()["status"] == "processed"
    delivered = events(api, "Template Delivered")
    read = events(api, "Template Read")
    assert [e.contact_id for e in delivered + read] == [sent.contact_id] * 2
    assert events(api, "Message Delivered") == []
    row = messaging_store(api.ledger).get_message_status(api.account.id, wamid)
    assert row is not None
    assert (row.status, row.is_template) == ("read", True)


async def _automation(api: Api, name: str, step: dict[str, Any]) -> UUID:
    answer = await api.post("/v1/automations", {
        "name": name, "trigger_metric": "Message Delivered", "steps": [step]})  # fmt: skip
    assert answer.status_code == 201, answer.text
    return UUID(answer.json()["id"])


async def _send_on_delivery(api: Api) -> UUID:
    """Automation A (Message Delivered → send a message) and a Message Delivered of a message
    a person sent, which A runs for; A's id."""
    again = await _automation(api, "Entregue: mande outra", {"type": "send_message",
                                                              "text": "Chegou?"})  # fmt: skip
    human = await api.post("/v1/events", {
        "metric": "Message Delivered", "source": "api", "source_id": "m-1",
        "entity_type": "message", "contact": {"phone": "+55 11 98765-4321"},
    })  # fmt: skip
    assert human.status_code == 201, human.text
    return again


async def test_whatsapp_delivery_of_its_own_message_never_re_triggers_the_automation(
    api: Api,
) -> None:
    with whatsapp_server() as (wa_url, server):
        wa = connect_whatsapp(api, api_base_url=wa_url)
        other = await _automation(api, "Entregue: marque", {"type": "add_tag", "tag": "entregue"})
        again = await _send_on_delivery(api)
        _dispatch(api)
        [request] = server.bodies("/messages")  # the human-sent message's delivery: one send
        [sent] = events(api, "Message Sent")
        assert sent.entity_id == "wamid.LOCAL00000000"
        body = statuses((sent.entity_id, "delivered", 1715362203), recipient=request["to"])
        assert (await deliver(api, wa, meta_bytes(body))).json()["status"] == "processed"
        _dispatch(api)
        assert len(server.bodies("/messages")) == 1  # no second message, no loop
    [own] = [e for e in events(api, "Message Delivered") if e.source == "whatsapp"]
    assert own.properties["sent_by_automation_id"] == str(again)
    execution_id = own.properties["sent_by_automation_execution_id"]
    assert execution_id == str(sent.automation_execution_id)
    trace = (await api.client.get(f"/v1/events/{own.id}/trace")).json()["automations"]
    outcomes = {UUID(t["automation_id"]): t["outcome"] for t in trace}
    assert outcomes == {again: "own_message", other: "triggered"}
    executions = Automations(api.ledger).store.list_executions(api.account.id, event_id=own.id)
    assert [x.automation_id for x in executions] == [other]  # another automation still runs


async def test_automations_answering_each_others_deliveries_stop_at_the_chain_limit(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """Two automations on Message Delivered, each sending a message: the delivery of each
    one's message (never re-triggering it) triggers the other, for ever. Each chain of
    executions, one per delivery, runs MAX_CHAIN_DEPTH + 1 deep (depths 0 to 8); the next
    execution is recorded stopped, unrun, saying why, and the worker logs it."""
    with whatsapp_server() as (wa_url, server):
        wa = connect_whatsapp(api, api_base_url=wa_url)
        await _automation(api, "Entregue: agradeça", {"type": "send_message", "text": "Valeu!"})
        await _send_on_delivery(api)  # and a person's message's delivery: both run for it
        _outcomes, report = _meta_reports_before_answering(api, wa, echoes_callback=True)
        server.behaviour.before_answer = report  # each message's delivery, as Meta reports it
        settings = DispatchSettings(http_timeout=5, retry=RetryPolicy(2),
                                    allow_private_webhooks=True)  # fmt: skip
        dispatcher = Dispatcher(api.ledger, settings)
        try:
            rounds = 0
            while dispatcher.run_once() and rounds < 60:  # bounded: a loop never ends
                rounds += 1
        finally:
            dispatcher.close()
        sent = len(server.bodies("/messages"))

    runs = MAX_CHAIN_DEPTH + 1
    assert sent == 2 * runs
    executions = Automations(api.ledger).store.list_executions(api.account.id, limit=1000)
    assert sorted(x.status for x in executions) == ["completed"] * 2 * runs + ["stopped"] * 2
    stopped = [x for x in executions if x.status == "stopped"]
    assert [(x.last_error, x.steps) for x in stopped] == [(too_deep(runs), ())] * 2
    assert "9 executions before it each sent a message" in too_deep(runs)
    for x in stopped:
        assert f"execution {x.id} stopped: {too_deep(runs)}" in caplog.text
        event = api.ledger.get_event(api.account.id, x.event_id)
        assert event is not None
        assert event.metric_name == "Message Delivered"
        trace = (await api.client.get(f"/v1/events/{x.event_id}/trace")).json()["automations"]
        [entry] = [t for t in trace if t["automation_id"] == str(x.automation_id)]
        assert (entry["triggered"], entry["outcome"]) == (False, "chain_too_deep")
        assert entry["message"] == too_deep(runs)
        assert entry["execution"]["id"] == str(x.id)


def _meta_reports_before_answering(
    api: Api, integration: Integration, *, echoes_callback: bool
) -> tuple[list[webhooks.Received], Callable[[Any, int], None]]:
    """Make the local WhatsApp API deliver the message's sent and delivered statuses to
    sinal before it answers the send (so before the step can record anything), the way
    Meta's webhooks can outrun its API's answer; what sinal made of each delivery."""
    outcomes: list[webhooks.Received] = []

    def report(request: Any, n: int) -> None:
        wamid = f"wamid.LOCAL{n:08d}"  # what the server answers to request n
        callback = request.get("biz_opaque_callback_data") if echoes_callback else None
        body = meta_bytes(statuses((wamid, "sent", 1715362200), (wamid, "delivered", 1715362203),
                                   recipient=request["to"], callback=callback))  # fmt: skip
        described = whatsapp_delivery({}, body)
        outcomes.append(webhooks.receive(
            api.ledger, integration, topic=described.topic, delivery_id=described.delivery_id,
            headers={}, body=body,
        ))  # fmt: skip

    return outcomes, report


def _dispatch_with_statuses_first(
    api: Api, integration: Integration, server: Any
) -> list[webhooks.Received]:
    """Dispatch, Meta reporting each message's statuses (with its callback data) before
    answering its send; what sinal made of each report."""
    outcomes, report = _meta_reports_before_answering(api, integration, echoes_callback=True)
    server.behaviour.before_answer = report
    _dispatch(api)
    return outcomes


async def test_whatsapp_status_outrunning_the_send_is_a_template_status_by_its_callback_data(
    api: Api,
) -> None:
    with whatsapp_server() as (wa_url, server):
        wa = connect_whatsapp(api, api_base_url=wa_url)
        contact_id = await _template_automation(api)
        outcomes = _dispatch_with_statuses_first(api, wa, server)
        [request] = server.bodies("/messages")
    [execution] = Automations(api.ledger).store.list_executions(api.account.id)
    assert request["biz_opaque_callback_data"] == (
        f"sinal:template:{contact_id}:{execution.automation_id}:{execution.id}"
    )
    # recorded at once, before the step's Template Sent existed: no waiting needed
    assert [o.status for o in outcomes] == ["processed"]
    [delivered] = events(api, "Template Delivered")
    [sent] = events(api, "Template Sent")
    assert delivered.contact_id == sent.contact_id == contact_id
    assert delivered.entity_id == sent.entity_id == "wamid.LOCAL00000000"
    assert delivered.received_at < sent.received_at  # the status really was recorded first
    assert events(api, "Message Delivered") == []
    assert len(events(api, "Contact Created")) == 1  # the recipient's id made no new contact
    row = messaging_store(api.ledger).get_message_status(api.account.id, sent.entity_id)
    assert row is not None
    assert (row.status, row.is_template, row.contact_id) == ("delivered", True, contact_id)


async def test_whatsapp_own_message_status_outrunning_the_send_never_re_triggers_it(
    api: Api,
) -> None:
    with whatsapp_server() as (wa_url, server):
        wa = connect_whatsapp(api, api_base_url=wa_url)
        again = await _send_on_delivery(api)
        outcomes = _dispatch_with_statuses_first(api, wa, server)
        assert len(server.bodies("/messages")) == 1
    assert [o.status for o in outcomes] == ["processed"]  # by its callback data, at once
    [own] = [e for e in events(api, "Message Delivered") if e.source == "whatsapp"]
    [sent] = events(api, "Message Sent")
    assert own.received_at < sent.received_at  # the status really was recorded first
    assert own.properties["sent_by_automation_id"] == str(again)
    assert own.properties["sent_by_automation_execution_id"] == str(sent.automation_execution_id)


async def test_whatsapp_status_outrunning_the_send_waits_for_its_template_sent_event(
    api: Api,
) -> None:
    with whatsapp_server() as (wa_url, server):
        wa = connect_whatsapp(api, api_base_url=wa_url)
        contact_id = await _template_automation(api)
        # Meta leaves the callback data out (or the message was sent before sinal sent it)
        outcomes, report = _meta_reports_before_answering(api, wa, echoes_callback=False)
        server.behaviour.before_answer = report
        _dispatch(api)
    assert [o.status for o in outcomes] == ["deferred"]
    [sent] = events(api, "Template Sent")  # the step's record, committed after the status
    assert [e.metric_name for e in events(api) if e.source == "whatsapp"] == []

    assert webhooks.process_deferred(api.ledger, due_at(api)) == 1
    [delivered] = events(api, "Template Delivered")
    assert (delivered.contact_id, delivered.entity_id) == (contact_id, sent.entity_id)
    assert delivered.occurred_at == _at(1715362203)  # its own time, not the pass's
    assert events(api, "Message Delivered") == []
    assert len(events(api, "Contact Created")) == 1
    row = messaging_store(api.ledger).get_message_status(api.account.id, "wamid.LOCAL00000000")
    assert row is not None
    assert (row.status, row.is_template, row.contact_id) == ("delivered", True, contact_id)
    # Meta redelivers the same statuses: duplicates, never second events
    again = statuses(("wamid.LOCAL00000000", "delivered", 1715362203), recipient="5521976543210")
    assert (await deliver(api, wa, meta_bytes(again))).json()["status"] == "processed"
    assert len(events(api, "Template Delivered")) == 1


async def test_whatsapp_messages_are_not_delayed_by_statuses_that_wait(api: Api) -> None:
    wa = connect_whatsapp(api)
    payload = text_message("wamid.IN1", "5511987654321", "Chegou?", name="Ana")
    value = payload["entry"][0]["changes"][0]["value"]
    value["statuses"] = statuses(("wamid.OUT1", "read", 1715362290))["entry"][0]["changes"][0][
        "value"]["statuses"]  # fmt: skip
    answer = await deliver(api, wa, meta_bytes(payload))
    assert answer.json()["status"] == "deferred"
    assert sorted(e.metric_name for e in events(api)) == [
        "Contact Created", "Conversation Opened", "Message Received"
    ]  # fmt: skip

    assert webhooks.process_deferred(api.ledger, due_at(api)) == 1
    [read] = events(api, "Message Read")
    [received] = events(api, "Message Received")
    assert read.contact_id == received.contact_id
    assert len(events(api, "Conversation Opened")) == 1
    assert count(api.url, "contacts") == 1


async def test_whatsapp_callback_data_naming_another_accounts_contact_is_not_trusted(
    api: Api,
) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = api.ledger.create_contact(other.id, phone="+55 11 91234-5678")
    wa = connect_whatsapp(api)
    body = statuses(("wamid.X1", "delivered", 1715362203),
                    callback=f"sinal:template:{theirs.id}")  # fmt: skip
    assert (await deliver(api, wa, meta_bytes(body))).json()["status"] == "deferred"
    assert webhooks.process_deferred(api.ledger, due_at(api)) == 1
    [delivered] = events(api, "Message Delivered")  # the recipient, as for any unknown one
    assert delivered.contact_id != theirs.id
    assert events(api, account_id=other.id) == []


async def test_whatsapp_the_worker_records_a_deferred_status_on_its_own(api: Api) -> None:
    wa = connect_whatsapp(api)
    assert (await deliver(api, wa, fixture_body("status_read"))).json()["status"] == "deferred"
    clock = DrivenClock()
    settings = Settings(database_url=api.url, housekeeping_interval=1,
                        worker_poll_interval=0.05)  # fmt: skip
    worker, stop = start_worker_thread(Ledger(api.ledger.store, clock=clock), settings)
    try:
        await asyncio.sleep(1.5)  # passes before the grace ends record nothing
        assert events(api, "Message Read") == []
        clock.advance(timedelta(seconds=61))
        await settle(lambda: events(api, "Message Read"))
        await asyncio.sleep(1.2)  # and another pass: still one
    finally:
        stop.set()
        worker.join(timeout=15)
    assert not worker.is_alive()
    assert len(events(api, "Message Read")) == 1
    [(status,)] = sql(api.url, "SELECT status FROM webhook_deliveries")
    assert status == "processed"


async def test_whatsapp_deferred_deliveries_are_drained_a_page_at_a_time(api: Api) -> None:
    wa = connect_whatsapp(api)
    for i in range(7):
        body = meta_bytes(statuses((f"wamid.D{i}", "delivered", 1715362200 + i)))
        assert (await deliver(api, wa, body)).json()["status"] == "deferred"
    due = max(d.due_at for d in deferred(api) if d.due_at is not None)

    assert webhooks.process_deferred(api.ledger, due, limit=3, max_rounds=2) == 6
    assert len(deferred(api)) == 1  # the rest waits for the next call
    assert webhooks.process_deferred(api.ledger, due, limit=3) == 1
    assert deferred(api) == []
    assert len(events(api, "Message Delivered")) == 7


async def test_whatsapp_deferred_delivery_a_crash_interrupted_is_taken_again(api: Api) -> None:
    wa = connect_whatsapp(api)
    await deliver(api, wa, fixture_body("status_read"))
    due = due_at(api)
    store = webhooks.store_of(api.ledger)
    assert len(store.claim_deferred(due, 10, 30.0)) == 1  # ...and that process dies
    assert webhooks.process_deferred(api.ledger, due) == 0  # still claimed
    assert webhooks.process_deferred(api.ledger, due + timedelta(seconds=30)) == 1
    assert len(events(api, "Message Read")) == 1


@pytest.mark.parametrize("grace", [-1, 3601, 1.5, True, "60"])
async def test_whatsapp_status_grace_must_be_whole_seconds_up_to_an_hour(
    api: Api, grace: Any
) -> None:
    answer = await api.post("/v1/integrations", {
        "kind": "whatsapp", "secret": APP_SECRET, "phone_number_id": PHONE_NUMBER_ID,
        "access_token": "EAAG-test", "status_grace_seconds": grace,
    })  # fmt: skip
    assert answer.status_code == 422
    assert [e["field"] for e in answer.json()["errors"]] == ["status_grace_seconds"]


async def test_whatsapp_concurrent_messages_of_a_new_contact_open_one_conversation(
    api: Api,
) -> None:
    wa = connect_whatsapp(api)
    bodies = [meta_bytes(text_message(f"wamid.C{i}", "5511912345678", f"msg {i}", name="Rui",
                                      timestamp=1715360000 + i)) for i in range(8)]  # fmt: skip
    answers = await asyncio.gather(*(deliver(api, wa, b) for b in bodies))
    assert {a.json()["status"] for a in answers} == {"processed"}
    assert len(events(api, "Message Received")) == 8
    assert len(events(api, "Contact Created")) == 1
    assert len(events(api, "Conversation Opened")) == 1
    assert count(api.url, "conversations") == 1


# --- what cannot be mapped ---------------------------------------------------------------


async def test_whatsapp_unmappable_body_is_kept_with_its_reason(api: Api) -> None:
    wa = connect_whatsapp(api)
    answer = await deliver(api, wa, b'{"object":"page","entry":[]}')
    assert answer.status_code == 200
    assert answer.json()["status"] == "unmappable"
    assert answer.json()["reason"].startswith("unexpected_object")
    [(status, reason)] = sql(api.url, "SELECT status, reason FROM webhook_deliveries")
    assert status == "unmappable"
    assert reason.startswith("unexpected_object")


async def test_whatsapp_bad_part_is_kept_and_the_rest_recorded(api: Api) -> None:
    wa = connect_whatsapp(api)
    payload = text_message("wamid.GOOD", "5511987654321", "bom")
    bad = dict(payload["entry"][0]["changes"][0]["value"]["messages"][0], id="wamid.BAD",
               timestamp="yesterday")  # fmt: skip
    payload["entry"][0]["changes"][0]["value"]["messages"].insert(0, bad)
    answer = await deliver(api, wa, meta_bytes(payload))
    assert answer.json()["status"] == "unmappable"
    assert "message wamid.BAD: invalid_timestamp" in answer.json()["reason"]
    assert [e.entity_id for e in events(api, "Message Received")] == ["wamid.GOOD"]


async def test_whatsapp_another_numbers_traffic_is_not_recorded(api: Api) -> None:
    wa = connect_whatsapp(api, phone_number_id="999999999999999")
    answer = await deliver(api, wa, fixture_body("text_message"))
    assert answer.json()["status"] == "unmappable"
    assert f"phone_number_mismatch ({PHONE_NUMBER_ID})" in answer.json()["reason"]
    assert events(api) == []


def _changes(*bodies: dict[str, Any]) -> bytes:
    """One delivery holding the changes of `bodies`, as Meta batches a WABA's numbers."""
    first, *rest = bodies
    for body in rest:
        first["entry"][0]["changes"] += body["entry"][0]["changes"]
    return meta_bytes(first)


async def test_whatsapp_a_shared_apps_delivery_is_recorded_for_each_numbers_connection(
    api: Api,
) -> None:
    """The Meta app's one callback URL is the first connection's: each change (messages and
    statuses) is recorded for the connection whose phone_number_id it names."""
    first = connect_whatsapp(api)
    second = connect_whatsapp(api, phone_number_id=SECOND_NUMBER)
    to_first = text_message("wamid.A1", "5511987654321", "Oi A", name="Ana")
    to_second = _to_number(SECOND_NUMBER, text_message("wamid.B1", "5521912345678", "Oi B"))
    answer = await deliver(api, first, _changes(to_first, json.loads(to_second)))
    assert answer.json() == {**answer.json(), "status": "processed", "reason": None}
    received = {e.entity_id: e for e in events(api, "Message Received")}
    assert received["wamid.A1"].integration_id == first.id
    assert received["wamid.B1"].integration_id == second.id
    assert received["wamid.B1"].properties["phone_number_id"] == SECOND_NUMBER
    # a status of a message sent from the second number, delivered at the same URL
    bia = received["wamid.B1"].contact_id
    callback = sent_callback_data(bia, is_template=False)
    status = statuses(("wamid.OUT_B", "delivered", 1715360100), recipient="5521912345678",
                      callback=callback)  # fmt: skip
    answer = await deliver(api, first, _to_number(SECOND_NUMBER, status))
    assert answer.json()["status"] == "processed"
    [delivered] = events(api, "Message Delivered")
    assert (delivered.integration_id, delivered.contact_id) == (second.id, bia)


async def test_whatsapp_a_number_of_another_meta_app_is_not_recorded_at_this_apps_url(
    api: Api,
) -> None:
    """Connections of one Meta app share its secret: a delivery signed with the first's
    never writes as a connection with another secret, even of the same account."""
    first = connect_whatsapp(api)
    connect_whatsapp(api, phone_number_id=SECOND_NUMBER, secret="another-apps-secret")
    body = _to_number(SECOND_NUMBER, text_message("wamid.B1", "5521912345678", "Oi"))
    answer = await deliver(api, first, body)
    assert answer.json()["status"] == "unmappable"
    assert f"message wamid.B1: app_secret_mismatch ({SECOND_NUMBER}" in answer.json()["reason"]
    assert events(api) == []


async def test_whatsapp_a_number_of_another_account_is_not_recorded(api: Api) -> None:
    """A number only another account connected is one no connection has: kept, not routed."""
    ours = connect_whatsapp(api)
    other = api.ledger.create_account("Outra Loja")
    connect_whatsapp(api, account_id=other.id, phone_number_id=SECOND_NUMBER)
    body = _to_number(SECOND_NUMBER, text_message("wamid.B1", "5521912345678", "Oi"))
    answer = await deliver(api, ours, body)
    assert answer.json()["status"] == "unmappable"
    assert f"phone_number_mismatch ({SECOND_NUMBER})" in answer.json()["reason"]
    assert events(api) == events(api, account_id=other.id) == []


async def test_whatsapp_a_number_connected_after_its_delivery_is_recorded_on_replay(
    api: Api,
) -> None:
    first = connect_whatsapp(api)
    body = _to_number(SECOND_NUMBER, text_message("wamid.B1", "5521912345678", "Oi"))
    assert (await deliver(api, first, body)).json()["status"] == "unmappable"
    second = connect_whatsapp(api, phone_number_id=SECOND_NUMBER)
    assert webhooks.replay(api.ledger) == {"processed": 1}
    [received] = events(api, "Message Received")
    assert received.integration_id == second.id


async def test_whatsapp_template_review_changes_are_ignored(api: Api) -> None:
    wa = connect_whatsapp(api)
    body = {"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [
        {"field": "message_template_status_update",
         "value": {"event": "APPROVED", "message_template_name": "pedido_enviado"}}]}]}  # fmt: skip
    answer = await deliver(api, wa, meta_bytes(body))
    assert answer.json()["status"] == "processed"
    assert events(api) == []


# --- tenants -----------------------------------------------------------------------------


async def test_whatsapp_delivery_is_recorded_in_its_integrations_account_only(api: Api) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = connect_whatsapp(api, account_id=other.id)
    ours = connect_whatsapp(api)
    await deliver(api, ours, fixture_body("text_message"))
    assert len(events(api, "Message Received")) == 1
    assert events(api, account_id=other.id) == []
    await deliver(api, theirs, fixture_body("image_caption"))
    [theirs_event] = events(api, "Message Received", account_id=other.id)
    assert theirs_event.properties["message_type"] == "image"
    assert len(events(api, "Message Received")) == 1
