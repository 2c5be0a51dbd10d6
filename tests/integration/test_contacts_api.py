"""Contacts through HTTP: create or match, change, tag, timeline, summaries."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from typer.testing import CliRunner

from sinal.cli import app as cli
from tests.helpers import sql
from tests.integration.conftest import Api

pytestmark = pytest.mark.anyio


def events_of(api: Api, metric: str) -> list[tuple[str, Any]]:
    return [
        (r[0], r[1])
        for r in sql(
            api.url,
            "SELECT source, properties FROM events WHERE metric_name = ? ORDER BY id",
            metric,
        )
    ]


async def test_contact_is_created_once_then_matched_by_any_identifier(api: Api) -> None:
    created = await api.post(
        "/v1/contacts", {"phone": "11 98765-4321", "email": "ana@example.com", "name": " Ana "}
    )
    matched = await api.post("/v1/contacts", {"email": "ANA@example.com", "name": "Other"})

    assert created.status_code == 201, created.text
    assert matched.status_code == 200
    assert matched.json() == created.json()
    assert created.json()["name"] == "Ana"
    assert [source for source, _ in events_of(api, "Contact Created")] == ["api"]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, {("contact", "identity_required")}),
        ({"phone": "123"}, {("phone", "invalid_phone")}),
        ({"email": "a@b"}, {("email", "invalid_email")}),
        ({"email": 5}, {("email", "string_type")}),
        ({"nickname": "x", "email": "a@example.com"}, {("nickname", "extra_forbidden")}),
    ],
)
async def test_bad_contact_bodies_are_422_per_field(
    api: Api, body: dict[str, object], expected: set[tuple[str, str]]
) -> None:
    response = await api.post("/v1/contacts", body)
    assert response.status_code == 422
    assert {(e["field"], e["code"]) for e in response.json()["errors"]} == expected


async def test_a_phone_pasted_with_bidi_marks_or_dashes_matches_and_other_digits_are_named(
    api: Api,
) -> None:
    made = await api.post("/v1/contacts", {"phone": "+55 11 98765-4321", "name": "Ana"})
    # as WhatsApp's apps copy a number (U+202A ... U+202C), and a word processor's en dash:
    # each was 422 "may contain only digits", to a user who sent only digits
    for pasted in ("\u202a+55 11 98765-4321\u202c", "(11) 98765\u20134321"):
        matched = await api.post("/v1/contacts", {"phone": pasted})
        assert (matched.status_code, matched.json()["id"]) == (200, made.json()["id"])
    listed = await api.client.get("/v1/contacts", params={"phone": "\u2068(11) 98765-4321\u2069"})
    assert [c["id"] for c in listed.json()["data"]] == [made.json()["id"]]

    arabic = await api.post("/v1/contacts", {"phone": "٠١١٩٨٧٦٥٤٣٢١"})
    assert arabic.status_code == 422
    [error] = arabic.json()["errors"]
    assert (error["field"], error["code"]) == ("phone", "invalid_phone")
    assert error["message"] == (
        "phone number may contain only digits 0-9, spaces, '-', '.', '/', '(' and ')'"
    )
    assert sql(api.url, "SELECT count(*) FROM contacts") == [(1,)]


async def test_an_address_typed_full_width_or_an_id_sent_decomposed_names_the_same_contact(
    api: Api,
) -> None:
    made = await api.post(
        "/v1/contacts", {"email": "ana@example.com", "external_id": "Jose\u0301-1"}
    )
    ident = made.json()["id"]
    # an East Asian keyboard's full-width forms, and an NFD id: each made a second contact
    # ("ａｎａ@example.com", "José-1" decomposed) or was 422 ("＠" is no "@")
    for body in ({"email": "ａｎａ@ｅｘａｍｐｌｅ.com"}, {"email": "ana＠example.com"},
                 {"external_id": "José-1"}):  # fmt: skip
        matched = await api.post("/v1/contacts", body)
        assert (matched.status_code, matched.json()["id"]) == (200, ident), body
    for params in ({"email": "ＡＮＡ@example.com"}, {"external_id": "José-1"}):
        listed = await api.client.get("/v1/contacts", params=params)
        assert [c["id"] for c in listed.json()["data"]] == [ident], params

    # "ﬁnance" prints as "finance" and "ana²" is not ana2: refused, neither kept nor mapped
    for email in ("\ufb01nance@example.com", "ana\u00b2@example.com"):
        refused = await api.post("/v1/contacts", {"email": email})
        assert refused.status_code == 422
        [error] = refused.json()["errors"]
        assert (error["field"], error["code"]) == ("email", "invalid_email")
        assert "compatibility character" in error["message"]
    assert sql(api.url, "SELECT email, external_id FROM contacts") == [
        ("ana@example.com", "José-1")
    ]


async def test_a_contact_kept_in_an_older_spelling_is_stored_anew_by_a_patch_of_it(
    api: Api,
) -> None:
    # as rows were stored before full-width forms were read as ASCII and ids put in NFC
    made = (await api.post("/v1/contacts", {"email": "bob@example.com", "external_id": "x"})).json()
    for kind, old in (("email", "ｂｏｂ@example.com"), ("external_id", "Jose\u0301")):
        sql(api.url, f"UPDATE contacts SET {kind} = ?", old)
        sql(api.url, "UPDATE contact_identities SET value = ? WHERE kind = ?", old, kind)
        patched = await api.client.patch(f"/v1/contacts/{made['id']}", json={kind: old})
        assert patched.status_code == 200, patched.text
    listed = await api.client.get("/v1/contacts", params={"email": "bob@example.com",
                                                          "external_id": "José"})  # fmt: skip
    assert [c["id"] for c in listed.json()["data"]] == [made["id"]]


async def test_an_unknown_contact_field_is_named_with_the_fields_a_contact_takes(
    api: Api,
) -> None:
    made = await api.post("/v1/contacts", {"nickname": "Ana", "email": "ana@example.com"})
    contact = await api.post("/v1/contacts", {"email": "ana@example.com"})
    patched = await api.client.patch(f"/v1/contacts/{contact.json()['id']}", json={"nick": "A"})

    assert [(e["field"], e["message"]) for e in made.json()["errors"]] == [
        ("nickname", "unknown field 'nickname'; the body takes phone, email, external_id, name")
    ]
    assert [(e["field"], e["message"]) for e in patched.json()["errors"]] == [
        ("nick", "unknown field 'nick'; the body takes name, phone, email, external_id")
    ]


# A refusal no check foresaw: the database refuses any contact named "Recusado".
_REFUSE_NAME = {
    "sqlite": "CREATE TRIGGER refuse_name BEFORE INSERT ON contacts WHEN NEW.name = 'Recusado' "
              "BEGIN SELECT RAISE(ABORT, 'refused'); END",
    "postgres": "ALTER TABLE contacts ADD CONSTRAINT refuse_name "
                "CHECK (name IS DISTINCT FROM 'Recusado')",
}  # fmt: skip


async def test_data_the_database_refuses_is_422_never_503(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    sql(api.url, _REFUSE_NAME["sqlite" if api.url.startswith("sqlite") else "postgres"])

    response = await api.post("/v1/contacts", {"email": "ana@example.com", "name": "Recusado"})

    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"] == "/problems/unstorable-input"
    assert body["detail"] == "The database refused the request's data"  # not the database's
    assert "Retry-After" not in response.headers
    assert any("refuse" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert sql(api.url, "SELECT count(*) FROM contacts") == [(0,)]


async def test_patch_changes_fields_and_records_contact_updated_once(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    path = f"/v1/contacts/{contact['id']}"

    changed = await api.client.patch(path, json={"name": "Ana Souza", "email": None,
                                                  "phone": "(21) 99876-5432"})  # fmt: skip
    again = await api.client.patch(path, json={"name": "Ana Souza"})
    by_phone = await api.post("/v1/contacts", {"phone": "+5521998765432"})
    by_old_email = await api.post("/v1/contacts", {"email": "ana@example.com"})

    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["name"], body["email"], body["phone"]) == ("Ana Souza", None, "+5521998765432")
    assert again.json()["updated_at"] == body["updated_at"]  # nothing changed
    assert by_phone.json()["id"] == contact["id"]
    assert by_old_email.status_code == 201  # the email no longer names Ana
    [(_, properties)] = events_of(api, "Contact Updated")
    props = json.loads(properties) if isinstance(properties, str) else properties
    assert sorted(props["changed"]) == ["email", "name", "phone"]
    assert props["phone"] == "+5521998765432"


async def test_patch_and_post_with_several_bad_fields_are_one_422_naming_each(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    bad = {"phone": "abc", "email": "not-an-email", "name": "x" * 201}

    patched = await api.client.patch(f"/v1/contacts/{contact['id']}", json=bad)
    posted = await api.post("/v1/contacts", bad)

    for response in (patched, posted):
        assert response.status_code == 422, response.text
        assert response.json()["type"] == "/problems/invalid-contact"
        assert [(e["field"], e["code"]) for e in response.json()["errors"]] == [
            ("phone", "invalid_phone"),
            ("email", "invalid_email"),
            ("name", "too_long"),
        ]
    unchanged = await api.client.get(f"/v1/contacts/{contact['id']}")
    assert unchanged.json() == contact
    assert events_of(api, "Contact Updated") == []


async def test_patch_with_another_contacts_identifier_is_409(api: Api) -> None:
    ana = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    await api.post("/v1/contacts", {"email": "bia@example.com"})

    response = await api.client.patch(f"/v1/contacts/{ana['id']}",
                                      json={"email": "bia@example.com"})  # fmt: skip

    assert response.status_code == 409
    assert response.json()["errors"][0]["field"] == "email"
    assert events_of(api, "Contact Updated") == []


async def test_tags_record_tag_added_and_removed_only_on_change(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    path = f"/v1/contacts/{contact['id']}"

    first = await api.post(f"{path}/tags", {"tags": ["vip", "black-friday"]})
    again = await api.post(f"{path}/tags", {"tags": ["vip"]})
    removed = await api.client.delete(f"{path}/tags/vip")
    absent = await api.client.delete(f"{path}/tags/vip")
    bad = await api.post(f"{path}/tags", {"tags": [""]})

    assert first.json()["tags"] == ["black-friday", "vip"]
    assert again.json()["tags"] == ["black-friday", "vip"]
    assert (removed.status_code, absent.status_code) == (204, 204)
    assert (await api.client.get(path)).json()["tags"] == ["black-friday"]
    assert len(events_of(api, "Tag Added")) == 2
    assert len(events_of(api, "Tag Removed")) == 1
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "tags[0]"


async def test_tags_with_a_slash_are_removed_by_their_path(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    path = f"/v1/contacts/{contact['id']}"
    await api.post(f"{path}/tags", {"tags": ["vip/2026", "a/b/c", "/", "keep"]})

    removed = [
        (await api.client.delete(f"{path}/tags/{quoted}")).status_code
        for quoted in ("vip%2F2026", "vip%2F2026", "a/b%2Fc", "%2F")
    ]

    assert removed == [204, 204, 204, 204]
    assert (await api.client.get(path)).json()["tags"] == ["keep"]
    assert len(events_of(api, "Tag Removed")) == 3
    metrics = (await api.client.get("/metrics")).text
    assert 'route="/v1/contacts/{contact_id}/tags/{tag}",status="204"' in metrics


async def test_timeline_and_metrics_follow_the_locale(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    for n in ("1", "2"):
        body = {"metric": "Order Paid", "contact_id": contact["id"], "value": "10.5",
                "source": "shopify", "source_id": n}  # fmt: skip
        await api.post("/v1/events", body)
    path = f"/v1/contacts/{contact['id']}"

    timeline = await api.client.get(f"{path}/timeline", headers={"Accept-Language": "pt-BR"})
    spanish = await api.client.get(f"{path}/timeline", params={"locale": "es", "limit": 1})
    metrics = await api.client.get(f"{path}/metrics", params={"locale": "pt-BR"})

    assert [e["label"] for e in timeline.json()["data"]] == [
        "Pedido Pago", "Pedido Pago", "Contato Criado",
    ]  # fmt: skip
    assert spanish.json()["data"][0]["label"] == "Pedido Pagado"
    assert spanish.json()["next_cursor"] is not None
    rows = {r["metric"]: r for r in metrics.json()["data"]}
    assert (rows["Order Paid"]["count"], rows["Order Paid"]["total_value"]) == (2, "21.00")
    assert rows["Order Paid"]["label"] == "Pedido Pago"


async def test_metrics_give_no_total_to_a_metric_whose_events_had_no_value(api: Api) -> None:
    """A message is worth nothing, not 0.00: total_value null, as the schema says it may
    be; orders whose values add up to 0 are "0.00"."""
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    bodies = [{"metric": "Message Read", "source_id": "wamid.1"},
              {"metric": "Order Paid", "value": "10.5", "source_id": "1"},
              {"metric": "Order Paid", "value": "-10.50", "source_id": "2"}]  # fmt: skip
    for body in bodies:
        sent = await api.post("/v1/events", {**body, "contact_id": contact["id"]})
        assert sent.status_code == 201, sent.text

    metrics = await api.client.get(f"/v1/contacts/{contact['id']}/metrics")
    schema = (await api.client.get("/openapi.json")).json()["components"]["schemas"]

    totals = {r["metric"]: (r["count"], r["total_value"]) for r in metrics.json()["data"]}
    assert totals == {
        "Contact Created": (1, None),
        "Message Read": (1, None),
        "Order Paid": (2, "0.00"),
    }
    total = schema["ContactMetricOut"]["properties"]["total_value"]
    assert {"type": "null"} in total["anyOf"]
    assert "total_value" in schema["ContactMetricOut"]["required"]


async def test_a_timeline_filter_says_the_events_list_takes_it(api: Api) -> None:
    # ?metric= on a timeline said only that the route takes limit, cursor, locale
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()

    answer = await api.client.get(
        f"/v1/contacts/{contact['id']}/timeline", params={"metric": "Order Paid"}
    )

    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    assert (error["field"], error["code"]) == ("metric", "unknown_parameter")
    assert error["message"] == (
        "unknown query parameter; this route takes limit, cursor, locale; to filter a "
        "contact's events by metric or time, list them with GET "
        "/v1/events?contact_id=…&metric=…&since=…"
    )


@pytest.mark.parametrize(
    ("accept_language", "label"),
    [
        ("en;q=0, *", "Pedido Pago"),  # "*" is any language but English: pt-BR
        ("*, en;q=0", "Pedido Pago"),
        ("en;q=0, pt;q=0, *", "Pedido Pagado"),
        ("pt;q=0, *", "Order Paid"),
    ],
)
async def test_labels_take_the_wildcard_as_the_languages_not_named(
    api: Api, accept_language: str, label: str
) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    body = {"metric": "Order Paid", "contact_id": contact["id"], "source_id": "1"}
    await api.post("/v1/events", body)
    path = f"/v1/contacts/{contact['id']}/timeline"
    timeline = await api.client.get(path, headers={"Accept-Language": accept_language})
    assert timeline.json()["data"][0]["label"] == label


@pytest.mark.parametrize(
    ("params", "accept_language", "label"),
    [
        ({"locale": "fr"}, "pt-BR", "Pedido Pago"),  # unsupported: Accept-Language decides
        ({"locale": "de-DE"}, "es-MX,es;q=0.9", "Pedido Pagado"),
        ({"locale": ""}, "pt-BR", "Pedido Pago"),
        ({"locale": "fr"}, None, "Order Paid"),  # neither: the default
        ({"locale": "es"}, "pt-BR", "Pedido Pagado"),  # a supported ?locale= wins
        ({"locale": "en"}, "pt-BR", "Order Paid"),
    ],
)
async def test_labels_take_accept_language_when_the_locale_parameter_is_unsupported(
    api: Api, params: dict[str, str], accept_language: str | None, label: str
) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    posted = await api.post(
        "/v1/events", {"metric": "Order Paid", "contact_id": contact["id"], "source_id": "1"}
    )
    headers = {} if accept_language is None else {"Accept-Language": accept_language}
    path = f"/v1/contacts/{contact['id']}"
    answers = [
        await api.client.get(f"{path}/timeline", params=params, headers=headers),
        await api.client.get(f"{path}/metrics", params=params, headers=headers),
        await api.client.get(f"/v1/events/{posted.json()['event_id']}", params=params,
                             headers=headers),
        await api.client.get("/v1/metrics", params=params, headers=headers),
    ]  # fmt: skip
    timeline, metrics, event, listing = (answer.json() for answer in answers)
    assert timeline["data"][0]["label"] == label
    assert {r["metric"]: r["label"] for r in metrics["data"]}["Order Paid"] == label
    assert event["label"] == label
    assert {r["name"]: r["label"] for r in listing["data"]}["Order Paid"] == label


async def test_another_accounts_contact_is_404_everywhere(api: Api) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = api.ledger.create_contact(other.id, email="bia@example.com")
    paths = [f"/v1/contacts/{theirs.id}", f"/v1/contacts/{theirs.id}/timeline",
             f"/v1/contacts/{theirs.id}/metrics"]  # fmt: skip

    for path in [*paths, f"/v1/contacts/{uuid.uuid4()}", "/v1/contacts/x"]:
        assert (await api.client.get(path)).status_code == 404, path
    patched = await api.client.patch(paths[0], json={"name": "Mine now"})
    tagged = await api.post(f"{paths[0]}/tags", {"tags": ["mine"]})
    untagged = await api.client.delete(f"{paths[0]}/tags/x")

    assert (patched.status_code, tagged.status_code, untagged.status_code) == (404, 404, 404)
    assert api.ledger.get_contact(other.id, theirs.id).name is None  # type: ignore[union-attr]
    assert api.ledger.list_tags(other.id, theirs.id) == []


async def test_delete_erases_a_contact_then_answers_404(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    path = f"/v1/contacts/{contact['id']}"
    await api.post(f"{path}/tags", {"tags": ["vip"]})
    posted = await api.post("/v1/events", {"metric": "Order Paid", "contact_id": contact["id"],
                                           "source": "shopify", "value": "99.90"})  # fmt: skip
    assert posted.status_code == 201, posted.text

    erased = await api.client.delete(path)
    again = await api.client.delete(path)
    read = await api.client.get(path)
    matched = await api.post("/v1/contacts", {"email": "ana@example.com"})

    assert (erased.status_code, erased.content) == (204, b"")
    assert (again.status_code, again.json()["type"]) == (404, "/problems/not-found")
    assert read.status_code == 404
    assert matched.status_code == 201  # the email names no one any more: a new contact
    assert matched.json()["id"] != contact["id"]
    for table in ("contacts", "contact_identities", "contact_tags", "events",
                  "contact_metrics_summary"):  # fmt: skip
        column = "id" if table == "contacts" else "contact_id"
        assert sql(api.url, f"SELECT count(*) FROM {table} WHERE {column} = ?",
                   contact["id"]) == [(0,)], table  # fmt: skip
    assert sql(api.url, "SELECT count(*) FROM outbox WHERE event_id = ?",
               posted.json()["event_id"]) == [(0,)]  # fmt: skip


async def test_delete_of_unknown_other_accounts_or_malformed_ids_is_404_alike(api: Api) -> None:
    other = api.ledger.create_account("Outra Loja")
    theirs = api.ledger.create_contact(other.id, email="bia@example.com")
    unknown = uuid.uuid4()

    mine = await api.client.delete(f"/v1/contacts/{unknown}")
    stranger = await api.client.delete(f"/v1/contacts/{theirs.id}")
    malformed = await api.client.delete("/v1/contacts/x")

    assert (mine.status_code, stranger.status_code, malformed.status_code) == (404, 404, 404)
    assert stranger.text.replace(str(theirs.id), "ID") == mine.text.replace(str(unknown), "ID")
    assert api.ledger.get_contact(other.id, theirs.id) is not None


async def test_delete_needs_the_admin_scope(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    key = await api.key_for("ingest", "read")

    refused = await api.client.delete(f"/v1/contacts/{contact['id']}", headers=api.auth(key))

    assert (refused.status_code, refused.json()["type"]) == (403, "/problems/forbidden")
    assert api.ledger.get_contact(api.account.id, contact["id"]) is not None


async def test_an_event_for_an_erased_contact_is_answered_as_for_an_unknown_one(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    await api.client.delete(f"/v1/contacts/{contact['id']}")

    answers = [
        await api.post("/v1/events", {"metric": "Order Paid", "contact_id": ident,
                                      "source": "shopify"})
        for ident in (contact["id"], str(uuid.uuid4()))
    ]  # fmt: skip

    erased, unknown = ((a.status_code, a.json()["reason"], a.json()["type"]) for a in answers)
    assert erased == unknown == (422, "contact_not_found", "/problems/event-rejected")


async def test_cli_erases_a_contact_once(api: Api) -> None:
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    args = ["contacts", "erase", contact["id"], "--account", str(api.account.id),
            "--database-url", api.url]  # fmt: skip

    erased = CliRunner().invoke(cli, [*args, "--json"])
    again = CliRunner().invoke(cli, args)

    assert erased.exit_code == 0, erased.output
    assert json.loads(erased.output) == {"id": contact["id"], "erased": True}
    assert again.exit_code == 1
    assert f"no contact {contact['id']}" in again.output
    assert (await api.client.get(f"/v1/contacts/{contact['id']}")).status_code == 404


async def test_metrics_give_a_total_per_currency_never_one_across_them(api: Api) -> None:
    """Order Paid 100 BRL and 50 USD: not a total of 150, but each currency's; a metric
    in one currency keeps its total_value, with that currency."""
    contact = (await api.post("/v1/contacts", {"email": "ana@example.com"})).json()
    bodies = [
        {"metric": "Order Paid", "value": "100", "currency": "BRL", "source_id": "1"},
        {"metric": "Order Paid", "value": "50", "currency": "usd", "source_id": "2"},
        {"metric": "Order Paid", "currency": "EUR", "source_id": "3"},  # no value
        {"metric": "Order Placed", "value": "20", "currency": "USD", "source_id": "4"},
    ]
    for body in bodies:
        sent = await api.post("/v1/events", {**body, "contact_id": contact["id"]})
        assert sent.status_code == 201, sent.text

    metrics = await api.client.get(f"/v1/contacts/{contact['id']}/metrics")

    rows = {r["metric"]: r for r in metrics.json()["data"]}
    paid, placed = rows["Order Paid"], rows["Order Placed"]
    assert (paid["count"], paid["total_value"], paid["currency"]) == (3, None, None)
    assert paid["totals"] == [{"currency": "BRL", "total_value": "100.00"},
                              {"currency": "USD", "total_value": "50.00"}]  # fmt: skip
    assert (placed["count"], placed["total_value"], placed["currency"]) == (1, "20.00", "USD")
    assert placed["totals"] == [{"currency": "USD", "total_value": "20.00"}]
    assert (rows["Contact Created"]["currency"], rows["Contact Created"]["totals"]) == (None, [])
