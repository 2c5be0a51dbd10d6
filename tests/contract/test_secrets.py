"""Integrations' secrets at rest, on both backends: sealed with SINAL_SECRET_KEYS' current
key, opened with any of its keys, bound to their row and field; rotated by
`sinal.rotation`, a short transaction per batch."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import pytest

from sinal import rotation
from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings, choose
from sinal.automations.model import SECRET_MASK, InvalidAutomation
from sinal.automations.service import Automations, automation_view
from sinal.catalog import METRIC_ORDER_PAID
from sinal.errors import SecretUnreadable
from sinal.keyring import Keyring, parse_keyring
from sinal.ledger import Ledger, connect
from sinal.store.automations import AutomationStore, Integration
from sinal.store.webhooks import WebhookStore
from tests.helpers import sql
from tests.servers import verify_signature, webhook_receiver, whatsapp_server

K1 = "k1:" + base64.b64encode(bytes(range(32))).decode()
K2 = "k2:" + base64.b64encode(bytes(range(50, 82))).decode()
WHATSAPP = {"kind": "whatsapp", "secret": "app-secret-1", "verify_token": "verify-1",
            "access_token": "EAAG-token-1", "phone_number_id": "1234567890"}  # fmt: skip
PLAINTEXTS = ("app-secret-1", "verify-1", "EAAG-token-1")


def ring(text: str) -> Keyring:
    keyring = parse_keyring(text)
    assert keyring is not None
    return keyring


@pytest.fixture
def open_ledger(database_url: str) -> Iterator[Any]:
    """`open_ledger(keys)`: a ledger on the test's database with those keys (None: none);
    every one closed at the end."""
    made: list[Ledger] = []

    def make(keys: str | None) -> Ledger:
        ledger = connect(database_url, keyring=None if keys is None else ring(keys))
        made.append(ledger)
        return ledger

    yield make
    for ledger in made:
        ledger.close()


def store_of(ledger: Ledger) -> AutomationStore:
    return cast(AutomationStore, ledger.store)


def stored_secrets(url: str, integration: Integration) -> dict[str, Any]:
    """The secrets column as the database holds it."""
    [(raw,)] = sql(url, "SELECT secrets FROM integrations WHERE id = ?", str(integration.id))
    return cast(dict[str, Any], json.loads(raw) if isinstance(raw, str) else raw)


def rewrite_secrets(url: str, integration: Integration, change: Any) -> None:
    """Change the integration's stored secrets in the database, under sinal."""
    raw = stored_secrets(url, integration)
    change(raw)
    sql(url, "UPDATE integrations SET secrets = ? WHERE id = ?", json.dumps(raw),
        str(integration.id))  # fmt: skip


def tamper(url: str, integration: Integration) -> None:
    """Flip a bit of the integration's sealed access token, in the database."""

    def flip(raw: dict[str, Any]) -> None:
        data = bytearray(base64.b64decode(raw["access_token"]["sealed"]))
        data[-1] ^= 1
        raw["access_token"]["sealed"] = base64.b64encode(bytes(data)).decode()

    rewrite_secrets(url, integration, flip)


def connect_whatsapp(ledger: Ledger, **changes: str) -> Integration:
    account = ledger.create_account("Loja")
    return Automations(ledger).create_integration(account.id, {**WHATSAPP, **changes})


def read_all_ways(ledger: Ledger, integration: Integration) -> list[dict[str, Any]]:
    """The integration's secrets as each read of the store gives them."""
    store = store_of(ledger)
    one = store.get_integration(integration.account_id, integration.id)
    [listed] = store.list_integrations(integration.account_id, "whatsapp")
    found = cast(WebhookStore, ledger.store).find_integration(integration.id)
    assert one is not None
    assert found is not None
    return [one.secrets, listed.secrets, found.secrets]


def test_secrets_are_stored_sealed_and_read_back_as_given(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    made = connect_whatsapp(ledger)

    raw = stored_secrets(database_url, made)
    assert {v["kid"] for v in raw.values()} == {"k1"}
    assert not any(text in json.dumps(raw) for text in PLAINTEXTS)
    expected = {"secret": "app-secret-1", "verify_token": "verify-1",
                "access_token": "EAAG-token-1"}  # fmt: skip
    assert read_all_ways(ledger, made) == [expected] * 3
    assert "EAAG" not in repr(made)


def test_secrets_are_plaintext_without_keys_and_still_read_once_keys_are_set(
    database_url: str, open_ledger: Any
) -> None:
    made = connect_whatsapp(open_ledger(None))

    assert stored_secrets(database_url, made)["access_token"] == "EAAG-token-1"
    keyed = open_ledger(K1)
    assert read_all_ways(keyed, made)[0]["access_token"] == "EAAG-token-1"
    assert store_of(keyed).count_secrets() == {"plaintext": 3}


def test_rotation_seals_plaintext_and_a_previous_keys_secrets_with_the_current_key(
    database_url: str, open_ledger: Any
) -> None:
    plain = connect_whatsapp(open_ledger(None))
    old = connect_whatsapp(open_ledger(K1), access_token="EAAG-token-2")
    current = open_ledger(f"{K2},{K1}")
    connect_whatsapp(current, access_token="EAAG-token-3")

    assert store_of(current).count_secrets() == {"plaintext": 3, "k1": 3, "k2": 3}
    assert rotation.rotate_secrets(current) == 6
    assert store_of(current).count_secrets() == {"k2": 9}
    assert rotation.rotate_secrets(current) == 0  # idempotent: nothing left to do

    only_k2 = open_ledger(K2)  # k1 can go now
    assert read_all_ways(only_k2, plain)[0]["access_token"] == "EAAG-token-1"
    assert read_all_ways(only_k2, old)[0]["access_token"] == "EAAG-token-2"
    assert not any(t in json.dumps(stored_secrets(database_url, plain)) for t in PLAINTEXTS)


def test_rotation_reaches_deleted_integrations_too(database_url: str, open_ledger: Any) -> None:
    ledger = open_ledger(None)
    made = connect_whatsapp(ledger)
    assert store_of(ledger).delete_integration(made.account_id, made.id)

    keyed = open_ledger(K1)
    assert rotation.rotate_secrets(keyed) == 3
    assert store_of(keyed).count_secrets() == {"k1": 3}
    assert "EAAG" not in json.dumps(stored_secrets(database_url, made))


def test_rotation_goes_in_batches_and_an_interrupted_one_is_finished_by_the_next(
    open_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = open_ledger(None)
    for n in range(5):
        connect_whatsapp(plain, access_token=f"token-{n}")
    keyed = open_ledger(K1)
    monkeypatch.setattr(rotation, "BATCH", 2)

    first = store_of(keyed).reseal_secrets("integrations", None, 2)  # one batch, then "killed"
    assert (first.scanned, first.resealed) == (6, 6)
    assert store_of(keyed).count_secrets() == {"k1": 6, "plaintext": 9}
    seen: list[int] = []
    assert rotation.rotate_secrets(keyed, seen.append) == 9
    # secrets read after each batch; the last of each table found none (no automations)
    assert seen == [6, 12, 15, 15, 15, 15]
    assert store_of(keyed).count_secrets() == {"k1": 15}


def test_secrets_sealed_with_a_key_no_longer_given_are_an_error_naming_it(
    database_url: str, open_ledger: Any
) -> None:
    made = connect_whatsapp(open_ledger(K1))

    for keys, held in ((K2, "which SINAL_SECRET_KEYS does not hold (it holds k2)"),
                       (None, "and SINAL_SECRET_KEYS is not set")):  # fmt: skip
        store = store_of(open_ledger(keys))
        for read in (
            partial(store.get_integration, made.account_id, made.id),
            partial(store.list_integrations, made.account_id),
            partial(cast(WebhookStore, store).find_integration, made.id),
        ):
            with pytest.raises(
                SecretUnreadable, match=re.escape(f"sealed with key 'k1', {held}")
            ) as caught:
                read()
            assert caught.value.key_id == "k1"
            assert f"integrations/{made.account_id}/{made.id}/" in str(caught.value)


def test_rotation_with_a_key_missing_is_refused_naming_it_before_writing_anything(
    open_ledger: Any,
) -> None:
    connect_whatsapp(open_ledger(None))
    connect_whatsapp(open_ledger(K1))
    only_k2 = open_ledger(K2)

    with pytest.raises(SecretUnreadable) as caught:
        rotation.rotate_secrets(only_k2)

    assert caught.value.key_id == "k1"
    assert str(caught.value) == (
        "3 stored secret(s) are sealed with key 'k1', which SINAL_SECRET_KEYS does not hold "
        "(it holds k2): give it back, after the current key, to rotate them"
    )
    assert store_of(only_k2).count_secrets() == {"k1": 3, "plaintext": 3}


def test_rotation_stops_at_a_secret_that_does_not_open_and_keeps_the_batches_before_it(
    database_url: str, open_ledger: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    k1 = open_ledger(K1)
    made = [connect_whatsapp(k1, access_token=f"token-{n}") for n in range(5)]
    made.sort(key=lambda i: (i.account_id, i.id))  # the rotation's order
    tamper(database_url, made[2])
    monkeypatch.setattr(rotation, "BATCH", 1)

    with pytest.raises(SecretUnreadable, match="access_token does not open with key 'k1'"):
        rotation.rotate_secrets(open_ledger(f"{K2},{K1}"))

    assert store_of(k1).count_secrets() == {"k2": 6, "k1": 9}  # 2 rows done, 3 left
    assert {v["kid"] for v in stored_secrets(database_url, made[1]).values()} == {"k2"}
    assert {v["kid"] for v in stored_secrets(database_url, made[3]).values()} == {"k1"}


def test_a_tampered_sealed_secret_is_an_error_not_a_wrong_value(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    made = connect_whatsapp(ledger)
    tamper(database_url, made)

    with pytest.raises(SecretUnreadable, match="access_token does not open with key 'k1'"):
        store_of(ledger).get_integration(made.account_id, made.id)


@pytest.mark.parametrize("where", ["same_account", "other_account"])
def test_sealed_secrets_copied_to_another_row_do_not_open(
    database_url: str, open_ledger: Any, where: str
) -> None:
    ledger = open_ledger(K1)
    victim = connect_whatsapp(ledger)
    account = victim.account_id if where == "same_account" else ledger.create_account("B").id
    thief = Automations(ledger).create_integration(account, {**WHATSAPP, "access_token": "x"})
    sql(database_url, "UPDATE integrations SET secrets = (SELECT secrets FROM integrations "
        "WHERE id = ?) WHERE id = ?", str(victim.id), str(thief.id))  # fmt: skip

    with pytest.raises(SecretUnreadable, match="does not open with key 'k1': it was altered"):
        store_of(ledger).get_integration(thief.account_id, thief.id)
    again = store_of(ledger).get_integration(victim.account_id, victim.id)
    assert again is not None
    assert again.secrets["access_token"] == "EAAG-token-1"


def test_a_sealed_secret_moved_to_another_field_does_not_open(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    made = connect_whatsapp(ledger)
    rewrite_secrets(database_url, made, lambda raw: raw.update(secret=raw["access_token"]))

    with pytest.raises(SecretUnreadable, match=r"/secret does not open with key 'k1'"):
        store_of(ledger).get_integration(made.account_id, made.id)


def test_count_secrets_of_an_empty_database_is_empty(open_ledger: Any) -> None:
    assert store_of(open_ledger(K1)).count_secrets() == {}
    status = rotation.secret_status(open_ledger(K1))
    assert status.as_dict() == {"current_key": "k1", "total": 0, "by_key": {},
                                "plaintext": 0, "to_rotate": 0}  # fmt: skip


def test_secret_status_counts_per_key_and_plaintext(open_ledger: Any) -> None:
    connect_whatsapp(open_ledger(None))
    connect_whatsapp(open_ledger(K1))
    connect_whatsapp(open_ledger(K1))

    status = rotation.secret_status(open_ledger(f"{K2},{K1}"))

    assert status.as_dict() == {"current_key": "k2", "total": 9, "by_key": {"k1": 6},
                                "plaintext": 3, "to_rotate": 9}  # fmt: skip
    assert rotation.secret_status(open_ledger(None)).as_dict()["current_key"] is None


THANKS = {
    "name": "Obrigado",
    "trigger_type": "order_paid",
    "steps": [{"type": "send_message", "text": "Obrigado!"}],
}


def paid_order_with_whatsapp(ledger: Ledger, api_base_url: str) -> Automations:
    """A WhatsApp connection, an automation thanking for paid orders, and a paid order."""
    account = ledger.create_account("Loja")
    contact = ledger.create_contact(account.id, phone="+55 11 98765-4321", name="Ana")
    automations = Automations(ledger)
    automations.create_integration(account.id, {**WHATSAPP, "api_base_url": api_base_url})
    automations.create(account.id, THANKS)
    ledger.emit_event(account_id=account.id, contact_id=contact.id, metric_name=METRIC_ORDER_PAID,
                      source="shopify", source_id="1001", entity_type="order")  # fmt: skip
    return automations


def drain(ledger: Ledger) -> None:
    settings = DispatchSettings(http_timeout=0.5, allow_private_webhooks=True,
                                retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.02))  # fmt: skip
    dispatcher = Dispatcher(ledger, settings)
    for _ in range(5):
        if not dispatcher.run_once():
            return


def test_a_step_sends_with_the_opened_token(open_ledger: Any) -> None:
    ledger = open_ledger(K1)
    with whatsapp_server() as (url, recorder):
        paid_order_with_whatsapp(ledger, url)
        drain(ledger)

    assert recorder.requests[0]["headers"]["Authorization"] == "Bearer EAAG-token-1"


def test_a_step_whose_token_no_key_opens_fails_naming_the_key_and_sends_nothing(
    open_ledger: Any,
) -> None:
    with whatsapp_server() as (url, recorder):
        automations = paid_order_with_whatsapp(open_ledger(K1), url)
        drain(open_ledger(K2))

    assert recorder.requests == []
    [account] = automations.ledger.list_accounts(limit=10)
    [execution] = automations.store.list_executions(account.id)
    assert execution.status in ("pending", "dead")  # retried: the key may come back
    assert execution.last_error is not None
    assert "is sealed with key 'k1', which SINAL_SECRET_KEYS does not hold" in execution.last_error


# -- a webhook step's signing secret, in its automation's definition ----------------------

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # Standard Webhooks' example: 24 bytes
SECRET_TEXT = SECRET.removeprefix("whsec_")


def signed_hook(
    ledger: Ledger, url: str, secret: str = SECRET, headers: dict[str, str] | None = None
) -> tuple[Automations, Any]:
    """An automation POSTing paid orders to `url`, signed with `secret` (with `headers`, if
    given), and a paid order; the automation's row."""
    account = ledger.create_account("Loja")
    contact = ledger.create_contact(account.id, phone="+55 11 98765-4321")
    automations = Automations(ledger)
    step = {"type": "webhook", "url": url, "secret": secret}
    row = automations.create(account.id, {
        "name": "Avisar o ERP", "trigger_type": "order_paid",
        "steps": [step if headers is None else {**step, "headers": headers}],
    })  # fmt: skip
    ledger.emit_event(account_id=account.id, contact_id=contact.id, metric_name=METRIC_ORDER_PAID,
                      source="shopify", source_id="1001", entity_type="order")  # fmt: skip
    return automations, row


def pay(ledger: Ledger, account_id: Any) -> None:
    """A paid order of a new contact of the account."""
    contact = ledger.create_contact(account_id, phone="+55 11 91234-5678")
    ledger.emit_event(account_id=account_id, contact_id=contact.id, metric_name=METRIC_ORDER_PAID,
                      source="shopify", source_id="2002", entity_type="order")  # fmt: skip


def stored_spec(url: str, automation_id: object) -> dict[str, Any]:
    [(raw,)] = sql(url, "SELECT spec FROM automations WHERE id = ?", str(automation_id))
    return cast(dict[str, Any], json.loads(raw) if isinstance(raw, str) else raw)


def test_a_webhook_steps_secret_is_stored_sealed_shown_masked_and_signs(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(ledger, f"{url}/hook")
        drain(ledger)

    [step] = stored_spec(database_url, row.id)["steps"]
    assert step["secret"]["kid"] == "k1"
    assert SECRET_TEXT not in json.dumps(step)
    [request] = hook.requests
    verify_signature(SECRET, request)
    stored = automations.store.get_automation(row.account_id, row.id)
    assert stored is not None
    assert automation_view(stored)["steps"][0]["secret"] == SECRET_MASK
    assert rotation.secret_status(ledger).counts == {"k1": 1}


def test_a_patch_keeping_a_sealed_secret_by_its_mask_still_signs(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(ledger, f"{url}/hook")
        changed = automations.update(row.account_id, row.id, {"steps": [
            {"type": "add_tag", "tag": "erp"},  # the signed step moves to index 1
            {"type": "webhook", "url": f"{url}/hook", "secret": SECRET_MASK},
        ]})  # fmt: skip
        assert changed is not None
        drain(ledger)

    assert stored_spec(database_url, row.id)["steps"][1]["secret"]["kid"] == "k1"
    [request] = hook.requests
    verify_signature(SECRET, request)


def test_a_client_cannot_send_a_sealed_value_as_a_secret(open_ledger: Any) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, _):
        automations, row = signed_hook(ledger, f"{url}/hook")
    envelope = ring(K1).seal(SECRET, "anything")
    sent = {
        "name": "x",
        "trigger_type": "order_paid",
        "steps": [{"type": "webhook", "url": "https://erp.example/hook", "secret": envelope}],
    }

    with pytest.raises(InvalidAutomation, match=r"steps\[0\]\.secret: secret must be text"):
        automations.create(row.account_id, sent)
    with pytest.raises(InvalidAutomation, match=r"steps\[0\]\.secret: secret must be text"):
        automations.update(row.account_id, row.id, {"steps": sent["steps"]})


def test_rotation_seals_webhook_secrets_stored_in_plaintext_and_leaves_updated_at(
    database_url: str, open_ledger: Any
) -> None:
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(open_ledger(None), f"{url}/hook")
        assert stored_spec(database_url, row.id)["steps"][0]["secret"] == SECRET
        keyed = open_ledger(f"{K2},{K1}")

        assert rotation.rotate_secrets(keyed) == 1
        assert rotation.rotate_secrets(keyed) == 0
        drain(open_ledger(K2))

    assert stored_spec(database_url, row.id)["steps"][0]["secret"]["kid"] == "k2"
    after = automations.store.get_automation(row.account_id, row.id)
    assert after is not None
    assert after.updated_at == row.updated_at
    verify_signature(SECRET, hook.requests[0])


def test_a_webhook_step_whose_secret_no_key_opens_fails_naming_the_key_and_sends_nothing(
    open_ledger: Any,
) -> None:
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(open_ledger(K1), f"{url}/hook")
        drain(open_ledger(K2))

    assert hook.requests == []
    [execution] = automations.store.list_executions(row.account_id)
    assert execution.last_error is not None
    assert "is sealed with key 'k1', which SINAL_SECRET_KEYS does not hold" in execution.last_error


def test_a_webhook_secret_copied_to_another_automation_does_not_open(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, hook):
        automations, victim = signed_hook(ledger, f"{url}/victim")
        thief = automations.create(victim.account_id, {
            "name": "copy", "trigger_type": "order_paid",
            "steps": [{"type": "webhook", "url": f"{url}/thief",
                       "secret": "whsec_" + base64.b64encode(b"t" * 24).decode()}],
        })  # fmt: skip
        sql(database_url, "UPDATE automations SET spec = (SELECT spec FROM automations "
            "WHERE id = ?) WHERE id = ?", str(victim.id), str(thief.id))  # fmt: skip
        pay(ledger, victim.account_id)  # after the thief was made: it runs for this one
        drain(ledger)

    assert {r["path"] for r in hook.requests} == {"/victim"}
    errors = [x.last_error for x in automations.store.list_executions(victim.account_id)
              if x.automation_id == thief.id]  # fmt: skip
    assert errors
    assert all(e is not None and "does not open with key 'k1'" in e for e in errors)


# -- a webhook step's header values, in its automation's definition -----------------------

HEADERS = {"Authorization": "Bearer tok-Zq9", "X-Api-Key": "key-Zq9"}


def sent_headers(request: dict[str, Any]) -> dict[str, str]:
    """The step's own headers as a receiver got them."""
    got = {k.lower(): v for k, v in request["headers"].items()}
    return {name: got[name.lower()] for name in HEADERS}


def test_a_webhook_steps_header_values_are_stored_sealed_shown_masked_and_sent(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(ledger, f"{url}/hook", headers=HEADERS)
        drain(ledger)

    [step] = stored_spec(database_url, row.id)["steps"]
    assert {value["kid"] for value in step["headers"].values()} == {"k1"}
    assert "Zq9" not in json.dumps(step)
    [request] = hook.requests
    assert sent_headers(request) == HEADERS
    verify_signature(SECRET, request)
    stored = automations.store.get_automation(row.account_id, row.id)
    assert stored is not None
    shown = automation_view(stored)["steps"][0]
    assert shown["headers"] == {"Authorization": "********", "X-Api-Key": "********"}
    assert "Zq9" not in json.dumps(automation_view(stored)) + repr(stored)
    assert rotation.secret_status(ledger).counts == {"k1": 3}  # the secret, two headers


def test_header_values_stored_in_plaintext_are_sent_and_sealed_by_rotation(
    database_url: str, open_ledger: Any
) -> None:
    """Rows written in plaintext (before header values were sealed, or with no key) keep
    working once keys are set, and `sinal secrets rotate` seals them."""
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(open_ledger(None), f"{url}/hook", headers=HEADERS)
        assert stored_spec(database_url, row.id)["steps"][0]["headers"] == HEADERS
        keyed = open_ledger(K1)
        assert rotation.secret_status(keyed).counts == {"plaintext": 3}
        drain(keyed)

        assert rotation.rotate_secrets(keyed) == 3
        assert rotation.rotate_secrets(keyed) == 0
        pay(keyed, row.account_id)
        drain(keyed)

    headers = stored_spec(database_url, row.id)["steps"][0]["headers"]
    assert {value["kid"] for value in headers.values()} == {"k1"}
    assert rotation.secret_status(keyed).counts == {"k1": 3}
    after = automations.store.get_automation(row.account_id, row.id)
    assert after is not None
    assert after.updated_at == row.updated_at
    assert [sent_headers(r) for r in hook.requests] == [HEADERS, HEADERS]


def test_a_sealed_header_value_moved_to_another_header_does_not_open_and_nothing_is_sent(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(ledger, f"{url}/hook", headers=HEADERS)
        spec = stored_spec(database_url, row.id)
        headers = spec["steps"][0]["headers"]
        headers["X-Api-Key"] = headers["Authorization"]  # the token, where the key was
        sql(database_url, "UPDATE automations SET spec = ? WHERE id = ?", json.dumps(spec),
            str(row.id))  # fmt: skip
        drain(ledger)

    assert hook.requests == []
    [execution] = automations.store.list_executions(row.account_id)
    assert execution.status in ("pending", "dead")
    assert (
        f"automations/{row.account_id}/{row.id}/webhook_headers/x-api-key does not open "
        "with key 'k1'" in (execution.last_error or "")
    )


def test_a_patch_keeping_sealed_header_values_by_their_mask_still_sends_them(
    database_url: str, open_ledger: Any
) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(ledger, f"{url}/hook", headers=HEADERS)
        changed = automations.update(row.account_id, row.id, {"steps": [
            {"type": "add_tag", "tag": "erp"},  # the step moves to index 1
            {"type": "webhook", "url": f"{url}/hook", "secret": SECRET_MASK,
             "headers": {"authorization": "********", "X-Api-Key": "********"}},
        ]})  # fmt: skip
        assert changed is not None
        drain(ledger)

    headers = stored_spec(database_url, row.id)["steps"][1]["headers"]
    assert set(headers) == {"authorization", "X-Api-Key"}
    assert {value["kid"] for value in headers.values()} == {"k1"}
    [request] = hook.requests
    assert sent_headers(request) == HEADERS


def test_a_client_cannot_send_a_sealed_value_as_a_header_value(open_ledger: Any) -> None:
    ledger = open_ledger(K1)
    with webhook_receiver() as (url, _):
        automations, row = signed_hook(ledger, f"{url}/hook", headers=HEADERS)
    envelope = ring(K1).seal("key-Zq9", "anything")
    steps = [{"type": "webhook", "url": "https://erp.example/hook",
              "headers": {"X-Api-Key": envelope}}]  # fmt: skip

    error = r"steps\[0\]\.headers\.X-Api-Key: header values are text"
    with pytest.raises(InvalidAutomation, match=error):
        automations.create(row.account_id, {"name": "x", "trigger_type": "order_paid",
                                            "steps": steps})  # fmt: skip
    with pytest.raises(InvalidAutomation, match=error):
        automations.update(row.account_id, row.id, {"steps": steps})


def test_a_kept_versions_secrets_are_counted_rotated_and_still_open(
    database_url: str, open_ledger: Any
) -> None:
    """An execution made before its automation's steps changed runs the steps it was made
    with: their secrets, kept with that version, are counted, sealed again by a rotation,
    and open with the new key alone."""
    with webhook_receiver() as (url, hook):
        automations, row = signed_hook(open_ledger(K1), f"{url}/hook", headers=HEADERS)
        automations.store.fan_out(choose, 10)  # its execution, made before the edit
        automations.update(row.account_id, row.id, {"steps": [{"type": "add_tag", "tag": "x"}]})
        keyed = open_ledger(f"{K2},{K1}")
        assert rotation.secret_status(keyed).counts == {"k1": 3}  # the kept version's

        assert rotation.rotate_secrets(keyed) == 3
        assert rotation.secret_status(keyed).counts == {"k2": 3}
        drain(open_ledger(K2))

    [kept] = sql(database_url, "SELECT spec FROM automation_versions")
    step = (json.loads(kept[0]) if isinstance(kept[0], str) else kept[0])["steps"][0]
    assert step["secret"]["kid"] == "k2"
    [request] = hook.requests
    assert sent_headers(request) == HEADERS
    verify_signature(SECRET, request)
