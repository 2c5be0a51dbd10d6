"""Schemathesis against the OpenAPI schema, on the ASGI app, on both backends: for valid
and invalid generated requests alike, never a 5xx, and every answer (status, content type,
body, headers) as the schema documents it. Generated ids seldom name a row, so a success
of every operation is also made by hand, on data that fills every field an answer shows,
and checked the same way."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from sinal.api import create_app
from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.config import Settings
from sinal.integrations import sign_shopify, sign_whatsapp, sign_yampi
from sinal.ledger import Ledger
from tests.integration.conftest import Api
from tests.integration.whatsapp import APP_SECRET, VERIFY_TOKEN, meta_bytes, text_message

EXAMPLES = 12  # per operation and mode: the suite stays within a few minutes
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
WHATSAPP = {"kind": "whatsapp", "secret": APP_SECRET, "verify_token": VERIFY_TOKEN,
            "phone_number_id": "106540352242922", "access_token": "EAAG-test",
            "api_base_url": "https://graph.example.test/v21.0"}  # fmt: skip
AI = {"kind": "ai", "base_url": "https://ai.example", "model": "m", "api_key": "sk-test"}
SHOPIFY = {"kind": "shopify", "secret": "shopify-secret", "shop_domain": "loja.myshopify.com"}
YAMPI = {"kind": "yampi", "secret": "yampi-secret", "alias": "loja"}
WEBHOOK_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
TRIGGERED = {
    "name": "Pedido pago",
    "trigger_type": "order_paid",
    "filters": [{"field": "properties.total", "op": "gte", "value": 100}],
    "steps": [
        {"type": "add_tag", "tag": "comprou"},
        {"type": "filter", "conditions": [{"field": "contact.tags", "op": "contains",
                                           "value": "vip"}]},
        {"type": "remove_tag", "tag": "vip"},
    ],
}  # fmt: skip
EVERY_STEP = {  # each kind of step, with its optional fields
    "name": "Todos os passos",
    "status": "paused",
    "trigger_metric": "Quiz Answered",
    "filters": [{"field": "source", "op": "in", "value": ["shopify", "yampi"]},
                {"field": "properties.paid", "op": "exists", "value": True}],
    "steps": [
        {"type": "send_message", "text": "Oi! https://loja.example/p/1", "track_links": True,
         "campaign": "natal"},
        {"type": "send_template", "name": "pedido_pago", "language": "pt_BR",
         "parameters": ["{{ contact.name }}"]},
        {"type": "send_template", "name": "boas_vindas", "language": "pt_BR",
         "components": [{"type": "body", "parameters": [{"type": "text", "text": "Ana"}]}]},
        {"type": "ai_respond", "system_prompt": "Seja breve", "prompt": "{{ event.metric_name }}",
         "max_tokens": 200, "track_links": True},
        {"type": "webhook", "url": "https://hooks.example/sinal", "headers": {"X-Loja": "1"},
         "secret": WEBHOOK_SECRET},
        {"type": "wait", "seconds": 60},
        {"type": "wait", "until": "2099-01-01T00:00:00Z"},
        {"type": "close_conversation"},
        {"type": "filter", "conditions": [{"field": "contact.email", "op": "eq",
                                           "value": "bia@example.com"}]},
    ],
}  # fmt: skip


@pytest.fixture
def fuzzed(database_url: str, ledger_at: Ledger) -> Iterator[tuple[Any, dict[str, str]]]:
    account = ledger_at.create_account("Loja Fuzz")
    contact = ledger_at.create_contact(account.id, email="ana@example.com")
    key, _ = ledger_at.create_api_key(account.id, ["ingest", "read", "admin"])
    # Lists with something in them: their items are checked against the schema too.
    Automations(ledger_at).create_integration(account.id, SHOPIFY)
    Automations(ledger_at).create(account.id, EVERY_STEP)
    ledger_at.emit_event(account_id=account.id, contact_id=contact.id, metric_name="Order Paid",
                         source="shopify", source_id="1", value="10")  # fmt: skip
    app = create_app(Settings(database_url=database_url, serve_worker=False))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    try:
        yield schema, {"Authorization": f"Bearer {key}"}
    finally:
        asgi.shutdown_lifespans()  # the app's lifespan: drain, close the pool


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_conforms_to_its_schema_and_never_answers_5xx(
    fuzzed: tuple[Any, dict[str, str]], mode: GenerationMode
) -> None:
    schema, headers = fuzzed
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15

    for operation in operations:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(headers=dict(headers), checks=CHECKS)  # it adds to them

        try:
            check()
        except Unsatisfiable:
            # No invalid request exists for it (e.g. GET /healthz takes no input).
            assert mode == GenerationMode.NEGATIVE, operation.label


def test_every_operation_documents_the_body_of_its_success(sqlite_url: str) -> None:
    doc = create_app(Settings(database_url=sqlite_url)).openapi()
    components = doc["components"]["schemas"]
    undescribed = []
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            label = f"{method.upper()} {path}"
            successes = {status: answer for status, answer in operation["responses"].items()
                         if status.startswith(("2", "3"))}  # fmt: skip
            assert successes, label
            for status, answer in successes.items():
                content = answer.get("content", {})
                if status == "204" or status.startswith("3"):
                    assert not content, f"{label} {status} has no body"
                elif not content or not all(
                    _says_something(media.get("schema"), components) for media in content.values()
                ):
                    undescribed.append(f"{label} {status}")
    assert undescribed == []


def _says_something(schema: dict[str, Any] | None, components: dict[str, Any]) -> bool:
    """Whether a body schema describes anything: `{}` (any JSON) does not."""
    if not schema:
        return False
    ref = schema.get("$ref")
    return ref is None or bool(components.get(ref.rpartition("/")[2]))


class Answers:
    """Requests through the API, each answer checked against its operation's schema."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.schema = schemathesis.openapi.from_dict(api.app.openapi())
        self.seen: set[str] = set()

    async def call(
        self, method: str, template: str, ids: dict[str, str] | None = None, **kw: Any
    ) -> httpx.Response:
        """`method` on `template` filled with `ids`: a success, as documented."""
        path = template.format(**(ids or {}))
        response = await self.api.client.request(method, path, **kw)
        assert response.status_code < 400, f"{method} {path}: {response.text}"
        self.check(method, template, ids or {}, response)
        return response

    def check(
        self, method: str, template: str, ids: dict[str, str], response: httpx.Response
    ) -> None:
        case = self.schema[template][method].Case(path_parameters=ids)
        try:
            case.validate_response(response, checks=CHECKS)
        except FailureGroup as exc:  # an ExceptionGroup, which anyio's runner would wrap
            pytest.fail(str(exc))
        self.seen.add(f"{method} {template}")

    def documented(self) -> set[str]:
        """Every operation of the document."""
        paths = self.api.app.openapi()["paths"]
        return {f"{method.upper()} {path}" for path, ops in paths.items() for method in ops}


async def exercise(answers: Answers) -> None:
    """A success of every operation of the API, on rows with every field filled."""
    call = answers.call
    await call("GET", "/healthz")
    await call("GET", "/readyz")
    await call("GET", "/v1/account")
    await call("PATCH", "/v1/account", json={"name": "Loja", "timezone": "America/Sao_Paulo"})

    made = [(await call("POST", "/v1/integrations", json=body)).json()
            for body in (WHATSAPP, AI, SHOPIFY, YAMPI)]  # fmt: skip
    whatsapp, _, shopify, yampi = (m["id"] for m in made)
    await call("GET", "/v1/integrations")
    for integration in made:
        await call(
            "GET", "/v1/integrations/{integration_id}", {"integration_id": integration["id"]}
        )
    await _deliver(answers, whatsapp, shopify, yampi)

    contact = (await call("POST", "/v1/contacts", json={"email": "bia@example.com"})).json()
    who = {"contact_id": contact["id"]}
    await call("GET", "/v1/contacts/{contact_id}", who)
    await call("PATCH", "/v1/contacts/{contact_id}", who, json={"name": "Bia Lima"})
    await call("POST", "/v1/contacts/{contact_id}/tags", who, json={"tags": ["vip", "novo"]})
    await call("GET", "/v1/contacts", params={"tag": "vip", "email": "Bia@Example.com"})
    await call("DELETE", "/v1/contacts/{contact_id}/tags/{tag}", {**who, "tag": "novo"})

    automation = (await call("POST", "/v1/automations", json=TRIGGERED)).json()
    paused = (await call("POST", "/v1/automations", json=EVERY_STEP)).json()
    await call("GET", "/v1/automations")
    await call("GET", "/v1/automations/{automation_id}", {"automation_id": paused["id"]})
    await call("PATCH", "/v1/automations/{automation_id}", {"automation_id": paused["id"]},
               json={"name": "Cada passo"})  # fmt: skip
    await _events(answers, contact["id"], automation["id"])

    rejected = await answers.api.post("/v1/events", {"metric": "Order Paid",
                                                     "contact_id": str(uuid4())})  # fmt: skip
    assert rejected.status_code == 422, rejected.text
    await call("GET", "/v1/rejections")
    await call("POST", "/v1/rejections/{rejection_id}/replay",
               {"rejection_id": rejected.json()["rejection_id"]}, json=who)  # fmt: skip

    link = await call(
        "POST",
        "/v1/links",
        json={"url": "https://loja.example/p/1", "contact_id": contact["id"], "campaign": "natal"},
    )
    await call("GET", "/l/{token}", {"token": link.json()["token"]})

    [conversation] = (await call("GET", "/v1/conversations")).json()["data"]
    this = {"conversation_id": conversation["id"]}
    await call("GET", "/v1/conversations/{conversation_id}", this)
    await call("POST", "/v1/conversations/{conversation_id}/assign", this, json={"agent": "Bia"})
    await call("POST", "/v1/conversations/{conversation_id}/close", this)

    await call("DELETE", "/v1/automations/{automation_id}", {"automation_id": paused["id"]})
    await call("DELETE", "/v1/integrations/{integration_id}", {"integration_id": yampi})
    await call("DELETE", "/v1/contacts/{contact_id}", who)


async def _deliver(answers: Answers, whatsapp: str, shopify: str, yampi: str) -> None:
    """A delivery of each provider (the WhatsApp message opens a conversation)."""
    call = answers.call
    await call("GET", "/webhooks/whatsapp/{integration_id}", {"integration_id": whatsapp},
               params={"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN,
                       "hub.challenge": "1158201444"})  # fmt: skip
    body = meta_bytes(text_message("wamid.A1", "5511987654321", "Oi", name="Ana Souza"))
    await call(
        "POST",
        "/webhooks/whatsapp/{integration_id}",
        {"integration_id": whatsapp},
        content=body,
        headers={
            "Content-Type": "application/json",
            "X-Hub-Signature-256": sign_whatsapp(APP_SECRET, body),
        },
    )
    order = json.dumps({"id": 1, "email": "ana@example.com"}).encode()
    signed = {
        shopify: {"X-Shopify-Hmac-Sha256": sign_shopify(SHOPIFY["secret"], order),
                  "X-Shopify-Topic": "orders/paid", "X-Shopify-Webhook-Id": "d-1"},
        yampi: {"X-Yampi-Hmac-SHA256": sign_yampi(YAMPI["secret"], order)},
    }  # fmt: skip
    for kind, ident in (("shopify", shopify), ("yampi", yampi)):
        headers = {"Content-Type": "application/json", **signed[ident]}
        await call("POST", f"/webhooks/{kind}/{{integration_id}}", {"integration_id": ident},
                   content=order, headers=headers)  # fmt: skip


async def _events(answers: Answers, contact: str, automation: str) -> None:
    """Events, the automation's execution for one, and the traces."""
    call = answers.call

    def order(total: str, source_id: str) -> dict[str, Any]:
        return {"metric": "Order Paid", "contact_id": contact, "value": total,
                "source": "shopify", "source_id": source_id, "entity_type": "order",
                "properties": {"total": total}}  # fmt: skip

    big = (await call("POST", "/v1/events", json=order("297.90", "1"))).json()
    small = (await call("POST", "/v1/events", json=order("50.00", "2"))).json()
    await call("POST", "/v1/events/batch", json={"events": [order("10", "3"), {"metric": ""}]})
    await call("GET", "/v1/events")
    await call("GET", "/v1/events/{event_id}", {"event_id": big["event_id"]})
    dispatcher = Dispatcher(answers.api.ledger, DispatchSettings(retry=RetryPolicy(2)))
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.close()
    executions = await call("GET", "/v1/automations/{automation_id}/executions",
                            {"automation_id": automation})  # fmt: skip
    [execution] = executions.json()["data"]
    assert execution["status"] == "completed", execution
    await call("GET", "/v1/executions/{execution_id}", {"execution_id": execution["id"]})
    for event in (big, small):
        await call("GET", "/v1/events/{event_id}/trace", {"event_id": event["event_id"]})
    await call("GET", "/v1/contacts/{contact_id}/timeline", {"contact_id": contact})
    await call("GET", "/v1/contacts/{contact_id}/metrics", {"contact_id": contact})
    await call("GET", "/v1/metrics")
    now = datetime.now(UTC)
    await call("GET", "/v1/metrics/{name}/aggregates", {"name": "Order Paid"}, params={
        "since": (now - timedelta(days=2)).isoformat(), "until": now.isoformat(),
        "measurement": "sum_value", "by": "total"})  # fmt: skip


@pytest.mark.anyio
async def test_every_operation_answers_its_success_as_its_schema_documents(api: Api) -> None:
    answers = Answers(api)
    await exercise(answers)
    assert answers.seen == answers.documented()
