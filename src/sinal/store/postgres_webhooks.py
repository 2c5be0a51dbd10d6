"""PostgreSQL side of `WebhookStore`."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from sinal.keyring import Keyring
from sinal.store.automations import Integration, opened_integration
from sinal.store.webhooks import (
    DELIVERY_COLUMNS,
    DeliveryCursor,
    DeliveryStatus,
    StoredDelivery,
)


class PostgresWebhooks:
    """Mixin for `PostgresStore`: the `WebhookStore` methods."""

    keyring: Keyring | None = None  # opens the integrations' secrets

    def _conn(self) -> AbstractContextManager[psycopg.Connection[TupleRow]]:
        raise NotImplementedError

    def find_integration(self, integration_id: UUID) -> Integration | None:
        """A live integration by id alone."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT account_id, id, kind, name, settings, secrets, created_at "
                "FROM integrations WHERE id = %s AND deleted_at IS NULL",
                (integration_id,),
            ).fetchone()
        return None if row is None else opened_integration(self.keyring, Integration(*row))

    def save_delivery(self, delivery: StoredDelivery) -> tuple[StoredDelivery, bool]:
        """Keep a delivery raw, once per (integration, delivery id)."""
        d = delivery
        with self._conn() as conn:
            row = conn.execute(
                f"INSERT INTO webhook_deliveries ({DELIVERY_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                f"ON CONFLICT (account_id, integration_id, delivery_id) DO NOTHING "
                f"RETURNING {DELIVERY_COLUMNS}",
                (d.account_id, d.id, d.integration_id, d.provider, d.topic, d.delivery_id,
                 Jsonb(d.headers), d.body, d.received_at, d.status, d.reason, d.attempts,
                 d.processed_at, d.due_at),
            ).fetchone()  # fmt: skip
            if row is not None:
                return _delivery(row), True
            earlier = conn.execute(
                f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries "
                "WHERE account_id = %s AND integration_id = %s AND delivery_id = %s",
                (d.account_id, d.integration_id, d.delivery_id),
            ).fetchone()
        if earlier is None:  # pruned (`sinal.retention`) between the two: kept anew
            return self.save_delivery(delivery)
        return _delivery(earlier), False

    def finish_delivery(
        self,
        account_id: UUID,
        delivery_id: UUID,
        status: DeliveryStatus,
        reason: str | None,
        due_at: datetime | None = None,
    ) -> None:
        """Record how processing ended (a deferred delivery's due time with it)."""
        with self._conn() as conn:
            conn.execute(
                "UPDATE webhook_deliveries SET status = %s, reason = %s, "
                "attempts = attempts + 1, processed_at = now(), due_at = coalesce(%s, due_at) "
                "WHERE account_id = %s AND id = %s",
                (status, reason, due_at, account_id, delivery_id),
            )

    def claim_deferred(self, now: datetime, limit: int, lease: float) -> list[StoredDelivery]:
        """Due deferred deliveries, pushed `lease` seconds ahead; SKIP LOCKED: concurrent
        callers take different ones."""
        with self._conn() as conn:
            rows = conn.execute(
                "WITH due AS (SELECT account_id, id FROM webhook_deliveries "
                "WHERE status = 'deferred' AND due_at <= %s ORDER BY due_at LIMIT %s "
                "FOR UPDATE SKIP LOCKED) "
                "UPDATE webhook_deliveries SET due_at = %s "
                "WHERE (account_id, id) IN (SELECT account_id, id FROM due) "
                f"RETURNING {DELIVERY_COLUMNS}",
                (now, limit, now + timedelta(seconds=lease)),
            ).fetchall()
        return sorted((_delivery(r) for r in rows), key=lambda d: (d.received_at, d.id))

    def list_deliveries(
        self,
        statuses: tuple[DeliveryStatus, ...],
        account_id: UUID | None = None,
        limit: int = 1000,
        after: DeliveryCursor | None = None,
    ) -> list[StoredDelivery]:
        """A page of deliveries in these states, oldest first (see `WebhookStore`)."""
        where, params = _filter(statuses, account_id)
        if after is not None:
            where += " AND (received_at, id) > (%s, %s)"
            params += after
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE {where} "
                "ORDER BY received_at, id LIMIT %s",
                (*params, limit),
            ).fetchall()
        return [_delivery(r) for r in rows]

    def count_deliveries(
        self, statuses: tuple[DeliveryStatus, ...], account_id: UUID | None = None
    ) -> int:
        """How many deliveries are in these states."""
        where, params = _filter(statuses, account_id)
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM webhook_deliveries WHERE {where}", params
            ).fetchone()
        return int(row[0]) if row else 0


def _filter(
    statuses: tuple[DeliveryStatus, ...], account_id: UUID | None
) -> tuple[str, tuple[Any, ...]]:
    if account_id is None:
        return "status = ANY(%s)", (list(statuses),)
    return "status = ANY(%s) AND account_id = %s", (list(statuses), account_id)


def _delivery(row: Any) -> StoredDelivery:
    values = list(row)
    values[7] = bytes(values[7])
    return StoredDelivery(*values)
