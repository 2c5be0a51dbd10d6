"""`create_app(settings)`: the FastAPI application over the ledger."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from sinal.api.errors import ApiError, handle_error
from sinal.api.fast_path import IngestFastPath
from sinal.api.metrics import Metrics, MetricsMiddleware
from sinal.api.models import REQUEST_MODELS
from sinal.api.openapi import build_openapi
from sinal.api.query_params import refuse_unknown_query
from sinal.api.routes import (
    analytics,
    automations,
    commerce_webhooks,
    contacts,
    conversations,
    events,
    links,
    rejections,
    system,
    whatsapp_webhooks,
)
from sinal.api.service import Service
from sinal.config import Settings
from sinal.errors import SinalError
from sinal.ledger import connect

log = logging.getLogger("sinal.api")

DESCRIPTION = """\
sinal records every activity of a commerce + WhatsApp CRM platform as one standardized
event. Authenticate with `Authorization: Bearer <key>` (from `sinal keys create`); the
account is the key's. Errors are `application/problem+json` (RFC 9457) with one entry
per bad field in `errors`.
"""


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service on `settings.database_url` (default: from the environment)."""
    settings = settings or Settings.from_env()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        opening = functools.partial(
            connect, settings.database_url, wait=settings.database_wait, keyring=settings.keyring()
        )
        ledger = await asyncio.to_thread(opening)
        svc = Service(settings, ledger, metrics)
        app.state.service = svc
        worker = None
        if settings.serve_worker:  # automations run in the server unless turned off
            from sinal.worker import start_worker_thread, stop_timeout

            worker = start_worker_thread(ledger, settings, metrics.registry)
        try:
            yield
        finally:
            if worker is not None:
                worker[1].set()  # no step starts from now on
            await svc.committer.drain()  # every accepted event is committed before exit
            if worker is not None:
                # the steps running finish (bounded): the ledger closes under none of them
                await asyncio.to_thread(worker[0].join, stop_timeout(settings))
                if worker[0].is_alive():
                    log.warning("the worker is still running a step: closing all the same")
            svc.close()
            await asyncio.to_thread(ledger.close)

    from sinal import __version__

    app = FastAPI(
        title="sinal",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    for module in (
        events, contacts, analytics, rejections, system, automations, commerce_webhooks,
        whatsapp_webhooks, links, conversations,
    ):  # fmt: skip
        # The routes go straight onto the app's router: `include_router` keeps nested
        # routers that every request walks through (~40% of a request's CPU here).
        app.router.routes.extend(module.router.routes)
    refuse_unknown_query(app)
    # Expected errors are answered by the exception middleware; `Exception` (a bug) by the
    # server-error middleware, which also logs it (and re-raises it: uvicorn logs it again).
    # A client gone mid-body is expected: 499, logged by neither.
    for error in (ApiError, SinalError, HTTPException, ClientDisconnect, Exception):
        app.add_exception_handler(error, handle_error)
    app.add_exception_handler(RequestValidationError, handle_error)
    hot = next(r for r in app.routes if getattr(r, "path", "") == "/v1/events"
               and "POST" in getattr(r, "methods", ()))  # fmt: skip
    app.add_middleware(IngestFastPath, route=hot)
    # Outermost: sees both paths. `plain`: the routes FastAPI does not label (/docs, ...).
    plain = [r for r in app.routes if not isinstance(r, APIRoute)]
    app.add_middleware(MetricsMiddleware, metrics=metrics, plain=plain, routes=app.routes)

    def openapi() -> dict[str, Any]:
        return build_openapi(app, (*REQUEST_MODELS, *automations.MODELS))

    app.openapi = openapi  # type: ignore[method-assign]
    return app


# A server process allocates hundreds of objects per request and keeps few of them: at
# the default threshold (700) the cyclic collector runs every request or two, and its
# older generations rescan every module, route and model loaded at startup. Measured with
# bench/http.py, server CPU per event of the batch route: 83-87 -> 67-69 us (single
# events: no change beyond noise).
GC_THRESHOLD = (50_000, 10, 10)


def tune_gc() -> None:
    """For a serving process: freeze what startup allocated (imports, the app) out of the
    collector's sight, and collect young objects every 50,000 allocations."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (each `sinal serve` worker builds its own app, then
    tunes its collector: the process serves and does nothing else)."""
    app = create_app(Settings.from_env())
    tune_gc()
    return app
