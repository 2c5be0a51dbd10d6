"""Prometheus metrics: requests by route and status, latency, events by source and outcome,
webhook deliveries by provider and outcome.
(The figures of the worker running in the server, and the workers' backlog: see
`sinal.automations.metrics`.)

Each app has its own registry (tests build many apps in one process). Under
`sinal serve --workers N` the workers share a `PROMETHEUS_MULTIPROC_DIR`, and /metrics
adds up every worker's figures.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from starlette.routing import BaseRoute, Match

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The status of the router's answer to a path that a known route matches with its trailing
# slash added or removed (`redirect_slashes`): a redirect to that route.
SLASH_REDIRECT = 307
MAX_SOURCES = 50  # distinct `source` label values per process; the rest count as "other"
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The collectors, in the app's registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sinal_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sinal_http_request_duration_seconds",
            "Time to answer an HTTP request, by method and route template.",
            ["method", "route"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.events = Counter(
            "sinal_events",
            "Events received through the API, by source and outcome.",
            ["source", "status"],
            registry=self.registry,
        )
        self.deliveries = Counter(
            "sinal_webhook_deliveries",
            "Signed webhook deliveries answered 200, by provider and what became of them "
            "(processed, duplicate, deferred, unmappable, failed).",
            ["provider", "status"],
            registry=self.registry,
        )
        self._sources: set[str] = set()
        # Labelled children, looked up once: `labels()` takes a lock and builds a tuple.
        self._children: dict[tuple[str, ...], Any] = {}

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one answered request and its duration."""
        key = ("r", method, route, str(status))
        pair = self._children.get(key)
        if pair is None:
            pair = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._children[key] = pair
        pair[0].inc()
        pair[1].observe(seconds)

    def count_events(self, outcomes: Iterable[tuple[str, str]]) -> None:
        """Count many outcomes, (source, status) each: one increment per distinct pair (an
        increment of a multi-process counter costs ~1 µs)."""
        for (source, status), n in collections.Counter(outcomes).items():
            self.count_event(source, status, n)

    def count_event(self, source: str, status: str, n: int = 1) -> None:
        """Count `n` outcomes of one source and status (created, duplicate, rejected)."""
        label = self._source_label(source)
        key = ("e", label, status)
        child = self._children.get(key)
        if child is None:
            child = self.events.labels(label, status)
            self._children[key] = child
        child.inc(n)

    def count_delivery(self, provider: str, status: str) -> None:
        """Count one webhook delivery of `provider` (shopify, yampi, whatsapp) and what
        became of it."""
        key = ("d", provider, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.deliveries.labels(provider, status)
        child.inc()

    def _source_label(self, source: str) -> str:
        if source in self._sources:
            return source
        if len(self._sources) < MAX_SOURCES:
            self._sources.add(source)
            return source
        return "other"

    def exposition(self) -> bytes:
        """The text format, across workers when running multi-process."""
        path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if path:
            forget_dead_processes(path)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)


def forget_dead_processes(path: str) -> None:
    """Drop the live gauges (`sinal_worker_executions_in_hand`, `sinal_worker_listening`)
    of the processes sharing `path` that died without saying so: a server process killed
    or crashed, which uvicorn's supervisor replaces. prometheus_client leaves that to the
    process manager (gunicorn's `child_exit` hook); uvicorn offers none, so each scrape
    does it. The files are `gauge_live<mode>_<pid>.db`."""
    for file in Path(path).glob("gauge_live*_*.db"):
        pid = file.stem.rpartition("_")[2]
        if pid.isdigit() and not _alive(int(pid)):
            mark_process_dead(int(pid), path)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


class MetricsMiddleware:
    """Pure ASGI middleware (no per-request task or body copy) timing every request.

    A request is labelled with its route's path template, or `unmatched` (a 404): labels
    come from the app's routes, never from the path, so a client cannot add label values.
    FastAPI's router puts only its own routes (`APIRoute`) in `scope["route"]`; `plain` are
    the app's other routes (/docs, /openapi.json, ...), matched here again when a request
    ends without one. The router's redirect of `/docs/` to `/docs` (or `/v1/events/` to
    `/v1/events`) sets no route: it is labelled with the route it redirects to, among
    `routes` (all of the app's).
    """

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        plain: Sequence[BaseRoute],
        routes: Sequence[BaseRoute],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.plain = tuple(plain)
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route") or self._plain_route(scope)
            if route is None and status == SLASH_REDIRECT:
                route = self._redirected_to(scope)
            # path_format: the template without converters ({tag}, not {tag:path})
            label = getattr(route, "path_format", None) or "unmatched"
            self.metrics.observe(scope["method"], label, status, time.perf_counter() - start)

    def _plain_route(self, scope: Scope) -> BaseRoute | None:
        """The route among `plain` that answered (or refused the method of) the request."""
        return _matching(self.plain, scope)

    def _redirected_to(self, scope: Scope) -> BaseRoute | None:
        """The route the router redirected the request to, with the trailing slash of its
        path removed or added (as `starlette.routing.Router` decides it)."""
        path = scope["path"]
        if path == scope.get("root_path", "") + "/":  # the root is never redirected
            return None
        other = path.rstrip("/") if path.endswith("/") else path + "/"
        return _matching(self.routes, {**scope, "path": other})


def _matching(routes: Sequence[BaseRoute], scope: Scope) -> BaseRoute | None:
    """The first of `routes` that matches the request (or refuses its method)."""
    return next((r for r in routes if r.matches(scope)[0] is not Match.NONE), None)
