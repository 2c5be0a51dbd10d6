"""Keys and scopes, health, readiness, Prometheus metrics, the account, the schema."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from fastapi.routing import APIRoute

from sinal.api import errors
from sinal.api.app import create_app
from sinal.api.query_params import QueryChecked
from sinal.automations.service import Automations
from sinal.config import Settings
from sinal.errors import InvalidAccount, StoreError, StoreUnavailable
from sinal.ledger import Ledger, connect
from tests.helpers import count, sql
from tests.integration.conftest import Api, running_api

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer snl_nope",
        "Bearer snl_0123456789abcdef0123456789abcdef_" + "A" * 43,
    ],
)
async def test_missing_malformed_or_unknown_keys_are_401(api: Api, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    api.client.headers.pop("Authorization")
    response = await api.client.get("/v1/events", headers=headers)

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"] == "application/problem+json"


async def test_a_revoked_key_is_401_at_once_without_cache(api: Api) -> None:
    key_text, key = api.ledger.create_api_key(api.account.id, ["read"])
    before = await api.client.get("/v1/events", headers=api.auth(key_text))
    api.ledger.revoke_api_key(key.id)
    after = await api.client.get("/v1/events", headers=api.auth(key_text))
    assert (before.status_code, after.status_code) == (200, 401)


async def test_another_accounts_key_text_with_this_account_id_is_401(api: Api) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = await api.key_for("read", account=other)
    forged = f"snl_{api.account.id.hex}_{theirs.rsplit('_', 1)[1]}"
    response = await api.client.get("/v1/events", headers=api.auth(forged))
    assert response.status_code == 401


async def test_missing_scope_is_403(api: Api) -> None:
    reader = await api.key_for("read")
    writer = await api.key_for("ingest")

    write = await api.post("/v1/events", {"metric": "x"}, headers=api.auth(reader))
    read = await api.client.get("/v1/events", headers=api.auth(writer))
    admin = await api.client.patch("/v1/account", json={"name": "X"}, headers=api.auth(writer))
    own = await api.client.get("/v1/account", headers=api.auth(writer))

    assert (write.status_code, read.status_code, admin.status_code) == (403, 403, 403)
    assert write.json()["type"] == "/problems/forbidden"
    assert own.json()["name"] == "Loja Exemplo"


async def test_missing_scope_says_how_to_make_a_key_that_has_it(api: Api) -> None:
    # "this route needs an API key with the 'admin' scope", and no word of how to get one
    writer = await api.key_for("ingest", "read")

    admin = await api.client.patch("/v1/account", json={"name": "X"}, headers=api.auth(writer))

    assert admin.json()["detail"] == (
        "this route needs an API key with the 'admin' scope; this key has ingest, read: make "
        f"one with `sinal keys create --account {api.account.id} --scopes ingest,read,admin`"
    )


async def test_health_readiness_and_metrics(api: Api) -> None:
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    await api.post("/v1/events", {"metric": "Order Paid", "contact_id": str(contact.id),
                                  "source": "shopify", "source_id": "1"})  # fmt: skip
    await api.post("/v1/events", {"metric": "Order Paid", "contact_id": str(contact.id),
                                  "source": "shopify", "source_id": "1"})  # fmt: skip

    health = await api.client.get("/healthz")
    ready = await api.client.get("/readyz")
    metrics = (await api.client.get("/metrics")).text

    assert health.json() == {"status": "ok"}
    assert ready.json()["status"] == "ready"
    assert 'sinal_events_total{source="shopify",status="created"} 1.0' in metrics
    assert 'sinal_events_total{source="shopify",status="duplicate"} 1.0' in metrics
    assert 'route="/v1/events",status="201"' in metrics
    assert 'sinal_http_request_duration_seconds_bucket{le="0.05",method="POST"' in metrics


def _gauges(text: str) -> dict[str, float]:
    """The backlog gauges of a /metrics answer, by name."""
    names = ("sinal_outbox_rows", "sinal_outbox_oldest_seconds", "sinal_executions_due",
             "sinal_executions_oldest_due_seconds")  # fmt: skip
    return {
        name: float(value)
        for name, _, value in (line.partition(" ") for line in text.splitlines())
        if name in names
    }


async def test_metrics_show_the_workers_backlog(api: Api) -> None:
    # No worker runs in these tests' server: the backlog stays until the test moves it.
    automations = Automations(api.ledger)
    tag = {"type": "add_tag", "tag": "comprou"}
    automations.create(api.account.id, {"name": "t", "trigger_type": "order_paid", "steps": [tag]})
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    empty = _gauges((await api.client.get("/metrics")).text)

    await api.post("/v1/events", {"metric": "Order Paid", "contact_id": str(contact.id),
                                  "source": "shopify", "source_id": "1"})  # fmt: skip
    time.sleep(0.2)
    waiting = _gauges((await api.client.get("/metrics")).text)
    store = automations.store
    store.fan_out(lambda event, candidates: [a.id for a in candidates], 10)
    due = _gauges((await api.client.get("/metrics")).text)
    store.claim_executions("worker-a", 10, 60.0)
    claimed = _gauges((await api.client.get("/metrics")).text)

    assert empty == dict.fromkeys(waiting, 0.0)  # all four, at 0
    assert waiting["sinal_outbox_rows"] == 1
    assert 0.2 <= waiting["sinal_outbox_oldest_seconds"] < 60
    assert (due["sinal_outbox_rows"], due["sinal_executions_due"]) == (0, 1)
    assert 0 <= due["sinal_executions_oldest_due_seconds"] < 60
    assert (claimed["sinal_executions_due"], claimed["sinal_executions_oldest_due_seconds"]) == (
        0,
        0,
    )


async def test_metrics_without_the_database_still_answer_the_services_figures(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down() -> None:
        raise StoreError("connection to server at 10.0.0.7 failed")

    monkeypatch.setattr(api.app.state.service.ledger.store, "backlog", down)
    await api.client.get("/v1/events")
    response = await api.client.get("/metrics")

    assert response.status_code == 200
    assert 'route="/v1/events",status="200"' in response.text
    assert _gauges(response.text) == {}


async def test_probes_answer_while_every_request_thread_waits_for_the_database(
    api: Api,
) -> None:
    # Requests whose calls wait for a database that does not answer hold the threads their
    # calls run on (`Service.run`), each for up to ~30 s; /readyz and /metrics used to
    # queue behind them, past an orchestrator's or Prometheus's timeout.
    release = threading.Event()
    loop = asyncio.get_running_loop()
    held = [loop.run_in_executor(None, release.wait, 30) for _ in range(64)]
    try:
        ready = await asyncio.wait_for(api.client.get("/readyz"), 10)
        metrics = await asyncio.wait_for(api.client.get("/metrics"), 10)
    finally:
        release.set()
        await asyncio.gather(*held)

    assert ready.json()["status"] == "ready"
    assert len(_gauges(metrics.text)) == 4


async def test_a_database_that_does_not_answer_in_time_is_not_ready_and_the_backlog_waits(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def stalled() -> None:
        release.wait(30)
        raise StoreUnavailable("connection to server at 10.0.0.7 failed: timed out")

    monkeypatch.setattr("sinal.api.service.PROBE_TIMEOUT", 0.2)
    monkeypatch.setattr(api.app.state.service.ledger, "schema_version", stalled)
    monkeypatch.setattr(api.app.state.service.ledger.store, "backlog", stalled)
    try:
        ready = await api.client.get("/readyz")
        metrics = await api.client.get("/metrics")
    finally:
        release.set()

    assert ready.status_code == 503
    assert ready.json()["detail"] == "the database did not answer within 0.2 s"
    assert metrics.status_code == 200
    assert "sinal_http_requests_total" in metrics.text  # the service's own figures
    assert _gauges(metrics.text) == {}


async def test_docs_routes_have_their_own_metrics_label_and_unknown_paths_share_one(
    api: Api,
) -> None:
    paths = ["/docs", "/docs/oauth2-redirect", "/openapi.json", "/redoc", "/no/such/path"]
    statuses = [(await api.client.get(path)).status_code for path in paths]
    await api.client.post("/docs")
    await api.client.get("/other/unknown/path")
    metrics = (await api.client.get("/metrics")).text

    requests = {x for x in metrics.splitlines() if x.startswith("sinal_http_requests_total")}
    assert statuses == [200, 200, 200, 200, 404]
    assert {f'sinal_http_requests_total{{method="GET",route="{p}",status="200"}} 1.0'
            for p in paths[:4]} <= requests  # fmt: skip
    assert 'sinal_http_requests_total{method="POST",route="/docs",status="405"} 1.0' in requests
    unmatched = {x for x in requests if 'route="unmatched"' in x}
    assert unmatched == {
        'sinal_http_requests_total{method="GET",route="unmatched",status="404"} 2.0'
    }


async def test_a_redirect_to_a_known_route_is_labelled_with_that_route(api: Api) -> None:
    docs = await api.client.get("/docs/")
    events = await api.client.post("/v1/events/", json={})  # not the ingest fast path's
    contact = await api.client.get("/v1/contacts/abc/")
    unknown = await api.client.get("/no/such/path/")
    metrics = (await api.client.get("/metrics")).text

    requests = {x for x in metrics.splitlines() if x.startswith("sinal_http_requests_total")}
    assert [r.status_code for r in (docs, events, contact, unknown)] == [307, 307, 307, 404]
    assert docs.headers["location"] == "http://sinal.test/docs"
    redirected = [("GET", "/docs"), ("POST", "/v1/events"), ("GET", "/v1/contacts/{contact_id}")]
    assert {f'sinal_http_requests_total{{method="{method}",route="{route}",status="307"}} 1.0'
            for method, route in redirected} <= requests  # fmt: skip
    assert {x for x in requests if 'route="unmatched"' in x} == {
        'sinal_http_requests_total{method="GET",route="unmatched",status="404"} 1.0'
    }


async def test_a_batch_counts_each_outcome_in_the_metrics(api: Api) -> None:
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    event = {"metric": "Order Paid", "contact_id": str(contact.id), "source": "shopify"}
    batch: list[object] = [
        {**event, "source_id": "1"},
        {**event, "source_id": "2"},
        {**event, "source_id": "1"},
        {**event, "source": "yampi", "source_id": "9"},
        {"metric": "", "contact_id": str(contact.id)},  # checked by the ledger: source "api"
        "not an object",
    ]
    answer = await api.post("/v1/events/batch", {"events": batch})
    metrics = (await api.client.get("/metrics")).text

    assert [r["status"] for r in answer.json()["results"]] == [
        "created", "created", "duplicate", "created", "rejected", "rejected"
    ]  # fmt: skip
    assert 'sinal_events_total{source="shopify",status="created"} 2.0' in metrics
    assert 'sinal_events_total{source="shopify",status="duplicate"} 1.0' in metrics
    assert 'sinal_events_total{source="yampi",status="created"} 1.0' in metrics
    assert 'sinal_events_total{source="api",status="rejected"} 1.0' in metrics
    assert 'sinal_events_total{source="unknown",status="rejected"} 1.0' in metrics  # unparsed


async def test_readiness_is_503_when_migrations_are_behind(api: Api) -> None:
    [(latest,)] = sql(api.url, "SELECT max(version) FROM schema_migrations")
    sql(api.url, "DELETE FROM schema_migrations WHERE version = ?", latest)
    response = await api.client.get("/readyz")
    assert response.status_code == 503
    assert "sinal migrate" in response.json()["detail"]


async def test_readiness_is_ready_on_a_newer_schema(api: Api) -> None:
    # a rolling deploy: the new code migrated; the old code's servers stay in service
    [(latest,)] = sql(api.url, "SELECT max(version) FROM schema_migrations")
    sql(api.url, "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
        latest + 1, "from newer code", "2026-12-06T00:00:00+00:00")  # fmt: skip
    response = await api.client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "schema_version": latest + 1}
    assert "sinal migrate" not in response.text


# -- a statement the schema refuses: sinal's bug (500), or migrations to apply (503) -----

AI_CONNECTION = {"kind": "ai", "base_url": "https://ai.example", "model": "m"}
# A schema changed under the code: each statement below is run by hand on both backends.
_CHANGED = {
    "column renamed": ("ALTER TABLE integrations RENAME COLUMN name TO label",
                       "POST", "/v1/integrations", AI_CONNECTION),
    "table dropped": ("DROP TABLE contact_metrics_summary{cascade}",
                      "POST", "/v1/events", None),
}  # fmt: skip


async def _send(api: Api, method: str, path: str, body: object) -> httpx.Response:
    if body is None:  # an event of a contact
        contact = api.ledger.create_contact(api.account.id, phone="+55 11 98765-4321")
        body = {"metric": "Order Paid", "contact_id": str(contact.id), "value": "297.90",
                "source": "shopify", "source_id": "1001", "entity_type": "order"}  # fmt: skip
    return await api.client.request(method, path, json=body)


@pytest.mark.parametrize("change", sorted(_CHANGED))
async def test_a_schema_changed_under_the_code_is_500_with_an_error_id_never_retry(
    api: Api, caplog: pytest.LogCaptureFixture, change: str
) -> None:
    """A table or column that is not there on a migrated database is a bug (or a schema
    changed by hand): sending the request again fails alike. 500 with the `error_id` of
    the log line holding the traceback, no Retry-After; it was 503 "retry" for ever."""
    statement, method, path, body = _CHANGED[change]
    cascade = "" if api.url.startswith("sqlite") else " CASCADE"
    sql(api.url, statement.format(cascade=cascade))

    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        response = await _send(api, method, path, body)

    assert response.status_code == 500, response.text
    assert "Retry-After" not in response.headers
    problem = response.json()
    assert problem["type"] == "/problems/internal-error"
    assert problem["detail"] == "Something went wrong on our side"  # no table, no SQL
    [logged] = [r for r in caplog.records if r.name == "sinal.api"]
    assert problem["error_id"] in logged.getMessage()
    assert logged.exc_info is not None
    assert count(api.url, "events") == 0


async def test_a_schema_behind_the_code_asks_for_sinal_migrate(
    api: Api, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same statement on a database whose last migration is not applied (a server
    started with --no-migrate before `sinal migrate`): 503 naming `sinal migrate`, as
    /readyz says, and one line logged without a traceback; not a bug's 500."""
    [(latest,)] = sql(api.url, "SELECT max(version) FROM schema_migrations")
    sql(api.url, "DELETE FROM schema_migrations WHERE version = ?", latest)
    sql(api.url, "ALTER TABLE integrations RENAME COLUMN name TO label")
    monkeypatch.setattr(errors, "_unavailable", errors._ThrottledLog())  # not throttled

    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        response = await api.post("/v1/integrations", AI_CONNECTION)

    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "2"
    problem = response.json()
    assert problem["type"] == "/problems/schema-out-of-date"
    assert "sinal migrate" in problem["title"]
    assert "error_id" not in problem
    [logged] = [r for r in caplog.records if r.name == "sinal.api"]
    assert "run `sinal migrate`" in logged.getMessage()
    assert logged.exc_info is None


async def test_a_database_never_migrated_asks_for_sinal_migrate(empty_url: str) -> None:
    """`sinal serve --no-migrate` on a new database: every request is 503 naming
    `sinal migrate` (the API key's lookup finds no table), not "the database is
    unavailable", nor a bug's 500."""
    app = create_app(Settings(database_url=empty_url, serve_worker=False))
    key = "snl_" + "0" * 32 + "_" + "A" * 43
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sinal.test") as client:
            response = await client.get("/v1/events", headers={"Authorization": f"Bearer {key}"})

    assert response.status_code == 503, response.text
    assert response.json()["type"] == "/problems/schema-out-of-date"


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("sqlstate", "status"),
    [
        # passing: the database cannot take it now; 503 with Retry-After, as before
        ("40001", 503),  # serialization failure
        ("40P01", 503),  # deadlock
        ("55P03", 503),  # lock not available (SINAL_DATABASE_WAIT)
        ("57P01", 503),  # admin shutdown
        ("53300", 503),  # too many connections
        ("53100", 503),  # disk full
        ("25006", 503),  # read-only transaction: a standby (a failover), or read-only set
        ("25P03", 503),  # idle_in_transaction_session_timeout: the session was ended
        ("25P04", 503),  # transaction_timeout (PostgreSQL 17): the session was ended
        # sinal's own SQL, whatever the input: 500, never "retry"
        ("42P01", 500),  # undefined table
        ("42703", 500),  # undefined column
        ("42883", 500),  # undefined function
        ("42601", 500),  # syntax error
        ("0A000", 500),  # feature not supported
        ("0B000", 500),  # invalid transaction initiation: sinal's own transaction handling
        ("0Z002", 500),  # GET STACKED DIAGNOSTICS outside a handler: a plpgsql routine's bug
        ("21000", 500),  # cardinality violation
        ("26000", 500),  # invalid SQL statement name (a prepared statement not there)
        ("2D000", 500),  # invalid transaction termination
        ("34000", 500),  # invalid cursor name
        ("3B001", 500),  # invalid savepoint (psycopg: an OperationalError)
        ("3F000", 500),  # invalid schema name
        ("24000", 500),  # invalid cursor state
        ("25000", 500),  # invalid transaction state
        ("25001", 500),  # active SQL transaction (a statement that cannot run in one)
        ("25P01", 500),  # no active SQL transaction (SAVEPOINT outside one)
        ("25P02", 500),  # in failed SQL transaction (a statement after an error)
        ("27000", 500),  # triggered data change violation (psycopg: an OperationalError)
        ("2F005", 500),  # a function ended without RETURN (psycopg: an OperationalError)
        ("38000", 500),  # external routine exception: PL/Python's, a C extension's
        ("38001", 500),  # containing SQL not permitted
        ("39P01", 500),  # trigger protocol violated (psycopg: an OperationalError)
        ("20000", 500),  # case not found: a plpgsql CASE without the ELSE a value needed
        ("XX001", 500),  # data corrupted: the database's own fault, for its operator
        ("XX002", 500),  # index corrupted
        # a trigger someone added judging the row (sinal's raise nothing): the input's
        ("P0001", 422),  # RAISE EXCEPTION
        ("P0004", 422),  # ASSERT
        # a view's WITH CHECK OPTION: a row outside its condition, as a CHECK (23514) is
        ("44000", 422),
    ],
)
async def test_postgres_errors_are_answered_by_whether_a_retry_can_help(
    pg_api: Api, sqlstate: str, status: int
) -> None:
    """What PostgreSQL answers a statement, by its SQLSTATE (raised here by a trigger)."""
    sql(pg_api.url, "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '{sqlstate}'; END $$")  # fmt: skip
    sql(pg_api.url, "CREATE TRIGGER refuse BEFORE INSERT ON integrations "
        "FOR EACH ROW EXECUTE FUNCTION refuse()")  # fmt: skip

    response = await pg_api.post("/v1/integrations", AI_CONNECTION)

    assert response.status_code == status, response.text
    assert ("Retry-After" in response.headers) is (status == 503)
    assert ("error_id" in response.json()) is (status == 500)
    assert (await pg_api.client.get("/v1/integrations")).json()["data"] == []


async def test_account_patch_checks_the_timezone(api: Api) -> None:
    response = await api.client.patch("/v1/account", json={"timezone": "Nowhere/City"})
    assert response.status_code == 422
    assert response.json()["errors"][0] == {
        "field": "timezone",
        "code": "invalid_timezone",
        "message": "'Nowhere/City' is not an IANA time zone",
    }


@pytest.mark.parametrize(
    "zone", ["localtime", "posixrules", "Factory", "right/UTC", "posix/UTC", "America"]
)
async def test_account_timezone_is_an_iana_zone_not_a_zoneinfo_file(api: Api, zone: str) -> None:
    patched = await api.client.patch("/v1/account", json={"timezone": zone})
    query = {"since": "2026-11-01T00:00:00Z", "until": "2026-11-02T00:00:00Z", "timezone": zone}
    await api.post("/v1/events", {"metric": "Quiz Answered", "contact_id": str(
        api.ledger.create_contact(api.account.id, email="ana@example.com").id)})  # fmt: skip
    aggregate = await api.client.get("/v1/metrics/Quiz Answered/aggregates", params=query)

    assert patched.status_code == 422, patched.text
    assert [(e["field"], e["code"]) for e in patched.json()["errors"]] == [
        ("timezone", "invalid_timezone")
    ]
    assert aggregate.status_code == 422, aggregate.text
    assert (await api.client.get("/v1/account")).json()["timezone"] == "America/Sao_Paulo"
    with pytest.raises(InvalidAccount):
        api.ledger.create_account("Outra", timezone=zone)


@pytest.mark.parametrize("zone", ["UTC", "Etc/GMT+3", "America/Sao_Paulo", "US/Eastern"])
async def test_account_timezone_takes_iana_zones_and_links(api: Api, zone: str) -> None:
    patched = await api.client.patch("/v1/account", json={"timezone": zone})
    assert (patched.status_code, patched.json()["timezone"]) == (200, zone)
    assert api.ledger.create_account("Outra", timezone=zone).timezone == zone


async def test_unknown_routes_and_methods_are_problems(api: Api) -> None:
    missing = await api.client.get("/v1/nothing")
    method = await api.client.put("/v1/events")
    assert (missing.status_code, method.status_code) == (404, 405)
    assert missing.headers["content-type"] == method.headers["content-type"]
    assert method.json()["type"] == "/problems/method-not-allowed"


async def test_a_key_sent_in_the_query_says_it_goes_in_the_authorization_header(
    api: Api,
) -> None:
    # ?api_key= said only "unknown query parameter; this route takes none"
    answer = await api.client.get("/v1/account", params={"api_key": api.key})

    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"] == [{
        "field": "api_key", "code": "unknown_parameter",
        "message": "unknown query parameter; this route takes none; an API key goes in the "
                   "Authorization header: Authorization: Bearer <key>",
    }]  # fmt: skip


async def test_a_path_no_route_answers_points_to_the_docs(api: Api) -> None:
    # GET / (a first look in a browser) and a misspelt path said only "Not Found"
    for path in ("/", "/v1/event"):
        missing = await api.client.get(path)
        assert missing.status_code == 404
        assert missing.json()["detail"] == f"no route answers {path}: /docs lists the API's routes"


async def test_a_method_a_route_does_not_take_is_405_naming_those_it_takes(api: Api) -> None:
    # it said only "Method Not Allowed" (GET /v1/contacts did, before it listed contacts)
    listed = await api.client.get("/v1/links")
    replaced = await api.client.put("/v1/contacts")

    assert listed.status_code == 405
    assert listed.headers["allow"] == "POST"
    assert listed.json()["detail"] == "/v1/links takes POST, not GET"
    assert replaced.status_code == 405
    assert replaced.headers["allow"] == "GET, POST"
    assert replaced.json()["detail"] == "/v1/contacts takes GET, POST, not PUT"


async def test_a_405_names_the_methods_of_every_route_of_its_path(api: Api) -> None:
    # Starlette's Allow named the first route's alone: GET /v1/contacts/{id} is one route,
    # PATCH and DELETE two more
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    replaced = await api.client.put(f"/v1/contacts/{contact.id}")

    assert replaced.status_code == 405
    assert replaced.headers["allow"] == "DELETE, GET, PATCH"
    assert (
        replaced.json()["detail"] == f"/v1/contacts/{contact.id} takes DELETE, GET, PATCH, not PUT"
    )


async def test_a_misspelt_query_parameter_is_422_naming_it_not_ignored(api: Api) -> None:
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    api.ledger.emit_event(
        account_id=api.account.id, contact_id=contact.id, metric_name="A", properties={},
        source="api",
    )  # fmt: skip

    listed = await api.client.get("/v1/events", params={"metrc": "Order Paid", "limit": 5})
    timeline = await api.client.get(f"/v1/contacts/{contact.id}/timeline?x=1&x=2&locale=es")
    none_taken = await api.client.get("/v1/account", params={"verbose": ""})
    hot = await api.post("/v1/events?dry_run=1", {"metric": "A", "contact_id": str(contact.id)})

    assert (listed.status_code, timeline.status_code, none_taken.status_code) == (422, 422, 422)
    problem = listed.json()
    assert problem["type"] == "/problems/invalid-query"
    [error] = problem["errors"]
    assert (error["field"], error["code"]) == ("metrc", "unknown_parameter")
    assert "metric" in error["message"]  # names what the route takes
    assert [e["field"] for e in timeline.json()["errors"]] == ["x"]
    assert none_taken.json()["errors"][0]["message"].endswith("takes none")
    assert (hot.status_code, hot.json()["errors"][0]["field"]) == (422, "dry_run")  # not stored
    ok = await api.client.get("/v1/events", params={"metric": "A", "limit": 5, "locale": "es"})
    assert (ok.status_code, len(ok.json()["data"])) == (200, 1)


async def test_a_query_parameter_given_twice_is_422_naming_it_not_the_last_one_read(
    api: Api,
) -> None:
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")
    for metric in ("A", "B"):
        api.ledger.emit_event(account_id=api.account.id, contact_id=contact.id,
                              metric_name=metric, source="api")  # fmt: skip

    # the route read the last value alone: a report for A and B counted B's events only
    both = await api.client.get("/v1/events", params=[("metric", "A"), ("metric", "B")])
    limits = await api.client.get("/v1/contacts?limit=1&limit=2&limit=3&tag=vip")
    spaced = await api.client.get(f"/v1/contacts/{contact.id}/timeline?locale=es&locale=")

    assert (both.status_code, limits.status_code, spaced.status_code) == (422, 422, 422)
    assert both.json()["type"] == "/problems/invalid-query"
    [error] = both.json()["errors"]
    assert error == {"field": "metric", "code": "repeated_parameter",
                     "message": "metric is given 2 times; give it once"}  # fmt: skip
    assert [(e["field"], e["code"]) for e in limits.json()["errors"]] == [
        ("limit", "repeated_parameter")
    ]
    assert "3 times" in limits.json()["detail"]
    assert spaced.json()["errors"][0]["field"] == "locale"
    once = await api.client.get("/v1/events", params={"metric": "B"})
    assert (once.status_code, len(once.json()["data"])) == (200, 1)


def test_every_app_made_checks_a_routes_query_once(tmp_path: Path) -> None:
    """The apps made share the routers' route objects: each route gets one query check,
    not one more per app (a check per app made ended, in the whole suite, in a
    RecursionError on every request)."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'sinal.db'}", serve_worker=False)
    apps = [create_app(settings) for _ in range(3)]

    routes = [r for app in apps for r in app.router.routes if isinstance(r, APIRoute)]
    checked = [r for r in routes if r.path.startswith("/v1/")]
    assert checked
    assert all(isinstance(r.app, QueryChecked) for r in checked)
    assert not any(isinstance(cast(QueryChecked, r.app).handler, QueryChecked) for r in checked)


async def test_links_and_webhooks_keep_ignoring_query_parameters(api: Api) -> None:
    made = (await api.post("/v1/links", {"url": "https://loja.example/p"})).json()
    click = await api.client.get(f"/l/{made['token']}?utm_source=whatsapp")
    assert (click.status_code, click.headers["location"]) == (302, "https://loja.example/p")


async def test_openapi_documents_bodies_problems_and_security(api: Api) -> None:
    doc = (await api.client.get("/openapi.json")).json()
    post = doc["paths"]["/v1/events"]["post"]

    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/EventIn"
    }
    assert "application/problem+json" in post["responses"]["422"]["content"]
    assert post["security"] == [{"apiKey": []}]
    assert {"EventIn", "BatchIn", "ProblemBody", "ContactIdentities"} <= set(
        doc["components"]["schemas"]
    )
    assert (await api.client.get("/docs")).status_code == 200


@pytest.fixture
async def cached_api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    async for running in running_api(database_url, ledger_at, auth_cache_ttl=0.3):
        yield running


async def test_revocation_takes_effect_within_the_cache_ttl(cached_api: Api) -> None:
    import asyncio

    api = cached_api
    key_text, key = api.ledger.create_api_key(api.account.id, ["read"])
    assert (await api.client.get("/v1/events", headers=api.auth(key_text))).status_code == 200
    api.ledger.revoke_api_key(key.id)
    await asyncio.sleep(0.35)
    assert (await api.client.get("/v1/events", headers=api.auth(key_text))).status_code == 401


async def test_a_sqlite_write_kept_waiting_for_its_turn_is_503_and_writes_nothing(
    sqlite_url: str,
) -> None:
    """Another process's writer holds the SQLite lock file past the busy timeout: the
    request is answered 503 (retry), nothing is stored, and the next one goes through."""
    import fcntl

    path = sqlite_url.removeprefix("sqlite:///")
    with connect(sqlite_url) as ledger:
        async for api in running_api(sqlite_url, ledger):
            api.app.state.service.ledger.store._busy_timeout = 0.2
            contact = ledger.create_contact(api.account.id, email="ana@example.com")
            body = {"metric": "Order Paid", "contact_id": str(contact.id), "source_id": "1"}
            with open(f"{path}-lock", "a") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                busy = await api.post("/v1/events", body)
                fcntl.flock(held, fcntl.LOCK_UN)
            later = await api.post("/v1/events", body)

    assert busy.status_code == 503
    assert busy.headers["content-type"] == "application/problem+json"
    assert busy.headers["retry-after"] == "2"
    assert busy.json()["type"] == "/problems/store-unavailable"
    assert later.status_code == 201
    assert sql(sqlite_url, "SELECT count(*) FROM events WHERE metric_name = 'Order Paid'") == [(1,)]


async def test_a_database_failure_is_503_without_the_drivers_message(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = api.app.state.service
    contact = api.ledger.create_contact(api.account.id, email="ana@example.com")

    def down(*args: object, **kwargs: object) -> None:
        raise StoreError("connection to server at 10.0.0.7 failed: secret detail")

    monkeypatch.setattr(svc.ledger, "record_prepared", down)
    monkeypatch.setattr(svc.ledger, "list_events", down)
    write = await api.post("/v1/events", {"metric": "Order Paid", "contact_id": str(contact.id)})
    read = await api.client.get("/v1/events")

    for response in (write, read):
        assert response.status_code == 503
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["retry-after"] == "2"
        assert response.json()["type"] == "/problems/store-unavailable"
        assert "10.0.0.7" not in response.text


async def test_database_failures_are_logged_one_line_at_a_time(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from sinal.api import errors

    def down(*args: object, **kwargs: object) -> None:
        raise StoreUnavailable("connection to server at 10.0.0.7 failed")

    throttle = errors._ThrottledLog(interval=3600)
    monkeypatch.setattr(errors, "_unavailable", throttle)
    monkeypatch.setattr(api.app.state.service.ledger, "list_events", down)
    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        for _ in range(3):
            assert (await api.client.get("/v1/events")).status_code == 503
        throttle.next_at = 0  # the interval has passed
        assert (await api.client.get("/v1/events")).status_code == 503

    lines = [r for r in caplog.records if r.name == "sinal.api"]
    assert [r.getMessage() for r in lines] == [
        "GET /v1/events: the database is unavailable, answered 503: "
        "connection to server at 10.0.0.7 failed",
        "GET /v1/events: the database is unavailable, answered 503: "
        "connection to server at 10.0.0.7 failed (2 more since the last line)",
    ]
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in lines)


async def test_a_statement_the_database_refused_is_503_and_logged_with_its_traceback(
    api: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise StoreError("cache lookup failed for type 16384")  # unclassified: not an outage

    monkeypatch.setattr(api.app.state.service.ledger, "list_events", refused)
    error_ids = []
    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        for _ in range(2):
            response = await api.client.get("/v1/events")
            assert response.status_code == 503
            assert "16384" not in response.text
            error_ids.append(response.json()["error_id"])

    lines = [r for r in caplog.records if r.name == "sinal.api"]
    assert [(r.levelname, r.getMessage()) for r in lines] == [
        ("ERROR", f"GET /v1/events failed (error_id {error_id})") for error_id in error_ids
    ]
    assert all(r.exc_info is not None for r in lines)
