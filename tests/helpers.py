"""Test-only helpers: a look at the database directly, under the ledger; rows made through
the store's own methods; a clock tests drive."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, cast
from uuid import UUID

import psycopg

from sinal.automations.service import Automations
from sinal.events import EmitResult, PreparedEvent
from sinal.ledger import Ledger
from sinal.store.commerce import CheckoutUpdate, CommerceStore

# Limits no shared transaction could keep, and the `ValueError` each gets: refused by
# `check_limits`, whether a `GroupCommitter` or an `AsyncLedger` is made with them.
BAD_LIMITS = [
    ({"max_batch": 0}, "max_batch must be within 1..1000"),
    ({"max_batch": 1001}, "max_batch must be within 1..1000"),
    ({"max_inflight": 0}, "max_inflight must be at least 1"),
    ({"max_delay": -0.001}, "max_delay must be within 0..1 seconds"),
    ({"max_delay": 2.0}, "max_delay must be within 0..1 seconds"),
    ({"max_delay": 1e9}, "max_delay must be within 0..1 seconds"),  # a lone event's wait
    ({"max_delay": float("nan")}, "max_delay must be within 0..1 seconds"),
]


async def settle(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (a worker thread got there), then a little more, so
    that a second, wrong, effect would have had its chance to happen too."""
    for _ in range(int(timeout / 0.05)):
        if condition():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)


def wait_until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll `condition()` every 10 ms until it holds or `timeout` seconds have passed
    (the caller asserts what it needs afterwards)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement on the database at `url` ("?" placeholders), return its rows."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return conn.execute(statement, params).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(statement.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []


def count(url: str, table: str) -> int:
    """Rows in a table."""
    return int(sql(url, f"SELECT count(*) FROM {table}")[0][0])


# A refusal no validation foresaw (a value, a text, a constraint): the database refuses
# any event whose value is 13.
_REFUSE_13 = {
    "sqlite": "CREATE TRIGGER refuse_13 BEFORE INSERT ON events "
              "WHEN CAST(NEW.value AS REAL) = 13 BEGIN SELECT RAISE(ABORT, 'refused'); END",
    "postgres": "ALTER TABLE events ADD CONSTRAINT refuse_13 CHECK (value IS DISTINCT FROM 13)",
}  # fmt: skip


def refuse_13(url: str) -> None:
    """Make the database at `url` refuse every event of value 13 (constraint `refuse_13`)."""
    sql(url, _REFUSE_13["sqlite" if url.startswith("sqlite") else "postgres"])


def save_checkouts(
    ledger: Ledger, account_id: UUID, n: int, updated_at: datetime, prefix: str = "checkout"
) -> UUID:
    """`n` Shopify checkouts (tokens `{prefix}-0000`, ...) of `n` contacts, last updated at
    `updated_at` and due 30 minutes later, as checkout webhooks leave them, of a new
    integration; its id."""
    integration = Automations(ledger).create_integration(
        account_id, {"kind": "shopify", "secret": "s", "abandon_after_minutes": 30}
    )
    store = cast(CommerceStore, ledger.store)
    for i in range(n):
        email = f"cliente{i}@exemplo.com.br"
        contact = ledger.create_contact(account_id, email=email)
        store.save_checkout(CheckoutUpdate(
            account_id=account_id, integration_id=integration.id, provider="shopify",
            token=f"{prefix}-{i:04d}", contact_id=contact.id,
            recovery_url=f"https://loja.example/checkouts/{i}/recover", total=Decimal("99.90"),
            currency="BRL", details={"contact": {"email": email}}, updated_at=updated_at,
            abandon_after=timedelta(minutes=30),
        ), [])  # fmt: skip
    return integration.id


class DrivenClock:
    """A ledger clock that runs with real time, shifted forward by hand (`advance`): a
    worker on it sees an hour pass in an instant, and keeps ticking after."""

    def __init__(self) -> None:
        self._offset = timedelta(0)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return datetime.now(UTC) + self._offset

    def advance(self, delta: timedelta) -> None:
        """Move the clock `delta` forward."""
        with self._lock:
            self._offset += delta


class WatchedLedger(Ledger):
    """The real ledger, recording the size of each shared transaction (`record_prepared`,
    what group commit calls); with `hold`, the first one waits until `release` is set (a
    slow commit while more callers arrive)."""

    def __init__(self, ledger: Ledger, *, hold: bool = False) -> None:
        super().__init__(ledger.store, clock=ledger.clock)
        self.sizes: list[int] = []
        self.started = threading.Event()  # set once the first transaction has begun
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def record_prepared(self, events: Sequence[PreparedEvent]) -> list[EmitResult]:
        self.sizes.append(len(events))
        self.started.set()
        if len(self.sizes) == 1:
            self.release.wait(10)
        return super().record_prepared(events)


def cut_connections(url: str) -> int:
    """Terminate every other session on the PostgreSQL database at `url` (what a server
    restart or a network cut does to them); how many there were.

    Returns once each of them has exited: `pg_terminate_backend` without a timeout only
    signals, so a statement sent at once raced the backend's exit, and once in CI failed
    with "connection socket closed" instead of the server's "terminating connection"."""
    cut = sql(
        url,
        "SELECT pid, pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    pids = [pid for pid, _ in cut]
    left = sql(url, "SELECT pid FROM pg_stat_activity WHERE pid = ANY(?)", pids)
    assert not left, f"sessions {left} still running 10 s after being terminated"
    return len(cut)


def free_port() -> int:
    """A loopback port nothing listens on (free when this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fail_recording(
    monkeypatch: Any, ledger: Ledger, failing: Callable[[PreparedEvent], bool]
) -> None:
    """Make the store raise `StoreUnavailable` (as for a lock not granted in time) when it
    writes an event for which `failing` holds, inside its transaction."""
    from sinal.errors import StoreUnavailable
    from sinal.store import postgres, sqlite

    if isinstance(ledger.store, postgres.PostgresStore):
        record_in = postgres._record_in

        def failing_record_in(conn: Any, events: Sequence[PreparedEvent]) -> Any:
            if any(map(failing, events)):
                raise StoreUnavailable("injected: lock timeout")
            return record_in(conn, events)

        monkeypatch.setattr(postgres, "_record_in", failing_record_in)
    else:
        record = sqlite._Batch.record

        def failing_record(batch: Any, event: PreparedEvent) -> Any:
            if failing(event):
                raise StoreUnavailable("injected: lock timeout")
            return record(batch, event)

        monkeypatch.setattr(sqlite._Batch, "record", failing_record)
