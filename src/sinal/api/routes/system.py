"""Health, readiness, Prometheus metrics, and the key's account."""

from __future__ import annotations

import contextlib
from typing import cast

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from sinal.api.body import read_json, validate
from sinal.api.errors import PROBLEMS, NotFound, Problem, problem_response, problem_responses
from sinal.api.models import AccountOut, AccountPatch, Health
from sinal.api.openapi import body_of
from sinal.api.service import ProbeTimeout, service
from sinal.api.views import account_view, json_response
from sinal.automations.metrics import backlog_exposition
from sinal.errors import AccountNotFound, StoreError
from sinal.store.automations import AutomationStore
from sinal.store.base import latest_schema_version

router = APIRouter()
_NOT_READY = Problem(503, "not-ready", "The service is not ready")


@router.get("/healthz", tags=["system"], summary="Liveness", response_model=Health)
async def healthz() -> Response:
    """The process answers (no database access)."""
    return json_response({"status": "ok"})


@router.get(
    "/readyz",
    tags=["system"],
    summary="Readiness: database reachable, migrations current",
    response_model=Health,
    responses=problem_responses(503),
)
async def readyz(request: Request) -> Response:
    """503 while the database cannot be reached or `sinal migrate` has not been run; ready
    on a schema newer than this code's (as `Ledger.check_schema`), so that during a rolling
    deploy the old code's servers stay in service once the new code has migrated."""
    svc = service(request)
    backend = getattr(svc.ledger.store, "backend", "sqlite")
    latest = latest_schema_version(backend)
    try:
        version = await svc.probe(svc.ledger.schema_version)
    except ProbeTimeout as exc:
        return problem_response(_NOT_READY, str(exc))
    except StoreError:  # its text may name the database's host: not for this open route
        return problem_response(_NOT_READY, "the database cannot be reached")
    if version < latest:  # a newer schema is ready: a rolling deploy's old code runs on it
        detail = f"schema version {version}, this code needs {latest}: run `sinal migrate`"
        return problem_response(_NOT_READY, detail)
    return json_response({"status": "ready", "schema_version": version})


@router.get("/metrics", tags=["system"], summary="Prometheus metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """The Prometheus text format: this service's figures, then the workers' backlog (left
    out while the database cannot be reached, which /readyz reports)."""
    svc = service(request)
    body = svc.metrics.exposition()
    store = cast(AutomationStore, svc.ledger.store)
    with contextlib.suppress(ProbeTimeout):
        body += await svc.probe(backlog_exposition, store.backlog)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/v1/account",
    tags=["account"],
    summary="The API key's account",
    response_model=AccountOut,
    responses=problem_responses(401, 503),
)
async def get_account(request: Request) -> Response:
    """Any valid key may read its account."""
    svc = service(request)
    key = await svc.authorize(request, None)
    account = await svc.run(svc.ledger.get_account, key.account_id)
    if account is None:
        raise AccountNotFound(str(key.account_id))
    return json_response(account_view(account))


@router.patch(
    "/v1/account",
    tags=["account"],
    summary="Change the account's name or timezone (admin)",
    response_model=AccountOut,
    openapi_extra=body_of(AccountPatch),
    responses=problem_responses(400, 401, 403, 413, 415, 422, 503),
)
async def patch_account(request: Request) -> Response:
    """The timezone is the default of aggregates."""
    svc = service(request)
    key = await svc.authorize(request, "admin")
    body = validate(AccountPatch, await read_json(request, 4096))
    account = await svc.run(
        lambda: svc.ledger.update_account(key.account_id, name=body.name, timezone=body.timezone)
    )
    return json_response(account_view(account))


@router.get("/problems/{slug}", include_in_schema=False)
async def problem_doc(slug: str) -> Response:
    """What a problem `type` means (the URI reference in every error answer)."""
    for problem in PROBLEMS.values():
        if problem.slug == slug:
            return json_response({"type": f"/problems/{slug}", "title": problem.title,
                                  "status": problem.status})  # fmt: skip
    raise NotFound(f"unknown problem type {slug}")
