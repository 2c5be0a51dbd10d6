"""Test-only helpers that look at the database directly, under the ledger."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg


def sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement on the database at `url` ("?" placeholders), return its rows."""
    if url.startswith("sqlite:"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            return conn.execute(statement, params).fetchall()
        finally:
            conn.close()
    with psycopg.connect(url, autocommit=True) as pg:
        cur = pg.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def count(url: str, table: str) -> int:
    """Rows in a table."""
    return int(sql(url, f"SELECT count(*) FROM {table}")[0][0])
