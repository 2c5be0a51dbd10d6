"""GET /v1/contacts: an account's contacts, page by page, or those with an email, phone,
external id or tag; and `sinal contacts list`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from sinal.cli import app as cli
from tests.integration.conftest import Api

pytestmark = pytest.mark.anyio


async def _listed(api: Api, headers: Any = None, **params: Any) -> list[dict[str, Any]]:
    """The first page's contacts (a 200 asserted)."""
    response = await api.client.get("/v1/contacts", params=params, headers=headers)
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def _ids(api: Api, **params: Any) -> list[str]:
    return [c["id"] for c in await _listed(api, **params)]


async def _made(api: Api, **body: Any) -> dict[str, Any]:
    """A contact made through POST /v1/contacts, with `tags` added."""
    tags = body.pop("tags", [])
    made = await api.post("/v1/contacts", body)
    assert made.status_code == 201, made.text
    contact: dict[str, Any] = made.json()
    if tags:
        tagged = await api.post(f"/v1/contacts/{contact['id']}/tags", {"tags": tags})
        contact = tagged.json()
    return contact


async def test_the_list_is_every_contact_oldest_first_as_each_is_read_alone(api: Api) -> None:
    ana = await _made(api, email="ana@example.com", name="Ana", tags=["vip", "novo"])
    bia = await _made(api, phone="11 98765-4321", external_id="cli-2")

    listed = await api.client.get("/v1/contacts")

    assert listed.status_code == 200, listed.text
    alone = [(await api.client.get(f"/v1/contacts/{c['id']}")).json() for c in (ana, bia)]
    assert listed.json() == {"data": alone, "next_cursor": None}
    assert alone[0]["tags"] == ["novo", "vip"]


async def test_paging_reaches_every_contact_once_with_those_made_between_pages(
    api: Api,
) -> None:
    made = [(await _made(api, external_id=f"c{i}"))["id"] for i in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 3} if cursor is None else {"limit": 3, "cursor": cursor}
        page = (await api.client.get("/v1/contacts", params=params)).json()
        seen.extend(c["id"] for c in page["data"])
        pages += 1
        if pages == 1:  # made between the first page and the second: listed at the end
            made.extend([(await _made(api, external_id=f"late{i}"))["id"] for i in range(2)])
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert seen == made
    assert pages == 3


async def test_paging_a_tag_reaches_each_tagged_contact_once(api: Api) -> None:
    tagged = [(await _made(api, external_id=f"c{i}", tags=["vip"]))["id"] for i in range(5)]
    await _made(api, external_id="other", tags=["novo"])
    first = (await api.client.get("/v1/contacts", params={"tag": "vip", "limit": 2})).json()
    tagged.append((await _made(api, external_id="late", tags=["vip"]))["id"])
    seen = [c["id"] for c in first["data"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = await api.client.get("/v1/contacts", params={"tag": "vip", "limit": 2,
                                                            "cursor": cursor})  # fmt: skip
        seen.extend(c["id"] for c in page.json()["data"])
        cursor = page.json()["next_cursor"]

    assert seen == tagged


async def test_each_filter_finds_the_contacts_it_names_written_as_people_type_them(
    api: Api,
) -> None:
    ana = (await _made(api, email="ana@loja.com", phone="+5511987654321", tags=["vip"]))["id"]
    bia = (await _made(api, email="bia@loja.com", external_id="shop-42", tags=["VIP", "vip"]))["id"]
    await _made(api, email="caio@loja.com", tags=["novo"])

    found = {
        "email": await _ids(api, email="  Ana@Loja.COM "),
        "phone": await _ids(api, phone="(11) 98765-4321"),
        "phone without the ninth digit": await _ids(api, phone="11 8765-4321"),
        "external_id": await _ids(api, external_id=" shop-42 "),
        "tag": await _ids(api, tag=" vip "),
        "tag in another case": await _ids(api, tag="VIP"),
        "tag and email": await _ids(api, tag="vip", email="bia@loja.com"),
        "tag and another's email": await _ids(api, tag="novo", email="bia@loja.com"),
        "email and phone of one": await _ids(api, email="ana@loja.com", phone="11987654321"),
        "email and phone of two": await _ids(api, email="bia@loja.com", phone="11987654321"),
        "an email no one has": await _ids(api, email="dan@loja.com"),
        "a tag no one has": await _ids(api, tag="antigo"),
    }

    assert found == {
        "email": [ana], "phone": [ana], "phone without the ninth digit": [ana],
        "external_id": [bia], "tag": [ana, bia], "tag in another case": [bia],
        "tag and email": [bia], "tag and another's email": [], "email and phone of one": [ana],
        "email and phone of two": [], "an email no one has": [], "a tag no one has": [],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"email": "ana@"}, [("email", "invalid_email")]),
        ({"phone": "123"}, [("phone", "invalid_phone")]),
        ({"external_id": "  "}, [("external_id", "invalid_external_id")]),
        ({"external_id": "a\u200bb"}, [("external_id", "invalid_external_id")]),
        ({"tag": ""}, [("tag", "empty")]),
        ({"tag": "x" * 65}, [("tag", "too_long")]),
        ({"tag": "a\x00b"}, [("tag", "control_characters")]),
        ({"email": "a\x00@loja.com"}, [("email", "invalid_email")]),
        (
            {"email": "x", "phone": "x", "external_id": "", "tag": " "},
            [
                ("phone", "invalid_phone"),
                ("email", "invalid_email"),
                ("external_id", "invalid_external_id"),
                ("tag", "empty"),
            ],
        ),
    ],
)
async def test_a_value_no_contact_can_have_is_422_naming_its_parameter(
    api: Api, params: dict[str, str], expected: list[tuple[str, str]]
) -> None:
    await _made(api, email="ana@loja.com", tags=["vip"])

    response = await api.client.get("/v1/contacts", params=params)

    assert response.status_code == 422, response.text
    assert response.json()["type"] == "/problems/invalid-query"
    assert [(e["field"], e["code"]) for e in response.json()["errors"]] == expected


async def test_a_cursor_serves_the_same_query_however_its_filters_are_written(api: Api) -> None:
    for i in range(3):
        await _made(api, external_id=f"c{i}", tags=["vip"])
    first = await api.client.get("/v1/contacts", params={"tag": "vip", "limit": 1})
    cursor = first.json()["next_cursor"]

    same = await api.client.get("/v1/contacts", params={"tag": " vip ", "cursor": cursor})
    other = await api.client.get("/v1/contacts", params={"tag": "novo", "cursor": cursor})
    unfiltered = await api.client.get("/v1/contacts", params={"cursor": cursor})
    events = await api.client.get("/v1/events", params={"cursor": cursor})

    assert same.status_code == 200, same.text
    assert len(same.json()["data"]) == 2
    for refused in (other, unfiltered):
        assert refused.status_code == 422
        [error] = refused.json()["errors"]
        assert (error["field"], error["code"]) == ("cursor", "invalid_cursor")
        assert error["message"].startswith("a next_cursor of this list for another account, "
                                           "phone, email, external_id or tag")  # fmt: skip
    assert events.json()["errors"][0]["message"] == (
        "a next_cursor of the contacts list, not of this list (events)"
    )


async def test_another_accounts_contacts_and_cursors_are_never_ours(api: Api) -> None:
    mine = (await _made(api, email="ana@loja.com", tags=["vip"]))["id"]
    other = api.ledger.create_account("Outra Loja")
    for i in range(2):
        theirs = api.ledger.create_contact(other.id, email=f"t{i}@loja.com", external_id=f"x{i}")
        api.ledger.add_tags(other.id, theirs.id, ["vip"])
    their_key = api.auth(await api.key_for("read", account=other))
    their_page = await api.client.get("/v1/contacts", params={"limit": 1}, headers=their_key)

    assert await _ids(api) == [mine]
    assert await _ids(api, tag="vip") == [mine]
    assert await _ids(api, email="t0@loja.com") == []
    assert await _ids(api, external_id="x1") == []
    theirs_read = await api.client.get(
        "/v1/contacts", params={"cursor": their_page.json()["next_cursor"]}
    )
    assert theirs_read.status_code == 422
    assert theirs_read.json()["errors"][0]["code"] == "invalid_cursor"


async def test_an_erased_contact_is_not_listed(api: Api) -> None:
    ana = (await _made(api, email="ana@loja.com", external_id="a", tags=["vip"]))["id"]
    bia = (await _made(api, email="bia@loja.com", tags=["vip"]))["id"]

    assert (await api.client.delete(f"/v1/contacts/{ana}")).status_code == 204

    assert await _ids(api) == [bia]
    assert await _ids(api, tag="vip") == [bia]
    assert await _ids(api, email="ana@loja.com") == []
    assert await _ids(api, external_id="a") == []


async def test_listing_contacts_needs_the_read_scope(api: Api) -> None:
    await _made(api, email="ana@loja.com")
    ingest = api.auth(await api.key_for("ingest"))
    read = api.auth(await api.key_for("read"))

    refused = await api.client.get("/v1/contacts", headers=ingest)

    assert (refused.status_code, refused.json()["type"]) == (403, "/problems/forbidden")
    assert len(await _listed(api, headers=read)) == 1


async def test_an_unknown_parameter_is_422_naming_the_ones_the_list_takes(api: Api) -> None:
    response = await api.client.get("/v1/contacts", params={"mail": "ana@loja.com"})

    assert response.status_code == 422
    assert response.json()["errors"] == [{
        "field": "mail", "code": "unknown_parameter",
        "message": "unknown query parameter; this route takes phone, email, external_id, tag, "
                   "limit, cursor",
    }]  # fmt: skip


async def test_cli_lists_contacts_as_the_api_does(api: Api) -> None:
    ana = await _made(api, email="ana@loja.com", name="Ana", external_id="c1", tags=["vip"])
    await _made(api, phone="11 98765-4321")
    args = ["contacts", "list", "--account", str(api.account.id), "--database-url", api.url]

    listed = CliRunner().invoke(cli, [*args, "--json"])
    tagged = CliRunner().invoke(cli, [*args, "--tag", " vip", "--external-id", "c1", "--json"])
    text = CliRunner().invoke(cli, [*args, "--email", "ANA@loja.com"])
    bad = CliRunner().invoke(cli, [*args, "--phone", "123"])

    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.output)["contacts"] == await _listed(api)
    assert json.loads(tagged.output)["contacts"] == [ana]
    assert text.output == f"{ana['id']}  Ana  -  ana@loja.com  c1  [vip]\n"
    assert bad.exit_code == 2
    assert "phone: phone number is not valid" in bad.stderr


async def test_cli_lists_every_contact_past_its_page(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sinal.cli.CONTACTS_PAGE", 2)
    made = [(await _made(api, external_id=f"c{i}", tags=["vip"]))["id"] for i in range(5)]
    args = ["contacts", "list", "--account", str(api.account.id), "--database-url", api.url]

    listed = CliRunner().invoke(cli, [*args, "--json"])
    tagged = CliRunner().invoke(cli, [*args, "--tag", "vip", "--json"])

    assert [c["id"] for c in json.loads(listed.output)["contacts"]] == made
    assert [c["id"] for c in json.loads(tagged.output)["contacts"]] == made
