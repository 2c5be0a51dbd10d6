"""SQLite side of `WebhookStore`."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import orjson

from sinal.events import dumps_json
from sinal.keyring import Keyring
from sinal.store.automations import Integration
from sinal.store.webhooks import (
    DELIVERY_COLUMNS,
    DeliveryCursor,
    DeliveryStatus,
    StoredDelivery,
)


class SQLiteWebhooks:
    """Mixin for `SQLiteStore`: the `WebhookStore` methods."""

    keyring: Keyring | None = None  # opens the integrations' secrets

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def find_integration(self, integration_id: UUID) -> Integration | None:
        """A live integration by id alone."""
        from sinal.store.sqlite_automations import _integration

        with self._read() as conn:
            row = conn.execute(
                "SELECT account_id, id, kind, name, settings, secrets, created_at "
                "FROM integrations WHERE id = ? AND deleted_at IS NULL",
                (str(integration_id),),
            ).fetchone()
        return None if row is None else _integration(row, self.keyring)

    def save_delivery(self, delivery: StoredDelivery) -> tuple[StoredDelivery, bool]:
        """Keep a delivery raw, once per (integration, delivery id)."""
        from sinal.store.sqlite import ts

        d = delivery
        with self._write() as conn:
            row = conn.execute(
                f"INSERT INTO webhook_deliveries ({DELIVERY_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                f"ON CONFLICT (account_id, integration_id, delivery_id) DO NOTHING "
                f"RETURNING {DELIVERY_COLUMNS}",
                (str(d.account_id), str(d.id), str(d.integration_id), d.provider, d.topic,
                 d.delivery_id, dumps_json(d.headers), d.body, ts(d.received_at), d.status,
                 d.reason, d.attempts, _opt_ts(d.processed_at), _opt_ts(d.due_at)),
            ).fetchone()  # fmt: skip
            if row is not None:
                return _delivery(row), True
            earlier = conn.execute(
                f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries "
                "WHERE account_id = ? AND integration_id = ? AND delivery_id = ?",
                (str(d.account_id), str(d.integration_id), d.delivery_id),
            ).fetchone()
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
        from sinal.store.sqlite import ts

        with self._write() as conn:
            conn.execute(
                "UPDATE webhook_deliveries SET status = ?, reason = ?, attempts = attempts + 1, "
                "processed_at = ?, due_at = coalesce(?, due_at) WHERE account_id = ? AND id = ?",
                (status, reason, ts(datetime.now(UTC)), _opt_ts(due_at), str(account_id),
                 str(delivery_id)),
            )  # fmt: skip

    def claim_deferred(self, now: datetime, limit: int, lease: float) -> list[StoredDelivery]:
        """Due deferred deliveries, pushed `lease` seconds ahead (one writer: no race)."""
        from sinal.store.sqlite import ts

        with self._write() as conn:
            rows = conn.execute(
                "UPDATE webhook_deliveries SET due_at = ? WHERE (account_id, id) IN ("
                "SELECT account_id, id FROM webhook_deliveries "
                "WHERE status = 'deferred' AND due_at <= ? ORDER BY due_at LIMIT ?) "
                f"RETURNING {DELIVERY_COLUMNS}",
                (ts(now + timedelta(seconds=lease)), ts(now), limit),
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
        from sinal.store.sqlite import ts

        where, params = _filter(statuses, account_id)
        if after is not None:
            where += " AND (received_at, id) > (?, ?)"
            params += (ts(after[0]), str(after[1]))
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries WHERE {where} "
                "ORDER BY received_at, id LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [_delivery(r) for r in rows]

    def count_deliveries(
        self, statuses: tuple[DeliveryStatus, ...], account_id: UUID | None = None
    ) -> int:
        """How many deliveries are in these states."""
        where, params = _filter(statuses, account_id)
        with self._read() as conn:
            row = conn.execute(
                f"SELECT count(*) FROM webhook_deliveries WHERE {where}", params
            ).fetchone()
        return int(row[0]) if row else 0


def _filter(
    statuses: tuple[DeliveryStatus, ...], account_id: UUID | None
) -> tuple[str, tuple[Any, ...]]:
    where = f"status IN ({', '.join('?' for _ in statuses)})"
    if account_id is None:
        return where, tuple(statuses)
    return f"{where} AND account_id = ?", (*statuses, str(account_id))


def _delivery(row: Any) -> StoredDelivery:
    from sinal.store.sqlite import parse_ts

    return StoredDelivery(
        UUID(row[0]), UUID(row[1]), UUID(row[2]), row[3], row[4], row[5], orjson.loads(row[6]),
        bytes(row[7]), parse_ts(row[8]), row[9], row[10], row[11],
        None if row[12] is None else parse_ts(row[12]),
        None if row[13] is None else parse_ts(row[13]),
    )  # fmt: skip


def _opt_ts(when: datetime | None) -> str | None:
    from sinal.store.sqlite import ts

    return None if when is None else ts(when)
