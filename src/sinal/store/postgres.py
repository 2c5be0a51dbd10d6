"""The production store: PostgreSQL through psycopg 3 and a connection pool.

A batch of events is recorded by ONE statement (data-modifying CTEs over `unnest`ed
arrays): contact check, metric upsert, dedup insert, summary upsert, outbox and
rejections commit together in one round trip, whatever the batch size. Only duplicates
cost a second, read-only, round trip (to compare payloads).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import orjson
import psycopg
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool

from sinal.errors import DuplicateKey, StoreError
from sinal.events import SCHEMA_VERSION, PreparedEvent, StoredPayload, dumps_json
from sinal.ids import metric_id
from sinal.store.base import (
    Account,
    Contact,
    EventQuery,
    NewContact,
    Outcome,
    Progress,
    RebuildReport,
    Rejection,
    StoredEvent,
    SummaryRow,
    compare_summaries,
    read_migrations,
    rejection_message,
)

# Any two sessions' lock ids would do; this one spells "sinal" in ASCII.
_MIGRATION_LOCK = 0x73696E616C
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
_ATTEMPTS = 5

_EVENT_COLUMNS = (
    "account_id, id, contact_id, metric_name, properties, value, currency, source, source_id, "
    "integration_id, unique_event_id, entity_type, entity_id, automation_execution_id, "
    "occurred_at, received_at, schema_version"
)
_CONTACT_COLUMNS = "account_id, id, name, phone, email, external_id, created_at, updated_at"

# Rows are sorted before every insert that can wait on another transaction (events by
# unique id, metrics and summaries by key), so concurrent batches lock in one order.
_RECORD_SQL = """
WITH input AS (
    SELECT * FROM unnest(
        %(ord)s::int[], %(id)s::uuid[], %(account_id)s::uuid[], %(contact_id)s::uuid[],
        %(metric_name)s::text[], %(display_name)s::text[], %(category)s::text[],
        %(is_system)s::bool[], %(properties)s::text[], %(value)s::numeric[],
        %(currency)s::text[], %(source)s::text[], %(source_id)s::text[],
        %(integration_id)s::uuid[], %(unique_event_id)s::text[], %(entity_type)s::text[],
        %(entity_id)s::text[], %(execution_id)s::uuid[], %(occurred_at)s::timestamptz[],
        %(received_at)s::timestamptz[], %(metric_id)s::uuid[]
    ) AS t(ord, id, account_id, contact_id, metric_name, display_name, category, is_system,
           properties, value, currency, source, source_id, integration_id, unique_event_id,
           entity_type, entity_id, execution_id, occurred_at, received_at, metric_id)
),
known AS (
    SELECT i.* FROM input i
    JOIN contacts c ON c.account_id = i.account_id AND c.id = i.contact_id
),
new_metrics AS (
    INSERT INTO metrics (account_id, id, name, display_name, category, source, is_system)
    SELECT DISTINCT ON (account_id, metric_name)
           account_id, metric_id, metric_name, display_name, category, source, is_system
    FROM known ORDER BY account_id, metric_name, ord
    ON CONFLICT DO NOTHING
),
stored AS (
    INSERT INTO events (account_id, id, contact_id, metric_id, metric_name, properties, value,
                        currency, source, source_id, integration_id, unique_event_id,
                        entity_type, entity_id, automation_execution_id, occurred_at,
                        received_at, schema_version)
    SELECT account_id, id, contact_id, metric_id, metric_name, properties::jsonb, value, currency,
           source, source_id, integration_id, unique_event_id, entity_type, entity_id,
           execution_id, occurred_at, received_at, %(schema_version)s
    FROM known ORDER BY account_id, unique_event_id, ord
    ON CONFLICT (account_id, unique_event_id) DO NOTHING
    RETURNING account_id, id, contact_id, metric_name, value, occurred_at,
              automation_execution_id
),
summary AS (
    INSERT INTO contact_metrics_summary AS s (account_id, contact_id, metric_name,
        event_count, total_value, first_event_at, last_event_at, updated_at)
    SELECT account_id, contact_id, metric_name, count(*), coalesce(sum(value), 0),
           min(occurred_at), max(occurred_at), now()
    FROM stored GROUP BY account_id, contact_id, metric_name
    ORDER BY account_id, contact_id, metric_name
    ON CONFLICT (account_id, contact_id, metric_name) DO UPDATE SET
        event_count = s.event_count + excluded.event_count,
        total_value = s.total_value + excluded.total_value,
        first_event_at = least(s.first_event_at, excluded.first_event_at),
        last_event_at = greatest(s.last_event_at, excluded.last_event_at),
        updated_at = excluded.updated_at
),
outboxed AS (
    INSERT INTO outbox (account_id, event_id, metric_name)
    SELECT account_id, id, metric_name FROM stored WHERE automation_execution_id IS NULL
),
rejected AS (
    INSERT INTO rejections (account_id, id, reason, message, source, payload)
    SELECT i.account_id, i.id,
           CASE WHEN i.contact_id IS NULL THEN 'contact_required' ELSE 'contact_not_found' END,
           CASE WHEN i.contact_id IS NULL THEN 'contact_id is required to record an event'
                ELSE format('contact %%s does not exist in account %%s', i.contact_id,
                            i.account_id) END,
           i.source,
           jsonb_build_object(
               'account_id', i.account_id, 'contact_id', i.contact_id,
               'metric_name', i.metric_name, 'properties', i.properties::jsonb,
               'value', i.value::text, 'currency', i.currency, 'source', i.source,
               'source_id', i.source_id, 'integration_id', i.integration_id,
               'entity_type', i.entity_type, 'entity_id', i.entity_id,
               'occurred_at', i.occurred_at, 'automation_execution_id', i.execution_id)
    FROM input i WHERE NOT EXISTS (SELECT 1 FROM known k WHERE k.ord = i.ord)
    RETURNING id
)
SELECT i.ord, s.id IS NOT NULL, k.ord IS NOT NULL
FROM input i
LEFT JOIN known k ON k.ord = i.ord
LEFT JOIN stored s ON s.account_id = i.account_id AND s.id = i.id
ORDER BY i.ord
"""

_DUPLICATES_SQL = """
SELECT e.account_id, e.unique_event_id, e.id, e.metric_name, e.properties, e.value,
       e.currency, e.occurred_at
FROM events e
JOIN unnest(%s::uuid[], %s::text[]) AS k(account_id, unique_event_id)
  ON e.account_id = k.account_id AND e.unique_event_id = k.unique_event_id
"""


@contextmanager
def translated_errors() -> Iterator[None]:
    """Turn psycopg's exceptions into sinal's, chained."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        raise DuplicateKey(exc.diag.constraint_name) from exc
    except psycopg.Error as exc:
        raise StoreError(str(exc)) from exc
    except psycopg_pool_errors() as exc:
        raise StoreError(str(exc)) from exc


def psycopg_pool_errors() -> type[Exception]:
    """The pool's own error base (a timeout waiting for a connection)."""
    from psycopg_pool import PoolTimeout

    return PoolTimeout


def _configure(conn: psycopg.Connection[TupleRow]) -> None:
    set_json_loads(orjson.loads, conn)
    set_json_dumps(dumps_json, conn)


class PostgresStore:
    """sinal's tables in a PostgreSQL database."""

    backend = "postgresql"

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 8) -> None:
        self.url = url
        self._pool: ConnectionPool[psycopg.Connection[TupleRow]] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            configure=_configure,
            open=False,
            name="sinal",
        )
        self._open_lock = threading.Lock()
        self._opened = False

    @contextmanager
    def _conn(self) -> Iterator[psycopg.Connection[TupleRow]]:
        if not self._opened:
            with self._open_lock, translated_errors():
                if not self._opened:
                    self._pool.open(wait=True, timeout=10)
                    self._opened = True
        with translated_errors(), self._pool.connection() as conn:
            yield conn

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[TupleRow]]:
        with self._conn() as conn, conn.transaction():
            yield conn

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()
        self._opened = False

    # -- schema ------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations under an advisory lock (safe from many processes)."""
        applied: list[int] = []
        with self._tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
            for version, name, script in read_migrations("postgres"):
                if version in done:
                    continue
                conn.execute(script.encode())  # bytes: a trusted file, not a query template
                conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        """The highest applied migration, 0 when none."""
        with self._conn() as conn:
            row = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
            if not row or not row[0]:
                return 0
            row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
            return int(row[0]) if row else 0

    # -- accounts and contacts ---------------------------------------------------------

    def create_account(self, account: Account) -> None:
        """Insert an account."""
        with self._conn() as conn:
            conn.execute(
                "INSERT INTO accounts (id, name, timezone, created_at) VALUES (%s, %s, %s, %s)",
                (account.id, account.name, account.timezone, account.created_at),
            )

    def get_account(self, account_id: UUID) -> Account | None:
        """One account, or None."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT id, name, timezone, created_at FROM accounts WHERE id = %s",
                (account_id,),
            ).fetchone()
        return None if row is None else Account(*row)

    def upsert_contact(self, contact: NewContact) -> tuple[Contact, bool]:
        """Find by any identity (most specific first), else create with its identities.

        Two callers creating the same new person race on the identity key: the loser's
        transaction fails with a unique violation and retries, finding the winner's contact.
        """
        for attempt in range(_ATTEMPTS):
            try:
                return self._upsert_contact_once(contact)
            except DuplicateKey:
                if attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _upsert_contact_once(self, contact: NewContact) -> tuple[Contact, bool]:
        pairs = contact.identities()
        with self._tx() as conn:
            if pairs:
                row = conn.execute(
                    "SELECT i.contact_id FROM contact_identities i "
                    "JOIN unnest(%s::text[], %s::text[]) WITH ORDINALITY AS k(kind, value, n) "
                    "  ON i.kind = k.kind AND i.value = k.value "
                    "WHERE i.account_id = %s ORDER BY k.n LIMIT 1",
                    ([k for k, _ in pairs], [v for _, v in pairs], contact.account_id),
                ).fetchone()
                if row is not None:
                    found = self._contact(conn, contact.account_id, row[0])
                    assert found is not None
                    return found, False
            created = conn.execute(
                f"INSERT INTO contacts (account_id, id, name, phone, email, external_id) "
                f"VALUES (%s, %s, %s, %s, %s, %s) RETURNING {_CONTACT_COLUMNS}",
                (
                    contact.account_id, contact.id, contact.name, contact.phone,
                    contact.email, contact.external_id,
                ),
            ).fetchone()  # fmt: skip
            assert created is not None
            if pairs:
                conn.execute(
                    "INSERT INTO contact_identities (account_id, kind, value, contact_id) "
                    "SELECT %s, kind, value, %s FROM unnest(%s::text[], %s::text[]) "
                    "AS k(kind, value)",
                    (
                        contact.account_id, contact.id,
                        [k for k, _ in pairs], [v for _, v in pairs],
                    ),
                )  # fmt: skip
            return Contact(*created), True

    def get_contact(self, account_id: UUID, contact_id: UUID) -> Contact | None:
        """One contact of the account, or None."""
        with self._conn() as conn:
            return self._contact(conn, account_id, contact_id)

    @staticmethod
    def _contact(
        conn: psycopg.Connection[TupleRow], account_id: UUID, contact_id: UUID
    ) -> Contact | None:
        row = conn.execute(
            f"SELECT {_CONTACT_COLUMNS} FROM contacts WHERE account_id = %s AND id = %s",
            (account_id, contact_id),
        ).fetchone()
        return None if row is None else Contact(*row)

    # -- events ------------------------------------------------------------------------

    def record(self, events: Sequence[PreparedEvent]) -> list[Outcome]:
        """Store a batch in one statement (see the module docstring)."""
        if not events:
            return []
        params = _record_params(events)
        for attempt in range(_ATTEMPTS):
            try:
                with self._conn() as conn:
                    rows = conn.execute(_RECORD_SQL, params).fetchall()
                    duplicates = [
                        events[ord_] for ord_, created, known in rows if known and not created
                    ]
                    stored = self._stored_payloads(conn, duplicates)
                break
            except StoreError as exc:
                if not isinstance(exc.__cause__, _RETRYABLE) or attempt == _ATTEMPTS - 1:
                    raise
        return [_outcome(events[o], created, known, stored) for o, created, known in rows]

    @staticmethod
    def _stored_payloads(
        conn: psycopg.Connection[TupleRow], events: list[PreparedEvent]
    ) -> dict[tuple[UUID, str], tuple[UUID, StoredPayload]]:
        if not events:
            return {}
        rows = conn.execute(
            _DUPLICATES_SQL,
            ([e.account_id for e in events], [e.unique_event_id for e in events]),
        ).fetchall()
        return {(r[0], r[1]): (r[2], StoredPayload(r[3], r[4], r[5], r[6], r[7])) for r in rows}

    def list_events(self, query: EventQuery) -> list[StoredEvent]:
        """Events matching the query, newest first."""
        where = ["account_id = %s"]
        args: list[Any] = [query.account_id]
        if query.contact_id is not None:
            where.append("contact_id = %s")
            args.append(query.contact_id)
        if query.metric_name is not None:
            where.append("metric_name = %s")
            args.append(query.metric_name)
        if query.since is not None:
            where.append("occurred_at >= %s")
            args.append(query.since)
        if query.until is not None:
            where.append("occurred_at < %s")
            args.append(query.until)
        if query.before is not None:
            where.append("(occurred_at, id) < (%s, %s)")
            args.extend(query.before)
        statement = (
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} "
            "ORDER BY occurred_at DESC, id DESC LIMIT %s"
        )
        with self._conn() as conn:
            rows = conn.execute(statement, [*args, query.limit]).fetchall()
        return [StoredEvent(*row) for row in rows]

    def get_summary(self, account_id: UUID, contact_id: UUID | None = None) -> list[SummaryRow]:
        """Summary rows of the account (or one contact)."""
        statement = (
            "SELECT account_id, contact_id, metric_name, event_count, total_value, "
            "first_event_at, last_event_at FROM contact_metrics_summary WHERE account_id = %s"
        )
        args: list[UUID] = [account_id]
        if contact_id is not None:
            statement += " AND contact_id = %s"
            args.append(contact_id)
        with self._conn() as conn:
            rows = conn.execute(statement + " ORDER BY contact_id, metric_name", args).fetchall()
        return [SummaryRow(*row) for row in rows]

    def list_rejections(self, account_id: UUID, limit: int = 100) -> list[Rejection]:
        """Kept rejections, newest first."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT account_id, id, reason, message, payload, created_at, replayed_event_id "
                "FROM rejections WHERE account_id = %s ORDER BY id DESC LIMIT %s",
                (account_id, limit),
            ).fetchall()
        return [Rejection(*row) for row in rows]

    def rebuild_summaries(
        self, account_id: UUID | None = None, progress: Progress | None = None
    ) -> list[RebuildReport]:
        """Recompute summaries from events, one account per transaction.

        Each account's transaction holds a SHARE lock on events (writers wait, readers
        don't), so no event can commit between the recount and the rewrite.
        """
        if account_id is not None:
            accounts = [account_id]
        else:
            with self._conn() as conn:
                accounts = [r[0] for r in conn.execute("SELECT id FROM accounts ORDER BY id")]
        reports: list[RebuildReport] = []
        for done, account in enumerate(accounts, start=1):
            with self._tx() as conn:
                conn.execute("LOCK TABLE events IN SHARE MODE")
                reports.append(_rebuild_account(conn, account))
            if progress is not None:
                progress(done, len(accounts))
        return reports


def _record_params(events: Sequence[PreparedEvent]) -> dict[str, Any]:
    return {
        "ord": list(range(len(events))),
        "id": [e.id for e in events],
        "account_id": [e.account_id for e in events],
        "contact_id": [e.contact_id for e in events],
        "metric_name": [e.metric_name for e in events],
        "display_name": [e.display_name for e in events],
        "category": [str(e.category) for e in events],
        "is_system": [e.is_system for e in events],
        "properties": [e.properties_json for e in events],
        "value": [e.value for e in events],
        "currency": [e.currency for e in events],
        "source": [e.source for e in events],
        "source_id": [e.source_id for e in events],
        "integration_id": [e.integration_id for e in events],
        "unique_event_id": [e.unique_event_id for e in events],
        "entity_type": [e.entity_type for e in events],
        "entity_id": [e.entity_id for e in events],
        "execution_id": [e.automation_execution_id for e in events],
        "occurred_at": [e.occurred_at for e in events],
        "received_at": [e.received_at for e in events],
        "metric_id": [metric_id(e.account_id, e.metric_name) for e in events],
        "schema_version": SCHEMA_VERSION,
    }


def _outcome(
    event: PreparedEvent,
    created: bool,
    known: bool,
    stored: dict[tuple[UUID, str], tuple[UUID, StoredPayload]],
) -> Outcome:
    if created:
        return Outcome("created", event_id=event.id)
    if not known:
        reason = "contact_required" if event.contact_id is None else "contact_not_found"
        return Outcome(
            "rejected",
            reason=reason,
            message=rejection_message(reason, event),
            rejection_id=event.id,
        )
    assert event.unique_event_id is not None
    existing_id, payload = stored[(event.account_id, event.unique_event_id)]
    return Outcome("duplicate", event_id=existing_id, stored=payload)


def _rebuild_account(conn: psycopg.Connection[TupleRow], account: UUID) -> RebuildReport:
    truth_sql = (
        "SELECT contact_id, metric_name, count(*), coalesce(sum(value), 0), min(occurred_at), "
        "max(occurred_at) FROM events WHERE account_id = %s GROUP BY contact_id, metric_name"
    )
    kept_sql = (
        "SELECT contact_id, metric_name, event_count, total_value, first_event_at, "
        "last_event_at FROM contact_metrics_summary WHERE account_id = %s"
    )
    truth = {(r[0], r[1]): tuple(r[2:]) for r in conn.execute(truth_sql, (account,))}
    kept = {(r[0], r[1]): tuple(r[2:]) for r in conn.execute(kept_sql, (account,))}
    report = compare_summaries(account, truth, kept)
    if report.drift:
        conn.execute("DELETE FROM contact_metrics_summary WHERE account_id = %s", (account,))
        conn.execute(
            "INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, "
            "event_count, total_value, first_event_at, last_event_at) "
            f"SELECT %s, * FROM ({truth_sql}) t",
            (account, account),
        )
    return report
