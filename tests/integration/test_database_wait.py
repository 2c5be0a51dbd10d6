"""SINAL_DATABASE_WAIT: how long a call waits for the database, on both backends, from
the environment to the store."""

from __future__ import annotations

import fcntl
import os

import pytest

import sinal
from sinal.cli import open_ledger
from sinal.ledger import Ledger, connect
from sinal.store.postgres import PostgresStore
from sinal.store.sqlite import SQLiteStore
from tests.integration.conftest import running_api


def _wait(ledger: Ledger) -> float:
    store = ledger.store
    if isinstance(store, PostgresStore):
        return store._pool.timeout
    assert isinstance(store, SQLiteStore)
    return store._busy_timeout


def test_the_wait_defaults_to_30_seconds(database_url: str) -> None:
    with connect(database_url) as ledger:
        assert _wait(ledger) == 30.0


def test_the_setting_reaches_the_store_of_a_command(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SINAL_DATABASE_URL", database_url)
    monkeypatch.setenv("SINAL_DATABASE_WAIT", "4.5")
    with open_ledger(None) as ledger:
        assert _wait(ledger) == 4.5


def test_a_malformed_setting_stops_a_command_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SINAL_DATABASE_WAIT", "-1")
    with pytest.raises(sinal.ConfigurationError, match=r"^SINAL_DATABASE_WAIT=-1 must be"):
        open_ledger("sqlite:///unused.db")


def test_a_sqlite_writer_gives_up_after_the_setting(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SINAL_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("SINAL_DATABASE_WAIT", "0.3")
    path = sqlite_url.removeprefix("sqlite:///")
    with open_ledger(None, is_migrating=True) as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        with open(f"{path}-lock", "a") as held:  # a writer of another process, stuck
            fcntl.flock(held, fcntl.LOCK_EX)
            with pytest.raises(sinal.StoreUnavailable, match=r"no writer's turn within 0\.3 s"):
                ledger.create_contact(account.id, external_id="c1")
            fcntl.flock(held, fcntl.LOCK_UN)
        assert ledger.create_contact(account.id, external_id="c1").external_id == "c1"


@pytest.mark.anyio
async def test_the_setting_reaches_the_servers_store(database_url: str, ledger_at: Ledger) -> None:
    async for api in running_api(database_url, ledger_at, database_wait=2.5):
        assert _wait(api.app.state.service.ledger) == 2.5


@pytest.mark.postgres
@pytest.mark.anyio
async def test_a_postgres_lock_wait_gives_up_after_the_setting_and_starves_no_read(
    pg_url: str,
) -> None:
    """A session holding a table lock (a long DDL, a stuck transaction): writes needing it
    answer 503 with Retry-After once the wait has passed, instead of waiting for the lock
    however long; and while they wait, a read needing no such lock is answered (their
    threads used to fill asyncio's default executor, min(32, cpus + 4), queueing it)."""
    import asyncio
    import time

    import psycopg

    blocked = min(6, (os.cpu_count() or 1) + 4)  # the default executor's threads, up to 6
    with connect(pg_url) as ledger:
        async for api in running_api(pg_url, ledger, database_wait=3):
            contact = {"phone": "+5511987654321"}
            warm = await api.post("/v1/events", {"metric": "Ping", "contact": contact})
            assert warm.status_code == 201, warm.text
            with psycopg.connect(pg_url) as holder:
                holder.execute("LOCK TABLE contact_metrics_summary IN ACCESS EXCLUSIVE MODE")
                began = time.monotonic()
                items = [{"metric": "Ping", "source_id": str(n), "contact": contact}
                         for n in range(blocked)]  # fmt: skip
                writes = [
                    asyncio.create_task(api.post("/v1/events/batch", {"events": [item]}))
                    for item in items
                ]
                await asyncio.sleep(0.5)  # the writes wait for the lock
                read = await asyncio.wait_for(api.client.get("/v1/events?limit=1"), 2.5)
                answers = await asyncio.wait_for(asyncio.gather(*writes), 20)
                took = time.monotonic() - began
                holder.rollback()

    assert read.status_code == 200
    assert [a.status_code for a in answers] == [503] * blocked
    assert {a.headers["retry-after"] for a in answers} == {"2"}
    assert 2.5 < took < 15  # the wait (3 s), not the lock's
