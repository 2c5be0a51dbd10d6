"""Migration 0032's step: emails and external ids stored before sinal read full-width
forms as ASCII and put external ids in NFC, rewritten to the form it stores now.

The new forms are computed by `normalize_email` and `normalize_external_id` themselves,
in Python on both backends: PostgreSQL has NFC but no width mapping, SQLite neither, and
the function that normalizes what users send cannot disagree with itself. Only non-ASCII
values are read: an ASCII one was stored as it is stored now. A value is left as stored,
and named in a warning (by contact id; the value is not logged), when

- today's code refuses it (a compatibility character before the "@": "ﬁ", "²"), or
- its new form is another contact's identity, or two contacts' values take one new form:
  whether they are one person is a person's decision (merge, or PATCH one).

`sinal contacts older-spellings` lists those of an account at any time (`unrespelled`).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sinal.contacts import InvalidIdentity, normalize_email, normalize_external_id

log = logging.getLogger("sinal.store")

RESPELLING_VERSION = 32

# A statement run in the migration's transaction: its rows ([] for a write).
Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]

_NORMALIZERS = {"email": normalize_email, "external_id": normalize_external_id}


@dataclass(frozen=True, slots=True)
class Unrespelled:
    """An identity left in its older spelling, and why (`refused` or `taken`)."""

    account_id: Any
    contact_id: Any
    kind: str
    value: str
    reason: str
    holders: tuple[Any, ...] = ()  # the other contacts its new form names, if `taken`

    def describe(self) -> str:
        """One line naming the contact, never the value."""
        if self.reason == "refused":
            why = "is refused now (invalid_email: 'ﬁ', '²'); PATCH the one its person uses"
        else:
            others = ", ".join(map(str, self.holders))
            why = f"in its form now names contact {others}: one person? PATCH or keep both"
        return f"account {self.account_id} contact {self.contact_id}: {self.kind} {why}"


def respell_identities(query: Query, backend: str, now: Any) -> list[Unrespelled]:
    """Rewrite every older spelling to today's, in contact_identities and contacts (its
    updated_at `now`), except those `unrespelled` leaves; return and log those."""
    p = "?" if backend == "sqlite" else "%s"
    moved, left = _respellings(query, backend)
    for (account_id, contact_id, kind, old), new in moved.items():
        query(
            f"UPDATE contact_identities SET value = {p} "
            f"WHERE account_id = {p} AND kind = {p} AND value = {p}",
            (new, account_id, kind, old),
        )
        query(
            f"UPDATE contacts SET {kind} = {p}, updated_at = {p} "
            f"WHERE account_id = {p} AND id = {p} AND {kind} = {p}",
            (new, now, account_id, contact_id, old),
        )
    for identity in left:
        log.warning("migration 0032 left an identity as stored: %s", identity.describe())
    return left


def unrespelled(query: Query, backend: str, account_id: Any) -> list[Unrespelled]:
    """The account's identities in an older spelling that `respell_identities` leaves."""
    return _respellings(query, backend, account_id)[1]


def _respellings(
    query: Query, backend: str, account: Any = None
) -> tuple[dict[tuple[Any, Any, str, str], str], list[Unrespelled]]:
    """The older spellings to rewrite, (account, contact, kind, old) -> new, and the rest;
    of one account, or (the migration) of every one."""
    p = "?" if backend == "sqlite" else "%s"
    size = "length(CAST(value AS BLOB))" if backend == "sqlite" else "octet_length(value)"
    scope = "" if account is None else f"account_id = {p} AND "
    rows = query(
        f"SELECT account_id, contact_id, kind, value FROM contact_identities WHERE {scope}"
        f"kind IN ('email', 'external_id') AND length(value) <> {size} "
        "ORDER BY account_id, kind, value",
        () if account is None else (account,),
    )
    new, left = _new_forms(rows)
    claims: dict[tuple[Any, str, str], list[Any]] = defaultdict(list)
    for (account_id, contact_id, kind, _), value in new.items():
        claims[(account_id, kind, value)].append(contact_id)
    moved: dict[tuple[Any, Any, str, str], str] = {}
    for key, value in new.items():
        account_id, contact_id, kind, old = key
        held = query(
            f"SELECT contact_id FROM contact_identities "
            f"WHERE account_id = {p} AND kind = {p} AND value = {p}",
            (account_id, kind, value),
        )
        holders = [h[0] for h in held]
        holders += [c for c in claims[(account_id, kind, value)] if c != contact_id]
        if holders:
            left.append(Unrespelled(account_id, contact_id, kind, old, "taken", tuple(holders)))
        else:
            moved[key] = value
    return moved, left


def _new_forms(
    rows: Iterable[tuple[Any, ...]],
) -> tuple[dict[tuple[Any, Any, str, str], str], list[Unrespelled]]:
    """Each row's form now where it differs, and the rows whose value is refused now."""
    new: dict[tuple[Any, Any, str, str], str] = {}
    refused: list[Unrespelled] = []
    for account_id, contact_id, kind, value in rows:
        try:
            form = _NORMALIZERS[kind](value)
        except InvalidIdentity:
            refused.append(Unrespelled(account_id, contact_id, kind, value, "refused"))
            continue
        if form != value:
            new[(account_id, contact_id, kind, value)] = form
    return new, refused
