"""`sinal worker`: a dispatcher process (and the one `sinal serve` runs in a thread)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType
from typing import cast

from prometheus_client import CollectorRegistry

from sinal.automations.dispatcher import HOUSEKEEPING_GRACE, Dispatcher, DispatchSettings
from sinal.automations.metrics import WorkerMetrics, serve_worker_metrics
from sinal.config import Settings
from sinal.ledger import Ledger
from sinal.store.automations import AutomationStore

log = logging.getLogger("sinal.worker")

# Connections a worker adds to its process's pool: one for its loop (fan-out, claims), one
# for each batch writer of step records, one for housekeeping and one for the renewal of
# its leases. Steps that touch the database themselves (tags, conversations) share the
# rest of the pool.
WORKER_CONNECTIONS = 5
# Seconds a stopping worker gives the steps running beyond the HTTP timeout (one request,
# the usual step) to finish and be recorded.
STEP_RECORD_GRACE = 5.0


def dispatch_settings(settings: Settings) -> DispatchSettings:
    """The dispatcher's settings from sinal's."""
    return DispatchSettings(
        lease=settings.worker_lease,
        concurrency=settings.worker_concurrency,
        poll_interval=settings.worker_poll_interval,
        hold_interval=settings.worker_hold_interval,
        retry=settings.retry(),
        http_timeout=settings.http_timeout,
        allow_private_webhooks=settings.allow_private_webhooks,
        housekeeping_interval=settings.housekeeping_interval,
        retention=settings.retention(),
        public_url=settings.public_url,
        stop_grace=settings.http_timeout + STEP_RECORD_GRACE,
    )


def stop_timeout(settings: Settings) -> float:
    """Seconds a worker may take to stop: its steps' grace, then housekeeping's, and a
    margin for its listener and last writes."""
    return settings.http_timeout + STEP_RECORD_GRACE + HOUSEKEEPING_GRACE + 5.0


def make_dispatcher(
    ledger: Ledger, settings: Settings, metrics: WorkerMetrics | None = None
) -> Dispatcher:
    """A dispatcher for this process, with room for its threads in the connection pool."""
    dispatcher = Dispatcher(ledger, dispatch_settings(settings), metrics=metrics)
    reserve = getattr(ledger.store, "reserve_connections", None)
    if reserve is not None:  # PostgreSQL: see WORKER_CONNECTIONS
        reserve(WORKER_CONNECTIONS)
    # one INFO line per HTTP request drowns the worker's own log (and costs time)
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    return dispatcher


def start_worker_thread(
    ledger: Ledger, settings: Settings, registry: CollectorRegistry | None = None
) -> tuple[threading.Thread, threading.Event]:
    """A worker inside another process (`sinal serve`, whose /metrics shows `registry`);
    set the event to stop it."""
    stop = threading.Event()
    dispatcher = make_dispatcher(ledger, settings, WorkerMetrics(registry))

    def work() -> None:
        try:
            dispatcher.run(stop)
        finally:
            dispatcher.close()

    thread = threading.Thread(target=work, name="sinal-worker", daemon=True)
    thread.start()
    return thread, stop


def run_worker(ledger: Ledger, settings: Settings) -> None:
    """Run a worker in this process until SIGTERM or SIGINT: no step starts after it, the
    steps running finish (within the grace), the rest is released. A second signal ends
    the process at once, as a kill would (the running steps' claims expire)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name  # SIGTERM, not 15
        if stop.is_set():
            log.warning("%s again: exiting now", name)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        log.info("%s: finishing the steps running, then stopping (again: at once)", name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    metrics = WorkerMetrics()
    stop_metrics = None
    if settings.worker_metrics_port:  # first: a port taken stops the worker before it starts
        backlog = cast(AutomationStore, ledger.store).backlog
        stop_metrics = serve_worker_metrics(
            metrics, backlog, settings.host, settings.worker_metrics_port
        )
    dispatcher = make_dispatcher(ledger, settings, metrics)
    try:
        dispatcher.run(stop)
    finally:
        dispatcher.close()
        if stop_metrics is not None:
            stop_metrics()
