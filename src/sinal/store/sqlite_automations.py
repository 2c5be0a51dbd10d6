"""SQLite side of `AutomationStore` (one worker: `BEGIN IMMEDIATE` serializes writers)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import orjson

from sinal.catalog import METRIC_CHECKOUT_ABANDONED
from sinal.errors import StoreError
from sinal.events import PreparedEvent, dumps_json
from sinal.ids import new_id
from sinal.keyring import Keyring
from sinal.store.automations import (
    AUTOMATION_COLUMNS,
    CLAIMED_AUTOMATION_COLUMNS,
    EVENT_REFUSALS,
    EXECUTION_COLUMNS,
    HELD_WHILE_PAUSED,
    INTEGRATION_COLUMNS,
    MAX_CHAIN_DEPTH,
    STEP_COLUMNS,
    STOPPED_BY_DELETE,
    TRACE_AUTOMATIONS_SQL,
    Advance,
    AutomationRow,
    AutomationTitle,
    Backlog,
    BuildCloseEvent,
    ChangeAutomation,
    Chooser,
    Claim,
    Execution,
    FanOut,
    Integration,
    IntegrationKind,
    ResealBatch,
    SecretTable,
    StepFinish,
    StepRecord,
    StepStart,
    StepStarted,
    StepStatus,
    automation_halt,
    chain_parent,
    opened_integration,
    pinned,
    refusal_outcome,
    refusal_row,
    resealed_rows,
    sealed_secrets,
    sealed_spec,
    secret_counts,
    secrets_of,
    storable_json,
    storable_text,
    too_deep,
    unrecorded_event_error,
)
from sinal.store.base import Outcome, Refusals, StoredEvent
from sinal.store.commerce import (
    DISCONNECT_EXECUTIONS_SQL,
    DISCONNECT_OUTBOX_SQL,
    STOPPED_BY_DISCONNECT,
)

_HELD = "account_id = ? AND id = ? AND claimed_by = ? AND claimed_until > ?"


def _now() -> datetime:
    return datetime.now(UTC)


def _ts(when: datetime) -> str:
    from sinal.store.sqlite import ts

    return ts(when)


def _parse(text: str | None) -> datetime | None:
    from sinal.store.sqlite import parse_ts

    return None if text is None else parse_ts(text)


def _age(text: str | None, now: datetime) -> float:
    """Seconds since the timestamp `text` (0 for None or a time to come)."""
    when = _parse(text)
    return 0.0 if when is None else max((now - when).total_seconds(), 0.0)


def _uuid(text: str | None) -> UUID | None:
    return None if text is None else UUID(text)


class SQLiteAutomations:
    """Mixin for `SQLiteStore`: the `AutomationStore` methods."""

    keyring: Keyring | None = None  # seals and opens stored secrets (`sinal.keyring`)

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    # -- integrations --------------------------------------------------------------------

    def create_integration(self, integration: Integration) -> None:
        """Insert an integration."""
        i = integration
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO integrations ({INTEGRATION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (str(i.account_id), str(i.id), i.kind, i.name, dumps_json(i.settings),
                 dumps_json(sealed_secrets(self.keyring, i)), _ts(i.created_at)),
            )  # fmt: skip

    def get_integration(self, account_id: UUID, integration_id: UUID) -> Integration | None:
        """One live integration of the account."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {INTEGRATION_COLUMNS} FROM integrations "
                "WHERE account_id = ? AND id = ? AND deleted_at IS NULL",
                (str(account_id), str(integration_id)),
            ).fetchone()
        return None if row is None else _integration(row, self.keyring)

    def list_integrations(
        self,
        account_id: UUID,
        kind: IntegrationKind | None = None,
        *,
        after: UUID | None = None,
        limit: int | None = None,
    ) -> list[Integration]:
        """The account's live integrations, oldest first (by id)."""
        where, args = _live_page(account_id, after)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {INTEGRATION_COLUMNS} FROM integrations WHERE {where} "
                "AND (? IS NULL OR kind = ?) ORDER BY id LIMIT ?",
                (*args, kind, kind, -1 if limit is None else limit),  # -1: no limit
            ).fetchall()
        return [_integration(r, self.keyring) for r in rows]

    def delete_integration(self, account_id: UUID, integration_id: UUID) -> bool:
        """Soft-delete an integration, and withdraw its Checkout Abandoned from automations
        (`DISCONNECT_OUTBOX_SQL`) in the same transaction."""
        now = _ts(_now())
        account, ident = str(account_id), str(integration_id)
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE integrations SET deleted_at = ? "
                "WHERE account_id = ? AND id = ? AND deleted_at IS NULL",
                (now, account, ident),
            )
            if cur.rowcount != 1:
                return False
            abandoned = METRIC_CHECKOUT_ABANDONED
            conn.execute(DISCONNECT_OUTBOX_SQL.format(p="?"), (account, abandoned, ident))
            conn.execute(
                DISCONNECT_EXECUTIONS_SQL.format(p="?", now="?", lock=""),
                (STOPPED_BY_DISCONNECT, now, account, ident, abandoned),
            )
            return True

    def count_secrets(self) -> dict[str, int]:
        """The stored secrets, by the key that sealed them (`PLAINTEXT`: none)."""
        with self._read() as conn:
            return secret_counts(conn.execute(_COUNT_SECRETS_SQL).fetchall())

    def reseal_secrets(
        self, table: SecretTable, after: tuple[UUID, UUID] | None, limit: int
    ) -> ResealBatch:
        """Seal the next `limit` rows' secrets again with the current key."""
        column, owner = secrets_of(table)
        past = "" if after is None else "WHERE (account_id, id) > (?, ?) "
        with self._write() as conn:
            rows = [
                (UUID(account), UUID(ident), orjson.loads(stored), UUID(bound))
                for account, ident, stored, bound in conn.execute(
                    f"SELECT account_id, id, {column}, {owner} FROM {table} {past}"
                    "ORDER BY account_id, id LIMIT ?",
                    (*(str(part) for part in after or ()), limit),
                )
            ]
            writes, scanned, resealed = resealed_rows(self.keyring, table, rows)
            for account_id, ident, fresh in writes:
                conn.execute(
                    f"UPDATE {table} SET {column} = ? WHERE account_id = ? AND id = ?",
                    (dumps_json(fresh), str(account_id), str(ident)),
                )
        last = None if not rows else (rows[-1][0], rows[-1][1])
        return ResealBatch(scanned, resealed, last)

    # -- automations ---------------------------------------------------------------------

    def create_automation(self, row: AutomationRow) -> None:
        """Insert an automation."""
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO automations ({AUTOMATION_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (str(row.account_id), str(row.id), row.name, row.status, row.trigger_metric,
                 dumps_json(sealed_spec(self.keyring, row)), _ts(row.created_at),
                 _ts(row.updated_at), row.version),
            )  # fmt: skip

    def get_automation(self, account_id: UUID, automation_id: UUID) -> AutomationRow | None:
        """One live automation."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {AUTOMATION_COLUMNS} FROM automations "
                "WHERE account_id = ? AND id = ? AND deleted_at IS NULL",
                (str(account_id), str(automation_id)),
            ).fetchone()
        return None if row is None else _automation(row)

    def list_automations(
        self, account_id: UUID, *, after: UUID | None = None, limit: int | None = None
    ) -> list[AutomationRow]:
        """The account's live automations, oldest first (by id)."""
        where, args = _live_page(account_id, after)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {AUTOMATION_COLUMNS} FROM automations WHERE {where} ORDER BY id LIMIT ?",
                (*args, -1 if limit is None else limit),  # -1: no limit
            ).fetchall()
        return [_automation(r) for r in rows]

    def trace_automations(
        self, account_id: UUID, metric_name: str
    ) -> list[AutomationRow | AutomationTitle]:
        """The account's live automations, oldest first (by id): the definitions of those
        listening to `metric_name` only."""
        sql = TRACE_AUTOMATIONS_SQL.format(p="?")
        with self._read() as conn:
            rows = conn.execute(sql, (metric_name, str(account_id))).fetchall()
        return [
            AutomationTitle(UUID(r[1]), r[2], r[4]) if r[5] is None else _automation(r)
            for r in rows
        ]

    def update_automation(
        self, account_id: UUID, automation_id: UUID, change: ChangeAutomation
    ) -> AutomationRow | None:
        """Read, change and write the row in one write transaction (`BEGIN IMMEDIATE`:
        no other writer between the read and the write); a paused automation set active
        has its held executions moved up to now; a change of steps keeps the definition
        it replaces, for the executions made with it."""
        account, ident = str(account_id), str(automation_id)
        with self._write() as conn:
            found = conn.execute(
                f"SELECT {AUTOMATION_COLUMNS} FROM automations "
                "WHERE account_id = ? AND id = ? AND deleted_at IS NULL",
                (account, ident),
            ).fetchone()
            if found is None:
                return None
            was = _automation(found)
            row = change(was)
            if row.version != was.version:  # copied as stored: its secrets stay sealed
                conn.execute(
                    "INSERT INTO automation_versions (account_id, id, automation_id, version, "
                    "spec, created_at) SELECT account_id, ?, id, version, spec, ? "
                    "FROM automations WHERE account_id = ? AND id = ?",
                    (str(new_id()), _ts(_now()), account, ident),
                )
            conn.execute(
                "UPDATE automations SET name = ?, status = ?, trigger_metric = ?, spec = ?, "
                "updated_at = ?, version = ? WHERE account_id = ? AND id = ?",
                (row.name, row.status, row.trigger_metric,
                 dumps_json(sealed_spec(self.keyring, row)), _ts(row.updated_at), row.version,
                 account, ident),
            )  # fmt: skip
            if was.status == "paused" and row.status == "active":
                now = _ts(_now())
                conn.execute(
                    "UPDATE executions SET run_at = ?, last_error = NULL, updated_at = ? "
                    "WHERE account_id = ? AND automation_id = ? AND status = 'waiting' "
                    "AND last_error = ?",
                    (now, now, account, ident, HELD_WHILE_PAUSED),
                )
            return row

    def delete_automation(self, account_id: UUID, automation_id: UUID) -> bool:
        """Soft-delete an automation and stop its unfinished executions (one transaction;
        the single worker's step records wait for it, so none starts after it)."""
        now = _ts(_now())
        account, ident = str(account_id), str(automation_id)
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE automations SET deleted_at = ? "
                "WHERE account_id = ? AND id = ? AND deleted_at IS NULL",
                (now, account, ident),
            )
            if cur.rowcount != 1:
                return False
            # the claims stay: a step running now is still recorded by its worker
            conn.execute(
                "UPDATE executions SET status = 'stopped', last_error = ?, updated_at = ? "
                "WHERE account_id = ? AND automation_id = ? AND status IN ('pending', 'waiting')",
                (STOPPED_BY_DELETE, now, account, ident),
            )
            return True

    # -- dispatch ------------------------------------------------------------------------

    def fan_out(self, choose: Chooser, limit: int) -> FanOut:
        """Outbox rows → executions, in one transaction."""
        from sinal.store.sqlite import _EVENT_COLUMNS, _stored_event

        report = FanOut()
        now = _ts(_now())
        with self._write() as conn:
            keys = conn.execute(
                "SELECT account_id, event_id, metric_name FROM outbox WHERE available_at <= ? "
                "ORDER BY available_at LIMIT ?",
                (now, limit),
            ).fetchall()
            listening: dict[tuple[str, str], list[AutomationRow]] = {}
            for account, event_id, metric in keys:
                conn.execute(
                    "DELETE FROM outbox WHERE account_id = ? AND event_id = ?", (account, event_id)
                )
                report.events += 1
                if (account, metric) not in listening:
                    listening[account, metric] = [
                        _automation(r)
                        for r in conn.execute(
                            f"SELECT {AUTOMATION_COLUMNS} FROM automations WHERE account_id = ? "
                            "AND trigger_metric = ? AND deleted_at IS NULL ORDER BY created_at, id",
                            (account, metric),
                        )
                    ]
                candidates = listening[account, metric]
                if not candidates:  # most metrics: the event need not be read
                    continue
                row = conn.execute(
                    f"SELECT {_EVENT_COLUMNS} FROM events WHERE account_id = ? AND id = ?",
                    (account, event_id),
                ).fetchone()
                if row is None:
                    continue
                event = _stored_event(row)
                chosen = choose(event, candidates)
                versions = {c.id: c.version for c in candidates}
                depth = _chain_depth(conn, account, event) if chosen else 0
                status, why = "pending", None
                if depth > MAX_CHAIN_DEPTH:
                    status, why = "stopped", too_deep(depth)
                for automation_id in chosen:
                    ident = new_id()
                    cur = conn.execute(
                        "INSERT INTO executions (account_id, id, automation_id, event_id, "
                        "contact_id, status, last_error, chain_depth, automation_version, "
                        "run_at, created_at, updated_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (account, str(ident), str(automation_id), event_id,
                         str(event.contact_id), status, why, depth, versions[automation_id],
                         now, now, now),
                    )  # fmt: skip
                    report.executions += cur.rowcount
                    if why is not None and cur.rowcount:
                        report.skipped.append((ident, why))
        return report

    def claim_executions(self, worker: str, limit: int, lease: float) -> list[Claim]:
        """Claim due executions for `lease` seconds."""
        now = _now()
        with self._write() as conn:
            rows = conn.execute(
                f"SELECT {EXECUTION_COLUMNS} FROM executions "
                "WHERE status IN ('pending', 'waiting') AND run_at <= ? "
                "AND (claimed_until IS NULL OR claimed_until < ?) ORDER BY run_at LIMIT ?",
                (_ts(now), _ts(now), limit),
            ).fetchall()
            until = _ts(now + timedelta(seconds=lease))
            claims = []
            for row in rows:
                conn.execute(
                    "UPDATE executions SET claimed_by = ?, claimed_until = ? "
                    "WHERE account_id = ? AND id = ?",
                    (worker, until, row[0], row[1]),
                )
                claims.append(_claim(conn, _execution(row), worker, lease))
            return claims

    def start_steps(self, starts: Sequence[StepStart]) -> list[StepStarted]:
        """Record that steps start; extend their leases (one transaction)."""
        if not starts:
            return []
        with self._write() as conn:
            return [_start(conn, start, _now()) for start in starts]

    def start_step(self, claim: Claim, step_index: int, step_type: str) -> StepStarted:
        """Record that a step starts; extend the lease. (record, started_now), a halt or
        None."""
        return self.start_steps([StepStart(claim, step_index, step_type)])[0]

    def finish_steps(self, finishes: Sequence[StepFinish]) -> list[bool]:
        """Record steps' outcomes, their events and advances (one transaction)."""
        from sinal.store.sqlite import _Batch, _record_isolated

        if not finishes:
            return []
        now = _ts(_now())
        with self._write() as conn:
            held = []
            for f in finishes:
                event_id, error = f.event_id, f.error
                # recorded even if the claim was lost: it happened; but not once the
                # execution went with its contact's erasure (a rejection would keep its data)
                if f.emit is not None and _exists(conn, f.claim.execution):
                    # under a savepoint (no round trip): refused, it is kept instead
                    outcome = _record_isolated(_Batch(conn), [f.emit], _STEP_REFUSALS)[0]
                    event_id = outcome.event_id
                    if outcome.kind == "rejected":
                        error = unrecorded_event_error(f.emit, outcome)
                held.append(_finish(conn, replace(f, event_id=event_id, error=error), now))
            return held

    def finish_step(
        self,
        claim: Claim,
        step_index: int,
        status: StepStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
        event_id: UUID | None = None,
        emit: PreparedEvent | None = None,
        then: Advance | None = None,
    ) -> bool:
        """Record a step's outcome, its event and (with `then`) the advance, fenced."""
        finish = StepFinish(claim, step_index, status, result, error, event_id, emit, then)
        return self.finish_steps([finish])[0]

    def advance(self, claim: Claim, advance: Advance) -> bool:
        """Move the execution on and release the claim (fenced)."""
        with self._write() as conn:
            return _advance(conn, claim, advance, _ts(_now()))

    def renew_claims(self, claims: Sequence[Claim]) -> set[UUID]:
        """Extend the leases of claims still held (fenced); the ids renewed."""
        if not claims:
            return set()
        now = _now()
        with self._write() as conn:
            return {c.execution.id for c in claims if _extend_lease(conn, c, now)}

    def get_execution(self, account_id: UUID, execution_id: UUID) -> Execution | None:
        """One execution with its step records."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE account_id = ? AND id = ?",
                (str(account_id), str(execution_id)),
            ).fetchone()
            if row is None:
                return None
            return _with_steps(conn, _execution(row))

    def list_executions(
        self,
        account_id: UUID,
        *,
        automation_id: UUID | None = None,
        event_id: UUID | None = None,
        limit: int | None = 100,
        before: UUID | None = None,
    ) -> list[Execution]:
        """Executions, newest first (older than `before`, when given; all of them when
        `limit` is None)."""
        where, args = ["account_id = ?"], [str(account_id)]
        # Only the filters given, so that an automation's are read from its index
        # (`executions_automation`), in order, from the cursor on.
        for clause, value in (("automation_id = ?", automation_id), ("event_id = ?", event_id),
                              ("id < ?", before)):  # fmt: skip
            if value is not None:
                where.append(clause)
                args.append(str(value))  # canonical text: text order is id order
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE {' AND '.join(where)} "
                "ORDER BY id DESC LIMIT ?",
                (*args, -1 if limit is None else limit),  # -1: no limit
            ).fetchall()
        return [_execution(r) for r in rows]

    def retry_dead(self, account_id: UUID | None = None, execution_id: UUID | None = None) -> int:
        """Revive dead executions (and an unknown one named by id)."""
        statuses = ("dead", "unknown") if execution_id is not None else ("dead", "dead")
        a = None if account_id is None else str(account_id)
        x = None if execution_id is None else str(execution_id)
        now = _ts(_now())
        with self._write() as conn:
            revived = conn.execute(
                "UPDATE executions SET status = 'pending', attempts = 0, run_at = ?, "
                "claimed_by = NULL, claimed_until = NULL, updated_at = ? "
                "WHERE status IN (?, ?) AND (? IS NULL OR account_id = ?) "
                "AND (? IS NULL OR id = ?) RETURNING account_id",
                (now, now, *statuses, a, a, x, x),
            ).fetchall()
            if x is not None:  # the operator checked the provider: it may be sent again
                for (account,) in revived:
                    conn.execute(
                        "UPDATE execution_steps SET status = 'failed' WHERE account_id = ? "
                        "AND execution_id = ? AND status IN ('unknown', 'started')",
                        (account, x),
                    )
            return len(revived)

    def close_open_conversation(
        self, account_id: UUID, contact_id: UUID, key: str, on_close: BuildCloseEvent
    ) -> tuple[UUID, UUID | None] | None:
        """Close the contact's open conversation with its event, once per `key`."""
        from sinal.store.sqlite import _record_in

        account = str(account_id)
        with self._write() as conn:
            earlier = conn.execute(
                "SELECT entity_id, id FROM events WHERE account_id = ? AND unique_event_id = ?",
                (account, key),
            ).fetchone()
            if earlier is not None:
                return UUID(earlier[0]), UUID(earlier[1])
            row = conn.execute(
                "UPDATE conversations SET status = 'closed', closed_at = ? "
                "WHERE account_id = ? AND contact_id = ? AND status = 'open' RETURNING id",
                (_ts(_now()), account, str(contact_id)),
            ).fetchone()
            if row is None:
                return None
            closed = UUID(row[0])
            return closed, _record_in(conn, [on_close(closed)])[0].event_id

    def backlog(self) -> Backlog:
        """What waits for the workers (see `Backlog`)."""
        now = _now()
        with self._read() as conn:
            outbox = conn.execute("SELECT count(*), min(created_at) FROM outbox").fetchone()
            due = conn.execute(
                "SELECT count(*), min(run_at) FROM executions "
                "WHERE status IN ('pending', 'waiting') AND run_at <= ? "
                "AND (claimed_until IS NULL OR claimed_until < ?)",
                (_ts(now), _ts(now)),
            ).fetchone()
        return Backlog(outbox[0], _age(outbox[1], now), due[0], _age(due[1], now))


def _chain_depth(conn: sqlite3.Connection, account: str, event: StoredEvent) -> int:
    """The depth in a chain of automations of an execution for `event`: one more than the
    execution that sent the message it is a status of, 0 without one (in this account)."""
    parent = chain_parent(event)
    if parent is None:
        return 0
    found = conn.execute(
        "SELECT chain_depth FROM executions WHERE account_id = ? AND id = ?",
        (account, str(parent)),
    ).fetchone()
    return 0 if found is None else int(found[0]) + 1


def _extend_lease(conn: sqlite3.Connection, claim: Claim, now: datetime) -> bool:
    """Hold `claim` for its `lease` from `now`, if it is still held (fenced)."""
    e = claim.execution
    cur = conn.execute(
        f"UPDATE executions SET claimed_until = ? WHERE {_HELD}",
        (_ts(now + timedelta(seconds=claim.lease)), str(e.account_id), str(e.id),
         claim.worker, _ts(now)),
    )  # fmt: skip
    return cur.rowcount == 1


def _start(conn: sqlite3.Connection, start: StepStart, now: datetime) -> StepStarted:
    e = start.claim.execution
    if not _extend_lease(conn, start.claim, now):
        return None
    # read in the transaction that records the start: a pause or delete committed before
    # it is seen, and one after it finds the step started (it may finish)
    state = conn.execute(
        "SELECT x.status, a.status, a.deleted_at FROM executions x JOIN automations a "
        "ON a.account_id = x.account_id AND a.id = x.automation_id "
        "WHERE x.account_id = ? AND x.id = ?",
        (str(e.account_id), str(e.id)),
    ).fetchone()
    if state[0] not in ("pending", "waiting"):
        return "stopped"
    if (halt := automation_halt(state[1], state[2])) is not None:
        return halt
    key = (str(e.account_id), str(e.id), start.step_index)
    row = conn.execute(
        "INSERT INTO execution_steps (account_id, execution_id, step_index, step_type, "
        "status, started_at) VALUES (?, ?, ?, ?, 'started', ?) "
        "ON CONFLICT (account_id, execution_id, step_index) DO UPDATE SET "
        "status = 'started', attempts = attempts + 1, error = NULL, "
        "started_at = excluded.started_at, finished_at = NULL "
        f"WHERE status = 'failed' RETURNING {STEP_COLUMNS}",
        (*key, start.step_type, _ts(now)),
    ).fetchone()
    if row is not None:
        return _step(row), True
    existing = conn.execute(
        f"SELECT {STEP_COLUMNS} FROM execution_steps "
        "WHERE account_id = ? AND execution_id = ? AND step_index = ?",
        key,
    ).fetchone()
    return _step(existing), False


def _keep_refused(conn: sqlite3.Connection, event: PreparedEvent, cause: StoreError) -> Outcome:
    """Keep a step's event the database refused as a rejection (reason "refused"), under a
    savepoint: one refused too is only logged."""
    from sinal.store.sqlite import _savepoint, translated_errors

    account, ident, contact, message, source, payload = refusal_row(event)
    try:
        with translated_errors(), _savepoint(conn, "refusal_kept"):
            conn.execute(
                "INSERT OR IGNORE INTO rejections (account_id, id, contact_id, reason, "
                "message, source, payload, created_at) VALUES (?, ?, ?, 'refused', ?, ?, ?, ?)",
                (str(account), str(ident), None if contact is None else str(contact), message,
                 source, dumps_json(payload), _ts(_now())),
            )  # fmt: skip
    except EVENT_REFUSALS as exc:
        return refusal_outcome(event, cause, exc)
    return refusal_outcome(event, cause)


# A step's event the database refuses, for its data, sinal's own statement or its
# operator's configuration (`EVENT_REFUSALS`), is kept (see `ANSWERED`, and
# `AutomationStore.finish_steps`).
_STEP_REFUSALS: Refusals[sqlite3.Connection] = Refusals(EVENT_REFUSALS, "events", _keep_refused)


def _exists(conn: sqlite3.Connection, execution: Execution) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM executions WHERE account_id = ? AND id = ?",
            (str(execution.account_id), str(execution.id)),
        ).fetchone()
        is not None
    )


def _finish(conn: sqlite3.Connection, f: StepFinish, now: str) -> bool:
    e = f.claim.execution
    held = conn.execute(
        f"SELECT 1 FROM executions WHERE {_HELD}",
        (str(e.account_id), str(e.id), f.claim.worker, now),
    ).fetchone()
    if held is None:
        return False
    conn.execute(
        "UPDATE execution_steps SET status = ?, result = ?, error = ?, event_id = ?, "
        "finished_at = ? WHERE account_id = ? AND execution_id = ? AND step_index = ?",
        (f.status, None if f.result is None else dumps_json(storable_json(f.result)),
         storable_text(f.error),
         None if f.event_id is None else str(f.event_id), now, str(e.account_id), str(e.id),
         f.step_index),
    )  # fmt: skip
    if f.then is not None:
        _advance(conn, f.claim, f.then, now)
    return True


def _advance(conn: sqlite3.Connection, claim: Claim, advance: Advance, now: str) -> bool:
    e = claim.execution
    # a held execution found stopped was stopped by its automation's delete: it stays so
    cur = conn.execute(
        "UPDATE executions SET status = CASE status WHEN 'stopped' THEN status ELSE ? END, "
        "next_step = ?, run_at = coalesce(?, run_at), attempts = coalesce(?, attempts), "
        "last_error = CASE status WHEN 'stopped' THEN last_error ELSE ? END, claimed_by = NULL, "
        f"claimed_until = NULL, updated_at = ? WHERE {_HELD}",
        (advance.status, advance.next_step,
         None if advance.run_at is None else _ts(advance.run_at), advance.attempts,
         storable_text(advance.last_error), now, str(e.account_id), str(e.id), claim.worker,
         now),
    )  # fmt: skip
    return cur.rowcount == 1


# The secrets of integrations (each value of `secrets`) and of webhook steps (`secret`,
# each value of `headers`; of automations and their kept versions), by the id of the key
# that sealed them (NULL: plaintext).
_COUNT_SECRETS_SQL = """
WITH _specs AS (SELECT spec FROM automations UNION ALL SELECT spec FROM automation_versions)
SELECT CASE WHEN s.type = 'object' THEN json_extract(s.value, '$.kid') END, count(*)
FROM integrations i, json_each(i.secrets) s WHERE s.type IN ('text', 'object') GROUP BY 1
UNION ALL
SELECT CASE WHEN json_type(st.value, '$.secret') = 'object'
            THEN json_extract(st.value, '$.secret.kid') END, count(*)
FROM _specs a, json_each(a.spec, '$.steps') st
WHERE json_extract(st.value, '$.type') = 'webhook'
  AND json_type(st.value, '$.secret') IN ('text', 'object')
GROUP BY 1
UNION ALL
SELECT CASE WHEN h.type = 'object' THEN json_extract(h.value, '$.kid') END, count(*)
FROM _specs a, json_each(a.spec, '$.steps') st, json_each(st.value, '$.headers') h
WHERE json_extract(st.value, '$.type') = 'webhook'
  AND json_type(st.value, '$.headers') = 'object' AND h.type IN ('text', 'object')
GROUP BY 1
"""


def _live_page(account_id: UUID, after: UUID | None) -> tuple[str, list[str]]:
    """The WHERE of a page of an account's live rows past the id `after`: read from the
    primary key (account_id, id) on, in order (canonical text: text order is id order)."""
    where, args = "account_id = ? AND deleted_at IS NULL", [str(account_id)]
    if after is not None:
        where, args = f"{where} AND id > ?", [*args, str(after)]
    return where, args


def _integration(r: Sequence[Any], keyring: Keyring | None) -> Integration:
    stored = Integration(UUID(r[0]), UUID(r[1]), r[2], r[3], orjson.loads(r[4]),
                         orjson.loads(r[5]), _parse(r[6]) or _now())  # fmt: skip
    return opened_integration(keyring, stored)


def _automation(r: Sequence[Any]) -> AutomationRow:
    return AutomationRow(UUID(r[0]), UUID(r[1]), r[2], r[3], r[4], orjson.loads(r[5]),
                         _parse(r[6]) or _now(), _parse(r[7]) or _now(), r[8],
                         _parse(r[9]) if len(r) > 9 else None)  # fmt: skip


def _execution(r: Sequence[Any]) -> Execution:
    return Execution(UUID(r[0]), UUID(r[1]), UUID(r[2]), UUID(r[3]), UUID(r[4]), r[5], r[6],
                     r[7], _parse(r[8]) or _now(), r[9], _parse(r[10]) or _now(),
                     _parse(r[11]) or _now(), r[12], r[13])  # fmt: skip


def _step(r: Sequence[Any]) -> StepRecord:
    return StepRecord(r[0], r[1], r[2], r[3], None if r[4] is None else orjson.loads(r[4]), r[5],
                      _uuid(r[6]), _parse(r[7]) or _now(), _parse(r[8]))  # fmt: skip


def _with_steps(conn: sqlite3.Connection, e: Execution) -> Execution:
    steps = conn.execute(
        f"SELECT {STEP_COLUMNS} FROM execution_steps "
        "WHERE account_id = ? AND execution_id = ? ORDER BY step_index",
        (str(e.account_id), str(e.id)),
    ).fetchall()
    return replace(e, steps=tuple(_step(s) for s in steps))


def _claim(conn: sqlite3.Connection, e: Execution, worker: str, lease: float) -> Claim:
    from sinal.store.sqlite import _EVENT_COLUMNS, SQLiteStore, _stored_event

    account = str(e.account_id)
    automation = conn.execute(
        f"SELECT {CLAIMED_AUTOMATION_COLUMNS} FROM automations WHERE account_id = ? AND id = ?",
        (account, str(e.automation_id)),
    ).fetchone()
    event = conn.execute(
        f"SELECT {_EVENT_COLUMNS} FROM events WHERE account_id = ? AND id = ?",
        (account, str(e.event_id)),
    ).fetchone()
    contact = SQLiteStore._contact(conn, account, str(e.contact_id))
    tags = conn.execute(
        "SELECT tag FROM contact_tags WHERE account_id = ? AND contact_id = ? ORDER BY tag",
        (account, str(e.contact_id)),
    ).fetchall()
    assert automation is not None
    assert event is not None
    assert contact is not None
    current = _automation(automation)
    kept = None
    if e.automation_version != current.version:  # made before a change of its steps
        kept = conn.execute(
            "SELECT spec FROM automation_versions "
            "WHERE account_id = ? AND automation_id = ? AND version = ?",
            (account, str(e.automation_id), e.automation_version),
        ).fetchone()
    return Claim(
        execution=_with_steps(conn, e),
        automation=pinned(current, e, None if kept is None else kept[0]),
        event=_stored_event(event),
        contact=contact,
        tags=tuple(t[0] for t in tags),
        worker=worker,
        lease=lease,
    )
