"""WhatsApp Cloud API webhooks: inbound messages, statuses, ordering, the handshake."""

from __future__ import annotations

import copy
import functools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest

from sinal.catalog import (
    METRIC_MESSAGE_DELIVERED,
    METRIC_MESSAGE_FAILED,
    METRIC_MESSAGE_READ,
    METRIC_MESSAGE_RECEIVED,
    METRIC_TEMPLATE_DELIVERED,
    METRIC_TEMPLATE_READ,
)
from sinal.events import prepare
from sinal.integrations import (
    UnmappablePayload,
    advance_status,
    map_whatsapp,
    parse_body,
    status_event,
    status_metric,
    verify_challenge,
    whatsapp_delivery,
)
from sinal.integrations.base import ContactRef, Mapped
from sinal.integrations.whatsapp import (
    StatusUpdate,
    WhatsAppBatch,
    read_callback_data,
    sent_callback_data,
    status_rank,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "whatsapp"
ACCOUNT = "0192f5d0-1a2b-7c3d-8e4f-000000000001"
CONTACT = "0192f5d0-1a2b-7c3d-8e4f-000000000002"
NOW = datetime(2024, 6, 1, tzinfo=UTC)
PHONE_NUMBER_ID = "106540352242922"
SENT = "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEkE3QjNDMDk4RDY1RTQzMjEwRgA="
OTHER = "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEjFDMkQzRTRGNUE2QjdDOEQ5RQA="


def load(name: str) -> dict[str, Any]:
    """A fixture body, parsed the way the HTTP edge parses it."""
    return dict(parse_body((FIXTURES / f"{name}.json").read_bytes()))


def batch(name: str) -> WhatsAppBatch:
    return map_whatsapp(load(name))


def message(name: str) -> Mapped:
    (event,) = batch(name).messages
    return event


def value(payload: dict[str, Any]) -> dict[str, Any]:
    """The first change's value, for tests that edit a fixture."""
    found: dict[str, Any] = payload["entry"][0]["changes"][0]["value"]
    return found


# --- inbound messages --------------------------------------------------------------------

MESSAGE_TABLE: list[tuple[str, str, dict[str, Any]]] = [
    ("text_message", "text", {
        "text": "Olá! Vocês têm a camiseta azul no tamanho M? Preciso até sexta 🙏 "
                "https://lojadaana.com.br/p/camiseta"}),
    ("image_caption", "image", {
        "caption": "Essa aqui, é de algodão?", "media_id": "1482937461029384",
        "mime_type": "image/jpeg"}),
    ("interactive_button_reply", "interactive", {
        "reply_type": "button_reply", "reply_id": "confirmar_pedido_1042",
        "reply_title": "Confirmar pedido",
        "context_message_id": "wamid.HBgMNTUxMTg3NjU0MzI5FQIAERgSMDlBNjdDQ0JGRTMyNzQ3Q0E2AA=="}),
    ("interactive_list_reply", "interactive", {
        "reply_type": "list_reply", "reply_id": "tamanho_m", "reply_title": "M",
        "reply_description": "Médio (peito 100 cm)"}),
    ("template_quick_reply", "button", {
        "reply_type": "quick_reply", "reply_id": "RASTREAR_PEDIDO_1042",
        "reply_title": "Rastrear meu pedido", "payload": "RASTREAR_PEDIDO_1042",
        "context_message_id": "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEjk4RjNBMTJCQzQ1NkQ3ODlFMAA="}),
    ("reaction_added", "reaction", {
        "reaction_emoji": "❤️", "reaction_removed": False,
        "reacted_message_id": "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEkY0QjgyOTFDNDdCMDE4QUQ1RQA="}),
    ("reaction_removed", "reaction", {
        "reaction_emoji": "", "reaction_removed": True,
        "reacted_message_id": "wamid.HBgNNTUxMTk4NzY1NDMyMRUCABEYEkY0QjgyOTFDNDdCMDE4QUQ1RQA="}),
    ("location", "location", {
        "latitude": -23.5558, "longitude": -46.6622, "location_name": "Conjunto Nacional"}),
    ("user_id_only", "text", {"text": "Oi, quero saber do meu pedido"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fixture", "message_type", "expected"), MESSAGE_TABLE, ids=[r[0] for r in MESSAGE_TABLE]
)
def test_inbound_message_is_message_received(
    fixture: str, message_type: str, expected: dict[str, Any]
) -> None:
    raw = value(load(fixture))["messages"][0]
    event = message(fixture)
    assert event.metric_name == METRIC_MESSAGE_RECEIVED
    assert event.unique_event_id == f"whatsapp:message:{raw['id']}"
    assert (event.source, event.entity_type, event.entity_id) == ("whatsapp", "message", raw["id"])
    assert event.occurred_at == datetime.fromtimestamp(int(raw["timestamp"]), UTC)
    assert event.value is None
    props = event.properties
    assert props["message_type"] == message_type
    assert props["wa_message_id"] == raw["id"]
    assert props["phone_number_id"] == PHONE_NUMBER_ID
    assert props.items() >= expected.items()
    prepared = prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)
    assert prepared.unique_event_id == event.unique_event_id


def test_text_escaped_by_meta_is_decoded() -> None:
    body = (FIXTURES / "text_message.json").read_bytes()
    assert "Olá".encode() not in body  # Meta sent it as Ol\u00e1
    event = message("text_message")
    assert event.properties["text"].startswith("Olá! Vocês têm")
    assert event.contact.name == "Conceição Araújo"


def test_message_contact_is_e164_with_profile_name() -> None:
    event = message("text_message")
    assert event.contact == ContactRef(
        phone="+5511987654321", name="Conceição Araújo", wa_id="5511987654321"
    )
    assert event.properties["phone"] == "+5511987654321"


def test_wa_id_without_the_ninth_digit_is_the_same_person() -> None:
    event = message("interactive_button_reply")
    assert event.contact.wa_id == "551187654329"  # as Meta sends it: replies go to this id
    assert event.contact.phone == "+5511987654329"


@pytest.mark.parametrize(
    ("wa_id", "phone"),
    [("51987654321", "+51987654321"), ("6591234567", "+6591234567")],  # Peru, Singapore
)
def test_foreign_wa_ids_stay_international_in_messages_and_statuses(wa_id: str, phone: str) -> None:
    payload = load("text_message")
    value(payload)["contacts"][0]["wa_id"] = wa_id
    value(payload)["messages"][0]["from"] = wa_id
    assert map_whatsapp(payload).messages[0].contact.phone == phone
    del value(payload)["contacts"][0]  # the sender read from "from" alone
    assert map_whatsapp(payload).messages[0].contact.phone == phone
    status = load("status_delivered")
    value(status)["statuses"][0]["recipient_id"] = wa_id
    assert map_whatsapp(status).statuses[0].recipient.phone == phone


def test_a_user_hiding_their_number_is_identified_by_the_business_scoped_id() -> None:
    event = message("user_id_only")
    assert event.contact.phone is None
    assert event.contact.user_id == "BR.1a2b3c4d5e6f7a8b9c0d"
    assert event.contact.external_id == "whatsapp:user:BR.1a2b3c4d5e6f7a8b9c0d"
    assert event.contact.name == "Bia"
    assert "phone" not in event.properties


def test_a_user_id_beside_a_phone_does_not_replace_the_phone_identity() -> None:
    payload = load("text_message")
    value(payload)["contacts"][0]["user_id"] = "BR.99aa"
    contact = map_whatsapp(payload).messages[0].contact
    assert (contact.phone, contact.user_id, contact.external_id) == (
        "+5511987654321",
        "BR.99aa",
        None,
    )


def test_a_reaction_with_an_empty_emoji_is_a_removal() -> None:
    payload = load("reaction_added")
    value(payload)["messages"][0]["reaction"]["emoji"] = ""
    props = map_whatsapp(payload).messages[0].properties
    assert (props["reaction_emoji"], props["reaction_removed"]) == ("", True)


def test_a_redelivered_message_maps_to_the_same_event() -> None:
    assert batch("template_quick_reply") == batch("template_quick_reply")


def test_contacts_are_listed_for_the_caller() -> None:
    (contact,) = batch("image_caption").contacts
    assert contact.phone == "+5511987654321"
    assert contact.name == "Conceição Araújo"


def test_message_without_a_contacts_entry_uses_its_sender() -> None:
    payload = load("text_message")
    value(payload)["contacts"] = None
    event = map_whatsapp(payload).messages[0]
    assert event.contact == ContactRef(phone="+5511987654321", wa_id="5511987654321")


def test_forwarded_and_ad_referral_context_is_kept() -> None:
    payload = load("text_message")
    raw = value(payload)["messages"][0]
    raw["context"] = {"forwarded": True}
    raw["referral"] = {
        "source_url": "https://fb.me/3cr4Wqqkv",
        "source_id": "120210000000000000",
        "source_type": "ad",
        "headline": "Camisetas orgânicas",
        "ctwa_clid": "ARAkLkA8rmlFeiCktEJQ-QTwRiyYHAFDLMNDBH0CD3qpjd0HR4irJ6LEkR7JwFF4XvnO2E4Nx0",
    }
    props = map_whatsapp(payload).messages[0].properties
    assert props["is_forwarded"] is True
    assert props["referral"] == {
        "source_type": "ad",
        "source_id": "120210000000000000",
        "source_url": "https://fb.me/3cr4Wqqkv",
        "ctwa_clid": raw["referral"]["ctwa_clid"],
    }


def test_an_unsupported_message_keeps_metas_error() -> None:
    payload = load("text_message")
    raw = value(payload)["messages"][0]
    del raw["text"]
    raw["type"] = "unsupported"
    raw["errors"] = [{"code": 131051, "title": "Message type unknown"}]
    props = map_whatsapp(payload).messages[0].properties
    assert (props["message_type"], props["error_code"]) == ("unsupported", 131051)


# --- one bad item does not sink its batch ------------------------------------------------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"id": None}, "missing_field"),
        ({"timestamp": None}, "missing_field"),
        ({"timestamp": "yesterday"}, "invalid_timestamp"),
        ({"timestamp": "99999999999999999999"}, "invalid_timestamp"),
        ({"from": None}, "no_sender"),
        ({"from": "not-a-number"}, "no_sender"),
        (
            {
                "type": "system",
                "system": {"body": "User changed number", "type": "user_changed_number"},
            },
            "system_message",
        ),
    ],
)
def test_a_bad_message_is_skipped_and_the_rest_mapped(change: dict[str, Any], reason: str) -> None:
    payload = load("text_message")
    good = value(payload)["messages"][0]
    bad = {**copy.deepcopy(good), "id": "wamid.bad", **change}
    value(payload)["contacts"] = []
    value(payload)["messages"] = [bad, good]
    result = map_whatsapp(payload)
    assert [m.source_id for m in result.messages] == [good["id"]]
    (skipped,) = result.skipped
    assert (skipped.kind, skipped.reason) == ("message", reason)


def test_a_bad_status_is_skipped_and_the_rest_mapped() -> None:
    payload = load("statuses_out_of_order")
    value(payload)["statuses"][1]["status"] = None
    result = map_whatsapp(payload)
    assert len(result.statuses) == 4
    assert [(s.kind, s.item_id, s.reason) for s in result.skipped] == [
        ("status", SENT, "missing_field")
    ]


def test_changes_other_than_messages_are_skipped() -> None:
    payload = load("text_message")
    payload["entry"][0]["changes"].append(
        {"field": "message_template_status_update", "value": {"event": "APPROVED"}}
    )
    result = map_whatsapp(payload)
    assert len(result.messages) == 1
    assert [(s.kind, s.reason) for s in result.skipped] == [("change", "unsupported_field")]


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"object": "page", "entry": []},
        {"object": "whatsapp_business_account"},
        {"object": "whatsapp_business_account", "entry": {"id": "1"}},
        [],
    ],
)
def test_a_malformed_envelope_is_unmappable(payload: Any) -> None:
    with pytest.raises(UnmappablePayload) as caught:
        map_whatsapp(payload)
    assert caught.value.reason in {"unexpected_object", "missing_field"}


def test_an_empty_entry_list_is_an_empty_batch() -> None:
    assert map_whatsapp({"object": "whatsapp_business_account", "entry": []}) == WhatsAppBatch()


FUZZ_FIXTURES = [
    "text_message",
    "interactive_list_reply",
    "reaction_added",
    "statuses_out_of_order",
    "status_failed",
]


@pytest.mark.parametrize("fixture", FUZZ_FIXTURES)
@pytest.mark.parametrize("junk", [None, "", "x", 0, True, [], {}, [None], 1.5])
def test_any_field_null_or_mistyped_never_crashes(fixture: str, junk: object) -> None:
    original = load(fixture)
    for path in _paths(original):
        payload = copy.deepcopy(original)
        _set(payload, path, junk)
        try:
            result = map_whatsapp(payload)
        except UnmappablePayload:
            continue
        result.status_events(lambda _wamid: False)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key and list index of the body, at any depth."""
    items = data.items() if isinstance(data, dict) else enumerate(data)
    paths: list[tuple[Any, ...]] = []
    for key, inner in items:
        paths.append((*prefix, key))
        if isinstance(inner, dict | list):
            paths.extend(_paths(inner, (*prefix, key)))
    return paths


def _set(data: Any, path: tuple[Any, ...], new: object) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = new


# --- statuses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "is_template", "metric"),
    [
        ("sent", False, None),
        ("sent", True, None),
        ("delivered", False, METRIC_MESSAGE_DELIVERED),
        ("delivered", True, METRIC_TEMPLATE_DELIVERED),
        ("read", False, METRIC_MESSAGE_READ),
        ("read", True, METRIC_TEMPLATE_READ),
        ("failed", False, METRIC_MESSAGE_FAILED),
        ("failed", True, METRIC_MESSAGE_FAILED),
        ("deleted", False, None),
        ("warning", True, None),
    ],
)
def test_status_metric(status: str, is_template: bool, metric: str | None) -> None:
    assert status_metric(status, is_template) == metric


@pytest.mark.parametrize(
    ("fixture", "metric"),
    [
        ("status_delivered", METRIC_MESSAGE_DELIVERED),
        ("status_read", METRIC_MESSAGE_READ),
        ("status_failed", METRIC_MESSAGE_FAILED),
    ],
)
def test_each_status_is_an_event_once_per_wamid(fixture: str, metric: str) -> None:
    (update,) = batch(fixture).statuses
    event = status_event(update, is_template=False)
    assert event is not None
    assert event.metric_name == metric
    assert event.unique_event_id == f"whatsapp:message_{update.status}:{update.wamid}"
    assert event.message_status == update.status
    assert event.contact.wa_id == update.recipient.wa_id
    prepare(event.to_emit(account_id=ACCOUNT, contact_id=CONTACT), NOW)


def test_sent_status_is_not_an_event() -> None:
    (update,) = batch("status_sent").statuses
    assert update.status == "sent"
    assert status_event(update, is_template=True) is None
    assert batch("status_sent").status_events(lambda _: True) == []


def test_failed_status_keeps_metas_error() -> None:
    (update,) = batch("status_failed").statuses
    assert update.error is not None
    assert (update.error.code, update.error.title) == (131026, "Message undeliverable")
    assert update.error.details == "Message Undeliverable."
    event = status_event(update, is_template=False)
    assert event is not None
    assert event.properties["error_code"] == 131026
    assert event.properties["error_title"] == "Message undeliverable"
    assert event.contact.phone == "+5521976543210"


def test_status_details_are_kept() -> None:
    (update,) = batch("status_delivered").statuses
    assert update.phone_number_id == PHONE_NUMBER_ID
    assert update.conversation_id == "4f1a2b3c5d6e7f8091a2b3c4d5e6f708"
    assert (update.conversation_category, update.pricing_category) == ("utility", "utility")
    assert update.billable is True
    assert update.occurred_at == datetime(2024, 5, 10, 17, 30, 3, tzinfo=UTC)


def test_template_statuses_use_the_template_metrics() -> None:
    templates = {SENT}
    events = batch("statuses_out_of_order").status_events(lambda wamid: wamid in templates)
    assert [(e.source_id, e.metric_name) for e in events] == [
        (SENT, METRIC_TEMPLATE_READ),
        (SENT, METRIC_TEMPLATE_DELIVERED),
        (OTHER, METRIC_MESSAGE_FAILED),
        (OTHER, METRIC_MESSAGE_DELIVERED),
    ]


def test_a_known_contact_replaces_the_bare_recipient() -> None:
    (update,) = batch("status_read").statuses
    known = ContactRef(phone="+5511987654321", external_id="shopify:customer:7203918462249")
    event = status_event(update, is_template=False, contact=known)
    assert event is not None
    assert event.contact == known


def test_statuses_out_of_order_end_at_the_furthest_one() -> None:
    result = batch("statuses_out_of_order")
    current: dict[str, str | None] = {}
    for update in result.statuses:
        current[update.wamid] = advance_status(current.get(update.wamid), update.status)
    assert current == {SENT: "read", OTHER: "failed"}  # read before delivered; failed stays


def test_statuses_out_of_order_each_keep_their_own_time_and_id() -> None:
    events = batch("statuses_out_of_order").status_events(lambda _: False)
    times = {(e.source_id, e.message_status): e.occurred_at for e in events}
    assert times[(SENT, "read")] == datetime(2024, 5, 10, 17, 31, 30, tzinfo=UTC)
    assert times[(SENT, "delivered")] == datetime(2024, 5, 10, 17, 30, 3, tzinfo=UTC)
    assert len({e.unique_event_id for e in events}) == len(events) == 4


def test_a_duplicated_status_has_the_same_id() -> None:
    (first,) = batch("status_delivered").status_events(lambda _: False)
    (again,) = batch("status_delivered").status_events(lambda _: False)
    assert first == again


@pytest.mark.parametrize(
    ("current", "new", "expected"),
    [
        (None, "sent", "sent"),
        (None, "read", "read"),
        ("sent", "delivered", "delivered"),
        ("delivered", "read", "read"),
        ("read", "delivered", "read"),
        ("read", "sent", "read"),
        ("delivered", "delivered", "delivered"),
        ("sent", "failed", "failed"),
        ("failed", "delivered", "failed"),
        ("failed", "read", "failed"),
        ("delivered", "deleted", "delivered"),
        (None, "warning", None),
    ],
)
def test_advance_status_only_moves_forward(
    current: str | None, new: str, expected: str | None
) -> None:
    assert advance_status(current, new) == expected


def test_advance_status_is_order_independent() -> None:
    import itertools

    for order in itertools.permutations(["sent", "delivered", "read"]):
        assert functools.reduce(advance_status, order, None) == "read"
    for order in itertools.permutations(["sent", "delivered", "failed"]):
        assert functools.reduce(advance_status, order, None) == "failed"


def test_status_rank() -> None:
    assert [status_rank(s) for s in ("sent", "delivered", "read", "failed", "x", None)] == [
        1,
        2,
        3,
        4,
        None,
        None,
    ]


def test_status_update_rank_and_error_without_errors() -> None:
    update = StatusUpdate(
        wamid="wamid.x",
        status="read",
        occurred_at=NOW,
        recipient=ContactRef(phone="+5511987654321"),
    )
    assert (update.rank, update.error) == (3, None)


# --- verification handshake --------------------------------------------------------------

TOKEN = "sinal-verify-8f2c1a"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"hub.mode": "subscribe", "hub.verify_token": TOKEN, "hub.challenge": "115820"}, "115820"),
        ({"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "115820"}, None),
        ({"hub.mode": "subscribe", "hub.verify_token": TOKEN.upper(), "hub.challenge": "1"}, None),
        ({"hub.mode": "unsubscribe", "hub.verify_token": TOKEN, "hub.challenge": "1"}, None),
        ({"hub.verify_token": TOKEN, "hub.challenge": "1"}, None),
        ({"hub.mode": "subscribe", "hub.challenge": "1"}, None),
        ({"hub.mode": "subscribe", "hub.verify_token": TOKEN}, None),
        ({"hub.mode": "subscribe", "hub.verify_token": TOKEN, "hub.challenge": ""}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_verify_challenge(params: dict[str, str], expected: str | None) -> None:
    assert verify_challenge(params, TOKEN) == expected


def test_verify_challenge_never_matches_an_unset_token() -> None:
    params = {"hub.mode": "subscribe", "hub.verify_token": "", "hub.challenge": "1"}
    assert verify_challenge(params, "") is None


def test_verify_challenge_with_a_non_ascii_token() -> None:
    params = {"hub.mode": "subscribe", "hub.verify_token": "çã", "hub.challenge": "42"}
    assert verify_challenge(params, "çã") == "42"
    assert verify_challenge(params, "ca") is None


# --- deliveries --------------------------------------------------------------------------


def test_whatsapp_delivery_reads_the_body() -> None:
    body = (FIXTURES / "statuses_out_of_order.json").read_bytes()
    delivery = whatsapp_delivery({"X-Hub-Signature-256": "sha256=00"}, body)
    assert delivery.provider == "whatsapp"
    assert delivery.topic == "messages"
    assert delivery.origin == "102290129340398"
    assert delivery.delivery_id.startswith("sha256:")
    assert whatsapp_delivery({}, body) == delivery


def test_whatsapp_delivery_survives_a_body_that_is_not_json() -> None:
    delivery = whatsapp_delivery({}, b"\xff\xfe")
    assert (delivery.topic, delivery.origin) == (None, None)


def test_contact_identities_are_the_ledgers_upsert_arguments() -> None:
    contact = message("text_message").contact
    assert contact.identities() == {
        "phone": "+5511987654321",
        "email": None,
        "external_id": None,
        "name": "Conceição Araújo",
    }


def test_a_location_with_mistyped_coordinates_keeps_the_rest() -> None:
    payload = load("location")
    value(payload)["messages"][0]["location"]["latitude"] = "-23.5"
    props = map_whatsapp(payload).messages[0].properties
    assert "latitude" not in props
    assert props["longitude"] == -46.6622


@pytest.mark.parametrize("is_template", [True, False])
def test_callback_data_sinal_sends_names_the_contact_and_kind(is_template: bool) -> None:
    contact = UUID(CONTACT)
    sent = sent_callback_data(contact, is_template=is_template)
    assert len(sent) <= 512  # Meta's limit for biz_opaque_callback_data
    assert read_callback_data(sent) == (contact, is_template, None)


def test_callback_data_a_step_sends_names_its_automation_and_execution() -> None:
    contact, automation, execution = UUID(CONTACT), uuid4(), uuid4()
    sent = sent_callback_data(contact, is_template=False, sent_by=(automation, execution))
    assert len(sent) <= 512
    assert read_callback_data(sent) == (contact, False, (automation, execution))


def test_status_event_of_a_message_an_automation_sent_names_it() -> None:
    [update] = batch("status_delivered").statuses
    automation, execution = uuid4(), uuid4()
    event = status_event(update, is_template=False, sent_by=(automation, execution))
    assert event is not None
    assert event.properties["sent_by_automation_id"] == str(automation)
    assert event.properties["sent_by_automation_execution_id"] == str(execution)
    plain = status_event(update, is_template=False)
    assert plain is not None
    assert "sent_by_automation_id" not in plain.properties


@pytest.mark.parametrize(
    "echoed",
    [None, "", "pedido-1042", "sinal", "sinal:template", "sinal:template:not-a-uuid",
     f"sinal:campaign:{CONTACT}", f"other:template:{CONTACT}", f"SINAL:template:{CONTACT}",
     f"sinal:template:{CONTACT}:{CONTACT}", f"sinal:message:{CONTACT}:{CONTACT}:x"],
)  # fmt: skip
def test_callback_data_of_other_senders_names_nothing(echoed: str | None) -> None:
    assert read_callback_data(echoed) is None


def test_status_keeps_the_callback_data_meta_echoes() -> None:
    payload = load("status_delivered")
    payload["entry"][0]["changes"][0]["value"]["statuses"][0]["biz_opaque_callback_data"] = (
        f"sinal:template:{CONTACT}"
    )
    [update] = map_whatsapp(payload).statuses
    assert read_callback_data(update.callback_data) == (UUID(CONTACT), True, None)
