"""The embedded default store: SQLite through the standard library.

One writer at a time (`BEGIN IMMEDIATE` takes the write lock up front, so a transaction
never has to upgrade a read lock and deadlock); readers run beside it under WAL. Writers
queue for it on an advisory file lock first (`flock` on `<database>-lock`, every process
and thread alike): SQLite's own busy handler makes a waiting writer sleep and poll (1, 2,
5 … 100 ms), which adds its sleeps to every write that waited, and lets a fresh arrival
overtake writers that have waited for seconds. The threads of one process queue on a lock
of the process before that, served in the order they came (`_Turns`): only one of them at
a time takes or waits for the file, and a thread that waits for another of its process
costs no thread of its own. A writer waits for its turn at most the busy timeout
(`SINAL_DATABASE_WAIT`, 30 s by default), then gets `StoreUnavailable`. Each thread has
its own connection.
Decimals are stored as exact text and summed with a Python aggregate (`decimal_sum`),
never as floats.
Events SQLite refuses are isolated as on PostgreSQL (`_record_isolated`, `Refusals`).
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote
from uuid import UUID

import orjson

from sinal.errors import (
    AccountNotFound,
    ConfigurationError,
    DuplicateKey,
    IdentityConflict,
    SchemaViolation,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    UnstorableInput,
)
from sinal.events import SCHEMA_VERSION, EventKey, PreparedEvent, StoredPayload, dumps_json
from sinal.ids import metric_id, new_id
from sinal.keyring import Keyring
from sinal.store import base
from sinal.store.base import (
    ANSWERED,
    CONTACT_COLUMNS,
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
    add_values,
    changed_fields,
    compare_summaries,
    contacts_page_sql,
    every_account,
    feed_page,
    qualified,
    read_migrations,
    rebuild_accounts,
    rejection_message,
    summary_deltas,
)
from sinal.store.respelling import (
    RESPELLING_VERSION,
    Unrespelled,
    respell_identities,
    unrespelled,
)
from sinal.store.sqlite_automations import SQLiteAutomations
from sinal.store.sqlite_commerce import SQLiteCommerce
from sinal.store.sqlite_erasure import SQLiteErasure
from sinal.store.sqlite_messaging import SQLiteMessaging
from sinal.store.sqlite_retention import SQLiteRetention
from sinal.store.sqlite_webhooks import SQLiteWebhooks

_EVENT_COLUMNS = (
    "account_id, id, contact_id, metric_name, properties, value, currency, source, source_id, "
    "integration_id, unique_event_id, entity_type, entity_id, automation_execution_id, "
    "occurred_at, received_at, schema_version"
)
_REJECTION_COLUMNS = "account_id, id, reason, message, payload, created_at, replayed_event_id"
_KEY_COLUMNS = "account_id, id, key_hash, hint, name, scopes, created_at, revoked_at"


def ts(when: datetime) -> str:
    """A datetime as stored: UTC, fixed width, so text order is time order
    ("2026-11-29T12:00:00.000000Z"). `isoformat` takes half of `strftime`'s ~3.8 µs, and
    an event is stored with four or five of these."""
    utc = when if when.tzinfo is UTC else when.astimezone(UTC)
    text = utc.isoformat()  # ends in "+00:00", and has no fraction when it is zero
    return text[:-6] + ("Z" if utc.microsecond else ".000000Z")


def parse_ts(text: str) -> datetime:
    """The inverse of `ts`."""
    return datetime.fromisoformat(text).astimezone(UTC)


def contact_of(row: Sequence[Any]) -> Contact:
    """A contact from its row (`CONTACT_COLUMNS`, in that order)."""
    return Contact(
        UUID(row[0]), UUID(row[1]), row[2], row[3], row[4], row[5],
        parse_ts(row[6]), parse_ts(row[7]),
    )  # fmt: skip


def _holders(conn: sqlite3.Connection, contact: NewContact) -> dict[IdentityKind, Contact]:
    """The contact each of `contact`'s identities names, most specific first."""
    held: dict[IdentityKind, Contact] = {}
    for kind, value in contact.identities():
        row = conn.execute(
            f"SELECT {qualified(CONTACT_COLUMNS, 'c')} FROM contact_identities i "
            "JOIN contacts c ON c.account_id = i.account_id AND c.id = i.contact_id "
            "WHERE i.account_id = ? AND i.kind = ? AND i.value = ?",
            (str(contact.account_id), kind, value),
        ).fetchone()
        if row is not None:
            held[kind] = contact_of(row)
    return held


def _opt(value: object | None) -> str | None:
    return None if value is None else str(value)


def _opt_uuid(text: str | None) -> UUID | None:
    return None if text is None else UUID(text)


def _opt_decimal(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)


class _DecimalSum:
    """SQLite aggregate: exact sum of decimal text (NULLs skipped, NULL when none, as
    SQL's SUM)."""

    def __init__(self) -> None:
        self.total: Decimal | None = None

    def step(self, value: str | None) -> None:
        if value is not None:
            self.total = add_values(self.total, Decimal(value))

    def finalize(self) -> str | None:
        return _opt(self.total)


# SQLite's result codes for a database that cannot work right now, rather than a statement
# it refuses: another writer's lock, a full disk, an I/O error, a file it cannot open.
# Worth a retry once that is over: `StoreUnavailable` (HTTP 503, one throttled log line),
# as PostgreSQL's connection errors are. SQLite rolls the transaction back whole.
_UNAVAILABLE = frozenset({
    sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CANTOPEN,
})  # fmt: skip


# SQLite's extended result codes of a statement refused for what sinal itself wrote,
# whatever the input (`SchemaViolation`): a NOT NULL column left empty, a reference to a
# row that is not there (sinal checks each one it takes from an input first, a new
# contact's account where it is inserted), a value of a type its STRICT column does not
# take (sinal binds every value's type; 3091 is SQLITE_CONSTRAINT_DATATYPE, which the
# sqlite3 module does not name). A CHECK, a trigger's RAISE or a text too big judge the
# data: the input's fault (`UnstorableInput`).
_OWN_FAULTS = frozenset({
    sqlite3.SQLITE_CONSTRAINT_NOTNULL, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY, 3091,
})  # fmt: skip


def _is_own_fault(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in _OWN_FAULTS


def _is_statement_fault(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused the statement itself: SQLITE_ERROR, its generic code (each
    passing trouble has a code of its own, `_UNAVAILABLE`), for a table, column or function
    that is not there (a schema not migrated, or changed under sinal), SQL it cannot parse,
    or a function of sinal's that failed. Sinal's fault, and it fails alike every time
    (`SchemaViolation`)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_ERROR


_FILE_FIX = (
    "make the SQLite database file, and its -wal, -shm and -lock files beside it, writable "
    "by the user sinal runs as (chmod, chown)"
)
_FOLDER_FIX = (
    "make the SQLite database's directory writable by the user sinal runs as (chmod, "
    "chown): SQLite writes its -wal and -shm files beside the database, sinal its -lock"
)


def _unwritable(reason: str, path: str | None) -> StoreMisconfigured | None:
    """`StoreMisconfigured` naming what of the database at `path` this process cannot
    write (the file, its -wal or -shm, or its directory, where SQLite makes those), for a
    failure saying `reason`; None when each can be written. Read-only permissions or
    mount, an immutable file: the operator's to fix, whatever the input, and no retry
    helps until then."""
    if path is None:
        return None
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-lock"):
        if os.path.exists(name) and not os.access(name, os.W_OK):
            return StoreMisconfigured(
                f"the SQLite file {name} is not writable by this process ({reason})",
                "database_read_only",
                _FILE_FIX,
            )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK | os.X_OK):
        return StoreMisconfigured(
            f"the directory {folder} of the SQLite database is not writable by this process "
            f"({reason})",
            "directory_read_only",
            _FOLDER_FIX,
        )
    return None


def _read_only(exc: sqlite3.Error, path: str | None) -> StoreMisconfigured:
    """The `StoreMisconfigured` of a write SQLite refused as read-only (SQLITE_READONLY):
    naming what is not writable where that can be told."""
    where = f" {path}" if path else ""
    return _unwritable(str(exc), path) or StoreMisconfigured(
        f"the SQLite database{where} is read-only to this process ({exc})",
        "database_read_only",
        _FILE_FIX,
    )


@contextmanager
def translated_errors(path: str | None = None) -> Iterator[None]:
    """Turn sqlite3's exceptions into sinal's, chained; `path`, the database's, is named
    in the error when its file or directory is not writable."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        if "UNIQUE" in str(exc):
            raise DuplicateKey(str(exc)) from exc
        if _is_own_fault(exc):
            raise SchemaViolation(str(exc)) from exc
        raise UnstorableInput(str(exc)) from exc
    except sqlite3.DataError as exc:  # a text or blob too big, say
        raise UnstorableInput(str(exc)) from exc
    except sqlite3.ProgrammingError as exc:  # sinal's misuse (bindings, a closed connection)
        raise SchemaViolation(str(exc)) from exc
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)  # the extended code; its low byte
        if code is not None and code & 0xFF == sqlite3.SQLITE_READONLY:
            raise _read_only(exc, path) from exc
        if code is not None and code & 0xFF == sqlite3.SQLITE_CANTOPEN:
            # a file or directory not writable is the operator's; a file the system cannot
            # open now (out of descriptors, say), a retry's
            raise (_unwritable(str(exc), path) or StoreUnavailable(str(exc))) from exc
        if code is not None and code & 0xFF in _UNAVAILABLE:
            raise StoreUnavailable(str(exc)) from exc
        if _is_statement_fault(exc):
            raise SchemaViolation(str(exc)) from exc
        raise StoreError(str(exc)) from exc


@contextmanager
def _savepoint(conn: sqlite3.Connection, name: str) -> Iterator[None]:
    """A savepoint for the block, inside the caller's transaction: rolled back to, then
    released, if it raises."""
    conn.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        conn.execute(f"ROLLBACK TO {name}")
        conn.execute(f"RELEASE {name}")
        raise
    conn.execute(f"RELEASE {name}")


class _LockWait:
    """One wait for the writers' lock file on `fd`, run by a thread of `_Waiters` (without
    the GIL) for a writer that can stop waiting, and take the wait up again at its next
    write."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._state = threading.Lock()
        self._taken = threading.Event()
        self._abandoned = False
        self._gone = False  # the lock came while abandoned: given back, the descriptor closed

    def run(self) -> None:
        """Wait for the lock (in a waiting thread); give it back if nobody wants it any more."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        with self._state:
            if not self._abandoned:
                self._taken.set()
                return
            self._gone = True
        fcntl.flock(self.fd, fcntl.LOCK_UN)  # nobody waits for it any more
        os.close(self.fd)

    def done(self, timeout: float) -> bool:
        """Whether the lock was taken within `timeout` seconds; if not, the waiting thread
        gives it back when it comes, and closes the descriptor, unless `resume`d first."""
        if self._taken.wait(timeout):
            return True
        with self._state:
            self._abandoned = not self._taken.is_set()
            return not self._abandoned

    def resume(self) -> bool:
        """Wait for the lock again, after `done` gave up; False when it came meanwhile and
        was given back (the descriptor is closed)."""
        with self._state:
            if self._gone:
                return False
            self._abandoned = False
            return True


class _Turns:
    """A lock handed over to the threads waiting for it in the order they came. (A
    `threading.Lock` lets the thread that releases it take it again before the waiter it
    woke runs: a thread writing back to back, as `rebuild-summaries` does chunk after
    chunk, would keep the other threads of its process waiting for several of its writes.)"""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held = False
        self._waiting: deque[threading.Lock] = deque()

    def acquire(self, timeout: float) -> bool:
        """Whether the lock is this thread's within `timeout` seconds."""
        with self._mutex:
            if not self._held:
                self._held = True
                return True
            mine = threading.Lock()
            mine.acquire()
            self._waiting.append(mine)
        if mine.acquire(timeout=timeout):
            return True  # handed over by `release`
        with self._mutex:
            if mine in self._waiting:
                self._waiting.remove(mine)
                return False
        return True  # handed over while the wait timed out

    def release(self) -> None:
        """Hand the lock to the thread that has waited longest, or leave it free."""
        with self._mutex:
            if self._waiting:
                self._waiting.popleft().release()  # still held: by that thread now
            else:
                self._held = False


class _Waiters:
    """The threads that wait for the lock file (`flock` cannot time out), each kept for the
    next wait once its wait has ended. Starting a thread costs ~100 µs; two processes
    writing one database found the file taken for 83–97% of their writes, and keeping
    the thread took their CPU per event from 560–617 µs to 532–583 (bench/README.md,
    session 29). One thread usually does: a process waits for the file one writer at a
    time, and only a wait given up while the file stays taken keeps its thread, until the
    file comes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_LockWait | None]] = []
        self._closed = False

    def start(self, fd: int) -> _LockWait:
        """A wait for the lock on `fd`, started in an idle waiting thread or a new one."""
        wait = _LockWait(fd)
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(
                target=self._serve, args=(inbox,), name="sinal-sqlite-lock", daemon=True
            ).start()
        inbox.put(wait)
        return wait

    def _serve(self, inbox: queue.SimpleQueue[_LockWait | None]) -> None:
        while (wait := inbox.get()) is not None:
            wait.run()
            with self._lock:
                if self._closed:
                    return
                self._idle.append(inbox)

    def close(self) -> None:
        """End the idle threads, and each busy one once its wait has ended."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


MIN_SQLITE = (3, 38, 0)  # `->` (3.38); STRICT tables (3.37); RETURNING (3.35)


class SQLiteStore(
    SQLiteAutomations,
    SQLiteWebhooks,
    SQLiteMessaging,
    SQLiteCommerce,
    SQLiteRetention,
    SQLiteErasure,
):
    """sinal's tables in one SQLite file."""

    backend = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = DEFAULT_WAIT,
        create: bool = True,
        keyring: Keyring | None = None,
    ):
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise ConfigurationError(
                f"sinal needs SQLite {'.'.join(map(str, MIN_SQLITE))} or newer (aggregates by "
                f"a property use its -> operator); Python's sqlite3 module links "
                f"{sqlite3.sqlite_version}"
            )
        if path in ("", ":memory:"):
            raise ConfigurationError(
                "SQLite needs a file path, e.g. sqlite:///sinal.db (each thread opens its own "
                "connection, so :memory: cannot be shared)"
            )
        self.path = path
        self.keyring = keyring  # seals and opens stored secrets; None: plaintext
        self._create = create  # False: a missing file is an error, not a new empty database
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._lock_path = f"{path}-lock"
        self._lock_fds: list[int] = []
        self._turn = _Turns()  # this process's writer, or the one waiting for the file
        self._waiters = _Waiters()
        self._users = 0  # operations in progress, in every thread
        self._idle = threading.Condition(self._all_lock)  # notified when they are none

    # -- connections -------------------------------------------------------------------

    @contextmanager
    def _using(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, counted in use until the block ends (`close` waits)."""
        with self._idle:
            self._users += 1
        try:
            yield self._conn()
        finally:
            with self._idle:
                self._users -= 1
                if not self._users:
                    self._idle.notify_all()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # SQLite opens a file it cannot write read-only, and the connection stays so:
            # one opened while the file was not writable (by a read) is opened again by the
            # next write (`_write`), which then sees the operator's fix
            read_only = os.path.exists(self.path) and not os.access(self.path, os.W_OK)
            with translated_errors(self.path):
                conn = self._open()
                try:
                    self._set_up(conn)
                except BaseException:  # not kept: closed now, not left to the collector
                    conn.close()
                    raise
            self._local.conn = conn
            self._local.read_only = read_only
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _set_up(self, conn: sqlite3.Connection) -> None:
        """The settings every connection of this store has."""
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.create_aggregate("decimal_sum", 1, _DecimalSum)  # type: ignore[arg-type]

    def _open(self) -> sqlite3.Connection:
        # mode=rw: opening never creates the file (checking first would race its removal)
        target = self.path if self._create else f"file:{quote(os.path.abspath(self.path))}?mode=rw"
        try:
            return sqlite3.connect(
                target,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=not self._create,
            )
        except sqlite3.OperationalError:
            folder = os.path.dirname(os.path.abspath(self.path))
            if self._create and not os.path.isdir(folder):  # SQLite: "unable to open …"
                raise ConfigurationError(
                    f"cannot create the SQLite database {self.path}: there is no directory {folder}"
                ) from None
            if self._create or os.path.exists(self.path):
                raise
            raise ConfigurationError(
                f"no SQLite database at {self.path}: run `sinal migrate` to create it"
            ) from None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._using() as opened:
            conn = self._writable(opened)
            fd = self._writers_turn()
            try:
                with translated_errors(self.path):
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield conn
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
                    conn.execute("COMMIT")
            except StoreMisconfigured:
                # the connection may have been opened read-only (`_conn`): the next write
                # opens the file again, the operator's fix seen at once
                self._forget(conn)
                raise
            finally:
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                finally:
                    self._turn.release()

    def _writable(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """This thread's connection `conn`, or, as it was opened read-only (`_conn`),
        another, opened now."""
        if not self._local.read_only:
            return conn
        self._forget(conn)
        return self._conn()

    def _forget(self, conn: sqlite3.Connection) -> None:
        """Close this thread's connection `conn`: its next call opens another."""
        self._local.conn = None
        with self._all_lock:
            self._all.remove(conn)
        conn.close()

    def _writers_turn(self) -> int:
        """Take this process's turn, then the writers' lock file, waiting at most the busy
        timeout for both; the descriptor holding the file (the turn is released after it).

        Without the turn, each thread that found the file taken waited for it in a thread
        made for the wait: six threads calling `emit_event` stored 916–997 events/s where
        one stored 2,354–2,589, and 1,361–1,389 with the turn (bench/README.md, session
        29). The process's lock is waited for without a thread of its own and without the
        GIL."""
        started = time.monotonic()
        if not self._turn.acquire(timeout=self._busy_timeout):
            raise self._busy()
        try:
            return self._file_turn(self._busy_timeout - (time.monotonic() - started))
        except BaseException:
            self._turn.release()
            raise

    def _busy(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"the database is busy: no writer's turn within {self._busy_timeout:g} s "
            f"(another writer holds {self._lock_path})"
        )

    def _file_turn(self, timeout: float) -> int:
        """Take the writers' lock file, waiting at most `timeout` seconds; the descriptor
        holding it. `flock` cannot time out, so a writer that has to wait does so in a
        thread of its own; if its turn does not come in time, that thread keeps the
        descriptor, and gives the lock back and closes it once it gets it. The writer's
        next write waits on that same thread while it still waits: a lock held for good
        costs each writing thread one waiting thread, not one per attempt."""
        wait: _LockWait | None = getattr(self._local, "pending", None)
        if wait is not None:
            self._local.pending = None
            if wait.resume():
                self._hold_lock_fd(wait.fd)  # the descriptor is this thread's again
            else:
                wait = None  # its lock came and went
        if wait is None:
            fd = self._lock_fd()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                pass
            wait = self._waiters.start(fd)
        if wait.done(max(timeout, 0.0)):
            return wait.fd
        with self._all_lock:
            self._lock_fds.remove(wait.fd)
        self._local.lock_fd = None  # the waiting thread's now
        self._local.pending = wait
        raise self._busy()

    def _lock_fd(self) -> int:
        """This thread's descriptor of the writers' lock file (flock locks belong to an
        open file, so threads need one each to exclude one another)."""
        fd: int | None = getattr(self._local, "lock_fd", None)
        if fd is None:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                reason = f"cannot open the writers' lock {self._lock_path}: {exc}"
                raise (_unwritable(str(exc), self.path) or StoreError(reason)) from exc
            self._hold_lock_fd(fd)
        return fd

    def _hold_lock_fd(self, fd: int) -> None:
        """Make `fd` this thread's descriptor of the lock file (closed by `close`)."""
        self._local.lock_fd = fd
        with self._all_lock:
            self._lock_fds.append(fd)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._using() as conn, translated_errors(self.path):
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def close(self) -> None:
        """Close every thread's connection, once the operations in progress have ended:
        closing a connection while another thread uses it can crash the process. (A
        thread must not close the store from inside one of its own operations.)"""
        with self._idle:
            self._idle.wait_for(lambda: not self._users)
            for conn in self._all:
                conn.close()
            self._all.clear()
            for fd in self._lock_fds:
                os.close(fd)
            self._lock_fds.clear()
            self._waiters.close()
            self._waiters = _Waiters()  # for a write after the close, which opens anew
        self._local = threading.local()

    # -- schema ------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply pending migrations, each in its own transaction."""
        applied: list[int] = []
        with self._using() as conn, translated_errors(self.path):
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
        for version, name, sql in read_migrations(self.backend):
            with self._write() as tx:
                done = tx.execute(
                    "SELECT 1 FROM schema_migrations WHERE version = ?", (version,)
                ).fetchone()
                if done:
                    continue
                for statement in _split_sql(sql):
                    tx.execute(statement)
                if version == RESPELLING_VERSION:
                    now = ts(datetime.now(UTC))
                    respell_identities(lambda q, a: tx.execute(q, a).fetchall(), "sqlite", now)
                tx.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, ts(datetime.now(UTC))),
                )
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        """The highest applied migration, 0 when none."""
        with self._read() as conn:
            exists = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
            ).fetchone()
            if not exists:
                return 0
            row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
            return int(row[0])

    # -- accounts and contacts ---------------------------------------------------------

    def create_account(self, account: Account) -> None:
        """Insert an account."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO accounts (id, name, timezone, created_at) VALUES (?, ?, ?, ?)",
                (str(account.id), account.name, account.timezone, ts(account.created_at)),
            )

    def get_account(self, account_id: UUID) -> Account | None:
        """One account, or None."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT id, name, timezone, created_at FROM accounts WHERE id = ?",
                (str(account_id),),
            ).fetchone()
        if row is None:
            return None
        return Account(UUID(row[0]), row[1], row[2], parse_ts(row[3]))

    def upsert_contact(self, contact: NewContact) -> tuple[Contact, bool]:
        """Find by any identity (most specific first), else create with its identities."""
        with self._write() as conn:
            return self._find_or_create(conn, contact)

    def _find_or_create(
        self, conn: sqlite3.Connection, contact: NewContact
    ) -> tuple[Contact, bool]:
        account = str(contact.account_id)
        held = _holders(conn, contact)
        if held:
            return next(iter(held.values())), False  # the most specific identity's
        now = ts(datetime.now(UTC))
        try:
            conn.execute(
                f"INSERT INTO contacts ({CONTACT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (account, str(contact.id), contact.name, contact.phone, contact.email,
                 contact.external_id, now, now),
            )  # fmt: skip
        except sqlite3.IntegrityError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
                raise
            # a contact's one reference
            raise AccountNotFound(f"account {account} does not exist") from exc
        conn.executemany(
            "INSERT INTO contact_identities (account_id, kind, value, contact_id) "
            "VALUES (?, ?, ?, ?)",
            [(account, kind, value, str(contact.id)) for kind, value in contact.identities()],
        )
        created = self._contact(conn, account, str(contact.id))
        assert created is not None
        return created, True

    def get_contact(self, account_id: UUID, contact_id: UUID) -> Contact | None:
        """One contact of the account, or None."""
        with self._read() as conn:
            return self._contact(conn, str(account_id), str(contact_id))

    def find_contacts(self, contact: NewContact) -> dict[IdentityKind, Contact]:
        """The contact each identity names, most specific first (a read)."""
        with self._read() as conn:
            return _holders(conn, contact)

    def older_spellings(self, account_id: UUID) -> list[Unrespelled]:
        """The account's identities in a spelling migration 0032 left (`respelling`)."""
        with self._read() as conn:
            left = unrespelled(
                lambda q, a: conn.execute(q, a).fetchall(), "sqlite", str(account_id)
            )
        return [replace(u, account_id=account_id, contact_id=UUID(u.contact_id),
                        holders=tuple(map(UUID, u.holders))) for u in left]  # fmt: skip

    def list_contacts(self, query: ContactQuery) -> list[ListedContact]:
        """The account's contacts matching the query, oldest first, with their tags: the
        page, then its tags, in one read transaction."""
        statement, args = contacts_page_sql(query, "?")
        params = [str(a) if isinstance(a, UUID) else a for a in args]
        with self._read() as conn:
            rows = conn.execute(statement, params).fetchall()
            tags: dict[str, list[str]] = {row[1]: [] for row in rows}
            if tags:
                marks = ", ".join("?" * len(tags))
                for contact, tag in conn.execute(
                    "SELECT contact_id, tag FROM contact_tags WHERE account_id = ? "
                    f"AND contact_id IN ({marks}) ORDER BY contact_id, tag",
                    [str(query.account_id), *tags],
                ):
                    tags[contact].append(tag)
        return [ListedContact(contact_of(row), tuple(tags[row[1]])) for row in rows]

    @staticmethod
    def _contact(conn: sqlite3.Connection, account: str, contact: str) -> Contact | None:
        row = conn.execute(
            f"SELECT {CONTACT_COLUMNS} FROM contacts WHERE account_id = ? AND id = ?",
            (account, contact),
        ).fetchone()
        return None if row is None else contact_of(row)

    # -- events ------------------------------------------------------------------------

    def record(
        self, events: Sequence[PreparedEvent], settle: Settle | None = None
    ) -> list[Outcome]:
        """Store a batch in one transaction, its rounds too (see `Store.record`)."""
        try:
            with self._write() as conn:
                return _record_in(conn, events, settle)
        except UnstorableInput:
            pass  # rolled back: again, in parts, in one transaction
        with self._write() as conn:
            return _record_in(conn, events, settle, _record_isolated)

    def record_chunks(
        self,
        chunks: Iterable[Sequence[PreparedEvent]],
        keys: Sequence[EventKey],
        early: Callable[[list[Outcome]], None] | None = None,
        settle: Settle | None = None,
    ) -> list[Outcome]:
        """`record` for all the chunks: validated before the write lock is taken, as one
        SQLite writer gains nothing from overlapping them (see `Store.record_chunks`);
        `early` is not called: the commit happens in this thread."""
        return self.record([event for chunk in chunks for event in chunk], settle)

    def list_events(self, query: EventQuery) -> list[StoredEvent]:
        """Events matching the query, newest first."""
        where = ["account_id = ?"]
        args: list[Any] = [str(query.account_id)]
        if query.contact_id is not None:
            where.append("contact_id = ?")
            args.append(str(query.contact_id))
        if query.metric_name is not None:
            where.append("metric_name = ?")
            args.append(query.metric_name)
        if query.automation_execution_id is not None:
            where.append("automation_execution_id = ?")
            args.append(str(query.automation_execution_id))
        if query.since is not None:
            where.append("occurred_at >= ?")
            args.append(ts(query.since))
        if query.until is not None:
            where.append("occurred_at < ?")
            args.append(ts(query.until))
        if query.before is not None:
            where.append("(occurred_at, id) < (?, ?)")
            args.extend([ts(query.before[0]), str(query.before[1])])
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} "
            "ORDER BY occurred_at DESC, id DESC LIMIT ?"
        )
        with self._read() as conn:
            rows = conn.execute(sql, [*args, query.limit]).fetchall()
        return [_stored_event(row) for row in rows]

    def read_feed(self, account_id: UUID, after: FeedPosition, limit: int) -> FeedPage:
        """The account's events by `seq`, their commit order (migration 0021): one writer
        at a time, so no event can commit later with a smaller number. Numbers are unique,
        so the one of `after` is all that places it."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT seq, {_EVENT_COLUMNS} FROM events "
                "WHERE account_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (str(account_id), after.arrival, limit + 1),
            ).fetchall()
        return feed_page(after, limit, [(row[0], _stored_event(row[1:])) for row in rows])

    def get_summary(self, account_id: UUID, contact_id: UUID | None = None) -> list[SummaryRow]:
        """Summary rows of the account (or one contact)."""
        sql = (
            "SELECT account_id, contact_id, metric_name, currency, event_count, total_value, "
            "first_event_at, last_event_at FROM contact_metrics_summary WHERE account_id = ?"
        )
        args: list[str] = [str(account_id)]
        if contact_id is not None:
            sql += " AND contact_id = ?"
            args.append(str(contact_id))
        with self._read() as conn:
            rows = conn.execute(
                sql + " ORDER BY contact_id, metric_name, currency", args
            ).fetchall()
        return [_summary_row(row) for row in rows]

    def list_rejections(
        self, account_id: UUID, limit: int = 100, before: UUID | None = None
    ) -> list[Rejection]:
        """Kept rejections, newest first."""
        # ids are UUIDv7 in canonical text: text order is creation order.
        bound = "ffffffff-ffff-ffff-ffff-ffffffffffff" if before is None else str(before)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_REJECTION_COLUMNS} FROM rejections WHERE account_id = ? AND id < ? "
                "ORDER BY id DESC LIMIT ?",
                (str(account_id), bound, limit),
            ).fetchall()
        return [_rejection(r) for r in rows]

    def rebuild_summaries(
        self, account_id: UUID | None = None, progress: Progress | None = None
    ) -> Iterator[RebuildReport]:
        """Recompute summaries from events, an account's contacts `base.REBUILD_CONTACTS`
        at a time, each chunk in one write transaction: writers wait for a chunk, not for
        the whole rebuild."""
        accounts: Iterable[str]
        with self._read() as conn:
            if account_id is not None:
                accounts = [str(account_id)]
                counted = conn.execute(
                    "SELECT count(*) FROM contacts WHERE account_id = ?", (accounts[0],)
                )
            else:
                accounts = every_account(self._accounts_after)
                counted = conn.execute("SELECT count(*) FROM contacts")
            [(contacts,)] = counted.fetchall()
        return rebuild_accounts(accounts, contacts, self._rebuild_step, progress)

    def _accounts_after(self, after: str | None, limit: int) -> list[str]:
        """The ids of the first `limit` accounts after the one `after` (None: the first)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT id FROM accounts WHERE id > ? ORDER BY id LIMIT ?", (after or "", limit)
            ).fetchall()
        return [r[0] for r in rows]

    def _rebuild_step(self, account: str, after: str | None) -> tuple[list[str], RebuildReport]:
        """The account's next contacts after `after`, recounted in one transaction."""
        with self._write() as conn:
            chunk = [
                r[0]
                for r in conn.execute(
                    "SELECT id FROM contacts WHERE account_id = ? AND id > ? ORDER BY id LIMIT ?",
                    (account, after or "", base.REBUILD_CONTACTS),
                )
            ]
            return chunk, _rebuild_contacts(conn, account, chunk)

    # -- added for the HTTP service ---------------------------------------------------

    def list_accounts(self, limit: int = 100, after: Account | None = None) -> list[Account]:
        """Accounts, oldest first; those after `after`."""
        start = "" if after is None else "WHERE (created_at, id) > (?, ?) "
        args = () if after is None else (ts(after.created_at), str(after.id))
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT id, name, timezone, created_at FROM accounts {start}"
                "ORDER BY created_at, id LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [Account(UUID(r[0]), r[1], r[2], parse_ts(r[3])) for r in rows]

    def update_account(
        self, account_id: UUID, name: str | None, timezone: str | None
    ) -> Account | None:
        """Change an account's name and/or timezone (None: unchanged)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE accounts SET name = coalesce(?, name), timezone = coalesce(?, timezone) "
                "WHERE id = ?",
                (name, timezone, str(account_id)),
            )
        return self.get_account(account_id)

    def create_api_key(self, key: ApiKey) -> None:
        """Insert an API key."""
        with self._write() as conn:
            conn.execute(
                f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    str(key.account_id), str(key.id), key.key_hash, key.hint, key.name,
                    orjson.dumps(list(key.scopes)).decode(), ts(key.created_at),
                    None if key.revoked_at is None else ts(key.revoked_at),
                ),
            )  # fmt: skip

    def find_api_key(self, account_id: UUID, key_hash: str) -> ApiKey | None:
        """The account's key with this hash, or None."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = ? AND key_hash = ?",
                (str(account_id), key_hash),
            ).fetchone()
        return None if row is None else _api_key(row)

    def list_api_keys(
        self, account_id: UUID, limit: int | None = None, after: ApiKey | None = None
    ) -> list[ApiKey]:
        """The account's keys, oldest first; those after `after`."""
        start = "" if after is None else "AND (created_at, id) > (?, ?) "
        args = () if after is None else (ts(after.created_at), str(after.id))
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = ? {start}"
                "ORDER BY created_at, id LIMIT ?",
                (str(account_id), *args, -1 if limit is None else limit),  # -1: no limit
            ).fetchall()
        return [_api_key(r) for r in rows]

    def revoke_api_key(self, key_id: UUID, when: datetime) -> ApiKey | None:
        """Revoke a key by id (idempotent: the first revocation time is kept)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?",
                (ts(when), str(key_id)),
            )
            row = conn.execute(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (str(key_id),)
            ).fetchone()
        return None if row is None else _api_key(row)

    def upsert_contact_recorded(
        self, contact: NewContact, on_create: BuildEvent
    ) -> tuple[Contact, bool]:
        """`upsert_contact`, recording `on_create(contact)` when the contact is new."""
        with self._write() as conn:
            found, created = self._find_or_create(conn, contact)
            if created:
                _record_in(conn, [on_create(found)])
            return found, created

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
        account, contact = str(account_id), str(contact_id)
        with self._write() as conn:
            before = self._contact(conn, account, contact)
            if before is None:
                return None
            changed = changed_fields(before, changes, only_missing=only_missing)
            if not changed:
                return before
            for kind, value in changed.items():
                if kind == "name":
                    continue
                if value is not None:
                    row = conn.execute(
                        "SELECT contact_id FROM contact_identities "
                        "WHERE account_id = ? AND kind = ? AND value = ?",
                        (account, kind, value),
                    ).fetchone()
                    if row is not None and row[0] != contact:
                        raise IdentityConflict(kind)
                conn.execute(
                    "DELETE FROM contact_identities "
                    "WHERE account_id = ? AND contact_id = ? AND kind = ?",
                    (account, contact, kind),
                )
                if value is not None:
                    conn.execute(
                        "INSERT INTO contact_identities (account_id, kind, value, contact_id) "
                        "VALUES (?, ?, ?, ?)",
                        (account, kind, value, contact),
                    )
            merged: dict[str, str | None] = {
                k: getattr(before, k) for k in ("name", "phone", "email", "external_id")
            }
            merged.update(changed)
            conn.execute(
                "UPDATE contacts SET name = ?, phone = ?, email = ?, external_id = ?, "
                "updated_at = ? WHERE account_id = ? AND id = ?",
                (
                    merged["name"], merged["phone"], merged["email"], merged["external_id"],
                    ts(datetime.now(UTC)), account, contact,
                ),
            )  # fmt: skip
            after = self._contact(conn, account, contact)
            assert after is not None
            _record_in(conn, [on_change(before, after)])
            return after

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
        account, contact = str(account_id), str(contact_id)
        with self._write() as conn:
            if self._contact(conn, account, contact) is None:
                return None
            changed: list[str] = []
            now = ts(datetime.now(UTC))
            for tag in dict.fromkeys(tags):
                if add:
                    cur = conn.execute(
                        "INSERT INTO contact_tags (account_id, contact_id, tag, created_at) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                        (account, contact, tag, now),
                    )
                else:
                    cur = conn.execute(
                        "DELETE FROM contact_tags "
                        "WHERE account_id = ? AND contact_id = ? AND tag = ?",
                        (account, contact, tag),
                    )
                if cur.rowcount:
                    changed.append(tag)
            if changed:
                _record_in(conn, [on_change(tag) for tag in changed])
            return changed

    def list_tags(self, account_id: UUID, contact_id: UUID) -> list[str]:
        """A contact's tags, sorted."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT tag FROM contact_tags WHERE account_id = ? AND contact_id = ? ORDER BY tag",
                (str(account_id), str(contact_id)),
            ).fetchall()
        return [r[0] for r in rows]

    def get_event(self, account_id: UUID, event_id: UUID) -> StoredEvent | None:
        """One event of the account, or None."""
        return self._event("id", str(account_id), str(event_id))

    def find_event(self, account_id: UUID, unique_event_id: str) -> StoredEvent | None:
        """The account's event with this `unique_event_id`, or None."""
        return self._event("unique_event_id", str(account_id), unique_event_id)

    def _event(self, key: str, account: str, value: str) -> StoredEvent | None:
        """The event whose `key` column, a unique key with the account's, is `value`."""
        with self._read() as conn:
            row = conn.execute(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE account_id = ? AND {key} = ?",
                (account, value),
            ).fetchone()
        return None if row is None else _stored_event(row)

    def list_metrics(
        self,
        account_id: UUID,
        name: str | None = None,
        *,
        after: str | None = None,
        limit: int | None = None,
    ) -> list[MetricInfo]:
        """The account's metrics with their event counts (from the summaries of the page's
        metrics alone); names compare as BINARY, code point order for UTF-8."""
        with self._read() as conn:
            rows = conn.execute(
                "WITH page AS (SELECT name, category, is_system, created_at FROM metrics "
                "WHERE account_id = :account AND (:name IS NULL OR name = :name) "
                "AND (:after IS NULL OR name > :after) ORDER BY name LIMIT :limit) "
                "SELECT p.name, p.category, p.is_system, coalesce(s.n, 0), p.created_at "
                "FROM page p LEFT JOIN (SELECT metric_name, sum(event_count) AS n "
                "FROM contact_metrics_summary WHERE account_id = :account "
                "AND metric_name IN (SELECT name FROM page) GROUP BY metric_name) s "
                "ON s.metric_name = p.name ORDER BY p.name",
                {"account": str(account_id), "name": name, "after": after,
                 "limit": -1 if limit is None else limit},  # -1: no limit
            ).fetchall()  # fmt: skip
        return [MetricInfo(r[0], r[1], bool(r[2]), int(r[3]), parse_ts(r[4])) for r in rows]

    def has_metric(self, account_id: UUID, name: str) -> bool:
        """Whether the account has a metric of this name (by its unique key)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT 1 FROM metrics WHERE account_id = ? AND name = ?", (str(account_id), name)
            ).fetchone()
        return row is not None

    def aggregate(self, query: AggregateQuery) -> list[AggregateCell]:
        """Cells computed in Python: exact decimals, buckets by bisection; a sum per
        currency, of the events with a value."""
        group = "NULL" if query.by is None else "properties -> ?"
        args: list[str] = [] if query.by is None else ['$."' + query.by + '"']
        args += [str(query.account_id), query.metric_name, ts(query.since), ts(query.until)]
        is_sum = query.measurement == "sum_value"
        where = " AND value IS NOT NULL" if is_sum else ""
        if query.currency is not None:
            where += " AND currency = ?"
            args.append(query.currency)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT occurred_at, value, contact_id, currency, {group} FROM events "
                "WHERE account_id = ? AND metric_name = ? AND occurred_at >= ? "
                f"AND occurred_at < ?{where}",
                args,
            ).fetchall()
        starts = [ts(s) for s in query.starts]
        cells: dict[tuple[int, str | None, str | None], Any] = {}
        labels: dict[str | None, str | None] = {}  # a property's few values, labelled once
        for occurred_at, value, contact, currency, raw_group in rows:
            if raw_group not in labels:
                labels[raw_group] = _group_text(raw_group)
            key = (
                bisect_right(starts, occurred_at) - 1,
                labels[raw_group],
                currency if is_sum else None,
            )
            if query.measurement == "count":
                cells[key] = cells.get(key, 0) + 1
            elif is_sum:
                cells[key] = cells.get(key, Decimal(0)) + Decimal(value)
            else:
                cells.setdefault(key, set()).add(contact)
        return [
            AggregateCell(b, g, len(v) if isinstance(v, set) else v, k)
            for (b, g, k), v in cells.items()
            if b >= 0
        ]

    def replay_rejection(
        self, account_id: UUID, rejection_id: UUID, build: BuildReplayEvent
    ) -> Replay | None:
        """Replay under the write lock (BEGIN IMMEDIATE): replays run one at a time."""
        account = str(account_id)
        with self._write() as conn:
            row = conn.execute(
                f"SELECT {_REJECTION_COLUMNS} FROM rejections WHERE account_id = ? AND id = ?",
                (account, str(rejection_id)),
            ).fetchone()
            if row is None:
                return None
            rejection = _rejection(row)
            if rejection.replayed_event_id is not None:
                earlier = Outcome("created", event_id=rejection.replayed_event_id)
                return Replay(rejection, earlier, earlier=True)
            event = build(rejection)
            if event.contact_id is None or (
                conn.execute(
                    "SELECT 1 FROM contacts WHERE account_id = ? AND id = ?",
                    (account, str(event.contact_id)),
                ).fetchone()
                is None
            ):
                return Replay.refused(rejection, event)
            [outcome] = _record_in(conn, [event])
            conn.execute(  # the contact its event went to: erased, it takes the rejection
                "UPDATE rejections SET replayed_at = ?, replayed_event_id = ?, contact_id = ? "
                "WHERE account_id = ? AND id = ?",
                (ts(datetime.now(UTC)), str(outcome.event_id), str(event.contact_id), account,
                 str(rejection_id)),
            )  # fmt: skip
            return Replay(replace(rejection, replayed_event_id=outcome.event_id), outcome)


class _Batch:
    """One `record()` call: per-event statements, then one upsert per summary row."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.contacts: dict[tuple[str, str], bool] = {}
        self.accounts: dict[str, bool] = {}  # looked up for rejections only
        self.metrics: dict[tuple[str, str], str] = {}  # (account, name) → the metric's id
        self.texts: dict[UUID, str] = {}  # the batch's accounts and contacts, as stored
        self.created: list[PreparedEvent] = []  # their summaries are written by flush
        self.now = ts(datetime.now(UTC))
        self.seq: int | None = None  # the feed's last number given (`event_sequence`)

    def text(self, ident: UUID) -> str:
        """An account's or contact's id as stored: the batch repeats a few (`str` of a
        UUID is ~1 µs of Python)."""
        text = self.texts.get(ident)
        if text is None:
            text = self.texts[ident] = str(ident)
        return text

    def record(self, event: PreparedEvent) -> Outcome:
        account = self.text(event.account_id)
        if event.contact_id is None:
            return self.reject(event, "contact_required")
        contact = self.text(event.contact_id)
        if not self.contact_exists(account, contact):
            return self.reject(event, "contact_not_found")
        metric, new_metric = self.ensure_metric(event, account)
        event_id = str(event.id)
        seq = self.next_seq()
        row = self.conn.execute(
            f"INSERT INTO events ({_EVENT_COLUMNS}, metric_id, created_at, seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (account_id, unique_event_id) DO NOTHING RETURNING id",
            (
                account, event_id, contact, event.metric_name, event.properties_json,
                _opt(event.value), event.currency, event.source, event.source_id,
                _opt(event.integration_id), event.unique_event_id, event.entity_type,
                event.entity_id, _opt(event.automation_execution_id), ts(event.occurred_at),
                ts(event.received_at), SCHEMA_VERSION, metric, self.now, seq,
            ),
        ).fetchone()  # fmt: skip
        if row is None:
            self.seq = seq - 1  # a duplicate: the number goes to the next event
            if new_metric:  # a metric is made by an event stored, never by a duplicate
                self.drop_metric(event, account, metric)
            return self.duplicate(event)
        self.created.append(event)
        if not event.from_automation:
            self.conn.execute(
                "INSERT INTO outbox (account_id, event_id, metric_name, created_at, available_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (account, event_id, event.metric_name, self.now, self.now),
            )
        return Outcome("created", event_id=event.id)

    def record_all(self, events: Sequence[PreparedEvent]) -> list[Outcome]:
        """`record` each of `events`; their outcomes."""
        return [self.record(event) for event in events]

    def next_seq(self) -> int:
        """The feed's number for the next event: in commit order, as this transaction
        holds the one write lock until it commits (migration 0021)."""
        if self.seq is None:
            self.seq = int(self.conn.execute("SELECT last FROM event_sequence").fetchone()[0])
        self.seq += 1
        return self.seq

    def flush_seq(self) -> None:
        """Keep the feed's last number given, if this transaction gave any."""
        if self.seq is not None:
            self.conn.execute("UPDATE event_sequence SET last = ?", (self.seq,))

    def contact_exists(self, account: str, contact: str) -> bool:
        key = (account, contact)
        if key not in self.contacts:
            self.contacts[key] = (
                self.conn.execute(
                    "SELECT 1 FROM contacts WHERE account_id = ? AND id = ?", key
                ).fetchone()
                is not None
            )
        return self.contacts[key]

    def ensure_metric(self, event: PreparedEvent, account: str) -> tuple[str, bool]:
        """Insert the event's metric unless the batch did; its id, as stored, and whether
        this call inserted it. (Before the event, which the metric's foreign key needs.)"""
        key = (account, event.metric_name)
        known = self.metrics.get(key)
        if known is not None:
            return known, False
        ident = str(metric_id(event.account_id, event.metric_name))
        inserted = self.conn.execute(
            "INSERT INTO metrics (account_id, id, name, display_name, category, source, "
            "is_system, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                account, ident, event.metric_name, event.display_name, str(event.category),
                event.source, int(event.is_system), self.now,
            ),
        ).rowcount  # fmt: skip
        self.metrics[key] = ident
        return ident, inserted > 0

    def drop_metric(self, event: PreparedEvent, account: str, ident: str) -> None:
        """Delete the metric `ensure_metric` just inserted for an event not stored."""
        self.conn.execute("DELETE FROM metrics WHERE account_id = ? AND id = ?", (account, ident))
        del self.metrics[(account, event.metric_name)]

    def duplicate(self, event: PreparedEvent) -> Outcome:
        row = self.conn.execute(
            "SELECT id, metric_name, properties, value, currency, occurred_at FROM events "
            "WHERE account_id = ? AND unique_event_id = ?",
            (self.text(event.account_id), event.unique_event_id),
        ).fetchone()
        stored = StoredPayload(
            metric_name=row[1],
            properties_json=row[2],
            value=_opt_decimal(row[3]),
            currency=row[4],
            occurred_at=parse_ts(row[5]),
        )
        return Outcome("duplicate", event_id=UUID(row[0]), stored=stored)

    def account_exists(self, account: str) -> bool:
        if account not in self.accounts:
            found = self.conn.execute("SELECT 1 FROM accounts WHERE id = ?", (account,))
            self.accounts[account] = found.fetchone() is not None
        return self.accounts[account]

    def reject(self, event: PreparedEvent, reason: str) -> Outcome:
        """Keep `event`'s rejection for `reason`; none for an account that does not exist
        (`account_missing`: checked only here, as an account's contact implies it)."""
        if not self.account_exists(self.text(event.account_id)):
            return account_missing(event)
        message = rejection_message(reason, event)
        self.conn.execute(
            "INSERT INTO rejections (account_id, id, contact_id, reason, message, source, "
            "payload, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.text(event.account_id), str(event.id), _opt(event.contact_id), reason,
                message, event.source, dumps_json(event.as_input()), self.now,
            ),
        )  # fmt: skip
        return Outcome("rejected", reason=reason, message=message, rejection_id=event.id)

    def flush_summaries(self) -> None:
        deltas = summary_deltas(self.created).items()
        for (account_id, contact_id, metric, currency), delta in deltas:
            assert contact_id is not None  # stored events all have their contact
            account, contact = self.text(account_id), self.text(contact_id)
            row = self.conn.execute(
                "SELECT event_count, total_value, first_event_at, last_event_at "
                "FROM contact_metrics_summary WHERE account_id = ? AND contact_id = ? "
                "AND metric_name = ? AND currency = ?",
                (account, contact, metric, currency),
            ).fetchone()
            count, total, first, last = delta[0], delta[1], ts(delta[2]), ts(delta[3])
            if row is not None:
                count, total = count + row[0], add_values(_opt_decimal(row[1]), total)
                first, last = min(first, row[2]), max(last, row[3])
            self.conn.execute(
                "INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, "
                "currency, id, event_count, total_value, first_event_at, last_event_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (account_id, contact_id, metric_name, currency) DO UPDATE SET "
                "event_count = excluded.event_count, total_value = excluded.total_value, "
                "first_event_at = excluded.first_event_at, "
                "last_event_at = excluded.last_event_at, updated_at = excluded.updated_at",
                (account, contact, metric, currency, str(delta[4]), count, _opt(total), first,
                 last, self.now),
            )  # fmt: skip


# Records a round of events with a batch writer: `_Batch.record_all`, or `_record_isolated`.
_Recorder = Callable[["_Batch", Sequence[PreparedEvent]], list[Outcome]]


def _record_in(
    conn: sqlite3.Connection,
    events: Sequence[PreparedEvent],
    settle: Settle | None = None,
    record: _Recorder | None = None,
) -> list[Outcome]:
    """Record events inside the caller's transaction, and the rounds `settle` names after
    them (see `Store.record`); the first round's outcomes."""
    batch = _Batch(conn)
    record_round = record or _Batch.record_all
    outcomes = record_round(batch, events)
    if settle is not None:
        more = settle(events, outcomes)
        while more:
            done = record_round(batch, more)
            more = settle(more, done)
    batch.flush_summaries()
    batch.flush_seq()
    return outcomes


def _record_isolated(
    batch: _Batch,
    events: Sequence[PreparedEvent],
    refusals: Refusals[sqlite3.Connection] = ANSWERED,
) -> list[Outcome]:
    """`batch.record_all(events)`, their summaries written, under a savepoint, inside the
    caller's transaction; when SQLite refuses them with one of `refusals.isolated`
    (ingest's: the events' data, a constraint, a text too big: `UnstorableInput`), they
    are recorded again in halves, down to the events it refuses, each of which gets
    `refusals.outcome` (ingest's: rejected, "refused"); or, split by "events", each under
    its own savepoint at once. For a batch refused once already, and for each automation
    step's event (`finish_steps`): a savepoint costs no round trip."""
    conn = batch.conn

    def attempt(events: Sequence[PreparedEvent]) -> list[Outcome]:
        with translated_errors(), _savepoint(conn, "refusal"):
            part = _Batch(conn)  # its own caches: a part rolled back leaves nothing behind
            outcomes = part.record_all(events)
            part.flush_summaries()
            part.flush_seq()  # the next part numbers its events after this one's
            return outcomes

    return refusals.record(conn, events, attempt)


def _rejection(r: Sequence[Any]) -> Rejection:
    return Rejection(
        UUID(r[0]), UUID(r[1]), r[2], r[3], orjson.loads(r[4]), parse_ts(r[5]), _opt_uuid(r[6])
    )


def _api_key(r: Sequence[Any]) -> ApiKey:
    return ApiKey(
        account_id=UUID(r[0]),
        id=UUID(r[1]),
        key_hash=r[2],
        hint=r[3],
        name=r[4],
        scopes=tuple(orjson.loads(r[5])),
        created_at=parse_ts(r[6]),
        revoked_at=None if r[7] is None else parse_ts(r[7]),
    )


def _group_text(raw: str | None) -> str | None:
    """A property's JSON text as its group label, as PostgreSQL's `_GROUP` says it:
    JSON null as None, strings unquoted, numbers in plain notation without trailing zeros
    (1.0 is "1", 1e20 is "100000000000000000000"), objects and arrays as jsonb prints them."""
    if raw is None:
        return None
    value = json.loads(raw, parse_float=Decimal, parse_int=Decimal)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Decimal):
        text = _plain(value)
        return text.rstrip("0").rstrip(".") if "." in text else text
    return _jsonb_text(value)


def _plain(number: Decimal) -> str:
    """A number as PostgreSQL's numeric prints it: no exponent, its scale kept, no -0."""
    return format(abs(number) if number.is_zero() else number, "f")


def _jsonb_text(value: Any) -> str:
    """A JSON value as PostgreSQL prints a jsonb: keys by length then bytes."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{_jsonb_text(k)}: {_jsonb_text(value[k])}" for k in keys) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_jsonb_text(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return _plain(value)
    return json.dumps(value, ensure_ascii=False)  # str, bool, None


def _rebuild_contacts(conn: sqlite3.Connection, account: str, contacts: list[str]) -> RebuildReport:
    """Recount the summaries of some contacts of an account inside the caller's write
    transaction (no other writer runs), and rewrite their rows if any is wrong."""
    ids = orjson.dumps(contacts).decode()
    truth = {
        (r[0], r[1], r[2]): (r[3], _opt_decimal(r[4]), r[5], r[6])
        for r in conn.execute(
            "SELECT contact_id, metric_name, currency, count(*), decimal_sum(value), "
            "min(occurred_at), max(occurred_at) FROM events WHERE account_id = ? "
            "AND contact_id IN (SELECT value FROM json_each(?)) "
            "GROUP BY contact_id, metric_name, currency",
            (account, ids),
        )
    }
    kept = {
        (r[0], r[1], r[2]): (r[3], _opt_decimal(r[4]), r[5], r[6])
        for r in conn.execute(
            "SELECT contact_id, metric_name, currency, event_count, total_value, "
            "first_event_at, last_event_at FROM contact_metrics_summary WHERE account_id = ? "
            "AND contact_id IN (SELECT value FROM json_each(?))",
            (account, ids),
        )
    }
    report = compare_summaries(UUID(account), truth, kept)
    if report.drift:
        now = ts(datetime.now(UTC))
        conn.execute(
            "DELETE FROM contact_metrics_summary WHERE account_id = ? "
            "AND contact_id IN (SELECT value FROM json_each(?))",
            (account, ids),
        )
        conn.executemany(
            "INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, currency, "
            "id, event_count, total_value, first_event_at, last_event_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (account, c, m, k, str(new_id()), n, _opt(total), first, last, now)
                for (c, m, k), (n, total, first, last) in truth.items()
            ],
        )
    return report


def _stored_event(row: Sequence[Any]) -> StoredEvent:
    return StoredEvent(
        account_id=UUID(row[0]),
        id=UUID(row[1]),
        contact_id=UUID(row[2]),
        metric_name=row[3],
        properties=orjson.loads(row[4]),
        value=_opt_decimal(row[5]),
        currency=row[6],
        source=row[7],
        source_id=row[8],
        integration_id=_opt_uuid(row[9]),
        unique_event_id=row[10],
        entity_type=row[11],
        entity_id=row[12],
        automation_execution_id=_opt_uuid(row[13]),
        occurred_at=parse_ts(row[14]),
        received_at=parse_ts(row[15]),
        schema_version=row[16],
    )


def _summary_row(row: Sequence[Any]) -> SummaryRow:
    return SummaryRow(
        account_id=UUID(row[0]),
        contact_id=UUID(row[1]),
        metric_name=row[2],
        currency=row[3],
        event_count=row[4],
        total_value=_opt_decimal(row[5]),
        first_event_at=parse_ts(row[6]),
        last_event_at=parse_ts(row[7]),
    )


def _split_sql(script: str) -> list[str]:
    """Split a migration into statements: at each ';' that ends one, not at those inside a
    trigger's body (`sqlite3.complete_statement`; ours have no ';' inside literals)."""
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    statements, current = [], ""
    for part in "\n".join(lines).split(";"):
        current += part
        if sqlite3.complete_statement(current + ";"):
            if current.strip():
                statements.append(current.strip())
            current = ""
        else:
            current += ";"
    return statements
