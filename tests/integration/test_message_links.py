"""Automation messages with tracked links, on both backends: the dispatcher runs the steps
against the local WhatsApp and AI servers; clicks go through the app's `GET /l/{token}`.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest

from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from sinal.automations.service import Automations
from sinal.ledger import Ledger
from sinal.links import StepLinks
from sinal.store.automations import AutomationStore, Execution
from tests.helpers import count, sql
from tests.integration.conftest import Api, running_api
from tests.integration.whatsapp import connect_whatsapp, events
from tests.servers import Recorder, ai_server, meta_error, whatsapp_server

pytestmark = pytest.mark.anyio

PUBLIC = "https://sin.al"
SHORT = re.compile(r"https://sin\.al/l/([A-Za-z0-9_-]{16})")
PERSON = "Mozilla/5.0 (Linux; Android 14) AppleWebKit/537.36 Chrome/124.0 Mobile Safari/537.36"
ORDER = "https://loja.com.br/pedidos/1042?utm_source=whatsapp"
HELP = "https://loja.com.br/ajuda"


def linking_dispatcher(ledger: Ledger, public_url: str) -> Dispatcher:
    """The real dispatcher, tracked links pointing at `public_url`."""
    return Dispatcher(
        ledger,
        DispatchSettings(
            http_timeout=5,
            retry=RetryPolicy(3, base=0.01, cap=0.02),
            public_url=public_url,
            allow_private_webhooks=True,  # the local WhatsApp server
        ),
    )


@pytest.fixture
async def api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    async for running in running_api(database_url, ledger_at, public_url=PUBLIC):
        yield running


async def _automation(api: Api, *steps: dict[str, Any]) -> None:
    answer = await api.post(
        "/v1/automations",
        {"name": "Pedido enviado", "trigger_metric": "Order Fulfilled", "steps": list(steps)},
    )
    assert answer.status_code == 201, answer.text


async def _order_fulfilled(api: Api) -> UUID:
    """Order Fulfilled for Caio (+55 21 97654-3210); his contact id."""
    order = await api.post("/v1/events", {
        "metric": "Order Fulfilled", "source": "shopify", "source_id": "5001",
        "entity_type": "order", "contact": {"phone": "+55 21 97654-3210", "name": "Caio"},
        "properties": {"tracking_url": "https://rastreio.example.com/BR123456789?x=1"},
    })  # fmt: skip
    assert order.status_code == 201, order.text
    return UUID(order.json()["contact_id"])


def _run(dispatcher: Dispatcher, api: Api) -> Execution:
    """Run the dispatcher until the execution settles; the execution, with its steps."""
    store: AutomationStore = Automations(api.ledger).store
    try:
        for _ in range(250):  # retries back off 10-20 ms: settled long before
            dispatcher.run_once()
            found = store.list_executions(api.account.id)
            if found and found[0].status not in ("pending", "waiting"):
                break
            time.sleep(0.02)
    finally:
        dispatcher.close()
    [execution] = store.list_executions(api.account.id)
    detail = store.get_execution(api.account.id, execution.id)
    assert detail is not None
    return detail


def _texts(server: Recorder) -> list[str]:
    return [body["text"]["body"] for body in server.bodies("/messages")]


async def _click(api: Api, token: str) -> str:
    answer = await api.client.get(f"/l/{token}", headers={"User-Agent": PERSON})
    assert answer.status_code == 302, answer.text
    location: str = answer.headers["location"]
    return location


async def test_message_step_sends_its_urls_as_tracked_links_and_clicks_are_recorded(
    api: Api,
) -> None:
    text = (f"Oi {{{{ contact.name | first_name }}}}! Seu pedido: {ORDER}. Dúvidas? ({HELP}) "
            f"ou mailto:ajuda@loja.com.br — {ORDER}")  # fmt: skip
    await _automation(api, {"type": "send_message", "text": text, "track_links": True})
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        contact_id = await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, PUBLIC), api)
    assert execution.status == "completed", execution.last_error

    [sent] = _texts(server)
    order_token, help_token, again = SHORT.findall(sent)
    assert again == order_token  # one link per URL in a message
    assert order_token != help_token
    assert sent == (
        f"Oi Caio! Seu pedido: {PUBLIC}/l/{order_token}. Dúvidas? ({PUBLIC}/l/{help_token}) "
        f"ou mailto:ajuda@loja.com.br — {PUBLIC}/l/{order_token}"
    )  # punctuation and brackets stay outside; other schemes untouched
    assert ORDER not in sent
    assert count(api.url, "links") == 2
    [message] = events(api, "Message Sent")
    assert message.properties["text"] == sent
    assert execution.steps[0].result is not None
    assert execution.steps[0].result["links"] == [
        {"url": ORDER, "short_url": f"{PUBLIC}/l/{order_token}"},
        {"url": HELP, "short_url": f"{PUBLIC}/l/{help_token}"},
    ]

    assert await _click(api, order_token) == ORDER
    assert await _click(api, help_token) == HELP
    clicks = events(api, "Link Clicked")
    assert sorted(c.properties["url"] for c in clicks) == sorted([ORDER, HELP])
    for click in clicks:
        assert click.contact_id == contact_id == execution.contact_id
        assert click.properties["automation_execution_id"] == str(execution.id)
        assert click.properties["campaign"] == "Pedido enviado"  # the automation's name


async def test_message_step_run_again_after_a_failed_send_sends_the_same_links(
    api: Api,
) -> None:
    await _automation(
        api, {"type": "send_message", "text": f"Pedido: {ORDER}", "track_links": True}
    )
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        server.behaviour.fail_times = 1  # refused, not sent: the step runs again later
        server.behaviour.fail_status = 400
        server.behaviour.fail_body = meta_error(131056, "pair rate limit hit")
        await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, PUBLIC), api)
    assert execution.status == "completed", execution.last_error
    assert execution.steps[0].attempts == 2

    first, second = _texts(server)
    assert first == second
    [token] = SHORT.findall(second)
    assert count(api.url, "links") == 1
    [(link_id, url, execution_id)] = sql(
        api.url, "SELECT id, url, automation_execution_id FROM links"
    )
    assert (url, str(execution_id)) == (ORDER, str(execution.id))
    assert await _click(api, token) == ORDER
    [click] = events(api, "Link Clicked")
    assert click.properties["link_id"] == str(link_id)


async def test_step_links_are_made_once_per_execution_step_and_url(api: Api) -> None:
    await _automation(api, {"type": "add_tag", "tag": "enviado"})
    with whatsapp_server() as (wa_url, _server):
        connect_whatsapp(api, api_base_url=wa_url)
        await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, PUBLIC), api)
    links = StepLinks(api.ledger, PUBLIC + "/")
    first = links(execution, 0, ORDER, "bf")
    assert links(execution, 0, ORDER, "bf") == first  # the step run again
    assert links(execution, 0, ORDER, "other campaign") == first  # the first one stays
    assert len({first, links(execution, 1, ORDER, "bf"), links(execution, 0, HELP, "bf")}) == 3
    assert links(execution, 0, first, "bf") == first  # already one of ours: kept as it is
    assert count(api.url, "links") == 3


async def test_ai_answer_and_template_parameters_send_tracked_links(api: Api) -> None:
    await _automation(
        api,
        {"type": "ai_respond", "prompt": f"Acompanhe em {ORDER}!", "track_links": True},
        {"type": "send_template", "name": "pedido_enviado", "language": "pt_BR",
         "parameters": ["{{ contact.name | first_name }}", "{{ event.properties.tracking_url }}"],
         "track_links": True, "campaign": "rastreio"},
    )  # fmt: skip
    with whatsapp_server() as (wa_url, server), ai_server() as (ai_url, _ai):
        connect_whatsapp(api, api_base_url=wa_url)
        await api.post("/v1/integrations", {"kind": "ai", "base_url": ai_url, "model": "m"})
        await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, PUBLIC), api)
    assert execution.status == "completed", execution.last_error

    answer, template = server.bodies("/messages")
    [answer_token] = SHORT.findall(answer["text"]["body"])
    assert answer["text"]["body"] == f"Resposta: Acompanhe em {PUBLIC}/l/{answer_token}!"
    name, tracking = template["template"]["components"][0]["parameters"]
    assert name["text"] == "Caio"
    [tracking_token] = SHORT.findall(tracking["text"])
    assert tracking["text"] == f"{PUBLIC}/l/{tracking_token}"

    assert await _click(api, answer_token) == ORDER
    assert await _click(api, tracking_token) == "https://rastreio.example.com/BR123456789?x=1"
    campaigns = {c.properties["url"]: c.properties["campaign"] for c in events(api, "Link Clicked")}
    assert campaigns == {
        ORDER: "Pedido enviado",
        "https://rastreio.example.com/BR123456789?x=1": "rastreio",
    }


async def test_message_links_end_before_emoji_and_keep_accented_paths(api: Api) -> None:
    promo, sale = "https://loja.com.br/promo", "https://loja.com.br/promoção"
    text = f"Confira {promo}🔥🔥 hoje e {sale}。"
    await _automation(api, {"type": "send_message", "text": text, "track_links": True})
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, PUBLIC), api)
    assert execution.status == "completed", execution.last_error

    [sent] = _texts(server)
    promo_token, sale_token = SHORT.findall(sent)
    assert sent == f"Confira {PUBLIC}/l/{promo_token}🔥🔥 hoje e {PUBLIC}/l/{sale_token}。"
    assert await _click(api, promo_token) == promo
    assert await _click(api, sale_token) == "https://loja.com.br/promo%C3%A7%C3%A3o"


async def test_message_urls_no_browser_can_open_are_sent_as_written(api: Api) -> None:
    text = (
        f"Pedido: {ORDER} ou https://loja.com.br:99999/p, https://loja.com.br:abc/ e https://a..b/!"
    )
    await _automation(api, {"type": "send_message", "text": text, "track_links": True})
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, PUBLIC), api)
    assert execution.status == "completed", execution.last_error
    [sent] = _texts(server)
    [token] = SHORT.findall(sent)
    assert sent == text.replace(ORDER, f"{PUBLIC}/l/{token}")
    assert [url for (url,) in sql(api.url, "SELECT url FROM links")] == [ORDER]


async def test_message_without_track_links_is_sent_as_written(api: Api) -> None:
    await _automation(api, {"type": "send_message", "text": f"Pedido: {ORDER}"})
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        await _order_fulfilled(api)
        _run(linking_dispatcher(api.ledger, PUBLIC), api)
    assert _texts(server) == [f"Pedido: {ORDER}"]
    assert count(api.url, "links") == 0


async def test_tracked_links_without_a_short_url_base_fail_before_sending(api: Api) -> None:
    await _automation(
        api, {"type": "send_message", "text": f"Pedido: {ORDER}", "track_links": True}
    )
    with whatsapp_server() as (wa_url, server):
        connect_whatsapp(api, api_base_url=wa_url)
        await _order_fulfilled(api)
        execution = _run(linking_dispatcher(api.ledger, public_url=""), api)  # not set
    assert execution.status == "dead"  # not retried: a setting has to change first
    assert "SINAL_PUBLIC_URL" in (execution.last_error or "")
    assert server.requests == []
    assert count(api.url, "links") == 0


async def test_track_links_must_be_a_boolean(api: Api) -> None:
    answer = await api.post("/v1/automations", {
        "name": "x", "trigger_metric": "Order Fulfilled",
        "steps": [{"type": "send_message", "text": "oi", "track_links": "sim"}],
    })  # fmt: skip
    assert answer.status_code == 422
    assert [(e["field"], e["code"]) for e in answer.json()["errors"]] == [
        ("steps[0].track_links", "invalid_type")
    ]
