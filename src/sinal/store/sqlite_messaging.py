"""SQLite side of `MessagingStore` (every write under the one write lock, BEGIN IMMEDIATE)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from sinal.catalog import METRIC_MESSAGE_RECEIVED
from sinal.errors import ContactNotFound
from sinal.events import PreparedEvent
from sinal.ids import new_id
from sinal.store.base import CONTACT_COLUMNS, Contact, Outcome, qualified
from sinal.store.messaging import (
    CONVERSATION_COLUMNS,
    LINK_COLUMNS,
    SENT_METRICS,
    STATUS_COLUMNS,
    TEMPLATE_METRICS,
    BuildConversationEvent,
    BuildOpenedEvent,
    Conversation,
    ConversationQuery,
    Link,
    MessageStatus,
    SentMessage,
    WhatsAppUser,
)
from sinal.store.sqlite_erasure import require_contact

# As PostgreSQL's (postgres_messaging.py): from the summary's last occurrence back, by
# events_contact_time, reading none of the contact's newer events (timestamps are
# fixed-width text, the summary's written from the event's own). Named: without
# statistics the planner took events_metric_time, walking the account's messages back
# from there until one of the contact's.
_LAST_INBOUND_NUMBER = (
    "SELECT (SELECT json_extract(e.properties, '$.phone_number_id') "
    "  FROM events e INDEXED BY events_contact_time "
    "  WHERE e.account_id = s.account_id AND e.contact_id = s.contact_id "
    "  AND e.occurred_at <= s.last_event_at AND e.metric_name = s.metric_name "
    "  AND json_extract(e.properties, '$.phone_number_id') IS NOT NULL "
    "  ORDER BY e.occurred_at DESC, e.id DESC LIMIT 1) "
    "FROM contact_metrics_summary s "
    "WHERE s.account_id = ? AND s.contact_id = ? AND s.metric_name = ? "
    "ORDER BY s.last_event_at DESC LIMIT 1"  # a row per currency (migration 0031)
)


def _ts(when: datetime) -> str:
    from sinal.store.sqlite import ts

    return ts(when)


def _parse(text: str) -> datetime:
    from sinal.store.sqlite import parse_ts

    return parse_ts(text)


def _contact(row: Sequence[Any]) -> Contact:
    from sinal.store.sqlite import contact_of

    return contact_of(row)


def _record(conn: sqlite3.Connection, events: Sequence[PreparedEvent]) -> list[Outcome]:
    from sinal.store.sqlite import _record_in

    return _record_in(conn, events)


def _marks(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)


class SQLiteMessaging:
    """Mixin for `SQLiteStore`: the `MessagingStore` methods."""

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    # -- WhatsApp users and inbound messages ---------------------------------------------

    def find_whatsapp_user(
        self, account_id: UUID, user_id: str, phone: str | None = None
    ) -> WhatsAppUser | None:
        """The contact the user id was seen with, and the one that has `phone`."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {qualified(CONTACT_COLUMNS, 'c')}, "
                "(SELECT i.contact_id FROM contact_identities i "
                "WHERE i.account_id = u.account_id AND i.kind = 'phone' AND i.value = ?) "
                "FROM whatsapp_users u "
                "JOIN contacts c ON c.account_id = u.account_id AND c.id = u.contact_id "
                "WHERE u.account_id = ? AND u.user_id = ?",
                (phone, str(account_id), user_id),
            ).fetchone()
        if row is None:
            return None
        return WhatsAppUser(_contact(row[:8]), None if row[8] is None else UUID(row[8]))

    def last_inbound_number(self, account_id: UUID, contact_id: UUID) -> str | None:
        """The newest Message Received naming a phone_number_id, read back from its
        summary's last occurrence (see `_LAST_INBOUND_NUMBER`)."""
        with self._read() as conn:
            row = conn.execute(
                _LAST_INBOUND_NUMBER,
                (str(account_id), str(contact_id), METRIC_MESSAGE_RECEIVED),
            ).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def link_whatsapp_user(self, account_id: UUID, user_id: str, contact_id: UUID) -> UUID:
        """Remember the user id's contact; the first one stays. `ContactNotFound` when the
        account does not have the contact (erased since it was found)."""
        with self._write() as conn:
            require_contact(conn, account_id, contact_id)
            conn.execute(
                "INSERT INTO whatsapp_users (account_id, user_id, contact_id, created_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (str(account_id), user_id, str(contact_id), _ts(datetime.now(UTC))),
            )
            row = conn.execute(
                "SELECT contact_id FROM whatsapp_users WHERE account_id = ? AND user_id = ?",
                (str(account_id), user_id),
            ).fetchone()
        return UUID(row[0])

    def record_inbound_message(
        self, message: PreparedEvent, on_open: BuildOpenedEvent
    ) -> tuple[Outcome, Conversation | None]:
        """Message Received and, for a new message with none open, a conversation."""
        with self._write() as conn:
            [outcome] = _record(conn, [message])
            if outcome.reason == "contact_not_found":  # erased since it was found
                raise ContactNotFound(outcome.message)
            if outcome.kind != "created":
                return outcome, None
            row = conn.execute(
                f"INSERT INTO conversations ({CONVERSATION_COLUMNS}) "
                "VALUES (?, ?, ?, 'open', NULL, ?, NULL) "
                f"ON CONFLICT DO NOTHING RETURNING {CONVERSATION_COLUMNS}",
                (str(message.account_id), str(new_id()), str(message.contact_id),
                 _ts(message.occurred_at)),
            ).fetchone()  # fmt: skip
            if row is None:
                return outcome, None
            opened = _conversation_row(row)
            _record(conn, [on_open(opened)])
            return outcome, opened

    # -- statuses ------------------------------------------------------------------------

    def find_sent_message(self, account_id: UUID, wamid: str) -> SentMessage | None:
        """The send event with this wamid (a template's first), else the status row."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT contact_id, metric_name IN ({_marks(TEMPLATE_METRICS)}), "
                "json_extract(properties, '$.automation_id'), automation_execution_id FROM events "
                "WHERE account_id = ? AND entity_type = 'message' AND entity_id = ? "
                f"AND metric_name IN ({_marks(SENT_METRICS)}) ORDER BY 2 DESC, occurred_at "
                "LIMIT 1",
                (*TEMPLATE_METRICS, str(account_id), wamid, *SENT_METRICS),
            ).fetchone()
            if row is None:
                row = conn.execute(
                    "SELECT contact_id, is_template, NULL, NULL FROM message_statuses "
                    "WHERE account_id = ? AND wamid = ?",
                    (str(account_id), wamid),
                ).fetchone()
        if row is None:
            return None
        return SentMessage.of_row(UUID(row[0]), bool(row[1]), row[2], _opt_uuid(row[3]))

    def record_message_status(
        self, status: MessageStatus, event: PreparedEvent | None
    ) -> MessageStatus:
        """Insert the row or advance it; record the event; one transaction. `ContactNotFound`
        when the account does not have the contact (erased since the message was found)."""
        s = status
        with self._write() as conn:
            require_contact(conn, s.account_id, s.contact_id)
            row = conn.execute(
                f"SELECT {STATUS_COLUMNS} FROM message_statuses WHERE account_id = ? AND wamid = ?",
                (str(s.account_id), s.wamid),
            ).fetchone()
            current = s if row is None else _status_row(row).advanced_by(s)
            if row is None or current != _status_row(row):
                conn.execute(
                    f"INSERT OR REPLACE INTO message_statuses ({STATUS_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (str(current.account_id), current.wamid, str(current.contact_id),
                     current.status, int(current.is_template), current.error_code,
                     current.error_title, _ts(current.status_at), _ts(current.updated_at)),
                )  # fmt: skip
            if event is not None:
                _record(conn, [event])
        return current

    def get_message_status(self, account_id: UUID, wamid: str) -> MessageStatus | None:
        """A message's current status."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {STATUS_COLUMNS} FROM message_statuses WHERE account_id = ? AND wamid = ?",
                (str(account_id), wamid),
            ).fetchone()
        return None if row is None else _status_row(row)

    # -- conversations -------------------------------------------------------------------

    def get_conversation(self, account_id: UUID, conversation_id: UUID) -> Conversation | None:
        """One conversation of the account."""
        with self._read() as conn:
            return _conversation(conn, account_id, conversation_id)

    def list_conversations(self, query: ConversationQuery) -> list[Conversation]:
        """Conversations, newest first (UUIDv7 text order is creation order)."""
        q = query
        contact = None if q.contact_id is None else str(q.contact_id)
        before = None if q.before is None else str(q.before)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE account_id = ? "
                "AND (? IS NULL OR contact_id = ?) AND (? IS NULL OR status = ?) "
                "AND (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?",
                (str(q.account_id), contact, contact, q.status, q.status, before, before,
                 q.limit),
            ).fetchall()  # fmt: skip
        return [_conversation_row(r) for r in rows]

    def close_conversation(
        self, account_id: UUID, conversation_id: UUID, on_close: BuildConversationEvent
    ) -> Conversation | None:
        """Close it; the event commits with the change."""
        with self._write() as conn:
            before = _conversation(conn, account_id, conversation_id)
            if before is None or before.status == "closed":
                return before
            row = conn.execute(
                "UPDATE conversations SET status = 'closed', closed_at = ? "
                f"WHERE account_id = ? AND id = ? RETURNING {CONVERSATION_COLUMNS}",
                (_ts(datetime.now(UTC)), str(account_id), str(conversation_id)),
            ).fetchone()
            after = _conversation_row(row)
            _record(conn, [on_close(before, after)])
            return after

    def assign_conversation(
        self,
        account_id: UUID,
        conversation_id: UUID,
        agent: str,
        on_assign: BuildConversationEvent,
    ) -> Conversation | None:
        """Assign it; the event commits with the change."""
        with self._write() as conn:
            before = _conversation(conn, account_id, conversation_id)
            if before is None or before.status == "closed" or before.assigned_to == agent:
                return before
            row = conn.execute(
                "UPDATE conversations SET assigned_to = ? "
                f"WHERE account_id = ? AND id = ? RETURNING {CONVERSATION_COLUMNS}",
                (agent, str(account_id), str(conversation_id)),
            ).fetchone()
            after = _conversation_row(row)
            _record(conn, [on_assign(before, after)])
            return after

    # -- tracked links -------------------------------------------------------------------

    def save_link(self, link: Link) -> Link | None:
        """Insert, unless the account has a link with its id (returned) or another link
        (of any account) has the token (None)."""
        k = link
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM links WHERE account_id = ? AND id = ?",
                (str(k.account_id), str(k.id)),
            ).fetchone()
            if row is not None:
                return _link_row(row)
            if conn.execute("SELECT 1 FROM links WHERE token = ?", (k.token,)).fetchone():
                return None
            if k.contact_id is not None:
                require_contact(conn, k.account_id, k.contact_id)
            conn.execute(
                f"INSERT INTO links ({LINK_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (str(k.account_id), str(k.id), k.token, k.url, _opt(k.contact_id), k.campaign,
                 _opt(k.automation_execution_id), _ts(k.created_at)),
            )  # fmt: skip
        return link

    def find_link(self, token: str) -> Link | None:
        """The one link with this token; None when none (or, never in practice, two)."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM links WHERE token = ? LIMIT 2", (token,)
            ).fetchall()
        return _link_row(rows[0]) if len(rows) == 1 else None


def _opt(value: UUID | None) -> str | None:
    return None if value is None else str(value)


def _opt_uuid(text: str | None) -> UUID | None:
    return None if text is None else UUID(text)


def _conversation(
    conn: sqlite3.Connection, account_id: UUID, conversation_id: UUID
) -> Conversation | None:
    row = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE account_id = ? AND id = ?",
        (str(account_id), str(conversation_id)),
    ).fetchone()
    return None if row is None else _conversation_row(row)


def _conversation_row(r: Sequence[Any]) -> Conversation:
    return Conversation(
        UUID(r[0]), UUID(r[1]), UUID(r[2]), r[3], r[4], _parse(r[5]),
        None if r[6] is None else _parse(r[6]),
    )  # fmt: skip


def _link_row(r: Sequence[Any]) -> Link:
    return Link(
        UUID(r[0]), UUID(r[1]), r[2], r[3], _opt_uuid(r[4]), r[5], _opt_uuid(r[6]),
        _parse(r[7]),
    )  # fmt: skip


def _status_row(r: Sequence[Any]) -> MessageStatus:
    return MessageStatus(
        UUID(r[0]), r[1], UUID(r[2]), r[3], bool(r[4]), r[5], r[6], _parse(r[7]), _parse(r[8])
    )
