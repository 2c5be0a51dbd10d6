"""`sinal worker`: a dispatcher process (and the one `sinal serve` runs in a thread)."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.config import Settings
from sinal.ledger import Ledger

log = logging.getLogger("sinal.worker")


def dispatch_settings(settings: Settings) -> DispatchSettings:
    """The dispatcher's settings from sinal's."""
    return DispatchSettings(
        lease=settings.worker_lease,
        poll_interval=settings.worker_poll_interval,
        retry=RetryPolicy(max_attempts=settings.max_attempts, base=settings.retry_base),
        http_timeout=settings.http_timeout,
        allow_private_webhooks=settings.allow_private_webhooks,
    )


def start_worker_thread(
    ledger: Ledger, settings: Settings
) -> tuple[threading.Thread, threading.Event]:
    """A worker inside another process (`sinal serve`); set the event to stop it."""
    stop = threading.Event()
    dispatcher = Dispatcher(ledger, dispatch_settings(settings))

    def work() -> None:
        try:
            dispatcher.run(stop)
        finally:
            dispatcher.close()

    thread = threading.Thread(target=work, name="sinal-worker", daemon=True)
    thread.start()
    return thread, stop


def run_worker(ledger: Ledger, settings: Settings) -> None:
    """Run a worker in this process until SIGTERM or SIGINT."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %s: finishing the current execution, then stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    dispatcher = Dispatcher(ledger, dispatch_settings(settings))
    try:
        dispatcher.run(stop)
    finally:
        dispatcher.close()
