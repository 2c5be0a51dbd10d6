"""API keys: their text, their hash and their scopes; no I/O.

A key reads `snl_<account id, 32 hex digits>_<43 base62 characters>` (256 random bits).
The account is part of the text, so a request is authenticated by `(account_id,
key_hash)` — a lookup inside one tenant, like every other — and only the SHA-256 of the
whole text is stored. A leaked database gives no usable key.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from collections.abc import Iterable
from datetime import datetime
from typing import Final, Literal, get_args
from uuid import UUID

from sinal.ids import new_id
from sinal.store.base import ApiKey

Scope = Literal["ingest", "read", "admin"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)
DEFAULT_SCOPES: Final[tuple[Scope, ...]] = ("ingest", "read")
KEY_PREFIX: Final = "snl_"
_ALPHABET: Final = string.ascii_letters + string.digits
_SECRET_LENGTH: Final = 43  # 43 base62 characters carry 256 bits
_KEY = re.compile(r"snl_([0-9a-f]{32})_([0-9A-Za-z]{43})")


def generate_key(
    account_id: UUID, scopes: Iterable[str], now: datetime, name: str | None = None
) -> tuple[str, ApiKey]:
    """A new key's text (shown once) and the record to store."""
    secret = "".join(secrets.choice(_ALPHABET) for _ in range(_SECRET_LENGTH))
    text = f"{KEY_PREFIX}{account_id.hex}_{secret}"
    record = ApiKey(
        account_id=account_id,
        id=new_id(),
        key_hash=hash_key(text),
        hint=text[-4:],
        name=name,
        scopes=parse_scopes(scopes),
        created_at=now,
    )
    return text, record


def hash_key(text: str) -> str:
    """The SHA-256 of a key's text, as stored."""
    return hashlib.sha256(text.encode()).hexdigest()


def key_account(text: str) -> UUID | None:
    """The account a well-formed key names, or None for anything else."""
    match = _KEY.fullmatch(text)
    return None if match is None else UUID(hex=match.group(1))


def parse_scopes(scopes: Iterable[str] | str) -> tuple[Scope, ...]:
    """Scopes from a list or "ingest,read"; `ValueError` names an unknown or empty one."""
    if isinstance(scopes, str):  # a blank text names no scope: the error says a key needs one
        items = scopes.split(",") if scopes.strip() else []
    else:
        items = list(scopes)
    found: list[Scope] = []
    for item in (s.strip() for s in items):
        if not item:  # "ingest,,read": a typo, not a scope named ''
            shown = scopes if isinstance(scopes, str) else ",".join(items)
            raise ValueError(f"the scope list {shown!r} has an empty item; "
                             f"scopes are {', '.join(SCOPES)}")  # fmt: skip
        if item not in SCOPES:
            raise ValueError(f"unknown scope {item!r}; scopes are {', '.join(SCOPES)}")
        if item not in found:
            found.append(item)
    if not found:
        raise ValueError(f"a key needs at least one scope ({', '.join(SCOPES)})")
    return tuple(found)
