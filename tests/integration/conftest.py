"""The API through HTTP (httpx over ASGI, the app's lifespan run), on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

import sinal
from sinal.api import create_app
from sinal.config import Settings
from sinal.ledger import Ledger, connect


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Api:
    """A running app, a client with an all-scopes key, and the ledger underneath."""

    client: httpx.AsyncClient
    app: FastAPI
    ledger: Ledger
    url: str
    account: sinal.Account
    key: str

    async def key_for(self, *scopes: str, account: sinal.Account | None = None) -> str:
        text, _ = self.ledger.create_api_key((account or self.account).id, list(scopes))
        return text

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async def post(self, path: str, body: Any, **kw: Any) -> httpx.Response:
        return await self.client.post(path, json=body, **kw)

    async def raw(self, path: str, content: bytes | str, **headers: str) -> httpx.Response:
        sent = {"Content-Type": "application/json", **headers}
        return await self.client.post(path, content=content, headers=sent)


@pytest.fixture
def ledger_at(database_url: str) -> Iterator[Ledger]:
    with connect(database_url) as led:
        yield led


@asynccontextmanager
async def serving(
    database_url: str, key: str, **settings: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """An app on `database_url` with its lifespan running, and a client sending `key`."""
    base = {"database_url": database_url, "auth_cache_ttl": 0, "serve_worker": False}
    app = create_app(Settings(**{**base, **settings}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://sinal.test", headers=headers
        ) as client:
            yield app, client


async def running_api(database_url: str, ledger: Ledger, **settings: Any) -> AsyncIterator[Api]:
    """An app on `database_url` with its lifespan running."""
    account = ledger.create_account("Loja Exemplo")
    key, _ = ledger.create_api_key(account.id, ["ingest", "read", "admin"])
    async with serving(database_url, key, **settings) as (app, client):
        yield Api(client, app, ledger, database_url, account, key)


@pytest.fixture
async def api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    async for running in running_api(database_url, ledger_at):
        yield running


@pytest.fixture
async def pg_api(pg_url: str) -> AsyncIterator[Api]:
    """The app on PostgreSQL alone."""
    with connect(pg_url) as ledger:
        async for running in running_api(pg_url, ledger):
            yield running
