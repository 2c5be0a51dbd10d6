"""Settings read from the environment: each checked against its range, SINAL_PUBLIC_URL tidied,
and the README's table kept in step."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from sinal.automations.backoff import RetryPolicy
from sinal.config import Settings, describe
from sinal.errors import ConfigurationError
from sinal.retention import Retention
from sinal.store import open_store
from sinal.worker import dispatch_settings


@pytest.mark.parametrize(
    ("raw", "public_url"),
    [
        ("https://sin.al", "https://sin.al"),
        ("https://sin.al/", "https://sin.al"),  # no `//l/{token}` in short links
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("https://crm.lojadaana.com.br/sinal/", "https://crm.lojadaana.com.br/sinal"),
        ("  https://sin.al\n", "https://sin.al"),
        ("", ""),  # set but empty: the request's own, as when unset
    ],
)
def test_settings_public_url_accepts_an_http_base_and_strips_its_trailing_slash(
    raw: str, public_url: str
) -> None:
    assert Settings.from_env({"SINAL_PUBLIC_URL": raw}).public_url == public_url


@pytest.mark.parametrize(
    "raw",
    [
        "sin.al",  # no scheme: links would come out relative
        "sin.al/l",
        "localhost:8000",
        "//sin.al",
        "ftp://sin.al",
        "https://",
        "https://:8443",
        "https://sin.al:porta",
        "https://sin.al:99999",
        "https://sin.al?utm_source=whatsapp",
        "https://sin.al/?",
        "https://sin.al/#top",
        "https://sin al",
        # short links no one could open: checked as a connection's base URL
        "https://sin.al:0",
        "https://ana:senha@sin.al",
        "https://a..b",
        "https://999.1.1.1",
        "http://[::1",  # urlsplit's ValueError, not a ConfigurationError
    ],
)
def test_settings_public_url_rejects_what_is_not_an_absolute_http_url(raw: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"SINAL_PUBLIC_URL": raw})
    assert str(caught.value) == (
        f"SINAL_PUBLIC_URL={raw!r} must be an absolute http:// or https:// URL with a host "
        "and no query or fragment, e.g. https://sin.al"
    )


def test_settings_public_url_is_unset_by_default() -> None:
    assert Settings.from_env({}).public_url == ""


@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        ("SINAL_PORT", "0", "SINAL_PORT=0 must be within 1..65535"),
        ("SINAL_PORT", "70000", "SINAL_PORT=70000 must be within 1..65535"),
        ("SINAL_PORT", "80.5", "SINAL_PORT='80.5' is not a whole number"),
        ("SINAL_PORT", "http", "SINAL_PORT='http' is not a whole number"),
        ("SINAL_WORKERS", "0", "SINAL_WORKERS=0 must be within 1..256"),
        # no wait at all would fail every call that meets a busy pool or lock
        ("SINAL_DATABASE_WAIT", "0", "SINAL_DATABASE_WAIT=0 must be within 0.1..3600"),
        ("SINAL_DATABASE_WAIT", "inf", "SINAL_DATABASE_WAIT=inf must be within 0.1..3600"),
        ("SINAL_DATABASE_WAIT", "30s", "SINAL_DATABASE_WAIT='30s' is not a number"),
        ("SINAL_AUTH_CACHE_TTL", "-1", "SINAL_AUTH_CACHE_TTL=-1 must be within 0..3600"),
        # a key cached forever: revoking it would never take effect
        ("SINAL_AUTH_CACHE_TTL", "inf", "SINAL_AUTH_CACHE_TTL=inf must be within 0..3600"),
        ("SINAL_AUTH_CACHE_TTL", "nan", "SINAL_AUTH_CACHE_TTL=nan must be within 0..3600"),
        ("SINAL_AUTH_CACHE_TTL", "2s", "SINAL_AUTH_CACHE_TTL='2s' is not a number"),
        ("SINAL_MAX_EVENT_BYTES", "0", "SINAL_MAX_EVENT_BYTES=0 must be within 1024..67108864"),
        ("SINAL_MAX_BATCH_BYTES", "1e9", "SINAL_MAX_BATCH_BYTES='1e9' is not a whole number"),
        (
            "SINAL_MAX_BATCH_BYTES",
            "1000000000",
            "SINAL_MAX_BATCH_BYTES=1000000000 must be within 1024..268435456",
        ),
        # over the ledger's batch limit: every shared transaction would fail
        (
            "SINAL_GROUP_COMMIT_MAX_BATCH",
            "5000",
            "SINAL_GROUP_COMMIT_MAX_BATCH=5000 must be within 1..1000",
        ),
        (
            "SINAL_GROUP_COMMIT_MAX_BATCH",
            "0",
            "SINAL_GROUP_COMMIT_MAX_BATCH=0 must be within 1..1000",
        ),
        # a lone request would wait that long for company
        (
            "SINAL_GROUP_COMMIT_MAX_DELAY",
            "1e9",
            "SINAL_GROUP_COMMIT_MAX_DELAY=1000000000 must be within 0..1",
        ),
        (
            "SINAL_GROUP_COMMIT_MAX_DELAY",
            "-0.001",
            "SINAL_GROUP_COMMIT_MAX_DELAY=-0.001 must be within 0..1",
        ),
        (
            "SINAL_LOG_LEVEL",
            "verbose",
            "SINAL_LOG_LEVEL='verbose' must be one of critical, error, warning, info, debug, trace",
        ),
        ("SINAL_WORKER_LEASE", "0", "SINAL_WORKER_LEASE=0 must be within 1..86400"),
        # was taken as 1, silently
        ("SINAL_WORKER_CONCURRENCY", "0", "SINAL_WORKER_CONCURRENCY=0 must be within 1..1024"),
        # a poll loop with no pause
        (
            "SINAL_WORKER_POLL_INTERVAL",
            "0",
            "SINAL_WORKER_POLL_INTERVAL=0 must be within 0.01..3600",
        ),
        (
            "SINAL_HOUSEKEEPING_INTERVAL",
            "-5",
            "SINAL_HOUSEKEEPING_INTERVAL=-5 must be 0 or within 1..86400",
        ),
        # 0 turns it off; a sliver above 0 had every worker querying the database non-stop
        (
            "SINAL_HOUSEKEEPING_INTERVAL",
            "0.001",
            "SINAL_HOUSEKEEPING_INTERVAL=0.001 must be 0 or within 1..86400",
        ),
        (
            "SINAL_HOUSEKEEPING_INTERVAL",
            "0.5",
            "SINAL_HOUSEKEEPING_INTERVAL=0.5 must be 0 or within 1..86400",
        ),
        (
            "SINAL_HOUSEKEEPING_INTERVAL",
            "nan",
            "SINAL_HOUSEKEEPING_INTERVAL=nan must be 0 or within 1..86400",
        ),
        # a period is whole days, 0 (keep for ever) or at most a hundred years
        (
            "SINAL_REJECTIONS_RETENTION_DAYS",
            "-1",
            "SINAL_REJECTIONS_RETENTION_DAYS=-1 must be 0 or within 1..36500",
        ),
        (
            "SINAL_REJECTIONS_RETENTION_DAYS",
            "36501",
            "SINAL_REJECTIONS_RETENTION_DAYS=36501 must be 0 or within 1..36500",
        ),
        (
            "SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS",
            "99999999999",
            "SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS=99999999999 must be 0 or within 1..36500",
        ),
        (
            "SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS",
            "7.5",
            "SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS='7.5' is not a whole number",
        ),
        (
            "SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS",
            "30d",
            "SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS='30d' is not a whole number",
        ),
        (
            "SINAL_EXECUTIONS_RETENTION_DAYS",
            "nan",
            "SINAL_EXECUTIONS_RETENTION_DAYS='nan' is not a whole number",
        ),
        (
            "SINAL_EXECUTIONS_RETENTION_DAYS",
            "inf",
            "SINAL_EXECUTIONS_RETENTION_DAYS='inf' is not a whole number",
        ),
        (
            "SINAL_EXECUTIONS_RETENTION_DAYS",
            "",
            "SINAL_EXECUTIONS_RETENTION_DAYS='' is not a whole number",
        ),
        (
            "SINAL_EXECUTIONS_RETENTION_DAYS",
            "forever",
            "SINAL_EXECUTIONS_RETENTION_DAYS='forever' is not a whole number",
        ),
        ("SINAL_MAX_ATTEMPTS", "0", "SINAL_MAX_ATTEMPTS=0 must be within 1..100"),
        ("SINAL_RETRY_BASE", "-1", "SINAL_RETRY_BASE=-1 must be within 0.01..3600"),
        # no backoff at all: every attempt at once (it failed at startup with a traceback)
        ("SINAL_RETRY_BASE", "0", "SINAL_RETRY_BASE=0 must be within 0.01..3600"),
        ("SINAL_RETRY_BASE", "nan", "SINAL_RETRY_BASE=nan must be within 0.01..3600"),
        ("SINAL_RETRY_CAP", "0.5", "SINAL_RETRY_CAP=0.5 must be within 1..604800"),
        ("SINAL_RETRY_CAP", "inf", "SINAL_RETRY_CAP=inf must be within 1..604800"),
        ("SINAL_RETRY_CAP", "6h", "SINAL_RETRY_CAP='6h' is not a number"),
        ("SINAL_RETRY_CAP", "5", "SINAL_RETRY_CAP=5 must be at least SINAL_RETRY_BASE=10"),
        ("SINAL_HTTP_TIMEOUT", "0", "SINAL_HTTP_TIMEOUT=0 must be within 0.1..3600"),
        ("SINAL_SERVE_WORKER", "maybe", "SINAL_SERVE_WORKER='maybe' is not true or false"),
        ("SINAL_HOST", " ", "SINAL_HOST must not be empty"),
    ],
)
def test_settings_out_of_range_is_refused_naming_the_variable_and_the_range(
    variable: str, raw: str, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({variable: raw})
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("variable", "raw", "name", "value"),
    [
        ("SINAL_PORT", "1", "port", 1),
        ("SINAL_PORT", "65535", "port", 65_535),
        ("SINAL_DATABASE_WAIT", "0.1", "database_wait", 0.1),
        ("SINAL_DATABASE_WAIT", "3600", "database_wait", 3_600.0),
        ("SINAL_AUTH_CACHE_TTL", "0", "auth_cache_ttl", 0.0),  # no cache
        ("SINAL_GROUP_COMMIT_MAX_BATCH", "1000", "group_commit_max_batch", 1_000),
        ("SINAL_GROUP_COMMIT_MAX_DELAY", "0", "group_commit_max_delay", 0.0),
        ("SINAL_GROUP_COMMIT_MAX_DELAY", "1", "group_commit_max_delay", 1.0),
        ("SINAL_LOG_LEVEL", "WARNING", "log_level", "WARNING"),  # uvicorn takes any case
        ("SINAL_WORKER_LEASE", "2", "worker_lease", 2.0),
        ("SINAL_WORKER_POLL_INTERVAL", "0.2", "worker_poll_interval", 0.2),
        ("SINAL_HOUSEKEEPING_INTERVAL", "0", "housekeeping_interval", 0.0),  # none
        ("SINAL_HOUSEKEEPING_INTERVAL", "1", "housekeeping_interval", 1.0),
        ("SINAL_HOUSEKEEPING_INTERVAL", "86400", "housekeeping_interval", 86_400.0),
        ("SINAL_REJECTIONS_RETENTION_DAYS", "0", "rejections_retention_days", 0),  # for ever
        ("SINAL_REJECTIONS_RETENTION_DAYS", "1", "rejections_retention_days", 1),
        ("SINAL_WEBHOOK_DELIVERIES_RETENTION_DAYS", "30", "webhook_deliveries_retention_days", 30),
        ("SINAL_EXECUTIONS_RETENTION_DAYS", "36500", "executions_retention_days", 36_500),
        ("SINAL_RETRY_BASE", "0.05", "retry_base", 0.05),
        ("SINAL_RETRY_CAP", "10", "retry_cap", 10.0),  # = the base: a constant backoff
        ("SINAL_RETRY_CAP", "604800", "retry_cap", 604_800.0),
        ("SINAL_MAX_ATTEMPTS", "100", "max_attempts", 100),
        ("SINAL_SERVE_WORKER", "off", "serve_worker", False),
    ],
)
def test_settings_at_the_edges_of_their_range_are_taken(
    variable: str, raw: str, name: str, value: object
) -> None:
    assert getattr(Settings.from_env({variable: raw}), name) == value


def test_settings_overrides_are_checked_as_the_environment_is() -> None:
    with pytest.raises(ConfigurationError, match=r"^SINAL_PORT=70000 must be within 1\.\.65535$"):
        Settings.from_env({}).with_overrides(port=70_000)


def test_settings_defaults_are_within_their_ranges_and_described_with_them() -> None:
    Settings()  # checks every field

    described = {variable: meaning for variable, _, meaning in describe()}

    assert described["SINAL_GROUP_COMMIT_MAX_DELAY"].endswith("[0..1]")
    assert described["SINAL_WORKER_POLL_INTERVAL"].endswith("[0.01..3600]")
    assert described["SINAL_HOUSEKEEPING_INTERVAL"].endswith("[0 or 1..86400]")
    assert described["SINAL_EXECUTIONS_RETENTION_DAYS"].endswith("[0 or 1..36500]")
    assert described["SINAL_DATABASE_URL"].endswith("postgresql://…")  # no range: text


def test_readme_settings_table_lists_every_setting_with_its_range() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("\n## Settings\n", 1)[1].strip().split("\n\n", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    documented = {cells[0].strip("|` "): cells[2] for cells in rows}

    described = describe()

    assert list(documented) == [variable for variable, _, _ in described]
    for variable, _, meaning in described:
        if meaning.endswith("]"):  # a number, with its range
            low, high = meaning.rsplit("[", 1)[1].rstrip("]").split("..")
            assert documented[variable] == f"{low}–{high}", variable


def test_settings_keep_every_row_for_ever_by_default() -> None:
    """sinal loses nothing unless the operator asks: no retention period is set."""
    assert Settings.from_env({}).retention() == Retention()
    assert Retention().cutoffs(datetime.now(UTC)) == {}
    taken = Settings.from_env({
        "SINAL_REJECTIONS_RETENTION_DAYS": "30", "SINAL_EXECUTIONS_RETENTION_DAYS": "90",
    })  # fmt: skip
    assert taken.retention() == Retention(rejections=30, webhook_deliveries=0, executions=90)


def test_settings_retry_policy_is_the_one_a_worker_retries_with() -> None:
    settings = Settings.from_env(
        {"SINAL_MAX_ATTEMPTS": "5", "SINAL_RETRY_BASE": "2", "SINAL_RETRY_CAP": "60"}
    )

    assert dispatch_settings(settings).retry == RetryPolicy(max_attempts=5, base=2.0, cap=60.0)
    assert dispatch_settings(Settings()).retry == RetryPolicy()  # the library's defaults


@pytest.mark.parametrize("url", ["sqlite:///shop.db?mode=ro", "sqlite:////tmp/x/shop.db?"])
def test_sqlite_url_with_a_query_string_is_refused_naming_the_form_to_use(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the query string was taken as part of the file's name: "shop.db?mode=ro" was created
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError, match=r"has a query string.*sqlite:///relative\.db"):
        open_store(url)
    assert list(tmp_path.iterdir()) == []
