"""The production store: PostgreSQL through psycopg 3 and a connection pool.

A batch of events is recorded by ONE statement (data-modifying CTEs over `unnest`ed
arrays): contact check, metric upsert, dedup insert, summary upsert, outbox and
rejections commit together in one round trip, whatever the batch size, and the answer
carries the duplicates' stored payloads. Only a duplicate whose stored event committed
while the statement ran costs a second, read-only, round trip.

One event goes through `sinal_record_event` (migration 0010), a function doing the same
writes in the same order, one plain statement each: for one row the set-based
statement's executor costs PostgreSQL more than the writes (migration 0011 checks the
contact inside the event's insert, one statement less; 0012 looks for the metric only
when the summary row is new). Its plans are kept per session, so it prices sequential
scans out: a plan made while a table looked tiny would otherwise scan it whole as it
grows. On an idle pooled connection it runs through libpq directly, prepared by name
(`_PooledConnection.record_one`): psycopg's execute was a tenth of the call. An event
whose contact is not in the account is left to the statement, which keeps the
rejection.

A big batch (`record_chunks`, from `Ledger.emit_many`) is streamed instead. One round
trip opens the transaction and reads the stored events of the batch's dedup keys (with
their payloads, properties as text: parsed only if a duplicate is compared) and which of
its contacts are not in their accounts, while the ledger validates the first chunk. Then the
new events go to `events` by COPY, each chunk as the ledger validates it, so PostgreSQL
inserts while Python checks; a repeat of a stored key is answered from the lookup, and
an event of no known contact goes to the record statement, which keeps the rejection.
Then one statement each for the outbox rows, the summaries and the metrics (their
parameters built while PostgreSQL inserts the COPY's last rows), and the COMMIT, in one
pipeline: the ledger builds its answers while PostgreSQL runs them. COPY skips the
per-row `INSERT ... ON CONFLICT` path (speculative insertion, the CTEs' materialised
rows): PostgreSQL spends about a third less CPU per event. Nothing waits on a key it
would not wait on in a statement: the rows go in the same order. If another
transaction stores one of the batch's keys after the lookup, the COPY fails on it, and
the whole batch is redone by the record statement, as after a deadlock (in the COPY or
in the closing statements).

A batch PostgreSQL refuses for some of its events is recorded again, in one transaction,
by `_record_isolated`: in parts under savepoints, down to the events refused, split and
answered as its caller's `Refusals` say (ingest: in halves, each refused event answered
rejected; an automation step's, `finish_steps`: event by event, each refused one kept as
a rejection).

A new summary row takes the id of an event that created it (`summary_deltas`; the
column's default, evaluated for every row an upsert is given, cost the batch's summary
statement a fifth of its time).

An event's contact and metric are checked by these statements, not by foreign keys
(migration 0009; the summaries' key to contacts went in 0012): the contact is looked up
in the account before the insert, and the metric is upserted in the same transaction as
the event and its summary. The lookup is a plain read (a row lock per event cost
`emit_event` ~80 µs of PostgreSQL's CPU, session 38): an erasure (`postgres_erasure`)
instead locks `events` against writers, SHARE ROW EXCLUSIVE, before it looks at the
contact. Every transaction that records holds ROW EXCLUSIVE on `events` before it reads
the contact (the record statement and the one-event function take it as they start; a
streamed batch with a LOCK TABLE first), so an emit that found the contact commits before
the erasure deletes, and one that comes during it waits, then finds no contact.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, NoReturn, TypeVar, cast
from uuid import UUID

import orjson
import psycopg
from psycopg import abc
from psycopg.adapt import Dumper, PyFormat, Transformer
from psycopg.copy import LibpqWriter
from psycopg.postgres import types as postgres_types
from psycopg.pq import (
    ConnStatus,
    DiagnosticField,
    ExecStatus,
    Format,
    PipelineStatus,
    TransactionStatus,
)
from psycopg.pq.abc import PGconn, PGresult
from psycopg.rows import TupleRow
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

from sinal.errors import (
    AccountNotFound,
    ConfigurationError,
    ContactNotFound,
    DuplicateKey,
    IdentityConflict,
    SchemaViolation,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    UnstorableInput,
    UnstorableText,
)
from sinal.events import SCHEMA_VERSION, EventKey, PreparedEvent, StoredPayload, dumps_json
from sinal.ids import metric_id
from sinal.keyring import Keyring
from sinal.store import base
from sinal.store.base import (
    ANSWERED,
    CONTACT_COLUMNS,
    CONTACT_REQUIRED_MESSAGE,
    DEFAULT_WAIT,
    Account,
    AggregateCell,
    AggregateQuery,
    ApiKey,
    BuildChangeEvent,
    BuildEvent,
    BuildReplayEvent,
    BuildTagEvent,
    Contact,
    ContactField,
    ContactQuery,
    EventQuery,
    FeedPage,
    FeedPosition,
    IdentityKind,
    ListedContact,
    MetricInfo,
    NewContact,
    Outcome,
    Progress,
    RebuildReport,
    Refusals,
    Rejection,
    Replay,
    Settle,
    StoredEvent,
    SummaryRow,
    account_missing,
    changed_fields,
    compare_summaries,
    contact_reason,
    contacts_page_sql,
    every_account,
    feed_page,
    qualified,
    read_migrations,
    rebuild_accounts,
    rejection_message,
    summary_deltas,
)
from sinal.store.libpq import network_defaults
from sinal.store.postgres_automations import PostgresAutomations
from sinal.store.postgres_commerce import PostgresCommerce
from sinal.store.postgres_erasure import WRITE_EVENTS, PostgresErasure
from sinal.store.postgres_messaging import PostgresMessaging
from sinal.store.postgres_retention import PostgresRetention
from sinal.store.postgres_webhooks import PostgresWebhooks
from sinal.store.respelling import (
    RESPELLING_VERSION,
    Unrespelled,
    respell_identities,
    unrespelled,
)

log = logging.getLogger("sinal.store")

# Any two sessions' lock ids would do; this one spells "sinal" in ASCII.
_MIGRATION_LOCK = 0x73696E616C
_RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
# A streamed batch is redone through the statement when another transaction stored one of
# its keys after the lookup (or when the transaction was aborted).
_REDONE = (*_RETRYABLE, psycopg.errors.UniqueViolation)
_ATTEMPTS = 5
T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")
LA = TypeVar("LA", bound=list[Any])
LB = TypeVar("LB", bound=list[Any])

_EVENT_COLUMNS = (
    "account_id, id, contact_id, metric_name, properties, value, currency, source, source_id, "
    "integration_id, unique_event_id, entity_type, entity_id, automation_execution_id, "
    "occurred_at, received_at, schema_version"
)
_REJECTION_COLUMNS = "account_id, id, reason, message, payload, created_at, replayed_event_id"
# A listed contact's tags, as `list_tags` reads them (`contacts_page_sql`'s last column).
_CONTACT_TAGS = (
    ", ARRAY(SELECT t.tag FROM contact_tags t WHERE t.account_id = c.account_id "
    'AND t.contact_id = c.id ORDER BY t.tag COLLATE "C")'
)
_KEY_COLUMNS = "account_id, id, key_hash, hint, name, scopes, created_at, revoked_at"
_MEASURES = {
    "count": "count(*)",
    "sum_value": "coalesce(sum(value), 0)",
    "unique_contacts": "count(DISTINCT contact_id)",
}
# An aggregate's group label (SQLite's `_group_text` says it alike): a number by its value
# in plain notation (trim_scale: 1.0 is 1), a string unquoted, anything else as jsonb text.
_GROUP = (
    "CASE WHEN jsonb_typeof(properties -> %(by)s) = 'number' "
    "THEN trim_scale((properties -> %(by)s)::numeric)::text ELSE properties ->> %(by)s END"
)

# Rows are sorted before every insert that can wait on another transaction (events by
# unique id, metrics and summaries by key), so concurrent batches lock in one order.
# Parameters go in binary (`%b`): psycopg escapes every element of a text array with a
# regex, and the JSON properties are full of quotes. The statement's whitespace is
# collapsed below, and its parameters go by position (their names took ~230 characters),
# so that it stays under psycopg's 4,096-character limit for caching its conversion
# (converting 4 kB of placeholders anew took ~50 µs a call); a test keeps it there.
# The batch's rows, as one array per column (`unnest`), or one row of scalars: psycopg
# dumps an array per parameter, which for a single event costs more than the statement.
_INPUT_COLUMNS = (
    ("ord", "int"), ("id", "uuid"), ("account_id", "uuid"), ("contact_id", "uuid"),
    ("metric_name", "text"), ("properties", "text"), ("value", "numeric"), ("currency", "text"),
    ("source", "text"), ("source_id", "text"), ("integration_id", "uuid"),
    ("unique_event_id", "text"), ("entity_type", "text"), ("entity_id", "text"),
    ("execution_id", "uuid"), ("occurred_at", "timestamptz"), ("received_at", "timestamptz"),
    ("metric_id", "uuid"),
    # Last, the columns only the metric upsert reads.
    ("display_name", "text"), ("category", "text"), ("is_system", "bool"),
)  # fmt: skip


def _unnest(columns: Sequence[tuple[str, str]]) -> str:
    return "SELECT * FROM unnest({}) AS t({})".format(
        ", ".join(f"%b::{kind}[]" for _, kind in columns),
        ", ".join(name for name, _ in columns),
    )


_INPUT_MANY = _unnest(_INPUT_COLUMNS)
_INPUT_ONE = "SELECT " + ", ".join(f"%b::{kind} AS {name}" for name, kind in _INPUT_COLUMNS)
# The parts of the record statement. Keys are sorted in code point order (COLLATE "C", as
# Python sorts str) wherever a row may wait on another transaction's: the ledger sends a
# big batch in chunks ordered that way, so a batch sent whole or in chunks locks alike.
_KNOWN = """
known AS (
    SELECT i.* FROM input i
    CROSS JOIN LATERAL (SELECT 1 FROM contacts c
                        WHERE c.account_id = i.account_id AND c.id = i.contact_id LIMIT 1) c
)"""
# A metric is made by an event stored, never by a duplicate or a rejection (as the
# one-event function and a streamed batch's closing statements do).
_NEW_METRICS = """
new_metrics AS (
    INSERT INTO metrics (account_id, id, name, display_name, category, source, is_system)
    SELECT DISTINCT ON (account_id, metric_name COLLATE "C")
           account_id, metric_id, metric_name, display_name, category, source, is_system
    FROM known WHERE id IN (SELECT id FROM stored)
    ORDER BY account_id, metric_name COLLATE "C", ord
    ON CONFLICT DO NOTHING
)"""
_STORED = f"""
stored AS (
    INSERT INTO events (account_id, id, contact_id, metric_id, metric_name, properties, value,
                        currency, source, source_id, integration_id, unique_event_id,
                        entity_type, entity_id, automation_execution_id, occurred_at,
                        received_at, schema_version)
    SELECT account_id, id, contact_id, metric_id, metric_name, properties::jsonb, value, currency,
           source, source_id, integration_id, unique_event_id, entity_type, entity_id,
           execution_id, occurred_at, received_at, {SCHEMA_VERSION:d}
    FROM known ORDER BY account_id, unique_event_id COLLATE "C", ord
    ON CONFLICT (account_id, unique_event_id) DO NOTHING
    RETURNING account_id, id, contact_id, metric_name, currency, value, occurred_at,
              automation_execution_id
)"""
# A new summary row takes the id of an event that created it (`summary_deltas`). A row
# counts the events of one currency (migration 0031): a total never adds two currencies.
_SUMMARY_COLUMNS = (
    "account_id, contact_id, metric_name, currency, id, event_count, total_value, "
    "first_event_at, last_event_at, updated_at"
)
# A total stays NULL until an event with a value comes, as SUM(value) over the events
# does (`base.add_values`): the new events' NULL (none had a value) leaves it as it was.
# `updated_at = now()`, the rows' own (the transaction's start), is shorter than
# excluded's: the record statements stay within the 4,096 characters psycopg caches the
# conversion of (`test_the_record_statements_stay_within_psycopgs_cache_limit`).
_SUMMARY_CONFLICT = """
ON CONFLICT (account_id, contact_id, metric_name, currency) DO UPDATE SET
    event_count = s.event_count + excluded.event_count,
    total_value = coalesce(coalesce(s.total_value, 0) + excluded.total_value, s.total_value),
    first_event_at = least(s.first_event_at, excluded.first_event_at),
    last_event_at = greatest(s.last_event_at, excluded.last_event_at),
    updated_at = now()"""
_SUMMARY = f"""
summary AS (
    INSERT INTO contact_metrics_summary AS s ({_SUMMARY_COLUMNS})
    SELECT account_id, contact_id, metric_name, currency, (array_agg(id))[1], count(*),
           sum(value), min(occurred_at), max(occurred_at), now()
    FROM stored GROUP BY account_id, contact_id, metric_name, currency
    ORDER BY account_id, contact_id, metric_name COLLATE "C", currency
    {_SUMMARY_CONFLICT}
)"""
_OUTBOXED = """
outboxed AS (
    INSERT INTO outbox (account_id, event_id, metric_name)
    SELECT account_id, id, metric_name FROM stored WHERE automation_execution_id IS NULL
)"""
# `contact_required`'s message as a literal of the statement (quotes doubled, and `%`
# doubled for psycopg's placeholders): the same text `rejection_message` gives.
_CONTACT_REQUIRED = "'{}'".format(CONTACT_REQUIRED_MESSAGE.replace("'", "''").replace("%", "%%"))
# A rejection keeps its input as SQLite's does (`PreparedEvent.as_input`): occurred_at as
# `events.stamp` writes it, in UTC with "Z", microseconds only when there are some.
_REJECTED = f"""
rejected AS (
    INSERT INTO rejections (account_id, id, contact_id, reason, message, source, payload)
    SELECT i.account_id, i.id, i.contact_id,
           CASE WHEN i.contact_id IS NULL THEN 'contact_required' ELSE 'contact_not_found' END,
           CASE WHEN i.contact_id IS NULL THEN {_CONTACT_REQUIRED}
                ELSE format('contact %%s does not exist in account %%s', i.contact_id,
                            i.account_id) END,
           i.source,
           jsonb_build_object(
               'account_id', i.account_id, 'contact_id', i.contact_id,
               'metric_name', i.metric_name, 'properties', i.properties::jsonb,
               'value', i.value::text, 'currency', i.currency, 'source', i.source,
               'source_id', i.source_id, 'integration_id', i.integration_id,
               'entity_type', i.entity_type, 'entity_id', i.entity_id,
               'occurred_at', replace(to_char(i.occurred_at AT TIME ZONE 'UTC',
                                              'YYYY-MM-DD"T"HH24:MI:SS.US'), '.000000', '')
                              || 'Z',
               'automation_execution_id', i.execution_id)
    FROM input i WHERE NOT EXISTS (SELECT 1 FROM known k WHERE k.ord = i.ord)
      AND (SELECT true FROM accounts WHERE id = i.account_id)
    RETURNING id
)"""
# The answer of a record statement: each input's (ord, created, known) and, for a
# duplicate, the stored event's id and payload (none when that event committed after this
# statement's snapshot was taken: a second query reads those). `known` is NULL for an
# event of no account, kept nowhere (`rejected` skips it): a rejection under an account
# that does not exist is one no list shows.
_ANSWER = """
SELECT i.ord, s.id IS NOT NULL,
       k.ord IS NOT NULL OR (SELECT false FROM accounts WHERE id = i.account_id),
       d.id, d.metric_name, d.properties::text, d.value, d.currency, d.occurred_at
FROM input i
LEFT JOIN known k ON k.ord = i.ord
LEFT JOIN stored s ON s.id = i.id
LEFT JOIN LATERAL (SELECT * FROM events e WHERE s.id IS NULL AND e.account_id = k.account_id
                   AND e.unique_event_id = k.unique_event_id LIMIT 1) d ON true
ORDER BY i.ord
"""
# The whole record. PostgreSQL runs `stored` as the main query reads it, then the other
# data-modifying parts in reverse order of their place here: rejections, outbox,
# summaries, metrics (seen on PostgreSQL 15 with a sequence default on each table). A
# streamed batch writes events, outbox, summaries and metrics in that order.
_RECORD_BODY = ",".join((_KNOWN, _STORED, _NEW_METRICS, _SUMMARY, _OUTBOXED, _REJECTED)) + _ANSWER
# The values' sums go as text, exact (NULL for none), for PostgreSQL to read: psycopg's
# binary numeric dumper took ~1.6 µs a value, on the client, while PostgreSQL waited for
# the statement.
_SUMMARY_SQL = f"""
INSERT INTO contact_metrics_summary AS s ({_SUMMARY_COLUMNS})
SELECT a, c, m, k, i, n, v::numeric, f, l, now()
FROM unnest(%b::uuid[], %b::uuid[], %b::text[], %b::text[], %b::int[], %b::text[],
            %b::timestamptz[], %b::timestamptz[], %b::uuid[]) AS t(a, c, m, k, n, v, f, l, i)
ORDER BY a, c, m COLLATE "C", k
{_SUMMARY_CONFLICT}
"""
_METRICS_SQL = """
INSERT INTO metrics (account_id, id, name, display_name, category, source, is_system)
SELECT * FROM unnest(%b::uuid[], %b::uuid[], %b::text[], %b::text[], %b::text[], %b::text[],
                     %b::bool[]) AS t(a, i, n)
ORDER BY a, n COLLATE "C"
ON CONFLICT DO NOTHING
"""


def _compact(statement: str) -> str:
    """`statement` with its whitespace collapsed, and none left after a comma or around
    `=` outside its string literals (whose single spaces stay: no literal here holds
    more than one in a row)."""
    parts = " ".join(statement.split()).replace("( ", "(").replace(" )", ")").split("'")
    # Outside a literal are the even parts (a doubled quote inside one makes an empty one).
    parts[::2] = [p.replace(", ", ",").replace(" = ", "=") for p in parts[::2]]
    return "'".join(parts)


_RECORD_SQL = _compact(f"WITH input AS ({_INPUT_MANY}), {_RECORD_BODY}")
_RECORD_ONE_SQL = _compact(f"WITH input AS ({_INPUT_ONE}), {_RECORD_BODY}")
# One event, with `_RECORD_ONE_SQL`'s parameters: the record statement's row shape, (ord,
# created, known, stored payload).
_RECORD_EVENT = (
    "SELECT 0, created, known, stored_id, stored_metric_name, stored_properties::text, "
    "stored_value, stored_currency, stored_occurred_at "
    f"FROM sinal_record_event({{}}, p_schema_version => {SCHEMA_VERSION:d})"
)
_RECORD_EVENT_SQL = _RECORD_EVENT.format(
    ", ".join(f"p_{name} => %b::{kind}" for name, kind in _INPUT_COLUMNS[1:])
)
# The same, prepared by name on each pooled connection and run through libpq directly
# (`_PooledConnection.record_one`): its parameters are `_input_row`'s but `ord`.
_RECORD_EVENT_NAME = b"sinal_record_event"
_RECORD_EVENT_PREPARED = _RECORD_EVENT.format(
    ", ".join(f"p_{name} => ${i}::{kind}" for i, (name, kind) in enumerate(_INPUT_COLUMNS[1:], 1))
).encode()

# Rows looked up by a whole key go through `LATERAL (... LIMIT 1)`, which the planner
# cannot flatten into a join: planned on statistics older than the table's growth (a new
# install, a burst), a join can scan a whole account's rows per key, and a prepared
# statement keeps that plan until the next ANALYZE.
#
# And neither is prepared: each is planned for its batch. A table vacuumed while empty
# (after a purge, or an operator's VACUUM) has statistics of no rows, for which a
# sequential scan per key is cheapest, and psycopg prepares a statement after five runs:
# the plan was kept while the table grew, until autovacuum's next ANALYZE, and each key
# of a batch read the whole table. After a purge and a VACUUM, 10,000 events by batches
# of 500 went at 2,580 events/s against 19,710 before, prepared; 21,190 against 18,708,
# planned per batch (bench/HISTORY.md, session 33). With sequential scans off, as
# `sinal_record_event` runs, the planner took another index of `events` and read the
# account's rows per key (762 events/s): with no rows expected, every index costs the
# same. Planned per batch, the plan follows the table's size as it grows; the planning
# did not show in `bench/ingest.py` (8 runs alternated with the prepared statements).
#
# Both answer with the key's place in the arrays (`ord`, from 1), not the key: the caller
# has it already, and loading 400 UUIDs back cost ~0.5 ms of a batch's ~25.
_DUPLICATES_SQL = """
SELECT k.ord, e.id, e.metric_name, e.properties::text, e.value, e.currency, e.occurred_at
FROM unnest(%b::uuid[], %b::text[]) WITH ORDINALITY AS k(account_id, unique_event_id, ord)
CROSS JOIN LATERAL (SELECT * FROM events
                    WHERE account_id = k.account_id AND unique_event_id = k.unique_event_id
                    LIMIT 1) e
"""
# A streamed batch reads its contacts before its COPY: it holds ROW EXCLUSIVE on `events`
# first, as a statement that inserts does from its start (see the module).
_LOCK_EVENTS = WRITE_EVENTS
# The places of the pairs whose contact is not in the account: usually none, where the
# found ones were a row each to read (~200 a batch of 500 in bench/ingest.py). The LATERAL
# subquery's LIMIT keeps the plan an index probe per pair, as `_DUPLICATES_SQL`'s: a NOT
# EXISTS could become a hash anti join over the whole table. Read after the batch's
# `_LOCK_EVENTS`: an erasure of one of the contacts waits for the batch, or the batch for
# it (see the module).
_MISSING_CONTACTS_SQL = """
SELECT k.ord
FROM unnest(%b::uuid[], %b::uuid[]) WITH ORDINALITY AS k(account_id, contact_id, ord)
LEFT JOIN LATERAL (SELECT true AS found FROM contacts
                   WHERE account_id = k.account_id AND id = k.contact_id LIMIT 1) c ON true
WHERE c.found IS NULL
"""
# A streamed batch's new events, in the record statement's insert order (the ledger sends
# the chunks sorted by dedup key), then their outbox rows.
#
# The WHERE holds for every row (`random()` is in [0, 1)); it is there because it is
# volatile. Otherwise PostgreSQL buffers a COPY's rows and inserts them 1,000 at a time or
# per 64 kB of text lines, and a binary row has no line: a batch's heap and index inserts
# all waited for its last row, the client idle meanwhile (6-7 ms of a ~37 ms batch of
# 500). With a volatile WHERE, PostgreSQL inserts each row as it reads it, while the
# ledger validates the next ones (bench/HISTORY.md, session 12).
_COPY_SQL = (
    f"COPY events ({_EVENT_COLUMNS}, metric_id) FROM STDIN (FORMAT BINARY) WHERE random() >= 0"
)
_COPY_TYPES = (
    "uuid", "uuid", "uuid", "text", "jsonb", "numeric", "text", "text", "text", "uuid", "text",
    "text", "text", "uuid", "timestamptz", "timestamptz", "int4", "uuid",
)  # fmt: skip
_OUTBOX_SQL = """
INSERT INTO outbox (account_id, event_id, metric_name)
SELECT * FROM unnest(%b::uuid[], %b::uuid[], %b::text[])
"""

# The change feed (migration 0021): events by the id of the transaction that wrote them,
# then by id, only those of transactions older than the oldest still running. Every one
# of those has ended, and a transaction that has not written yet will get a larger id:
# no event can later appear behind a position handed out. Ordering by the events' ids
# alone would not do: a transaction holding a smaller id can commit after a reader has
# passed it. One statement, so the horizon is that of the snapshot its rows are read in
# (`pg_current_snapshot()` is the statement's). `tx` goes out as text (psycopg has no
# loader for xid8), under another name: ORDER BY would otherwise sort by that text.
_FEED_SQL = f"""
SELECT tx::text AS arrival, {_EVENT_COLUMNS} FROM events
WHERE account_id = %s AND (tx, id) > (%s::xid8, %s)
  AND tx < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY tx, id LIMIT %s
"""

# psycopg's message for a text parameter holding a NUL ("PostgreSQL text fields cannot
# contain NUL (0x00) bytes"); it raises a plain DataError, with no SQLSTATE to tell by.
_NUL_REFUSED = "cannot contain NUL"
# How the foreign keys to contacts are named (PostgreSQL's default names).
_CONTACT_KEY = "_account_id_contact_id_fkey"
# The SQLSTATE classes of a statement refused for the data it was given: data exception
# (a value out of a column's range, a text or JSON PostgreSQL cannot hold), integrity
# constraint violation, program limit exceeded (an index row too large). psycopg raises
# class 54 as an OperationalError, which said "unavailable" (retry) for it before.
# And plpgsql's class P0 (RAISE, ASSERT, SELECT INTO STRICT): sinal's migrations raise
# none, so it is a trigger or function someone added judging the row it was given, as a
# RAISE in a SQLite trigger does (`UnstorableInput` there too): the event is refused alone.
# And class 44, a view's WITH CHECK OPTION: a row outside the view's condition, a CHECK
# under another name (sinal writes through no view; a row-level security policy's refusal
# is 42501 instead, sinal's role lacking a right).
_REFUSAL_CLASSES = ("22", "23", "44", "54", "P0")
# ... but for these, which say what sinal itself wrote or asked, whatever the input
# (`SchemaViolation`): a NOT NULL column left empty (23502), a reference to a row that is
# not there (23503: sinal checks each one it takes from an input before writing; a
# contact erased meanwhile is told apart above, a new contact's account where it is
# inserted), a row another restricts (23001), a
# NULL or a division by zero in its own SQL (22004, 22012), a statement beyond
# PostgreSQL's limits (54001 too complex, 54011 too many columns, 54023 too many
# arguments). A value out of range, a text or JSON PostgreSQL cannot hold, a CHECK, an
# index row too large (54000) or an error a trigger raises judge the data: the input's.
_OWN_FAULTS = frozenset({"23502", "23503", "23001", "22004", "22012", "54001", "54011", "54023"})
# ... and these classes, whatever the statement (`SchemaViolation` too): syntax error or
# access rule violation (42: a table, column or function that is not there, as when code
# runs on a schema it was not migrated for or one changed under it; SQL PostgreSQL cannot
# parse; a privilege the role lacks) and feature not supported (0A). Sending the request
# again fails alike, and the input is not at fault. So do these, which a retry cannot fix
# either (psycopg raises 3B as an OperationalError, which said "retry" for it):
_OWN_FAULT_CLASSES = (
    "42",  # but for 42501 (`_MISCONFIGURED`)
    "0A",
    "0B",  # invalid transaction initiation: a transaction begun where none can be, as 2D
    "0Z",  # diagnostics exception (0Z002: GET STACKED DIAGNOSTICS outside a handler): a
    # plpgsql routine's bug, as 2F and 20 are
    "21",  # cardinality violation: a subquery or an upsert of sinal's met more rows than it expects
    "26",  # invalid SQL statement name: a prepared statement not there (a pooler in between)
    "2D",  # invalid transaction termination: sinal's own transaction handling
    "34",  # invalid cursor name: sinal's own cursor handling
    "3B",  # savepoint exception: sinal's own savepoints
    "3F",  # invalid schema name: a schema not there, as a table not there is (42P01)
    "24",  # invalid cursor state: sinal's own cursors (FETCH, WHERE CURRENT OF)
    # invalid transaction state (25P02 a statement after an error in the transaction,
    # 25001 a statement that cannot run in one, 25P01 SAVEPOINT outside one): sinal's own
    # transaction handling; but for `_PASSING`'s, which a retry may pass
    "25",
    "27",  # triggered data change violation: a BEFORE trigger changed a row the
    # statement then changes again; the triggers' and the statement's shape, whatever the row
    "2F",  # SQL routine exception (2F005: a function ended without RETURN): its bug
    # external routine exception: an exception escaped a PL/Python, PL/Perl or PL/Tcl
    # routine or a C extension (sinal installs none): a crash as likely as a judgment (one
    # that means to refuse the row can give its SQLSTATE, P0001 or 23514, as plpgsql's
    # RAISE does), and a 500 with the traceback logged shows it to the operator, where a
    # 422 would tell the client to change an input that may be fine
    "38",
    # external routine invocation exception (39P01 a trigger function that returned what
    # a trigger cannot, 39004 a NULL where one cannot be) and plpgsql's CASE without the
    # ELSE a value needed (20000): a routine's bug (psycopg raises 27, 2F, 38 and 39 as an
    # OperationalError, which said "retry" for them)
    "39",
    "20",
    "XX",  # internal error, data or index corrupted: the database's own fault, for its
    # operator (a 500 with an error_id, its traceback logged), which a retry reads again
)
# Class 25's that a retry may pass (`StoreUnavailable`, 503), whatever sinal sent: a
# read-only transaction (25006: a hot standby, as an address still naming the old
# primary is once it is back as a standby after a failover, until the address names the
# new one; or default_transaction_read_only, set by an operator or by a provider whose
# disk quota is reached), and a session or transaction the server ended for lasting too
# long (25P03 idle_in_transaction_session_timeout, 25P04 transaction_timeout; the
# connection closed with it), as a statement_timeout's 57014 is a retry's.
_PASSING = frozenset({"25006", "25P03", "25P04"})
# ... and a snapshot too old (72000: a statement's snapshot outlived old_snapshot_threshold,
# PostgreSQL 16 and older, the rows it needed since vacuumed): the next try takes a new one.
_SNAPSHOT_TOO_OLD = "72000"

# A statement the database's configuration refuses, whatever the input and whatever
# sinal's SQL (`StoreMisconfigured`: 503 without Retry-After, as no retry helps until the
# operator acts; not a bug's 500): by SQLSTATE, else by its class, the answer's `code`
# and the operator's fix. Sinal runs no GRANT, REVOKE, SET ROLE, nor a trigger that
# raises these: a migration run by another role, a REVOKE, a row-level security policy,
# or a trigger, function or role setting someone added does.
_MISCONFIGURED = {
    "42501": (
        "insufficient_privilege",
        "grant the role sinal connects as SELECT, INSERT, UPDATE and DELETE on sinal's "
        "tables and EXECUTE on its functions (`sinal migrate` needs CREATE on the schema "
        "too), or connect as the role that ran `sinal migrate`",
    ),
    "0L": (  # invalid grantor, invalid grant operation
        "invalid_grant",
        "fix or drop the GRANT or REVOKE that a trigger, function or setting someone added "
        "to the database runs for sinal's role",
    ),
    "0P": (  # invalid role specification
        "invalid_role",
        "fix the role that a trigger, function or role setting (ALTER ROLE ... SET role) "
        "someone added names for sinal's role",
    ),
    "2B": (  # dependent privilege descriptors, or objects, still exist
        "dependent_objects",
        "objects someone added depend on one sinal changes or drops (a view, a foreign key, "
        "a grant): drop them, run sinal again, then make them again",
    ),
    "09": (  # triggered action exception: raised by a trigger set up wrong (contrib's)
        "trigger_failed",
        "fix or drop the trigger someone added to sinal's tables whose action fails (sinal "
        "adds none that raises this)",
    ),
}


@contextmanager
def translated_errors() -> Iterator[None]:
    """Turn psycopg's exceptions into sinal's, chained."""
    try:
        yield
    except psycopg.Error as exc:
        _raise_translated(exc)


def _raise_translated(exc: psycopg.Error) -> NoReturn:
    """Raise sinal's error for psycopg's `exc` (the pool's errors included: a timeout, a
    closed pool), chained to it."""
    if isinstance(exc, psycopg.errors.UniqueViolation):
        raise DuplicateKey(exc.diag.constraint_name) from exc
    if _is_contact_gone(exc):
        # a row naming a contact that an erasure deleted meanwhile: the writer waited for
        # the erasure's lock (the writer's check takes the contact FOR KEY SHARE), then found
        # no contact, as if it had come after the erasure
        raise ContactNotFound(str(exc)) from exc
    if isinstance(exc, psycopg.DataError) and _NUL_REFUSED in str(exc):
        # psycopg's own check, before anything is sent: a text parameter holds a NUL
        raise UnstorableText from exc
    misconfigured = _MISCONFIGURED.get(exc.sqlstate or "") or _MISCONFIGURED.get(
        (exc.sqlstate or "")[:2]
    )
    if misconfigured is not None:  # the operator's to fix, whatever the input
        raise StoreMisconfigured(_reason(exc), *misconfigured) from exc
    if _is_own_fault(exc):  # a bug of sinal's (or a schema changed under it)
        raise SchemaViolation(_reason(exc)) from exc
    if _is_refused(exc):  # its first line: the next ones may quote the whole row
        raise UnstorableInput(_reason(exc)) from exc
    if exc.sqlstate == _SNAPSHOT_TOO_OLD:
        raise StoreUnavailable(
            f"{_reason(exc)}; the request may be retried, and a larger old_snapshot_threshold "
            "(or shorter statements beside it) makes it rarer",
            code="snapshot_too_old",
        ) from exc
    if _is_passing(exc):
        # the connection (lost, refused, the pool's timeout), the server (shutting down, a
        # standby), or a transaction it rolled back to be retried (serialization, deadlock)
        raise StoreUnavailable(str(exc)) from exc
    raise StoreError(str(exc)) from exc


def _holders(
    conn: psycopg.Connection[TupleRow], contact: NewContact
) -> dict[IdentityKind, Contact]:
    """The contact each of `contact`'s identities names, most specific first."""
    pairs = contact.identities()
    if not pairs:
        return {}
    rows = conn.execute(
        f"SELECT k.kind, {qualified(CONTACT_COLUMNS, 'c')} "
        "FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS k(kind, value, n) "
        "JOIN contact_identities i "
        "  ON i.account_id = %s AND i.kind = k.kind AND i.value = k.value "
        "JOIN contacts c ON c.account_id = i.account_id AND c.id = i.contact_id "
        "ORDER BY k.n",
        ([k for k, _ in pairs], [v for _, v in pairs], contact.account_id),
    ).fetchall()
    return {row[0]: Contact(*row[1:]) for row in rows}


def _is_contact_gone(exc: psycopg.Error) -> bool:
    return isinstance(exc, psycopg.errors.ForeignKeyViolation) and str(
        exc.diag.constraint_name
    ).endswith(_CONTACT_KEY)


def _is_own_fault(exc: psycopg.Error) -> bool:
    """Whether PostgreSQL refused what sinal itself wrote or asked: `SchemaViolation`."""
    if exc.sqlstate is None and isinstance(exc, psycopg.ProgrammingError):
        return True  # psycopg's own check, before anything is sent: placeholders, say
    if exc.sqlstate in _PASSING:
        return False
    return exc.sqlstate in _OWN_FAULTS or (exc.sqlstate or "")[:2] in _OWN_FAULT_CLASSES


def _is_passing(exc: psycopg.Error) -> bool:
    """Whether the database cannot take the statement now but may later: `StoreUnavailable`
    (psycopg raises most such as an `OperationalError`; `_PASSING`'s are its InternalError)."""
    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) or (
        exc.sqlstate in _PASSING
    )


def _is_refused(exc: psycopg.Error) -> bool:
    """Whether PostgreSQL (or psycopg, for a NUL) refused a statement for its data:
    `UnstorableInput`. Not a unique key (a race, redone), a contact erased meanwhile, nor
    what sinal itself wrote or asked wrong (`_is_own_fault`)."""
    if isinstance(exc, psycopg.errors.UniqueViolation) or _is_contact_gone(exc):
        return False
    if _is_own_fault(exc):
        return False
    if isinstance(exc, psycopg.DataError) and _NUL_REFUSED in str(exc):
        return True
    return (exc.sqlstate or "")[:2] in _REFUSAL_CLASSES


def _configure(conn: psycopg.Connection[TupleRow], lock_wait: float = DEFAULT_WAIT) -> None:
    set_json_loads(orjson.loads, conn)
    set_json_dumps(dumps_json, conn)
    # Whatever the database's or the role's defaults: read committed, which sinal's writes
    # are built for (a statement waits for a concurrent key and then sees its row; with a
    # serializable default, racing writers failed more often than they retried); and
    # dates in ISO, the only style psycopg reads back (with 'SQL, DMY' every read of a
    # timestamp failed); and times in UTC, as sinal stores them: a timestamptz turned into
    # text in SQL (a rejection's payload) took the database's zone. And a lock not granted
    # within the wait (a table locked by a long DDL, a stuck session) fails the call with
    # 55P03 (StoreUnavailable: 503, Retry-After) instead of holding a request, and a thread
    # and a connection of this process, for as long as the lock. One round trip for all.
    conn.execute(
        "SELECT set_config('default_transaction_isolation', 'read committed', false), "
        "set_config('datestyle', 'ISO', false), set_config('intervalstyle', 'postgres', false), "
        "set_config('timezone', 'UTC', false), set_config('lock_timeout', %s, false)",
        (f"{lock_wait * 1000:.0f}ms",),
    )
    conn.adapters.register_dumper(_UuidArray, _UuidArrayDumper)
    conn.adapters.register_dumper(_TextArray, _TextArrayDumper)
    if isinstance(conn, _PooledConnection):
        conn.returned_at = time.monotonic()  # just made: known to work


def _rows(conn: psycopg.Connection[TupleRow], query: str, args: Sequence[Any]) -> list[TupleRow]:
    """A statement's rows, [] for one that returns none (a migration step's `Query`)."""
    cursor = conn.execute(query.encode(), args)  # a step's own statements
    return cursor.fetchall() if cursor.description else []


def _check_encoding(conn: psycopg.Connection[TupleRow]) -> None:
    """`ConfigurationError` unless the database stores text as UTF-8: in any other
    encoding, text PostgreSQL cannot convert fails on write, and SQL_ASCII keeps bytes
    unchecked."""
    row = conn.execute("SELECT current_database(), current_setting('server_encoding')").fetchone()
    assert row is not None
    database, encoding = row
    if encoding != "UTF8":
        raise ConfigurationError(
            f"sinal needs a UTF8 database; {database!r} is {encoding}: create one with "
            "CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0"
        )


class _PooledConnection(psycopg.Connection[TupleRow]):
    """The pool's connections. Each keeps the cursor of the one-event statement: a cursor
    made anew sets up its adapters and loaders again, which cost a fifth of the call's
    client CPU (`record` of one event: 150 → 129 µs, the medians of 10 alternated rounds
    of 1,000 calls).

    And each runs the one-event function through libpq directly when it can
    (`record_one`): psycopg's execute, a generator-driven wait and per-call query and
    parameter handling, cost ~50 µs of a ~420 µs call (bench/HISTORY.md, session 15)."""

    _one_event: psycopg.Cursor[TupleRow] | None = None
    _one_event_adapter: abc.Transformer | None = None  # set once the statement is prepared
    returned_at = 0.0  # `time.monotonic()` when made, then when last returned to the pool

    def one_event_cursor(self) -> psycopg.Cursor[TupleRow]:
        """The kept cursor (made on first use, or again if it was closed)."""
        cursor = self._one_event
        if cursor is None or cursor.closed:
            cursor = self._one_event = self.cursor()
        return cursor

    def record_one(self, params: Sequence[Any]) -> list[TupleRow] | None:
        """`sinal_record_event`'s answer for one event's `params`, through libpq: the
        statement prepared by name once per connection, then one blocking call (libpq
        waits with the GIL released), parameters dumped and the row loaded by psycopg's
        own adapters. Only on an idle connection in autocommit, where a failed call leaves
        nothing behind; otherwise, or when PostgreSQL answers anything but the row (an
        error; the statement gone, after psycopg's `DEALLOCATE ALL`), None: the caller
        runs it through psycopg, which raises what psycopg raises. A connection lost on
        the way (reset, timed out) raises `OperationalError` with libpq's reason: run again
        through psycopg, the call would only say that the connection is closed."""
        pgconn = self.pgconn
        if (
            pgconn.transaction_status != TransactionStatus.IDLE
            or pgconn.pipeline_status != PipelineStatus.OFF
        ):
            return None
        adapter = self._one_event_adapter
        if adapter is None:
            prepared = pgconn.prepare(_RECORD_EVENT_NAME, _RECORD_EVENT_PREPARED)
            if prepared.status != ExecStatus.COMMAND_OK and _sqlstate(prepared) != _EXISTS:
                _raise_if_lost(pgconn, prepared)
                return None
            adapter = self._one_event_adapter = Transformer(self)
        values = adapter.dump_sequence(params, _BINARY_PARAMS)
        # A None value is a NULL, as for `send_query_prepared` (typed so; this one is not).
        params_ = cast(Sequence[abc.Buffer], values)
        result = pgconn.exec_prepared(_RECORD_EVENT_NAME, params_, _BINARY_FORMATS, Format.BINARY)
        if result.status != ExecStatus.TUPLES_OK:
            _raise_if_lost(pgconn, result)
            if _sqlstate(result) == _NO_SUCH_STATEMENT:
                self._one_event_adapter = None  # prepared again on the next call
            return None
        adapter.set_pgresult(result)
        return adapter.load_rows(0, result.ntuples, tuple)


_BINARY_PARAMS = [PyFormat.BINARY] * (len(_INPUT_COLUMNS) - 1)
_BINARY_FORMATS = [Format.BINARY] * (len(_INPUT_COLUMNS) - 1)
_EXISTS = b"42P05"  # duplicate_prepared_statement
_NO_SUCH_STATEMENT = b"26000"  # invalid_sql_statement_name


def _sqlstate(result: PGresult) -> bytes | None:
    return result.error_field(DiagnosticField.SQLSTATE)


def _raise_if_lost(pgconn: PGconn, result: PGresult) -> None:
    """Raise `OperationalError` with `result`'s message if `pgconn` is no longer usable."""
    if pgconn.status != ConnStatus.OK:
        message = result.get_error_message("utf-8").strip()
        raise psycopg.OperationalError(message or "the connection to PostgreSQL was lost")


class _LifoPool(ConnectionPool[_PooledConnection]):
    """psycopg's pool, handing out the idle connection returned last (its own hands out
    the one returned first, so a sequential caller rotates through every connection a
    burst ever opened).

    After 8 threads had each held a connection once, a sequential `emit_event` made 1,762
    and 1,966 events/s through the pool's own order, 2,601 and 2,425 through this one, and
    2,554 and 2,511 before the pool grew (2026-12-01, 2,000 events a run, the bench's
    workload): each call woke a backend whose caches the other seven had cooled. The
    others stay idle at the front of the queue, where psycopg's `ShrinkPool` takes the
    connections it closes when some went unused for `max_idle` seconds.

    The order is psycopg_pool's internals (`_pool`, a deque taken from the left by
    `_get_ready_connection`, under the pool's lock):
    `test_the_pool_hands_out_the_connection_returned_last` fails if they change.

    A connection idle for more than `ALIVE_BYPASS` seconds is tried (an empty statement)
    before it is handed out, and replaced if its server ended it meanwhile: after a
    restart or a failover, the first call on each idle connection used to fail with 503.
    One returned more recently is handed out untried, as HikariCP does: under load no
    call pays the round trip. (psycopg's own `check` tries every connection, and waits a
    second or more before trying the next after a failure.)

    While PostgreSQL cannot be reached, a call waits for a connection only until the
    outage is `timeout` seconds old, then fails at once with libpq's reason; the pool
    tries to connect again every `RECONNECT_EVERY` seconds, and the first connection it
    makes ends that. Stopped for 40 s under `sinal serve`, PostgreSQL had every request
    wait 30 s for a 503, and served again 11 s after it was back (bench/HISTORY.md,
    session 27)."""

    def _get_ready_connection(self, timeout: float | None) -> _PooledConnection | None:
        self._pool.rotate(1)  # the last one returned goes to the left, where it is taken
        return super()._get_ready_connection(timeout)

    # Since when no connection could be made, and libpq's reason (None: the last attempt
    # worked). Written by the pool's own threads, read by the callers'.
    unreachable: tuple[float, str] | None = None

    def getconn(self, timeout: float | None = None) -> _PooledConnection:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            now = time.monotonic()
            left = deadline - now
            down = self.unreachable
            if down is not None:  # wait no longer than the outage's first `timeout` seconds
                left = min(left, down[0] + self.timeout - now)
                if left <= 0 and not self._pool:
                    raise _unreachable(down, now)
            try:
                conn = super().getconn(max(left, 0.001))
            except PoolTimeout:
                down = self.unreachable
                if down is None:
                    raise
                raise _unreachable(down, time.monotonic()) from None
            if time.monotonic() - conn.returned_at <= ALIVE_BYPASS:
                return conn
            try:
                self.check_connection(conn)  # psycopg_pool's: an empty statement
            except psycopg.Error:
                self.putconn(conn)  # broken: the pool discards it, and makes another
                continue
            return conn

    def putconn(self, conn: _PooledConnection) -> None:
        conn.returned_at = time.monotonic()
        super().putconn(conn)

    # What the last attempt to connect that failed said, and since when it has failed
    # (None: connected), for the log's one line as connecting starts and stops failing.
    failing: tuple[float, str] | None = None

    def _connect(self, timeout: float | None = None) -> _PooledConnection:
        try:
            conn = super()._connect(timeout)
        except psycopg.OperationalError as exc:
            # Not reached (refused, timed out, no such host) or not taking connections
            # (starting up, shutting down: class 57); not a full server (53300) or a
            # refused login, where the connections the pool holds still work.
            if (exc.sqlstate is None or exc.sqlstate.startswith("57")) and not self.unreachable:
                self.unreachable = (time.monotonic(), _reason(exc))
            self._log_failing(_reason(exc))
            raise
        self.unreachable = None
        self._log_failing(None)
        return conn

    def _log_failing(self, reason: str | None) -> None:
        """One warning as attempts to connect start failing (or fail for another reason),
        and one as they work again: psycopg's pool logged each attempt, every second of an
        outage and for each connection it was making (`_quiet_pool_attempts`)."""
        with _FAILING_LOCK:  # the pool's threads connect at once
            failing = self.failing
            if reason is None and failing is not None:
                log.warning("connected to PostgreSQL again, after %.0f s of failed attempts",
                            time.monotonic() - failing[0])  # fmt: skip
                self.failing = None
            elif reason is not None and (failing is None or failing[1] != reason):
                log.warning("cannot connect to PostgreSQL: %s; trying again every %.0f s",
                            reason, RECONNECT_EVERY)  # fmt: skip
                self.failing = (time.monotonic() if failing is None else failing[0], reason)

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        super()._add_connection(attempt or _Reconnect(timeout=self.reconnect_timeout), growing)


class _Reconnect(AttemptWithBackoff):
    """psycopg_pool's schedule for making a lost connection again, its delay capped at
    `RECONNECT_EVERY` seconds. Its own doubles the delay after each failure (1, 2, 4 … s),
    so a server back after an outage of a minute could wait up to ~30 s for the pool's
    next try, and every request with it (11 s late after a stop of 40 s: bench/HISTORY.md,
    session 27)."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        self.delay = min(self.delay, RECONNECT_EVERY)


def _unreachable(down: tuple[float, str], now: float) -> PoolTimeout:
    return PoolTimeout(f"PostgreSQL unreachable for {now - down[0]:.0f} s: {down[1]}")


def _reason(exc: psycopg.Error) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# Seconds a connection may sit idle in the pool and still be handed out untried.
ALIVE_BYPASS = 0.5
# Seconds between the pool's attempts to make a lost connection again.
RECONNECT_EVERY = 1.0
POOL_NAME = "sinal"
_FAILING_LOCK = threading.Lock()


def _quiet_pool_attempts(record: logging.LogRecord) -> bool:
    """False for psycopg_pool's line on each failed attempt to connect of sinal's pool
    ("error connecting in 'sinal': …", several a second while PostgreSQL is away): the
    pool logs when attempts start and stop failing (`_LifoPool._log_failing`)."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (
        record.msg == "error connecting in %r: %s"
        and args[:1] == (POOL_NAME,)
        and isinstance(args[-1], psycopg.OperationalError)
    )


logging.getLogger("psycopg.pool").addFilter(_quiet_pool_attempts)


class _Checkout:
    """A pooled connection for one `with` block, psycopg's errors raised as sinal's.

    What `ConnectionPool.connection()` does, without the three generators the store
    stacked around it (`_conn`, `translated_errors`, `connection()`): the store's record
    of one event cost 133 µs of client CPU through them and 125 through this (the
    medians of 40 alternated rounds of 1,000 calls). Its `with conn` commit or rollback
    is left out: the connections are in autocommit, where each transaction is a
    `conn.transaction()` block, closed when the block ends, and `putconn` rolls back (or
    discards) a connection returned in a transaction or broken."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: ConnectionPool[_PooledConnection]) -> None:
        self._pool = pool

    def __enter__(self) -> _PooledConnection:
        try:
            self._conn = self._pool.getconn()
        except psycopg.Error as exc:  # the pool's timeout, or the pool closed meanwhile
            _raise_translated(exc)
        return self._conn

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._pool.putconn(self._conn)
        if isinstance(exc, psycopg.Error):
            _raise_translated(exc)


# Seconds the pool's first connections may take (the first connection, made before them,
# is bounded by its connect_timeout: `network_defaults`).
OPEN_TIMEOUT = 10
# Seconds after a failed opening during which calls fail at once with its reason, instead
# of each trying (and, with a server that does not answer, waiting) in turn.
OPEN_RETRY = 1.0


class PostgresStore(
    PostgresAutomations,
    PostgresWebhooks,
    PostgresMessaging,
    PostgresCommerce,
    PostgresRetention,
    PostgresErasure,
):
    """sinal's tables in a PostgreSQL database."""

    backend = "postgresql"

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        wait: float = DEFAULT_WAIT,
        keyring: Keyring | None = None,
    ) -> None:
        """`wait`: seconds a call waits for a connection (all in use, or none can be
        made); once PostgreSQL has been unreachable for that long, calls fail at once
        until a connection can be made again (`_LifoPool.getconn`)."""
        self.url = url
        self.keyring = keyring  # seals and opens stored secrets; None: plaintext
        self._network = network_defaults(url)  # for every connection the store makes
        self._wait = wait
        self._pool = self._new_pool(min_size, max_size)
        self._open_lock = threading.Lock()
        self._opened = False
        self._closed = False
        self._open_failed: tuple[float, StoreUnavailable] | None = None  # when, and why

    def _new_pool(self, min_size: int, max_size: int) -> ConnectionPool[_PooledConnection]:
        return _LifoPool(
            self.url,
            connection_class=_PooledConnection,
            min_size=min_size,
            max_size=max_size,
            # UTF-8 whatever the server's or the environment's default (PGCLIENTENCODING):
            # sinal's own dumpers write text as UTF-8 (`_TextArrayDumper`, `_JsonbTextDumper`).
            kwargs={"autocommit": True, "client_encoding": "UTF8", **self._network},
            configure=functools.partial(_configure, lock_wait=self._wait),
            open=False,
            name=POOL_NAME,
            timeout=self._wait,
            # Make lost connections again for as long as it takes, every second: the
            # pool's default gives up after 5 minutes, and while callers fail at once it
            # would not try again (`_LifoPool.getconn`).
            reconnect_timeout=math.inf,
        )

    def _conn(self) -> _Checkout:
        """A connection of the pool for a `with` block (the pool opened on first use)."""
        if not self._opened:
            with self._open_lock:
                if self._closed:  # a thread still working after close opens no new pool
                    raise StoreError("the PostgreSQL store is closed")
                if not self._opened:
                    failed = self._open_failed
                    if failed is not None and time.monotonic() < failed[0] + OPEN_RETRY:
                        raise StoreUnavailable(str(failed[1]))
                    try:
                        self._open()
                    except StoreUnavailable as exc:
                        self._open_failed = (time.monotonic(), exc)
                        raise
        return _Checkout(self._pool)

    def _open(self) -> None:
        """Open the pool, or raise `StoreUnavailable` saying why PostgreSQL cannot be
        reached and leave it to the next call to try again (a server started before its
        database, a worker waiting for it, recover once it is up).

        One connection first, made directly: it fails at once with the reason (refused,
        no such database, authentication), where the pool would retry quietly for its whole
        timeout and then say only that it timed out. And a pool whose opening timed out is
        closed for good: it is replaced."""
        try:
            psycopg.connect(self.url, **self._network).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {_reason(exc)}") from exc
        try:
            self._pool.open(wait=True, timeout=OPEN_TIMEOUT)
        except psycopg.Error as exc:
            self._pool = self._new_pool(self._pool.min_size, self._pool.max_size)
            _raise_translated(exc)
        self._opened = True

    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection[TupleRow]]:
        with self._conn() as conn, conn.transaction():
            yield conn

    @property
    def max_connections(self) -> int:
        """The most connections the pool holds (callers size their threads by it)."""
        return self._pool.max_size

    def close(self) -> None:
        """Close the pool, for good: calls made after it raise `StoreError`."""
        with self._open_lock:
            self._closed = True
            self._opened = False
            self._pool.close()

    # -- schema ------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations under an advisory lock (safe from many processes)."""
        applied: list[int] = []
        with self._tx() as conn:
            _check_encoding(conn)
            # a migration waits for another process's and for its tables' locks as long
            # as it takes: the connections' lock_timeout is for calls
            conn.execute("SET LOCAL lock_timeout = 0")
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
                if version == RESPELLING_VERSION:
                    respell_identities(
                        functools.partial(_rows, conn), "postgres", datetime.now(UTC)
                    )
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
        with self._tx() as conn:
            return self._find_or_create(conn, contact)

    def _find_or_create(
        self, conn: psycopg.Connection[TupleRow], contact: NewContact
    ) -> tuple[Contact, bool]:
        pairs = contact.identities()
        held = _holders(conn, contact)
        if held:
            return next(iter(held.values())), False  # the most specific identity's
        try:
            created = conn.execute(
                f"INSERT INTO contacts (account_id, id, name, phone, email, external_id) "
                f"VALUES (%s, %s, %s, %s, %s, %s) RETURNING {CONTACT_COLUMNS}",
                (
                    contact.account_id, contact.id, contact.name, contact.phone,
                    contact.email, contact.external_id,
                ),
            ).fetchone()  # fmt: skip
        except psycopg.errors.ForeignKeyViolation as exc:  # a contact's one reference
            raise AccountNotFound(f"account {contact.account_id} does not exist") from exc
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

    def find_contacts(self, contact: NewContact) -> dict[IdentityKind, Contact]:
        """The contact each identity names, most specific first (one statement)."""
        with self._conn() as conn:
            return _holders(conn, contact)

    def older_spellings(self, account_id: UUID) -> list[Unrespelled]:
        """The account's identities in a spelling migration 0032 left (`respelling`)."""
        with self._tx() as conn:
            return unrespelled(functools.partial(_rows, conn), "postgres", account_id)

    def list_contacts(self, query: ContactQuery) -> list[ListedContact]:
        """The account's contacts matching the query, oldest first, with their tags (one
        statement; each row's tags by `contact_tags`' key, in `list_tags`' order)."""
        statement, args = contacts_page_sql(query, "%s", _CONTACT_TAGS)
        with self._conn() as conn:
            rows = conn.execute(statement, args).fetchall()
        return [ListedContact(Contact(*row[:-1]), tuple(row[-1])) for row in rows]

    @staticmethod
    def _contact(
        conn: psycopg.Connection[TupleRow], account_id: UUID, contact_id: UUID, lock: str = ""
    ) -> Contact | None:
        row = conn.execute(
            f"SELECT {CONTACT_COLUMNS} FROM contacts WHERE account_id = %s AND id = %s{lock}",
            (account_id, contact_id),
        ).fetchone()
        return None if row is None else Contact(*row)

    # -- events ------------------------------------------------------------------------

    def record(
        self, events: Sequence[PreparedEvent], settle: Settle | None = None
    ) -> list[Outcome]:
        """Store a batch in one statement (see the module docstring); with `settle`, in a
        transaction holding its later rounds too (see `Store.record`)."""
        if not events:
            return []
        record = _record_in
        for attempt in range(_ATTEMPTS):
            try:
                with self._conn() as conn:
                    if settle is None and record is _record_in:
                        return _record_in(conn, events)
                    with conn.transaction():
                        return _record_rounds(conn, events, settle, record)
            except UnstorableInput:
                if record is _record_isolated:  # not one event's: the commit's, say
                    raise
                record = _record_isolated  # again, in parts, in one transaction
            except StoreError as exc:
                if not isinstance(exc.__cause__, _RETRYABLE) or attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def record_chunks(
        self,
        chunks: Iterable[Sequence[PreparedEvent]],
        keys: Sequence[EventKey],
        early: Callable[[list[Outcome]], None] | None = None,
        settle: Settle | None = None,
    ) -> list[Outcome]:
        """Looked up, then streamed: one round trip reads the stored events of the batch's
        dedup keys and which of its contacts are missing, while the ledger validates the first
        chunk; then the new events go to PostgreSQL by COPY as each chunk is validated,
        and three statements add their outbox rows, summaries and metrics (see the module
        docstring). When another transaction stores one of the batch's keys in between
        (the COPY then fails on the key), or PostgreSQL aborts the transaction (a
        deadlock), the whole batch goes through `record`, which answers duplicates and
        retries. `early` runs while PostgreSQL writes the last three and commits."""
        pending = iter(chunks)
        pulled: list[Sequence[PreparedEvent]] = []
        try:
            with self._conn() as conn:
                return _record_copied(conn, keys, _pulling(pending, pulled), early, settle)
        except StoreError as exc:
            # a refused batch is redone by `record`, which finds the events refused
            if not isinstance(exc.__cause__, _REDONE) and not isinstance(exc, UnstorableInput):
                raise
        return self.record([e for chunk in (*pulled, *pending) for e in chunk], settle)

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
        if query.automation_execution_id is not None:
            where.append("automation_execution_id = %s")
            args.append(query.automation_execution_id)
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

    def read_feed(self, account_id: UUID, after: FeedPosition, limit: int) -> FeedPage:
        """The account's events by (tx, id) below the horizon (see `_FEED_SQL`)."""
        with self._conn() as conn:
            rows = conn.execute(
                _FEED_SQL, (account_id, str(after.arrival), after.event_id, limit + 1)
            ).fetchall()
        return feed_page(after, limit, [(int(row[0]), StoredEvent(*row[1:])) for row in rows])

    def get_summary(self, account_id: UUID, contact_id: UUID | None = None) -> list[SummaryRow]:
        """Summary rows of the account (or one contact)."""
        statement = (
            "SELECT account_id, contact_id, metric_name, currency, event_count, total_value, "
            "first_event_at, last_event_at FROM contact_metrics_summary WHERE account_id = %s"
        )
        args: list[UUID] = [account_id]
        if contact_id is not None:
            statement += " AND contact_id = %s"
            args.append(contact_id)
        with self._conn() as conn:
            rows = conn.execute(  # names in code point order, as SQLite's and the metrics'
                statement + ' ORDER BY contact_id, metric_name COLLATE "C", currency', args
            ).fetchall()
        return [SummaryRow(*row) for row in rows]

    def list_rejections(
        self, account_id: UUID, limit: int = 100, before: UUID | None = None
    ) -> list[Rejection]:
        """Kept rejections, newest first (ids are UUIDv7: id order is creation order)."""
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_REJECTION_COLUMNS} FROM rejections WHERE account_id = %s "
                "AND (%s::uuid IS NULL OR id < %s) ORDER BY id DESC LIMIT %s",
                (account_id, before, before, limit),
            ).fetchall()
        return [Rejection(*row) for row in rows]

    def rebuild_summaries(
        self, account_id: UUID | None = None, progress: Progress | None = None
    ) -> Iterator[RebuildReport]:
        """Recompute summaries from events, an account's contacts `base.REBUILD_CONTACTS` at a
        time, each chunk in its own transaction (`_rebuild_contacts`). Only writers of the
        summary rows being recounted wait, for one chunk; other contacts and accounts
        write on."""
        accounts: Iterable[UUID]
        with self._conn() as conn:
            if account_id is not None:
                accounts = [account_id]
                counted = conn.execute(
                    "SELECT count(*) FROM contacts WHERE account_id = %s", (account_id,)
                )
            else:
                accounts = every_account(self._accounts_after)
                counted = conn.execute("SELECT count(*) FROM contacts")
            [(contacts,)] = counted.fetchall()
        return rebuild_accounts(accounts, contacts, self._rebuild_step, progress)

    def _accounts_after(self, after: UUID | None, limit: int) -> list[UUID]:
        """The ids of the first `limit` accounts after the one `after` (None: the first)."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT id FROM accounts WHERE (%s::uuid IS NULL OR id > %s) ORDER BY id LIMIT %s",
                (after, after, limit),
            ).fetchall()
        return [r[0] for r in rows]

    def _rebuild_step(self, account: UUID, after: UUID | None) -> tuple[list[UUID], RebuildReport]:
        """The account's next contacts after `after`, recounted in one transaction."""
        with self._tx() as conn:
            chunk = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM contacts WHERE account_id = %s "
                    "AND (%s::uuid IS NULL OR id > %s) ORDER BY id LIMIT %s",
                    (account, after, after, base.REBUILD_CONTACTS),
                )
            ]
            return chunk, _rebuild_contacts(conn, account, chunk)

    # -- added for the HTTP service ---------------------------------------------------

    def _retrying(self, work: Callable[[psycopg.Connection[TupleRow]], T]) -> T:
        """Run `work` in one transaction, again on a deadlock, serialization failure or
        unique violation (a concurrent insert of the same identity or tag)."""
        for attempt in range(_ATTEMPTS):
            try:
                with self._tx() as conn:
                    return work(conn)
            except StoreError as exc:
                retry = isinstance(exc, DuplicateKey) or isinstance(exc.__cause__, _RETRYABLE)
                if not retry or attempt == _ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def list_accounts(self, limit: int = 100, after: Account | None = None) -> list[Account]:
        """Accounts, oldest first; those after `after`."""
        start = "" if after is None else "WHERE (created_at, id) > (%s, %s) "
        args = () if after is None else (after.created_at, after.id)
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT id, name, timezone, created_at FROM accounts {start}"
                "ORDER BY created_at, id LIMIT %s",
                (*args, limit),
            ).fetchall()
        return [Account(*r) for r in rows]

    def update_account(
        self, account_id: UUID, name: str | None, timezone: str | None
    ) -> Account | None:
        """Change an account's name and/or timezone (None: unchanged)."""
        with self._conn() as conn:
            row = conn.execute(
                "UPDATE accounts SET name = coalesce(%s, name), "
                "timezone = coalesce(%s, timezone) WHERE id = %s "
                "RETURNING id, name, timezone, created_at",
                (name, timezone, account_id),
            ).fetchone()
        return None if row is None else Account(*row)

    def create_api_key(self, key: ApiKey) -> None:
        """Insert an API key."""
        with self._conn() as conn:
            conn.execute(
                f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    key.account_id, key.id, key.key_hash, key.hint, key.name,
                    list(key.scopes), key.created_at, key.revoked_at,
                ),
            )  # fmt: skip

    def find_api_key(self, account_id: UUID, key_hash: str) -> ApiKey | None:
        """The account's key with this hash, or None."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = %s AND key_hash = %s",
                (account_id, key_hash),
            ).fetchone()
        return None if row is None else _api_key(row)

    def list_api_keys(
        self, account_id: UUID, limit: int | None = None, after: ApiKey | None = None
    ) -> list[ApiKey]:
        """The account's keys, oldest first; those after `after`."""
        start = "" if after is None else "AND (created_at, id) > (%s, %s) "
        args = () if after is None else (after.created_at, after.id)
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = %s {start}"
                "ORDER BY created_at, id LIMIT %s",  # NULL: no limit
                (account_id, *args, limit),
            ).fetchall()
        return [_api_key(r) for r in rows]

    def revoke_api_key(self, key_id: UUID, when: datetime) -> ApiKey | None:
        """Revoke a key by id (idempotent: the first revocation time is kept)."""
        with self._conn() as conn:
            row = conn.execute(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, %s) WHERE id = %s "
                f"RETURNING {_KEY_COLUMNS}",
                (when, key_id),
            ).fetchone()
        return None if row is None else _api_key(row)

    def upsert_contact_recorded(
        self, contact: NewContact, on_create: BuildEvent
    ) -> tuple[Contact, bool]:
        """`upsert_contact`, recording `on_create(contact)` when the contact is new."""

        def work(conn: psycopg.Connection[TupleRow]) -> tuple[Contact, bool]:
            found, created = self._find_or_create(conn, contact)
            if created:
                _record_in(conn, [on_create(found)])
            return found, created

        return self._retrying(work)

    def update_contact(
        self,
        account_id: UUID,
        contact_id: UUID,
        changes: Mapping[ContactField, str | None],
        on_change: BuildChangeEvent,
        *,
        only_missing: bool = False,
    ) -> Contact | None:
        """Apply changes and record `on_change(before, after)`, in one transaction."""

        def work(conn: psycopg.Connection[TupleRow]) -> Contact | None:
            row = conn.execute(
                f"SELECT {CONTACT_COLUMNS} FROM contacts WHERE account_id = %s AND id = %s "
                "FOR NO KEY UPDATE",  # the key stays: emits for the contact need not wait
                (account_id, contact_id),
            ).fetchone()
            if row is None:
                return None
            before = Contact(*row)
            changed = changed_fields(before, changes, only_missing=only_missing)
            if not changed:
                return before
            for kind, value in changed.items():
                if kind != "name":
                    _move_identity(conn, before, kind, value)
            merged: dict[str, str | None] = {
                k: getattr(before, k) for k in ("name", "phone", "email", "external_id")
            }
            merged.update(changed)
            updated = conn.execute(
                "UPDATE contacts SET name = %s, phone = %s, email = %s, external_id = %s, "
                f"updated_at = now() WHERE account_id = %s AND id = %s "
                f"RETURNING {CONTACT_COLUMNS}",
                (
                    merged["name"], merged["phone"], merged["email"], merged["external_id"],
                    account_id, contact_id,
                ),
            ).fetchone()  # fmt: skip
            assert updated is not None
            after = Contact(*updated)
            _record_in(conn, [on_change(before, after)])
            return after

        return self._retrying(work)

    def change_tags(
        self,
        account_id: UUID,
        contact_id: UUID,
        tags: Sequence[str],
        *,
        add: bool,
        on_change: BuildTagEvent,
    ) -> list[str] | None:
        """Add or remove tags; record `on_change(tag)` for each one that changed."""
        wanted = sorted(set(tags))  # one lock order for concurrent callers
        order = {tag: i for i, tag in enumerate(dict.fromkeys(tags))}

        def work(conn: psycopg.Connection[TupleRow]) -> list[str] | None:
            if self._contact(conn, account_id, contact_id, " FOR KEY SHARE") is None:
                return None  # erased meanwhile too: the lock waited for the erasure
            if add:
                rows = conn.execute(
                    "INSERT INTO contact_tags (account_id, contact_id, tag) "
                    "SELECT %s, %s, t FROM unnest(%s::text[]) AS t ON CONFLICT DO NOTHING "
                    "RETURNING tag",
                    (account_id, contact_id, wanted),
                ).fetchall()
            else:
                rows = conn.execute(
                    "DELETE FROM contact_tags WHERE account_id = %s AND contact_id = %s "
                    "AND tag = ANY(%s) RETURNING tag",
                    (account_id, contact_id, wanted),
                ).fetchall()
            changed = sorted((r[0] for r in rows), key=order.__getitem__)
            if changed:
                _record_in(conn, [on_change(tag) for tag in changed])
            return changed

        return self._retrying(work)

    def list_tags(self, account_id: UUID, contact_id: UUID) -> list[str]:
        """A contact's tags, sorted."""
        with self._conn() as conn:
            rows = conn.execute(
                "SELECT tag FROM contact_tags WHERE account_id = %s AND contact_id = %s "
                'ORDER BY tag COLLATE "C"',
                (account_id, contact_id),
            ).fetchall()
        return [r[0] for r in rows]

    def get_event(self, account_id: UUID, event_id: UUID) -> StoredEvent | None:
        """One event of the account, or None."""
        return self._event("id", account_id, event_id)

    def find_event(self, account_id: UUID, unique_event_id: str) -> StoredEvent | None:
        """The account's event with this `unique_event_id`, or None."""
        return self._event("unique_event_id", account_id, unique_event_id)

    def _event(self, key: str, account_id: UUID, value: object) -> StoredEvent | None:
        """The event whose `key` column, a unique key with the account's, is `value`."""
        with self._conn() as conn:
            row = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE account_id = %s AND {key} = %s",
                (account_id, value),
            ).fetchone()
        return None if row is None else StoredEvent(*row)

    def list_metrics(
        self,
        account_id: UUID,
        name: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[MetricInfo]:
        """The account's metrics with their event counts (from the summaries of the page's
        metrics alone); names compare as COLLATE "C", code point order for UTF8, as
        SQLite's do."""
        with self._conn() as conn:
            rows = conn.execute(
                "WITH page AS (SELECT name, category, is_system, created_at FROM metrics "
                "WHERE account_id = %(account)s "
                "AND (%(name)s::text IS NULL OR name = %(name)s) "
                'AND (%(after)s::text IS NULL OR name > %(after)s COLLATE "C") '
                'ORDER BY name COLLATE "C" LIMIT %(limit)s) '  # NULL: no limit
                "SELECT p.name, p.category, p.is_system, coalesce(s.n, 0)::bigint, p.created_at "
                "FROM page p LEFT JOIN (SELECT metric_name, sum(event_count) AS n "
                "FROM contact_metrics_summary WHERE account_id = %(account)s "
                "AND metric_name IN (SELECT name FROM page) GROUP BY metric_name) s "
                'ON s.metric_name = p.name ORDER BY p.name COLLATE "C"',
                {"account": account_id, "name": name, "after": after, "limit": limit},
            ).fetchall()
        return [MetricInfo(*r) for r in rows]

    def has_metric(self, account_id: UUID, name: str) -> bool:
        """Whether the account has a metric of this name (by its unique key)."""
        with self._conn() as conn:
            row = conn.execute(
                "SELECT FROM metrics WHERE account_id = %s AND name = %s", (account_id, name)
            ).fetchone()
        return row is not None

    def aggregate(self, query: AggregateQuery) -> list[AggregateCell]:
        """One scan of the metric's index range; `width_bucket` places each event. A sum
        is per currency, of the events with a value."""
        group = "NULL::text" if query.by is None else _GROUP
        is_sum = query.measurement == "sum_value"
        statement = (
            f"SELECT width_bucket(occurred_at, %(starts)s::timestamptz[]) - 1, {group}, "
            f"{_MEASURES[query.measurement]}, {'currency' if is_sum else 'NULL'} FROM events "
            "WHERE account_id = %(account)s AND metric_name = %(metric)s "
            "AND occurred_at >= %(since)s AND occurred_at < %(until)s"
            + (" AND value IS NOT NULL" if is_sum else "")
            + ("" if query.currency is None else " AND currency = %(currency)s")
            + (" GROUP BY 1, 2, 4" if is_sum else " GROUP BY 1, 2")
        )
        params = {
            "starts": list(query.starts),
            "by": query.by,
            "account": query.account_id,
            "metric": query.metric_name,
            "since": query.since,
            "until": query.until,
            "currency": query.currency,
        }
        with self._conn() as conn:
            rows = conn.execute(statement.encode(), params).fetchall()
        return [AggregateCell(b, g, v, k) for b, g, v, k in rows if b >= 0]

    def replay_rejection(
        self, account_id: UUID, rejection_id: UUID, build: BuildReplayEvent
    ) -> Replay | None:
        """Replay holding the rejection's row lock: a concurrent replay waits, then sees
        it replayed."""

        def work(conn: psycopg.Connection[TupleRow]) -> Replay | None:
            row = conn.execute(
                f"SELECT {_REJECTION_COLUMNS} FROM rejections "
                "WHERE account_id = %s AND id = %s FOR UPDATE",
                (account_id, rejection_id),
            ).fetchone()
            if row is None:
                return None
            rejection = Rejection(*row)
            if rejection.replayed_event_id is not None:
                earlier = Outcome("created", event_id=rejection.replayed_event_id)
                return Replay(rejection, earlier, earlier=True)
            event = build(rejection)
            if (
                event.contact_id is None
                or self._contact(conn, account_id, event.contact_id) is None
            ):
                return Replay.refused(rejection, event)
            [outcome] = _record_in(conn, [event])
            conn.execute(  # the contact its event went to: erased, it takes the rejection
                "UPDATE rejections SET replayed_at = now(), replayed_event_id = %s, "
                "contact_id = %s WHERE account_id = %s AND id = %s",
                (outcome.event_id, event.contact_id, account_id, rejection_id),
            )
            return Replay(replace(rejection, replayed_event_id=outcome.event_id), outcome)

        return self._retrying(work)


def _record_in(
    conn: psycopg.Connection[TupleRow], events: Sequence[PreparedEvent]
) -> list[Outcome]:
    """Record events inside the caller's transaction (or each statement in its own, on an
    autocommit connection): one event whose contact exists by `sinal_record_event`, any
    other by the record statement."""
    if len(events) > 1:
        rows = conn.execute(_RECORD_SQL, _input_arrays(events)).fetchall()
    else:  # one event: scalars (dumping 21 one-element arrays costs more than the statement)
        row = _input_row(0, events[0])
        pooled = conn if isinstance(conn, _PooledConnection) else None
        answer = pooled.record_one(row[1:]) if pooled else None
        if answer is None or not answer[0][2]:  # through psycopg, or a contact not in the account
            cursor = pooled.one_event_cursor() if pooled else conn.cursor()
            if answer is None:
                answer = cursor.execute(_RECORD_EVENT_SQL, row[1:]).fetchall()
            if not answer[0][2]:  # not a contact of the account: the statement keeps the rejection
                answer = cursor.execute(_RECORD_ONE_SQL, row).fetchall()
        rows = answer
    return _outcomes(conn, events, rows)


# Records events inside the caller's transaction: `_record_in`, or `_record_isolated`.
_Recorder = Callable[[psycopg.Connection[TupleRow], Sequence[PreparedEvent]], list[Outcome]]


def _record_isolated(
    conn: psycopg.Connection[TupleRow],
    events: Sequence[PreparedEvent],
    refusals: Refusals[psycopg.Connection[TupleRow]] = ANSWERED,
) -> list[Outcome]:
    """`_record_in` under a savepoint, inside the caller's transaction; when PostgreSQL
    refuses it with one of `refusals.isolated` (ingest's: the events' data, `_is_refused`),
    the events are recorded again in halves, down to the events it refuses, each of which
    gets `refusals.outcome` (ingest's: rejected, "refused"); or, split by "events", each
    under its own savepoint at once. Only for a batch refused once already: each part
    costs a round trip more. Ingest's and automation steps' (`finish_steps`)."""

    def attempt(part: Sequence[PreparedEvent]) -> list[Outcome]:
        # a savepoint: a refused part is rolled back alone
        with translated_errors(), conn.transaction():
            return _record_in(conn, part)

    return refusals.record(conn, events, attempt)


def _record_rounds(
    conn: psycopg.Connection[TupleRow],
    events: Sequence[PreparedEvent],
    settle: Settle | None,
    record: _Recorder | None = None,
) -> list[Outcome]:
    """Record `events` (by `record`, default `_record_in`), then each round `settle` names
    after them, inside the caller's transaction (see `Store.record`); the first round's
    outcomes."""
    outcomes = (record or _record_in)(conn, events)
    if settle is not None:
        _record_later_rounds(conn, events, outcomes, settle, record)
    return outcomes


def _record_later_rounds(
    conn: psycopg.Connection[TupleRow],
    events: Sequence[PreparedEvent],
    outcomes: list[Outcome],
    settle: Settle,
    record: _Recorder | None = None,
) -> None:
    """The rounds `settle` names after `events` (recorded, with `outcomes`), by `record`
    (default `_record_in`)."""
    more = settle(events, outcomes)
    while more:
        done = (record or _record_in)(conn, more)
        more = settle(more, done)


def _record_copied(
    conn: psycopg.Connection[TupleRow],
    keys: Sequence[EventKey],
    chunks: Iterator[Sequence[PreparedEvent]],
    early: Callable[[list[Outcome]], None] | None,
    settle: Settle | None = None,
) -> list[Outcome]:
    """Record a batch by COPY (see `PostgresStore.record_chunks`). Fails with
    UniqueViolation when a key was stored by another transaction after the lookup."""
    with ExitStack() as transaction:
        with conn.pipeline():
            # BEGIN goes with the lookups: outside a pipeline it waits for its answer. (Not
            # `conn.transaction()`, which in a pipeline keeps one open around its block.)
            transaction.enter_context(psycopg.Transaction(conn))
            conn.execute(_LOCK_EVENTS, prepare=False)
            dedup = _key_arrays((k.account_id, k.unique_event_id) for k in keys)
            found = conn.execute(_DUPLICATES_SQL, dedup, prepare=False)
            contacts = _pair_arrays(
                ((k.account_id, k.contact_id) for k in keys), _UuidArray, _UuidArray
            )
            missing = conn.cursor().execute(_MISSING_CONTACTS_SQL, contacts, prepare=False)
            first = next(chunks, ())  # validated while PostgreSQL looks up
            batch = _Streamed(
                _payloads(dedup, found.fetchall()), _pairs_at(contacts, missing.fetchall())
            )
        closing: list[tuple[str, tuple[list[Any], ...]]] = []
        with conn.cursor() as cursor:
            cursor.adapters.register_dumper(None, _JsonbTextDumper)
            # The closing statements' parameters are built while PostgreSQL inserts the
            # last rows, before the COPY ends.
            writer = _SentThen(cursor, lambda: closing.extend(_closing(batch.created)))
            with cursor.copy(_COPY_SQL, writer=writer) as copy:
                copy.set_types(_COPY_TYPES)
                for e in itertools.chain(first, itertools.chain.from_iterable(chunks)):
                    if batch.take(e):
                        copy.write_row(_copy_row(e))
        if batch.unknown:
            batch.record_unknown(conn)
        outcomes = batch.outcomes()
        if settle is not None:  # the batch's repeats of keys it could not store
            _record_later_rounds(conn, batch.events, outcomes, settle)
        with conn.pipeline():
            for statement, params in closing:
                conn.execute(statement, params)
            # The COMMIT queued behind them: the transaction ends inside the pipeline, and
            # the caller's work runs while PostgreSQL writes and commits. An error of any
            # of them is raised when the pipeline ends.
            transaction.close()
            if early is not None:
                early(outcomes)
    return outcomes


def _closing(created: Sequence[PreparedEvent]) -> list[tuple[str, tuple[list[Any], ...]]]:
    """A streamed batch's closing statements, with their parameters: the outbox rows,
    summaries and metrics of its new events (`created`)."""
    if not created:
        return []
    statements = []
    outboxed = [e for e in created if e.automation_execution_id is None]
    if outboxed:
        statements.append((_OUTBOX_SQL, _outbox_params(outboxed)))
    statements.append((_SUMMARY_SQL, _summary_params(created)))
    statements.append((_METRICS_SQL, _metric_params(created)))
    return statements


class _SentThen(LibpqWriter):
    """A COPY's writer that sends each block of rows as soon as psycopg has formatted it,
    and runs `then` once the last rows are on their way, before it ends the COPY and waits
    for PostgreSQL to take them. (psycopg keeps up to 32 kB of rows until the COPY ends,
    and by default leaves up to 1 MB of them in libpq's buffer.) Should `then` fail, the
    COPY is abandoned with its error."""

    def __init__(self, cursor: psycopg.Cursor[Any], then: Callable[[], object]) -> None:
        super().__init__(cursor, flush_threshold=0)
        self._then = then

    def finish(self, exc: BaseException | None = None) -> None:
        if exc is None:
            try:
                self._then()
            except BaseException as error:
                super().finish(error)
                raise
        super().finish(exc)


class _Streamed:
    """A streamed batch's events and their outcomes, taken one by one as the COPY goes."""

    def __init__(
        self,
        stored: dict[tuple[UUID, str], tuple[UUID, StoredPayload]],
        missing: set[tuple[UUID, UUID]],
    ) -> None:
        self.stored = stored  # the looked-up events, by dedup key
        self.missing = missing  # the (account, contact) pairs not found
        self.events: list[PreparedEvent] = []
        self.answers: list[Outcome | None] = []
        self.created: list[PreparedEvent] = []
        self.unknown: list[int] = []  # places of the events of no known contact

    def take(self, e: PreparedEvent) -> bool:
        """Answer `e` from the lookup; True when it is new (to be copied)."""
        self.events.append(e)
        # Every pair with a contact was looked up: the ledger's keys, which `prepare` keeps.
        if e.contact_id is None or (e.account_id, e.contact_id) in self.missing:
            self.unknown.append(len(self.answers))
            self.answers.append(None)
            return False
        key = e.unique_event_id
        repeated = None if key is None else self.stored.get((e.account_id, key))
        if repeated is not None:
            self.answers.append(Outcome("duplicate", repeated[0], repeated[1]))
            return False
        self.created.append(e)
        self.answers.append(Outcome("created", e.id))  # (kind, event_id): positional is cheaper
        return True

    def record_unknown(self, conn: psycopg.Connection[TupleRow]) -> None:
        """The events of no known contact, through the record statement: it keeps their
        rejections (or stores them, should their contact have appeared since)."""
        outcomes = _record_in(conn, [self.events[i] for i in self.unknown])
        for i, outcome in zip(self.unknown, outcomes, strict=True):
            self.answers[i] = outcome

    def outcomes(self) -> list[Outcome]:
        """One outcome per event taken, in order."""
        assert all(o is not None for o in self.answers)
        return self.answers  # type: ignore[return-value]


class _UuidArray(list[UUID]):
    """A uuid[] parameter, dumped by `_UuidArrayDumper` (a None in it goes as NULL: a
    group commit's nullable columns)."""


class _TextArray(list[str]):
    """A text[] parameter, dumped by `_TextArrayDumper` (a None in it goes as NULL)."""


# PostgreSQL's binary array (`array_send`): dimensions, a has-nulls flag and the element
# type, each dimension's length and lower bound, then each element as its length and bytes.
# (`array_recv` reads one dimension of no elements as '{}'.)
_ARRAY_HEAD = struct.Struct(">iiIii")
_UUID_OID = postgres_types["uuid"].oid
_TEXT_OID = postgres_types["text"].oid
_UUID_ELEMENT = 16 << 128  # an element's length (16) before its 128 bits: 20 bytes in all
_LENGTH = struct.Struct(">i").pack
_NULL = _LENGTH(-1)  # a null element: length -1, no bytes


def _array_head(oid: int, n: int, has_nulls: bool) -> bytes:
    return _ARRAY_HEAD.pack(1, has_nulls, oid, n, 1)  # one dimension, from 1


class _UuidArrayDumper(Dumper):
    """uuid[] in binary, written in one pass. psycopg's list dumper finds the elements'
    type, then calls a dumper per element: 344 ns an id against 149 here, and a streamed
    batch of 500 events sends ~3,300 ids (its lookups, outbox rows and summaries)."""

    format = Format.BINARY
    oid = postgres_types["uuid"].array_oid

    def dump(self, obj: list[UUID | None]) -> bytes:
        body = [_NULL if u is None else (_UUID_ELEMENT | u.int).to_bytes(20, "big") for u in obj]
        # an element is 20 bytes: only a null is _NULL
        return _array_head(_UUID_OID, len(obj), _NULL in body) + b"".join(body)


class _TextArrayDumper(Dumper):
    """text[] in binary, written in one pass (as `_UuidArrayDumper`: 339 ns a string
    against ~170)."""

    format = Format.BINARY
    oid = postgres_types["text"].array_oid

    def dump(self, obj: list[str | None]) -> bytes:
        parts = []
        has_nulls = False
        for text in obj:
            if text is None:
                parts.append(_NULL)
                has_nulls = True
                continue
            data = text.encode()
            parts.append(_LENGTH(len(data)))
            parts.append(data)
        return _array_head(_TEXT_OID, len(obj), has_nulls) + b"".join(parts)


# The array type of each input column (`_input_arrays`).
_INPUT_ARRAYS: tuple[Callable[[Iterable[Any]], list[Any]], ...] = tuple(
    {"uuid": _UuidArray, "text": _TextArray}.get(kind, list) for _, kind in _INPUT_COLUMNS
)


class _JsonbTextDumper(Dumper):
    """jsonb in binary from JSON text already serialized (the properties' canonical
    text): the format's version byte, then the text."""

    format = Format.BINARY
    oid = postgres_types["jsonb"].oid

    def dump(self, obj: str) -> bytes:
        return b"\x01" + obj.encode()


def _pulling(
    chunks: Iterator[Sequence[PreparedEvent]], pulled: list[Sequence[PreparedEvent]]
) -> Iterator[Sequence[PreparedEvent]]:
    """`chunks`, each kept in `pulled` as it is pulled (to redo the batch)."""
    for chunk in chunks:
        pulled.append(chunk)
        yield chunk


def _pair_arrays(
    pairs: Iterable[tuple[A | None, B | None]],
    left: Callable[[list[A]], LA],
    right: Callable[[list[B]], LB],
) -> tuple[LA, LB]:
    """The distinct pairs with neither side None, as two arrays (for `unnest`), each made
    by its array type (`_UuidArray`, `_TextArray`)."""
    valid = {(a, b) for a, b in pairs if a is not None and b is not None}
    return left([a for a, _ in valid]), right([b for _, b in valid])


def _key_arrays(keys: Iterable[tuple[UUID | None, str | None]]) -> tuple[_UuidArray, _TextArray]:
    """The distinct (account, dedup key) pairs, as arrays."""
    return _pair_arrays(keys, _UuidArray, _TextArray)


def _copy_row(e: PreparedEvent) -> tuple[Any, ...]:
    """One event as `_COPY_SQL`'s columns."""
    return (
        e.account_id, e.id, e.contact_id, e.metric_name, e.properties_json, e.value,
        e.currency, e.source, e.source_id, e.integration_id, e.unique_event_id, e.entity_type,
        e.entity_id, e.automation_execution_id, e.occurred_at, e.received_at, SCHEMA_VERSION,
        metric_id(e.account_id, e.metric_name),
    )  # fmt: skip


def _outbox_params(events: Sequence[PreparedEvent]) -> tuple[list[Any], ...]:
    """The outbox rows of `events`, as arrays."""
    return (
        _UuidArray([e.account_id for e in events]),
        _UuidArray([e.id for e in events]),
        _TextArray([e.metric_name for e in events]),
    )


def _outcomes(
    conn: psycopg.Connection[TupleRow], events: Sequence[PreparedEvent], rows: list[TupleRow]
) -> list[Outcome]:
    """A record statement's `rows` (`_ANSWER`) as one outcome per event; reads, in one
    query, the stored payloads the statement could not see (events committed by others
    after it began)."""
    stored: dict[tuple[UUID, str], tuple[UUID, StoredPayload]] = {}
    unseen: list[PreparedEvent] = []
    for ord_, created, known, existing_id, *payload in rows:
        if known and not created:
            event = events[ord_]
            assert event.unique_event_id is not None
            if existing_id is None:
                unseen.append(event)
            else:
                key = (event.account_id, event.unique_event_id)
                stored[key] = (existing_id, StoredPayload(*payload))
    if unseen:
        stored.update(_stored_payloads(conn, unseen))
    return [_outcome(events[row[0]], row[1], row[2], stored) for row in rows]


def _move_identity(
    conn: psycopg.Connection[TupleRow], contact: Contact, kind: str, value: str | None
) -> None:
    """Point the contact's identity of `kind` at `value` (None: drop it)."""
    if value is not None:
        owner = conn.execute(
            "SELECT contact_id FROM contact_identities "
            "WHERE account_id = %s AND kind = %s AND value = %s",
            (contact.account_id, kind, value),
        ).fetchone()
        if owner is not None and owner[0] != contact.id:
            raise IdentityConflict(kind)
    conn.execute(
        "DELETE FROM contact_identities WHERE account_id = %s AND contact_id = %s AND kind = %s",
        (contact.account_id, contact.id, kind),
    )
    if value is not None:
        conn.execute(
            "INSERT INTO contact_identities (account_id, kind, value, contact_id) "
            "VALUES (%s, %s, %s, %s)",
            (contact.account_id, kind, value, contact.id),
        )


def _api_key(r: Sequence[Any]) -> ApiKey:
    return ApiKey(r[0], r[1], r[2], r[3], r[4], tuple(r[5]), r[6], r[7])


def _input_arrays(events: Sequence[PreparedEvent]) -> list[list[Any]]:
    """`events`' input rows, one array per column; the uuid and text ones by sinal's own
    dumpers (psycopg's list dumper took most of the client CPU of a group commit)."""
    rows = (_input_row(i, e) for i, e in enumerate(events))
    return [
        array(column) for array, column in zip(_INPUT_ARRAYS, zip(*rows, strict=True), strict=True)
    ]


def _stored_payloads(
    conn: psycopg.Connection[TupleRow], events: Sequence[PreparedEvent]
) -> dict[tuple[UUID, str], tuple[UUID, StoredPayload]]:
    """The stored events (id and payload) that `events`, duplicates, repeat, by dedup key."""
    keys = _key_arrays((e.account_id, e.unique_event_id) for e in events)
    return _payloads(keys, conn.execute(_DUPLICATES_SQL, keys, prepare=False).fetchall())


def _payloads(
    keys: tuple[list[UUID], list[str]], rows: Iterable[TupleRow]
) -> dict[tuple[UUID, str], tuple[UUID, StoredPayload]]:
    """`_DUPLICATES_SQL`'s rows for the dedup `keys` it was given, by key: (the stored
    event's id, its payload)."""
    accounts, uniques = keys
    return {
        (accounts[r[0] - 1], uniques[r[0] - 1]): (r[1], StoredPayload(r[2], r[3], r[4], r[5], r[6]))
        for r in rows
    }


def _pairs_at(pairs: tuple[list[A], list[B]], rows: Iterable[TupleRow]) -> set[tuple[A, B]]:
    """The `pairs` at the places a lookup's `rows` name (`ord`, from 1, in the arrays)."""
    left, right = pairs
    return {(left[i - 1], right[i - 1]) for (i,) in rows}


def _metric_params(created: Sequence[PreparedEvent]) -> tuple[list[Any], ...]:
    """The metrics rows of the `created` events (the first event's source for each), as
    arrays; the statement sorts them."""
    first: dict[tuple[UUID, str], PreparedEvent] = {}
    for e in created:
        first.setdefault((e.account_id, e.metric_name), e)
    rows = [
        (a, metric_id(a, name), name, e.display_name, str(e.category), e.source, e.is_system)
        for (a, name), e in first.items()
    ]
    return tuple(list(column) for column in zip(*rows, strict=True))


def _summary_params(created: Sequence[PreparedEvent]) -> tuple[list[Any], ...]:
    """The summary rows the `created` events add up to, as arrays; the statement sorts
    them into lock order."""
    deltas = summary_deltas(created)
    keys, rows = deltas.keys(), deltas.values()
    contacts = [c for _, c, _, _ in keys]  # every created event has its contact
    return (
        _UuidArray([a for a, _, _, _ in keys]),
        _UuidArray(cast(list[UUID], contacts)),
        _TextArray([m for _, _, m, _ in keys]),
        _TextArray([k for _, _, _, k in keys]),  # currency
        [d[0] for d in rows],  # event count
        # total value: a Decimal's text is exact; None (NULL) when none of the events had one
        _TextArray(cast(list[str], [None if d[1] is None else str(d[1]) for d in rows])),
        [d[2] for d in rows],  # first occurred_at
        [d[3] for d in rows],  # last
        _UuidArray([d[4] for d in rows]),  # the id of the first event
    )


def _input_row(ord_: int, e: PreparedEvent) -> tuple[Any, ...]:
    """One event as the statement's input columns, in `_INPUT_COLUMNS` order."""
    return (
        ord_, e.id, e.account_id, e.contact_id, e.metric_name, e.properties_json, e.value,
        e.currency, e.source, e.source_id, e.integration_id, e.unique_event_id, e.entity_type,
        e.entity_id, e.automation_execution_id, e.occurred_at, e.received_at,
        metric_id(e.account_id, e.metric_name), e.display_name, str(e.category), e.is_system,
    )  # fmt: skip


def _outcome(
    event: PreparedEvent,
    created: bool,
    known: bool | None,
    stored: dict[tuple[UUID, str], tuple[UUID, StoredPayload]],
) -> Outcome:
    if created:
        return Outcome("created", event_id=event.id)
    if known is None:  # no such account (`_ANSWER`)
        return account_missing(event)
    if not known:
        reason = contact_reason(event)
        return Outcome(
            "rejected",
            reason=reason,
            message=rejection_message(reason, event),
            rejection_id=event.id,
        )
    assert event.unique_event_id is not None
    existing_id, payload = stored[(event.account_id, event.unique_event_id)]
    return Outcome("duplicate", event_id=existing_id, stored=payload)


# The summary keys of some contacts of an account: those their events have, and those
# stored (rows with no events behind them are found this way).
_REBUILD_KEYS_SQL = """
SELECT contact_id, metric_name, currency FROM events
WHERE account_id = %(account)s AND contact_id = ANY(%(contacts)s)
UNION
SELECT contact_id, metric_name, currency FROM contact_metrics_summary
WHERE account_id = %(account)s AND contact_id = ANY(%(contacts)s)
"""
# Lock each key's summary row, creating the missing ones (a placeholder, rewritten or
# deleted before the commit), in the writers' order: `DO UPDATE ... WHERE false` locks a
# row it does not change. Answers the keys it created.
_REBUILD_LOCK_SQL = """
INSERT INTO contact_metrics_summary AS s (account_id, contact_id, metric_name, currency,
                                          event_count, total_value, first_event_at,
                                          last_event_at)
SELECT %s, c, m, k, 0, 0, 'epoch', 'epoch'
FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS t(c, m, k)
ORDER BY c, m COLLATE "C", k
ON CONFLICT (account_id, contact_id, metric_name, currency) DO UPDATE
SET event_count = s.event_count WHERE false
RETURNING contact_id, metric_name, currency
"""
_REBUILD_KEPT_SQL = (
    "SELECT contact_id, metric_name, currency, event_count, total_value, first_event_at, "
    "last_event_at FROM contact_metrics_summary WHERE account_id = %s AND contact_id = ANY(%s)"
)
_REBUILD_TRUTH_SQL = (
    "SELECT contact_id, metric_name, currency, count(*), sum(value), min(occurred_at), "
    "max(occurred_at) FROM events WHERE account_id = %s AND contact_id = ANY(%s) "
    "GROUP BY contact_id, metric_name, currency"
)
_REBUILD_SET_SQL = """
UPDATE contact_metrics_summary AS s
SET event_count = t.n, total_value = t.v, first_event_at = t.f, last_event_at = t.l,
    updated_at = now()
FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::bigint[], %s::numeric[],
            %s::timestamptz[], %s::timestamptz[]) AS t(c, m, k, n, v, f, l)
WHERE s.account_id = %s AND s.contact_id = t.c AND s.metric_name = t.m AND s.currency = t.k
"""
_REBUILD_DELETE_SQL = """
DELETE FROM contact_metrics_summary AS s
USING unnest(%s::uuid[], %s::text[], %s::text[]) AS t(c, m, k)
WHERE s.account_id = %s AND s.contact_id = t.c AND s.metric_name = t.m AND s.currency = t.k
"""


def _rebuild_contacts(
    conn: psycopg.Connection[TupleRow], account: UUID, contacts: list[UUID]
) -> RebuildReport:
    """Recount the summaries of some contacts of an account, inside the caller's
    transaction, and fix the rows that are wrong.

    Every writer updates an event's summary row in the event's transaction. So once this
    transaction holds the rows' locks, a writer of an event of these keys either
    committed before (its event is seen by the recount, which starts after the locks are
    taken, and its addition is in the row) or waits for the row until this commits, its
    event unseen (and adds to the row afterwards). A key whose first event commits after
    the keys were read is not locked, not recounted, and its row is the writer's own.
    No lock on `events`: only writers of these rows wait."""
    keys = conn.execute(_REBUILD_KEYS_SQL, {"account": account, "contacts": contacts}).fetchall()
    if not keys:
        return RebuildReport(account)
    locked = {(c, m, k) for c, m, k in keys}  # by (contact, metric, currency)
    created = {
        (c, m, k)
        for c, m, k in conn.execute(_REBUILD_LOCK_SQL, (account, *_key_columns(keys))).fetchall()
    }
    kept = {
        (r[0], r[1], r[2]): tuple(r[3:])
        for r in conn.execute(_REBUILD_KEPT_SQL, (account, contacts))
        if (r[0], r[1], r[2]) in locked and (r[0], r[1], r[2]) not in created
    }
    truth = {
        (r[0], r[1], r[2]): tuple(r[3:])
        for r in conn.execute(_REBUILD_TRUTH_SQL, (account, contacts))
        if (r[0], r[1], r[2]) in locked
    }
    report = compare_summaries(account, truth, kept)
    wrong = [(key, figures) for key, figures in truth.items() if kept.get(key) != figures]
    if wrong:
        columns = list(zip(*((*key, *figures) for key, figures in wrong), strict=True))
        conn.execute(_REBUILD_SET_SQL, (*(list(c) for c in columns), account))
    empty = sorted(locked - truth.keys())  # no events behind: kept rows and placeholders
    if empty:
        conn.execute(_REBUILD_DELETE_SQL, (*_key_columns(empty), account))
    return report


def _key_columns(keys: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Summary keys (contact, metric, currency) as three arrays, one per column."""
    return [[k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]]
