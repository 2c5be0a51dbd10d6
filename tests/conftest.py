"""Fixtures shared by every layer: a database URL per backend, a ledger on it.

PostgreSQL tests clone a migrated template database (fast) into a fresh database per test.
Without a PostgreSQL server they are skipped locally and fail the run with CI=true.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sinal.ledger import Ledger, connect
from sinal.store.base import Account

PG_URL = os.environ.get("SINAL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_counter = itertools.count()


def _admin_url(dbname: str) -> str:
    return PG_URL.rsplit("/", 1)[0] + "/" + dbname


def _pg_available() -> str | None:
    """None when PostgreSQL answers, else the reason."""
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL at {PG_URL} is not reachable: {exc}"
    return None


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    """A migrated template database; its name."""
    problem = _pg_available()
    if problem:
        if IN_CI:
            pytest.fail(f"{problem} (CI=true: PostgreSQL tests may not be skipped)")
        pytest.skip(problem)
    name = f"sinal_tpl_{os.getpid()}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    ledger = connect(_admin_url(name))
    ledger.migrate()
    ledger.close()
    yield name
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for one test."""
    name = f"sinal_t_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield _admin_url(name)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_unusual_url(pg_url: str) -> str:
    """A fresh, migrated PostgreSQL database with unusual session defaults: transactions
    serializable, dates in the SQL style, day first, intervals in the SQL standard's, the
    time zone +05:45. (Read it through sinal: psycopg cannot read such dates back.)"""
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        for setting, value in (
            ("default_transaction_isolation", "serializable"),
            ("datestyle", "SQL, DMY"),
            ("intervalstyle", "sql_standard"),
            ("timezone", "Asia/Kathmandu"),
        ):
            admin.execute(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'")
    return pg_url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh, migrated SQLite database for one test."""
    url = f"sqlite:///{tmp_path / 'sinal.db'}"
    ledger = connect(url)
    ledger.migrate()
    ledger.close()
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database on each backend."""
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database on each backend, no migration applied."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    request.getfixturevalue("pg_template")  # skips (or fails in CI) without PostgreSQL
    name = f"sinal_empty_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield _admin_url(name)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["LATIN1", "SQL_ASCII"])
def non_utf8_url(request: pytest.FixtureRequest, pg_template: str) -> Iterator[str]:
    """An empty PostgreSQL database not in UTF8: LATIN1, or SQL_ASCII (no encoding)."""
    name = f"sinal_non_utf8_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" ENCODING '{request.param}' LC_COLLATE 'C' "
            "LC_CTYPE 'C' TEMPLATE template0"
        )
    yield _admin_url(name)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def linguistic_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database on each backend, PostgreSQL's collating text by a
    language's rules (ICU's en-US, as a database made with LOCALE 'en_US.UTF-8' does:
    "abc" before "Zeta"), not by code point as the test databases' C.UTF-8 does."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_url")
        return
    request.getfixturevalue("pg_template")  # skips (or fails in CI) without PostgreSQL
    name = f"sinal_icu_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE \"{name}\" TEMPLATE template0 ENCODING 'UTF8' "
            "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        )
    with connect(_admin_url(name)) as migrating:
        migrating.migrate()
    yield _admin_url(name)
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def ledger(database_url: str) -> Iterator[Ledger]:
    """A ledger on a fresh database, on each backend."""
    with connect(database_url) as led:
        yield led


@pytest.fixture
def account(ledger: Ledger) -> Account:
    """An account of `ledger`'s."""
    return ledger.create_account(name="Loja")
