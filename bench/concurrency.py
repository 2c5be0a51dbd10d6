"""Concurrent ingest: `emit_event` from many processes at once, on PostgreSQL.

Run from the project root:

    .venv/bin/python bench/concurrency.py [--quick] [--json] [--processes N] [--events N]
                                         [--repeat R]

On a fresh database holding another tenant's events (bench/ingest.py's), N processes
share the generated events (~20% repeat an earlier one, maybe another process's) and
store them one per transaction, three ways, in rounds (the order alternates):

- `INSERT ×1/tx`: one INSERT ... ON CONFLICT DO NOTHING per event, on a plain connection:
  the ceiling for anything that commits every event;
- `emit_event, all notify`: the ledger with the `outbox_wake` flag up and no worker, so
  every transaction that stores an event sends a NOTIFY (sinal before migration 0014);
- `emit_event + worker`: the ledger while a worker (`sinal worker`, one more process)
  waits for NOTIFY and fans the outbox out, arming the flag before it waits.

Each run is checked afterwards (events, summaries, outbox; the worker must empty the
outbox); a mismatch is printed and the script exits with status 1. NOTIFYs are counted
by a session listening on the outbox's channel. See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from ingest import (
    DEFAULT_PG,
    EVENT_COLUMNS,
    HISTORY,
    SEED,
    Input,
    Mismatch,
    PostgresBench,
    console,
    failed,
    generate,
    pg_row,
)
from sinal.ledger import connect
from sinal.store.postgres import PostgresStore

# A repeated input carries its first row's id: two processes inserting it at once collide
# on the primary key as well as on the dedup key, and a conflict target naming only the
# latter (`bench/ingest.py`'s statement, run by one process) lets the former raise.
INSERT = (
    f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ({', '.join(['%s'] * 18)}) ON CONFLICT DO NOTHING"
)
FULL = (8, 6_000)  # (processes, events)
QUICK = (4, 1_200)


@dataclass(frozen=True, slots=True)
class Method:
    key: str  # the --json name
    label: str
    ledger: bool  # through the ledger (summaries and outbox checked too)
    worker: bool = False  # a worker runs meanwhile


METHODS = (
    Method("insert_each", "INSERT ×1/tx", ledger=False),
    Method("emit_event_all_notify", "emit_event, all notify", ledger=True),
    Method("emit_event_worker", "emit_event + worker", ledger=True, worker=True),
)


def run_process(key: str, url: str, inputs: Sequence[Input], signals: tuple[Any, ...]) -> None:
    """One process's share of a run: connect, say so on `ready`, wait for `go`, store
    `inputs`, put on `done` when it finished (the monotonic clock, which the processes of
    one machine share) or what went wrong."""
    ready, go, done = signals
    try:
        if key == "insert_each":
            with psycopg.connect(url, autocommit=True) as conn:
                ready.put(os.getpid())
                go.wait()
                for item in inputs:
                    conn.execute(INSERT, pg_row(item.row, item.row.metric_id))
                done.put(time.monotonic())
            return
        ledger = connect(url)
        ledger.emit_event(**inputs[0].params)  # the pool's connection and prepared statement
        ready.put(os.getpid())
        go.wait()
        for item in inputs[1:]:
            ledger.emit_event(**item.params)
        done.put(time.monotonic())
        ledger.close()
    except BaseException:
        done.put(traceback.format_exc())
        raise


def shares(inputs: Sequence[Input], n: int) -> list[list[Input]]:
    """`inputs` dealt round-robin to `n` processes."""
    return [list(inputs[i::n]) for i in range(n)]


def timed_run(bench: PostgresBench, method: Method, processes: int) -> tuple[float, int]:
    """One run of `method` from empty tables: events/s, and the NOTIFYs heard."""
    bench.reset()
    store = bench.ledger.store
    assert isinstance(store, PostgresStore)
    store.arm_outbox()  # as migrated: up until a worker lowers it
    inputs = bench.workload.inputs
    ctx = mp.get_context("spawn")
    ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    parts = shares(inputs, processes)
    workers = [
        ctx.Process(target=run_process, args=(method.key, bench.url, part, (ready, go, done)))
        for part in parts
    ]
    worker = start_worker(bench.url) if method.worker else None
    with psycopg.connect(bench.url, autocommit=True) as listener:
        listener.execute("LISTEN sinal_outbox")
        listener.execute("LISTEN sinal_bench_end")
        for w in workers:
            w.start()
        for _ in workers:
            ready.get(timeout=60)
        gc.collect()
        started = time.monotonic()
        go.set()
        for w in workers:  # what they put on `done` is small: it never holds them up
            w.join(timeout=600)
        finished = [done.get(timeout=1) for _ in range(done.qsize())]
        errors = [f for f in finished if isinstance(f, str)]
        if errors or len(finished) < len(workers):
            codes = [w.exitcode for w in workers]
            raise Mismatch(f"writing processes failed (exit codes {codes}):\n{''.join(errors)}")
        ended = max(finished)
        heard = _notifications(listener, bench.url)
    if worker is not None:
        _wait_for(lambda: bench.count("outbox") == 0, timeout=60)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    _verify(bench, method, processes)
    timed = len(inputs) - (processes if method.ledger else 0)  # one each before the start
    return timed / (ended - started), heard


def start_worker(url: str) -> subprocess.Popen[bytes]:
    """`sinal worker` on `url`, once it listens for NOTIFY."""
    env = {**os.environ, "SINAL_DATABASE_URL": url, "SINAL_LOG_LEVEL": "warning"}
    worker = subprocess.Popen([sys.executable, "-m", "sinal", "worker"], env=env)
    with psycopg.connect(url, autocommit=True) as conn:
        _wait_for(lambda: _listening(conn) > 0 or worker.poll() is not None, timeout=60)
        if _listening(conn) == 0:
            worker.kill()
            raise Mismatch("the worker did not start listening")
    return worker


def _listening(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query ILIKE 'listen sinal_executions'"
    ).fetchone()
    return int(row[0]) if row else 0


def _notifications(listener: psycopg.Connection[Any], url: str) -> int:
    """NOTIFYs on "sinal_outbox" heard so far: PostgreSQL delivers in commit order, so all
    of them arrive before a marker sent now."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("NOTIFY sinal_bench_end")
    for heard, notice in enumerate(listener.notifies(timeout=30)):
        if notice.channel == "sinal_bench_end":
            return heard
    raise Mismatch("the NOTIFY marking the end of the run never arrived")


def _wait_for(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def _verify(bench: PostgresBench, method: Method, processes: int) -> None:
    distinct = bench.workload.expected(len(bench.workload.inputs))
    checks = [("events stored", bench.count("events"), distinct)]
    if method.ledger:
        checks += [
            ("summary event_count", bench.summary_total(), distinct),
            ("outbox rows", bench.count("outbox"), 0 if method.worker else distinct),
        ]
    wrong = [f"{what}: {got} (expected {want})" for what, got, want in checks if got != want]
    if wrong:
        raise Mismatch(f"{method.label}, {processes} processes: {'; '.join(wrong)}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (< 1 min)")
    parser.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    parser.add_argument("--processes", type=int, help="writing processes (default 8, quick 4)")
    parser.add_argument("--events", type=int, help="events per run (default 6,000)")
    parser.add_argument("--repeat", type=int, help="rounds; medians kept (default 3, quick 1)")
    args = parser.parse_args(argv)
    processes, events = QUICK if args.quick else FULL
    args.processes = args.processes or processes
    args.events = args.events or events
    args.repeat = args.repeat or (1 if args.quick else 3)
    if min(args.processes, args.events, args.repeat) < 1 or args.events < 2 * args.processes:
        parser.error("counts must be positive, with at least 2 events per process")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workload = generate(args.events)
    history = generate(HISTORY * args.events, seed=SEED + 1)
    gc.collect()
    gc.freeze()
    console.print(
        f"{args.events:,} events ({workload.expected(args.events):,} distinct) from "
        f"{args.processes} processes, {args.repeat} round(s); {os.cpu_count()} cores"
    )
    rates: dict[str, list[float]] = {m.key: [] for m in METHODS}
    heard: dict[str, list[int]] = {m.key: [] for m in METHODS}
    base = os.environ.get("SINAL_BENCH_PG", DEFAULT_PG)
    try:
        with PostgresBench(workload, history, base) as bench:
            for round_ in range(1, args.repeat + 1):
                order = METHODS if round_ % 2 else tuple(reversed(METHODS))
                for method in order:
                    rate, notified = timed_run(bench, method, args.processes)
                    rates[method.key].append(rate)
                    heard[method.key].append(notified)
                    console.print(
                        f"round {round_}/{args.repeat} {method.label:<24} {rate:>9,.0f} events/s"
                        f" {notified:>6,} NOTIFYs (load {os.getloadavg()[0]:.2f})"
                    )
    except (Mismatch, psycopg.OperationalError) as exc:
        return failed(exc)
    medians = {key: statistics.median(values) for key, values in rates.items()}
    if args.json:
        sys.stdout.write(json.dumps({"postgresql": medians, "processes": args.processes}) + "\n")
        return 0
    table = Table(title=f"postgresql: {args.processes} processes, one event per transaction")
    distinct = workload.expected(args.events)
    for column in ("method", "events/s", "× INSERT", "NOTIFYs per 1,000 stored"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for m in METHODS:
        per_thousand = statistics.median(heard[m.key]) * 1000 / distinct
        table.add_row(
            m.label,
            f"{medians[m.key]:,.0f}",
            f"{medians[m.key] / medians['insert_each']:.2f}",
            f"{per_thousand:,.0f}" if m.ledger else "—",
        )
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
