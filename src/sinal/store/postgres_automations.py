"""PostgreSQL side of `AutomationStore`: integrations, automations, outbox fan-out, executions.

Workers on many machines share the work through row locks: the outbox is fanned out under
`FOR UPDATE SKIP LOCKED` inside one transaction (a dead worker's transaction aborts and its
rows become visible again), and executions are claimed with a lease (`claimed_until`) that
a dead worker's successor waits out. Every write of a claimed execution is fenced by
`claimed_by`, so a worker whose lease was taken over cannot move it any more.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

from sinal.ids import new_id
from sinal.store.automations import (
    Advance,
    AutomationRow,
    Chooser,
    Claim,
    Execution,
    FanOut,
    Integration,
    IntegrationKind,
    StepRecord,
    StepStatus,
)
from sinal.store.base import Contact, StoredEvent

_EXECUTION_COLUMNS = (
    "account_id, id, automation_id, event_id, contact_id, status, next_step, attempts, run_at, "
    "last_error, created_at, updated_at"
)
_STEP_COLUMNS = (
    "step_index, step_type, status, attempts, result, error, event_id, started_at, finished_at"
)
_AUTOMATION_COLUMNS = "account_id, id, name, status, trigger_metric, spec, created_at, updated_at"
_INTEGRATION_COLUMNS = "account_id, id, kind, name, settings, secrets, created_at"
# Fencing: only the worker holding a live claim may write the execution.
_HELD = "account_id = %s AND id = %s AND claimed_by = %s AND claimed_until > now()"

Conn = psycopg.Connection[TupleRow]


class PostgresAutomations:
    """Mixin for `PostgresStore`: the `AutomationStore` methods."""

    def _conn(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    # -- integrations --------------------------------------------------------------------

    def create_integration(self, integration: Integration) -> None:
        """Insert an integration."""
        i = integration
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO integrations ({_INTEGRATION_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (i.account_id, i.id, i.kind, i.name, Jsonb(i.settings), Jsonb(i.secrets),
                 i.created_at),
            )  # fmt: skip

    def get_integration(self, account_id: UUID, integration_id: UUID) -> Integration | None:
        """One live integration of the account."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_INTEGRATION_COLUMNS} FROM integrations "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, integration_id),
            ).fetchone()
        return None if row is None else Integration(*row)

    def list_integrations(
        self, account_id: UUID, kind: IntegrationKind | None = None
    ) -> list[Integration]:
        """The account's live integrations, oldest first."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_INTEGRATION_COLUMNS} FROM integrations WHERE account_id = %s "
                "AND deleted_at IS NULL AND (%s::text IS NULL OR kind = %s) ORDER BY created_at",
                (account_id, kind, kind),
            ).fetchall()
        return [Integration(*r) for r in rows]

    def delete_integration(self, account_id: UUID, integration_id: UUID) -> bool:
        """Soft-delete an integration."""
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE integrations SET deleted_at = now() "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, integration_id),
            )
            return cur.rowcount == 1

    # -- automations ---------------------------------------------------------------------

    def create_automation(self, row: AutomationRow) -> None:
        """Insert an automation."""
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO automations ({_AUTOMATION_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (row.account_id, row.id, row.name, row.status, row.trigger_metric,
                 Jsonb(row.spec), row.created_at, row.updated_at),
            )  # fmt: skip

    def get_automation(self, account_id: UUID, automation_id: UUID) -> AutomationRow | None:
        """One live automation."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_AUTOMATION_COLUMNS} FROM automations "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, automation_id),
            ).fetchone()
        return None if row is None else AutomationRow(*row)

    def list_automations(self, account_id: UUID) -> list[AutomationRow]:
        """The account's live automations, oldest first."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_AUTOMATION_COLUMNS} FROM automations "
                "WHERE account_id = %s AND deleted_at IS NULL ORDER BY created_at, id",
                (account_id,),
            ).fetchall()
        return [AutomationRow(*r) for r in rows]

    def update_automation(self, row: AutomationRow) -> bool:
        """Replace name, status, trigger and spec."""
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE automations SET name = %s, status = %s, trigger_metric = %s, spec = %s, "
                "updated_at = %s WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (row.name, row.status, row.trigger_metric, Jsonb(row.spec), row.updated_at,
                 row.account_id, row.id),
            )  # fmt: skip
            return cur.rowcount == 1

    def delete_automation(self, account_id: UUID, automation_id: UUID) -> bool:
        """Soft-delete an automation."""
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE automations SET deleted_at = now() "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, automation_id),
            )
            return cur.rowcount == 1

    # -- dispatch ------------------------------------------------------------------------

    def fan_out(self, choose: Chooser, limit: int) -> FanOut:
        """Outbox rows → executions, in one transaction (see the module docstring)."""
        from sinal.store.postgres import _EVENT_COLUMNS

        report = FanOut()
        with self._tx() as conn:
            keys = conn.execute(
                "SELECT account_id, event_id FROM outbox WHERE available_at <= now() "
                "ORDER BY available_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (limit,),
            ).fetchall()
            if not keys:
                return report
            accounts, ids = [k[0] for k in keys], [k[1] for k in keys]
            events = [
                StoredEvent(*r)
                for r in conn.execute(
                    f"SELECT {_qualified(_EVENT_COLUMNS, 'e')} FROM events e "
                    "JOIN unnest(%s::uuid[], %s::uuid[]) AS k(a, i) "
                    "ON e.account_id = k.a AND e.id = k.i ORDER BY e.received_at, e.id",
                    (accounts, ids),
                )
            ]
            listening = _listening(conn, events)
            rows: list[tuple[UUID, UUID, UUID, UUID, UUID]] = []
            for event in events:
                candidates = listening.get((event.account_id, event.metric_name), [])
                for automation_id in choose(event, candidates):
                    rows.append((event.account_id, new_id(), automation_id, event.id,
                                 event.contact_id))  # fmt: skip
            if rows:
                inserted = conn.execute(
                    "INSERT INTO executions (account_id, id, automation_id, event_id, contact_id, "
                    "status) SELECT a, i, au, ev, c, 'pending' FROM unnest(%s::uuid[], "
                    "%s::uuid[], %s::uuid[], %s::uuid[], %s::uuid[]) AS t(a, i, au, ev, c) "
                    "ORDER BY a, au, ev ON CONFLICT (account_id, automation_id, event_id) "
                    "DO NOTHING",
                    tuple(list(col) for col in zip(*rows, strict=True)),
                )
                report.executions = inserted.rowcount
                conn.execute("SELECT pg_notify('sinal_executions', '')")
            conn.execute(
                "DELETE FROM outbox WHERE (account_id, event_id) IN "
                "(SELECT * FROM unnest(%s::uuid[], %s::uuid[]))",
                (accounts, ids),
            )
            report.events = len(keys)
        return report

    def claim_executions(self, worker: str, limit: int, lease: float) -> list[Claim]:
        """Claim due executions for `lease` seconds."""
        with self._tx() as conn:
            rows = conn.execute(
                f"UPDATE executions e SET claimed_by = %s, "
                "claimed_until = now() + %s * interval '1 second', updated_at = now() "
                "FROM (SELECT account_id, id FROM executions "
                "      WHERE status IN ('pending', 'waiting') AND run_at <= now() "
                "        AND (claimed_until IS NULL OR claimed_until < now()) "
                "      ORDER BY run_at LIMIT %s FOR UPDATE SKIP LOCKED) d "
                "WHERE e.account_id = d.account_id AND e.id = d.id "
                f"RETURNING {_qualified(_EXECUTION_COLUMNS, 'e')}",
                (worker, lease, limit),
            ).fetchall()
            return [_claim(conn, Execution(*r), worker, lease) for r in rows]

    def start_step(
        self, claim: Claim, step_index: int, step_type: str
    ) -> tuple[StepRecord, bool] | None:
        """Record that a step starts; extend the lease. (record, started_now) or None."""
        e = claim.execution
        with self._tx() as conn:
            held = conn.execute(
                f"UPDATE executions SET claimed_until = now() + %s * interval '1 second' "
                f"WHERE {_HELD}",
                (claim.lease, e.account_id, e.id, claim.worker),
            )
            if held.rowcount != 1:
                return None
            row = conn.execute(
                "INSERT INTO execution_steps (account_id, execution_id, step_index, step_type, "
                "status) VALUES (%s, %s, %s, %s, 'started') "
                "ON CONFLICT (account_id, execution_id, step_index) DO UPDATE SET "
                "status = 'started', attempts = execution_steps.attempts + 1, error = NULL, "
                "started_at = now(), finished_at = NULL "
                "WHERE execution_steps.status = 'failed' "
                f"RETURNING {_STEP_COLUMNS}",
                (e.account_id, e.id, step_index, step_type),
            ).fetchone()
            if row is not None:
                return StepRecord(*row), True
            existing = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM execution_steps "
                "WHERE account_id = %s AND execution_id = %s AND step_index = %s",
                (e.account_id, e.id, step_index),
            ).fetchone()
            assert existing is not None
            return StepRecord(*existing), False

    def finish_step(
        self,
        claim: Claim,
        step_index: int,
        status: StepStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        event_id: UUID | None = None,
    ) -> bool:
        """Record a step's outcome (fenced)."""
        e = claim.execution
        with self._tx() as conn:
            held = conn.execute(
                f"SELECT 1 FROM executions WHERE {_HELD} FOR UPDATE",
                (e.account_id, e.id, claim.worker),
            ).fetchone()
            if held is None:
                return False
            conn.execute(
                "UPDATE execution_steps SET status = %s, result = %s, error = %s, "
                "event_id = %s, finished_at = now() "
                "WHERE account_id = %s AND execution_id = %s AND step_index = %s",
                (status, None if result is None else Jsonb(result), error, event_id,
                 e.account_id, e.id, step_index),
            )  # fmt: skip
            return True

    def advance(self, claim: Claim, advance: Advance) -> bool:
        """Move the execution on and release the claim (fenced)."""
        e = claim.execution
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE executions SET status = %s, next_step = %s, "
                "run_at = coalesce(%s, run_at), attempts = coalesce(%s, attempts), "
                "last_error = %s, claimed_by = NULL, claimed_until = NULL, updated_at = now() "
                f"WHERE {_HELD}",
                (advance.status, advance.next_step, advance.run_at, advance.attempts,
                 advance.last_error, e.account_id, e.id, claim.worker),
            )  # fmt: skip
            return cur.rowcount == 1

    def get_execution(self, account_id: UUID, execution_id: UUID) -> Execution | None:
        """One execution with its step records."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE account_id = %s AND id = %s",
                (account_id, execution_id),
            ).fetchone()
            if row is None:
                return None
            steps = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM execution_steps "
                "WHERE account_id = %s AND execution_id = %s ORDER BY step_index",
                (account_id, execution_id),
            ).fetchall()
        return replace(Execution(*row), steps=tuple(StepRecord(*s) for s in steps))

    def list_executions(
        self,
        account_id: UUID,
        *,
        automation_id: UUID | None = None,
        event_id: UUID | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        """Executions, newest first."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_EXECUTION_COLUMNS} FROM executions WHERE account_id = %s "
                "AND (%s::uuid IS NULL OR automation_id = %s) "
                "AND (%s::uuid IS NULL OR event_id = %s) ORDER BY id DESC LIMIT %s",
                (account_id, automation_id, automation_id, event_id, event_id, limit),
            ).fetchall()
        return [Execution(*r) for r in rows]

    def retry_dead(self, account_id: UUID | None = None, execution_id: UUID | None = None) -> int:
        """Revive dead executions (and an unknown one named by id)."""
        statuses = ["dead", "unknown"] if execution_id is not None else ["dead"]
        with self._conn() as conn:
            cur = conn.execute(
                "UPDATE executions SET status = 'pending', attempts = 0, run_at = now(), "
                "claimed_by = NULL, claimed_until = NULL, updated_at = now() "
                "WHERE status = ANY(%s) AND (%s::uuid IS NULL OR account_id = %s) "
                "AND (%s::uuid IS NULL OR id = %s)",
                (statuses, account_id, account_id, execution_id, execution_id),
            )
            if execution_id is not None and cur.rowcount:
                # the operator checked the provider: an unknown step may now be sent again
                conn.execute(
                    "UPDATE execution_steps SET status = 'failed' WHERE execution_id = %s "
                    "AND status IN ('unknown', 'started')",
                    (execution_id,),
                )
            return cur.rowcount

    def close_open_conversation(self, account_id: UUID, contact_id: UUID) -> UUID | None:
        """Close the contact's open conversation."""
        with self._conn() as conn:
            row = conn.execute(
                "UPDATE conversations SET status = 'closed', closed_at = now() "
                "WHERE account_id = %s AND contact_id = %s AND status = 'open' RETURNING id",
                (account_id, contact_id),
            ).fetchone()
        return None if row is None else row[0]

    def outbox_depth(self) -> int:
        """Outbox rows waiting."""
        with self._conn() as conn:
            row = conn.execute("SELECT count(*) FROM outbox").fetchone()
        return int(row[0]) if row else 0

    def listen(self, channels: Sequence[str]) -> Iterator[None]:
        """Yield each time a NOTIFY arrives on `channels` (or every second, as a fallback).

        Uses its own connection (a LISTEN must stay on one session); reconnects on errors.
        """
        url: str = getattr(self, "url")  # noqa: B009 - set by PostgresStore
        while True:
            try:
                with psycopg.connect(url, autocommit=True) as conn:
                    for channel in channels:
                        conn.execute(f"LISTEN {channel}")  # channel names are ours, not input
                    while True:
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            pass
                        yield None
            except psycopg.OperationalError:
                yield None  # the server went away: the caller polls; we reconnect


def _qualified(columns: str, alias: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def _listening(
    conn: Conn, events: list[StoredEvent]
) -> dict[tuple[UUID, str], list[AutomationRow]]:
    """Live automations of the events' accounts that listen to the events' metrics."""
    pairs = sorted({(e.account_id, e.metric_name) for e in events})
    rows = conn.execute(
        f"SELECT {_qualified(_AUTOMATION_COLUMNS, 'a')} FROM automations a "
        "JOIN unnest(%s::uuid[], %s::text[]) AS k(acc, metric) "
        "ON a.account_id = k.acc AND a.trigger_metric = k.metric "
        "WHERE a.deleted_at IS NULL ORDER BY a.created_at, a.id",
        ([p[0] for p in pairs], [p[1] for p in pairs]),
    ).fetchall()
    found: dict[tuple[UUID, str], list[AutomationRow]] = {}
    for r in rows:
        automation = AutomationRow(*r)
        found.setdefault((automation.account_id, automation.trigger_metric), []).append(automation)
    return found


def _claim(conn: Conn, execution: Execution, worker: str, lease: float) -> Claim:
    from sinal.store.postgres import _CONTACT_COLUMNS, _EVENT_COLUMNS

    e = execution
    automation = conn.execute(
        f"SELECT {_AUTOMATION_COLUMNS} FROM automations WHERE account_id = %s AND id = %s",
        (e.account_id, e.automation_id),
    ).fetchone()
    event = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE account_id = %s AND id = %s",
        (e.account_id, e.event_id),
    ).fetchone()
    contact = conn.execute(
        f"SELECT {_CONTACT_COLUMNS} FROM contacts WHERE account_id = %s AND id = %s",
        (e.account_id, e.contact_id),
    ).fetchone()
    tags = conn.execute(
        "SELECT tag FROM contact_tags WHERE account_id = %s AND contact_id = %s ORDER BY tag",
        (e.account_id, e.contact_id),
    ).fetchall()
    steps = conn.execute(
        f"SELECT {_STEP_COLUMNS} FROM execution_steps "
        "WHERE account_id = %s AND execution_id = %s ORDER BY step_index",
        (e.account_id, e.id),
    ).fetchall()
    assert automation is not None
    assert event is not None
    assert contact is not None
    full = replace(e, steps=tuple(StepRecord(*s) for s in steps))
    return Claim(
        execution=full,
        automation=AutomationRow(*automation),
        event=StoredEvent(*event),
        contact=Contact(*contact),
        tags=tuple(t[0] for t in tags),
        worker=worker,
        lease=lease,
    )
