"""Secrets at rest: the keys of `SINAL_SECRET_KEYS`, and the sealed values they make.

A connection's secrets (a WhatsApp access token and app secret, a store's webhook secret,
an AI endpoint's API key) are stored sealed with AES-256-GCM:

    {"v": 1, "kid": "k2", "sealed": "<base64 of nonce (12 bytes) + ciphertext + tag>"}

`kid` names the key that sealed it, so a keyring of several keys (`k2:…,k1:…`: the first
seals, every one opens) reads values sealed before a rotation. The associated data is the
value's place — its table, account, row and field (`context`) — so a sealed value copied
to another row, account or field does not open. A value that is a plain string was stored
before encryption, or with no key set: it is read as it is, and sealed by the next
`sinal secrets rotate`.

No I/O: the stores seal on write and open on read (`seal_all`, `open_all`, `reseal_all`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeGuard

from sinal.errors import ConfigurationError, SecretUnreadable

SECRET_KEYS_VARIABLE: Final = "SINAL_SECRET_KEYS"
KEY_BYTES: Final = 32  # AES-256
NONCE_BYTES: Final = 12  # GCM's own size: random per seal (2^32 seals per key stay safe)
ENVELOPE_VERSION: Final = 1
PLAINTEXT: Final = "plaintext"
"""What `sealed_with` answers, and `sinal secrets status` counts, for a value not sealed."""

_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


@dataclass(frozen=True, slots=True)
class Keyring:
    """The keys secrets are sealed and opened with: the first seals, every one opens."""

    keys: tuple[tuple[str, bytes], ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring holds one key at least")

    @property
    def current_id(self) -> str:
        """The id of the key new values are sealed with."""
        return self.keys[0][0]

    @property
    def ids(self) -> tuple[str, ...]:
        """Every key's id, the current one first."""
        return tuple(kid for kid, _ in self.keys)

    def seal(self, plaintext: str, context: str) -> dict[str, Any]:
        """`plaintext` sealed with the current key, bound to `context` (its place)."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # only when used

        kid, key = self.keys[0]
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(key).encrypt(nonce, plaintext.encode(), context.encode())
        text = base64.b64encode(nonce + sealed).decode("ascii")
        return {"v": ENVELOPE_VERSION, "kid": kid, "sealed": text}

    def open(self, envelope: Mapping[str, Any], context: str) -> str:
        """The plaintext of a sealed value; `SecretUnreadable` (naming its key) when no key
        of the ring opens it, or it was altered or sealed for another place."""
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        kid = str(envelope.get("kid"))
        key = dict(self.keys).get(kid)
        if key is None:
            held = ", ".join(self.ids)
            raise SecretUnreadable(
                kid, f"the secret {context} is sealed with key {kid!r}, which "
                f"{SECRET_KEYS_VARIABLE} does not hold (it holds {held})"
            )  # fmt: skip
        try:
            raw = base64.b64decode(str(envelope.get("sealed")), validate=True)
            plain = AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], context.encode())
        except (binascii.Error, ValueError, InvalidTag):
            raise SecretUnreadable(
                kid, f"the secret {context} does not open with key {kid!r}: it was altered, "
                "or sealed for another row or field"
            ) from None  # fmt: skip
        return plain.decode()


def parse_keyring(text: str, variable: str = SECRET_KEYS_VARIABLE) -> Keyring | None:
    """The keyring `text` describes (`id:base64-of-32-bytes`, comma-separated, the current
    key first); None for an empty text. `ConfigurationError` naming `variable` — never
    quoting a key — for anything else."""
    if not text.strip():
        return None
    keys: list[tuple[str, bytes]] = []
    for position, item in enumerate(text.split(","), start=1):
        kid, colon, encoded = item.strip().partition(":")
        where = f"{variable}: key {position}"
        if not colon or not _KEY_ID.fullmatch(kid):
            raise ConfigurationError(
                f"{where} must be ID:KEY, the ID 1 to 32 letters, digits, _ or - "
                "(e.g. k2:<base64 of 32 random bytes>), comma-separated, the current key first"
            )
        key = _decode_key(encoded.strip())
        if key is None or len(key) != KEY_BYTES:
            raise ConfigurationError(
                f"{where} ({kid}) must be the base64 of {KEY_BYTES} random bytes "
                "(`sinal secrets new-key` makes one)"
            )
        if any(kid == known for known, _ in keys):
            raise ConfigurationError(f"{where}: the id {kid!r} is given twice")
        keys.append((kid, key))
    return Keyring(tuple(keys))


def _decode_key(encoded: str) -> bytes | None:
    """The bytes of a key in standard or URL-safe base64; None if it is neither."""
    try:
        alphabet = encoded.replace("-", "+").replace("_", "/")
        return base64.b64decode(alphabet, validate=True)
    except (binascii.Error, ValueError):
        return None


def new_key(key_id: str) -> str:
    """A fresh key as `SINAL_SECRET_KEYS` takes it: `key_id:<base64 of 32 random bytes>`."""
    if not _KEY_ID.fullmatch(key_id):
        raise ConfigurationError("a key id is 1 to 32 letters, digits, _ or -")
    return f"{key_id}:{base64.b64encode(os.urandom(KEY_BYTES)).decode('ascii')}"


def is_sealed(value: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether a stored value is a sealed envelope (not a plaintext string)."""
    return isinstance(value, Mapping) and "kid" in value and "sealed" in value


def sealed_with(value: object) -> str:
    """The id of the key a stored value is sealed with, or `PLAINTEXT`."""
    return str(value["kid"]) if is_sealed(value) else PLAINTEXT


def open_value(keyring: Keyring | None, value: Any, context: str) -> Any:
    """A stored value as it was given: opened when sealed, else as it is."""
    if not is_sealed(value):
        return value
    if keyring is None:
        kid = sealed_with(value)
        raise SecretUnreadable(
            kid,
            f"the secret {context} is sealed with key {kid!r}, and {SECRET_KEYS_VARIABLE} "
            "is not set",
        )
    return keyring.open(value, context)


def seal_all(keyring: Keyring | None, secrets: Mapping[str, Any], place: str) -> dict[str, Any]:
    """`secrets` as stored: each text sealed for `place/field` (kept as it is without a
    keyring, or when it is sealed already)."""
    if keyring is None:
        return dict(secrets)
    return {
        name: keyring.seal(value, f"{place}/{name}") if isinstance(value, str) else value
        for name, value in secrets.items()
    }


def open_all(keyring: Keyring | None, stored: Mapping[str, Any], place: str) -> dict[str, Any]:
    """Stored secrets as they were given (`SecretUnreadable` for one no key opens)."""
    return {name: open_value(keyring, value, f"{place}/{name}") for name, value in stored.items()}


def reseal_all(keyring: Keyring, stored: Mapping[str, Any], place: str) -> dict[str, Any] | None:
    """Stored secrets with each value the current key did not seal (plaintext, or another
    key's) sealed again with it; None when every one is the current key's already."""
    fresh = {name: reseal(keyring, value, f"{place}/{name}") for name, value in stored.items()}
    return None if all(fresh[name] is stored[name] for name in stored) else fresh


def reseal(keyring: Keyring, value: Any, context: str) -> Any:
    """A stored value sealed with the current key: as it is when it is already (or is no
    text: nothing to seal), else opened (`SecretUnreadable`) and sealed again."""
    if sealed_with(value) == keyring.current_id or not (is_sealed(value) or isinstance(value, str)):
        return value
    return keyring.seal(open_value(keyring, value, context), context)


@dataclass(frozen=True, slots=True)
class SealedSecret:
    """A sealed value as an automation's parsed definition holds it: opened only by the
    step that uses it (`open_value` of `as_dict()`)."""

    kid: str
    sealed: str = field(repr=False)

    @classmethod
    def of(cls, envelope: Mapping[str, Any]) -> SealedSecret:
        """The sealed value a stored envelope holds."""
        return cls(str(envelope.get("kid")), str(envelope.get("sealed")))

    def as_dict(self) -> dict[str, Any]:
        """The envelope, as stored."""
        return {"v": ENVELOPE_VERSION, "kid": self.kid, "sealed": self.sealed}


def integration_place(account_id: object, integration_id: object) -> str:
    """Where an integration's secrets live (`integrations/{account}/{id}`): with the
    field's name, the associated data of each one's seal, and what errors name."""
    return f"integrations/{account_id}/{integration_id}"


def webhook_secret_place(account_id: object, automation_id: object) -> str:
    """Where an automation's webhook steps' signing secrets live (the associated data of
    their seals): one place for every step of the automation, so that a secret kept by a
    PATCH that moves its step still opens."""
    return f"automations/{account_id}/{automation_id}/webhook_secret"


def webhook_header_place(account_id: object, automation_id: object, name: str) -> str:
    """Where the value of header `name` of an automation's webhook steps lives: one place
    per automation, as for the signing secret, and per header name in lower case (names are
    case-insensitive: a value a PATCH keeps under another case still opens)."""
    return f"automations/{account_id}/{automation_id}/webhook_headers/{name.lower()}"


__all__ = [
    "PLAINTEXT",
    "SECRET_KEYS_VARIABLE",
    "Keyring",
    "SealedSecret",
    "integration_place",
    "is_sealed",
    "new_key",
    "open_all",
    "open_value",
    "parse_keyring",
    "reseal",
    "reseal_all",
    "seal_all",
    "sealed_with",
    "webhook_header_place",
    "webhook_secret_place",
]
