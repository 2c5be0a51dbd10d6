"""Prometheus metrics of the automation workers: what a worker did (counters, step
durations) and what waits for the workers (gauges read from the database at each scrape).

A worker counts into the registry it is given: `sinal serve` passes its app's, so /metrics
shows its worker's figures; `sinal worker` serves its own on SINAL_WORKER_METRICS_PORT.
Counters from many processes add up under a `PROMETHEUS_MULTIPROC_DIR`, as the server's do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import start_http_server

from sinal.errors import ConfigurationError, StoreError
from sinal.store.automations import Backlog

log = logging.getLogger("sinal.worker")

# Seconds: a step is a database write (tags, conversations) or an HTTP call (sends, AI,
# webhooks) that may run up to the HTTP timeout several times over.
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class WorkerMetrics:
    """The collectors a dispatcher counts into, in `registry` (default: one of its own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.fanned_out = Counter(
            "sinal_worker_events_fanned_out",
            "Outbox rows a worker turned into executions (none, when no automation listens).",
            registry=r,
        )
        self.executions_created = Counter(
            "sinal_worker_executions_created",
            "Executions created by fan-out.",
            registry=r,
        )
        self.claimed = Counter(
            "sinal_worker_executions_claimed",
            "Executions a worker claimed to run (a waiting or retried one, again each time).",
            registry=r,
        )
        self.steps = Counter(
            "sinal_worker_steps",
            "Steps run, by step type and recorded status (completed, failed, unknown).",
            ["type", "status"],
            registry=r,
        )
        self.step_seconds = Histogram(
            "sinal_worker_step_duration_seconds",
            "Time from a step's start to its recorded outcome, by step type.",
            ["type"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.settled = Counter(
            "sinal_worker_executions_settled",
            "Executions a worker left, by the status it left them in (completed, waiting, "
            "stopped, pending: a retry is due later, unknown, dead).",
            ["status"],
            registry=r,
        )
        self.lost = Counter(
            "sinal_worker_claims_lost",
            "Executions whose claim a worker found taken over when it recorded a step (its "
            "lease had expired; another worker resumes them).",
            registry=r,
        )
        self.stuck = Counter(
            "sinal_worker_steps_stuck",
            "Steps that ran past the lease plus five HTTP timeouts: their claims were left "
            "to expire.",
            registry=r,
        )
        self.errors = Counter(
            "sinal_worker_errors",
            "Failures a worker logged and went on from: `database` (unreachable, retried), "
            "`unexpected` (a bug; the execution's lease runs out and it is retried).",
            ["kind"],
            registry=r,
        )
        self.housekeeping_failures = Counter(
            "sinal_worker_housekeeping_failures",
            "Housekeeping tasks (abandoned checkouts, …) that failed; each runs again next pass.",
            registry=r,
        )
        self.pruned = Counter(
            "sinal_worker_rows_pruned",
            "Rows housekeeping deleted once past their retention (SINAL_*_RETENTION_DAYS), by "
            "table: rejections, webhook_deliveries, executions (each with its steps).",
            ["table"],
            registry=r,
        )
        self.listening = Gauge(
            "sinal_worker_listening",
            "1 while a worker's LISTEN connection is up (PostgreSQL): writers' NOTIFY wakes "
            "it. 0 while it only polls: the connection failed, or the store is SQLite.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.listener_outages = Counter(
            "sinal_worker_listener_outages",
            "Times a worker's LISTEN connection failed or could not be made (once an outage, "
            "however many attempts it takes to connect again); it polls meanwhile.",
            registry=r,
        )
        self.running = Gauge(
            "sinal_worker_executions_in_hand",
            "Executions a worker holds: running, or claimed and waiting for a thread.",
            registry=r,
            multiprocess_mode="livesum",
        )
        # Labelled children, looked up once: `labels()` takes a lock and builds a tuple.
        self._counters: dict[tuple[object, ...], Counter] = {}
        self._durations: dict[str, Histogram] = {}

    def step(self, step_type: str, status: str, seconds: float) -> None:
        """Count one step outcome and its duration."""
        self._counter(self.steps, step_type, status).inc()
        histogram = self._durations.get(step_type)
        if histogram is None:
            histogram = self._durations[step_type] = self.step_seconds.labels(step_type)
        histogram.observe(seconds)

    def settle(self, status: str) -> None:
        """Count one execution left in `status`."""
        self._counter(self.settled, status).inc()

    def prune(self, table: str, n: int) -> None:
        """Count `n` rows of `table` deleted past their retention."""
        self._counter(self.pruned, table).inc(n)

    def listener(self, up: bool) -> None:
        """The worker's LISTEN connection went up, or down (one outage)."""
        self.listening.set(1 if up else 0)
        if not up:
            self.listener_outages.inc()

    def error(self, kind: str) -> None:
        """Count one failure of `kind` (database, unexpected)."""
        self._counter(self.errors, kind).inc()

    def _counter(self, parent: Counter, *labels: str) -> Counter:
        key = (parent, *labels)
        child = self._counters.get(key)
        if child is None:
            child = self._counters[key] = parent.labels(*labels)
        return child


class BacklogCollector:
    """What waits for the workers, read with `read` at each scrape; nothing while the
    database cannot be reached (a scrape must not fail for it)."""

    def __init__(self, read: Callable[[], Backlog]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        try:
            b = self.read()
        except StoreError as exc:
            log.debug("backlog gauges left out: %s", exc)
            return
        yield GaugeMetricFamily(
            "sinal_outbox_rows",
            "Stored events waiting for a worker to fan them out.",
            value=b.outbox_rows,
        )
        yield GaugeMetricFamily(
            "sinal_outbox_oldest_seconds",
            "How long the oldest outbox row has waited (0 when none waits).",
            value=b.outbox_oldest,
        )
        yield GaugeMetricFamily(
            "sinal_executions_due",
            "Automation executions due to run that no worker holds.",
            value=b.executions_due,
        )
        yield GaugeMetricFamily(
            "sinal_executions_oldest_due_seconds",
            "How long the oldest due execution has waited past its run_at (0 when none).",
            value=b.executions_oldest,
        )


def backlog_exposition(read: Callable[[], Backlog]) -> bytes:
    """The workers' backlog as gauges, in the text format, read now (nothing while the
    database cannot be reached)."""
    registry = CollectorRegistry()
    registry.register(BacklogCollector(read))
    return generate_latest(registry)


def serve_worker_metrics(
    metrics: WorkerMetrics, backlog: Callable[[], Backlog], host: str, port: int
) -> Callable[[], None]:
    """Serve the worker's figures and the backlog over HTTP (any path; Prometheus scrapes
    /metrics) on a daemon thread; the function that stops it."""
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:  # taken, or an address not of this machine
        raise ConfigurationError(
            f"SINAL_WORKER_METRICS_PORT: cannot listen on {host}:{port}: {exc.strerror}"
        ) from exc
    metrics.registry.register(BacklogCollector(backlog))
    log.info("worker metrics on http://%s:%d/metrics", host, server.server_port)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
