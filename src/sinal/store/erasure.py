"""Erasing a contact (LGPD art. 18 VI, GDPR art. 17): what goes, in which order, in one
transaction (the backends' mixins, `sqlite_erasure.py` and `postgres_erasure.py`).

Every table that holds a `contact_id` or the contact's data:

- deleted: its events (whole: events are never edited, DESIGN.md invariant 9) with their
  outbox rows, its `contact_metrics_summary` rows (so every other contact's summaries
  still equal their events, invariant 8), its executions (unfinished or not) with their
  steps, tags, identities, conversations, message statuses, WhatsApp users, links,
  checkouts (their `details` hold the buyer's identities) and the rejections of events
  naming it or replayed to it (by their `contact_id`, migration 0020);
- detached: its orders keep their totals and status (revenue stays what it was) and lose
  their `contact_id`; an order holds no identity of its own;
- left to retention: `webhook_deliveries`, raw provider bodies in which the contact's data
  cannot be found reliably (`SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS`).

The outbox goes before the executions: on PostgreSQL a dispatcher turning one of the
contact's outbox rows into executions holds that row, so the erasure waits for it and then
deletes the executions it committed. The executions are taken (`FOR UPDATE`) before their
steps go: a worker starting or finishing a step holds its execution's row, so the erasure
waits for that step's record and deletes it; a step that comes after finds no execution.
"""

from __future__ import annotations

from typing import Any, Protocol
from uuid import UUID

# Tables whose rows carry the contact's id, deleted by it (after the outbox and the
# executions, which are found through the events and the contact).
_OWNED = (
    "events", "contact_metrics_summary", "contact_tags", "contact_identities",
    "message_statuses", "whatsapp_users", "conversations", "links", "checkouts", "rejections",
)  # fmt: skip


def erase_statements(account: str, contact: str, lock: str = "") -> tuple[str, ...]:
    """The statements of an erasure, in order, with `account` and `contact` the backend's
    placeholders: first the contact's row (taken with `lock`, as its executions are before
    their steps go), then the deletes."""
    of_contact = f"account_id = {account} AND contact_id = {contact}"
    return (
        f"SELECT 1 FROM contacts WHERE account_id = {account} AND id = {contact}{lock}",
        f"DELETE FROM outbox WHERE account_id = {account} AND event_id IN "
        f"(SELECT id FROM events WHERE {of_contact})",
        f"SELECT 1 FROM executions WHERE {of_contact}{lock}",
        f"DELETE FROM execution_steps WHERE account_id = {account} AND execution_id IN "
        f"(SELECT id FROM executions WHERE {of_contact})",
        f"DELETE FROM executions WHERE {of_contact}",
        *(f"DELETE FROM {table} WHERE {of_contact}" for table in _OWNED),
        f"UPDATE orders SET contact_id = NULL WHERE {of_contact}",
        f"DELETE FROM contacts WHERE account_id = {account} AND id = {contact}",
    )


class _Cursor(Protocol):
    def fetchone(self) -> Any: ...


class Connection(Protocol):
    """What an erasure uses of a connection (sqlite3's and psycopg's alike)."""

    def execute(self, statement: str, params: dict[str, Any], /) -> _Cursor:
        """Run one statement with named parameters."""
        ...


def erase_in(conn: Connection, statements: tuple[str, ...], params: dict[str, Any]) -> bool:
    """Run `erase_statements` in the caller's transaction; False, having deleted nothing,
    if the first finds no contact."""
    find, *deletes = statements
    if conn.execute(find, params).fetchone() is None:
        return False
    for statement in deletes:
        conn.execute(statement, params)
    return True


class ErasureStore(Protocol):
    """What `Ledger.erase_contact` needs from a database."""

    def erase_contact(self, account_id: UUID, contact_id: UUID) -> bool:
        """Delete the contact and everything of it (see the module) in one transaction;
        False if the account has no such contact."""
        ...
