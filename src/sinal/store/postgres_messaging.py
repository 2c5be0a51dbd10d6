"""PostgreSQL side of `MessagingStore`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow

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

Conn = psycopg.Connection[TupleRow]
T = TypeVar("T")

# The newest Message Received naming a phone_number_id. Its summary row (the primary key)
# says when the contact's last one occurred: the scan of events_contact_time starts there,
# so the contact's newer events of other metrics (clicks, orders, statuses: thousands) are
# not read, nor is any event of a contact who never wrote (no summary row). Walking back
# from the contact's newest event (or the account's newest message) read them all.
_LAST_INBOUND_NUMBER = (
    "SELECT (SELECT e.properties->>'phone_number_id' FROM events e "
    "  WHERE e.account_id = s.account_id AND e.contact_id = s.contact_id "
    "  AND e.occurred_at <= s.last_event_at AND e.metric_name = s.metric_name "
    "  AND e.properties ? 'phone_number_id' "
    "  ORDER BY e.occurred_at DESC, e.id DESC LIMIT 1) "
    "FROM contact_metrics_summary s "
    "WHERE s.account_id = %s AND s.contact_id = %s AND s.metric_name = %s "
    "ORDER BY s.last_event_at DESC LIMIT 1"  # a row per currency (migration 0031)
)


def _record(conn: Conn, events: Sequence[PreparedEvent]) -> list[Outcome]:
    from sinal.store.postgres import _record_in

    return _record_in(conn, events)


class PostgresMessaging:
    """Mixin for `PostgresStore`: the `MessagingStore` methods."""

    def _conn(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _retrying(self, work: Callable[[Conn], T]) -> T:
        raise NotImplementedError

    # -- WhatsApp users and inbound messages ---------------------------------------------

    def find_whatsapp_user(
        self, account_id: UUID, user_id: str, phone: str | None = None
    ) -> WhatsAppUser | None:
        """The contact the user id was seen with, and the one that has `phone`."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {qualified(CONTACT_COLUMNS, 'c')}, "
                "(SELECT i.contact_id FROM contact_identities i "
                "WHERE i.account_id = u.account_id AND i.kind = 'phone' AND i.value = %s) "
                "FROM whatsapp_users u "
                "JOIN contacts c ON c.account_id = u.account_id AND c.id = u.contact_id "
                "WHERE u.account_id = %s AND u.user_id = %s",
                (phone, account_id, user_id),
            ).fetchone()
        return None if row is None else WhatsAppUser(Contact(*row[:8]), row[8])

    def last_inbound_number(self, account_id: UUID, contact_id: UUID) -> str | None:
        """The newest Message Received naming a phone_number_id, read back from its
        summary's last occurrence (see `_LAST_INBOUND_NUMBER`)."""
        with self._conn() as conn:
            row = conn.execute(
                _LAST_INBOUND_NUMBER, (account_id, contact_id, METRIC_MESSAGE_RECEIVED)
            ).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    def link_whatsapp_user(self, account_id: UUID, user_id: str, contact_id: UUID) -> UUID:
        """Remember the user id's contact; the first one stays."""
        with self._tx() as conn:
            row = conn.execute(
                "INSERT INTO whatsapp_users (account_id, user_id, contact_id) "
                "VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING contact_id",
                (account_id, user_id, contact_id),
            ).fetchone()
            if row is None:
                row = conn.execute(
                    "SELECT contact_id FROM whatsapp_users WHERE account_id = %s AND user_id = %s",
                    (account_id, user_id),
                ).fetchone()
        assert row is not None
        found: UUID = row[0]
        return found

    def record_inbound_message(
        self, message: PreparedEvent, on_open: BuildOpenedEvent
    ) -> tuple[Outcome, Conversation | None]:
        """Message Received and, for a new message with none open, a conversation."""

        def work(conn: Conn) -> tuple[Outcome, Conversation | None]:
            [outcome] = _record(conn, [message])
            if outcome.reason == "contact_not_found":  # erased since it was found
                raise ContactNotFound(outcome.message)
            if outcome.kind != "created":
                return outcome, None
            # The partial unique index (one open per contact) decides a race: the loser
            # waits for the winner's commit, then inserts nothing.
            row = conn.execute(
                f"INSERT INTO conversations ({CONVERSATION_COLUMNS}) "
                "VALUES (%s, %s, %s, 'open', NULL, %s, NULL) "
                f"ON CONFLICT DO NOTHING RETURNING {CONVERSATION_COLUMNS}",
                (message.account_id, new_id(), message.contact_id, message.occurred_at),
            ).fetchone()
            if row is None:
                return outcome, None
            opened = Conversation(*row)
            _record(conn, [on_open(opened)])
            return outcome, opened

        return self._retrying(work)

    # -- statuses ------------------------------------------------------------------------

    def find_sent_message(self, account_id: UUID, wamid: str) -> SentMessage | None:
        """The send event with this wamid (a template's first), else the status row."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT contact_id, metric_name = ANY(%s), properties->>'automation_id', "
                "automation_execution_id FROM events "
                "WHERE account_id = %s AND entity_type = 'message' AND entity_id = %s "
                "AND metric_name = ANY(%s) ORDER BY 2 DESC, occurred_at LIMIT 1",
                (list(TEMPLATE_METRICS), account_id, wamid, list(SENT_METRICS)),
            ).fetchone()
            if row is None:
                row = conn.execute(
                    "SELECT contact_id, is_template, NULL, NULL FROM message_statuses "
                    "WHERE account_id = %s AND wamid = %s",
                    (account_id, wamid),
                ).fetchone()
        if row is None:
            return None
        return SentMessage.of_row(row[0], bool(row[1]), row[2], row[3])

    def record_message_status(
        self, status: MessageStatus, event: PreparedEvent | None
    ) -> MessageStatus:
        """Insert the row, or advance it under its row lock; record the event."""
        s = status

        def work(conn: Conn) -> MessageStatus:
            row = conn.execute(
                f"INSERT INTO message_statuses ({STATUS_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT DO NOTHING RETURNING {STATUS_COLUMNS}",
                (s.account_id, s.wamid, s.contact_id, s.status, s.is_template, s.error_code,
                 s.error_title, s.status_at, s.updated_at),
            ).fetchone()  # fmt: skip
            # inserted: the first status of this message; else advance the existing row
            current = MessageStatus(*row) if row is not None else self._advance_status(conn, s)
            if event is not None:
                _record(conn, [event])
            return current

        return self._retrying(work)

    @staticmethod
    def _advance_status(conn: Conn, status: MessageStatus) -> MessageStatus:
        row = conn.execute(
            f"SELECT {STATUS_COLUMNS} FROM message_statuses "
            "WHERE account_id = %s AND wamid = %s FOR UPDATE",
            (status.account_id, status.wamid),
        ).fetchone()
        assert row is not None
        before = MessageStatus(*row)
        after = before.advanced_by(status)
        if after != before:
            conn.execute(
                "UPDATE message_statuses SET status = %s, is_template = %s, error_code = %s, "
                "error_title = %s, status_at = %s, updated_at = %s "
                "WHERE account_id = %s AND wamid = %s",
                (after.status, after.is_template, after.error_code, after.error_title,
                 after.status_at, after.updated_at, after.account_id, after.wamid),
            )  # fmt: skip
        return after

    def get_message_status(self, account_id: UUID, wamid: str) -> MessageStatus | None:
        """A message's current status."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {STATUS_COLUMNS} FROM message_statuses "
                "WHERE account_id = %s AND wamid = %s",
                (account_id, wamid),
            ).fetchone()
        return None if row is None else MessageStatus(*row)

    # -- conversations -------------------------------------------------------------------

    def get_conversation(self, account_id: UUID, conversation_id: UUID) -> Conversation | None:
        """One conversation of the account."""
        with self._conn() as conn:
            return _conversation(conn, account_id, conversation_id, lock=False)

    def list_conversations(self, query: ConversationQuery) -> list[Conversation]:
        """Conversations, newest first (ids are UUIDv7: id order is creation order)."""
        q = query
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE account_id = %s "
                "AND (%s::uuid IS NULL OR contact_id = %s) AND (%s::text IS NULL OR status = %s) "
                "AND (%s::uuid IS NULL OR id < %s) ORDER BY id DESC LIMIT %s",
                (q.account_id, q.contact_id, q.contact_id, q.status, q.status, q.before,
                 q.before, q.limit),
            ).fetchall()  # fmt: skip
        return [Conversation(*r) for r in rows]

    def close_conversation(
        self, account_id: UUID, conversation_id: UUID, on_close: BuildConversationEvent
    ) -> Conversation | None:
        """Close under the row lock; the event commits with the change."""

        def work(conn: Conn) -> Conversation | None:
            before = _conversation(conn, account_id, conversation_id, lock=True)
            if before is None or before.status == "closed":
                return before
            row = conn.execute(
                "UPDATE conversations SET status = 'closed', closed_at = now() "
                f"WHERE account_id = %s AND id = %s RETURNING {CONVERSATION_COLUMNS}",
                (account_id, conversation_id),
            ).fetchone()
            assert row is not None
            after = Conversation(*row)
            _record(conn, [on_close(before, after)])
            return after

        return self._retrying(work)

    def assign_conversation(
        self,
        account_id: UUID,
        conversation_id: UUID,
        agent: str,
        on_assign: BuildConversationEvent,
    ) -> Conversation | None:
        """Assign under the row lock; the event commits with the change."""

        def work(conn: Conn) -> Conversation | None:
            before = _conversation(conn, account_id, conversation_id, lock=True)
            if before is None or before.status == "closed" or before.assigned_to == agent:
                return before
            row = conn.execute(
                "UPDATE conversations SET assigned_to = %s "
                f"WHERE account_id = %s AND id = %s RETURNING {CONVERSATION_COLUMNS}",
                (agent, account_id, conversation_id),
            ).fetchone()
            assert row is not None
            after = Conversation(*row)
            _record(conn, [on_assign(before, after)])
            return after

        return self._retrying(work)

    # -- tracked links -------------------------------------------------------------------

    def save_link(self, link: Link) -> Link | None:
        """Insert, unless the account has a link with its id (returned) or another link
        (of any account) has the token (None)."""
        k = link

        def work(conn: Conn) -> Link | None:
            row = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM links WHERE account_id = %s AND id = %s",
                (k.account_id, k.id),
            ).fetchone()
            if row is not None:
                return Link(*row)
            taken = conn.execute("SELECT 1 FROM links WHERE token = %s", (k.token,)).fetchone()
            if taken is not None:
                return None
            # A concurrent insert of the same id makes this one wait for it, then do nothing.
            row = conn.execute(
                f"INSERT INTO links ({LINK_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT (account_id, id) DO NOTHING RETURNING {LINK_COLUMNS}",
                (k.account_id, k.id, k.token, k.url, k.contact_id, k.campaign,
                 k.automation_execution_id, k.created_at),
            ).fetchone()  # fmt: skip
            if row is None:
                row = conn.execute(
                    f"SELECT {LINK_COLUMNS} FROM links WHERE account_id = %s AND id = %s",
                    (k.account_id, k.id),
                ).fetchone()
            return None if row is None else Link(*row)

        return self._retrying(work)

    def find_link(self, token: str) -> Link | None:
        """The one link with this token; None when none (or, never in practice, two)."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {LINK_COLUMNS} FROM links WHERE token = %s LIMIT 2", (token,)
            ).fetchall()
        return Link(*rows[0]) if len(rows) == 1 else None


def _conversation(
    conn: Conn, account_id: UUID, conversation_id: UUID, *, lock: bool
) -> Conversation | None:
    row: Any = conn.execute(
        f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE account_id = %s AND id = %s"
        + (" FOR UPDATE" if lock else ""),
        (account_id, conversation_id),
    ).fetchone()
    return None if row is None else Conversation(*row)
