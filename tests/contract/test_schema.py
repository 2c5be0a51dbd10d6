"""The migrations produce the schema the code expects, on both backends."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from typer.testing import CliRunner

import sinal
from sinal.cli import app as cli
from sinal.commerce import commerce_store
from sinal.errors import ConfigurationError, SchemaOutOfDate
from sinal.ledger import connect
from sinal.store.base import (
    ContactQuery,
    contacts_page_sql,
    latest_schema_version,
    read_migrations,
)
from sinal.store.sqlite import _DecimalSum
from tests.helpers import sql

# table -> its primary key columns; every key starts with account_id (sharding by account)
EXPECTED_KEYS = {
    "contacts": ["account_id", "id"],
    "contact_identities": ["account_id", "kind", "value"],
    "metrics": ["account_id", "id"],
    "events": ["account_id", "id"],
    "contact_metrics_summary": ["account_id", "contact_id", "metric_name", "currency"],
    "outbox": ["account_id", "event_id"],
    "rejections": ["account_id", "id"],
    "orders": ["account_id", "id"],
    "checkouts": ["account_id", "integration_id", "token"],
    "webhook_deliveries": ["account_id", "id"],
    "message_statuses": ["account_id", "wamid"],
    "links": ["account_id", "id"],
    "automation_versions": ["account_id", "id"],
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


# The tables that are not an account's data: the tenants themselves (keyed by their id,
# the account_id of every other row) and the server's own bookkeeping (`outbox_wake`:
# PostgreSQL only; `event_sequence`, the change feed's counter: SQLite only).
NOT_AN_ACCOUNTS = {"accounts", "schema_migrations", "outbox_wake", "event_sequence"}


def _tables(url: str) -> set[str]:
    if url.startswith("sqlite:"):
        query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    else:
        query = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
    return {r[0] for r in sql(url, query)}


def test_schema_every_table_of_an_account_is_keyed_by_it(database_url: str) -> None:
    """DESIGN.md's "tenants are walls", over every table the migrations make, so a table
    added later cannot slip past `EXPECTED_KEYS`: its primary key and each unique key
    start with account_id."""
    tables = _tables(database_url)
    assert tables >= set(EXPECTED_KEYS) | {"accounts", "schema_migrations"}
    wrong = [
        (table, key)
        for table in sorted(tables - NOT_AN_ACCOUNTS)
        for key in [_primary_key(database_url, table), *_unique_keys(database_url, table)]
        if key[:1] != ["account_id"]
    ]
    assert wrong == []


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


def _migrate_up_to(url: str, last: int) -> None:
    """Apply the migrations up to `last` as that release's `sinal migrate` did."""
    backend = "sqlite" if url.startswith("sqlite:") else "postgres"
    scripts = [(v, n, text) for v, n, text in read_migrations(backend) if v <= last]
    if backend == "sqlite":
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.create_aggregate("decimal_sum", 1, _DecimalSum)  # type: ignore[arg-type]  # 0031
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                     "name TEXT NOT NULL, applied_at TEXT NOT NULL)")  # fmt: skip
        for version, name, text in scripts:
            conn.executescript(text)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, '2026-01-01T00:00:00Z')",
                         (version, name))  # fmt: skip
        conn.commit()
        conn.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, "
            "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, name, text in scripts:
            pg.execute(text.encode())
            pg.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                       (version, name))  # fmt: skip


def test_migration_0008_keeps_the_deliveries_kept_before_it(empty_url: str) -> None:
    _migrate_up_to(empty_url, 7)
    account, delivery, integration = str(uuid4()), str(uuid4()), str(uuid4())
    sql(empty_url, "INSERT INTO webhook_deliveries (account_id, id, integration_id, provider, "
        "topic, delivery_id, headers, body, received_at, status, reason, attempts) VALUES "
        "(?, ?, ?, 'whatsapp', 'messages', 'digest-1', '{}', ?, '2026-01-01T00:00:00.000000Z', "
        "'unmappable', 'partly_unmappable: x', 1)", account, delivery, integration,
        b'{"object":"whatsapp_business_account"}')  # fmt: skip

    with connect(empty_url) as ledger:
        backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v > 7]
        from sinal.webhooks import store_of

        [kept] = store_of(ledger).list_deliveries(("unmappable",))
    assert (str(kept.account_id), str(kept.id), str(kept.integration_id)) == (
        account, delivery, integration
    )  # fmt: skip
    assert kept.body == b'{"object":"whatsapp_business_account"}'
    assert (kept.status, kept.reason, kept.attempts, kept.due_at) == (
        "unmappable", "partly_unmappable: x", 1, None
    )  # fmt: skip
    assert kept.received_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert _primary_key(empty_url, "webhook_deliveries") == ["account_id", "id"]
    assert ["account_id", "integration_id", "delivery_id"] in _unique_keys(
        empty_url, "webhook_deliveries"
    )


def test_migration_0015_puts_the_executions_made_before_it_at_chain_depth_0(
    empty_url: str,
) -> None:
    _migrate_past_an_execution(empty_url, 14, "completed")

    assert sql(empty_url, "SELECT chain_depth FROM executions") == [(0,)]


def _migrate_past_an_execution(empty_url: str, version: int, status: str) -> None:
    """Migrate up to `version`, store an automation with one execution in `status` as the
    schema of then holds them, then migrate the rest."""
    _migrate_up_to(empty_url, version)
    with connect(empty_url) as ledger:
        account = str(ledger.create_account("Loja").id)
    automation, at = str(uuid4()), "2026-01-01T00:00:00.000000Z"
    sql(empty_url, "INSERT INTO automations (account_id, id, name, status, trigger_metric, "
        "spec, created_at, updated_at) VALUES (?, ?, 'a', 'active', 'Ping', '{}', ?, ?)",
        account, automation, at, at)  # fmt: skip
    sql(empty_url, "INSERT INTO executions (account_id, id, automation_id, event_id, "
        "contact_id, status, run_at, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        account, str(uuid4()), automation, str(uuid4()), str(uuid4()), status, at, at,
        at)  # fmt: skip

    with connect(empty_url) as ledger:
        assert ledger.migrate() == [v for v, _, _ in read_migrations("sqlite") if v > version]


def test_migration_0026_gives_automations_and_their_executions_made_before_it_version_1(
    empty_url: str,
) -> None:
    """An execution made before versions existed runs its automation's current steps, as
    it did: both are at version 1, and no version is kept."""
    _migrate_past_an_execution(empty_url, 25, "waiting")

    assert sql(empty_url, "SELECT version FROM automations") == [(1,)]
    assert sql(empty_url, "SELECT automation_version FROM executions") == [(1,)]
    assert sql(empty_url, "SELECT count(*) FROM automation_versions") == [(0,)]


def _old_event(
    url: str,
    account: UUID,
    contact: UUID,
    metric: str,
    *,
    value: str | None,
    at: str,
    **columns: str,
) -> None:
    """An event as the schemas of before hold one, written by hand (sinal's own writes
    name the columns of its latest schema): `columns` such as currency, unique_event_id."""
    names = "".join(f", {name}" for name in columns)
    sql(url, "INSERT INTO events (account_id, id, contact_id, metric_id, metric_name, value, "
        f"source, occurred_at, received_at, schema_version, created_at{names}) "
        f"VALUES (?, ?, ?, ?, ?, ?, 'api', ?, ?, 1, ?{', ?' * len(columns)})",
        str(account), str(uuid4()), str(contact), str(uuid4()), metric, value, at, at, at,
        *columns.values())  # fmt: skip


def _old_summary(
    url: str, account: UUID, contact: UUID, metric: str, *, count: int, total: str | None
) -> None:
    """A summary row as the schemas before 0031 hold one (no currency)."""
    at = "2026-01-01T00:00:00.000000Z"
    sql(url, "INSERT INTO contact_metrics_summary (account_id, contact_id, metric_name, id, "
        "event_count, total_value, first_event_at, last_event_at, updated_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", str(account), str(contact), metric, str(uuid4()),
        count, total, at, at, at)  # fmt: skip


def test_migration_0029_dates_the_yampi_orders_kept_before_it_by_their_order_placed(
    empty_url: str,
) -> None:
    """A Yampi order kept before 0029 is placed when its Order Placed says (a cart reminder
    coming after it tells by that whether the cart was abandoned first); one whose Order
    Placed never came stays unknown."""
    _migrate_up_to(empty_url, 28)
    placed = datetime(2024, 5, 11, 13, 0, tzinfo=UTC)
    shop, at = str(uuid4()), "2026-01-01T00:00:00.000000Z"
    with connect(empty_url) as ledger:
        account = ledger.create_account("Loja").id
        ana = ledger.create_contact(account, email="ana@loja.com").id
    _old_event(
        empty_url, account, ana, "Order Placed", value="99.90",
        at="2024-05-11T13:00:00.000000Z", unique_event_id="yampi:order_placed:318",
    )  # fmt: skip
    for order in ("318", "319"):  # 319: its Order Placed never came (only order.paid did)
        sql(empty_url, "INSERT INTO orders (account_id, id, provider, integration_id, "
            "external_id, status, refunded, cart_token, created_at, updated_at) "
            "VALUES (?, ?, 'yampi', ?, ?, 'paid', '0', 'cart', ?, ?)",
            str(account), str(uuid4()), shop, order, at, at)  # fmt: skip

    with connect(empty_url) as ledger:
        backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v > 28]
        found = [commerce_store(ledger).find_order(account, UUID(shop), o) for o in ("318", "319")]
    assert [o.placed_at if o else "gone" for o in found] == [placed, None]


def test_migration_0030_takes_the_total_from_summaries_whose_events_had_no_value(
    empty_url: str,
) -> None:
    """Summaries written as 0 for want of a value lose it; those whose values added up to
    0, or to anything, keep theirs; and what the migrated database records next adds up
    as SUM(value) does."""
    _migrate_up_to(empty_url, 29)
    with connect(empty_url) as ledger:
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, external_id="ana")
    at = "2026-01-01T00:00:00.000000Z"
    # metric: (its events' values, the summary's total as sinal wrote it)
    written: dict[str, tuple[list[str | None], str]] = {
        "Message Read": ([None, None], "0"),
        "Order Refunded": (["5", "-5"], "0"),
        "Order Paid": ([None, "10.50"], "10.50"),
        "Quiz Answered": ([None], "7"),
    }
    for metric, (values, total) in written.items():
        for value in values:
            _old_event(empty_url, account.id, ana.id, metric, value=value, at=at)
        _old_summary(empty_url, account.id, ana.id, metric, count=len(values), total=total)

    with connect(empty_url) as ledger:
        backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v > 29]
        migrated = {s.metric_name: s.total_value for s in ledger.get_summary(account.id)}
        # the drift ("Quiz Answered": 7 of no value) is left to rebuild-summaries
        assert migrated == {"Message Read": None, "Order Refunded": 0,
                            "Order Paid": Decimal("10.50"), "Quiz Answered": 7}  # fmt: skip
        for metric, value in (("Message Read", None), ("Order Refunded", None),
                              ("Message Read", "0.25")):  # fmt: skip
            ledger.emit_event(account_id=account.id, contact_id=ana.id, metric_name=metric,
                              source="api", value=value)  # fmt: skip
        totals = {s.metric_name: s.total_value for s in ledger.get_summary(account.id)}
    assert (totals["Message Read"], totals["Order Refunded"]) == (Decimal("0.25"), Decimal(0))


def test_migration_0031_splits_the_summaries_that_added_currencies_up(empty_url: str) -> None:
    """A summary whose events are in BRL and USD (its total added them: 100 + 50 = 150)
    becomes a row per currency, recounted from its events; one whose events are all in USD
    is kept as it was, in USD; one with no events behind it (drift) is left as it was, in
    BRL. The migrated database then adds each event to its currency's row."""
    _migrate_up_to(empty_url, 30)
    with connect(empty_url) as ledger:
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, external_id="ana")
    # metric: (its events' (currency, value, day of occurrence), the summary as written)
    written: dict[str, tuple[list[tuple[str, str | None, int]], tuple[int, str | None]]] = {
        "Order Paid": ([("BRL", "100", 3), ("USD", "50", 1), ("USD", None, 2)], (3, "150")),
        "Order Placed": ([("USD", "20", 1), ("USD", "5", 2)], (2, "25")),
        "Message Read": ([("BRL", None, 1)], (1, None)),
        "Never Emitted": ([], (4, "9")),
    }
    for metric, (events, (count, total)) in written.items():
        for currency, value, day in events:
            at = f"2026-01-0{day}T00:00:00.000000Z"
            _old_event(empty_url, account.id, ana.id, metric, value=value, at=at, currency=currency)
        _old_summary(empty_url, account.id, ana.id, metric, count=count, total=total)

    with connect(empty_url) as ledger:
        backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v > 30]
        migrated = [(s.metric_name, s.currency, s.event_count, s.total_value,
                     s.first_event_at.day, s.last_event_at.day)
                    for s in ledger.get_summary(account.id)]  # fmt: skip
        assert sorted(migrated) == [
            ("Message Read", "BRL", 1, None, 1, 1),
            ("Never Emitted", "BRL", 4, 9, 1, 1),
            ("Order Paid", "BRL", 1, 100, 3, 3),
            ("Order Paid", "USD", 2, 50, 1, 2),
            ("Order Placed", "USD", 2, 25, 1, 1),  # kept as written (its last day was 1)
        ]
        for currency in ("USD", "BRL", "EUR"):
            ledger.emit_event(account_id=account.id, contact_id=ana.id, currency=currency,
                              metric_name="Order Paid", source="api", value="1")  # fmt: skip
        totals = {(s.metric_name, s.currency): s.total_value
                  for s in ledger.get_summary(account.id)}  # fmt: skip
        [report] = ledger.rebuild_summaries(account.id)
    assert [totals[("Order Paid", c)] for c in ("BRL", "EUR", "USD")] == [101, 1, 51]
    # the drift left to rebuild-summaries: the row with no events, Order Placed's last day
    assert (report.deleted, report.changed) == (1, 1)


def test_check_schema_refuses_a_database_behind_this_code(empty_url: str) -> None:
    latest = latest_schema_version("sqlite" if empty_url.startswith("sqlite:") else "postgres")
    expected = f"^schema version 0, this code needs {latest}: run `sinal migrate`$"
    with connect(empty_url) as ledger, pytest.raises(SchemaOutOfDate, match=expected):
        ledger.check_schema()
    _migrate_up_to(empty_url, 7)
    with connect(empty_url) as ledger:
        with pytest.raises(SchemaOutOfDate, match=f"^schema version 7, this code needs {latest}"):
            ledger.check_schema()
        ledger.migrate()
        ledger.check_schema()  # current: no error


def test_connect_refuses_a_sqlite_older_than_3_38(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # aggregate(by=…) reads a property with `->`, which SQLite has since 3.38.0.
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 37, 2))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.37.2")
    if database_url.startswith("sqlite"):
        with pytest.raises(ConfigurationError, match=r"SQLite 3\.38\.0 or newer.*3\.37\.2"):
            connect(database_url)
        return
    with connect(database_url) as ledger:  # PostgreSQL does not use the sqlite3 module
        assert ledger.create_account("Loja").timezone == "America/Sao_Paulo"


def test_migration_0016_takes_the_indexes_an_operator_built_beforehand(empty_url: str) -> None:
    """README: on a large PostgreSQL database, build 0016's indexes first with CREATE
    INDEX CONCURRENTLY (writers go on meanwhile); the migration then finds them."""
    _migrate_up_to(empty_url, 15)
    backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
    [script] = [text for v, _, text in read_migrations(backend) if v == 16]
    concurrently = "" if backend == "sqlite" else "CONCURRENTLY "
    built = [s for s in script.split(";") if "CREATE INDEX" in s]
    for statement in built:
        sql(empty_url, statement.replace("CREATE INDEX ", f"CREATE INDEX {concurrently}"))

    with connect(empty_url) as ledger:
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v >= 16]

    assert len(built) == 3


def test_migration_0020_gives_the_rejections_kept_before_it_their_contact(
    empty_url: str,
) -> None:
    """The rejections of a contact are found by their contact_id column (the erasure's
    delete): one kept before it gets its input's contact_id, one that named none stays
    NULL, and erasing the contact deletes its rejection, not the other."""
    _migrate_up_to(empty_url, 19)
    account, ana, at = str(uuid4()), str(uuid4()), "2026-01-01T00:00:00Z"
    sql(empty_url, "INSERT INTO accounts (id, name, timezone, created_at) "
        "VALUES (?, 'Loja', 'America/Sao_Paulo', ?)", account, at)  # fmt: skip
    sql(empty_url, "INSERT INTO contacts (account_id, id, created_at, updated_at) "
        "VALUES (?, ?, ?, ?)", account, ana, at, at)  # fmt: skip
    named, anonymous = str(uuid4()), str(uuid4())
    for ident, payload in ((named, f'{{"contact_id": "{ana}"}}'), (anonymous, "{}")):
        sql(empty_url, "INSERT INTO rejections (account_id, id, reason, message, source, "
            "payload, created_at) VALUES (?, ?, 'contact_not_found', 'm', 'api', ?, ?)",
            account, ident, payload, at)  # fmt: skip

    with connect(empty_url) as ledger:
        backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v > 19]
        kept = sql(empty_url, "SELECT id, contact_id FROM rejections")
        assert {(str(i), c and str(c)) for i, c in kept} == {(named, ana), (anonymous, None)}
        assert ledger.erase_contact(account, ana)

    assert [str(r[0]) for r in sql(empty_url, "SELECT id FROM rejections")] == [anonymous]


def test_an_events_executions_are_read_by_index(database_url: str) -> None:
    """The trace's read of an event's executions (`list_executions(event_id=…)`) goes
    through an index leading with (account_id, event_id) (migration 0023), not through
    every execution of the account."""
    from tests.contract.test_erasure import plan_of

    with connect(database_url) as ledger:
        ledger.migrate()
    params = {"account": str(uuid4()), "event": str(uuid4())}
    if database_url.startswith("sqlite:"):
        statement = ("SELECT id FROM executions WHERE account_id = :account "
                     "AND event_id = :event ORDER BY id DESC")  # fmt: skip
        plan = plan_of(database_url, statement, params)
        assert any("executions_event" in line and "event_id=?" in line for line in plan), plan
        return
    statement = ("SELECT id FROM executions WHERE account_id = %(account)s "
                 "AND event_id = %(event)s ORDER BY id DESC")  # fmt: skip
    plan = plan_of(database_url, statement, params)
    assert any("executions_event" in line for line in plan), plan  # not the unique key's
    assert any("Index Cond" in line and "event_id =" in line for line in plan), plan


def test_an_executions_events_are_read_by_a_partial_index(database_url: str) -> None:
    """`GET /v1/executions/{id}` reads the events an execution emitted (`list_events` by
    automation_execution_id) through the partial index of migration 0025, newest first
    without a sort: among a few thousand events, PostgreSQL walked the account's events."""
    from tests.contract.test_erasure import plan_of

    execution = uuid4()
    with connect(database_url) as ledger:
        ledger.migrate()
        account = ledger.create_account("Loja")
        ana = ledger.create_contact(account.id, email="ana@example.com")
        events = [
            sinal.EmitEvent(account_id=account.id, contact_id=ana.id, metric_name="Order Paid",
                            source="shopify", source_id=str(i),
                            automation_execution_id=execution if i % 1000 == 0 else None)
            for i in range(3000)
        ]  # fmt: skip
        for start in range(0, len(events), 1000):
            ledger.emit_many(events[start : start + 1000])
    params = {"account": str(account.id), "execution": str(execution)}
    if database_url.startswith("sqlite:"):
        statement = ("SELECT id FROM events WHERE account_id = :account AND "
                     "automation_execution_id = :execution "
                     "ORDER BY occurred_at DESC, id DESC LIMIT 1001")  # fmt: skip
        plan = plan_of(database_url, statement, params)
        assert any("events_execution" in line for line in plan), plan
        assert not any("TEMP B-TREE" in line for line in plan), plan  # no sort
        return
    sql(database_url, "ANALYZE events")  # as autovacuum would: the planner sees the table
    statement = ("SELECT id FROM events WHERE account_id = %(account)s AND "
                 "automation_execution_id = %(execution)s "
                 "ORDER BY occurred_at DESC, id DESC LIMIT 1001")  # fmt: skip
    with psycopg.connect(database_url) as conn:
        plan = [r[0] for r in conn.execute(f"EXPLAIN {statement}", params)]
    assert any("events_execution" in line for line in plan), plan
    assert not any("Seq Scan" in line or "Sort" in line for line in plan), plan


# Each filter of `GET /v1/contacts`, as `contact_query` leaves it.
CONTACT_FILTERS = {
    "none": {},
    "tag": {"tag": "t7"},
    "email": {"email": "c42@loja.com"},
    "phone": {"phone": "+5511987600042"},
    "external_id": {"external_id": "x42"},
    "tag and email": {"tag": "t7", "email": "c42@loja.com"},
}
_NOW = "'2026-01-01T00:00:00.000000Z'"
# `n` contacts with an email, phone and external id each, one tag of 100 each (the
# account's id is the only parameter of each statement).
_MANY_CONTACTS = {
    "sqlite": [
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < {last}) "
        "INSERT INTO contacts (account_id, id, email, phone, external_id, created_at, "
        "updated_at) SELECT ?, printf('00000000-0000-7000-8000-%012d', i), 'c' || i || "
        f"'@loja.com', printf('+55119876%05d', i), 'x' || i, {_NOW}, {_NOW} FROM n",
        "INSERT INTO contact_tags (account_id, contact_id, tag, created_at) SELECT account_id, "
        f"id, 't' || (CAST(substr(external_id, 2) AS INTEGER) % 100), {_NOW} FROM contacts "
        "WHERE account_id = ?",
    ],
    "postgres": [
        "INSERT INTO contacts (account_id, id, email, phone, external_id) SELECT ?, "
        "gen_random_uuid(), 'c' || i || '@loja.com', '+55119876' || lpad(i::text, 5, '0'), "
        "'x' || i FROM generate_series(0, {last}) i",
        "INSERT INTO contact_tags (account_id, contact_id, tag) SELECT account_id, id, "
        "'t' || mod(substr(external_id, 2)::int, 100) FROM contacts WHERE account_id = ?",
    ],
}


def _many_contacts(url: str, account: str, n: int) -> None:
    backend = "sqlite" if url.startswith("sqlite:") else "postgres"
    for statement in _MANY_CONTACTS[backend]:
        sql(url, statement.format(last=n - 1), account)
    for kind in ("email", "phone", "external_id"):
        sql(url, "INSERT INTO contact_identities (account_id, kind, value, contact_id) "
            f"SELECT account_id, '{kind}', {kind}, id FROM contacts WHERE account_id = ?",
            account)  # fmt: skip


def _contacts_plan(url: str, statement: str, args: list[Any]) -> list[str]:
    """The plan of `list_contacts`' statement (PostgreSQL's with its statistics and
    sequential scans priced out, as on an account too large to read)."""
    if url.startswith("sqlite:"):
        params = [str(a) if isinstance(a, UUID) else a for a in args]
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as lite:
            return [r[-1] for r in lite.execute(f"EXPLAIN QUERY PLAN {statement}", params)]
    with psycopg.connect(url) as conn:  # one transaction: the setting holds
        conn.execute("SET LOCAL enable_seqscan = off")
        return [r[0] for r in conn.execute(f"EXPLAIN {statement}", args)]


def test_a_contacts_list_is_an_index_range_whatever_its_filter(database_url: str) -> None:
    """`list_contacts`' statement, among 5,000 contacts, for each filter, on the first
    page and the next: no table read whole, the page not sorted; a tag's contacts through
    `contact_tags_tag` (migration 0027: the key leads with the contact, so they were found
    by walking every contact), an identity's contact through `contact_identities`' key;
    the account's contacts in the order of their key."""
    from sinal.store.postgres import _CONTACT_TAGS

    with connect(database_url) as ledger:
        account = ledger.create_account("Loja").id
    _many_contacts(database_url, str(account), 5000)
    is_sqlite = database_url.startswith("sqlite:")
    if not is_sqlite:
        sql(database_url, "VACUUM ANALYZE")  # as autovacuum would: the planner sees the tables
    plans = {}
    for case, filters in CONTACT_FILTERS.items():
        # the next page from before the first contact: a random id, past most of the
        # account's (random ids on PostgreSQL), left a page of few rows, which PostgreSQL
        # rightly read by a bitmap and sorted
        for after in (None, UUID(int=1)):
            query = ContactQuery(account, after=after, limit=101, **filters)
            built = (
                contacts_page_sql(query, "?")
                if is_sqlite
                else contacts_page_sql(query, "%s", _CONTACT_TAGS)
            )
            plans[case, after is not None] = _contacts_plan(database_url, *built)

    for (case, _), plan in plans.items():
        identity = case not in ("none", "tag")
        text = "\n".join(plan)
        if is_sqlite:
            assert not any(line.startswith("SCAN ") for line in plan), plan
            # sorted only when an identity names the one contact it may be
            assert identity or "TEMP B-TREE" not in text, plan
        else:
            assert "Seq Scan" not in text, plan
            # a tag's few contacts may be read by a bitmap and sorted: never the account's
            assert case != "none" or "Sort Key: c.id" not in text, plan
        assert ("contact_identities" in text) == identity, plan
        if not identity:  # else the contact's own tags are its key's
            assert ("contact_tags_tag" in text) == (case == "tag"), plan


def test_a_kept_versions_executions_are_found_by_a_partial_index(database_url: str) -> None:
    """`prune_versions` asks every housekeeping pass whether an execution that may still
    run names a kept version: through the partial index of migration 0028, not the index
    of an automation's executions (0022), which walked every one it ever made."""
    from sinal.store import postgres_retention, sqlite_retention
    from tests.contract.test_erasure import plan_of

    with connect(database_url) as ledger:
        ledger.migrate()
    if database_url.startswith("sqlite:"):
        unneeded = sqlite_retention._UNNEEDED.replace("?", ":before")
    else:
        unneeded = postgres_retention._UNNEEDED
    statement = f"SELECT account_id, id FROM automation_versions v WHERE {unneeded}"
    plan = plan_of(database_url, statement, {"before": "2026-01-01T00:00:00Z"})
    assert any("executions_live_version" in line for line in plan), plan
    assert not any("executions_automation" in line for line in plan), plan


def _respelled_back(url: str, contact: UUID, kind: str, old: str) -> None:
    """Give a contact's identity of `kind` the spelling sinal stored before 0032."""
    sql(url, f"UPDATE contacts SET {kind} = ? WHERE id = ?", old, str(contact))
    sql(url, "UPDATE contact_identities SET value = ? WHERE contact_id = ? AND kind = ?",
        old, str(contact), kind)  # fmt: skip


def test_migration_0032_rewrites_identities_stored_in_an_older_spelling_but_merges_none(
    empty_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An email kept with full-width letters and an id kept decomposed are found by what
    users send after 0032. Left as stored, each named in a warning: one whose form now is
    another contact's, two whose forms now are one, and one refused now."""
    _migrate_up_to(empty_url, 31)
    older = {  # contact: (kind, as sinal stored it before 0032)
        "ana": ("email", "ａｎａ@example.com"),
        "bob": ("email", "bob@example.com"),  # today's form: another contact's
        "old-bob": ("email", "ｂｏｂ@example.com"),
        "jose": ("external_id", "Ana-Jose\u0301"),
        "other-jose": ("external_id", "Jos\u00e9"),  # today's form
        "old-jose": ("external_id", "Jose\u0301"),
        "twin-1": ("external_id", "A\u030a"),  # both "Å" in NFC
        "twin-2": ("external_id", "\u212b"),  # the Angstrom sign
        "fi": ("email", "\ufb01nance@example.com"),  # "ﬁ": refused now
    }
    with connect(empty_url) as ledger:
        account = ledger.create_account("Loja").id
        made = {name: ledger.create_contact(account, email=f"{name}@x.com", external_id=name).id
                for name in older}  # fmt: skip
    for name, (kind, old) in older.items():
        sql(empty_url, f"UPDATE contacts SET {kind} = ? WHERE id = ?", old, str(made[name]))
        sql(empty_url, "UPDATE contact_identities SET value = ? WHERE contact_id = ? "
            "AND kind = ?", old, str(made[name]), kind)  # fmt: skip

    with connect(empty_url) as ledger:
        backend = "sqlite" if empty_url.startswith("sqlite:") else "postgres"
        assert ledger.migrate() == [v for v, _, _ in read_migrations(backend) if v > 31]
        sent = [("email", "ana@example.com"), ("email", "ＡＮＡ＠ｅｘａｍｐｌｅ.com"),
                ("external_id", "Ana-Jos\u00e9"), ("email", "bob@example.com"),
                ("external_id", "Jos\u00e9")]  # fmt: skip
        found = [ledger.upsert_contact(account, **{kind: value}) for kind, value in sent]
        stored = {n: ledger.get_contact(account, made[n]) for n in older}
    assert [(c.id, is_new) for c, is_new in found] == [
        (made[n], False) for n in ("ana", "ana", "jose", "bob", "other-jose")
    ]
    assert {n: getattr(c, older[n][0]) for n, c in stored.items() if c} == {
        "ana": "ana@example.com",
        "jose": "Ana-Jos\u00e9",
        **{n: older[n][1] for n in ("bob", "old-bob", "other-jose", "old-jose", "twin-1",
                                    "twin-2", "fi")},
    }  # fmt: skip
    warned = " ".join(r.getMessage() for r in caplog.records if "0032" in r.getMessage())
    for name in ("old-bob", "old-jose", "twin-1", "twin-2", "fi"):
        assert str(made[name]) in warned, name
    # and listed at any time after, with the contacts holding each one's form now
    args = ["contacts", "older-spellings", "--account", str(account), "--database-url"]
    listed = CliRunner().invoke(cli, [*args, empty_url, "--json"])
    assert listed.exit_code == 0, listed.output
    ids = {str(i): n for n, i in made.items()}
    assert sorted(
        (ids[u["contact_id"]], u["kind"], u["value"], u["reason"], [ids[h] for h in u["holders"]])
        for u in json.loads(listed.output)["identities"]
    ) == [
        ("fi", "email", "\ufb01nance@example.com", "refused", []),
        ("old-bob", "email", "ｂｏｂ@example.com", "taken", ["bob"]),
        ("old-jose", "external_id", "Jose\u0301", "taken", ["other-jose"]),
        ("twin-1", "external_id", "A\u030a", "taken", ["twin-2"]),
        ("twin-2", "external_id", "\u212b", "taken", ["twin-1"]),
    ]
    text = CliRunner().invoke(cli, [*args, empty_url]).output
    assert f"{made['fi']}  email  \ufb01nance@example.com  refused\n" in text
    assert f"{made['old-bob']}  email  ｂｏｂ@example.com  taken (also {made['bob']})\n" in text
