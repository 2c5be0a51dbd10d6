"""`create_app(settings)`: the FastAPI application over the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from sinal.api.errors import ApiError, handle_error
from sinal.api.metrics import Metrics, MetricsMiddleware
from sinal.api.models import REQUEST_MODELS
from sinal.api.openapi import build_openapi
from sinal.api.routes import analytics, contacts, events, rejections, system
from sinal.api.service import Service
from sinal.config import Settings
from sinal.errors import SinalError
from sinal.ledger import connect

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
        ledger = await asyncio.to_thread(connect, settings.database_url)
        svc = Service(settings, ledger, metrics)
        app.state.service = svc
        try:
            yield
        finally:
            await svc.committer.drain()  # every accepted event is committed before exit
            await asyncio.to_thread(ledger.close)

    from sinal import __version__

    app = FastAPI(
        title="sinal",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    for router in (events, contacts, analytics, rejections, system):
        app.include_router(router.router)
    # Expected errors are answered by the exception middleware; `Exception` (a bug) by the
    # server-error middleware, which also logs it.
    for error in (ApiError, SinalError, HTTPException, Exception):
        app.add_exception_handler(error, handle_error)
    app.add_exception_handler(RequestValidationError, handle_error)
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    def openapi() -> dict[str, Any]:
        return build_openapi(app, REQUEST_MODELS)

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def create_app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory` (each `sinal serve` worker builds its own app)."""
    return create_app(Settings.from_env())
