"""Webhook signatures: HMAC-SHA256 over the raw bytes, as each provider signs them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sinal.errors import SignatureMismatch, WebhookError
from sinal.integrations.signatures import (
    sign_shopify,
    sign_whatsapp,
    sign_yampi,
    verify_shopify,
    verify_whatsapp,
    verify_yampi,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
SECRET = "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"
OTHER_SECRET = "shpss_00000000000000000000000000000000"

Verify = Callable[[str, bytes, str | None], None]
Sign = Callable[[str, bytes], str]
PROVIDERS: list[tuple[str, Sign, Verify, str]] = [
    ("shopify", sign_shopify, verify_shopify, "shopify/orders_create.json"),
    ("yampi", sign_yampi, verify_yampi, "yampi/order_paid.json"),
    ("whatsapp", sign_whatsapp, verify_whatsapp, "whatsapp/text_message.json"),
]
IDS = [p[0] for p in PROVIDERS]


def _body(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def _reference_base64(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def test_sign_shopify_matches_an_independent_hmac() -> None:
    body = _body("shopify/orders_create.json")
    assert sign_shopify(SECRET, body) == _reference_base64(SECRET, body)


def test_sign_yampi_matches_an_independent_hmac() -> None:
    body = _body("yampi/order_paid.json")
    assert sign_yampi(SECRET, body) == _reference_base64(SECRET, body)


def test_sign_whatsapp_is_sha256_prefix_and_lowercase_hex() -> None:
    body = _body("whatsapp/text_message.json")
    expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert sign_whatsapp(SECRET, body) == f"sha256={expected}"


@pytest.mark.parametrize(("provider", "sign", "verify", "fixture"), PROVIDERS, ids=IDS)
def test_verify_accepts_the_providers_signature(
    provider: str, sign: Sign, verify: Verify, fixture: str
) -> None:
    body = _body(fixture)
    verify(SECRET, body, sign(SECRET, body))
    verify(SECRET, body, "  " + sign(SECRET, body) + "\t")  # header whitespace is not signal


@pytest.mark.parametrize(("provider", "sign", "verify", "fixture"), PROVIDERS, ids=IDS)
@pytest.mark.parametrize("header", [None, "", "   "])
def test_verify_rejects_a_missing_signature(
    provider: str, sign: Sign, verify: Verify, fixture: str, header: str | None
) -> None:
    with pytest.raises(SignatureMismatch, match="missing"):
        verify(SECRET, _body(fixture), header)


@pytest.mark.parametrize(("provider", "sign", "verify", "fixture"), PROVIDERS, ids=IDS)
def test_verify_rejects_another_secrets_signature(
    provider: str, sign: Sign, verify: Verify, fixture: str
) -> None:
    body = _body(fixture)
    with pytest.raises(SignatureMismatch, match="does not match"):
        verify(SECRET, body, sign(OTHER_SECRET, body))


@pytest.mark.parametrize(("provider", "sign", "verify", "fixture"), PROVIDERS, ids=IDS)
def test_verify_rejects_a_tampered_body(
    provider: str, sign: Sign, verify: Verify, fixture: str
) -> None:
    body = _body(fixture)
    header = sign(SECRET, body)
    tampered = body.replace(b"55119", b"55118", 1)
    assert tampered != body
    with pytest.raises(SignatureMismatch):
        verify(SECRET, tampered, header)
    with pytest.raises(SignatureMismatch):
        verify(SECRET, body + b"\n", header)


@pytest.mark.parametrize(
    ("verify", "header"),
    [
        (verify_shopify, "not base64!"),
        (verify_shopify, base64.b64encode(b"short").decode()),
        (verify_shopify, base64.b64encode(bytes(33)).decode()),
        (verify_shopify, "A" * 300),
        (verify_shopify, "çãõ"),
        (verify_yampi, "%%%%"),
        (verify_yampi, base64.b64encode(bytes(31)).decode()),
        (verify_whatsapp, "sha1=" + "0" * 40),
        (verify_whatsapp, "0" * 64),  # no "sha256=" prefix
        (verify_whatsapp, "sha256=zz" + "0" * 62),
        (verify_whatsapp, "sha256=" + "0" * 63),
        (verify_whatsapp, "sha256=" + "0" * 62),
        (verify_whatsapp, "sha256="),
    ],
)
def test_verify_rejects_a_malformed_signature(verify: Verify, header: str) -> None:
    with pytest.raises(SignatureMismatch):
        verify(SECRET, b'{"id": 1}', header)


def test_verify_whatsapp_checks_the_bytes_meta_sent_not_a_reserialization() -> None:
    body = _body("whatsapp/text_message.json")
    assert b"\\u00e7" in body  # Meta's escapes, as received
    assert b"\\ud83d\\ude4f" in body
    header = sign_whatsapp(SECRET, body)
    verify_whatsapp(SECRET, body, header)

    payload = json.loads(body)
    for reserialized in (
        json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode(),
        json.dumps(payload, separators=(",", ":")).encode(),  # same escapes, but "/" unescaped
        json.dumps(payload).encode(),
    ):
        with pytest.raises(SignatureMismatch):
            verify_whatsapp(SECRET, reserialized, header)


def test_verify_whatsapp_accepts_uppercase_hex() -> None:
    body = _body("whatsapp/status_read.json")
    header = "sha256=" + sign_whatsapp(SECRET, body).removeprefix("sha256=").upper()
    verify_whatsapp(SECRET, body, header)


@pytest.mark.parametrize(("provider", "sign", "verify", "fixture"), PROVIDERS, ids=IDS)
def test_an_empty_secret_is_a_configuration_error_not_a_pass(
    provider: str, sign: Sign, verify: Verify, fixture: str
) -> None:
    body = _body(fixture)
    forged = _reference_base64("", body)
    with pytest.raises(ValueError, match="secret is empty"):
        verify("", body, forged)
    with pytest.raises(ValueError, match="secret is empty"):
        sign("", body)


def test_signature_mismatch_is_a_webhook_error() -> None:
    with pytest.raises(WebhookError):
        verify_shopify(SECRET, b"{}", None)


def test_secrets_with_non_ascii_characters_sign_as_utf8() -> None:
    secret = "segredo-çã"
    body = _body("yampi/order_created.json")
    expected = base64.b64encode(
        hmac.new(secret.encode("utf-8"), body, hashlib.sha256).digest()
    ).decode()
    verify_yampi(secret, body, expected)
