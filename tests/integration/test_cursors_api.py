"""Each list's `next_cursor` pages that list, for the query it answered, and no other: a
cursor of another list, of this list under other filters or of another account, and
anything that is not a cursor of ours are 422 `invalid_cursor` on `cursor`, never a
page from a wrong place nor a 500."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Any

import pytest

from tests.integration.conftest import Api
from tests.integration.test_automations_api import AI, TAGGING, _answered
from tests.integration.whatsapp import connect_whatsapp, deliver, meta_bytes, text_message

pytestmark = pytest.mark.anyio


async def _lists(api: Api) -> dict[str, str]:
    """Two rows or more in every list of the account; each list's path, by the name of the
    list its cursors carry (a contact's timeline is the events list's)."""
    ana = api.ledger.create_contact(api.account.id, email="ana@example.com")
    api.ledger.create_contact(api.account.id, email="caio@example.com")
    first = (await api.post("/v1/automations", TAGGING)).json()["id"]
    await api.post("/v1/automations", {**TAGGING, "name": "Outra"})
    await api.post("/v1/integrations", {**AI, "name": "ai"})
    _answered(api, ana.id, range(2))  # events, and an execution of each automation each
    for _ in range(2):
        unknown = {"metric": "Order Paid", "contact_id": str(uuid.uuid4())}
        assert (await api.post("/v1/events", unknown)).status_code == 422  # kept: a rejection
    whatsapp = connect_whatsapp(api)
    for n in range(2):
        message = meta_bytes(text_message(f"wamid.C{n}", f"55119876500{n:02d}", "oi"))
        assert (await deliver(api, whatsapp, message)).status_code == 200  # a conversation
    return {
        "events": "/v1/events",
        "timeline": f"/v1/contacts/{ana.id}/timeline",
        "integrations": "/v1/integrations",
        "automations": "/v1/automations",
        "executions": f"/v1/automations/{first}/executions",
        "rejections": "/v1/rejections",
        "conversations": "/v1/conversations",
        "contacts": "/v1/contacts",
        "metrics": "/v1/metrics",
    }


async def _next(api: Api, path: str, headers: Any = None, **params: Any) -> str:
    """The `next_cursor` of `path`'s first page of one row."""
    response = await api.client.get(path, params={"limit": 1, **params}, headers=headers)
    assert response.status_code == 200, response.text
    cursor = response.json()["next_cursor"]
    assert isinstance(cursor, str), response.text
    return cursor


async def _answer(api: Api, path: str, cursor: str, **params: Any) -> tuple[int, Any]:
    response = await api.client.get(path, params={"cursor": cursor, **params})
    return response.status_code, response.json()["errors"] if response.status_code == 422 else None


def _refused(message: str) -> tuple[int, Any]:
    return 422, [{"field": "cursor", "code": "invalid_cursor", "message": message}]


async def test_a_cursor_of_another_list_is_422_naming_the_list_it_pages(api: Api) -> None:
    """Every list's ids are time-ordered, so another list's cursor (a bare id, before) read
    as a place in this one: `/v1/automations`' on `/v1/integrations` paged from the time
    of that automation's id, without a word."""
    paths = await _lists(api)
    cursors = {name: await _next(api, path) for name, path in paths.items() if name != "timeline"}
    cursors["change feed"] = await _next(api, "/v1/events", after="start")

    answers, expected = {}, {}
    for source, cursor in cursors.items():
        for target, path in paths.items():
            listed = "events" if target == "timeline" else target
            if listed != source:
                answers[source, target] = await _answer(api, path, cursor)
                whose = source if source == "change feed" else f"{source} list"
                expected[source, target] = _refused(
                    f"a next_cursor of the {whose}, not of this list ({listed})"
                )
    assert answers == expected


async def test_a_cursor_of_the_same_list_for_another_query_is_422(api: Api) -> None:
    """A cursor holds the account, the path's id and the filters it was issued for (not
    `limit`): one used with others paged from its place in another list of rows."""
    paths = await _lists(api)
    bia = api.ledger.create_contact(api.account.id, email="bia@example.com").id
    ana = paths["timeline"].split("/")[-2]
    other_automation = (await api.client.get("/v1/automations")).json()["data"][1]["id"]
    other = api.ledger.create_account("Outra Loja")
    theirs = api.auth(await api.key_for("admin", account=other))
    for name in ("a", "b"):
        await api.client.post("/v1/automations", json={**TAGGING, "name": name}, headers=theirs)
    quiz = {"metric": "Quiz Answered"}
    open_ones = {"status": "open"}
    since = {"since": "2020-01-01T00:00:00Z"}

    issued_and_used: dict[str, tuple[str, dict[str, Any], str, dict[str, Any]]] = {
        "a filter dropped": ("/v1/events", quiz, "/v1/events", {}),
        "a filter added": ("/v1/conversations", {}, "/v1/conversations", open_ones),
        "another contact": (paths["timeline"], {}, f"/v1/contacts/{bia}/timeline", {}),
        "another automation": (
            paths["executions"], {}, f"/v1/automations/{other_automation}/executions", {}
        ),
        "unfiltered, for a contact": ("/v1/events", {}, paths["timeline"], {}),
        "the same filter": ("/v1/events", quiz, "/v1/events", quiz),
        "the same instant": ("/v1/events", since, "/v1/events",
                             {"since": "2019-12-31T21:00:00-03:00"}),
        "a timeline, as its filter": (paths["timeline"], {}, "/v1/events", {"contact_id": ana}),
        "another limit": ("/v1/automations", {}, "/v1/automations", {"limit": 5}),
    }  # fmt: skip
    answers = {}
    for case, (issued, issued_with, used, used_with) in issued_and_used.items():
        cursor = await _next(api, issued, **issued_with)
        answers[case] = (await _answer(api, used, cursor, **used_with))[0]
    their_cursor = await _next(api, "/v1/automations", headers=theirs)
    answers["another account"], errors = await _answer(api, "/v1/automations", their_cursor)

    assert answers == {
        "a filter dropped": 422, "a filter added": 422, "another contact": 422,
        "another automation": 422, "unfiltered, for a contact": 422, "the same filter": 200,
        "the same instant": 200, "a timeline, as its filter": 200, "another limit": 200,
        "another account": 422,
    }  # fmt: skip
    assert (
        errors
        == _refused(
            "a next_cursor of this list for another account: repeat the query it came from, or "
            "leave cursor out to list from the first page"
        )[1]
    )


def _text(cursor: str) -> str:
    return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()


def _cursor(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _malformed(cursor: str) -> dict[str, str]:
    """`cursor` broken in every way we can think of, by name."""
    name, digest, *position = _text(cursor).split("|")
    ident = position[-1]
    broken = {
        "garbage": "garbage",
        "empty": "",
        "not base64": "!!!!",
        "one base64 character": "a",
        "not UTF-8": _cursor(b"\xff\xfe|\x80"),
        "a NUL": _cursor("\x00"),
        "another id": _cursor("|".join([name, digest, *position[:-1], "not-an-id"])),
        "a part more": _cursor("|".join([name, digest, *position, ident])),
        "a part less": _cursor("|".join([name, digest, *position[:-1]])),
        "another digest": _cursor("|".join([name, "AAAAAAAA", *position])),
        "an unknown list": _cursor("|".join(["widgets", digest, *position])),
    }
    if name == "events":
        for case, when in [("not a time", "soon"), ("a naive time", "2026-11-01T00:00:00"),
                           ("year 0 in UTC", "0001-01-01T00:00:00+01:00"),
                           ("year 10000 in UTC", "9999-12-31T23:59:59-01:00")]:  # fmt: skip
            broken[case] = _cursor("|".join([name, digest, when, ident]))
    if name == "metrics":  # the position is a name in base64: ours, and no other spelling
        for case, text in [("a name not in base64", "Order Paid"),
                           ("a name padded", _cursor("Order Paid") + "=="),
                           ("a name not UTF-8", _cursor(b"\xff")),
                           ("a name with a NUL", _cursor("Order\x00Paid"))]:  # fmt: skip
            broken[case] = _cursor("|".join([name, digest, text]))
    return broken


async def test_every_lists_malformed_cursor_is_422_naming_cursor_never_a_500(api: Api) -> None:
    paths = await _lists(api)
    answers, expected = {}, {}
    for name, path in paths.items():
        for case, cursor in _malformed(await _next(api, path)).items():
            status, errors = await _answer(api, path, cursor)
            answers[name, case] = status, [(e["field"], e["code"]) for e in errors or []]
            expected[name, case] = 422, [("cursor", "invalid_cursor")]
    assert answers == expected


async def test_cursors_of_before_this_release(api: Api) -> None:
    """An events list's ("<occurred_at>|<id>", which no other list had) is still taken,
    for /v1/events and a timeline alike, and so is the change feed's ("feed|<arrival>|<id>",
    which named no account); an id list's, a bare id that could be any list's, is 422
    saying to list again from the first page."""
    paths = await _lists(api)
    first = (await api.client.get("/v1/events", params={"after": "start", "limit": 1})).json()
    name, _, *position = _text(first["next_cursor"]).split("|")
    old = await api.client.get("/v1/events", params={"after": _cursor("|".join([name, *position]))})
    new = await api.client.get("/v1/events", params={"after": first["next_cursor"]})
    assert old.status_code == 200, old.text
    assert old.json() == new.json()  # its next_cursor names the account
    for name in ("events", "timeline"):
        first = (await api.client.get(paths[name], params={"limit": 1})).json()
        [last] = first["data"]
        when = datetime.fromisoformat(last["occurred_at"]).isoformat()
        old = await api.client.get(paths[name], params={"cursor": _cursor(f"{when}|{last['id']}")})
        new = await api.client.get(paths[name], params={"cursor": first["next_cursor"]})
        assert old.status_code == 200, old.text
        assert old.json()["data"] == new.json()["data"]
    for name in ("integrations", "automations", "executions", "rejections", "conversations"):
        [row] = (await api.client.get(paths[name], params={"limit": 1})).json()["data"]
        assert await _answer(api, paths[name], _cursor(row["id"])) == _refused(
            "a cursor of an earlier release, which names no list: leave cursor out to list "
            "from the first page"
        )


async def test_a_bare_id_given_to_a_list_that_never_had_one_says_it_is_another_lists(
    api: Api,
) -> None:
    """The contacts list, new, and the events lists never handed out a bare id: one is an
    earlier release's cursor of another list, not one of theirs (it said "a cursor of an
    earlier release" to the contacts list, as if the contacts list had had one)."""
    paths = await _lists(api)
    [automation] = (await api.client.get(paths["automations"], params={"limit": 1})).json()["data"]
    answers = {
        name: await _answer(api, paths[name], _cursor(automation["id"]))
        for name in ("contacts", "events", "timeline", "metrics")
    }
    assert answers == {
        name: _refused(
            f"a cursor of another list, of an earlier release (the {listed} list's were never "
            "a bare id): leave cursor out to list from the first page"
        )
        for name, listed in (("contacts", "contacts"), ("events", "events"),
                             ("timeline", "events"), ("metrics", "metrics"))
    }  # fmt: skip


async def test_the_change_feed_cursor_of_another_account_is_422_on_after(api: Api) -> None:
    """A feed position named no account: another's, read as a place in this account's
    feed, skipped (or read again) this account's events without a word."""
    await _lists(api)
    other = api.ledger.create_account("Outra Loja")
    theirs = api.auth(await api.key_for("read", account=other))
    read = await api.client.get("/v1/events", params={"after": "start"}, headers=theirs)
    assert read.status_code == 200, read.text

    response = await api.client.get("/v1/events", params={"after": read.json()["next_cursor"]})

    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [{
        "field": "after", "code": "invalid_cursor",
        "message": "a next_cursor of the change feed of another account: pass one this "
                   "account's feed handed out, or 'start'",
    }]  # fmt: skip
    ours = await api.client.get("/v1/events", params={"after": "start", "limit": 1})
    again = await api.client.get("/v1/events", params={"after": ours.json()["next_cursor"]})
    assert again.status_code == 200, again.text


async def test_a_malformed_change_feed_cursor_of_this_account_is_422_on_after(api: Api) -> None:
    await _lists(api)
    cursor = (await api.client.get("/v1/events", params={"after": "start"})).json()["next_cursor"]
    name, digest, arrival, ident = _text(cursor).split("|")
    broken = {
        "a negative arrival": [name, digest, "-1", ident],
        "not a digit": [name, digest, "\u0663", ident],
        "past SQLite's integers": [name, digest, str(2**63), ident],
        "another id": [name, digest, arrival, "not-a-uuid"],
        "a part more": [name, digest, arrival, ident, ident],
    }
    answers = {}
    for case, parts in broken.items():
        response = await api.client.get("/v1/events", params={"after": _cursor("|".join(parts))})
        answers[case] = (
            response.status_code,
            [(e["field"], e["code"]) for e in response.json()["errors"]],
        )
    assert answers == dict.fromkeys(broken, (422, [("after", "invalid_cursor")]))


async def test_the_lists_cursor_given_to_the_change_feed_says_where_it_goes(api: Api) -> None:
    await _lists(api)
    cursor = await _next(api, "/v1/events")
    response = await api.client.get("/v1/events", params={"after": cursor})
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [{
        "field": "after", "code": "invalid_cursor",
        "message": "a next_cursor of the events list: pass it as cursor, without after",
    }]  # fmt: skip
