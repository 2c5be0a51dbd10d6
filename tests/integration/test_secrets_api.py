"""Integrations' secrets through HTTP, on both backends: sealed at rest with the server's
SINAL_SECRET_KEYS, used to verify webhooks, never answered; a key the server lacks is a
503 naming no key, logged as one line naming it, never a 500 with a traceback."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator
from contextlib import closing
from typing import Any

import pytest

from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.integrations import sign_shopify
from sinal.keyring import parse_keyring
from sinal.ledger import Ledger, connect
from tests.helpers import sql
from tests.integration.conftest import Api, running_api
from tests.servers import webhook_receiver

pytestmark = pytest.mark.anyio

K1 = "k1:" + base64.b64encode(bytes(range(32))).decode()
K2 = "k2:" + base64.b64encode(bytes(range(50, 82))).decode()
SECRETS = {"secret": "app-secret-Xy1", "verify_token": "verify-Xy1", "access_token": "EAAG-Xy1"}


@pytest.fixture
async def keyed_api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    """The API with SINAL_SECRET_KEYS=K1."""
    async for running in running_api(database_url, ledger_at, secret_keys=K1):
        yield running


@pytest.fixture
async def k2_api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    """The API with SINAL_SECRET_KEYS=K2 only."""
    async for running in running_api(database_url, ledger_at, secret_keys=K2):
        yield running


def raw_secrets(url: str) -> list[dict[str, Any]]:
    """Every integration's secrets column, as the database holds it."""
    rows = sql(url, "SELECT secrets FROM integrations")
    return [json.loads(raw) if isinstance(raw, str) else raw for (raw,) in rows]


async def test_integrations_are_stored_sealed_and_never_answered_with_their_secrets(
    keyed_api: Api,
) -> None:
    api = keyed_api
    made = await api.post("/v1/integrations", {"kind": "whatsapp", "phone_number_id": "1",
                                               **SECRETS})  # fmt: skip
    shop = await api.post("/v1/integrations", {"kind": "shopify", "secret": "shop-Xy1"})
    ai = await api.post("/v1/integrations", {"kind": "ai", "base_url": "https://ai.example",
                                             "model": "m", "api_key": "sk-Xy1"})  # fmt: skip
    assert (made.status_code, shop.status_code, ai.status_code) == (201, 201, 201)

    answers = [made.text, shop.text, ai.text]
    answers.append((await api.client.get("/v1/integrations")).text)
    for one in (made, shop, ai):
        answers.append((await api.client.get(f"/v1/integrations/{one.json()['id']}")).text)
    assert not any("Xy1" in text for text in answers)
    assert made.json()["secrets_set"] == ["access_token", "secret", "verify_token"]
    stored = raw_secrets(api.url)
    assert "Xy1" not in json.dumps(stored)
    assert {value["kid"] for row in stored for value in row.values()} == {"k1"}


async def test_a_webhook_is_verified_with_the_opened_secret(keyed_api: Api) -> None:
    api = keyed_api
    made = await api.post("/v1/integrations", {"kind": "shopify", "secret": "shop-Xy1"})
    path = f"/webhooks/shopify/{made.json()['id']}"
    body = b'{"id": 1}'

    async def send(secret: str) -> int:
        headers = {"Content-Type": "application/json", "X-Shopify-Topic": "orders/paid",
                   "X-Shopify-Hmac-Sha256": sign_shopify(secret, body),
                   "X-Shopify-Webhook-Id": f"w-{secret}"}  # fmt: skip
        response = await api.client.post(path, content=body, headers=headers)
        return response.status_code

    assert await send("shop-Xy1") == 200
    assert await send("not-the-secret") == 401


async def test_a_secret_the_servers_keys_cannot_open_is_503_and_one_log_line_naming_the_key(
    k2_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    api = k2_api
    with connect(api.url, keyring=parse_keyring(K1)) as k1_ledger:
        made = Automations(k1_ledger).create_integration(
            api.account.id, {"kind": "whatsapp", "phone_number_id": "1", **SECRETS}
        )
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", f"/v1/integrations/{made.id}", {}),
        ("GET", "/v1/integrations", {}),
        ("POST", f"/webhooks/whatsapp/{made.id}",
         {"content": b"{}", "headers": {"X-Hub-Signature-256": "sha256=00"}}),
        ("GET", f"/webhooks/whatsapp/{made.id}",
         {"params": {"hub.mode": "subscribe", "hub.verify_token": "verify-Xy1",
                     "hub.challenge": "1"}}),
    ]  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        for method, path, extra in calls:
            response = await api.client.request(method, path, **extra)
            assert response.status_code == 503, (path, response.text)
            problem = response.json()
            assert problem["type"] == "/problems/secret-unreadable"
            assert "k1" not in response.text  # anyone may call a webhook route
            assert "Xy1" not in response.text
    lines = [r for r in caplog.records if r.name == "sinal.api"]
    assert len(lines) == len(calls)
    assert all(r.exc_info is None for r in lines)  # no traceback: a setting, not a bug
    assert "sealed with key 'k1', which SINAL_SECRET_KEYS does not hold" in lines[0].getMessage()


async def test_webhook_header_values_are_sealed_never_answered_and_kept_by_their_mask(
    keyed_api: Api,
) -> None:
    """A step's header values (`Authorization`, `X-Api-Key`) are secrets: sealed at rest,
    answered as ********, which a PATCH sends back to keep them (the receiver still gets
    them); the mask for a header with no value to keep is 422 naming it."""
    api = keyed_api
    headers = {"Authorization": "Bearer tok-Xy1", "X-Api-Key": "key-Xy1"}
    with webhook_receiver() as (hook_url, hook):
        step = {"type": "webhook", "url": f"{hook_url}/hook", "headers": headers}
        made = await api.post("/v1/automations", {"name": "erp", "trigger_type": "order_paid",
                                                  "steps": [step]})  # fmt: skip
        assert made.status_code == 201, made.text
        path = f"/v1/automations/{made.json()['id']}"
        shown = (await api.client.get(path)).json()["steps"]
        masked = {"Authorization": "********", "X-Api-Key": "********"}
        assert shown[0]["headers"] == masked
        patched = await api.client.patch(path, json={"steps": shown})
        assert patched.status_code == 200, patched.text
        answers = [made, patched, await api.client.get("/v1/automations")]
        assert not any("Xy1" in answer.text for answer in answers)
        assert [s["headers"] for s in patched.json()["steps"]] == [masked]
        stored = sql(api.url, "SELECT spec FROM automations")[0][0]
        assert "Xy1" not in (stored if isinstance(stored, str) else json.dumps(stored))

        new = {**step, "headers": {"X-Other": "********"}}
        refused = await api.client.patch(path, json={"steps": [new]})
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["errors"]
        assert (error["field"], error["code"]) == ("steps[0].headers.X-Other", "invalid_value")

        with connect(api.url, keyring=parse_keyring(K1)) as keyed:
            contact = keyed.create_contact(api.account.id, phone="+55 11 98765-4321")
            keyed.emit_event(account_id=api.account.id, contact_id=contact.id,
                             metric_name="Order Paid", source="shopify", source_id="1",
                             entity_type="order")  # fmt: skip
            settings = DispatchSettings(http_timeout=1, allow_private_webhooks=True)
            with closing(Dispatcher(keyed, settings)) as dispatcher:
                while dispatcher.run_once():
                    pass

    [request] = hook.requests
    assert (request["headers"]["Authorization"], request["headers"]["X-Api-Key"]) == (
        "Bearer tok-Xy1", "key-Xy1",
    )  # fmt: skip
