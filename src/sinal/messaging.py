"""WhatsApp messaging: webhook deliveries into events, message statuses, conversations.

`process_whatsapp` is the processor `sinal.webhooks` runs on each kept WhatsApp delivery:

- an inbound message: its contact is found or created (Meta's business-scoped user id
  first, then the phone — Brazilian numbers with and without the ninth digit are one
  person — a new contact also getting Contact Created, source ``whatsapp``; a contact
  found gains the phone and profile name it lacks, with Contact Updated, unless another
  contact has that phone: `Ledger.fill_contact`); Message
  Received is recorded (``whatsapp:message:{wamid}``) and, when the contact has no open
  conversation, one is opened with Conversation Opened: message, conversation and its
  event commit together, so a redelivered message never opens a second one.
- a status of a message sinal sent: the contact and whether it was a template come from
  the send event (the automation step's Message Sent / Template Sent whose entity_id is
  the wamid), else from the callback data the step sent with the message (Meta echoes it
  in the statuses, so a status that outruns the step's commit still names them). The
  status event names the automation and execution that sent the message
  (``sent_by_automation_id``, ``sent_by_automation_execution_id``, from the send event):
  that automation never runs for it (no loop: "Message Delivered → send a message"),
  other automations may. The message's status row only moves forward and the status event
  (once per wamid and status, with its own time) commit together. ``sent`` moves the row
  but records no event: the sending step recorded Message Sent.
- a status of a message sinal knows nothing of (sent by another system, or by a step whose
  record has not committed yet): the delivery is deferred (`DeliveryDeferred`) for the
  integration's grace (`status_grace`, 60 s unless ``status_grace_seconds`` says otherwise)
  while everything else in it is recorded at once. `sinal.webhooks.process_deferred`
  processes it again when due: what was recorded stays once, and the statuses still
  unknown are then recorded for the recipient, as Message Delivered / Read / Failed.

Each change is recorded for the connection whose ``phone_number_id`` it names (Meta sends
every number of an app's WhatsApp Business Accounts to the app's one callback URL, which
may be any one of the account's connections): the connection that received it, else
another WhatsApp connection of the same account with that number and the same app secret
(the delivery was verified with the receiving one's; a connection of another Meta app is
never written as). A number no connection of the account has is left unrecorded
(``phone_number_mismatch``), as is one only a connection of another app has
(``app_secret_mismatch``): kept, for a replay once it is connected.

Everything is idempotent: a redelivery or a replay records duplicates, never second
events. Parts that cannot be mapped do not stop the rest; the delivery is then kept as
``unmappable`` with their reasons (and can be replayed: what was recorded stays once).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Final, cast
from uuid import UUID

from sinal.catalog import (
    METRIC_CONVERSATION_ASSIGNED,
    METRIC_CONVERSATION_CLOSED,
    METRIC_CONVERSATION_OPENED,
)
from sinal.errors import ContactNotFound, ConversationClosed, InvalidContact, InvalidEvent
from sinal.events import EmitEvent, PreparedEvent, prepare
from sinal.integrations import parse_body
from sinal.integrations.base import ContactRef, DeliveryDeferred, Mapped, UnmappablePayload
from sinal.integrations.whatsapp import (
    StatusUpdate,
    map_whatsapp,
    read_callback_data,
    status_event,
)
from sinal.ledger import Ledger
from sinal.store.automations import AutomationStore, Integration
from sinal.store.messaging import (
    Conversation,
    ConversationQuery,
    MessageStatus,
    MessagingStore,
    SentMessage,
)
from sinal.store.webhooks import StoredDelivery
from sinal.webhooks import MAX_REASON, deferral_grace, may_defer_until

__all__ = [
    "assign_conversation",
    "close_conversation",
    "conversation_event",
    "get_conversation",
    "list_conversations",
    "messaging_store",
    "process_whatsapp",
    "status_grace",
]

SOURCE: Final = "whatsapp"
# Skipped parts that are not losses: changes sinal does not map (template reviews, ...)
# and WhatsApp's system notices.
_IGNORED_SKIPS: Final = frozenset({"unsupported_field", "system_message"})


def messaging_store(ledger: Ledger) -> MessagingStore:
    """The ledger's store, as a `MessagingStore`."""
    return cast(MessagingStore, ledger.store)


# --- WhatsApp deliveries -----------------------------------------------------------------


def status_grace(integration: Integration) -> timedelta:
    """How long a status of a message sinal has no record of waits for that record (the
    sending step may not have committed yet) before it counts as another sender's."""
    return deferral_grace(integration, "status_grace_seconds")


def process_whatsapp(ledger: Ledger, integration: Integration, delivery: StoredDelivery) -> None:
    """Record one kept WhatsApp delivery (see the module docstring); raises
    `DeliveryDeferred` when statuses in it wait for their messages' send records, else
    `UnmappablePayload` when the body, or any part of it, cannot be mapped."""
    batch = map_whatsapp(parse_body(delivery.body))
    until = may_defer_until(ledger, delivery, status_grace(integration))
    inbox = _Inbox(ledger, integration, may_wait=until is not None)
    problems = [f"{s.kind} {s.item_id}: {s.reason}" for s in batch.skipped
                if s.reason not in _IGNORED_SKIPS]  # fmt: skip
    for message in batch.messages:
        number = message.properties.get("phone_number_id")
        problems += inbox.attempt("message", message.source_id, number,
                                  partial(inbox.receive, message))  # fmt: skip
    for update in batch.statuses:
        problems += inbox.attempt("status", update.wamid, update.phone_number_id,
                                  partial(inbox.apply_status, update))  # fmt: skip
    if inbox.waiting and until is not None:  # only a pass that may wait has any waiting
        waiting = list(dict.fromkeys(inbox.waiting))
        detail = (f"statuses of {len(waiting)} message(s) sinal has no send record of yet: "
                  + ", ".join(waiting[:5]) + (", ..." if len(waiting) > 5 else ""))  # fmt: skip
        if problems:
            detail += f"; {len(problems)} other part(s) not recorded: " + "; ".join(problems)
        raise DeliveryDeferred(until, detail[:MAX_REASON])
    if problems:
        detail = f"{len(problems)} part(s) not recorded: " + "; ".join(problems)
        raise UnmappablePayload("partly_unmappable", detail[:MAX_REASON])


class _Skip(Exception):
    """One part of a delivery that cannot be recorded; the rest goes on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Inbox:
    """One delivery's processing: the integration, and the contacts resolved so far."""

    def __init__(self, ledger: Ledger, integration: Integration, *, may_wait: bool) -> None:
        self.ledger = ledger
        self.may_wait = may_wait  # statuses of unknown messages wait, instead of guessing
        self.waiting: list[str] = []  # the wamids of those statuses
        self.store = messaging_store(ledger)
        self.integration = integration
        self.account_id = integration.account_id
        self.phone_number_id = str(integration.settings.get("phone_number_id") or "")
        self.contacts: dict[tuple[str | None, str | None, str | None], UUID] = {}
        self.owners: dict[str, Integration | str] | None = None  # read on first need

    def attempt(
        self, kind: str, item_id: str, number: str | None, work: Callable[[Integration], None]
    ) -> list[str]:
        """Run `work` for one part sent to phone `number`, with the connection it is recorded
        for; the problems it left (none when it was recorded)."""
        owner = self.owner(number)
        if isinstance(owner, str):
            return [f"{kind} {item_id}: {owner}"]
        try:
            work(owner)
        except _Skip as exc:
            return [f"{kind} {item_id}: {exc.reason}"]
        except (InvalidEvent, InvalidContact) as exc:
            return [f"{kind} {item_id}: {exc.reason} ({exc})"]
        return []

    def owner(self, number: str | None) -> Integration | str:
        """The connection a part sent to business number `number` is recorded for, or why
        none is (see the module docstring)."""
        if not number or not self.phone_number_id or number == self.phone_number_id:
            return self.integration
        if self.owners is None:
            store = cast(AutomationStore, self.ledger.store)
            connections = store.list_integrations(self.account_id, "whatsapp")
            self.owners = _owners_by_number(self.integration, connections)
        return self.owners.get(number) or f"phone_number_mismatch ({number})"

    def prepare(self, event: EmitEvent) -> PreparedEvent:
        """Validate an event with the ledger's clock."""
        return prepare(event, self.ledger.clock())

    def contact_for(self, ref: ContactRef) -> UUID:
        """The contact `ref` names: by Meta's user id, else found or created by phone (or
        by the user id as external id, when the number is hidden); a contact found gains
        the phone and profile name it lacks."""
        key = (ref.phone, ref.external_id, ref.user_id)
        if key in self.contacts:
            return self.contacts[key]
        found = None
        if ref.user_id:
            found = self.known_user(ref.user_id, ref)
        if found is None:
            if ref.is_empty:
                raise _Skip("no_contact")
            try:
                found = self.resolved(ref)
            except ContactNotFound:  # erased meanwhile: as after the erasure, a new contact
                found = self.resolved(ref)
        self.contacts[key] = found
        return found

    def known_user(self, user_id: str, ref: ContactRef) -> UUID | None:
        """The contact Meta's user id was seen with, given the phone and profile name it
        lacks (Contact Updated; a phone another contact has is left to it); None if there
        is none (an erasure deleted it meanwhile included)."""
        user = self.store.find_whatsapp_user(self.account_id, user_id, ref.phone)
        if user is None:
            return None
        contact = user.contact
        # first seen with the number hidden, the contact has none: automations could not
        # message it once Meta shows the number (wa_id / from). A number another contact
        # has stays that contact's: not even tried, as that write fails on every message.
        may_take = contact.phone is None and user.phone_holder in (None, contact.id)
        phone = ref.phone if may_take else None
        name = ref.name if contact.name is None else None
        if phone is None and name is None:
            return contact.id  # nothing to give it: no write, and no second read
        filled = self.ledger.fill_contact(  # as read with the user: not read again
            self.account_id, contact, phone=phone, name=name, source=SOURCE
        )
        return None if filled is None else filled.id

    def resolved(self, ref: ContactRef) -> UUID:
        """The contact found or created by `ref`'s phone (or external id), remembered for
        its user id; a contact found gains the profile name it lacks. Raises
        `ContactNotFound` when an erasure deleted it meanwhile."""
        contact, _ = self.ledger.resolve_contact(
            self.account_id, phone=ref.phone, external_id=ref.external_id,
            name=ref.name, source=SOURCE, fill_missing=True,
        )  # fmt: skip
        if not ref.user_id:
            return contact.id
        return self.store.link_whatsapp_user(self.account_id, ref.user_id, contact.id)

    def receive(self, message: Mapped, owner: Integration) -> None:
        """Message Received (for connection `owner`), and a conversation when none is open;
        when an erasure deletes the sender meanwhile, again, from the sender found anew (as
        after the erasure: by phone, a new contact), not kept as a rejection naming the
        erased contact."""
        try:
            self.receive_once(message, owner)
        except ContactNotFound:
            ref = message.contact
            self.contacts.pop((ref.phone, ref.external_id, ref.user_id), None)
            self.receive_once(message, owner)

    def receive_once(self, message: Mapped, owner: Integration) -> None:
        """Message Received, and a conversation when none is open."""
        contact_id = self.contact_for(message.contact)
        event = self.prepare(
            message.to_emit(account_id=self.account_id, contact_id=contact_id,
                            integration_id=owner.id)
        )  # fmt: skip

        def opened(conversation: Conversation) -> PreparedEvent:
            properties = {"channel": SOURCE, "opened_by_message_id": message.source_id}
            return self.prepare(
                conversation_event(METRIC_CONVERSATION_OPENED, conversation, source=SOURCE,
                                   key="opened", when=conversation.opened_at,
                                   properties=properties)
            )  # fmt: skip

        self.store.record_inbound_message(event, opened)

    def apply_status(self, update: StatusUpdate, owner: Integration) -> None:
        """Advance the message's status row and record its status event (for connection
        `owner`); when an erasure deletes the message's contact meanwhile, again, as for a
        message sent to a contact that no longer exists (its send record went with it)."""
        try:
            self.apply_status_once(update, owner)
        except ContactNotFound:
            self.apply_status_once(update, owner)

    def apply_status_once(self, update: StatusUpdate, owner: Integration) -> None:
        """Advance the message's status row and record its status event."""
        if update.rank is None:
            return  # a status sinal does not track (deleted, warning): nothing to record
        sent = self.sent_message(update)
        if sent is None:
            self.waiting.append(update.wamid)
            return
        sent_by = None if sent.automation_id is None else (sent.automation_id, sent.execution_id)
        mapped = status_event(update, is_template=sent.is_template, sent_by=sent_by)
        event = None
        if mapped is not None:
            event = self.prepare(
                mapped.to_emit(account_id=self.account_id, contact_id=sent.contact_id,
                               integration_id=owner.id)
            )  # fmt: skip
        error = update.error if update.status == "failed" else None
        row = MessageStatus(
            account_id=self.account_id, wamid=update.wamid, contact_id=sent.contact_id,
            status=update.status, is_template=sent.is_template,
            error_code=None if error is None else error.code,
            error_title=None if error is None else error.title,
            status_at=update.occurred_at, updated_at=self.ledger.clock(),
        )  # fmt: skip
        self.store.record_message_status(row, event)

    def sent_message(self, update: StatusUpdate) -> SentMessage | None:
        """To whom the message went, whether as a template and which automation sent it:
        its send record, else the callback data sinal sent with it; else None while waiting
        for the send record may still help, and after that the recipient (not sent by
        sinal, as far as it knows)."""
        sent = self.store.find_sent_message(self.account_id, update.wamid)
        echoed = read_callback_data(update.callback_data)
        # another account's contact id (or a deleted one) is one that does not exist
        if (
            sent is None
            and echoed is not None
            and self.ledger.get_contact(self.account_id, echoed.contact_id) is not None
        ):
            sent = SentMessage(echoed.contact_id, echoed.is_template)
        if sent is not None:
            # the send event names the automation that sent it; until it commits (only an
            # earlier status's row, or nothing, is known) the callback data does
            if sent.automation_id is None and echoed is not None and echoed.sent_by:
                automation_id, execution_id = echoed.sent_by
                sent = replace(sent, automation_id=automation_id, execution_id=execution_id)
            return sent
        if self.may_wait:
            return None
        return SentMessage(self.contact_for(update.recipient), is_template=False)


def _owners_by_number(
    receiver: Integration, connections: Iterable[Integration]
) -> dict[str, Integration | str]:
    """Each number of the account's WhatsApp `connections` (oldest first): the oldest
    connection of it signed with `receiver`'s app secret, else why none may record it."""
    secret = str(receiver.secrets.get("secret") or "").encode("utf-8")
    owners: dict[str, Integration | str] = {}
    for wa in connections:
        number = str(wa.settings.get("phone_number_id") or "")
        theirs = str(wa.secrets.get("secret") or "").encode("utf-8")
        if not number or isinstance(owners.get(number), Integration):
            continue
        if secret and hmac.compare_digest(secret, theirs):
            owners[number] = wa
        else:  # another Meta app's number: its deliveries are signed with another secret
            owners[number] = f"app_secret_mismatch ({number}: another app's connection)"
    return owners


# --- conversations -----------------------------------------------------------------------


def conversation_event(
    metric: str,
    conversation: Conversation,
    *,
    source: str,
    when: datetime,
    key: str | None = None,
    properties: dict[str, Any] | None = None,
) -> EmitEvent:
    """A conversation's event (entity "conversation"); `key` makes it once per
    conversation (opened, closed), None leaves it undeduplicated (each assignment)."""
    return EmitEvent(
        account_id=conversation.account_id,
        contact_id=conversation.contact_id,
        metric_name=metric,
        source=source,
        source_id=None if key is None else f"{conversation.id}:{key}",
        entity_type="conversation",
        entity_id=str(conversation.id),
        occurred_at=when,
        properties={"conversation_id": str(conversation.id), **(properties or {})},
    )


def get_conversation(
    ledger: Ledger, account_id: UUID, conversation_id: UUID
) -> Conversation | None:
    """One conversation of the account, or None (another account's id included)."""
    return messaging_store(ledger).get_conversation(account_id, conversation_id)


def list_conversations(ledger: Ledger, query: ConversationQuery) -> list[Conversation]:
    """Conversations matching the query, newest first."""
    return messaging_store(ledger).list_conversations(query)


def close_conversation(
    ledger: Ledger, account_id: UUID, conversation_id: UUID, *, source: str = "api"
) -> Conversation | None:
    """Close a conversation, recording Conversation Closed in the same transaction; an
    already closed one is returned unchanged (nothing recorded). None if there is none."""

    def closed(before: Conversation, after: Conversation) -> PreparedEvent:
        assert after.closed_at is not None
        event = conversation_event(
            METRIC_CONVERSATION_CLOSED, after, source=source, key="closed",
            when=after.closed_at, properties={"assigned_to": after.assigned_to},
        )  # fmt: skip
        return prepare(event, ledger.clock())

    return messaging_store(ledger).close_conversation(account_id, conversation_id, closed)


def assign_conversation(
    ledger: Ledger, account_id: UUID, conversation_id: UUID, agent: str, *, source: str = "api"
) -> Conversation | None:
    """Assign an open conversation to `agent` (a non-empty name or id), recording
    Conversation Assigned when the agent changes; raises `ConversationClosed` for a
    closed one. None if there is none."""
    clean = " ".join(agent.split())
    if not clean:
        raise ValueError("agent must not be blank")

    def assigned(before: Conversation, after: Conversation) -> PreparedEvent:
        now = ledger.clock()
        event = conversation_event(
            METRIC_CONVERSATION_ASSIGNED, after, source=source, when=now,
            properties={"agent": after.assigned_to, "previous_agent": before.assigned_to},
        )  # fmt: skip
        return prepare(event, now)

    store = messaging_store(ledger)
    after = store.assign_conversation(account_id, conversation_id, clean, assigned)
    if after is not None and after.status == "closed":
        raise ConversationClosed(f"conversation {conversation_id} is closed")
    return after
