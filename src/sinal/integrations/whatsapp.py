"""WhatsApp Cloud API webhooks into sinal events. Pure: no I/O.

A body holds ``entry[].changes[]``; each ``messages`` change carries ``value.contacts[]``,
``value.messages[]`` (inbound) and ``value.statuses[]`` (of messages we sent).

- Inbound messages → Message Received, unique id ``whatsapp:message:{wamid}``.
- Statuses → `StatusUpdate` records. Which metric one records depends on whether that
  wamid was sent as a template, which only the store knows: call
  ``status_event(update, is_template=...)`` (or ``batch.status_events(is_template)``).
  Each status is recorded once per wamid (``whatsapp:message_{status}:{wamid}``); the
  message's current status only moves forward, see `advance_status`.
- Messages sinal sends carry `sent_callback_data` (Meta's ``biz_opaque_callback_data``),
  which Meta echoes in their statuses: `read_callback_data` tells the contact, whether it
  was a template and which automation sent it even when the status outruns the record of
  the send.

One malformed message or status does not sink its batch: it lands in `WhatsAppBatch.skipped`
with a reason. A malformed envelope raises `UnmappablePayload`.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, NamedTuple
from uuid import UUID

from sinal.catalog import (
    METRIC_MESSAGE_DELIVERED,
    METRIC_MESSAGE_FAILED,
    METRIC_MESSAGE_READ,
    METRIC_MESSAGE_RECEIVED,
    METRIC_TEMPLATE_DELIVERED,
    METRIC_TEMPLATE_READ,
)
from sinal.integrations import _read as r
from sinal.integrations.base import ContactRef, Delivery, Mapped, UnmappablePayload

__all__ = [
    "SENT_BY_AUTOMATION",
    "STATUS_RANK",
    "SentCallback",
    "Skipped",
    "StatusError",
    "StatusUpdate",
    "WhatsAppBatch",
    "advance_status",
    "map_whatsapp",
    "read_callback_data",
    "sent_callback_data",
    "status_event",
    "status_metric",
    "status_rank",
    "verify_challenge",
    "whatsapp_delivery",
]

SOURCE: Final = "whatsapp"
OBJECT: Final = "whatsapp_business_account"

# A message's status only moves up: sent < delivered < read. Failed outranks them all and
# stays (its error with it): a late "delivered" must not hide that the message failed.
STATUS_RANK: Final[Mapping[str, int]] = {"sent": 1, "delivered": 2, "read": 3, "failed": 4}

# biz_opaque_callback_data of the messages sinal sends: "sinal:{template|message}:{contact}",
# and ":{automation}:{execution}" after it when an automation step sent the message.
_CALLBACK_PREFIX: Final = "sinal"
_CALLBACK_KINDS: Final[Mapping[str, bool]] = {"template": True, "message": False}

_MEDIA_TYPES: Final = frozenset({"image", "video", "audio", "document", "sticker"})
# Meta's error codes are small (131026); message_statuses.error_code is a 32-bit integer.
_MAX_ERROR_CODE: Final = 2**31 - 1
# The status events' property naming the automation that sent the message: that automation
# never runs for them (`sinal.automations.matching`, outcome ``own_message``).
SENT_BY_AUTOMATION: Final = "sent_by_automation_id"
# ... and the execution that sent it: an execution made for them is one deeper in a chain
# of automations (`sinal.store.automations.MAX_CHAIN_DEPTH`).
SENT_BY_EXECUTION: Final = "sent_by_automation_execution_id"


@dataclass(frozen=True, slots=True)
class StatusError:
    """One of Meta's errors on a failed status (code 131026: undeliverable, ...)."""

    code: int | None
    title: str | None
    message: str | None = None
    details: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusUpdate:
    """One status of a message we sent, as Meta reported it."""

    wamid: str
    status: str  # sent, delivered, read, failed (others are kept but record nothing)
    occurred_at: datetime  # aware, UTC
    recipient: ContactRef
    phone_number_id: str | None = None
    errors: tuple[StatusError, ...] = ()
    conversation_id: str | None = None
    conversation_category: str | None = None
    pricing_category: str | None = None
    billable: bool | None = None
    callback_data: str | None = None  # biz_opaque_callback_data given when sending

    @property
    def rank(self) -> int | None:
        """This status on STATUS_RANK; None for statuses sinal does not track."""
        return status_rank(self.status)

    @property
    def error(self) -> StatusError | None:
        """The first error Meta gave, if any."""
        return self.errors[0] if self.errors else None


class SentCallback(NamedTuple):
    """What the callback data of a message sinal sent names: the contact, whether it was a
    template, and the (automation id, execution id) of the step that sent it, if any."""

    contact_id: UUID
    is_template: bool
    sent_by: tuple[UUID, UUID] | None = None


@dataclass(frozen=True, slots=True)
class Skipped:
    """A part of a batch that was not mapped, and why."""

    kind: str  # "message", "status" or "change"
    item_id: str | None
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class WhatsAppBatch:
    """Everything in one WhatsApp webhook body."""

    messages: tuple[Mapped, ...] = ()  # Message Received events
    statuses: tuple[StatusUpdate, ...] = ()
    contacts: tuple[ContactRef, ...] = ()
    skipped: tuple[Skipped, ...] = ()

    def status_events(self, is_template: Callable[[str], bool]) -> list[Mapped]:
        """The status events to record; `is_template(wamid)` tells how each was sent."""
        events = (status_event(s, is_template=is_template(s.wamid)) for s in self.statuses)
        return [event for event in events if event is not None]


# --- verification ------------------------------------------------------------------------


def verify_challenge(params: Mapping[str, str], verify_token: str) -> str | None:
    """Meta's subscription handshake: the challenge to echo, or None (answer 403)."""
    token = params.get("hub.verify_token") or ""
    challenge = params.get("hub.challenge")
    if not verify_token or params.get("hub.mode") != "subscribe" or not challenge:
        return None
    if not hmac.compare_digest(token.encode("utf-8"), verify_token.encode("utf-8")):
        return None
    return challenge


def whatsapp_delivery(headers: Mapping[str, str], body: bytes) -> Delivery:
    """The delivery's change fields and dedup id (a digest of the body: Meta sends no id)."""
    del headers  # Meta sends no delivery id header; kept for a uniform signature
    try:
        payload: Mapping[str, Any] = r.parse_body(body)
    except UnmappablePayload:
        payload = {}
    entries = r.objects(payload, "entry")
    fields = sorted(
        {f for e in entries for c in r.objects(e, "changes") if (f := r.text(c, "field"))}
    )
    return Delivery(
        provider=SOURCE,
        topic=",".join(fields) or None,
        delivery_id=r.body_digest(body),
        occurred_at=None,
        origin=r.text(entries[0], "id") if entries else None,
    )


# --- statuses ----------------------------------------------------------------------------


def status_rank(status: str | None) -> int | None:
    """Where `status` sits on STATUS_RANK (sent 1 < delivered 2 < read 3 < failed 4)."""
    return STATUS_RANK.get(status or "")


def advance_status(current: str | None, new: str) -> str | None:
    """A message's status after `new` arrives: it only moves forward; failed stays."""
    new_rank = status_rank(new)
    if new_rank is None:
        return current
    current_rank = status_rank(current)
    return new if current_rank is None or new_rank > current_rank else current


def status_metric(status: str, is_template: bool) -> str | None:
    """The metric a status records; None for `sent` (the sending step records it)."""
    if status == "delivered":
        return METRIC_TEMPLATE_DELIVERED if is_template else METRIC_MESSAGE_DELIVERED
    if status == "read":
        return METRIC_TEMPLATE_READ if is_template else METRIC_MESSAGE_READ
    if status == "failed":
        return METRIC_MESSAGE_FAILED  # the catalog has no "Template Failed"
    return None


def sent_callback_data(
    contact_id: UUID, *, is_template: bool, sent_by: tuple[UUID, UUID] | None = None
) -> str:
    """The ``biz_opaque_callback_data`` sinal sends with a message: Meta returns it in the
    message's statuses, so they name the contact, the kind and (`sent_by`) the automation
    and execution that sent it before the send is recorded."""
    kind = "template" if is_template else "message"
    text = f"{_CALLBACK_PREFIX}:{kind}:{contact_id}"
    return text if sent_by is None else f"{text}:{sent_by[0]}:{sent_by[1]}"


def read_callback_data(text: str | None) -> SentCallback | None:
    """What a status's callback data that sinal sent names; None for anything else (no
    data, another sender's, malformed)."""
    parts = (text or "").split(":")
    if len(parts) not in (3, 5) or parts[0] != _CALLBACK_PREFIX or parts[1] not in _CALLBACK_KINDS:
        return None
    try:
        ids = [UUID(part) for part in parts[2:]]
    except ValueError:
        return None
    sent_by = (ids[1], ids[2]) if len(ids) == 3 else None
    return SentCallback(ids[0], _CALLBACK_KINDS[parts[1]], sent_by)


def status_event(
    update: StatusUpdate,
    *,
    is_template: bool,
    contact: ContactRef | None = None,
    sent_by: tuple[UUID, UUID | None] | None = None,
) -> Mapped | None:
    """The event for one status, once per (wamid, status); None when it records nothing.
    `sent_by` is (automation id, execution id) when an automation step sent the message:
    the event names them, so that automation never runs for its own message's statuses."""
    metric = status_metric(update.status, is_template)
    if metric is None:
        return None
    error = update.error
    automation_id, execution_id = sent_by or (None, None)
    properties = {
        "wa_message_id": update.wamid,
        "status": update.status,
        "is_template": is_template,
        "phone": update.recipient.phone,
        "recipient_id": update.recipient.wa_id,
        "phone_number_id": update.phone_number_id,
        "error_code": None if error is None else error.code,
        "error_title": None if error is None else error.title,
        "error_message": None if error is None else error.message,
        "error_details": None if error is None else error.details,
        "conversation_category": update.conversation_category,
        "pricing_category": update.pricing_category,
        SENT_BY_AUTOMATION: None if automation_id is None else str(automation_id),
        SENT_BY_EXECUTION: None if execution_id is None else str(execution_id),
    }
    return Mapped(
        metric_name=metric,
        contact=contact or update.recipient,
        source=SOURCE,
        source_id=update.wamid,
        entity_type=f"message_{update.status}",
        entity_id=update.wamid,
        occurred_at=update.occurred_at,
        properties=r.compact(properties),
        message_status=update.status,
    )


# --- the body ----------------------------------------------------------------------------


def map_whatsapp(payload: Mapping[str, Any]) -> WhatsAppBatch:
    """Messages, statuses and contacts of one webhook body; raises UnmappablePayload."""
    if not isinstance(payload, Mapping) or r.text(payload, "object") != OBJECT:
        raise UnmappablePayload("unexpected_object", f"object is not {OBJECT!r}")
    entries = r.get(payload, "entry")
    if not isinstance(entries, list):
        raise UnmappablePayload("missing_field", "entry is missing or not a list")
    batch = _Collector()
    for entry in r.objects(payload, "entry"):
        for change in r.objects(entry, "changes"):
            batch.add_change(change)
    return batch.result()


class _Collector:
    """Accumulates one body's parts; bad items become `Skipped` instead of failing all."""

    def __init__(self) -> None:
        self.messages: list[Mapped] = []
        self.statuses: list[StatusUpdate] = []
        self.contacts: list[ContactRef] = []
        self.skipped: list[Skipped] = []

    def result(self) -> WhatsAppBatch:
        return WhatsAppBatch(
            tuple(self.messages), tuple(self.statuses), tuple(self.contacts), tuple(self.skipped)
        )

    def add_change(self, change: Mapping[str, Any]) -> None:
        field = r.text(change, "field")
        if field != "messages":
            why = f"change field {str(field)[:64]!r} is not mapped"
            self.skipped.append(Skipped("change", None, "unsupported_field", why))
            return
        value = r.obj(change, "value")
        phone_number_id = r.text(value, "metadata", "phone_number_id")
        contacts = [_contact(c) for c in r.objects(value, "contacts")]
        self.contacts.extend(contacts)
        for message in r.objects(value, "messages"):
            self._try("message", message, lambda m: self._message(m, contacts, phone_number_id))
        for status in r.objects(value, "statuses"):
            self._try("status", status, lambda s: self._status(s, phone_number_id))

    def _try(self, kind: str, item: Mapping[str, Any], add: Callable[[Any], None]) -> None:
        try:
            add(item)
        except UnmappablePayload as exc:
            self.skipped.append(Skipped(kind, r.text(item, "id"), exc.reason, exc.message))

    def _message(
        self, message: Mapping[str, Any], contacts: list[ContactRef], phone_number_id: str | None
    ) -> None:
        self.messages.append(_message_event(message, contacts, phone_number_id))

    def _status(self, status: Mapping[str, Any], phone_number_id: str | None) -> None:
        self.statuses.append(_status_update(status, phone_number_id))


def _contact(contact: Mapping[str, Any]) -> ContactRef:
    return _whatsapp_contact(
        r.text(contact, "wa_id"), r.id_text(contact, "user_id"), r.text(contact, "profile", "name")
    )


def _whatsapp_contact(wa_id: str | None, user_id: str | None, name: str | None) -> ContactRef:
    ref = ContactRef.parse(wa_id=wa_id, user_id=user_id, name=name)
    if ref.phone is None and user_id:
        # The user hides their number: the business-scoped id is all that identifies them.
        ref = ContactRef.parse(
            wa_id=wa_id, user_id=user_id, name=name, external_id=f"whatsapp:user:{user_id}"
        )
    return ref


def _sender(message: Mapping[str, Any], contacts: list[ContactRef]) -> ContactRef:
    wa_id = r.text(message, "from")
    user_id = r.id_text(message, "from_user_id")
    for contact in contacts:
        if (wa_id and contact.wa_id == wa_id) or (user_id and contact.user_id == user_id):
            return contact
    sender = _whatsapp_contact(wa_id, user_id, None)
    if sender.is_empty:
        raise UnmappablePayload("no_sender", "the message has no valid 'from' or user id")
    return sender


def _message_event(
    message: Mapping[str, Any], contacts: list[ContactRef], phone_number_id: str | None
) -> Mapped:
    wamid = r.required_text(message, "id")
    contact = _sender(message, contacts)
    occurred_at = r.epoch_time(message, "timestamp")
    if occurred_at is None:
        raise UnmappablePayload("missing_field", "timestamp is missing")
    message_type = r.text(message, "type") or "unknown"
    if message_type == "system":
        raise UnmappablePayload("system_message", "system notices are not messages")
    properties = {
        "phone": contact.phone,
        "wa_id": contact.wa_id,
        "user_id": contact.user_id,
        "message_type": message_type,
        "wa_message_id": wamid,
        "phone_number_id": phone_number_id,
        **_content(message_type, message),
        **_context(message),
    }
    return Mapped(
        metric_name=METRIC_MESSAGE_RECEIVED,
        contact=contact,
        source=SOURCE,
        source_id=wamid,
        entity_type="message",
        entity_id=wamid,
        occurred_at=occurred_at,
        properties=r.compact(properties),
    )


def _content(message_type: str, message: Mapping[str, Any]) -> dict[str, Any]:
    """The fields automations read, per message type."""
    body = r.obj(message, message_type)
    if message_type == "text":
        return {"text": r.text(body, "body")}
    if message_type in _MEDIA_TYPES:
        return {
            "caption": r.text(body, "caption"),
            "media_id": r.text(body, "id"),
            "mime_type": r.text(body, "mime_type"),
            "filename": r.text(body, "filename"),
        }
    if message_type == "interactive":
        return _interactive(body)
    if message_type == "button":  # a template's quick-reply button
        payload = r.text(body, "payload")
        return {
            "reply_type": "quick_reply",
            "reply_id": payload,
            "reply_title": r.text(body, "text"),
            "payload": payload,
        }
    if message_type == "reaction":
        return _reaction(body)
    if message_type == "location":
        return {
            "latitude": _number(r.get(body, "latitude")),
            "longitude": _number(r.get(body, "longitude")),
            "location_name": r.text(body, "name"),
            "location_address": r.text(body, "address"),
        }
    return _unsupported(message)


def _interactive(body: Mapping[str, Any]) -> dict[str, Any]:
    reply_type = r.text(body, "type")
    reply = r.obj(body, reply_type or "")
    return {
        "reply_type": reply_type,
        "reply_id": r.text(reply, "id"),
        "reply_title": r.text(reply, "title"),
        "reply_description": r.text(reply, "description"),
    }


def _reaction(body: Mapping[str, Any]) -> dict[str, Any]:
    raw = r.get(body, "emoji")
    emoji = raw if isinstance(raw, str) else ""
    return {
        "reaction_emoji": emoji,
        "reaction_removed": emoji == "",  # Meta sends an empty emoji when it is taken back
        "reacted_message_id": r.text(body, "message_id"),
    }


def _unsupported(message: Mapping[str, Any]) -> dict[str, Any]:
    errors = r.objects(message, "errors")
    if not errors:
        return {}
    return {"error_code": _code(errors[0]), "error_title": r.text(errors[0], "title")}


def _context(message: Mapping[str, Any]) -> dict[str, Any]:
    context = r.obj(message, "context")
    referral = r.obj(message, "referral")
    ad = r.compact(
        {
            "source_type": r.text(referral, "source_type"),
            "source_id": r.text(referral, "source_id"),
            "source_url": r.text(referral, "source_url"),
            "ctwa_clid": r.text(referral, "ctwa_clid"),
        }
    )
    return {
        "context_message_id": r.text(context, "id"),
        "is_forwarded": True if r.flag(context, "forwarded") else None,
        "referral": ad or None,
    }


def _status_update(status: Mapping[str, Any], phone_number_id: str | None) -> StatusUpdate:
    wamid = r.required_text(status, "id")
    name = r.required_text(status, "status").lower()
    occurred_at = r.epoch_time(status, "timestamp")
    if occurred_at is None:
        raise UnmappablePayload("missing_field", "timestamp is missing")
    recipient = _whatsapp_contact(
        r.text(status, "recipient_id"), r.id_text(status, "recipient_user_id"), None
    )
    return StatusUpdate(
        wamid=wamid,
        status=name,
        occurred_at=occurred_at,
        recipient=recipient,
        phone_number_id=phone_number_id,
        errors=tuple(_status_error(e) for e in r.objects(status, "errors")),
        conversation_id=r.text(status, "conversation", "id"),
        conversation_category=r.text(status, "conversation", "origin", "type"),
        pricing_category=r.text(status, "pricing", "category"),
        billable=r.flag(status, "pricing", "billable"),
        callback_data=r.text(status, "biz_opaque_callback_data"),
    )


def _status_error(error: Mapping[str, Any]) -> StatusError:
    return StatusError(
        code=_code(error),
        title=r.text(error, "title"),
        message=r.text(error, "message"),
        details=r.text(error, "error_data", "details"),
    )


def _code(error: Mapping[str, Any]) -> int | None:
    raw = r.get(error, "code")
    if raw is None or raw == "":
        return None
    code = r.whole_number(raw)
    if code is None or not 0 <= code <= _MAX_ERROR_CODE:
        why = f"an error code is not a whole number from 0 to {_MAX_ERROR_CODE}"
        raise UnmappablePayload("invalid_error_code", why)
    return code


def _number(raw: object) -> float | int | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    return raw
