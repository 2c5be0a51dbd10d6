"""The CLI as a person runs it: real processes, real databases."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer

import sinal
from sinal import cli, connect
from sinal.automations.service import Automations
from sinal.store.base import latest_schema_version
from tests.contract.test_retention import OLD, age_rejection, reject
from tests.helpers import count, free_port, sql

SINAL = [sys.executable, "-m", "sinal"]
SRC = Path(sinal.__file__).resolve().parents[1]


def run(url: str, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SINAL_DATABASE_URL": url, "COLUMNS": "200", **settings}
    return subprocess.run(
        [*SINAL, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_migrate_is_idempotent_and_prints_the_version(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    first = run(url, "migrate")
    second = run(url, "migrate")
    assert first.returncode == 0, first.stderr
    assert "applied migrations 1" in first.stdout
    assert "schema is up to date" in second.stdout


def test_cli_prints_each_message_on_one_line_however_narrow(empty_url: str) -> None:
    # A log or a pipe is 80 columns to rich: "applied migrations 1, …, 16; schema version
    # 16" was cut in two there, and a script looking for "schema version 16" missed it.
    result = run(empty_url, "migrate", COLUMNS="40")

    assert result.returncode == 0, result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith("applied migrations 1, 2, 3")
    assert line.endswith(f"; schema version {latest_schema_version(empty_url.split(':', 1)[0])}")


def test_cli_demo_shows_events_duplicates_rejections_and_summary(database_url: str) -> None:
    result = run(database_url, "demo")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "duplicate" in out
    assert "contact_not_found" in out
    assert "Pedido Pago" in out  # the summary's labels are pt-BR
    # money as the templates' `| money` writes it, in events and summaries alike
    assert "R$ 297,90" in out
    assert "297.90" not in out
    assert count(database_url, "events") == 7
    assert count(database_url, "rejections") == 1


def test_cli_demo_shows_no_money_for_a_metric_that_carries_no_value(database_url: str) -> None:
    # A message has no value: its summary's total is 0, which printed "R$ 0,00" as if
    # the messages had been free orders.
    result = run(database_url, "demo")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    messages = [line for line in lines if "Mensagem" in line]  # events and summaries
    assert len(messages) == 8, result.stdout
    assert all("—" in line and "R$" not in line for line in messages), result.stdout
    [paid_summary] = [line for line in lines if "Pedido Pago" in line and "Ana" in line]
    assert "R$ 297,90" in paid_summary


def test_cli_rebuild_summaries_reports_and_fixes_drift(database_url: str) -> None:
    assert run(database_url, "demo").returncode == 0
    sql(database_url, "UPDATE contact_metrics_summary SET event_count = event_count + 5")

    fixed = run(database_url, "rebuild-summaries")
    clean = run(database_url, "rebuild-summaries")

    assert fixed.returncode == 0, fixed.stderr
    assert "fixed 7 drifted row(s)" in fixed.stdout
    assert "fixed 0 drifted row(s)" in clean.stdout


def test_cli_prune_deletes_only_what_the_settings_let_go_and_says_so(database_url: str) -> None:
    with connect(database_url) as ledger:
        account = ledger.create_account("Loja")
        age_rejection(database_url, reject(ledger, account.id), OLD)
        reject(ledger, account.id)

    kept = run(database_url, "prune")  # no period set: nothing goes
    pruned = run(database_url, "prune", SINAL_REJECTIONS_RETENTION_DAYS="30",
                 SINAL_EXECUTIONS_RETENTION_DAYS="90")  # fmt: skip
    again = run(database_url, "prune", "--json", SINAL_REJECTIONS_RETENTION_DAYS="30")

    assert kept.returncode == 0, kept.stderr
    assert kept.stdout == "nothing to prune: every SINAL_*_RETENTION_DAYS is 0 (kept for ever)\n"
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout == (
        "pruned 1 rejections older than 30 days\npruned 0 executions older than 90 days\n"
    )
    assert json.loads(again.stdout) == {"pruned": {"rejections": 0}}
    assert count(database_url, "rejections") == 1


@pytest.mark.parametrize(
    "command", [["rebuild-summaries"], ["webhooks", "replay"], ["prune"]], ids=" ".join
)
def test_cli_progress_bar_leaves_nothing_in_a_log(database_url: str, command: list[str]) -> None:
    # a bar is for a terminal: in a log or a pipe, an empty line was left on stderr
    result = run(database_url, *command)

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("url", ["mysql://nope", "sqlite:///"])
def test_cli_bad_database_url_is_one_readable_line(url: str) -> None:
    result = run(url, "migrate")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("url", "message"),
    [
        # the password was quoted whole
        (
            "postgress://app:s3cret@db/shop",
            "unsupported database URL 'postgress://app:***@db/shop': use sqlite:///file.db or "
            "postgresql://...",
        ),
        # a traceback (urlsplit's ValueError: Invalid IPv6 URL); libpq's reason quotes the URL
        ("postgresql://app:s3cret@[db/shop", "malformed PostgreSQL URL: "),
        # made a file named "sqlite:shop.db", in which nothing else found the database
        (
            "sqlite:shop.db",
            "malformed SQLite URL 'sqlite:shop.db': use sqlite:///relative.db or "
            "sqlite:////absolute.db (three slashes, then the path)",
        ),
        # made a file named "shop.db?mode=ro"
        (
            "sqlite:///shop.db?mode=ro",
            "SQLite URL 'sqlite:///shop.db?mode=ro' has a query string, which sinal does not "
            "take (it opens the file itself): use sqlite:///relative.db or sqlite:////absolute.db",
        ),
        # "unable to open database file"
        (
            "sqlite:///nowhere/shop.db",
            "cannot create the SQLite database nowhere/shop.db: there is no directory "
            "{tmp}/nowhere",
        ),
    ],
    ids=["password", "ipv6", "sqlite_slashes", "sqlite_query", "sqlite_directory"],
)
def test_cli_database_url_mistakes_are_one_line_saying_what_to_fix(
    url: str, message: str, tmp_path: Path
) -> None:
    env = {**os.environ, "SINAL_DATABASE_URL": url, "PYTHONPATH": str(SRC)}
    result = subprocess.run([*SINAL, "migrate"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip

    assert result.returncode == 1
    assert result.stderr.startswith(f"error: {message.format(tmp=tmp_path)}"), result.stderr
    assert result.stderr.count("\n") == 1
    assert "s3cret" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.postgres
def test_cli_migrate_on_a_database_not_in_utf8_is_one_line_naming_its_encoding(
    non_utf8_url: str,
) -> None:
    result = run(non_utf8_url, "migrate")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "needs a UTF8 database" in result.stderr
    [(raw,)] = sql(non_utf8_url, "SHOW server_encoding")
    encoding = raw.decode() if isinstance(raw, bytes) else raw  # SQL_ASCII answers bytes
    assert f"is {encoding}" in result.stderr
    assert sql(non_utf8_url, "SELECT to_regclass('schema_migrations') IS NULL") == [(True,)]


@pytest.mark.parametrize("command", ["serve", "worker", "prune"])
@pytest.mark.parametrize(
    ("variable", "raw", "message"),
    [
        (
            "SINAL_PUBLIC_URL",
            "sin.al",
            "SINAL_PUBLIC_URL='sin.al' must be an absolute http:// or https:// URL with a "
            "host and no query or fragment, e.g. https://sin.al",
        ),
        # these failed at startup with a traceback, or were taken as another value
        (
            "SINAL_GROUP_COMMIT_MAX_BATCH",
            "5000",
            "SINAL_GROUP_COMMIT_MAX_BATCH=5000 must be within 1..1000",
        ),
        (
            "SINAL_LOG_LEVEL",
            "verbose",
            "SINAL_LOG_LEVEL='verbose' must be one of critical, error, warning, info, debug, trace",
        ),
        ("SINAL_WORKER_CONCURRENCY", "0", "SINAL_WORKER_CONCURRENCY=0 must be within 1..1024"),
        # every worker would have run its housekeeping queries non-stop
        (
            "SINAL_HOUSEKEEPING_INTERVAL",
            "0.001",
            "SINAL_HOUSEKEEPING_INTERVAL=0.001 must be 0 or within 1..86400",
        ),
        (
            "SINAL_EXECUTIONS_RETENTION_DAYS",
            "-1",
            "SINAL_EXECUTIONS_RETENTION_DAYS=-1 must be 0 or within 1..36500",
        ),
        # a worker's retries: no backoff at all, or a cap below the first delay
        ("SINAL_RETRY_BASE", "0", "SINAL_RETRY_BASE=0 must be within 0.01..3600"),
        ("SINAL_RETRY_CAP", "5", "SINAL_RETRY_CAP=5 must be at least SINAL_RETRY_BASE=10"),
    ],
    ids=[
        "public_url",
        "group_commit_max_batch",
        "log_level",
        "worker_concurrency",
        "housekeeping_interval",
        "executions_retention_days",
        "retry_base",
        "retry_cap",
    ],
)
def test_cli_malformed_setting_is_one_line_naming_it(
    command: str, variable: str, raw: str, message: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a narrow log: no wrapping
    env[variable] = raw
    result = subprocess.run([*SINAL, command], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == f"error: {message}\n"
    assert list(tmp_path.iterdir()) == []  # refused before opening (or creating) a database


@pytest.mark.parametrize("group", [[], ["contacts"], ["executions"], ["webhooks"], ["secrets"]],
                         ids=lambda group: " ".join(["sinal", *group]))  # fmt: skip
def test_cli_help_lists_each_command_on_one_line(group: list[str]) -> None:
    # rich keeps a docstring's line breaks in the list of commands: `worker`'s row broke
    # after "runs executions and, every", `prune`'s after "older than their"
    result = run("sqlite:///unused.db", *group, "--help")

    assert result.returncode == 0, result.stderr
    panel = result.stdout.split("Commands ")[1].splitlines()[1:]
    rows = panel[: next(i for i, line in enumerate(panel) if line.startswith("╰"))]
    assert [row for row in rows if row.startswith("│  ")] == []  # a row's continuation


def _every_command(command: Any = None, path: tuple[str, ...] = ()) -> list[list[str]]:
    """Every group's and command's path: [], ["accounts"], ["accounts", "create"], ..."""
    command = typer.main.get_command(cli.app) if command is None else command
    found = [list(path)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _every_command(sub, (*path, name))
    return found


@pytest.mark.parametrize("command", _every_command(), ids=lambda path: " ".join(["sinal", *path]))
def test_cli_help_shows_what_each_option_takes_and_no_type_for_a_flag(command: list[str]) -> None:
    """Each option's row read `--json <bool>`, `--help <bool>`, as if a flag took a value,
    and `--account <str>`: a flag shows nothing there now, a value what it is (ID, URL,
    NAME, ...), as the README writes the commands."""
    result = run("sqlite:///unused.db", *command, "--help")

    assert result.returncode == 0, result.stderr
    panel = result.stdout.split("─ Options ")[1].splitlines()[1:]
    rows = panel[: next(i for i, line in enumerate(panel) if line.startswith("╰"))]
    assert [row for row in rows if "<" in row] == []
    [help_row] = [row for row in rows if " --help " in row]
    assert help_row.split("--help")[1].split() == ["Show", "this", "message", "and", "exit.", "│"]
    assert all(" ID " in row for row in rows if " --account " in row)


@pytest.mark.parametrize("option", ["--host", "--port", "--workers", "--database-url"])
def test_cli_serve_help_names_each_option_default(option: str) -> None:
    # Typer renders help with rich markup: "[default: 8000]" in a help text was taken for a
    # style tag and dropped, so --port's line read "Port ."
    result = run("sqlite:///unused.db", "serve", "--help")

    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if f" {option} " in line)
    assert "default" in line


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_cli_help_says_a_setting_without_default_is_unset(command: str) -> None:
    # "SINAL_PUBLIC_URL (default ): …"
    result = run("sqlite:///unused.db", command, "--help")

    assert result.returncode == 0, result.stderr
    assert "(default )" not in result.stdout
    assert " SINAL_PUBLIC_URL (unset): " in result.stdout
    assert " SINAL_SECRET_KEYS (unset): " in result.stdout


def test_cli_serve_port_out_of_range_is_one_line(tmp_path: Path) -> None:
    result = subprocess.run([*SINAL, "serve", "--port", "70000"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == "error: SINAL_PORT=70000 must be within 1..65535\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "host", "reason"),
    [
        ([], "no such host", "Name or service not known"),
        (["--host", "no such host"], "no such host", "Name or service not known"),
        ([], "192.0.2.1", "Cannot assign requested address"),  # another machine's
    ],
)
def test_cli_serve_host_not_of_this_machine_is_one_line_naming_it(
    args: list[str], host: str, reason: str, tmp_path: Path
) -> None:
    """uvicorn said only "[Errno -2] Name or service not known", after the database was
    made and migrated."""
    env = {**os.environ, "SINAL_PORT": str(free_port())}
    if not args:
        env["SINAL_HOST"] = host
    result = subprocess.run([*SINAL, "serve", *args], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    named = "--host " if args else "SINAL_HOST="  # as the user gave it
    assert result.stderr == f"error: {named}{host!r} is not an address of this machine: {reason}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("by_option", [True, False])
def test_cli_serve_port_taken_is_one_line_before_anything_starts(
    by_option: bool, tmp_path: Path
) -> None:
    """uvicorn said "address already in use" once the app had started (the database
    migrated, the worker running), and exited with status 3. The line names the port as
    the user gave it (it said SINAL_PORT for a --port)."""
    env = {**os.environ, "SINAL_DATABASE_URL": f"sqlite:///{tmp_path / 'sinal.db'}"}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = [*SINAL, "serve"]
        if by_option:
            serve += ["--port", str(port)]
        else:
            env["SINAL_PORT"] = str(port)
        result = subprocess.run(serve, env=env, capture_output=True, text=True, timeout=60,
                                check=False)  # fmt: skip

    assert result.returncode == 1
    named = "--port " if by_option else "SINAL_PORT="
    assert result.stderr == (
        f"error: {named}{port}: cannot listen on 127.0.0.1:{port}: Address already in use "
        "(another process listens there: stop it, or give a free port with --port or "
        "SINAL_PORT)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_worker_metrics_host_not_of_this_machine_is_one_line_naming_it(
    tmp_path: Path,
) -> None:
    """The worker blamed SINAL_WORKER_METRICS_PORT for SINAL_HOST's value."""
    url = f"sqlite:///{tmp_path / 'sinal.db'}"
    assert run(url, "migrate").returncode == 0
    env = {**os.environ, "SINAL_DATABASE_URL": url, "SINAL_HOST": "no such host",
           "SINAL_WORKER_METRICS_PORT": str(free_port())}  # fmt: skip
    result = subprocess.run([*SINAL, "worker"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        "error: SINAL_HOST='no such host' is not an address of this machine: "
        "Name or service not known\n"
    )


def test_cli_on_an_unreachable_postgresql_is_one_line_with_the_reason() -> None:
    result = run(f"postgresql://postgres@127.0.0.1:{free_port()}/test", "migrate")

    assert result.returncode == 1
    assert result.stderr.startswith("error: cannot connect to PostgreSQL: connection failed: ")
    assert result.stderr.rstrip().endswith("Connection refused"), result.stderr
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["worker", "migrate"])
def test_cli_on_a_url_libpq_cannot_read_is_one_line_at_once(command: str) -> None:
    """A query parameter libpq does not know (other tools' URLs carry `?schema=public`)
    can never connect: `sinal worker` used to wait for the database for ever, logging
    the reason every second, where `sinal migrate` stopped."""
    env = {**os.environ, "SINAL_DATABASE_URL": "postgresql://127.0.0.1/sinal?schema=public"}
    result = subprocess.run(
        [*SINAL, command], env=env, capture_output=True, text=True, timeout=30, check=False
    )

    assert result.returncode == 1
    reason = 'invalid URI query parameter: "schema"'
    assert result.stderr == f"error: malformed PostgreSQL URL: {reason}\n"


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgresql://postgres@127.0.0.1:99999/sinal", 'invalid port number: "99999"'),
        ("postgresql://postgres@127.0.0.1/sinal?sslmode=bogus", 'invalid sslmode value: "bogus"'),
    ],
)
def test_cli_worker_on_a_value_libpq_refuses_is_one_line_at_once(url: str, reason: str) -> None:
    """libpq reads these but refuses them on every connection attempt: the worker logged
    "cannot connect" every second for ever."""
    env = {**os.environ, "SINAL_DATABASE_URL": url}
    result = subprocess.run(
        [*SINAL, "worker"], env=env, capture_output=True, text=True, timeout=30, check=False
    )

    assert result.returncode == 1
    assert result.stderr == f"error: malformed PostgreSQL URL: {reason}\n"


def test_cli_worker_metrics_port_taken_is_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sinal.db'}"
    assert run(url, "migrate").returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "SINAL_DATABASE_URL": url, "SINAL_WORKER_METRICS_PORT": str(port)}
        result = subprocess.run([*SINAL, "worker"], env=env, capture_output=True, text=True,
                                timeout=60, check=False)  # fmt: skip

    assert result.returncode == 1
    assert result.stderr == (
        f"error: SINAL_WORKER_METRICS_PORT: cannot listen on 127.0.0.1:{port}: "
        "Address already in use\n"
    )


ACCOUNT = "0192a3b4-c5d6-7e8f-9a0b-1c2d3e4f5a6b"
NEEDS_SCHEMA = [  # every command that reads or writes the database but does not migrate it
    ["webhooks", "replay"],
    ["executions", "retry"],
    ["rebuild-summaries"],
    ["accounts", "create", "--name", "Loja da Ana"],
    ["accounts", "list"],
    ["keys", "create", "--account", ACCOUNT],
    ["keys", "list", "--account", ACCOUNT],
    ["keys", "revoke", ACCOUNT],
    ["worker"],  # instead of logging a missing table on every poll
    ["prune"],
]


def _tables(url: str) -> list[tuple[object, ...]]:
    if url.startswith("sqlite:"):
        return sql(url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    return sql(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")


@pytest.mark.parametrize("command", NEEDS_SCHEMA, ids=" ".join)
def test_cli_on_a_database_never_migrated_says_to_run_migrate(
    empty_url: str, command: list[str]
) -> None:
    if empty_url.startswith("sqlite:"):  # a file with no table (a missing one: below)
        Path(empty_url.removeprefix("sqlite:///")).touch()
    result = run(empty_url, *command)

    assert result.returncode == 1
    latest = latest_schema_version(empty_url.split(":", 1)[0])
    assert result.stderr == (
        f"error: schema version 0, this code needs {latest}: run `sinal migrate`\n"
    )
    assert result.stdout == ""
    assert _tables(empty_url) == []  # nothing written, not even half a schema


def test_cli_replay_works_once_the_database_is_migrated(empty_url: str) -> None:
    assert run(empty_url, "webhooks", "replay").returncode == 1
    assert run(empty_url, "migrate").returncode == 0

    replayed = run(empty_url, "webhooks", "replay")

    assert replayed.returncode == 0, replayed.stderr
    assert "replayed 0 deliveries: nothing to do" in replayed.stdout


def test_cli_on_a_database_behind_this_code_says_to_run_migrate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    assert run(url, "migrate").returncode == 0
    latest = latest_schema_version("sqlite")
    # as an older release left it: its newest migration not applied yet
    sql(url, "DELETE FROM schema_migrations WHERE version = ?", latest)
    previous = sql(url, "SELECT max(version) FROM schema_migrations")[0][0]

    result = run(url, "webhooks", "replay")

    assert result.returncode == 1
    assert result.stderr == (
        f"error: schema version {previous}, this code needs {latest}: run `sinal migrate`\n"
    )


def test_cli_migrate_on_a_database_ahead_of_this_code_says_so(tmp_path: Path) -> None:
    """Left at that version (newer code migrated it in a rolling deploy): not "up to date"."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert run(url, "migrate").returncode == 0
    latest = latest_schema_version("sqlite")
    sql(url, "INSERT INTO schema_migrations VALUES (?, 'next', '2026-12-01')", latest + 1)

    result = run(url, "migrate")

    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"schema version {latest + 1} is newer than this code's ({latest}): nothing to apply\n"
    )


@pytest.mark.parametrize("zone", ["America", "Etc", "a" * 300], ids=["dir", "etc", "long"])
def test_cli_accounts_create_with_a_zone_that_is_not_iana_is_one_line(
    database_url: str, zone: str
) -> None:
    # a directory of zone files, or a name too long for a file: a traceback (OSError) before
    result = run(database_url, "accounts", "create", "--name", "Loja", "--timezone", zone)

    assert result.returncode == 1
    assert result.stderr == f"error: timezone: {zone!r} is not an IANA time zone\n"
    assert count(database_url, "accounts") == 0


def test_cli_rebuild_summaries_account_not_a_uuid_is_a_usage_error(database_url: str) -> None:
    result = run(database_url, "rebuild-summaries", "--account", "garbage")

    assert result.returncode == 2  # a traceback (ValueError) and 1 before
    assert "Traceback" not in result.stderr
    assert "--account must be a UUID, got 'garbage'" in result.stderr


@pytest.mark.parametrize(
    "command",
    [["rebuild-summaries"], ["executions", "retry"], ["webhooks", "replay"], ["keys", "list"]],
    ids=" ".join,
)
def test_cli_unknown_account_is_an_error_naming_it(database_url: str, command: list[str]) -> None:
    # "1 account(s), 0 summary rows", "revived 0", "replayed 0", no keys: all exit 0 before
    result = run(database_url, *command, "--account", ACCOUNT)

    assert result.returncode == 1
    assert result.stderr == f"error: account {ACCOUNT} does not exist\n"
    assert result.stdout == ""


def test_cli_known_account_is_rebuilt_alone(database_url: str) -> None:
    created = run(database_url, "accounts", "create", "--name", "Loja", "--json")
    assert run(database_url, "accounts", "create", "--name", "Outra").returncode == 0
    account = json.loads(created.stdout)["id"]

    result = run(database_url, "rebuild-summaries", "--account", account)

    assert result.returncode == 0, result.stderr
    assert "1 account(s), 0 summary rows; fixed 0 drifted row(s)" in result.stdout


def test_cli_keys_list_names_each_key_by_its_label(database_url: str) -> None:
    # `keys create --name` took a label that only `--json` showed again
    account = json.loads(run(database_url, "accounts", "create", "--name", "Loja", "--json").stdout)
    create = ["keys", "create", "--account", account["id"], "--json"]
    named = json.loads(run(database_url, *create, "--name", "checkout [site]").stdout)
    unnamed = json.loads(run(database_url, *create).stdout)

    listed = run(database_url, "keys", "list", "--account", account["id"])

    assert listed.returncode == 0, listed.stderr
    assert sorted(listed.stdout.splitlines()) == sorted([
        f"{named['id']}  …{named['key'][-4:]}  ingest,read  active  checkout [site]",
        f"{unnamed['id']}  …{unnamed['key'][-4:]}  ingest,read  active",
    ])  # fmt: skip


def test_cli_executions_retry_of_an_unknown_execution_is_an_error_naming_it(
    database_url: str,
) -> None:
    result = run(database_url, "executions", "retry", ACCOUNT)  # "revived 0", exit 0 before

    assert result.returncode == 1
    assert result.stderr == f"error: no dead or unknown execution {ACCOUNT}\n"
    assert result.stdout == ""


def test_cli_executions_retry_json_says_how_many_it_revived(database_url: str) -> None:
    # the only database command of the CLI without --json: "No such option", exit 2
    with connect(database_url) as ledger:
        account = ledger.create_account("Loja")
        contact = ledger.create_contact(account.id, email="ana@example.com")
        automations = Automations(ledger)
        automations.create(account.id, {"name": "VIP", "trigger_metric": "Order Paid",
                                        "steps": [{"type": "add_tag", "tag": "vip"}]})  # fmt: skip
        ledger.emit_event(account_id=account.id, contact_id=contact.id,
                          metric_name="Order Paid", source="shopify")  # fmt: skip
        automations.store.fan_out(lambda e, c: [a.id for a in c], 10)
    sql(database_url, "UPDATE executions SET status = 'dead'")

    revived = run(database_url, "executions", "retry", "--json")
    again = run(database_url, "executions", "retry", "--json", "--account", str(account.id))
    missing = run(database_url, "executions", "retry", ACCOUNT, "--json")

    assert (revived.returncode, json.loads(revived.stdout)) == (0, {"revived": 1}), revived.stderr
    assert (again.returncode, json.loads(again.stdout)) == (0, {"revived": 0}), again.stderr
    assert [r[0] for r in sql(database_url, "SELECT status FROM executions")] == ["pending"]
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == f"error: no dead or unknown execution {ACCOUNT}\n"


def test_cli_accounts_list_pages_through_every_account(database_url: str) -> None:
    # it read the first 10,000 and stopped there, saying nothing of the others
    total = 10_001
    with connect(database_url) as ledger:
        ledger.migrate()
        made = [ledger.create_account(f"Loja {i}") for i in range(3)]
    if database_url.startswith("sqlite:"):  # the rest at once, all created after those three
        sql(database_url, "WITH RECURSIVE n(i) AS (SELECT 3 UNION ALL SELECT i + 1 FROM n "
            f"WHERE i < {total - 1}) INSERT INTO accounts (id, name, timezone, created_at) "
            "SELECT lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) "
            "|| '-' || substr(h, 17, 4) || '-' || substr(h, 21)), 'Loja ' || i, 'UTC', "
            "'2999-01-01T00:00:00.000000Z' "
            "FROM (SELECT i, hex(randomblob(16)) AS h FROM n)")  # fmt: skip
    else:
        sql(database_url, "INSERT INTO accounts (id, name, timezone, created_at) "
            "SELECT gen_random_uuid(), 'Loja ' || i, 'UTC', now() + interval '1 day' "
            f"FROM generate_series(3, {total - 1}) AS i")  # fmt: skip

    listed = run(database_url, "accounts", "list", "--json")
    lines = run(database_url, "accounts", "list").stdout.splitlines()

    assert listed.returncode == 0, listed.stderr
    names = [a["name"] for a in json.loads(listed.stdout)["accounts"]]
    assert len(names) == len(set(names)) == len(lines) == total
    assert names[:3] == [a.name for a in made]
    assert sorted(names) == sorted(f"Loja {i}" for i in range(total))


# A row made while `accounts list` or `contacts list` prints, ordered after every other:
# an account made in 2999, a contact of the largest id.
_LAST_ACCOUNT = ("INSERT INTO accounts (id, name, timezone, created_at) VALUES "
                 "('ffffffff-ffff-4fff-bfff-ffffffffffff', 'Loja depois', 'UTC', ?)")  # fmt: skip
_LAST_CONTACT = ("INSERT INTO contacts (account_id, id, name, created_at, updated_at) VALUES "
                 "(?, 'ffffffff-ffff-4fff-bfff-ffffffffffff', 'Depois', ?, ?)")  # fmt: skip
_LATE = "2999-01-01T00:00:00.000000Z"
_LAST_KEY = ("INSERT INTO api_keys (account_id, id, key_hash, hint, name, scopes, created_at) "
             "VALUES (?, 'ffffffff-ffff-4fff-bfff-ffffffffffff', 'last', 'last', 'Depois', "
             "{scopes}, ?)")  # fmt: skip


def _many_rows(url: str, rows: int) -> str:
    """An account with `rows` contacts, after `rows` other accounts, each row's name 100
    characters long or more; the account's id."""
    with connect(url) as ledger:
        ledger.migrate()
        account = str(ledger.create_account("Loja").id)
    if url.startswith("sqlite:"):
        uuid = ("lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-' || substr(h, 13, 4) "
                "|| '-' || substr(h, 17, 4) || '-' || substr(h, 21))")  # fmt: skip
        numbers = ("FROM (SELECT i, hex(randomblob(16)) AS h FROM (WITH RECURSIVE n(i) AS "
                   f"(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows}) "
                   "SELECT i FROM n))")  # fmt: skip
        name = "printf('%0100d', i)"
    else:
        uuid, numbers = "gen_random_uuid()", f"FROM generate_series(1, {rows}) AS i"
        name = "lpad(i::text, 100, '0')"
    when = "'2998-01-01T00:00:00.000000Z'"  # before _LATE; the accounts after "Loja"
    sql(url, f"INSERT INTO accounts (id, name, timezone, created_at) SELECT {uuid}, "
        f"'Loja ' || {name}, 'UTC', {when} {numbers}")  # fmt: skip
    sql(url, "INSERT INTO contacts (account_id, id, name, created_at, updated_at) "
        f"SELECT ?, {uuid}, 'Ana ' || {name}, {when}, {when} {numbers}", account)  # fmt: skip
    sql(url, "INSERT INTO api_keys (account_id, id, key_hash, hint, name, scopes, created_at) "
        f"SELECT ?, {uuid}, 'hash ' || i, 'abcd', 'Chave ' || {name}, {_scopes(url)}, {when} "
        f"{numbers}", account)  # fmt: skip
    return account


def _scopes(url: str) -> str:
    """The scopes ["read"] as the backend's SQL keeps them."""
    return "'[\"read\"]'" if url.startswith("sqlite:") else "ARRAY['read']"


def _printed_while(url: str, args: list[str], change: Callable[[], object]) -> str:
    """What `sinal args` prints, `change()` made once it printed its first byte: into a pipe
    of 4 KiB, not read meanwhile, which holds far less than a page of the list."""
    env = {**os.environ, "SINAL_DATABASE_URL": url, "COLUMNS": "200"}
    with subprocess.Popen(
        [*SINAL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        bufsize=0, pipesize=4096,
    ) as process:  # fmt: skip
        assert process.stdout is not None
        first = process.stdout.read(1)  # unbuffered: communicate() reads the rest
        change()
        rest, errors = process.communicate(timeout=120)
    assert process.returncode == 0, errors.decode()
    return (first + rest).decode()


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("listed", ["accounts", "contacts", "keys"])
def test_cli_lists_print_each_page_as_it_is_read(
    database_url: str, listed: str, as_json: bool
) -> None:
    """`accounts list`, `contacts list` and `keys list` held every row, and printed nothing
    until they had read the last page: a row made once the first was printed, ordered
    last, was never listed. Each page is printed as it is read now, and only it is held."""
    account = _many_rows(database_url, 1001)  # a full page of 1,000 and one more
    args = {
        "accounts": ["accounts", "list"],
        "contacts": ["contacts", "list", "--account", account],
        "keys": ["keys", "list", "--account", account],
    }[listed]

    def make_the_last_row() -> None:
        if listed == "accounts":
            sql(database_url, _LAST_ACCOUNT, _LATE)
        elif listed == "contacts":
            sql(database_url, _LAST_CONTACT, account, _LATE, _LATE)
        else:
            sql(database_url, _LAST_KEY.format(scopes=_scopes(database_url)), account, _LATE)

    out = _printed_while(database_url, [*args, *(["--json"] if as_json else [])], make_the_last_row)

    column = -1 if listed == "keys" else 1  # a key's label is last: it may have none
    names = (
        [row["name"] for row in json.loads(out)[listed]]
        if as_json
        else [line.split("  ")[column] for line in out.splitlines()]
    )
    expected = 1001 + (2 if listed == "accounts" else 1)  # "Loja", the contacts' account
    last = {"accounts": "Loja depois", "contacts": "Depois", "keys": "Depois"}[listed]
    assert (len(names), names[-1]) == (expected, last)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["accounts", "list"], "no accounts: create one with `sinal accounts create --name NAME`"),
        (["keys", "list", "--account", "{account}"],
         "account {account} has no keys: create one with `sinal keys create --account {account}`"),
        (["contacts", "list", "--account", "{account}"], "account {account} has no contacts"),
        (["contacts", "list", "--account", "{account}", "--tag", "vip",
          "--phone", "(11) 98765-4321"],
         "no contact of account {account} matches --phone '(11) 98765-4321' --tag vip"),
    ],
    ids=["accounts", "keys", "contacts", "contacts matching"],
)  # fmt: skip
def test_cli_a_list_of_nothing_says_so_on_stderr(
    database_url: str, args: list[str], said: str
) -> None:
    """An empty list printed nothing at all, as a command that did not run would; a script
    reading stdout still gets nothing there, and `--json` the empty list alone."""
    account = ACCOUNT
    if "--account" in args:  # an account with no keys and no contacts
        made = run(database_url, "accounts", "create", "--name", "Loja", "--json")
        account = json.loads(made.stdout)["id"]
    args = [arg.format(account=account) for arg in args]

    listed = run(database_url, *args)
    as_json = run(database_url, *args, "--json")

    said = said.format(account=account)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "", said + "\n")
    assert (as_json.returncode, as_json.stderr) == (0, "")
    assert json.loads(as_json.stdout) == {args[0]: []}


def test_cli_keys_create_with_an_empty_scope_says_the_list_has_one(database_url: str) -> None:
    account = json.loads(run(database_url, "accounts", "create", "--name", "Loja", "--json").stdout)

    result = run(database_url, "keys", "create", "--account", account["id"],
                 "--scopes", "ingest,,read")  # fmt: skip

    assert result.returncode == 2  # "unknown scope ''" before, as if '' were a scope's name
    assert "the scope list 'ingest,,read' has an empty item" in result.stderr
    assert count(database_url, "api_keys") == 0


MARKUP_NAMES = ["Loja [/b]", "Loja [promo]", "Loja [red]x[/red] :fire:"]


def test_cli_account_names_print_as_typed(database_url: str) -> None:
    # Rich read them as markup: "[/b]" crashed after the account was made (a retry made a
    # second one) and then every `accounts list`; "[promo]" printed as "Loja "
    created = [run(database_url, "accounts", "create", "--name", name) for name in MARKUP_NAMES]
    listed = run(database_url, "accounts", "list")

    for name, result in zip(MARKUP_NAMES, created, strict=True):
        assert result.returncode == 0, result.stderr
        assert f"created account {name!r}: " in result.stdout
    assert listed.returncode == 0, listed.stderr
    assert [line.split("  ")[1] for line in listed.stdout.splitlines()] == MARKUP_NAMES
    assert count(database_url, "accounts") == len(MARKUP_NAMES)


def test_cli_error_quoting_markup_prints_as_typed(database_url: str) -> None:
    # the error handler itself raised MarkupError on "[/]"
    result = run(database_url, "accounts", "create", "--name", "Loja", "--timezone", "[/]")

    assert result.returncode == 1
    assert result.stderr == "error: timezone: '[/]' is not an IANA time zone\n"


def test_cli_rebuild_summaries_names_a_drifted_metric_as_typed(database_url: str) -> None:
    with connect(database_url) as ledger:
        account = ledger.create_account("Loja [/b]")
        contact = ledger.create_contact(account.id, phone="+55 11 98765-4321")
        ledger.emit_event(
            account_id=account.id, contact_id=contact.id, metric_name="Promo [/x]", source="app",
            source_id="1",
        )  # fmt: skip
    sql(database_url, "UPDATE contact_metrics_summary SET event_count = event_count + 5")

    fixed = run(database_url, "rebuild-summaries")  # committed, then crashed printing it

    assert fixed.returncode == 0, fixed.stderr
    assert f"  account {account.id}: wrong figures: contact {contact.id}, Promo [/x] in BRL\n" in (
        fixed.stdout
    )
    assert "fixed 1 drifted row(s)" in fixed.stdout


def test_cli_worker_takes_log_level_trace(database_url: str) -> None:
    # SINAL_LOG_LEVEL lists trace (uvicorn's, which `sinal serve` takes); the worker failed
    # with "ValueError: Unknown level: 'TRACE'"
    env = {**os.environ, "SINAL_DATABASE_URL": database_url, "SINAL_LOG_LEVEL": "trace"}
    with subprocess.Popen([*SINAL, "worker"], env=env, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        started = proc.stderr.readline()  # the first line: "started", or a traceback
        proc.send_signal(signal.SIGTERM)
        rest = proc.stderr.read()
        returncode = proc.wait(timeout=60)

    assert " started" in started, started + rest
    assert returncode == 0, rest
    assert "stopped" in rest


@pytest.mark.parametrize("command", NEEDS_SCHEMA, ids=" ".join)
def test_cli_on_a_sqlite_file_that_does_not_exist_creates_none(
    tmp_path: Path, command: list[str]
) -> None:
    # a typo in the path made an empty typo.db before saying to run `sinal migrate`
    env = {**os.environ, "SINAL_DATABASE_URL": "sqlite:///typo.db", "COLUMNS": "200"}
    env["PYTHONPATH"] = str(SRC)  # this sinal, though run from elsewhere
    result = subprocess.run([*SINAL, *command], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip

    assert result.returncode == 1
    assert result.stderr == (
        "error: no SQLite database at typo.db: run `sinal migrate` to create it\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_cli_migrate_creates_the_sqlite_file_the_others_open_it(tmp_path: Path) -> None:
    # characters a file: URI escapes ("?" starts a query string, refused above)
    url = f"sqlite:///{tmp_path / 'loja #1 %20.db'}"

    migrated = run(url, "migrate")
    created = run(url, "accounts", "create", "--name", "Loja")
    listed = run(url, "accounts", "list")

    assert migrated.returncode == 0, migrated.stderr
    assert created.returncode == 0, created.stderr
    assert listed.returncode == 0, listed.stderr
    assert "  Loja  (America/Sao_Paulo)" in listed.stdout
    assert (tmp_path / "loja #1 %20.db").is_file()
