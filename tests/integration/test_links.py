"""Tracked links through HTTP, on both backends: made, followed (by people and by preview
fetchers), counted, refused, and behind the tenant wall."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from sinal import links
from sinal.ledger import Ledger
from tests.contract.test_schema import _primary_key, _unique_keys
from tests.helpers import count, sql
from tests.integration.conftest import Api, running_api
from tests.integration.whatsapp import events

pytestmark = pytest.mark.anyio

TARGET = "https://lojadaana.com.br/p/camiseta-azul?utm_source=whatsapp&cor=azul#tamanhos"
PERSON = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 Mobile"
PREVIEWS = [
    "WhatsApp/2.24.8.78 A",
    "WhatsApp/2.23.20.0 i",
    "facebookexternalhit/1.1 (+http://www.facebook.com/externalhit_uatext.php)",
    "Facebot",
    "Mozilla/5.0 (compatible; facebookexternalhit/1.1)",
]


async def _contact(api: Api, phone: str = "+55 11 98765-4321") -> str:
    answer = await api.post("/v1/contacts", {"phone": phone, "name": "Ana Souza"})
    ident: str = answer.json()["id"]
    return ident


async def _link(api: Api, **fields: Any) -> dict[str, Any]:
    answer = await api.post("/v1/links", {"url": TARGET, **fields})
    assert answer.status_code == 201, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def _follow(
    api: Api, token: str, agent: str = PERSON, headers: dict[str, str] | None = None, **kw: Any
) -> Any:
    headers = {"User-Agent": agent, **(headers or {})}
    return await api.client.get(f"/l/{token}", headers=headers, **kw)


async def test_link_is_made_with_an_unguessable_token_and_a_short_url(api: Api) -> None:
    contact = await _contact(api)
    made = await _link(api, contact_id=contact, campaign="black-friday")
    assert len(made["token"]) == 16
    assert made["short_url"] == f"http://sinal.test/l/{made['token']}"
    assert (made["url"], made["contact_id"], made["campaign"]) == (TARGET, contact, "black-friday")
    assert made["automation_execution_id"] is None
    other = await _link(api, contact_id=contact)
    assert other["token"] != made["token"]
    assert events(api, "Link Clicked") == []


@pytest.fixture
async def public_api(database_url: str, ledger_at: Ledger) -> AsyncIterator[Api]:
    async for running in running_api(database_url, ledger_at, public_url="https://sin.al/"):
        yield running


async def test_link_short_url_uses_the_public_url_setting(public_api: Api) -> None:
    made = await _link(public_api)
    assert made["short_url"] == f"https://sin.al/l/{made['token']}"


async def test_link_click_by_a_person_redirects_and_records_link_clicked(api: Api) -> None:
    contact = await _contact(api)
    made = await _link(api, contact_id=contact, campaign="black-friday")
    answer = await _follow(api, made["token"])
    assert answer.status_code == 302
    assert answer.headers["location"] == TARGET
    assert answer.headers["cache-control"] == "no-store"

    [click] = events(api, "Link Clicked")
    assert (str(click.contact_id), click.source) == (contact, "tracking")
    assert (click.entity_type, click.entity_id) == ("link", made["id"])
    assert click.properties == {
        "url": TARGET, "link_id": made["id"], "campaign": "black-friday", "user_agent": PERSON,
    }  # fmt: skip
    assert click.automation_execution_id is None  # a person's act: it may trigger automations


@pytest.mark.parametrize("agent", PREVIEWS)
async def test_link_preview_fetchers_are_redirected_but_not_counted(api: Api, agent: str) -> None:
    made = await _link(api, contact_id=await _contact(api))
    answer = await _follow(api, made["token"], agent)
    assert (answer.status_code, answer.headers["location"]) == (302, TARGET)
    assert events(api, "Link Clicked") == []


@pytest.mark.parametrize(
    "purpose",
    [
        {"Sec-Purpose": "prefetch"},
        {"Sec-Purpose": "prefetch;prerender"},
        {"Purpose": "prefetch"},
        {"X-Purpose": "preview"},
        {"X-Moz": "prefetch"},
    ],
)
async def test_link_browser_prefetches_are_redirected_but_not_counted(
    api: Api, purpose: dict[str, str]
) -> None:
    # A browser (or a mail app) fetching the link ahead: the person may never open it, and a
    # Link Clicked would start their click automations.
    made = await _link(api, contact_id=await _contact(api))
    answer = await _follow(api, made["token"], headers=purpose)
    assert (answer.status_code, answer.headers["location"]) == (302, TARGET)
    assert events(api, "Link Clicked") == []


@pytest.mark.parametrize("agent", [None, "", "  "])
async def test_link_requests_without_a_user_agent_are_redirected_but_not_counted(
    api: Api, agent: str | None
) -> None:
    # Every browser names itself (WhatsApp's in-app one too); a fetch without a name is a
    # script's or a scanner's, and a Link Clicked would start the contact's click automations.
    made = await _link(api, contact_id=await _contact(api))
    request = api.client.build_request("GET", f"/l/{made['token']}")
    if agent is None:
        del request.headers["user-agent"]
    else:
        request.headers["user-agent"] = agent
    answer = await api.client.send(request)
    assert (answer.status_code, answer.headers["location"]) == (302, TARGET)
    assert events(api, "Link Clicked") == []


async def test_link_redirects_to_the_stored_url_never_one_from_the_request(api: Api) -> None:
    made = await _link(api, contact_id=await _contact(api))
    answer = await api.client.get(
        f"/l/{made['token']}",
        params={"url": "https://evil.example/", "next": "https://evil.example/"},
        headers={"Host": "evil.example", "Referer": "https://evil.example/"},
    )
    assert answer.headers["location"] == TARGET


async def test_link_to_a_look_alike_host_is_kept_and_redirected_as_its_ascii_form(
    api: Api,
) -> None:
    # "аpple.com" with a Cyrillic "а" (U+0430) prints as Apple's host; it is another one
    contact = await _contact(api)
    made = await _link(api, url="https://\u0430pple.com/conta?p=1", contact_id=contact)
    assert made["url"] == "https://xn--pple-43d.com/conta?p=1"
    answer = await _follow(api, made["token"])
    assert (answer.status_code, answer.headers["location"]) == (302, made["url"])
    [click] = events(api, "Link Clicked")
    assert click.properties["url"] == made["url"]

    # a link kept before with the host as typed is redirected the same way, as requested
    kept = "https://\u0430pple.com:8443/conta"
    sql(api.url, "UPDATE links SET url = ? WHERE token = ?", kept, made["token"])
    again = await _follow(api, made["token"], "curl/8.5.0")
    assert (again.status_code, again.headers["location"]) == (
        302,
        "https://xn--pple-43d.com:8443/conta",
    )


@pytest.mark.parametrize(
    "token",
    ["AAAAAAAAAAAAAAAA", "short", "x" * 17, "%2e%2e%2fadmin", "abc def ghi jklm",
     "ÁAAAAAAAAAAAAAAA"],
)  # fmt: skip
async def test_link_unknown_or_malformed_token_is_404(api: Api, token: str) -> None:
    await _link(api)
    answer = await api.client.get(f"/l/{token}")
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/problem+json"


async def test_link_without_a_contact_redirects_and_records_nothing(api: Api) -> None:
    made = await _link(api, campaign="instagram-bio")
    answer = await _follow(api, made["token"])
    assert (answer.status_code, answer.headers["location"]) == (302, TARGET)
    assert events(api) == []
    assert count(api.url, "rejections") == 0


async def test_link_head_is_answered_and_not_counted(api: Api) -> None:
    made = await _link(api, contact_id=await _contact(api))
    answer = await api.client.head(f"/l/{made['token']}", headers={"User-Agent": PERSON})
    assert (answer.status_code, answer.headers["location"]) == (302, TARGET)
    assert events(api, "Link Clicked") == []


def _at(moment: datetime) -> datetime:
    return moment


async def test_link_clicks_are_counted_each_but_a_double_fire_once(api: Api) -> None:
    made = await _link(api, contact_id=await _contact(api))
    start = datetime(2026, 3, 2, 14, 0, 0, 100_000, tzinfo=UTC)
    moments = [start, start + timedelta(milliseconds=300), start + timedelta(seconds=2)]
    for moment in moments:
        at = Ledger(api.ledger.store, clock=functools.partial(_at, moment))
        assert links.follow_link(at, made["token"], user_agent=PERSON) is not None
    clicks = events(api, "Link Clicked")
    assert [c.occurred_at for c in clicks] == [moments[0], moments[2]]
    # Two clicks through HTTP, seconds apart in the ledger's eyes, are two events.
    assert (await _follow(api, made["token"])).status_code == 302
    assert len(events(api, "Link Clicked")) == 3


@pytest.mark.parametrize(
    ("body", "field", "code"),
    [
        ({"url": "/p/camiseta"}, "url", "invalid_url"),
        ({"url": "javascript:alert(1)"}, "url", "invalid_url"),
        ({"url": "ftp://lojadaana.com.br/x"}, "url", "invalid_url"),
        ({"url": "https://"}, "url", "invalid_url"),
        ({"url": "https://loja.com.br/a b"}, "url", "invalid_url"),
        ({"url": "https://user:senha@loja.com.br/"}, "url", "invalid_url"),
        ({"url": "https://loja.com.br:99999/p"}, "url", "invalid_url"),
        ({"url": "https://loja.com.br:abc/"}, "url", "invalid_url"),
        ({"url": "https://a..b/"}, "url", "invalid_url"),
        ({"url": "https://999.1.1.1/p"}, "url", "invalid_url"),
        ({"url": "https://loja.com.br/p\u009b"}, "url", "invalid_url"),  # a C1 control
        # shown as ".../exe.jpg": it was kept, and shown so in every answer
        ({"url": "https://loja.com.br/\u202egpj.exe"}, "url", "invalid_url"),
        ({"url": "https://loja.com.br/p\u2066"}, "url", "invalid_url"),
        ({"url": "https://loja.com.br/" + "a" * 2100}, "url", "string_too_long"),
        ({"url": TARGET, "contact_id": str(uuid4())}, "contact_id", "not_found"),
        ({"url": TARGET, "contact_id": "ana"}, "contact_id", "not_found"),
        ({"url": TARGET, "automation_execution_id": str(uuid4())}, "automation_execution_id",
         "not_found"),
        ({"url": TARGET, "campaign": "c\x01"}, "campaign", "control_characters"),
        ({"url": TARGET, "utm": "x"}, "utm", "extra_forbidden"),
        ({}, "url", "missing"),
    ],
)  # fmt: skip
async def test_link_with_bad_fields_is_refused(
    api: Api, body: dict[str, Any], field: str, code: str
) -> None:
    answer = await api.post("/v1/links", body)
    assert answer.status_code == 422, answer.text
    assert [(e["field"], e["code"]) for e in answer.json()["errors"]] == [(field, code)]
    assert count(api.url, "links") == 0


async def test_link_needs_the_ingest_scope(api: Api) -> None:
    reader = api.auth(await api.key_for("read"))
    answer = await api.client.post("/v1/links", json={"url": TARGET}, headers=reader)
    assert answer.status_code == 403
    anonymous = await api.client.post("/v1/links", json={"url": TARGET},
                                      headers={"Authorization": ""})  # fmt: skip
    assert anonymous.status_code == 401


async def test_link_for_another_accounts_contact_is_refused_and_clicks_stay_home(
    api: Api,
) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = api.ledger.create_contact(other.id, phone="+5521976543210")
    refused = await api.post("/v1/links", {"url": TARGET, "contact_id": str(theirs.id)})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["code"] == "not_found"

    key = api.auth(await api.key_for("ingest", account=other))
    made = await api.client.post("/v1/links", json={"url": TARGET, "contact_id": str(theirs.id)},
                                 headers=key)  # fmt: skip
    assert made.status_code == 201, made.text
    await _follow(api, made.json()["token"])
    [click] = events(api, "Link Clicked", account_id=other.id)
    assert click.contact_id == theirs.id
    assert events(api, "Link Clicked") == []


async def test_link_made_by_an_automation_execution_carries_it(api: Api) -> None:
    contact = await _contact(api)
    store: Any = api.ledger.store
    execution = _an_execution(api, store, contact)
    made = await _link(api, contact_id=contact, automation_execution_id=str(execution))
    assert made["automation_execution_id"] == str(execution)
    await _follow(api, made["token"])
    [click] = events(api, "Link Clicked")
    assert click.properties["automation_execution_id"] == str(execution)
    assert click.automation_execution_id is None


def _an_execution(api: Api, store: Any, contact: str) -> Any:
    """An execution of an automation of the account, as the dispatcher creates them."""
    from sinal.automations.service import Automations

    automation = Automations(api.ledger).create(api.account.id, {
        "name": "Link", "trigger_metric": "Order Paid",
        "steps": [{"type": "send_message", "text": "Veja: {{ event.properties.link }}"}],
    })  # fmt: skip
    result = api.ledger.emit_event(account_id=api.account.id, contact_id=contact,
                                   metric_name="Order Paid", source="api")  # fmt: skip
    fanned = store.fan_out(lambda _event, rows: [r.id for r in rows], 10)
    assert fanned.executions == 1
    [execution] = store.list_executions(api.account.id, event_id=result.event_id)
    assert execution.automation_id == automation.id
    return execution.id


def test_messaging_tables_keys_start_with_account_id(database_url: str) -> None:
    for table in ("links", "message_statuses", "whatsapp_users"):
        assert _primary_key(database_url, table)[0] == "account_id"
        assert all(key[0] == "account_id" for key in _unique_keys(database_url, table))
