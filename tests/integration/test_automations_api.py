"""Automations, integrations, executions and traces through HTTP, on both backends."""

from __future__ import annotations

import base64
import logging
import unicodedata
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import anyio
import pytest

from sinal import EmitEvent
from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.events import stamp
from sinal.ledger import Ledger
from tests.helpers import sql
from tests.integration.conftest import Api, running_api
from tests.integration.whatsapp import PHONE_NUMBER_ID, connect_whatsapp
from tests.servers import meta_error, verify_signature, webhook_receiver, whatsapp_server

pytestmark = pytest.mark.anyio

AUTOMATION = {
    "name": "Pedido pago",
    "trigger_type": "order_paid",
    "filters": [{"field": "properties.total", "op": "gte", "value": 100}],
    "steps": [
        {"type": "send_message", "text": "Oi {{ contact.name | first_name }}! Pedido "
                                         "{{ event.properties.order_number }} pago."},
        {"type": "add_tag", "tag": "comprou"},
    ],
}  # fmt: skip


async def _order(api: Api, total: str, source_id: str) -> dict[str, Any]:
    response = await api.post("/v1/events", {
        "metric": "Order Paid", "contact": {"phone": "+55 11 98765-4321", "name": "Ana Souza"},
        "value": total, "source": "shopify", "source_id": source_id, "entity_type": "order",
        "properties": {"order_number": f"#{source_id}", "total": total},
    })  # fmt: skip
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def _connect(api: Api, wa_url: str) -> None:
    """The account's WhatsApp connection, sending to `wa_url`."""
    made = await api.post("/v1/integrations", {
        "kind": "whatsapp", "secret": "app-secret", "verify_token": "v",
        "phone_number_id": "1234", "access_token": "EAAG", "api_base_url": wa_url,
    })  # fmt: skip
    assert made.status_code == 201, made.text


def _drain(api: Api) -> None:
    settings = DispatchSettings(http_timeout=1, retry=RetryPolicy(2), allow_private_webhooks=True)
    dispatcher = Dispatcher(api.ledger, settings)
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.close()


async def test_automation_lifecycle_runs_and_is_traced(api: Api) -> None:
    with whatsapp_server() as (wa_url, wa):
        made = await api.post("/v1/integrations", {
            "kind": "whatsapp", "secret": "app-secret", "verify_token": "v",
            "phone_number_id": "1234", "access_token": "EAAG", "api_base_url": wa_url,
        })  # fmt: skip
        assert made.status_code == 201, made.text
        assert "access_token" not in made.json()
        assert made.json()["secrets_set"] == ["access_token", "secret", "verify_token"]
        created = await api.post("/v1/automations", AUTOMATION)
        assert created.status_code == 201, created.text
        automation = created.json()
        assert automation["resolved_metric"] == "Order Paid"

        big = await _order(api, "297.90", "1001")
        small = await _order(api, "50.00", "1002")
        _drain(api)

        [sent] = wa.bodies("/1234/messages")
        assert sent["text"]["body"] == "Oi Ana! Pedido #1001 pago."
    runs = await api.client.get(f"/v1/automations/{automation['id']}/executions")
    [run] = runs.json()["data"]
    assert (run["status"], run["event_id"]) == ("completed", big["event_id"])
    detail = (await api.client.get(f"/v1/executions/{run['id']}")).json()
    assert [s["status"] for s in detail["steps"]] == ["completed", "completed"]
    assert sorted(e["metric"] for e in detail["emitted_events"]) == ["Message Sent", "Tag Added"]

    hit = (await api.client.get(f"/v1/events/{big['event_id']}/trace")).json()
    assert hit["automations"][0]["triggered"] is True
    assert hit["automations"][0]["execution"]["id"] == run["id"]
    miss = (await api.client.get(f"/v1/events/{small['event_id']}/trace")).json()
    assert miss["automations"][0]["outcome"] == "filter_false"
    assert miss["automations"][0]["filter_field"] == "properties.total"


async def test_a_send_answered_with_a_server_error_is_unknown_saying_why_never_resent(
    api: Api,
) -> None:
    """Meta's API failed while handling the send (500): the message may have gone out, and
    the Cloud API has no idempotency key, so it is not sent again. The operator sees the
    execution `unknown` with the answer, and decides (`sinal executions retry`)."""
    with whatsapp_server() as (wa_url, wa):
        wa.behaviour.fail_times = 1
        wa.behaviour.fail_status = 500
        wa.behaviour.fail_body = meta_error(131000, "Something went wrong")
        await _connect(api, wa_url)
        automation = (await api.post("/v1/automations", AUTOMATION)).json()
        await _order(api, "297.90", "1001")
        _drain(api)
        _drain(api)  # the API answers again by now: nothing is due all the same
        assert len(wa.requests) == 1

    runs = await api.client.get(f"/v1/automations/{automation['id']}/executions")
    [run] = runs.json()["data"]
    detail = (await api.client.get(f"/v1/executions/{run['id']}")).json()
    assert (run["status"], detail["status"]) == ("unknown", "unknown")
    [send] = detail["steps"]  # the tag step never started
    assert (send["status"], send["attempts"]) == ("unknown", 1)
    host = wa_url.removeprefix("http://")
    said = (
        f"{host} answered 500, a server error: the request may or may not have been carried "
        'out: {"error": {"message": "(#131000) Something went wrong", "type": "OAuthException", '
        '"code": 131000, "fbtrace_id": "AbCdEf123"}}; not sent again, so the contact gets no '
        "duplicate"
    )
    assert (send["error"], detail["last_error"]) == (said, said)
    assert detail["emitted_events"] == []


async def test_a_trigger_metric_spelling_a_system_metric_otherwise_is_422(api: Api) -> None:
    # saved, it listened to a custom "order paid" that Order Paid events never are
    body = {k: v for k, v in AUTOMATION.items() if k != "trigger_type"}
    body["trigger_metric"] = "order paid"

    answer = await api.post("/v1/automations", body)

    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert (error["field"], error["code"]) == ("trigger_metric", "misspelt_system_metric")
    assert "send 'Order Paid'" in error["message"]


async def test_patch_pauses_and_delete_removes(api: Api) -> None:
    automation = (await api.post("/v1/automations", AUTOMATION)).json()
    paused = await api.client.patch(f"/v1/automations/{automation['id']}",
                                    json={"status": "paused"})  # fmt: skip
    assert paused.status_code == 200
    assert paused.json()["status"] == "paused"
    listed = (await api.client.get("/v1/automations")).json()["data"]
    assert [a["status"] for a in listed] == ["paused"]
    gone = await api.client.delete(f"/v1/automations/{automation['id']}")
    assert gone.status_code == 204
    assert (await api.client.get(f"/v1/automations/{automation['id']}")).status_code == 404


REMINDER_STEPS: list[dict[str, Any]] = [
    {"type": "send_message", "text": "Oi!"}, {"type": "wait", "seconds": 1},
    {"type": "send_message", "text": "Seu carinho espera"},  # sic: a typo
]  # fmt: skip
REMINDER = {"name": "Lembrete", "trigger_type": "order_paid", "steps": REMINDER_STEPS}


async def _reminder_waiting(api: Api, wa_url: str) -> tuple[str, str]:
    """REMINDER's execution for an order, its first message sent and its wait begun: the
    automation's id and the execution's."""
    await _connect(api, wa_url)
    automation = (await api.post("/v1/automations", REMINDER)).json()
    await _order(api, "297.90", "1001")
    _drain(api)
    runs = await api.client.get(f"/v1/automations/{automation['id']}/executions")
    [run] = runs.json()["data"]
    assert run["status"] == "waiting"
    return automation["id"], run["id"]


async def test_a_paused_automations_executions_are_held_and_go_on_once_resumed(
    api: Api,
) -> None:
    """The typo is seen after the first message went out: pause, correct in place, resume.
    The execution waiting meanwhile sends the corrected text, once."""
    with whatsapp_server() as (wa_url, wa):
        automation, execution = await _reminder_waiting(api, wa_url)
        await api.client.patch(f"/v1/automations/{automation}", json={"status": "paused"})
        await anyio.sleep(1.1)  # the wait is over
        _drain(api)

        held = (await api.client.get(f"/v1/executions/{execution}")).json()
        assert (held["status"], held["next_step"]) == ("waiting", 2)
        assert held["last_error"] == "the automation is paused: held until it is active again"
        assert [s["status"] for s in held["steps"]] == ["completed", "completed"]
        assert len(wa.bodies("/1234/messages")) == 1

        fixed = [*REMINDER["steps"][:2], {"type": "send_message", "text": "Seu carrinho espera"}]
        corrected = await api.client.patch(
            f"/v1/automations/{automation}", json={"steps": fixed, "correct_in_place": True}
        )
        assert corrected.json()["version"] == 1
        _drain(api)
        assert len(wa.bodies("/1234/messages")) == 1  # corrected, still paused
        await api.client.patch(f"/v1/automations/{automation}", json={"status": "active"})
        resumed = (await api.client.get(f"/v1/executions/{execution}")).json()
        assert (resumed["status"], resumed["last_error"]) == ("waiting", None)
        _drain(api)

        [first, second] = wa.bodies("/1234/messages")
    assert (first["text"]["body"], second["text"]["body"]) == ("Oi!", "Seu carrinho espera")
    done = (await api.client.get(f"/v1/executions/{execution}")).json()
    assert done["status"] == "completed"
    assert [(s["status"], s["attempts"]) for s in done["steps"]] == [("completed", 1)] * 3


async def test_an_edit_of_the_steps_is_a_new_version_and_executions_under_way_keep_theirs(
    api: Api,
) -> None:
    """Without `correct_in_place`, the same correction makes version 2: the execution
    waiting meanwhile sends the text it was made with, and says which version it ran."""
    with whatsapp_server() as (wa_url, wa):
        automation, execution = await _reminder_waiting(api, wa_url)
        fixed = [*REMINDER_STEPS[:2], {"type": "send_message", "text": "Seu carrinho espera"}]
        edited = await api.client.patch(f"/v1/automations/{automation}", json={"steps": fixed})
        assert edited.json()["version"] == 2
        await anyio.sleep(1.1)  # the wait is over
        _drain(api)

        [first, second] = wa.bodies("/1234/messages")
    assert (first["text"]["body"], second["text"]["body"]) == ("Oi!", "Seu carinho espera")
    done = (await api.client.get(f"/v1/executions/{execution}")).json()
    assert (done["status"], done["automation_version"]) == ("completed", 1)
    assert [s["type"] for s in done["steps"]] == [s["type"] for s in REMINDER_STEPS]


@pytest.mark.parametrize(
    ("flag", "steps", "code"),
    [
        (True, [{"type": "send_message", "text": "Oi!"}], "not_in_place"),
        (True, [{"type": "add_tag", "tag": "a"}, {"type": "wait", "seconds": 1},
                {"type": "send_message", "text": "b"}], "not_in_place"),
        ("yes", [{"type": "send_message", "text": "Oi!"}], "invalid_type"),
    ],
)  # fmt: skip
async def test_a_correction_in_place_keeps_each_steps_place_or_is_refused(
    api: Api, flag: object, steps: list[dict[str, Any]], code: str
) -> None:
    with whatsapp_server() as (wa_url, _):
        automation, _ = await _reminder_waiting(api, wa_url)
        answer = await api.client.patch(
            f"/v1/automations/{automation}", json={"steps": steps, "correct_in_place": flag}
        )
        kept = (await api.client.get(f"/v1/automations/{automation}")).json()

    assert answer.status_code == 422
    [error] = answer.json()["errors"]
    assert error["code"] == code
    assert (kept["version"], kept["steps"]) == (1, REMINDER_STEPS)


async def test_a_deleted_automations_executions_end_stopped_saying_why(api: Api) -> None:
    with whatsapp_server() as (wa_url, wa):
        automation, execution = await _reminder_waiting(api, wa_url)
        gone = await api.client.delete(f"/v1/automations/{automation}")
        assert gone.status_code == 204

        stopped = (await api.client.get(f"/v1/executions/{execution}")).json()
        assert (stopped["status"], stopped["last_error"]) == (
            "stopped",
            "the automation was deleted",
        )
        await anyio.sleep(1.1)  # the wait is over
        _drain(api)

        assert len(wa.bodies("/1234/messages")) == 1
    after = (await api.client.get(f"/v1/executions/{execution}")).json()
    assert (after["status"], after["last_error"]) == ("stopped", "the automation was deleted")
    assert [s["status"] for s in after["steps"]] == ["completed", "completed"]
    assert [e["metric"] for e in after["emitted_events"]] == ["Message Sent"]


async def test_the_trace_of_an_event_whose_execution_is_held_says_paused(api: Api) -> None:
    with whatsapp_server() as (wa_url, _):
        automation, execution = await _reminder_waiting(api, wa_url)
        await api.client.patch(f"/v1/automations/{automation}", json={"status": "paused"})
        await anyio.sleep(1.1)
        _drain(api)
    runs = await api.client.get(f"/v1/automations/{automation}/executions")
    event = runs.json()["data"][0]["event_id"]

    [traced] = (await api.client.get(f"/v1/events/{event}/trace")).json()["automations"]

    assert (traced["triggered"], traced["outcome"]) == (False, "paused")
    assert traced["execution"]["id"] == execution
    assert traced["execution"]["status"] == "waiting"
    assert traced["execution"]["last_error"] == (
        "the automation is paused: held until it is active again"
    )


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"name": "x", "trigger_type": "order_shipped", "steps": [{"type": "add_tag",
          "tag": "a"}]}, {"trigger_type"}),
        ({"name": "x", "trigger_metric": "Order Paid", "trigger_type": "order_paid",
          "steps": [{"type": "add_tag", "tag": "a"}]}, {"trigger_type"}),
        ({"name": "x", "trigger_metric": "Order Paid", "steps": []}, {"steps"}),
        ({"name": "x", "trigger_metric": "Order Paid",
          "filters": [{"field": "properties.total", "op": "between", "value": 1}],
          "steps": [{"type": "add_tag", "tag": "a"}]}, {"filters[0].op"}),
        ({"name": "x", "trigger_metric": "Order Paid",
          "steps": [{"type": "send_message", "text": "Oi {{ contact.nome"}]}, {"steps[0].text"}),
        ({"name": "x", "trigger_metric": "Order Paid",
          "steps": [{"type": "webhook", "url": "ftp://example.com"}]}, {"steps[0].url"}),
        ({"name": "x", "trigger_metric": "Order Paid",
          "steps": [{"type": "webhook", "url": "https://a..b/h"}]}, {"steps[0].url"}),
        ({"name": "x", "trigger_metric": "Order Paid", "steps": [{"type": "filter",
          "conditions": [{"field": "contact.attributes.plan", "op": "eq", "value": "vip"}]}]},
         {"steps[0].conditions[0].field"}),
        ({"name": "x", "trigger_metric": "Order Paid",
          "steps": [{"type": "webhook", "url": "https://hooks.example.com/h",
                     "headers": {"X-Token": "senha-ção"}}]}, {"steps[0].headers.X-Token"}),
    ],
)  # fmt: skip
async def test_invalid_automation_is_422_naming_the_field(
    api: Api, body: dict[str, Any], fields: set[str]
) -> None:
    response = await api.post("/v1/automations", body)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    assert fields <= {e["field"] for e in response.json()["errors"]}


# The kinds a provider calls back, and what each needs besides its secret.
CALLED_BACK: dict[str, dict[str, str]] = {
    "shopify": {},
    "yampi": {},
    "whatsapp": {"verify_token": "v", "phone_number_id": "1234", "access_token": "EAAG"},
}


async def _webhook_urls(api: Api, kind: str, **headers: str) -> tuple[str, list[str]]:
    """The integration's id and its webhook_url as created, read alone and listed."""
    body = {"kind": kind, "secret": "s", **CALLED_BACK[kind]}
    made = await api.client.post("/v1/integrations", json=body, headers=headers)
    assert made.status_code == 201, made.text
    ident = made.json()["id"]
    one = await api.client.get(f"/v1/integrations/{ident}", headers=headers)
    listed = (await api.client.get("/v1/integrations", headers=headers)).json()["data"]
    [in_list] = [i for i in listed if i["id"] == ident]
    return ident, [made.json()["webhook_url"], one.json()["webhook_url"], in_list["webhook_url"]]


@pytest.fixture
async def proxied_api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    """An app whose public address (SINAL_PUBLIC_URL) is not the host it is reached on."""
    public = "https://crm.lojadaana.com.br/sinal/"
    async for running in running_api(database_url, ledger_at, public_url=public):
        yield running


@pytest.mark.parametrize("kind", CALLED_BACK)
async def test_integration_webhook_url_is_on_the_public_url_when_set(
    proxied_api: Api, kind: str
) -> None:
    # as a reverse proxy forwards it: to the internal address
    ident, urls = await _webhook_urls(proxied_api, kind, Host="10.0.3.7:8000")
    expected = f"https://crm.lojadaana.com.br/sinal/webhooks/{kind}/{ident}"
    assert urls == [expected] * 3


async def test_integration_webhook_url_is_on_the_request_host_without_a_public_url(
    api: Api,
) -> None:
    ident, urls = await _webhook_urls(api, "shopify")
    assert urls == [f"http://sinal.test/webhooks/shopify/{ident}"] * 3
    ai = await api.post("/v1/integrations", {"kind": "ai", "base_url": "https://ai.example",
                                             "model": "m"})  # fmt: skip
    assert ai.status_code == 201, ai.text
    assert "webhook_url" not in ai.json()  # nothing calls an AI integration back


async def test_an_unknown_field_is_named_with_the_fields_its_object_takes(api: Api) -> None:
    automation = await api.post("/v1/automations", {**AUTOMATION, "trigger": "order_paid"})
    step = {"type": "add_tag", "tag": "vip", "tags": ["vip"]}
    in_step = await api.post("/v1/automations", {**AUTOMATION, "steps": [step]})
    integration = await api.post("/v1/integrations", {**AI, "modle": "m"})

    def named(response: Any) -> list[tuple[str, str, str]]:
        assert response.status_code == 422, response.text
        return [(e["field"], e["code"], e["message"]) for e in response.json()["errors"]]

    assert named(automation) == [
        (
            "trigger",
            "unknown_field",
            "unknown field 'trigger'; "
            "expected one of: name, status, trigger_metric, trigger_type, filters, steps",
        )
    ]
    assert named(in_step) == [
        ("steps[0].tags", "unknown_field", "unknown field 'tags'; expected one of: tag")
    ]
    assert named(integration) == [("modle", "unknown_field", "unknown field 'modle'; ai takes "
        "kind, base_url, model, name, api_key")]  # fmt: skip


async def test_invalid_integration_is_422_naming_the_field(api: Api) -> None:
    response = await api.post("/v1/integrations", {"kind": "ai", "base_url": "not a url"})
    assert response.status_code == 422
    assert {e["field"] for e in response.json()["errors"]} == {"base_url", "model"}


async def test_an_integration_setting_of_another_type_is_named_as_such_not_as_missing(
    api: Api,
) -> None:
    # "phone_number_id is required for whatsapp" answered a phone_number_id sent as a JSON
    # number; a secret sent as one got "required" and "must be a string" both
    response = await api.post("/v1/integrations", {
        "kind": "whatsapp", "phone_number_id": 106540352242922, "secret": 5,
        "access_token": ["EAAG"], "verify_token": True,
    })  # fmt: skip

    assert response.status_code == 422
    assert [(e["field"], e["code"], e["message"]) for e in response.json()["errors"]] == [
        ("phone_number_id", "invalid_type",
         'phone_number_id must be a string (send "106540352242922", in quotes)'),
        ("secret", "invalid_type", 'secret must be a string (send "5", in quotes)'),
        ("verify_token", "invalid_type", "verify_token must be a string"),
        ("access_token", "invalid_type", "access_token must be a string"),
    ]  # fmt: skip
    missing = await api.post("/v1/integrations", {"kind": "shopify", "secret": ""})
    assert [(e["field"], e["code"]) for e in missing.json()["errors"]] == [("secret", "required")]
    long = await api.post("/v1/integrations", {"kind": "shopify", "secret": "s" * 4097})
    assert [(e["field"], e["code"]) for e in long.json()["errors"]] == [("secret", "too_long")]
    assert (await api.client.get("/v1/integrations")).json()["data"] == []


async def test_webhook_host_no_client_can_connect_to_is_422_saying_why(api: Api) -> None:
    response = await api.post("/v1/automations", {
        "name": "crm", "trigger_metric": "Order Paid",
        "steps": [{"type": "webhook", "url": f"https://{'a' * 64}.example.com/hook"}],
    })  # fmt: skip
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert (error["field"], error["code"]) == ("steps[0].url", "invalid_url")
    assert "longer than 63 characters" in error["message"]


WHATSAPP = {"kind": "whatsapp", "secret": "s", "phone_number_id": "1", "access_token": "t"}
AI = {"kind": "ai", "model": "m", "api_key": "sk-test"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "ai", "base_url": "https://a..b/v1", "model": "m"}, "base_url"),
        ({"kind": "ai", "base_url": "https://ai.example.com:0/v1", "model": "m"}, "base_url"),
        ({"kind": "ai", "base_url": "https://ai.example.com:99999/v1", "model": "m"},
         "base_url"),
        ({"kind": "whatsapp", "secret": "s", "phone_number_id": "1", "access_token": "t",
          "api_base_url": "https://graph.example.com:0"}, "api_base_url"),
        ({"kind": "whatsapp", "secret": "s", "phone_number_id": "1",
          "access_token": "EAAG-ção", "api_base_url": "https://graph.example.com"},
         "access_token"),
        # what httpx refuses (or `urlsplit` drops before the host is checked): every send
        # failed, after its retries
        ({**WHATSAPP, "api_base_url": "https://graph.exa\nmple.com/v21.0"}, "api_base_url"),
        ({**WHATSAPP, "api_base_url": "https://graph.example.com/v21.0\x7f"}, "api_base_url"),
        ({**AI, "base_url": "https://ai.example.com/v1\t/x"}, "base_url"),
        # paths are appended to a base URL: they would land in its query or fragment
        ({**AI, "base_url": "https://ai.example.com/v1?api-version=2024-06-01"}, "base_url"),
        ({**AI, "base_url": "https://ai.example.com/v1#chat"}, "base_url"),
        # sent as Basic auth in place of the api_key, and shown with the settings
        ({**AI, "base_url": "https://ana:sk-live@ai.example.com/v1"}, "base_url"),
        ({**AI, "base_url": "https://ai.example.com/" + "v" * 2048}, "base_url"),
    ],
)  # fmt: skip
async def test_connection_no_request_could_be_sent_with_is_422(
    api: Api, body: dict[str, Any], field: str
) -> None:
    assert await _refused_fields(api, body) == [field]


async def test_connection_base_url_with_credentials_is_422_saying_why(api: Api) -> None:
    """Settings are shown by `GET /v1/integrations`: credentials go in the secrets."""
    body = {**AI, "base_url": "https://ana:sk-live@ai.example.com/v1"}
    response = await api.post("/v1/integrations", body)
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert (error["field"], error["code"]) == ("base_url", "invalid_url")
    assert error["message"].startswith("base_url must not carry a user name or password")
    assert (await api.client.get("/v1/integrations")).json()["data"] == []


async def test_whatsapp_api_base_url_pasted_with_spaces_is_kept_trimmed_and_sends(
    api: Api,
) -> None:
    """As an AI connection's base_url is: the untrimmed URL was stored, and httpx read it
    as a relative URL, so every send stopped as `unknown` though nothing had left."""
    with whatsapp_server() as (wa_url, wa):
        made = await api.post(
            "/v1/integrations",
            {**WHATSAPP, "phone_number_id": "1234", "api_base_url": f" {wa_url}/v21.0\n"},
        )
        assert made.status_code == 201, made.text
        assert made.json()["api_base_url"] == f"{wa_url}/v21.0"
        await api.post("/v1/automations", AUTOMATION)
        await _order(api, "297.90", "1001")
        _drain(api)
        [sent] = wa.bodies("/v21.0/1234/messages")
    assert sent["text"]["body"] == "Oi Ana! Pedido #1001 pago."


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "ai", "base_url": "https://ai.example.com", "model": "m", "name": {"a": 1}},
         "name"),
        ({"kind": "whatsapp", "secret": "s", "phone_number_id": "1", "access_token": "t",
          "name": 5}, "name"),
        ({"kind": "shopify", "secret": "s", "shop_domain": ["loja.myshopify.com"]},
         "shop_domain"),
        ({"kind": "yampi", "secret": "s", "alias": "a" * 201}, "alias"),
        ({"kind": "yampi", "secret": "s", "alias": " "}, "alias"),
        ({"kind": "shopify", "secret": "s", "shop_domain": ""}, "shop_domain"),
        ({"kind": "shopify", "secret": "s", "name": ""}, "name"),
    ],
)  # fmt: skip
async def test_a_connection_setting_that_is_no_text_is_422(
    api: Api, body: dict[str, Any], field: str
) -> None:
    """Names and the like are text, not blank: anything else is refused naming the field,
    never stored as given (an int, a blank alias that checks nothing) nor failed on in the
    database (an object: 503, "retry")."""
    assert await _refused_fields(api, body) == [field]


async def _refused_fields(api: Api, body: dict[str, Any]) -> list[str]:
    """The fields `POST /v1/integrations` names refusing `body` with a 422."""
    response = await api.post("/v1/integrations", body)
    assert response.status_code == 422, response.text
    return [e["field"] for e in response.json()["errors"]]


async def test_configuration_needs_the_admin_scope(api: Api) -> None:
    key = await api.key_for("ingest", "read")
    response = await api.client.post("/v1/automations", json=AUTOMATION, headers=api.auth(key))
    assert response.status_code == 403


async def test_other_accounts_automations_look_like_missing_ones(api: Api) -> None:
    automation = (await api.post("/v1/automations", AUTOMATION)).json()
    other = api.ledger.create_account("Outra")
    key = await api.key_for("admin", "read", account=other)
    for path in (f"/v1/automations/{automation['id']}",
                 f"/v1/automations/{automation['id']}/executions"):  # fmt: skip
        response = await api.client.get(path, headers=api.auth(key))
        assert response.status_code == 404, path
    assert (await api.client.get("/v1/automations/not-a-uuid")).status_code == 404


@pytest.mark.parametrize(
    ("step", "field"),
    [
        ({"type": "wait", "until": "0001-01-01T00:00:00+01:00"}, "steps[0].until"),
        ({"type": "wait", "until": "9999-12-31T23:59:59-01:00"}, "steps[0].until"),
        ({"type": "send_template", "name": "pedido", "language": "pt_BR", "components": [
            {"type": "body", "parameters": [{"type": "currency", "amount_1000": 2**64}]}]},
         "steps[0].components[0].parameters[0].amount_1000"),
    ],
)  # fmt: skip
async def test_values_out_of_range_are_422_on_create_and_patch(
    api: Api, step: dict[str, Any], field: str
) -> None:
    body = {"name": "x", "trigger_metric": "Order Paid", "steps": [step]}
    created = await api.post("/v1/automations", body)
    assert created.status_code == 422, created.text
    assert [(e["field"], e["code"]) for e in created.json()["errors"]] == [(field, "out_of_range")]
    automation = (await api.post("/v1/automations", AUTOMATION)).json()
    patched = await api.client.patch(f"/v1/automations/{automation['id']}",
                                     json={"steps": [step]})  # fmt: skip
    assert patched.status_code == 422, patched.text
    assert [e["field"] for e in patched.json()["errors"]] == [field]


def _nfd(text: str) -> str:
    return unicodedata.normalize("NFD", text)


async def _order_by(api: Api, contact_id: str, source_id: str) -> None:
    response = await api.post("/v1/events", {
        "metric": "Order Paid", "contact_id": contact_id, "value": "297.90",
        "source": "shopify", "source_id": source_id, "entity_type": "order",
    })  # fmt: skip
    assert response.status_code == 201, response.text


async def test_tag_steps_store_tags_as_the_api_does_and_remove_the_tags_it_added(
    api: Api,
) -> None:
    ana = api.ledger.create_contact(api.account.id, phone="+55 11 98765-4321")
    api.ledger.add_tags(api.account.id, ana.id, ["promoção"])  # NFC, as the API keeps it
    created = await api.post("/v1/automations", {
        "name": "Tags", "trigger_type": "order_paid",
        "steps": [{"type": "add_tag", "tag": _nfd("  cliente   VIP ")},
                  {"type": "remove_tag", "tag": _nfd("promoção")}],
    })  # fmt: skip
    assert created.status_code == 201, created.text
    steps = created.json()["steps"]
    assert [s["tag"] for s in steps] == ["cliente VIP", "promoção"]  # trimmed, NFC

    await _order_by(api, str(ana.id), "2001")
    _drain(api)

    assert api.ledger.list_tags(api.account.id, ana.id) == ["cliente VIP"]


async def test_contact_filters_compare_with_the_contacts_stored_identities(api: Api) -> None:
    ana = api.ledger.create_contact(api.account.id, phone="+55 11 98765-4321", email="ana@loja.com")
    api.ledger.add_tags(api.account.id, ana.id, ["promoção"])
    created = await api.post("/v1/automations", {
        "name": "Filtro", "trigger_type": "order_paid",
        "steps": [{"type": "filter", "conditions": [
                      {"field": "contact.email", "op": "eq", "value": " Ana@Loja.com "},
                      {"field": "contact.phone", "op": "in", "value": ["11987654321"]},
                      {"field": "contact.phone", "op": "eq", "value": "+55 11 98765-4321"},
                      {"field": "contact.tags", "op": "contains", "value": _nfd("promoção")}]},
                  {"type": "add_tag", "tag": "passou"}],
    })  # fmt: skip
    assert created.status_code == 201, created.text
    conditions = created.json()["steps"][0]["conditions"]
    assert [c["value"] for c in conditions] == [
        "ana@loja.com", ["+5511987654321"], "+5511987654321", "promoção",
    ]  # fmt: skip

    await _order_by(api, str(ana.id), "2002")
    _drain(api)

    assert sorted(api.ledger.list_tags(api.account.id, ana.id)) == ["passou", "promoção"]


@pytest.mark.parametrize(
    "step", [{"type": "add_tag", "tag": " \t "}, {"type": "remove_tag", "tag": "v\u0007ip"}]
)
async def test_a_tag_no_contact_could_hold_is_422_naming_the_step(
    api: Api, step: dict[str, Any]
) -> None:
    response = await api.post(
        "/v1/automations", {"name": "x", "trigger_type": "order_paid", "steps": [step]}
    )
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == ["steps[0].tag"]


@pytest.mark.parametrize(
    ("condition", "field"),
    [
        ({"field": "contact.email", "op": "eq", "value": "ana@"}, ".value"),
        ({"field": "contact.phone", "op": "in", "value": ["+55 11 98765-4321", "123"]},
         ".value[1]"),
        ({"field": "contact.tags", "op": "contains", "value": "   "}, ".value"),
    ],
)  # fmt: skip
async def test_a_contact_filter_value_no_contact_could_hold_is_422_naming_the_condition(
    api: Api, condition: dict[str, Any], field: str
) -> None:
    step = {"type": "filter", "conditions": [condition]}
    response = await api.post(
        "/v1/automations", {"name": "x", "trigger_type": "order_paid", "steps": [step]}
    )
    assert response.status_code == 422, response.text
    errors = [e["field"] for e in response.json()["errors"]]
    assert errors == [f"steps[0].conditions[0]{field}"]


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks spec's example


@pytest.mark.parametrize(
    "secret",
    [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no whsec_
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"k" * 16).decode(),  # too short to be a key
        "whsec_" + base64.b64encode(b"k" * 65).decode(),
        "whsec_********",  # the mask, with no secret of this step to keep
        12345,
    ],
)
async def test_a_webhook_secret_not_in_the_standard_form_is_422_naming_it(
    api: Api, secret: object
) -> None:
    response = await api.post("/v1/automations", {
        "name": "crm", "trigger_type": "order_paid",
        "steps": [{"type": "webhook", "url": "https://hooks.example.com/h", "secret": secret}],
    })  # fmt: skip
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["field"] == "steps[0].secret"
    assert error["code"] in {"invalid_type", "invalid_format", "out_of_range", "invalid_value"}
    if secret != "whsec_********":  # a secret, even a bad one, is never quoted
        assert str(secret).removeprefix("whsec_") not in error["message"]


async def test_a_webhook_secret_is_never_shown_and_a_patch_sending_back_its_mask_keeps_it(
    api: Api,
) -> None:
    with webhook_receiver() as (hook_url, hook):
        step = {"type": "webhook", "url": f"{hook_url}/signed", "secret": SECRET}
        made = await api.post("/v1/automations", {
            "name": "crm", "trigger_type": "order_paid", "steps": [step],
        })  # fmt: skip
        assert made.status_code == 201, made.text
        path = f"/v1/automations/{made.json()['id']}"
        answers = [
            made,
            await api.client.get(path),
            await api.client.get("/v1/automations"),
            await api.client.patch(path, json={"name": "crm 2"}),
        ]
        for answer in answers:
            assert answer.status_code == 200 or answer is made
            assert SECRET.removeprefix("whsec_") not in answer.text
            assert '"secret":"whsec_********"' in answer.text
        # sent back as shown, after a step put before it: kept (by its url)
        shown = answers[1].json()["steps"]
        other = {"type": "webhook", "url": f"{hook_url}/unsigned"}
        patched = await api.client.patch(path, json={"steps": [other, *shown]})
        assert patched.status_code == 200, patched.text
        assert [s.get("secret") for s in patched.json()["steps"]] == [None, "whsec_********"]
        await _order(api, "297.90", "1001")
        _drain(api)
        # steps sent without the secret: the step is no longer signed, as the answer shows
        dropped = await api.client.patch(path, json={"steps": [{**step, "secret": None}]})
        assert dropped.status_code == 200, dropped.text
        assert "secret" not in dropped.json()["steps"][0]
        await _order(api, "297.90", "1002")
        _drain(api)

    unsigned, signed, last = hook.requests
    assert (unsigned["path"], signed["path"], last["path"]) == ("/unsigned", "/signed", "/signed")
    verify_signature(SECRET, signed)
    assert "webhook-signature" not in {k.lower() for k in unsigned["headers"]}
    assert "webhook-signature" not in {k.lower() for k in last["headers"]}


# -- listing executions a page at a time -------------------------------------------------

TAGGING = {"name": "Quiz", "trigger_metric": "Quiz Answered",
           "steps": [{"type": "add_tag", "tag": "respondeu"}]}  # fmt: skip


def _answered(api: Api, contact_id: UUID, numbers: range) -> None:
    """A Quiz Answered event of the contact for each number, the executions made and run."""
    for n in numbers:
        api.ledger.emit_event(
            account_id=api.account.id, contact_id=contact_id, metric_name="Quiz Answered",
            source="api", source_id=f"q{n}",
        )  # fmt: skip
    _drain(api)


async def test_executions_page_through_every_one_once_newest_first(api: Api) -> None:
    """Pass each `next_cursor` back as `cursor`: every execution of the automation once,
    newest first (another automation's, made for the same events, left out); those made
    while paging are newer than the first page, so no later page shows one."""
    automation = (await api.post("/v1/automations", TAGGING)).json()
    await api.post("/v1/automations", {**TAGGING, "name": "Outra"})
    ana = api.ledger.create_contact(api.account.id, email="ana@example.com")
    _answered(api, ana.id, range(7))
    path = f"/v1/automations/{automation['id']}/executions"
    whole = (await api.client.get(path)).json()
    assert whole["next_cursor"] is None
    ids = [x["id"] for x in whole["data"]]
    assert len(ids) == 7
    assert ids == sorted(ids, key=UUID, reverse=True)  # UUIDv7: newest first

    pages: list[list[str]] = []
    params: dict[str, Any] = {"limit": 3}
    while True:
        page = await api.client.get(path, params=params)
        assert page.status_code == 200, page.text
        pages.append([x["id"] for x in page.json()["data"]])
        if len(pages) == 1:
            _answered(api, ana.id, range(7, 9))
        if page.json()["next_cursor"] is None:
            break
        params["cursor"] = page.json()["next_cursor"]
    assert pages == [ids[:3], ids[3:6], ids[6:]]
    newest = (await api.client.get(path, params={"limit": 2})).json()
    assert not {x["id"] for x in newest["data"]} & set(ids)
    assert newest["next_cursor"] is not None


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        # a cursor of GET /v1/events (a time and an id) is not one of these
        base64.urlsafe_b64encode(f"2026-12-07T13:00:00+00:00|{UUID(int=1)}".encode()).decode(),
    ],
)
async def test_executions_cursor_not_from_a_page_is_422_naming_it(api: Api, cursor: str) -> None:
    automation = (await api.post("/v1/automations", TAGGING)).json()
    response = await api.client.get(
        f"/v1/automations/{automation['id']}/executions", params={"cursor": cursor}
    )
    assert response.status_code == 422, response.text
    assert [(e["field"], e["code"]) for e in response.json()["errors"]] == [
        ("cursor", "invalid_cursor")
    ]


# -- the account's automations and integrations, a page at a time ----------------------

AI = {"kind": "ai", "base_url": "https://ai.example", "model": "m"}


async def _paged(api: Api, path: str, limit: int, between: Any = None) -> list[list[str]]:
    """The ids of each page of `path`, passing each `next_cursor` back as `cursor`;
    `between()` is awaited after the first page."""
    pages: list[list[str]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        page = await api.client.get(path, params=params)
        assert page.status_code == 200, page.text
        pages.append([x["id"] for x in page.json()["data"]])
        if between is not None and len(pages) == 1:
            await between()
        if page.json()["next_cursor"] is None:
            return pages
        params["cursor"] = page.json()["next_cursor"]


@pytest.mark.parametrize("path", ["/v1/automations", "/v1/integrations"])
async def test_automations_and_integrations_page_through_every_one_once_oldest_first(
    api: Api, path: str
) -> None:
    """As every list: `limit`, and each `next_cursor` passed back as `cursor` until it is
    null; oldest first, each live one once (a deleted one left out), and one made while
    paging on the last page. Without parameters, the first 100 and a null cursor."""
    body = AI if path == "/v1/integrations" else TAGGING
    ids = [(await api.post(path, {**body, "name": f"n{n}"})).json()["id"] for n in range(6)]
    assert (await api.client.delete(f"{path}/{ids.pop(2)}")).status_code == 204
    whole = (await api.client.get(path)).json()
    assert ([x["id"] for x in whole["data"]], whole["next_cursor"]) == (ids, None)
    made: list[str] = []

    async def make_one() -> None:
        made.append((await api.post(path, {**body, "name": "later"})).json()["id"])

    pages = await _paged(api, path, 2, between=make_one)

    assert pages == [ids[:2], ids[2:4], [ids[4], *made]]
    other = await api.key_for("admin", account=api.ledger.create_account("Outra"))
    theirs = await api.client.get(path, headers=api.auth(other))
    assert theirs.json() == {"data": [], "next_cursor": None}


@pytest.mark.parametrize("path", ["/v1/automations", "/v1/integrations"])
@pytest.mark.parametrize(
    ("params", "field"),
    [({"cursor": "garbage"}, "cursor"), ({"limit": 0}, "limit"), ({"limit": 1001}, "limit")],
)
async def test_automations_and_integrations_bad_page_is_422_naming_it(
    api: Api, path: str, params: dict[str, Any], field: str
) -> None:
    response = await api.client.get(path, params=params)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    if field == "cursor":
        assert response.json()["errors"][0]["code"] == "invalid_cursor"


async def test_an_executions_answer_lists_1000_emitted_events_and_says_when_more(
    api: Api,
) -> None:
    """A step emits one event at most, so only events a library caller tagged with the
    execution pass 1,000: the answer lists the newest 1,000, oldest first, and
    `emitted_events_truncated` says that more name the execution."""
    automation = (await api.post("/v1/automations", TAGGING)).json()
    ana = api.ledger.create_contact(api.account.id, email="ana@example.com")
    _answered(api, ana.id, range(1))
    runs = await api.client.get(f"/v1/automations/{automation['id']}/executions")
    [run] = runs.json()["data"]
    path = f"/v1/executions/{run['id']}"
    alone = (await api.client.get(path)).json()
    assert [e["metric"] for e in alone["emitted_events"]] == ["Tag Added"]
    assert alone["emitted_events_truncated"] is False

    start = datetime.now(UTC) + timedelta(minutes=1)
    api.ledger.emit_many([
        EmitEvent(account_id=api.account.id, contact_id=ana.id, metric_name="Note",
                  source="crm", source_id=str(n), automation_execution_id=UUID(run["id"]),
                  occurred_at=start + timedelta(seconds=n))
        for n in range(1000)
    ])  # fmt: skip

    detail = (await api.client.get(path)).json()
    emitted = detail["emitted_events"]
    assert len(emitted) == 1000
    assert {e["metric"] for e in emitted} == {"Note"}  # Tag Added, the oldest, left out
    assert [e["occurred_at"] for e in emitted] == sorted(e["occurred_at"] for e in emitted)
    assert detail["emitted_events_truncated"] is True


# -- what the database refuses: the input's fault (422) or sinal's (500) ------------------

_REFUSALS = {
    # a CHECK on the data: the input's fault, as a check validation lacks would be
    ("input", "sqlite"): ["CREATE TRIGGER no_acme BEFORE INSERT ON integrations "
                          "WHEN NEW.name = 'acme' BEGIN SELECT RAISE(ABORT, 'no acme'); END"],
    ("input", "postgres"): ["ALTER TABLE integrations ADD CONSTRAINT no_acme "
                            "CHECK (name IS DISTINCT FROM 'acme')"],
    # a row sinal itself writes with a NOT NULL column left empty, as code out of step with
    # its schema would, whatever the input
    ("own", "sqlite"): ["CREATE TABLE audit (note TEXT NOT NULL)",
                        "CREATE TRIGGER audit AFTER INSERT ON integrations "
                        "BEGIN INSERT INTO audit VALUES (NULL); END"],
    ("own", "postgres"): ["CREATE TABLE audit (note text NOT NULL)",
                          "CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS "
                          "$$ BEGIN INSERT INTO audit VALUES (NULL); RETURN NEW; END $$",
                          "CREATE TRIGGER audit AFTER INSERT ON integrations "
                          "FOR EACH ROW EXECUTE FUNCTION audit()"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("fault", "status", "problem"),
    [("input", 422, "unstorable-input"), ("own", 500, "internal-error")],
)
async def test_a_refused_write_is_422_for_the_inputs_fault_and_500_for_sinals(
    api: Api, caplog: pytest.LogCaptureFixture, fault: str, status: int, problem: str
) -> None:
    """Data the database refuses is the input's fault (422, a warning logged); a row sinal
    itself wrote wrong is a bug, whatever the input: 500 with an opaque `error_id`, which
    the log line holding its traceback names (it was 422, telling the client to change an
    input that is fine). Neither echoes the database's message; neither writes a thing."""
    backend = "sqlite" if api.url.startswith("sqlite") else "postgres"
    for statement in _REFUSALS[fault, backend]:
        sql(api.url, statement)

    with caplog.at_level(logging.WARNING, logger="sinal.api"):
        response = await api.post("/v1/integrations", {**AI, "name": "acme"})

    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == f"/problems/{problem}"
    assert "acme" not in body["detail"]
    assert "audit" not in body["detail"]
    [logged] = [r for r in caplog.records if r.name == "sinal.api"]
    if fault == "own":
        assert len(body["error_id"]) == 32
        assert body["error_id"] in logged.getMessage()
        assert logged.exc_info is not None  # the traceback
    else:
        assert "error_id" not in body
        assert logged.exc_info is None
    assert (await api.client.get("/v1/integrations")).json()["data"] == []


# -- wait until --------------------------------------------------------------------------


async def test_a_wait_until_already_past_is_422_on_create_and_patch(api: Api) -> None:
    """A date past when the automation is saved would not wait at all: a mistake (the
    year typed wrong), refused naming the step, not stored to run through it."""
    past = {"type": "wait", "until": stamp(datetime.now(UTC) - timedelta(minutes=1))}
    body = {**TAGGING, "steps": [*TAGGING["steps"], past]}
    created = await api.post("/v1/automations", body)
    assert created.status_code == 422, created.text
    assert [(e["field"], e["code"]) for e in created.json()["errors"]] == [
        ("steps[1].until", "in_the_past")
    ]
    assert (await api.client.get("/v1/automations")).json()["data"] == []
    automation = (await api.post("/v1/automations", TAGGING)).json()
    patched = await api.client.patch(f"/v1/automations/{automation['id']}",
                                     json={"steps": [past]})  # fmt: skip
    assert patched.status_code == 422, patched.text
    assert [e["field"] for e in patched.json()["errors"]] == ["steps[0].until"]


async def test_a_wait_until_that_passed_since_it_was_saved_still_runs_and_patches(
    api: Api,
) -> None:
    """Saved a day ago, when its date was ahead: it is not dead now that the date has
    passed (it runs through the wait at once), and a PATCH keeping the date is taken."""
    until = datetime.now(UTC) - timedelta(hours=1)
    a_day_ago = Ledger(api.ledger.store, clock=lambda: until - timedelta(days=1))
    steps = [{"type": "add_tag", "tag": "antes"}, {"type": "wait", "until": stamp(until)},
             {"type": "add_tag", "tag": "depois"}]  # fmt: skip
    row = Automations(a_day_ago).create(api.account.id, {**TAGGING, "steps": steps})
    path = f"/v1/automations/{row.id}"
    shown = (await api.client.get(path)).json()
    paused = await api.client.patch(path, json={"status": "paused"})
    assert paused.status_code == 200, paused.text
    resumed = await api.client.patch(path, json={"status": "active", "steps": shown["steps"]})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["steps"] == shown["steps"]

    ana = api.ledger.create_contact(api.account.id, email="ana@example.com")
    _answered(api, ana.id, range(1))
    [run] = (await api.client.get(f"{path}/executions")).json()["data"]
    assert (run["status"], run["next_step"]) == ("completed", 3)


# -- the number a sending step sends from ------------------------------------------------


async def test_a_sending_steps_number_must_be_one_of_the_accounts_connections(api: Api) -> None:
    """`phone_number_id` names the WhatsApp number to send from: one the account has not
    connected is 422 naming the step; a PATCH keeping one whose connection was deleted
    since is taken (the step then fails when it would use it)."""
    connection = connect_whatsapp(api)
    unknown = {"type": "send_message", "text": "Oi", "phone_number_id": "999"}
    created = await api.post("/v1/automations", {**TAGGING, "steps": [unknown]})
    assert created.status_code == 422, created.text
    [error] = created.json()["errors"]
    assert (error["field"], error["code"]) == ("steps[0].phone_number_id", "unknown_connection")
    assert PHONE_NUMBER_ID in error["message"]  # the numbers it could name

    known = {**unknown, "phone_number_id": PHONE_NUMBER_ID}
    created = await api.post("/v1/automations", {**TAGGING, "steps": [known]})
    assert created.status_code == 201, created.text
    assert created.json()["steps"] == [known]
    path = f"/v1/automations/{created.json()['id']}"
    patched = await api.client.patch(path, json={"steps": [{"type": "add_tag", "tag": "x"},
                                                           unknown]})  # fmt: skip
    assert patched.status_code == 422, patched.text
    assert [e["field"] for e in patched.json()["errors"]] == ["steps[1].phone_number_id"]

    assert (await api.client.delete(f"/v1/integrations/{connection.id}")).status_code == 204
    kept = await api.client.patch(path, json={"status": "paused", "steps": [known]})
    assert kept.status_code == 200, kept.text
    assert kept.json()["steps"] == [known]
