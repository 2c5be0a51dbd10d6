"""Summaries rebuilt while events are written: how long the writers wait for it.

Run from the project root:

    .venv/bin/python bench/rebuild.py [--quick] [--events N] [--contacts N]
                                      [--backend postgresql|sqlite|both]

On a fresh database, one account ("big") holds N events over M contacts, every summary
row of it wrong (its count one too high), and another ("small") has one contact. Two
threads call `emit_event` in a loop, one event per call: one for "small", one for the
first contact of "big" (in the rebuild's first chunk). Half a second later,
`rebuild_summaries` of "big" runs. The table gives each writer's latency before the
rebuild (the baseline, same run) and during it (every call that overlapped it), the
rebuild's seconds, its chunks (each one write transaction; the longest is the most a
writer should wait) and the rows it fixed. Afterwards "big"'s summaries must equal a
GROUP BY over its events, computed here in Python from the raw rows; a mismatch is
printed and the script exits with status 1.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID

import psycopg
from rich.console import Console
from rich.table import Table

from ingest import DEFAULT_PG, console
from sinal import EmitEvent
from sinal.ledger import Ledger, connect

METRICS = ("Order Paid", "Order Placed", "Message Sent", "Message Read", "Link Clicked")
T0 = datetime(2026, 6, 1, tzinfo=UTC)
BATCH = 1_000
BASELINE_SECONDS = 0.5


@dataclass
class Writer:
    """A thread calling `emit_event` in a loop; each call's start and end
    (`time.perf_counter()`)."""

    label: str
    account_id: UUID
    contact_id: UUID
    calls: list[tuple[float, float]]
    stop: threading.Event
    thread: threading.Thread | None = None

    def start(self, ledger: Ledger) -> None:
        def run() -> None:
            while not self.stop.is_set():
                began = time.perf_counter()
                ledger.emit_event(account_id=self.account_id, contact_id=self.contact_id,
                                  metric_name="Order Paid", source="bench")  # fmt: skip
                self.calls.append((began, time.perf_counter()))

        self.thread = threading.Thread(target=run, name=self.label)
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


@dataclass(frozen=True)
class Result:
    backend: str
    events: int
    contacts: int
    seconds: float
    chunks: list[float]  # each chunk's seconds, in order
    fixed: int
    writers: list[tuple[str, list[float], list[float]]]  # label, latencies before, during


@contextmanager
def database(backend: str) -> Iterator[str]:
    """A new, empty database's URL, dropped (or removed) afterwards. (bench/http.py has
    its twin: it cannot import its sibling modules, see there.)"""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{Path(tmp) / 'rebuild.db'}"
        return
    base = os.environ.get("SINAL_BENCH_PG", DEFAULT_PG)
    name = f"sinal_bench_rebuild_{os.getpid()}"
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(base)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def raw(url: str, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Rows of one statement, outside sinal ("?" placeholders)."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return conn.execute(statement, params).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(statement.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []


# A summary's key (contact, metric, currency) and its figures (count, total, first, last).
_Key = tuple[str, str, str]
_Figures = tuple[int, Decimal | None, str, str]


def group_by(url: str, account: UUID) -> dict[_Key, _Figures]:
    """The oracle: the account's events added up here, from their raw rows (a total is
    None while no event of its row carried a value, as SUM is)."""
    truth: dict[_Key, _Figures] = {}
    rows = raw(url, "SELECT contact_id, metric_name, currency, value, occurred_at FROM events "
               "WHERE account_id = ?", (str(account),))  # fmt: skip
    for contact, metric, currency, value, when in rows:
        key, at = (str(contact), metric, currency), _time(when)
        n, total, first, last = truth.get(key, (0, None, at, at))
        if value is not None:
            total = (total or Decimal(0)) + Decimal(str(value))
        truth[key] = (n + 1, total, min(first, at), max(last, at))
    return truth


def summaries(url: str, account: UUID) -> dict[_Key, _Figures]:
    rows = raw(url, "SELECT contact_id, metric_name, currency, event_count, total_value, "
               "first_event_at, last_event_at FROM contact_metrics_summary WHERE account_id = ?",
               (str(account),))  # fmt: skip
    return {
        (str(c), m, cur): (int(n), None if v is None else Decimal(str(v)), _time(f), _time(last))
        for c, m, cur, n, v, f, last in rows
    }


def _time(value: object) -> str:
    """A timestamp as comparable text: SQLite stores fixed-width UTC text already."""
    return value.astimezone(UTC).isoformat() if isinstance(value, datetime) else str(value)


def run(backend: str, events: int, contacts: int) -> Result:
    with database(backend) as url, connect(url) as ledger:
        ledger.migrate()
        big, small = ledger.create_account("big"), ledger.create_account("small")
        people = [ledger.create_contact(big.id, external_id=f"c{i}").id for i in range(contacts)]
        ana = ledger.create_contact(small.id, external_id="ana").id
        rnd = random.Random(1)
        console.print(f"{backend}: storing {events:,} events over {contacts:,} contacts")
        for _ in range(events // BATCH):
            ledger.emit_many([
                EmitEvent(account_id=big.id, contact_id=rnd.choice(people),
                          metric_name=rnd.choice(METRICS), source="bench",
                          value=Decimal(rnd.randrange(100_000)) / 100,
                          occurred_at=T0 + timedelta(minutes=rnd.randrange(100_000)),
                          properties={"order_id": str(rnd.randrange(10**9)), "pad": "x" * 200})
                for _ in range(BATCH)
            ])  # fmt: skip
        raw(url, "UPDATE contact_metrics_summary SET event_count = event_count + 1 "
            "WHERE account_id = ?", (str(big.id),))  # fmt: skip
        raw(url, "ANALYZE")
        writers = [
            Writer("another account", small.id, ana, [], threading.Event()),
            Writer("the same account, first chunk", big.id, people[0], [], threading.Event()),
        ]
        for w in writers:
            w.start(ledger)
        time.sleep(BASELINE_SECONDS)
        console.print(f"{backend}: rebuilding, two writers running")
        began = time.perf_counter()
        marks = [(0, began)]  # contacts done, and when, at the end of each chunk
        [report] = ledger.rebuild_summaries(
            big.id, lambda done, _: marks.append((done, time.perf_counter()))
        )
        ended = time.perf_counter()
        time.sleep(BASELINE_SECONDS)  # a call the rebuild held up ends after it
        for w in writers:
            w.join()
        if summaries(url, big.id) != group_by(url, big.id):
            raise SystemExit(f"MISMATCH {backend}: summaries differ from the events")
        return Result(
            backend, events, contacts, ended - began,
            # a chunk that found no contacts (the last look, when they divide evenly) is
            # a transaction too, but not a chunk to report
            [b - a for (n, a), (m, b) in itertools.pairwise(marks) if m > n], report.drift,
            [(w.label, [b - a for a, b in w.calls if b < began],
              [b - a for a, b in w.calls if b >= began and a <= ended])
             for w in writers],
        )  # fmt: skip


def ms(values: list[float], pick: str) -> str:
    if not values:
        return "—"
    value = statistics.median(values) if pick == "median" else max(values)
    return f"{value * 1000:,.1f}"


def print_results(results: list[Result]) -> None:
    table = Table(title="rebuild_summaries while two writers call emit_event")
    for column in ("backend", "writer", "calls before", "median ms before", "calls during",
                   "median ms during", "max ms during"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("backend", "writer") else "right")
    for r in results:
        for label, before, during in r.writers:
            table.add_row(r.backend, label, f"{len(before):,}", ms(before, "median"),
                          f"{len(during):,}", ms(during, "median"), ms(during, "max"))  # fmt: skip
    out = Console()
    if not out.is_terminal:
        out = Console(width=140)  # not 80: the table fits without wrapping
    out.print(table)
    for r in results:
        out.print(f"{r.backend}: the rebuild of {r.events:,} events over {r.contacts:,} "
                  f"contacts took {r.seconds:.2f} s in {len(r.chunks)} chunks (longest "
                  f"{ms(r.chunks, 'max')} ms, median {ms(r.chunks, 'median')}) and fixed "
                  f"{r.fixed:,} rows")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="20,000 events, 200 contacts")
    parser.add_argument("--events", type=int, help="events of the rebuilt account (200,000)")
    parser.add_argument("--contacts", type=int, help="its contacts (2,000)")
    parser.add_argument("--backend", choices=("postgresql", "sqlite", "both"), default="both")
    args = parser.parse_args(argv)
    events = args.events or (20_000 if args.quick else 200_000)
    contacts = args.contacts or (200 if args.quick else 2_000)
    if events < BATCH or contacts < 1:
        parser.error(f"--events must be at least {BATCH:,} and --contacts at least 1")
    backends = ["postgresql", "sqlite"] if args.backend == "both" else [args.backend]
    try:
        results = [run(b, events, contacts) for b in backends]
    except psycopg.OperationalError as exc:
        console.print(f"[bold red]PostgreSQL failed[/bold red] (see SINAL_BENCH_PG): {exc}")
        return 2
    print_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
