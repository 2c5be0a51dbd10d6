"""Webhook signatures: HMAC-SHA256 over the raw body bytes, compared in constant time.

Verify the bytes exactly as received, before parsing: Meta escapes non-ASCII text as
``\\uXXXX`` and Shopify's JSON spacing is its own, so re-serialized JSON never matches.

| provider | header                  | value                                   |
|----------|-------------------------|-----------------------------------------|
| Shopify  | X-Shopify-Hmac-Sha256   | base64(HMAC-SHA256(app secret, body))   |
| Yampi    | X-Yampi-Hmac-SHA256     | base64(HMAC-SHA256(webhook secret, body)) |
| WhatsApp | X-Hub-Signature-256     | "sha256=" + hex(HMAC-SHA256(app secret, body)) |
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

from sinal.errors import SignatureMismatch

__all__ = [
    "SHOPIFY_SIGNATURE_HEADER",
    "WHATSAPP_SIGNATURE_HEADER",
    "YAMPI_SIGNATURE_HEADER",
    "sign_shopify",
    "sign_whatsapp",
    "sign_yampi",
    "verify_shopify",
    "verify_whatsapp",
    "verify_yampi",
]

SHOPIFY_SIGNATURE_HEADER: Final = "X-Shopify-Hmac-Sha256"
YAMPI_SIGNATURE_HEADER: Final = "X-Yampi-Hmac-SHA256"
WHATSAPP_SIGNATURE_HEADER: Final = "X-Hub-Signature-256"

_WHATSAPP_PREFIX: Final = "sha256="
_SHA256_SIZE: Final = 32
# A signature header longer than this is junk; do not spend work decoding it.
_MAX_HEADER_LENGTH: Final = 256


def _digest(secret: str, body: bytes) -> bytes:
    if not secret:
        # An empty key would let anyone sign: a misconfigured integration, not a bad request.
        raise ValueError("the webhook secret is empty")
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).digest()


def sign_shopify(secret: str, body: bytes) -> str:
    """The X-Shopify-Hmac-Sha256 value for `body` (for tests and fixture generators)."""
    return base64.b64encode(_digest(secret, body)).decode("ascii")


def sign_yampi(secret: str, body: bytes) -> str:
    """The X-Yampi-Hmac-SHA256 value for `body` (for tests and fixture generators)."""
    return base64.b64encode(_digest(secret, body)).decode("ascii")


def sign_whatsapp(app_secret: str, body: bytes) -> str:
    """The X-Hub-Signature-256 value for `body`: "sha256=<hex>"."""
    return _WHATSAPP_PREFIX + _digest(app_secret, body).hex()


def verify_shopify(secret: str, body: bytes, header: str | None) -> None:
    """Raise SignatureMismatch unless `header` is Shopify's signature of `body`."""
    _compare(_digest(secret, body), _from_base64(_present(header)))


def verify_yampi(secret: str, body: bytes, header: str | None) -> None:
    """Raise SignatureMismatch unless `header` is Yampi's signature of `body`."""
    _compare(_digest(secret, body), _from_base64(_present(header)))


def verify_whatsapp(app_secret: str, body: bytes, header: str | None) -> None:
    """Raise SignatureMismatch unless `header` is "sha256=<hex>" of `body` (Meta's form)."""
    expected = _digest(app_secret, body)  # first: an empty secret is an error either way
    value = _present(header)
    if not value.startswith(_WHATSAPP_PREFIX):
        raise SignatureMismatch("the signature does not start with 'sha256='")
    _compare(expected, _from_hex(value.removeprefix(_WHATSAPP_PREFIX)))


def _present(header: str | None) -> str:
    value = (header or "").strip()
    if not value:
        raise SignatureMismatch("the signature header is missing")
    if len(value) > _MAX_HEADER_LENGTH:
        raise SignatureMismatch("the signature header is malformed")
    return value


def _from_base64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise SignatureMismatch("the signature is not valid base64") from None


def _from_hex(value: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise SignatureMismatch("the signature is not valid hex") from None


def _compare(expected: bytes, given: bytes) -> None:
    # Length is not secret (always 32 bytes); the comparison of the bytes is constant-time.
    if len(given) != _SHA256_SIZE or not hmac.compare_digest(expected, given):
        raise SignatureMismatch("the signature does not match the body")
