"""Dispatch: sinal's automation workers against procrastinate's, on the same PostgreSQL.

Run from the project root (procrastinate comes with the `bench` extra):

    .venv/bin/python bench/dispatch.py [--quick] [--json] [--pg postgresql://user@host:port]
    .venv/bin/python bench/dispatch.py --one-worker [--seconds 20]  # sinal, 1 worker, lag only

Each system gets a fresh database of its own on the same server and runs the same work:
one no-op unit per input, done by `sinal worker` / procrastinate worker *processes*.

- sinal: an event of metric "Bench Ping" triggers one automation whose single step is a
  `filter` that always holds. It does nothing outside, so it matches the peer's no-op job,
  yet it goes through the whole protocol: outbox fan-out, claim, the step's 'started'
  record committed before it runs, 'completed' and the execution settled.
- procrastinate: an async task whose body is `pass`, deferred with `batch_defer`.

Measured, for 1 and 4 worker processes (each with concurrency 8, threads for sinal and
asyncio for procrastinate):

- throughput: N inputs committed at once while the workers listen; units done divided by
  the span from the first unit's start to the last one's end (database timestamps);
- lag at a steady offered load (1,000 inputs/s for 20 s): from the input's commit to the
  start of its unit (sinal: `events.received_at` → step 0's `execution_steps.started_at`;
  procrastinate: its 'deferred' event → its 'started' event), p50 / p99 / max.

Targets: lag p99 < 1 s at 1,000 events/s with 4 workers; sinal's executions/s at least the
peer's jobs/s with 1 and with 4 workers. See bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.table import Table

from sinal import EmitEvent, connect

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"
CONCURRENCY = 32  # per worker process, both systems (sinal's default; --concurrency)
CONTACTS = 100
METRIC = "Bench Ping"
RATE = 1_000  # inputs/s offered in the lag runs
TICKS = 50  # producer batches per second (20 inputs each at 1,000/s)
PRODUCERS = 4  # threads committing those batches
# drain: seconds a lag run waits, after the load, for the backlog (what is not done by then
# is left out of the percentiles and shows in "done / offered")
FULL = {"throughput": 10_000, "lag_seconds": 20.0, "lag_workers": (1, 4), "drain": 60.0}
QUICK = {"throughput": 600, "lag_seconds": 3.0, "lag_workers": (4,), "drain": 6.0}
# the workers' PostgreSQL sessions say so (PGAPPNAME), for their backends' CPU time
WORKER_APP = "sinal-dbench-worker"
console = Console(stderr=True, soft_wrap=True)  # progress; stdout holds only the results


@dataclass
class Throughput:
    """One throughput run."""

    workers: int
    units: int
    seconds: float

    @property
    def per_second(self) -> float:
        """Units done per second of the busy span."""
        return self.units / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Lag:
    """One steady-load run: what was offered and how late the units started."""

    workers: int
    offered: int
    offered_rate: float
    done: int
    p50: float
    p99: float
    max: float
    # CPU seconds over the run (from the load's start to the drain's end, read from /proc:
    # the server must run on this host) of the worker processes and of their backends
    worker_cpu: float = float("nan")
    db_cpu: float = float("nan")


# -- the two systems -----------------------------------------------------------------------


class System(ABC):
    """A task system under test: its database, its workers and its producer."""

    name: str
    unit: str  # what one run of the no-op is called
    tag: str  # its database's suffix

    def __init__(self, base_url: str, logs: Path, concurrency: int) -> None:
        self.db = f"sinal_dbench_{os.getpid()}_{self.tag}"
        self.concurrency = concurrency
        self.base_url = base_url
        self.url = f"{base_url}/{self.db}"
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        with psycopg.connect(f"{base_url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{self.db}"')
        try:
            self.setup()
        except BaseException:  # no database left behind
            self._drop_database()
            raise

    @abstractmethod
    def setup(self) -> None:
        """Prepare the new database: schema, and whatever the producer needs."""

    def drop(self) -> None:
        """Stop the workers and drop the database."""
        self.stop_workers()
        self.close()
        self._drop_database()

    def _drop_database(self) -> None:
        with psycopg.connect(f"{self.base_url}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')

    def query(self, statement: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of one statement on this system's database (none for a command)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(statement.encode(), params)
            return cur.fetchall() if cur.description else []

    def start_workers(self, n: int) -> None:
        """Start `n` worker processes and wait until each listens for work."""
        for i in range(n):
            log = (self.logs / f"{self.name}-{len(self.procs)}-{i}.log").open("wb")
            proc = subprocess.Popen(
                self.worker_command(),
                env={**os.environ, **self.worker_env(), "PGAPPNAME": WORKER_APP},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            self.procs.append(proc)
        deadline = time.monotonic() + 60
        while self.listeners() < n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"{self.name} workers did not start; see {self.logs}")
            time.sleep(0.1)

    def listeners(self) -> int:
        """Sessions on this database that LISTEN (one per ready worker)."""
        rows = self.query(
            "SELECT count(DISTINCT pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query ILIKE 'listen%%'"
        )
        return int(rows[0][0])

    def stop_workers(self) -> None:
        """SIGTERM the workers; SIGKILL what has not stopped after 20 s."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def wait_done(self, expected: int, timeout: float) -> int:
        """Wait until `expected` units are done (or the timeout); how many are."""
        deadline = time.monotonic() + timeout
        done = self.done()
        while done < expected and time.monotonic() < deadline:
            time.sleep(0.2)
            done = self.done()
        return done

    def throughput(self, workers: int, n: int) -> Throughput:
        """N inputs at once, `workers` processes listening: units per busy second."""
        self.reset()
        self.start_workers(workers)
        try:
            self.offer(n)
            done = self.wait_done(n, timeout=30 + n / 50)
        finally:
            self.stop_workers()
        first, last = self.span()
        return Throughput(workers, done, last - first)

    def lag(self, workers: int, seconds: float, drain: float) -> Lag:
        """A steady `RATE`/s for `seconds`; then drain and read each unit's lag."""
        self.reset()
        self.start_workers(workers)
        try:
            before = self.cpu()
            offered, elapsed = steady(self.offer, RATE, seconds)
            self.wait_done(offered, timeout=drain)
            after = self.cpu()
        finally:
            self.stop_workers()
        lags = sorted(self.lags())
        return Lag(
            workers, offered, offered / elapsed, len(lags),
            percentile(lags, 0.50), percentile(lags, 0.99), lags[-1] if lags else float("nan"),
            *(sum(after[k].values()) - sum(before[k].get(pid, 0.0) for pid in after[k])
              for k in ("workers", "backends")),
        )  # fmt: skip

    def cpu(self) -> dict[str, dict[int, float]]:
        """CPU seconds so far of each worker process and each of their backends, by pid."""
        backends = self.query(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            WORKER_APP,
        )
        return {
            "workers": {p.pid: cpu_seconds(p.pid) for p in self.procs},
            "backends": {pid: cpu_seconds(pid) for (pid,) in backends},
        }

    @abstractmethod
    def worker_command(self) -> list[str]:
        """The command line of one worker process."""

    def worker_env(self) -> dict[str, str]:
        """Environment added for the workers."""
        return {}

    @abstractmethod
    def reset(self) -> None:
        """Empty the work tables."""

    @abstractmethod
    def offer(self, n: int) -> None:
        """Commit `n` inputs (in batches of at most 500)."""

    @abstractmethod
    def done(self) -> int:
        """Units done so far."""

    @abstractmethod
    def span(self) -> tuple[float, float]:
        """Epoch seconds of the first unit's start and the last unit's end."""

    @abstractmethod
    def lags(self) -> list[float]:
        """Seconds from each input's commit to its unit's start."""

    @abstractmethod
    def close(self) -> None:
        """Release the producer's connections."""


class SinalSystem(System):
    """`sinal worker` processes; inputs are events recorded by `Ledger.emit_many`."""

    name = "sinal"
    unit = "executions"
    tag = "sinal"

    def setup(self) -> None:
        """Migrate; an account, its contacts, and the automation that listens."""
        from sinal.automations.service import Automations  # imports httpx: see main()

        self.ledger = connect(self.url)
        self.ledger.migrate()
        self.account = self.ledger.create_account("Bench")
        self.contacts = [
            self.ledger.create_contact(self.account.id, phone=f"+55 11 9{7100_0000 + i:08d}")
            for i in range(CONTACTS)
        ]
        Automations(self.ledger).create(self.account.id, {
            "name": "no-op", "trigger_metric": METRIC,
            "steps": [{"type": "filter",
                       "conditions": [{"field": "source", "op": "eq", "value": "bench"}]}],
        })  # fmt: skip
        self.sequence = itertools.count(1)  # source ids; next() is atomic under the GIL

    def worker_command(self) -> list[str]:
        """`sinal worker`."""
        return [sys.executable, "-m", "sinal", "worker"]

    def worker_env(self) -> dict[str, str]:
        """The database, quiet logs, the concurrency."""
        return {
            "SINAL_DATABASE_URL": self.url,
            "SINAL_LOG_LEVEL": "warning",
            "SINAL_WORKER_CONCURRENCY": str(self.concurrency),
        }

    def reset(self) -> None:
        """Empty outbox, events, executions and their steps."""
        self.query("TRUNCATE outbox, execution_steps, executions, contact_metrics_summary, events")

    def offer(self, n: int) -> None:
        """Record `n` events."""
        for start in range(0, n, 500):
            batch = []
            for _ in range(min(500, n - start)):
                number = next(self.sequence)
                contact = self.contacts[number % CONTACTS]
                batch.append(EmitEvent(account_id=self.account.id, contact_id=contact.id,
                                       metric_name=METRIC, source="bench",
                                       source_id=str(number)))  # fmt: skip
            self.ledger.emit_many(batch)

    def done(self) -> int:
        """Completed executions."""
        return int(self.query("SELECT count(*) FROM executions WHERE status = 'completed'")[0][0])

    def span(self) -> tuple[float, float]:
        """First step start, last step end."""
        [(first, last)] = self.query(
            "SELECT extract(epoch FROM min(started_at))::float8, "
            "extract(epoch FROM max(finished_at))::float8 FROM execution_steps"
        )
        return first or 0.0, last or 0.0

    def lags(self) -> list[float]:
        """Event received (committed right after) → step 0 started."""
        rows = self.query(
            "SELECT extract(epoch FROM s.started_at - e.received_at)::float8 "
            "FROM execution_steps s "
            "JOIN executions x ON x.account_id = s.account_id AND x.id = s.execution_id "
            "JOIN events e ON e.account_id = x.account_id AND e.id = x.event_id "
            "WHERE s.step_index = 0"
        )
        return [r[0] for r in rows]

    def close(self) -> None:
        """Close the ledger."""
        self.ledger.close()


class PeerSystem(System):
    """procrastinate worker processes; inputs are no-op jobs deferred with `batch_defer`."""

    name = "procrastinate"
    unit = "jobs"
    tag = "peer"

    def setup(self) -> None:
        """procrastinate's schema."""
        self.app = peer_app(self.url)
        self.app.open()
        self.app.schema_manager.apply_schema()

    def worker_command(self) -> list[str]:
        """This script, as a procrastinate worker."""
        return [sys.executable, __file__, "--peer-worker", self.url,
                "--concurrency", str(self.concurrency)]  # fmt: skip

    def reset(self) -> None:
        """Empty the jobs and their events."""
        self.query("TRUNCATE procrastinate_events, procrastinate_jobs CASCADE")

    def offer(self, n: int) -> None:
        """Defer `n` no-op jobs."""
        task = self.app.tasks["noop"]
        for start in range(0, n, 500):
            task.batch_defer(*({} for _ in range(min(500, n - start))))

    def done(self) -> int:
        """Succeeded jobs."""
        rows = self.query("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        return int(rows[0][0])

    def span(self) -> tuple[float, float]:
        """First 'started' event, last 'succeeded' one."""
        [(first, last)] = self.query(
            "SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started'))::float8, "
            "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded'))::float8 "
            "FROM procrastinate_events"
        )
        return first or 0.0, last or 0.0

    def lags(self) -> list[float]:
        """'deferred' (committed with the job) → 'started'."""
        rows = self.query(
            "SELECT extract(epoch FROM s.at - d.at)::float8 FROM procrastinate_events d "
            "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
            "WHERE d.type = 'deferred'"
        )
        return [r[0] for r in rows]

    def close(self) -> None:
        """Close the app's connections."""
        self.app.close()


def peer_app(url: str) -> Any:
    """A procrastinate app on `url` with one task, `noop`, that does nothing."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    # untyped where the `bench` extra is not installed (`make test` type-checks without it)
    @app.task(name="noop")  # type: ignore[untyped-decorator,unused-ignore]
    async def noop() -> None:
        """Nothing: the peer's unit of work."""

    return app


def run_peer_worker(url: str, concurrency: int) -> None:
    """One procrastinate worker process (this script with --peer-worker)."""
    logging.basicConfig(level=logging.WARNING)
    peer_app(url).run_worker(concurrency=concurrency, listen_notify=True)


# -- load and statistics -------------------------------------------------------------------


def steady(offer: Callable[[int], None], rate: int, seconds: float) -> tuple[int, float]:
    """Offer `rate` inputs per second for `seconds`, in `TICKS` batches a second on an
    absolute schedule, each batch on one of `PRODUCERS` threads (open loop: a slow commit
    does not hold the next batch back); (offered, seconds until all were committed)."""
    per_tick = rate // TICKS
    ticks = int(seconds * TICKS)
    with ThreadPoolExecutor(PRODUCERS, thread_name_prefix="producer") as producers:
        start = time.monotonic()
        batches = []
        for tick in range(ticks):
            pause = start + tick / TICKS - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            batches.append(producers.submit(offer, per_tick))
        for batch in batches:
            batch.result()
        elapsed = time.monotonic() - start
    return per_tick * ticks, elapsed


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process of this host so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after the command, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile of sorted `values` (nearest rank); NaN when empty."""
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(q * len(values)) - 1))]


# -- the run -------------------------------------------------------------------------------


@dataclass
class Report:
    """Everything one run measured."""

    throughput: dict[str, list[Throughput]]
    lag: dict[str, list[Lag]]

    def targets(self) -> dict[str, bool]:
        """Whether each target holds."""
        sinal_4 = [lag for lag in self.lag["sinal"] if lag.workers == 4]
        ours = {t.workers: t.per_second for t in self.throughput["sinal"]}
        peer = {t.workers: t.per_second for t in self.throughput["procrastinate"]}
        return {
            "lag_p99_under_1s_at_1000_per_s": bool(sinal_4)
            and all(
                lag.p99 < 1.0 and lag.done == lag.offered and lag.offered_rate >= 0.95 * RATE
                for lag in sinal_4
            ),
            **{f"throughput_at_least_peer_{w}_workers": ours[w] >= peer[w] for w in ours},
        }

    def as_json(self) -> dict[str, Any]:
        """The figures as plain data."""
        return {
            "throughput_per_s": {
                name: {str(t.workers): round(t.per_second, 1) for t in runs}
                for name, runs in self.throughput.items()
            },
            "lag": {name: [asdict(lag) for lag in runs] for name, runs in self.lag.items()},
            "targets": self.targets(),
        }


def run(base_url: str, sizes: dict[str, Any], concurrency: int) -> Report:
    """Measure both systems, one after the other, on the same server."""
    report = Report({}, {})
    with tempfile.TemporaryDirectory(prefix="sinal-dbench-") as tmp:
        for make in (SinalSystem, PeerSystem):
            system = make(base_url, Path(tmp), concurrency)
            try:
                runs = report.throughput.setdefault(system.name, [])
                for workers in (1, 4):
                    runs.append(system.throughput(workers, sizes["throughput"]))
                    console.print(f"{system.name}: {runs[-1]}, {runs[-1].per_second:,.0f}/s")
                lags = report.lag.setdefault(system.name, [])
                for workers in sizes["lag_workers"]:
                    lags.append(system.lag(workers, sizes["lag_seconds"], sizes["drain"]))
                    console.print(f"{system.name}: {lags[-1]}")
            finally:
                system.drop()
    return report


def run_one_worker(base_url: str, sizes: dict[str, Any], concurrency: int) -> Lag:
    """Only sinal's lag run with one worker (`--one-worker`)."""
    with tempfile.TemporaryDirectory(prefix="sinal-dbench-") as tmp:
        system = SinalSystem(base_url, Path(tmp), concurrency)
        try:
            return system.lag(1, sizes["lag_seconds"], sizes["drain"])
        finally:
            system.drop()


def show_one_worker(lag: Lag, seconds: float) -> None:
    """The one-worker run's line: its lag, and CPU per execution done."""
    per = 1e6 / lag.done if lag.done else float("nan")
    Console(width=110).print(
        f"sinal, 1 worker, {lag.offered_rate:,.0f}/s offered for {seconds:.0f} s: lag p50 "
        f"{lag.p50 * 1000:,.0f} ms, p99 {lag.p99 * 1000:,.0f} ms, max {lag.max * 1000:,.0f} ms; "
        f"{lag.done:,} / {lag.offered:,} done; CPU per execution: worker "
        f"{lag.worker_cpu * per:,.0f} µs, its PostgreSQL backends {lag.db_cpu * per:,.0f} µs"
    )


def show(report: Report, sizes: dict[str, Any], concurrency: int) -> None:
    """The results as a table, and the targets."""
    table = Table(title=f"Dispatch on PostgreSQL (worker processes × {concurrency} concurrency)")
    table.add_column("system")
    table.add_column("workers", justify="right")
    table.add_column("units/s", justify="right")
    table.add_column(f"lag p50 @ {RATE}/s", justify="right")
    table.add_column("lag p99", justify="right")
    table.add_column("lag max", justify="right")
    table.add_column("offered/s", justify="right")
    table.add_column("done / offered", justify="right")
    for name, runs in report.throughput.items():
        lags = {lag.workers: lag for lag in report.lag.get(name, [])}
        for t in runs:
            lag = lags.get(t.workers)
            cells = (
                [f"{lag.p50 * 1000:,.0f} ms", f"{lag.p99 * 1000:,.0f} ms",
                 f"{lag.max * 1000:,.0f} ms", f"{lag.offered_rate:,.0f}",
                 f"{lag.done:,} / {lag.offered:,}"]
                if lag else ["—"] * 5
            )  # fmt: skip
            table.add_row(name, str(t.workers), f"{t.per_second:,.0f}", *cells)
    out = Console(width=110)
    out.print(table)
    out.print(
        f"throughput: {sizes['throughput']:,} inputs at once; lag: {RATE:,}/s offered for "
        f"{sizes['lag_seconds']:.0f} s; units: sinal executions, procrastinate jobs"
    )
    for target, holds in report.targets().items():
        out.print(f"{'✔' if holds else '✘'} {target}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    parser.add_argument("--json", action="store_true", help="print only the figures, as JSON")
    parser.add_argument("--pg", default=DEFAULT_PG, help=f"server URL (default {DEFAULT_PG})")
    parser.add_argument(
        "--concurrency", type=int, default=CONCURRENCY,
        help=f"executions / jobs each worker process runs at once (default {CONCURRENCY})",
    )  # fmt: skip
    parser.add_argument(
        "--one-worker", action="store_true",
        help="only sinal's lag run with 1 worker, and its CPU per execution",
    )  # fmt: skip
    parser.add_argument(
        "--seconds", type=float, help="seconds of load in the lag runs (default 20; --quick 3)"
    )
    parser.add_argument("--peer-worker", metavar="URL", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; 0 when the targets hold, 1 otherwise, 2 without procrastinate."""
    args = parse_args(argv)
    # procrastinate warns that the app lives in __main__: on purpose, one file is the bench
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    # This folder holds http.py (the HTTP benchmark), which would shadow the standard
    # library's `http` for httpx: Python puts a script's folder first on the path.
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    if args.peer_worker:
        run_peer_worker(args.peer_worker, args.concurrency)
        return 0
    if importlib.util.find_spec("procrastinate") is None:  # needed after sinal's half
        print(
            "bench/dispatch.py needs the peer, procrastinate: .venv/bin/pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 2
    sizes: dict[str, Any] = {**(QUICK if args.quick else FULL)}
    if args.seconds:
        sizes["lag_seconds"] = args.seconds
    if args.one_worker:
        lag = run_one_worker(args.pg.rstrip("/"), sizes, args.concurrency)
        if args.json:
            print(json.dumps(asdict(lag), indent=2))
        else:
            show_one_worker(lag, sizes["lag_seconds"])
        return 0
    report = run(args.pg.rstrip("/"), sizes, args.concurrency)
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        show(report, sizes, args.concurrency)
    return 0 if all(report.targets().values()) else 1


if __name__ == "__main__":
    sys.exit(main())
