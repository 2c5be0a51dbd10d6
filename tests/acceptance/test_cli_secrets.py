"""`sinal secrets status|rotate|new-key` and SINAL_SECRET_KEYS as a person meets them: real
processes, both backends."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from sinal.automations.service import Automations
from sinal.keyring import parse_keyring
from sinal.ledger import connect
from tests.acceptance.test_cli import SINAL, run
from tests.helpers import sql
from tests.integration.test_serve import start_serve

K1 = "k1:" + base64.b64encode(bytes(range(32))).decode()
K2 = "k2:" + base64.b64encode(bytes(range(50, 82))).decode()
SHORT = base64.b64encode(b"x" * 16).decode()


def connect_shops(url: str, keys: str | None, n: int = 2) -> None:
    """`n` Shopify connections (one secret each), written with `keys` (None: plaintext)."""
    with connect(url, keyring=None if keys is None else parse_keyring(keys)) as ledger:
        account = ledger.create_account("Loja")
        for i in range(n):
            Automations(ledger).create_integration(
                account.id, {"kind": "shopify", "secret": f"shop-secret-{i}"}
            )


def status(url: str, keys: str = "") -> dict[str, object]:
    done = run(url, "secrets", "status", "--json", SINAL_SECRET_KEYS=keys)
    assert done.returncode == 0, done.stderr
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_cli_secrets_rotate_seals_plaintext_and_is_idempotent(database_url: str) -> None:
    connect_shops(database_url, None)
    assert status(database_url) == {"current_key": None, "total": 2, "by_key": {},
                                    "plaintext": 2, "to_rotate": 2}  # fmt: skip

    first = run(database_url, "secrets", "rotate", "--json", SINAL_SECRET_KEYS=K1)
    again = run(database_url, "secrets", "rotate", "--json", SINAL_SECRET_KEYS=K1)

    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"resealed": 2, "current_key": "k1", "total": 2,
                                        "by_key": {"k1": 2}, "plaintext": 0,
                                        "to_rotate": 0}  # fmt: skip
    assert json.loads(again.stdout)["resealed"] == 0
    raw = json.dumps([r[0] for r in sql(database_url, "SELECT secrets FROM integrations")])
    assert "shop-secret" not in raw


def test_cli_secrets_rotate_to_a_new_key_then_the_old_one_can_go(database_url: str) -> None:
    connect_shops(database_url, K1)

    done = run(database_url, "secrets", "rotate", SINAL_SECRET_KEYS=f"{K2},{K1}")

    assert done.returncode == 0, done.stderr
    assert done.stdout == "sealed 2 secret(s) with key k2; 2 stored, 0 not sealed with it\n"
    assert status(database_url, K2)["by_key"] == {"k2": 2}
    human = run(database_url, "secrets", "status", SINAL_SECRET_KEYS=K2)
    assert human.stdout == "current key: k2\n  k2: 2 secret(s)\n2 secret(s) stored\n"


def test_cli_secrets_status_says_what_is_left_to_rotate(database_url: str) -> None:
    connect_shops(database_url, None, n=1)
    connect_shops(database_url, K1, n=2)

    done = run(database_url, "secrets", "status", SINAL_SECRET_KEYS=f"{K2},{K1}")

    assert done.stdout == (
        "current key: k2\n  k1: 2 secret(s)\n  plaintext: 1 secret(s)\n"
        "3 of 3 to rotate: run `sinal secrets rotate`\n"
    )


def test_cli_secrets_rotate_without_keys_is_one_line(database_url: str) -> None:
    connect_shops(database_url, None)

    done = run(database_url, "secrets", "rotate", SINAL_SECRET_KEYS="")

    assert done.returncode == 1
    assert done.stderr == (
        "error: SINAL_SECRET_KEYS is not set: give it the key to seal with "
        "(`sinal secrets new-key ID` makes one)\n"
    )


def test_cli_secrets_rotate_with_a_key_missing_is_one_line_naming_it(database_url: str) -> None:
    connect_shops(database_url, K1, n=1)

    done = run(database_url, "secrets", "rotate", SINAL_SECRET_KEYS=K2)

    assert done.returncode == 1
    assert done.stderr == (
        "error: 1 stored secret(s) are sealed with key 'k1', which SINAL_SECRET_KEYS does not "
        "hold (it holds k2): give it back, after the current key, to rotate them\n"
    )
    assert status(database_url, K2)["by_key"] == {"k1": 1}


@pytest.mark.parametrize(
    "command", [["secrets", "status"], ["secrets", "rotate"], ["migrate"], ["worker"], ["serve"]]
)
def test_cli_malformed_secret_keys_is_one_line_naming_the_variable_not_the_key(
    command: list[str], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env |= {"SINAL_SECRET_KEYS": f"{K1},k2:{SHORT}",
            "SINAL_DATABASE_URL": f"sqlite:///{tmp_path / 'sinal.db'}"}  # fmt: skip
    done = subprocess.run([*SINAL, *command], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip

    assert done.returncode == 1
    assert done.stderr == (
        "error: SINAL_SECRET_KEYS: key 2 (k2) must be the base64 of 32 random bytes "
        "(`sinal secrets new-key` makes one)\n"
    )
    assert list(tmp_path.iterdir()) == []  # refused before opening (or creating) a database


def test_cli_secrets_new_key_prints_a_key_the_variable_takes() -> None:
    done = subprocess.run([*SINAL, "secrets", "new-key", "k3"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip

    assert done.returncode == 0, done.stderr
    keyring = parse_keyring(done.stdout.strip())
    assert keyring is not None
    assert keyring.current_id == "k3"


def _serve_output(env: dict[str, str], tmp_path: Path) -> str:
    _, proc = start_serve(env, tmp_path, subprocess.PIPE)
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


def test_serve_without_keys_warns_that_secrets_are_plaintext(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SINAL_SECRET_KEYS"}
    env |= {"SINAL_DATABASE_URL": f"sqlite:///{tmp_path / 'sinal.db'}", "COLUMNS": "300"}

    out = _serve_output(env, tmp_path)

    assert (
        "warning: SINAL_SECRET_KEYS is not set: secrets (connections' access tokens, app "
        "secrets and API keys, webhook steps' signing secrets) are stored in plaintext "
        "(README: Secrets at rest)\n"
    ) in out


def test_serve_with_keys_warns_of_secrets_left_to_rotate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sinal.db'}"
    assert run(url, "migrate").returncode == 0
    connect_shops(url, None, n=1)
    env = {**os.environ, "SINAL_DATABASE_URL": url, "SINAL_SECRET_KEYS": K1, "COLUMNS": "300"}

    out = _serve_output(env, tmp_path)

    assert "SINAL_SECRET_KEYS is not set" not in out
    assert (
        "warning: 1 stored secret(s) not sealed with the current key 'k1' (plaintext, or a "
        "previous key): run `sinal secrets rotate`\n"
    ) in out
