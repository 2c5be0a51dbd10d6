"""Every time an answer shows is written one way, whichever resource it belongs to."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from sinal.automations.backoff import RetryPolicy
from sinal.automations.dispatcher import Dispatcher, DispatchSettings
from tests.integration.conftest import Api
from tests.integration.whatsapp import connect_whatsapp, deliver, fixture_body

pytestmark = pytest.mark.anyio

# RFC 3339 in UTC with "Z"; microseconds only when there are some, as events always had.
UTC_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{6})?Z")
AUTOMATION = {
    "name": "Pedido pago", "trigger_type": "order_paid",
    "steps": [{"type": "add_tag", "tag": "comprou"},
              {"type": "wait", "until": "2099-12-01T10:00:00-03:00"},
              {"type": "wait", "seconds": 3600}],
}  # fmt: skip


def _times(answer: Any, where: str = "$") -> Iterator[tuple[str, str]]:
    """(path, text) of every time in `answer`: the values of keys ending in `_at` or
    named `until`."""
    if isinstance(answer, dict):
        for key, value in answer.items():
            if isinstance(value, str) and (key.endswith("_at") or key == "until"):
                yield f"{where}.{key}", value
            yield from _times(value, f"{where}.{key}")
    elif isinstance(answer, list):
        for i, value in enumerate(answer):
            yield from _times(value, f"{where}[{i}]")


def _drain(api: Api) -> None:
    dispatcher = Dispatcher(api.ledger, DispatchSettings(retry=RetryPolicy(2)))
    try:
        while dispatcher.run_once():
            pass
    finally:
        dispatcher.close()


async def _answers(api: Api) -> dict[str, Any]:
    """One answer about each kind of resource, by what was asked."""
    got: dict[str, Any] = {}

    async def get(path: str) -> Any:
        response = await api.client.get(path)
        assert response.status_code == 200, (path, response.text)
        got[f"GET {path}"] = body = response.json()
        return body

    async def post(path: str, body: Any, status: int = 201) -> Any:
        response = await api.post(path, body)
        assert response.status_code == status, (path, response.text)
        got[f"POST {path}"] = answer = response.json()
        return answer

    integration = await post("/v1/integrations", {"kind": "shopify", "secret": "s",
                                                 "shop_domain": "loja.myshopify.com"})  # fmt: skip
    automation = await post("/v1/automations", AUTOMATION)
    contact = await post("/v1/contacts", {"phone": "+55 11 98765-4321", "name": "Ana"})
    event = await post("/v1/events", {
        "metric": "Order Paid", "contact_id": contact["id"], "value": "297.90",
        "source": "shopify", "source_id": "1001", "occurred_at": "2026-12-01T09:00:00.5-03:00",
    })  # fmt: skip
    await post("/v1/events", {"metric": "Order Paid", "contact_id": str(integration["id"]),
                              "source": "api", "source_id": "x"}, 422)  # fmt: skip
    await post("/v1/links", {"url": "https://loja.example.com/p/1", "contact_id": contact["id"]})
    wa = connect_whatsapp(api)
    assert (await deliver(api, wa, fixture_body("text_message"))).status_code == 200
    _drain(api)
    [execution] = (await get(f"/v1/automations/{automation['id']}/executions"))["data"]
    for path in (
        "/v1/account", "/v1/integrations", f"/v1/integrations/{integration['id']}",
        "/v1/automations", f"/v1/automations/{automation['id']}",
        f"/v1/executions/{execution['id']}", f"/v1/events/{event['event_id']}/trace",
        f"/v1/contacts/{contact['id']}", f"/v1/contacts/{contact['id']}/metrics",
        f"/v1/contacts/{contact['id']}/timeline", "/v1/events",
        f"/v1/events/{event['event_id']}", "/v1/rejections", "/v1/conversations",
    ):  # fmt: skip
        await get(path)
    return got


async def test_every_time_in_every_answer_is_utc_with_z(api: Api) -> None:
    answers = await _answers(api)
    times = [(asked, *found) for asked, body in answers.items() for found in _times(body)]
    assert {"created_at", "run_at", "started_at", "finished_at", "until", "opened_at",
            "occurred_at", "received_at", "first_event_at"} <= {
        path.rsplit(".", 1)[1] for _, path, _ in times
    }  # fmt: skip
    assert [t for t in times if not UTC_STAMP.fullmatch(t[2])] == []
