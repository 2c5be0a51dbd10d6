"""The WhatsApp Cloud API's refusals of a send: which clear by themselves, which do not."""

from __future__ import annotations

import json

import pytest

from sinal.integrations.whatsapp_api import SendRefusal, read_refusal


def _meta(code: object, message: str = "(#0) title", details: str | None = None) -> bytes:
    error: dict[str, object] = {"message": message, "type": "OAuthException", "code": code}
    if details is not None:
        error["error_data"] = {"messaging_product": "whatsapp", "details": details}
    return json.dumps({"error": error}).encode()


@pytest.mark.parametrize(
    ("status", "code", "is_temporary"),
    [
        (400, 130429, True),  # throughput reached
        (400, 131056, True),  # pair rate limit
        (400, 131048, True),  # spam rate limit
        (400, 80007, True),  # the business account's rate limit
        (400, 4, True),  # the app's call rate
        (400, 131000, True),  # something went wrong: "try again"
        (400, 131016, True),  # service unavailable, said with a 4xx
        (400, 131026, False),  # undeliverable
        (400, 131047, False),  # outside the 24 h window: a template is needed
        (400, 100, False),  # invalid parameter
        (404, 132001, False),  # no such template
        (401, 190, False),  # the access token expired
        (403, 131031, False),  # the account is locked
        (400, 131042, False),  # a payment problem
        (429, 190, True),  # 429 is "not now", whatever the code
        (408, None, True),
        (404, None, False),  # a proxy's 404 page: not Meta's, and not temporary
    ],
)
def test_read_refusal_sorts_meta_codes_into_for_now_and_for_good(
    status: int, code: int | None, is_temporary: bool
) -> None:
    content = b"<html>not found</html>" if code is None else _meta(code)
    refusal = read_refusal(status, content)
    assert (refusal.code, refusal.is_temporary) == (code, is_temporary)


def test_read_refusal_quotes_meta_message_and_details() -> None:
    content = _meta(131026, "(#131026) Message undeliverable", "Unable to deliver the message.")
    refusal = read_refusal(400, content)
    assert str(refusal) == (
        "(400, error 131026): (#131026) Message undeliverable: Unable to deliver the message."
    )


def test_read_refusal_quotes_details_repeating_the_message_once() -> None:
    content = _meta(190, "(#190) Access token has expired", "Access token has expired")
    assert read_refusal(401, content).reason == "(#190) Access token has expired"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", ""),
        (b"Bad Request", "Bad Request"),
        (b'{"error": "plain"}', '{"error": "plain"}'),  # not Graph's shape
        (b"[1, 2]", "[1, 2]"),
        (b'{"error": {"code": "131026"}}', '{"error": {"code": "131026"}}'),  # code as text
        (b'{"error": {"code": true}}', '{"error": {"code": true}}'),
        (b"\xff" * 400, "\ufffd" * 300),  # not UTF-8, and long: quoted in part
    ],
)
def test_read_refusal_of_a_body_without_meta_code_quotes_it_and_is_final(
    content: bytes, reason: str
) -> None:
    assert read_refusal(400, content) == SendRefusal(400, None, reason, False)
