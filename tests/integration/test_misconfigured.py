"""A database only its operator can mend (a privilege revoked, a trigger set up wrong, a
SQLite file or directory not writable): 503 without Retry-After, a `code`, the fix in
the answer and in one log line without a traceback. On real databases: a role a REVOKE
left without a privilege, contrib's moddatetime on a column that is not there, a file
this process cannot write."""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from sinal.api import errors
from sinal.errors import StoreMisconfigured
from sinal.ledger import connect
from tests.helpers import count, sql
from tests.integration.conftest import Api, serving

pytestmark = pytest.mark.anyio
_roles = itertools.count()
GRANT_FIX = (
    "grant the role sinal connects as SELECT, INSERT, UPDATE and DELETE on sinal's tables "
    "and EXECUTE on its functions (`sinal migrate` needs CREATE on the schema too), or "
    "connect as the role that ran `sinal migrate`"
)


def order(contact_id: object) -> dict[str, Any]:
    return {"metric": "Order Paid", "contact_id": str(contact_id), "value": "10",
            "source": "shopify", "source_id": "1001", "entity_type": "order"}  # fmt: skip


def operators(response: httpx.Response, code: str) -> dict[str, Any]:
    """The answer's problem, checked to be the operator's 503: no Retry-After (a retry
    fails alike until the fix), no error_id (no bug, no traceback)."""
    assert response.status_code == 503, response.text
    assert "Retry-After" not in response.headers
    problem: dict[str, Any] = response.json()
    assert problem["type"] == "/problems/database-misconfigured"
    assert problem["code"] == code
    assert "error_id" not in problem
    return problem


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """The one line the API logged: an error (nothing mends itself), no traceback."""
    [line] = [r for r in caplog.records if r.name == "sinal.api"]
    assert (line.levelname, line.exc_info) == ("ERROR", None)
    return line.getMessage()


@pytest.fixture(autouse=True)
def _unthrottled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The misconfiguration log's first line is written (an earlier test's may not be
    10 s old)."""
    monkeypatch.setattr(errors._misconfigured, "next_at", 0.0)


# -- PostgreSQL ------------------------------------------------------------------------


@pytest.fixture
def pg_role(pg_url: str) -> Iterator[str]:
    """A login role with the privileges the grant fix names on `pg_url`; its name."""
    role = f"sinal_app_{os.getpid()}_{next(_roles)}"
    sql(pg_url, f'CREATE ROLE "{role}" LOGIN')
    sql(pg_url, f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
    yield role
    sql(pg_url, f'DROP OWNED BY "{role}"')
    sql(pg_url, f'DROP ROLE "{role}"')


@pytest.mark.postgres
async def test_a_privilege_revoked_from_sinals_role_is_503_naming_the_grant(
    pg_url: str, pg_role: str, caplog: pytest.LogCaptureFixture
) -> None:
    """REVOKE INSERT ON events from the role sinal connects as: a 500 "something went
    wrong on our side" with a traceback before, as for a bug; the grant is the fix, and
    once it is made the same server records the event."""
    with connect(pg_url) as ledger:
        account = ledger.create_account("Loja")
        key, _ = ledger.create_api_key(account.id, ["ingest", "read"])
        contact = ledger.create_contact(account.id, email="ana@example.com")
    as_role = pg_url.replace("postgres@", f"{pg_role}@", 1)
    async with serving(as_role, key) as (_, client):
        sql(pg_url, f'REVOKE INSERT ON events FROM "{pg_role}"')
        with caplog.at_level(logging.WARNING, logger="sinal.api"):
            refused = await client.post("/v1/events", json=order(contact.id))
        sql(pg_url, f'GRANT INSERT ON events TO "{pg_role}"')
        granted = await client.post("/v1/events", json=order(contact.id))

    assert operators(refused, "insufficient_privilege")["detail"] == GRANT_FIX
    line = logged(caplog)
    assert line.startswith("POST /v1/events: the database refuses what sinal needs "
                           "(insufficient_privilege), answered 503: ")  # fmt: skip
    assert "permission denied for table events" in line
    assert GRANT_FIX in line
    assert granted.status_code == 201, granted.text
    assert count(pg_url, "events") == 1


@pytest.mark.postgres
async def test_a_trigger_set_up_wrong_is_503_naming_the_trigger(
    pg_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """contrib's moddatetime on a column accounts lack: PostgreSQL's 09000 (triggered
    action exception) on every update, whatever the row. It was 503 "retry", with a
    traceback and an error id as for a bug."""
    sql(pg_api.url, "CREATE EXTENSION IF NOT EXISTS moddatetime")
    sql(pg_api.url, "CREATE TRIGGER stamp BEFORE UPDATE ON accounts "
        "FOR EACH ROW EXECUTE FUNCTION moddatetime(changed_at)")  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        response = await pg_api.client.patch("/v1/account", json={"name": "Outra"})

    problem = operators(response, "trigger_failed")
    assert problem["detail"].startswith("fix or drop the trigger someone added")
    assert '"accounts" has no attribute "changed_at"' in logged(caplog)
    assert (await pg_api.client.get("/v1/account")).json()["name"] == "Loja Exemplo"


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sqlstate", "code", "fix"),
    [
        ("42501", "insufficient_privilege", "grant the role sinal connects as"),
        ("0L000", "invalid_grant", "fix or drop the GRANT or REVOKE"),  # invalid grantor
        ("0LP01", "invalid_grant", "fix or drop the GRANT or REVOKE"),  # grant operation
        ("0P000", "invalid_role", "fix the role"),  # invalid role specification
        ("2B000", "dependent_objects", "objects someone added depend"),  # privileges
        ("2BP01", "dependent_objects", "objects someone added depend"),  # objects
        ("09000", "trigger_failed", "fix or drop the trigger"),
    ],
)
async def test_postgres_errors_an_operator_mends_say_how(
    pg_api: Api, caplog: pytest.LogCaptureFixture, sqlstate: str, code: str, fix: str
) -> None:
    """Each SQLSTATE (raised by a trigger) that no retry and no other input gets past
    until the operator acts. They were 503 "retry" with a traceback (42501: 500 "our
    bug")."""
    sql(pg_api.url, "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '{sqlstate}'; END $$")  # fmt: skip
    sql(pg_api.url, "CREATE TRIGGER refuse BEFORE INSERT ON integrations "
        "FOR EACH ROW EXECUTE FUNCTION refuse()")  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        response = await pg_api.post(
            "/v1/integrations", {"kind": "ai", "model": "m", "base_url": "https://ai.example"}
        )

    assert operators(response, code)["detail"].startswith(fix)
    assert f"({code}), answered 503: refused; {fix}" in logged(caplog)


@pytest.mark.postgres
async def test_a_snapshot_too_old_is_503_retry_naming_the_threshold(
    pg_api: Api, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL 16 and older's 72000 (old_snapshot_threshold): the next try takes a new
    snapshot, so it is a retry's 503, as an outage's; it had a traceback and an error id
    as for a bug."""
    monkeypatch.setattr(errors._unavailable, "next_at", 0.0)
    sql(
        pg_api.url,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'snapshot too old' USING ERRCODE = '72000'; END $$",
    )
    sql(pg_api.url, "CREATE TRIGGER refuse BEFORE INSERT ON integrations "
        "FOR EACH ROW EXECUTE FUNCTION refuse()")  # fmt: skip

    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        response = await pg_api.post(
            "/v1/integrations", {"kind": "ai", "model": "m", "base_url": "https://ai.example"}
        )

    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "2"
    problem = response.json()
    assert (problem["type"], problem["code"]) == ("/problems/store-unavailable",
                                                  "snapshot_too_old")  # fmt: skip
    assert "error_id" not in problem
    [line] = [r for r in caplog.records if r.name == "sinal.api"]
    assert (line.levelname, line.exc_info) == ("WARNING", None)
    assert "snapshot too old; the request may be retried" in line.getMessage()
    assert "old_snapshot_threshold" in line.getMessage()


# -- SQLite ----------------------------------------------------------------------------


@contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """`path` (a file or a directory) not writable by this process: its mode without
    write permission, and for root, whom modes do not stop, the immutable flag (`chattr
    +i`); skipped where neither holds."""
    mode = path.stat().st_mode
    path.chmod(mode & ~0o222)
    flagged = (
        os.geteuid() == 0
        and subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode
        == 0
    )
    try:
        if os.access(path, os.W_OK):
            pytest.skip(f"{path} stays writable to this process (root without chattr)")
        yield
    finally:
        if flagged:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


@pytest.fixture
def sqlite_key(sqlite_url: str) -> str:
    """An API key of an account of the SQLite database, its ledger closed (SQLite removes
    the -wal and -shm files with the last connection: a server starting finds none)."""
    with connect(sqlite_url) as ledger:
        account = ledger.create_account("Loja")
        key, _ = ledger.create_api_key(account.id, ["ingest", "read"])
        ledger.create_contact(account.id, email="ana@example.com")
    return key


async def test_a_sqlite_file_not_writable_is_503_naming_the_file(
    sqlite_url: str, sqlite_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database file read-only to the server's user (a chmod 444, a copy made by
    another user): it was 503 "the database is unavailable; retry", with a traceback, for
    every write, for ever."""
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    async with serving(sqlite_url, sqlite_key) as (_, client):
        with unwritable(path), caplog.at_level(logging.WARNING, logger="sinal.api"):
            # opened now, SQLite opens the file read-only
            read = await client.get("/v1/events")
            response = await client.post("/v1/events", json=order(uuid.uuid4()))
        # made writable: the same server records it (a connection kept read-only did not)
        fixed = await client.post("/v1/events", json=order(uuid.uuid4()))

    assert read.status_code == 200, read.text  # reads go on
    problem = operators(response, "database_read_only")
    assert problem["detail"].startswith("make the SQLite database file")
    assert str(path) not in response.text  # the answer names no path; the log does
    line = logged(caplog)
    assert f"the SQLite file {path} is not writable by this process" in line
    assert "make the SQLite database file" in line
    assert (fixed.status_code, fixed.json()["reason"]) == (422, "contact_not_found")
    assert count(sqlite_url, "rejections") == 1


async def test_a_sqlite_directory_not_writable_is_503_naming_the_directory(
    sqlite_url: str, sqlite_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's directory read-only (SQLite makes its -wal and -shm files there):
    it was 503 "the database is unavailable; retry", for ever."""
    folder = Path(sqlite_url.removeprefix("sqlite:///")).parent
    with unwritable(folder), caplog.at_level(logging.WARNING, logger="sinal.api"):
        async with serving(sqlite_url, sqlite_key) as (_, client):
            response = await client.post("/v1/events", json=order(uuid.uuid4()))

    problem = operators(response, "directory_read_only")
    assert problem["detail"].startswith("make the SQLite database's directory writable")
    assert f"the directory {folder} of the SQLite database is not writable" in logged(caplog)


def test_a_sqlite_connection_opened_while_the_file_was_not_writable_writes_once_it_is(
    sqlite_url: str,
) -> None:
    """A thread that read while the file was not writable has a connection SQLite opened
    read-only: once the file is writable, its next write passes. It failed with
    database_read_only (a 503 saying the file is not writable, when it was) once on each
    thread that had read meanwhile, as only a connection a write had failed on was opened
    again."""
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with connect(sqlite_url) as ledger:
        account = ledger.create_account("Loja")
    with connect(sqlite_url) as ledger:
        with unwritable(path):
            assert ledger.get_account(account.id) is not None  # opens this thread's connection
        ana = ledger.create_contact(account.id, external_id="ana")
        assert ledger.get_contact(account.id, ana.id) is not None


def _open_files(folder: Path) -> list[str]:
    """The files under `folder` this process holds open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor, closed since
            continue
    return [n for n in names if n.startswith(f"{folder}/")]


def test_a_sqlite_connection_whose_setup_fails_is_closed_at_once(sqlite_url: str) -> None:
    """SQLite opens the file, then its setup (WAL, in a directory not writable) fails: the
    connection was dropped without being closed, the file held open for as long as the
    error was kept (a log record, a 503's traceback), and closed only when collected."""
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    with connect(sqlite_url) as ledger:
        account = ledger.create_account("Loja")
    with connect(sqlite_url) as ledger:
        kept: list[StoreMisconfigured] = []

        def write() -> None:  # a thread of its own: its first connection, opened now
            try:
                ledger.create_contact(account.id, external_id="ana")
            except StoreMisconfigured as exc:
                kept.append(exc)

        with unwritable(path.parent):
            thread = threading.Thread(target=write)
            thread.start()
            thread.join()
            held = _open_files(path.parent)

    [error] = kept
    assert error.code == "directory_read_only"
    assert held == []
