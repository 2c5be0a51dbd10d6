"""The migrations produce the schema the code expects, on both backends."""

from __future__ import annotations

import pytest

from sinal.store.base import read_migrations
from tests.helpers import sql

# table -> its primary key columns; every key starts with account_id (sharding by account)
EXPECTED_KEYS = {
    "contacts": ["account_id", "id"],
    "contact_identities": ["account_id", "kind", "value"],
    "metrics": ["account_id", "id"],
    "events": ["account_id", "id"],
    "contact_metrics_summary": ["account_id", "contact_id", "metric_name"],
    "outbox": ["account_id", "event_id"],
    "rejections": ["account_id", "id"],
    "orders": ["account_id", "id"],
    "checkouts": ["account_id", "integration_id", "token"],
}
EVENT_COLUMNS = {
    "id", "account_id", "contact_id", "metric_id", "metric_name", "properties", "value",
    "currency", "source", "source_id", "integration_id", "unique_event_id", "entity_type",
    "entity_id", "automation_execution_id", "occurred_at", "received_at", "schema_version",
    "created_at",
}  # fmt: skip


def _primary_key(url: str, table: str) -> list[str]:
    if url.startswith("sqlite:"):
        rows = sql(url, f"SELECT name, pk FROM pragma_table_info('{table}') WHERE pk > 0")
        return [name for name, _ in sorted(rows, key=lambda r: r[1])]
    rows = sql(
        url,
        "SELECT a.attname FROM pg_index i "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = ?::regclass AND i.indisprimary "
        "ORDER BY array_position(i.indkey::int2[], a.attnum)",
        table,
    )
    return [r[0] for r in rows]


def _unique_keys(url: str, table: str) -> list[list[str]]:
    if url.startswith("sqlite:"):
        keys = []
        for name, unique in sql(url, f"SELECT name, \"unique\" FROM pragma_index_list('{table}')"):
            if unique:
                cols = sql(url, f"SELECT name FROM pragma_index_info('{name}') ORDER BY seqno")
                keys.append([c[0] for c in cols])
        return keys
    rows = sql(
        url,
        "SELECT array_agg(a.attname ORDER BY array_position(i.indkey::int2[], a.attnum)) "
        "FROM pg_index i JOIN pg_attribute a "
        "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = ?::regclass AND i.indisunique GROUP BY i.indexrelid",
        table,
    )
    return [list(r[0]) for r in rows]


def _columns(url: str, table: str) -> set[str]:
    if url.startswith("sqlite:"):
        return {r[0] for r in sql(url, f"SELECT name FROM pragma_table_info('{table}')")}
    return {
        r[0]
        for r in sql(
            url, "SELECT column_name FROM information_schema.columns WHERE table_name = ?", table
        )
    }


@pytest.mark.parametrize("table", sorted(EXPECTED_KEYS))
def test_schema_every_key_starts_with_account_id(database_url: str, table: str) -> None:
    assert _primary_key(database_url, table) == EXPECTED_KEYS[table]
    for key in _unique_keys(database_url, table):
        assert key[0] == "account_id", f"{table} has a unique key without account_id: {key}"


def test_schema_events_have_the_seed_columns_and_dedup_key(database_url: str) -> None:
    assert _columns(database_url, "events") >= EVENT_COLUMNS
    assert ["account_id", "unique_event_id"] in _unique_keys(database_url, "events")
    assert ["account_id", "name"] in _unique_keys(database_url, "metrics")


def test_schema_records_every_applied_migration(database_url: str) -> None:
    applied = [r[0] for r in sql(database_url, "SELECT version FROM schema_migrations")]
    backend = "sqlite" if database_url.startswith("sqlite:") else "postgres"
    assert sorted(applied) == [v for v, _, _ in read_migrations(backend)]


def test_migrations_are_numbered_alike_on_both_backends() -> None:
    sqlite_versions = [(v, n) for v, n, _ in read_migrations("sqlite")]
    postgres_versions = [(v, n) for v, n, _ in read_migrations("postgres")]
    assert sqlite_versions == postgres_versions
