"""The CLI as a person runs it: real processes, real databases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import count, sql

SINAL = [sys.executable, "-m", "sinal"]


def run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SINAL_DATABASE_URL": url, "COLUMNS": "200"}
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


def test_cli_demo_shows_events_duplicates_rejections_and_summary(database_url: str) -> None:
    result = run(database_url, "demo")

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "duplicate" in out
    assert "contact_not_found" in out
    assert "Pedido Pago" in out  # the summary's labels are pt-BR
    assert count(database_url, "events") == 7
    assert count(database_url, "rejections") == 1


def test_cli_rebuild_summaries_reports_and_fixes_drift(database_url: str) -> None:
    assert run(database_url, "demo").returncode == 0
    sql(database_url, "UPDATE contact_metrics_summary SET event_count = event_count + 5")

    fixed = run(database_url, "rebuild-summaries")
    clean = run(database_url, "rebuild-summaries")

    assert fixed.returncode == 0, fixed.stderr
    assert "fixed 7 drifted row(s)" in fixed.stdout
    assert "fixed 0 drifted row(s)" in clean.stdout


@pytest.mark.parametrize("url", ["mysql://nope", "sqlite:///"])
def test_cli_bad_database_url_is_one_readable_line(url: str) -> None:
    result = run(url, "migrate")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_cli_malformed_public_url_is_one_line_naming_the_setting(
    command: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a narrow log: no wrapping
    env["SINAL_PUBLIC_URL"] = "sin.al"
    result = subprocess.run([*SINAL, command], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr == (
        "error: SINAL_PUBLIC_URL='sin.al' must be an absolute http:// or https:// URL with a "
        "host and no query or fragment, e.g. https://sin.al\n"
    )
    assert list(tmp_path.iterdir()) == []  # refused before opening (or creating) a database
