"""PostgreSQL side of `AutomationStore`: integrations, automations, outbox fan-out, executions.

Workers on many machines share the work through row locks: the outbox is fanned out under
`FOR UPDATE SKIP LOCKED` inside one transaction (a dead worker's transaction aborts and its
rows become visible again), and executions are claimed with a lease (`claimed_until`) that
a dead worker's successor waits out. Every write of a claimed execution is fenced by
`claimed_by`, so a worker whose lease was taken over cannot move it any more.

A statement that locks many executions and waits for them takes their rows in key order,
(account_id, id): a batch of steps' starts or finishes, and an order stopping the
executions of its cart's abandonment (`postgres_commerce`). In any other order two of them
could each hold a row the other waits for (PostgreSQL then aborts one after
`deadlock_timeout`, a second by default). The statements that skip locked rows instead
(claims, lease renewals, an automation's delete or resume) wait for none.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import Jsonb

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
from sinal.store.base import (
    CONTACT_COLUMNS,
    Contact,
    Outcome,
    Refusals,
    StoredEvent,
    qualified,
)
from sinal.store.commerce import (
    DISCONNECT_EXECUTIONS_SQL,
    DISCONNECT_OUTBOX_SQL,
    STOPPED_BY_DISCONNECT,
)
from sinal.store.libpq import network_defaults
from sinal.store.postgres_erasure import WRITE_EVENTS

if TYPE_CHECKING:
    from sinal.store.postgres import _Recorder

log = logging.getLogger("sinal.store")


def _live_page(account_id: UUID, after: UUID | None) -> tuple[str, list[UUID]]:
    """The WHERE of a page of an account's live rows past the id `after`: read from the
    primary key (account_id, id) on, in order."""
    where, args = "account_id = %s AND deleted_at IS NULL", [account_id]
    if after is not None:
        where, args = f"{where} AND id > %s", [*args, after]
    return where, args


# Fencing: only the worker holding a live claim may write the execution.
_HELD = (
    "account_id = %(account)s AND id = %(id)s AND claimed_by = %(worker)s AND claimed_until > now()"
)
# A held execution found stopped was stopped by its automation's delete (which leaves the
# claim, so the step running then is still recorded): it stays stopped, with that reason.
_ADVANCE_SET = (
    "status = CASE status WHEN 'stopped' THEN status ELSE %(status_to)s END, "
    "next_step = %(next_step)s, run_at = coalesce(%(run_at)s, run_at), "
    "attempts = coalesce(%(attempts)s, attempts), "
    "last_error = CASE status WHEN 'stopped' THEN last_error ELSE %(last_error)s END, "
    "claimed_by = NULL, claimed_until = NULL, updated_at = now()"
)

# The requests travel as one JSON array (`json_to_recordset`): one parameter is far cheaper
# to send from Python than a dozen typed arrays, whatever the batch size.
#
# Many executions' steps start in one statement (one round trip, one commit): each is
# fenced, its lease extended and its 'started' record written. Per request (by `ord`):
# (true, NULL, record) when this started the step (fresh, or again after a definite
# failure), (false, NULL, earlier record) when it had been started or done before, (NULL,
# halt) when it does not start, no row when the claim was lost. The second branch reads
# the statement's snapshot: the record as it was.
#
# A step starts only while its automation is active and live and its execution unfinished
# (`checked`: one lookup by key per request, no lock). A pause or delete committed before
# this statement's snapshot is seen, and nothing starts. One committed after it is ordered
# after this start (the statement read none of its writes): the step runs, as if the pause
# had come a moment later, and the next step's start sees it. A delete also writes the
# execution's row (`_STOP_DELETED_SQL`), and so does an order stopping its abandoned cart's
# executions (`postgres_commerce`): if it committed after the snapshot but before `locked`
# reached the row, the fence is checked again on the row as it left it, whose `status`
# says 'stopped'; if `locked` took the row first, the delete skips it (an order waits).
# The rows are locked before the write, in key order (see the module).
_START_STEPS_SQL = f"""
WITH req AS (
    SELECT * FROM json_to_recordset(%(req)s::json) AS r(ord int, account_id uuid, id uuid,
        worker text, lease float8, step_index int, step_type text)
), locked AS MATERIALIZED (
    SELECT r.* FROM req r
    JOIN executions e ON e.account_id = r.account_id AND e.id = r.id
        AND e.claimed_by = r.worker AND e.claimed_until > now()
    ORDER BY e.account_id, e.id FOR UPDATE OF e
), held AS (
    UPDATE executions e SET claimed_until = now() + l.lease * interval '1 second'
    FROM locked l WHERE e.account_id = l.account_id AND e.id = l.id
    RETURNING l.ord, l.account_id, l.id, l.step_index, l.step_type, e.status, e.automation_id
), checked AS (
    SELECT h.ord, h.account_id, h.id, h.step_index, h.step_type,
        CASE WHEN h.status NOT IN ('pending', 'waiting') THEN 'stopped'
             WHEN a.deleted_at IS NOT NULL THEN 'deleted'
             WHEN a.status <> 'active' THEN 'paused' END AS halt
    FROM held h CROSS JOIN LATERAL (SELECT status, deleted_at FROM automations
        WHERE account_id = h.account_id AND id = h.automation_id LIMIT 1) a
), started AS (
    INSERT INTO execution_steps (account_id, execution_id, step_index, step_type, status)
    SELECT account_id, id, step_index, step_type, 'started' FROM checked WHERE halt IS NULL
    ORDER BY account_id, id
    ON CONFLICT (account_id, execution_id, step_index) DO UPDATE SET
        status = 'started', attempts = execution_steps.attempts + 1, error = NULL,
        started_at = now(), finished_at = NULL
    WHERE execution_steps.status = 'failed'
    RETURNING account_id, execution_id, {STEP_COLUMNS}
)
SELECT h.ord, true, NULL, {qualified(STEP_COLUMNS, "s")} FROM checked h
JOIN started s ON s.account_id = h.account_id AND s.execution_id = h.id
    AND s.step_index = h.step_index
UNION ALL
SELECT h.ord, false, NULL, {qualified(STEP_COLUMNS, "x")} FROM checked h
JOIN execution_steps x ON x.account_id = h.account_id AND x.execution_id = h.id
    AND x.step_index = h.step_index
WHERE h.halt IS NULL AND NOT EXISTS (SELECT 1 FROM started s WHERE s.account_id = h.account_id
                  AND s.execution_id = h.id AND s.step_index = h.step_index)
UNION ALL
SELECT ord, NULL, halt, {", ".join(["NULL"] * len(STEP_COLUMNS.split(",")))} FROM checked
WHERE halt IS NOT NULL
"""

# A deleted automation's pending and waiting executions end stopped, in the delete's
# transaction. The claim of one a worker holds is left: that worker still records the
# step it is running (`_ADVANCE_SET` keeps the execution stopped) and starts no other.
# SKIP LOCKED: a row locked now is a step being recorded, in a statement that may lock
# other rows of this automation in another order (a batch of step records), so waiting
# could deadlock; the worker stops that execution itself as its next step would start,
# and a claim stops one the worker left settled ('pending', 'waiting') before it runs.
_STOP_DELETED_SQL = """
UPDATE executions e SET status = 'stopped', last_error = %(reason)s, updated_at = now()
FROM (SELECT account_id, id FROM executions
      WHERE account_id = %(account)s AND automation_id = %(automation)s
        AND status IN ('pending', 'waiting')
      FOR UPDATE SKIP LOCKED) d
WHERE e.account_id = d.account_id AND e.id = d.id
"""

# A paused automation set active again: its held executions go on now, and the workers
# are told. One it skips (locked by a worker holding it again, on a view of the
# automation from before this) runs after its hold, `DispatchSettings.hold_interval`.
_RESUME_HELD_SQL = """
UPDATE executions e SET run_at = now(), last_error = NULL, updated_at = now()
FROM (SELECT account_id, id FROM executions
      WHERE account_id = %(account)s AND automation_id = %(automation)s
        AND status = 'waiting' AND last_error = %(reason)s
      FOR UPDATE SKIP LOCKED) d
WHERE e.account_id = d.account_id AND e.id = d.id
"""

# The three statements above and below (and the claim) find each request's execution
# (and step) by its whole primary key, the requests coming as one JSON array that the
# planner takes for 100 rows. On statistics taken while `executions` was small (a new or
# emptied table, until autovacuum's next ANALYZE) it joined them to a scan of the whole
# table by a hash, kept that as the statement's generic plan, and every step's start and
# finish then read every execution: 25-40 ms a statement 20 s into a steady 1,000
# executions/s on a new database, and the lag grew with the table (bench/README.md,
# session 34). These settings, sent in the statement's round trip and transaction, leave
# the planner one way: a nested loop over the requests, each an index lookup.
#
# Which index, the planner picks by the table's size, and every index of `executions`
# leads with `account_id`: while the table holds a few hundred rows, finding the account's
# executions through `executions_contact` and filtering them by id costs it as much as the
# primary key, and a generic plan made then (psycopg prepares a statement on its sixth
# run) was kept as the table grew: each start and finish read every execution of the
# account (5,438 rows for one finish 28 s into a run), 0.85-7.2 ms of PostgreSQL's CPU per
# execution at 1,000 events/s, and one worker fell behind (bench/README.md, Dispatch).
# Planned each time (`force_custom_plan`), a statement is costed on the table as it is:
# 0.4-0.5 ms per execution, planning included.
_BY_KEY_SETTINGS = ("enable_seqscan", "enable_hashjoin", "enable_mergejoin")
_BY_KEY = (
    "SELECT "
    + ", ".join(f"set_config('{s}', 'off', true)" for s in _BY_KEY_SETTINGS)
    + ", set_config('plan_cache_mode', 'force_custom_plan', true)"
)
# ... and back, for what else the transaction runs (a plan is kept whatever the settings).
_BY_KEY_END = (
    "SELECT set_config(name, reset_val, true) FROM pg_settings WHERE name IN ("
    + ", ".join(f"'{s}'" for s in (*_BY_KEY_SETTINGS, "plan_cache_mode"))
    + ")"
)

# Leases renewed while their executions run, fenced like every write of a claimed
# execution. SKIP LOCKED: a row locked by another transaction belongs to a step being
# recorded, and that record releases the claim or the next step's start extends it;
# waiting for it could deadlock with a batch of step records locking the same worker's
# rows in another order.
_RENEW_CLAIMS_SQL = """
WITH req AS (
    SELECT * FROM json_to_recordset(%(req)s::json) AS r(account_id uuid, id uuid, worker text,
        lease float8)
), held AS (
    SELECT e.account_id, e.id, r.lease FROM executions e
    JOIN req r ON e.account_id = r.account_id AND e.id = r.id AND e.claimed_by = r.worker
    WHERE e.claimed_until > now()
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE executions e SET claimed_until = now() + h.lease * interval '1 second'
FROM held h WHERE e.account_id = h.account_id AND e.id = h.id
RETURNING e.id
"""

_BACKLOG_SQL = """
SELECT o.n, coalesce(extract(epoch FROM now() - o.oldest), 0),
       x.n, coalesce(extract(epoch FROM now() - x.oldest), 0)
FROM (SELECT count(*) AS n, min(created_at) AS oldest FROM outbox) o,
     (SELECT count(*) AS n, min(run_at) AS oldest FROM executions
      WHERE status IN ('pending', 'waiting') AND run_at <= now()
        AND (claimed_until IS NULL OR claimed_until < now())) x
"""

# Many steps' outcomes, fenced: each execution whose claim holds is locked first, all of
# them in key order (see the module), so no successor claims one between the check
# and the write; one that moves on is then updated and released (one stopped meanwhile, by
# its automation's delete or its checkout's order, stays stopped, as in `_ADVANCE_SET`).
# Returns the `ord` of every request whose claim held.
_FINISH_STEPS_SQL = """
WITH req AS (
    SELECT * FROM json_to_recordset(%(req)s::json) AS r(ord int, account_id uuid, id uuid,
        worker text, step_index int, status text, result jsonb, error text, event_id uuid,
        advance bool, status_to text, next_step int, run_at timestamptz, attempts int,
        last_error text)
), held AS MATERIALIZED (
    SELECT r.* FROM req r
    JOIN executions e ON e.account_id = r.account_id AND e.id = r.id
        AND e.claimed_by = r.worker AND e.claimed_until > now()
    ORDER BY e.account_id, e.id FOR UPDATE OF e
), moved AS (
    UPDATE executions e SET
        status = CASE e.status WHEN 'stopped' THEN e.status ELSE h.status_to END,
        next_step = h.next_step,
        run_at = coalesce(h.run_at, e.run_at), attempts = coalesce(h.attempts, e.attempts),
        last_error = CASE e.status WHEN 'stopped' THEN e.last_error ELSE h.last_error END,
        claimed_by = NULL, claimed_until = NULL, updated_at = now()
    FROM held h
    WHERE h.advance AND e.account_id = h.account_id AND e.id = h.id
), step AS (
    UPDATE execution_steps s SET status = h.status, result = h.result,
        error = h.error, event_id = h.event_id, finished_at = now()
    FROM held h WHERE s.account_id = h.account_id AND s.execution_id = h.id
        AND s.step_index = h.step_index
)
SELECT ord FROM held
"""
# A step whose event went otherwise than planned: recorded before (a duplicate: that
# event's id), or not recorded (no id; the error says why: `unrecorded_event_error`).
_SET_STEP_EVENT = (
    "UPDATE execution_steps SET event_id = %s, error = coalesce(%s, error) "
    "WHERE account_id = %s AND execution_id = %s AND step_index = %s"
)
# A step's event the database refused, kept (`refusal_row`); once, should the step's
# record be made again.
_KEEP_REFUSED = (
    "INSERT INTO rejections (account_id, id, contact_id, reason, message, source, payload) "
    "VALUES (%s, %s, %s, 'refused', %s, %s, %s) ON CONFLICT DO NOTHING"
)

Conn = psycopg.Connection[TupleRow]
# Lower the outbox's wake-up flag (migration 0014), unless a worker is arming it right now:
# then it stays up, and writers notify a little longer.
_DISARM_OUTBOX = (
    "UPDATE outbox_wake SET armed = false "
    "WHERE id = (SELECT id FROM outbox_wake WHERE id AND armed FOR UPDATE SKIP LOCKED)"
)
T = TypeVar("T")


# The secrets of integrations (each value of `secrets`) and of webhook steps (`secret`,
# each value of `headers`; of automations and their kept versions), by the id of the key
# that sealed them (NULL: plaintext).
_COUNT_SECRETS_SQL = """
WITH hooks AS (
  SELECT st FROM (SELECT spec FROM automations
                  UNION ALL SELECT spec FROM automation_versions) a,
         jsonb_array_elements(CASE WHEN jsonb_typeof(a.spec -> 'steps') = 'array'
                                   THEN a.spec -> 'steps' ELSE '[]' END) st
  WHERE st ->> 'type' = 'webhook'
)
SELECT CASE WHEN jsonb_typeof(s.value) = 'object' THEN s.value ->> 'kid' END, count(*)
FROM integrations i, jsonb_each(i.secrets) s
WHERE jsonb_typeof(s.value) IN ('string', 'object') GROUP BY 1
UNION ALL
SELECT CASE WHEN jsonb_typeof(st -> 'secret') = 'object' THEN st -> 'secret' ->> 'kid' END,
       count(*)
FROM hooks WHERE jsonb_typeof(st -> 'secret') IN ('string', 'object')
GROUP BY 1
UNION ALL
SELECT CASE WHEN jsonb_typeof(h.value) = 'object' THEN h.value ->> 'kid' END, count(*)
FROM hooks,
     jsonb_each(CASE WHEN jsonb_typeof(st -> 'headers') = 'object'
                     THEN st -> 'headers' ELSE '{}' END) h
WHERE jsonb_typeof(h.value) IN ('string', 'object')
GROUP BY 1
"""


class PostgresAutomations:
    """Mixin for `PostgresStore`: the `AutomationStore` methods."""

    keyring: Keyring | None = None  # seals and opens stored secrets (`sinal.keyring`)

    def _conn(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _tx(self) -> AbstractContextManager[Conn]:
        raise NotImplementedError

    def _retrying(self, work: Callable[[Conn], T]) -> T:
        raise NotImplementedError

    # -- integrations --------------------------------------------------------------------

    def create_integration(self, integration: Integration) -> None:
        """Insert an integration."""
        i = integration
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO integrations ({INTEGRATION_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (i.account_id, i.id, i.kind, i.name, Jsonb(i.settings),
                 Jsonb(sealed_secrets(self.keyring, i)), i.created_at),
            )  # fmt: skip

    def get_integration(self, account_id: UUID, integration_id: UUID) -> Integration | None:
        """One live integration of the account."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {INTEGRATION_COLUMNS} FROM integrations "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, integration_id),
            ).fetchone()
        return None if row is None else opened_integration(self.keyring, Integration(*row))

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
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {INTEGRATION_COLUMNS} FROM integrations WHERE {where} "
                "AND (%s::text IS NULL OR kind = %s) ORDER BY id LIMIT %s",
                (*args, kind, kind, limit),  # LIMIT NULL: no limit
            ).fetchall()
        return [opened_integration(self.keyring, Integration(*r)) for r in rows]

    def delete_integration(self, account_id: UUID, integration_id: UUID) -> bool:
        """Soft-delete an integration, and withdraw its Checkout Abandoned from automations
        (`DISCONNECT_OUTBOX_SQL`) in the same transaction. A pass abandoning one of its
        checkouts now (`abandon_checkout`, which reads the integration `FOR SHARE`) is
        waited for, so its abandonment is withdrawn too."""
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE integrations SET deleted_at = now() "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, integration_id),
            )
            if cur.rowcount != 1:
                return False
            abandoned = METRIC_CHECKOUT_ABANDONED
            conn.execute(
                DISCONNECT_OUTBOX_SQL.format(p="%s"), (account_id, abandoned, integration_id)
            )
            conn.execute(
                DISCONNECT_EXECUTIONS_SQL.format(p="%s", now="now()", lock=" FOR UPDATE OF x"),
                (STOPPED_BY_DISCONNECT, account_id, integration_id, abandoned),
            )
            return True

    def count_secrets(self) -> dict[str, int]:
        """The stored secrets, by the key that sealed them (`PLAINTEXT`: none)."""
        with self._conn() as conn:
            return secret_counts(conn.execute(_COUNT_SECRETS_SQL).fetchall())

    def reseal_secrets(
        self, table: SecretTable, after: tuple[UUID, UUID] | None, limit: int
    ) -> ResealBatch:
        """Seal the next `limit` rows' secrets again with the current key; the rows are
        locked meanwhile (a concurrent rotation or update waits, then reads them done)."""
        column, owner = secrets_of(table)
        past = "" if after is None else "WHERE (account_id, id) > (%s, %s) "
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT account_id, id, {column}, {owner} FROM {table} {past}"
                "ORDER BY account_id, id LIMIT %s FOR NO KEY UPDATE",
                (*(after or ()), limit),
            ).fetchall()
            writes, scanned, resealed = resealed_rows(self.keyring, table, rows)
            for account_id, ident, fresh in writes:
                conn.execute(
                    f"UPDATE {table} SET {column} = %s WHERE account_id = %s AND id = %s",
                    (Jsonb(fresh), account_id, ident),
                )
        last = None if not rows else (rows[-1][0], rows[-1][1])
        return ResealBatch(scanned, resealed, last)

    # -- automations ---------------------------------------------------------------------

    def create_automation(self, row: AutomationRow) -> None:
        """Insert an automation."""
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO automations ({AUTOMATION_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (row.account_id, row.id, row.name, row.status, row.trigger_metric,
                 Jsonb(sealed_spec(self.keyring, row)), row.created_at, row.updated_at,
                 row.version),
            )  # fmt: skip

    def get_automation(self, account_id: UUID, automation_id: UUID) -> AutomationRow | None:
        """One live automation."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {AUTOMATION_COLUMNS} FROM automations "
                "WHERE account_id = %s AND id = %s AND deleted_at IS NULL",
                (account_id, automation_id),
            ).fetchone()
        return None if row is None else AutomationRow(*row)

    def list_automations(
        self, account_id: UUID, *, after: UUID | None = None, limit: int | None = None
    ) -> list[AutomationRow]:
        """The account's live automations, oldest first (by id)."""
        where, args = _live_page(account_id, after)
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {AUTOMATION_COLUMNS} FROM automations WHERE {where} ORDER BY id LIMIT %s",
                (*args, limit),  # LIMIT NULL: no limit
            ).fetchall()
        return [AutomationRow(*r) for r in rows]

    def trace_automations(
        self, account_id: UUID, metric_name: str
    ) -> list[AutomationRow | AutomationTitle]:
        """The account's live automations, oldest first (by id): the definitions of those
        listening to `metric_name` only."""
        sql = TRACE_AUTOMATIONS_SQL.format(p="%s")
        with self._conn() as conn:
            rows = conn.execute(sql, (metric_name, account_id)).fetchall()
        return [
            AutomationTitle(r[1], r[2], r[4]) if r[5] is None else AutomationRow(*r) for r in rows
        ]

    def update_automation(
        self, account_id: UUID, automation_id: UUID, change: ChangeAutomation
    ) -> AutomationRow | None:
        """Read the row `FOR UPDATE`, change it and write it, in one transaction (a
        concurrent update waits for it, then reads what it wrote); a paused automation set
        active has its held executions moved up to now; a change of steps keeps the
        definition it replaces, for the executions made with it."""
        keys = {"account": account_id, "automation": automation_id}
        with self._tx() as conn:
            found = conn.execute(
                f"SELECT {AUTOMATION_COLUMNS} FROM automations WHERE account_id = %(account)s "
                "AND id = %(automation)s AND deleted_at IS NULL FOR UPDATE",
                keys,
            ).fetchone()
            if found is None:
                return None
            was = AutomationRow(*found)
            row = change(was)
            if row.version != was.version:  # copied as stored: its secrets stay sealed
                conn.execute(
                    "INSERT INTO automation_versions (account_id, id, automation_id, version, "
                    "spec) SELECT account_id, %(id)s, id, version, spec FROM automations "
                    "WHERE account_id = %(account)s AND id = %(automation)s",
                    {**keys, "id": new_id()},
                )
            conn.execute(
                "UPDATE automations SET name = %s, status = %s, trigger_metric = %s, spec = %s, "
                "updated_at = %s, version = %s WHERE account_id = %s AND id = %s",
                (row.name, row.status, row.trigger_metric, Jsonb(sealed_spec(self.keyring, row)),
                 row.updated_at, row.version, account_id, automation_id),
            )  # fmt: skip
            if was.status == "paused" and row.status == "active":
                resumed = conn.execute(_RESUME_HELD_SQL, {**keys, "reason": HELD_WHILE_PAUSED})
                if resumed.rowcount:
                    conn.execute("SELECT pg_notify('sinal_executions', '')")
            return row

    def delete_automation(self, account_id: UUID, automation_id: UUID) -> bool:
        """Soft-delete an automation and stop its unfinished executions, in one
        transaction (see `_STOP_DELETED_SQL`)."""
        keys = {"account": account_id, "automation": automation_id}
        with self._tx() as conn:
            cur = conn.execute(
                "UPDATE automations SET deleted_at = now() "
                "WHERE account_id = %(account)s AND id = %(automation)s AND deleted_at IS NULL",
                keys,
            )
            if cur.rowcount != 1:
                return False
            conn.execute(_STOP_DELETED_SQL, {**keys, "reason": STOPPED_BY_DELETE})
            return True

    # -- dispatch ------------------------------------------------------------------------

    def fan_out(self, choose: Chooser, limit: int) -> FanOut:
        """Outbox rows → executions, in one transaction (see the module docstring)."""
        report = FanOut()
        with self._tx() as conn:
            # The oldest rows no other worker holds leave the outbox in one statement (by
            # `ctid`: the rows are locked, so they stay where the subquery found them); the
            # executions below commit with their removal, or neither does.
            keys = conn.execute(
                "DELETE FROM outbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM outbox "
                "WHERE available_at <= now() ORDER BY available_at LIMIT %s "
                "FOR UPDATE SKIP LOCKED)) RETURNING account_id, event_id, metric_name",
                (limit,),
            ).fetchall()
            if not keys:
                return report
            # Only the events that some automation listens to are read (most metrics of most
            # accounts have none): the outbox row names the event's metric.
            listening = _listening(conn, {(k[0], k[2]) for k in keys})
            heard = [(k[0], k[1]) for k in keys if (k[0], k[2]) in listening]
            events = _events_of(conn, heard) if heard else []
            chosen: list[tuple[StoredEvent, list[UUID]]] = []
            versions: dict[UUID, int] = {}  # the version each execution is made with
            for event in events:
                candidates = listening.get((event.account_id, event.metric_name), [])
                versions.update((c.id, c.version) for c in candidates)
                chosen.append((event, choose(event, candidates)))
            depths = _chain_depths(conn, [event for event, ids in chosen if ids])
            rows: list[tuple[UUID, UUID, UUID, UUID, UUID, str, str | None, int, int]] = []
            for event, automation_ids in chosen:
                depth = depths.get(event.id, 0)
                status, why = "pending", None
                if depth > MAX_CHAIN_DEPTH:
                    status, why = "stopped", too_deep(depth)
                for automation_id in automation_ids:
                    rows.append((event.account_id, new_id(), automation_id, event.id,
                                 event.contact_id, status, why, depth,
                                 versions[automation_id]))  # fmt: skip
            if rows:
                inserted = conn.execute(
                    "INSERT INTO executions (account_id, id, automation_id, event_id, contact_id, "
                    "status, last_error, chain_depth, automation_version) "
                    "SELECT a, i, au, ev, c, s, l, d, v "
                    "FROM unnest(%s::uuid[], %s::uuid[], %s::uuid[], %s::uuid[], %s::uuid[], "
                    "%s::text[], %s::text[], %s::int[], %s::int[]) "
                    "AS t(a, i, au, ev, c, s, l, d, v) "
                    "ORDER BY a, au, ev ON CONFLICT (account_id, automation_id, event_id) "
                    "DO NOTHING RETURNING id, last_error",
                    tuple(list(col) for col in zip(*rows, strict=True)),
                ).fetchall()
                report.executions = len(inserted)
                report.skipped = [(i, why) for i, why in inserted if why is not None]
                conn.execute("SELECT pg_notify('sinal_executions', '')")
            report.events = len(keys)
        return report

    def claim_executions(self, worker: str, limit: int, lease: float) -> list[Claim]:
        """Claim due executions for `lease` seconds: one statement claims them and joins what
        they need (automation, event, contact, tags), a second reads their step records."""
        with self._conn() as conn:
            # A queue's index fills with entries of executions no longer due (claimed,
            # finished) until VACUUM. A plain index scan in `run_at` order marks those it
            # finds dead so the next claims skip them; a bitmap scan (the planner's choice
            # when its statistics lag behind the churn) visits every one of them, every
            # time: 18,000 entries and 12 ms per claim after 17 s at 1,000 executions/s.
            # And like the fenced writes (`_BY_KEY`), the claim finds each claimed row by its
            # key: on a small table's statistics it too was planned as a hash join over a
            # scan of every execution. The pipeline sends BEGIN, the settings, the claim and
            # COMMIT in one round trip.
            with conn.pipeline(), conn.transaction():
                conn.execute("SET LOCAL enable_bitmapscan = off")
                conn.execute(_BY_KEY)
                cur = conn.execute(
                    _claim_layout()[0], {"worker": worker, "lease": lease, "limit": limit}
                )
            rows = cur.fetchall()
            if not rows:
                return []
            # read after the claim committed: only the holder writes a held execution's steps
            steps = _steps_of(conn, [(r[0], r[1]) for r in rows])
        return [_claim(r, steps.get(r[1], ()), worker, lease) for r in rows]

    def start_steps(self, starts: Sequence[StepStart]) -> list[StepStarted]:
        """Record that steps start, extending their leases: one statement (see above)."""
        if not starts:
            return []
        params = {"req": dumps_json([
            {"ord": i, "account_id": s.claim.execution.account_id, "id": s.claim.execution.id,
             "worker": s.claim.worker, "lease": s.claim.lease, "step_index": s.step_index,
             "step_type": s.step_type}
            for i, s in enumerate(starts)
        ])}  # fmt: skip
        with self._conn() as conn:
            rows = _by_key(conn, _START_STEPS_SQL, params).fetchall()
        found: list[StepStarted] = [None] * len(starts)
        for row in rows:
            found[row[0]] = row[2] if row[2] is not None else (StepRecord(*row[3:]), row[1])
        return found

    def start_step(self, claim: Claim, step_index: int, step_type: str) -> StepStarted:
        """Record that a step starts; extend the lease. (record, started_now), a halt or
        None."""
        return self.start_steps([StepStart(claim, step_index, step_type)])[0]

    def finish_steps(self, finishes: Sequence[StepFinish]) -> list[bool]:
        """Record steps' outcomes, their events and advances: one transaction (see above)."""
        from sinal.store.postgres import _record_in, _record_isolated

        if not finishes:
            return []
        params = _finish_params(finishes)
        emits = [(i, f.emit) for i, f in enumerate(finishes) if f.emit is not None]

        def held_of(cur: psycopg.Cursor[TupleRow]) -> list[bool]:
            held = [False] * len(finishes)
            for (ord_,) in cur:
                held[ord_] = True
            return held

        def work(conn: Conn, record: _Recorder) -> list[bool]:
            with conn.pipeline():  # one round trip, in the transaction of `_retrying`
                conn.execute(_BY_KEY)
                cur = conn.execute(_FINISH_STEPS_SQL, params)
                conn.execute(_BY_KEY_END)
            held = held_of(cur)
            kept = _of_live_executions(conn, emits, held, finishes)
            if kept:
                # recorded even where a claim was lost: the steps did happen. Last, so the
                # contacts' summary rows stay locked only until the commit right after.
                outcomes = record(conn, [e for _, e in kept])
                for (i, emit), outcome in zip(kept, outcomes, strict=True):
                    if held[i] and outcome.event_id != emit.id:  # recorded before, rejected
                        e = finishes[i].claim.execution
                        error = None
                        if outcome.kind == "rejected":
                            error = storable_text(unrecorded_event_error(emit, outcome))
                        conn.execute(_SET_STEP_EVENT, (outcome.event_id, error, e.account_id,
                                                       e.id, finishes[i].step_index))  # fmt: skip
            return held

        if not emits:  # one statement
            with self._conn() as conn:
                return held_of(_by_key(conn, _FINISH_STEPS_SQL, params))
        try:
            return self._retrying(lambda conn: work(conn, _record_in))
        except _STEP_REFUSALS.isolated:
            # An event the database refuses fails no step's record: again, the events
            # it refuses isolated and kept (`_record_isolated`). Rare: it costs round trips.
            kept = partial(_record_isolated, refusals=_STEP_REFUSALS)
            return self._retrying(lambda conn: work(conn, kept))

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
        e = claim.execution
        with self._conn() as conn:
            cur = conn.execute(
                f"UPDATE executions SET {_ADVANCE_SET} WHERE {_HELD}",
                {"account": e.account_id, "id": e.id, "worker": claim.worker,
                 **_advance_params(advance)},
            )  # fmt: skip
            return cur.rowcount == 1

    def renew_claims(self, claims: Sequence[Claim]) -> set[UUID]:
        """Extend the leases of claims still held (fenced): one statement, which skips the
        rows another transaction holds locked rather than wait for them (see the
        protocol)."""
        if not claims:
            return set()
        params = {"req": dumps_json([
            {"account_id": c.execution.account_id, "id": c.execution.id, "worker": c.worker,
             "lease": c.lease}
            for c in claims
        ])}  # fmt: skip
        with self._conn() as conn:
            return {row[0] for row in _by_key(conn, _RENEW_CLAIMS_SQL, params)}

    def get_execution(self, account_id: UUID, execution_id: UUID) -> Execution | None:
        """One execution with its step records."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE account_id = %s AND id = %s",
                (account_id, execution_id),
            ).fetchone()
            if row is None:
                return None
            steps = conn.execute(
                f"SELECT {STEP_COLUMNS} FROM execution_steps "
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
        limit: int | None = 100,
        before: UUID | None = None,
    ) -> list[Execution]:
        """Executions, newest first (older than `before`, when given; all of them when
        `limit` is None)."""
        where, args = ["account_id = %s"], [account_id]
        # Only the filters given, each shape planned for what it names: an automation's
        # page is read from `executions_automation`, in order, from the cursor on.
        for clause, value in (("automation_id = %s", automation_id),
                              ("event_id = %s", event_id), ("id < %s", before)):  # fmt: skip
            if value is not None:
                where.append(clause)
                args.append(value)
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {EXECUTION_COLUMNS} FROM executions WHERE {' AND '.join(where)} "
                "ORDER BY id DESC LIMIT %s",
                (*args, limit),  # LIMIT NULL: no limit
            ).fetchall()
        return [Execution(*r) for r in rows]

    def retry_dead(self, account_id: UUID | None = None, execution_id: UUID | None = None) -> int:
        """Revive dead executions (and an unknown one named by id): one transaction, so no
        worker claims one before its step records are reset."""
        statuses = ["dead", "unknown"] if execution_id is not None else ["dead"]
        with self._tx() as conn:
            # executions first, as every writer locks them before their steps
            revived = conn.execute(
                "UPDATE executions SET status = 'pending', attempts = 0, run_at = now(), "
                "claimed_by = NULL, claimed_until = NULL, updated_at = now() "
                "WHERE status = ANY(%s) AND (%s::uuid IS NULL OR account_id = %s) "
                "AND (%s::uuid IS NULL OR id = %s) RETURNING account_id",
                (statuses, account_id, account_id, execution_id, execution_id),
            ).fetchall()
            if execution_id is not None and revived:
                # the operator checked the provider: an unknown step may now be sent again
                conn.execute(
                    "UPDATE execution_steps SET status = 'failed' WHERE account_id = ANY(%s) "
                    "AND execution_id = %s AND status IN ('unknown', 'started')",
                    ([r[0] for r in revived], execution_id),
                )
            return len(revived)

    def close_open_conversation(
        self, account_id: UUID, contact_id: UUID, key: str, on_close: BuildCloseEvent
    ) -> tuple[UUID, UUID | None] | None:
        """Close the contact's open conversation with its event, once per `key`."""
        from sinal.store.postgres import _record_in

        def work(conn: Conn) -> tuple[UUID, UUID | None] | None:
            earlier = conn.execute(
                "SELECT entity_id, id FROM events WHERE account_id = %s AND unique_event_id = %s",
                (account_id, key),
            ).fetchone()
            if earlier is not None:
                return UUID(earlier[0]), earlier[1]
            row = conn.execute(
                "UPDATE conversations SET status = 'closed', closed_at = now() "
                "WHERE account_id = %s AND contact_id = %s AND status = 'open' RETURNING id",
                (account_id, contact_id),
            ).fetchone()
            if row is None:
                return None
            return row[0], _record_in(conn, [on_close(row[0])])[0].event_id

        return self._retrying(work)

    def backlog(self) -> Backlog:
        """What waits for the workers: one statement (the due executions by their partial
        index, as the claim finds them)."""
        with self._conn() as conn:
            row = conn.execute(_BACKLOG_SQL).fetchone()
        assert row is not None
        return Backlog(int(row[0]), float(row[1]), int(row[2]), float(row[3]))

    def reserve_connections(self, n: int) -> None:
        """Let the connection pool grow by `n` connections, for a worker beside whatever
        else shares this store (`sinal serve`'s API)."""
        pool = getattr(self, "_pool")  # noqa: B009 - set by PostgresStore
        pool.resize(pool.min_size, pool.max_size + n)

    def arm_outbox(self) -> None:
        """Ask the next writer of outbox rows to notify "sinal_outbox"; returns once every
        writer that would not has committed (migration 0014). Call it before each look
        at the outbox that may be followed by waiting for a NOTIFY."""
        with self._conn() as conn:
            conn.execute("SELECT sinal_outbox_arm()")

    def listen(
        self,
        channels: Sequence[str],
        timeout: float = 1.0,
        on_state: Callable[[bool], None] | None = None,
    ) -> Iterator[set[str]]:
        """Yield the channels notified each time a NOTIFY arrives on `channels`, or an empty
        set every `timeout` seconds without one (the caller polls then, as a fallback).

        A NOTIFY on "sinal_outbox" lowers the flag `arm_outbox` raised, before it is
        yielded: the writers meanwhile need not notify; the caller arms again before it
        next looks at the outbox. Uses its own connection (a LISTEN must stay on one
        session, and waiting for a pooled one would hold the wake-up up); see `listen`.
        """
        url: str = getattr(self, "url")  # noqa: B009 - set by PostgresStore
        return listen(url, channels, timeout, on_state)


# Seconds between attempts to reconnect a listener: the first soon (a server restarting is
# back within seconds), then longer, and never more than the caller's poll interval.
RECONNECT_DELAYS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def listen(
    url: str,
    channels: Sequence[str],
    timeout: float = 1.0,
    on_state: Callable[[bool], None] | None = None,
) -> Iterator[set[str]]:
    """`PostgresAutomations.listen` on the database at `url`. When the connection fails or
    cannot be made, yields an empty set (the caller polls) and tries again after a delay
    (`RECONNECT_DELAYS`, at most `timeout`, so the caller's polls keep their pace): never
    in a tight loop, which would spin a core and hammer a server coming back up. Logs and
    reports (`on_state`) the first failure of each outage, and the recovery."""
    failures = 0
    network = network_defaults(url)  # once: the URL and the environment stay as they are
    while True:
        try:
            with psycopg.connect(url, autocommit=True, **network) as conn:
                for channel in channels:
                    conn.execute(f"LISTEN {channel}")  # channel names are ours, not input
                if failures:
                    log.warning(
                        "listening for notifications again, after %d failed attempts", failures
                    )
                failures = 0
                if on_state is not None:
                    on_state(True)
                while True:
                    notices = conn.notifies(timeout=timeout, stop_after=1)
                    notified = {n.channel for n in notices}
                    if "sinal_outbox" in notified:
                        # failing, writers go on notifying: only slower (a broken
                        # connection fails the next wait, and is replaced)
                        with suppress(psycopg.Error):
                            conn.execute(_DISARM_OUTBOX)
                    yield notified
        except psycopg.OperationalError as exc:
            if not failures:
                log.warning("listening for notifications failed, polling meanwhile: %s", exc)
                if on_state is not None:
                    on_state(False)
            yield set()  # the caller polls; we reconnect after a while
            time.sleep(min(RECONNECT_DELAYS[min(failures, len(RECONNECT_DELAYS) - 1)], timeout))
            failures += 1


def _events_of(conn: Conn, keys: list[tuple[UUID, UUID]]) -> list[StoredEvent]:
    """The stored events of these (account, id) keys, in the order they were received."""
    from sinal.store.postgres import _EVENT_COLUMNS

    return [
        StoredEvent(*r)
        for r in conn.execute(
            f"SELECT {qualified(_EVENT_COLUMNS, 'e')} "
            "FROM unnest(%s::uuid[], %s::uuid[]) AS k(a, i) CROSS JOIN LATERAL "
            "(SELECT * FROM events WHERE account_id = k.a AND id = k.i LIMIT 1) e "
            "ORDER BY e.received_at, e.id",
            ([k[0] for k in keys], [k[1] for k in keys]),
        )
    ]


def _chain_depths(conn: Conn, events: list[StoredEvent]) -> dict[UUID, int]:
    """By event id, the depth in a chain of automations of an execution for it, when not
    0: one more than the execution that sent the message it is a status of (in its
    account; see `MAX_CHAIN_DEPTH`)."""
    keys = [(e.id, e.account_id, parent) for e in events if (parent := chain_parent(e))]
    if not keys:
        return {}
    rows = conn.execute(
        "SELECT k.ev, x.chain_depth + 1 FROM unnest(%s::uuid[], %s::uuid[], %s::uuid[]) "
        "AS k(ev, a, parent) JOIN executions x ON x.account_id = k.a AND x.id = k.parent",
        tuple(list(col) for col in zip(*keys, strict=True)),
    ).fetchall()
    return dict(rows)


def _listening(
    conn: Conn, metrics: set[tuple[UUID, str]]
) -> dict[tuple[UUID, str], list[AutomationRow]]:
    """Live automations listening to these (account, metric) pairs, by pair (a pair that no
    automation listens to is absent)."""
    pairs = sorted(metrics)
    rows = conn.execute(
        f"SELECT {qualified(AUTOMATION_COLUMNS, 'a')} FROM automations a "
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


def _steps_of(
    conn: Conn, executions: list[tuple[UUID, UUID]]
) -> dict[UUID, tuple[StepRecord, ...]]:
    """The step records of many executions, by execution id."""
    rows = conn.execute(
        f"SELECT s.execution_id, {qualified(STEP_COLUMNS, 's')} "
        "FROM unnest(%s::uuid[], %s::uuid[]) AS k(a, i) CROSS JOIN LATERAL "
        "(SELECT * FROM execution_steps WHERE account_id = k.a AND execution_id = k.i "
        " OFFSET 0) s ORDER BY s.execution_id, s.step_index",  # OFFSET 0: not flattened
        ([a for a, _ in executions], [i for _, i in executions]),
    ).fetchall()
    found: dict[UUID, list[StepRecord]] = {}
    for r in rows:
        found.setdefault(r[0], []).append(StepRecord(*r[1:]))
    return {k: tuple(v) for k, v in found.items()}


@cache
def _claim_layout() -> tuple[str, tuple[int, int, int, int]]:
    """The claim statement and where each row splits into execution, automation, event,
    contact and tags (the event and contact columns live in postgres.py, which imports us)."""
    from sinal.store.postgres import _EVENT_COLUMNS

    # Each claimed execution looks its rows up by their whole primary key (LATERAL ...
    # LIMIT 1 keeps the planner from flattening them into joins): on statistics that lag
    # behind a growing table, the joins were planned as a scan of the account's events
    # per claimed execution, a claim costing more with every event stored. The last
    # column is the definition kept for an execution made before its automation's steps
    # changed (NULL for the others: the lookup is skipped when the versions match).
    parts = (EXECUTION_COLUMNS, CLAIMED_AUTOMATION_COLUMNS, _EVENT_COLUMNS, CONTACT_COLUMNS)
    a, b, c, d = itertools.accumulate(len(p.split(",")) for p in parts)
    statement = f"""
WITH claimed AS (
    UPDATE executions e SET claimed_by = %(worker)s,
        claimed_until = now() + %(lease)s * interval '1 second', updated_at = now()
    FROM (SELECT account_id, id FROM executions
          WHERE status IN ('pending', 'waiting') AND run_at <= now()
            AND (claimed_until IS NULL OR claimed_until < now())
          ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED) d
    WHERE e.account_id = d.account_id AND e.id = d.id
    RETURNING {qualified(EXECUTION_COLUMNS, "e")}
)
SELECT {qualified(EXECUTION_COLUMNS, "x")}, {qualified(CLAIMED_AUTOMATION_COLUMNS, "a")},
       {qualified(_EVENT_COLUMNS, "ev")}, {qualified(CONTACT_COLUMNS, "c")},
       array(SELECT t.tag FROM contact_tags t
             WHERE t.account_id = x.account_id AND t.contact_id = x.contact_id ORDER BY t.tag),
       v.spec
FROM claimed x
CROSS JOIN LATERAL (SELECT * FROM automations
                    WHERE account_id = x.account_id AND id = x.automation_id LIMIT 1) a
LEFT JOIN LATERAL (SELECT spec FROM automation_versions
                   WHERE x.automation_version <> a.version AND account_id = x.account_id
                     AND automation_id = x.automation_id AND version = x.automation_version
                   LIMIT 1) v ON true
CROSS JOIN LATERAL (SELECT * FROM events
                    WHERE account_id = x.account_id AND id = x.event_id LIMIT 1) ev
CROSS JOIN LATERAL (SELECT * FROM contacts
                    WHERE account_id = x.account_id AND id = x.contact_id LIMIT 1) c
ORDER BY x.run_at
"""
    return statement, (a, b, c, d)


def _claim(row: Sequence[Any], steps: tuple[StepRecord, ...], worker: str, lease: float) -> Claim:
    a, b, c, d = _claim_layout()[1]
    execution = replace(Execution(*row[:a]), steps=steps)
    return Claim(
        execution=execution,
        automation=pinned(AutomationRow(*row[a:b]), execution, row[d + 1]),
        event=StoredEvent(*row[b:c]),
        contact=Contact(*row[c:d]),
        tags=tuple(row[d]),
        worker=worker,
        lease=lease,
    )


def _of_live_executions(
    conn: Conn,
    emits: list[tuple[int, PreparedEvent]],
    held: list[bool],
    finishes: Sequence[StepFinish],
) -> list[tuple[int, PreparedEvent]]:
    """`emits` but those of steps whose execution is gone: erased with its contact while
    the step ran, its event would be kept as a rejection holding the contact's data. Looked
    for only where the claim was lost (a held execution is locked by the finish), after
    ROW EXCLUSIVE on `events`, so an erasure running now has committed, and one to come
    waits for this transaction."""
    lost = [finishes[i].claim.execution for i, _ in emits if not held[i]]
    if not lost:
        return emits
    conn.execute(WRITE_EVENTS)
    live = {r[0] for r in conn.execute(
        "SELECT e.id FROM unnest(%s::uuid[], %s::uuid[]) AS k(a, i) "
        "JOIN executions e ON e.account_id = k.a AND e.id = k.i",
        ([x.account_id for x in lost], [x.id for x in lost]),
    )}  # fmt: skip
    return [(i, e) for i, e in emits if held[i] or finishes[i].claim.execution.id in live]


def _keep_refused(conn: Conn, event: PreparedEvent, cause: StoreError) -> Outcome:
    """Keep a step's event the database refused as a rejection (reason "refused"), under a
    savepoint: one refused too (what was refused may be in its payload) is only logged."""
    from sinal.store.postgres import translated_errors

    account, ident, contact, message, source, payload = refusal_row(event)
    try:
        with translated_errors(), conn.transaction():
            conn.execute(_KEEP_REFUSED, (account, ident, contact, message, source,
                                         Jsonb(payload)))  # fmt: skip
    except EVENT_REFUSALS as exc:
        return refusal_outcome(event, cause, exc)
    return refusal_outcome(event, cause)


# A step's event the database refuses, for its data, sinal's own statement or its
# operator's configuration (`EVENT_REFUSALS`), is kept (see `ANSWERED`, and
# `AutomationStore.finish_steps`).
_STEP_REFUSALS: Refusals[Conn] = Refusals(EVENT_REFUSALS, "events", _keep_refused)


def _by_key(
    conn: Conn, statement: str, params: dict[str, Any], settings: str = _BY_KEY
) -> psycopg.Cursor[TupleRow]:
    """`statement` in a transaction of its own under `settings` (`_BY_KEY`): BEGIN, the
    settings, the statement and COMMIT in one round trip. Its rows are read after the
    commit."""
    with conn.pipeline(), conn.transaction():
        conn.execute(settings)
        cur = conn.execute(statement, params)
    return cur


def _finish_params(finishes: Sequence[StepFinish]) -> dict[str, str]:
    """The requests of `_FINISH_STEPS_SQL`, as one JSON array."""
    rows = []
    for i, f in enumerate(finishes):
        e, then = f.claim.execution, f.then
        rows.append({
            "ord": i, "account_id": e.account_id, "id": e.id, "worker": f.claim.worker,
            "step_index": f.step_index, "status": f.status, "result": storable_json(f.result),
            "error": storable_text(f.error),
            "event_id": f.emit.id if f.emit is not None else f.event_id,
            "advance": then is not None, **_advance_params(then),
        })  # fmt: skip
    return {"req": dumps_json(rows)}


def _advance_params(advance: Advance | None) -> dict[str, Any]:
    if advance is None:
        return {}
    return {
        "status_to": advance.status, "next_step": advance.next_step, "run_at": advance.run_at,
        "attempts": advance.attempts, "last_error": storable_text(advance.last_error),
    }  # fmt: skip
