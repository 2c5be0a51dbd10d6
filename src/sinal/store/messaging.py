"""The storage interface of WhatsApp messaging: message statuses, conversations, tracked
links (implemented by the backends' mixins, `sqlite_messaging.py` and
`postgres_messaging.py`; each method one transaction).

State rows and the events that announce their changes commit together: the caller hands
in the prepared event (or a function building it from the row), as `Store.change_tags`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal, Protocol
from uuid import UUID

from sinal.catalog import (
    METRIC_AI_RESPONSE_SENT,
    METRIC_CAMPAIGN_SENT,
    METRIC_MESSAGE_SENT,
    METRIC_TEMPLATE_SENT,
)
from sinal.events import PreparedEvent
from sinal.integrations.whatsapp import advance_status
from sinal.store.base import Contact, Outcome

ConversationStatus = Literal["open", "closed"]

# Column lists both backends select, in the order the records' fields take them.
STATUS_COLUMNS = (
    "account_id, wamid, contact_id, status, is_template, error_code, error_title, status_at, "
    "updated_at"
)
CONVERSATION_COLUMNS = "account_id, id, contact_id, status, assigned_to, opened_at, closed_at"
LINK_COLUMNS = (
    "account_id, id, token, url, contact_id, campaign, automation_execution_id, created_at"
)

# The metrics of a message sinal sent (entity_type "message", entity_id = wamid).
SENT_METRICS = (
    METRIC_MESSAGE_SENT,
    METRIC_TEMPLATE_SENT,
    METRIC_AI_RESPONSE_SENT,
    METRIC_CAMPAIGN_SENT,
)
TEMPLATE_METRICS = (METRIC_TEMPLATE_SENT,)


@dataclass(frozen=True, slots=True)
class MessageStatus:
    """A sent message's current status (it only moves forward; failed keeps its error)."""

    account_id: UUID
    wamid: str
    contact_id: UUID
    status: str  # sent, delivered, read, failed
    is_template: bool
    error_code: int | None
    error_title: str | None
    status_at: datetime  # when Meta says the current status happened
    updated_at: datetime

    def advanced_by(self, new: MessageStatus) -> MessageStatus:
        """This row after `new` arrives: a later status replaces it, an earlier one not."""
        status = advance_status(self.status, new.status)
        is_template = self.is_template or new.is_template
        if status == self.status:
            return replace(self, is_template=is_template)
        return replace(
            self, status=new.status, is_template=is_template, error_code=new.error_code,
            error_title=new.error_title, status_at=new.status_at, updated_at=new.updated_at,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SentMessage:
    """A message sinal sent, as its send event tells: to whom, whether a template, and (when
    an automation step sent it) which automation and execution."""

    contact_id: UUID
    is_template: bool
    automation_id: UUID | None = None
    execution_id: UUID | None = None

    @classmethod
    def of_row(
        cls, contact_id: UUID, is_template: bool, automation: str | None, execution: UUID | None
    ) -> SentMessage:
        """From a send event's row: the automation only when a step emitted it (it carries
        an execution) and its ``automation_id`` property reads as an id."""
        try:
            automation_id = UUID(automation) if automation and execution else None
        except ValueError:
            automation_id = None
        return cls(contact_id, is_template, automation_id, execution if automation_id else None)


@dataclass(frozen=True, slots=True)
class WhatsAppUser:
    """The contact Meta's business-scoped user id was seen with, as it stands now, and the
    contact whose identity the phone asked about is (None: no contact has it)."""

    contact: Contact
    phone_holder: UUID | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A minimal conversation with a contact: open or closed, maybe with an agent."""

    account_id: UUID
    id: UUID
    contact_id: UUID
    status: ConversationStatus
    assigned_to: str | None
    opened_at: datetime
    closed_at: datetime | None


@dataclass(frozen=True, slots=True)
class ConversationQuery:
    """Filters for listing conversations, newest first (ids are time-ordered)."""

    account_id: UUID
    contact_id: UUID | None = None
    status: ConversationStatus | None = None
    before: UUID | None = None  # keyset cursor: conversations older than this id
    limit: int = 100


@dataclass(frozen=True, slots=True)
class Link:
    """A tracked link: a click on its short URL is redirected to `url` and recorded."""

    account_id: UUID
    id: UUID
    token: str
    url: str
    contact_id: UUID | None
    campaign: str | None
    automation_execution_id: UUID | None
    created_at: datetime


BuildOpenedEvent = Callable[[Conversation], PreparedEvent]
BuildConversationEvent = Callable[[Conversation, Conversation], PreparedEvent]


class MessagingStore(Protocol):
    """What WhatsApp processing, conversations and tracked links need from a database."""

    def find_whatsapp_user(
        self, account_id: UUID, user_id: str, phone: str | None = None
    ) -> WhatsAppUser | None:
        """The contact Meta's business-scoped user id was seen with and, given `phone`,
        the contact that has it, in one statement; None when the user id has no contact
        (an erasure deleted it meanwhile included)."""
        ...

    def last_inbound_number(self, account_id: UUID, contact_id: UUID) -> str | None:
        """The business number (``phone_number_id``) the contact last wrote to: that of
        its latest Message Received naming one; None if none does. Found back from its
        Message Received summary's last occurrence: the contact's newer events of other
        metrics are not read."""
        ...

    def link_whatsapp_user(self, account_id: UUID, user_id: str, contact_id: UUID) -> UUID:
        """Remember the user id's contact (the first one stays); the contact it names.
        `ContactNotFound` when the account does not have the contact (erased since it was
        found)."""
        ...

    def record_inbound_message(
        self, message: PreparedEvent, on_open: BuildOpenedEvent
    ) -> tuple[Outcome, Conversation | None]:
        """Record Message Received; when it is new and its contact has no open
        conversation, open one and record `on_open(conversation)` — one transaction.
        `ContactNotFound`, nothing kept, when the account does not have the message's
        contact (erased since it was found)."""
        ...

    def find_sent_message(self, account_id: UUID, wamid: str) -> SentMessage | None:
        """The message sinal sent with this wamid (its send event), or the contact its
        earlier statuses were recorded for; None when unknown."""
        ...

    def record_message_status(
        self, status: MessageStatus, event: PreparedEvent | None
    ) -> MessageStatus:
        """Advance the message's status row (see `MessageStatus.advanced_by`) and record
        its event, in one transaction; the row as it now stands. `ContactNotFound` when
        the account does not have the status's contact (erased since it was found)."""
        ...

    def get_message_status(self, account_id: UUID, wamid: str) -> MessageStatus | None:
        """A message's current status, or None."""
        ...

    def get_conversation(self, account_id: UUID, conversation_id: UUID) -> Conversation | None:
        """One conversation of the account, or None (another account's id included)."""
        ...

    def list_conversations(self, query: ConversationQuery) -> list[Conversation]:
        """Conversations matching the query, newest first."""
        ...

    def close_conversation(
        self, account_id: UUID, conversation_id: UUID, on_close: BuildConversationEvent
    ) -> Conversation | None:
        """Close an open conversation, recording `on_close(before, after)` in the same
        transaction; a closed one comes back unchanged. None if there is none."""
        ...

    def assign_conversation(
        self,
        account_id: UUID,
        conversation_id: UUID,
        agent: str,
        on_assign: BuildConversationEvent,
    ) -> Conversation | None:
        """Assign an open conversation to `agent`, recording `on_assign(before, after)`
        when the agent changes; a closed one comes back unchanged. None if there is none."""
        ...

    def save_link(self, link: Link) -> Link | None:
        """Insert a tracked link unless the account has one with its id; the stored link
        (the earlier one, when the id was taken), or None (nothing written) when its token
        is another link's. `ContactNotFound` when the account does not have the link's
        contact (erased since it was found)."""
        ...

    def find_link(self, token: str) -> Link | None:
        """The link with this token, in any account (a click names no account)."""
        ...


__all__ = [
    "CONVERSATION_COLUMNS",
    "LINK_COLUMNS",
    "SENT_METRICS",
    "STATUS_COLUMNS",
    "TEMPLATE_METRICS",
    "BuildConversationEvent",
    "BuildOpenedEvent",
    "Conversation",
    "ConversationQuery",
    "ConversationStatus",
    "Link",
    "MessageStatus",
    "MessagingStore",
    "SentMessage",
    "WhatsAppUser",
]
