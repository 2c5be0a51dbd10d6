"""Cursors: the opaque `next_cursor` of a list's page, and reading one back.

A list's cursor names the list and, by a digest, the query it pages: the account, the
path's id (an automation's executions) and the filters (`contact_id`, `metric`, `since`,
`until`; `status`; `email`, `phone`, `external_id`, `tag`). Lists are ordered by
time-ordered ids, by time or (the metrics) by name, so a position taken from one list reads
as a place in another: another list's cursor, or this list's under other filters, paged
from a wrong place without a word. Each is 422 `invalid_cursor` on `cursor` now, its
message saying which. `limit` is not bound: a page may be of any size. A contact's
timeline is `GET /v1/events?contact_id=`, one list.

```
base64url("automations|<digest>|<id>")              # integrations, automations, executions,
                                                    # rejections, conversations, contacts
base64url("events|<digest>|<occurred_at>|<id>")     # GET /v1/events, a contact's timeline
base64url("feed|<digest>|<arrival>|<id>")           # the change feed's `after`
base64url("metrics|<digest>|<base64url(name)>")     # GET /v1/metrics (a name may hold "|")
```

The feed's digest covers the account alone (`after` takes no filter): another account's
position read as a place in this one's feed, and its poller skipped (or read again) its
own events without a word.

Before, an id list's cursor was its last id alone, an events list's
"<occurred_at>|<id>" and the feed's "feed|<arrival>|<id>". The events and feed forms are
still taken (their filters and account unchecked): no other list had them, and a feed
poller keeps its cursor across an upgrade. A read is scoped to the caller's account
whatever the cursor says, so an unchecked one shows nothing of another account; and the
first page read with it hands out a bound cursor. A bare id is 422: it could be any id
list's (to the events and contacts lists, which never had one, surely another's).
"""

from __future__ import annotations

import base64
import hashlib
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NoReturn, get_args
from uuid import UUID

import orjson

from sinal.errors import FieldError, InvalidQuery
from sinal.events import in_utc
from sinal.store.base import FEED_START, FeedPosition

ListName = Literal["events", "integrations", "automations", "executions", "rejections",
                   "conversations", "contacts", "metrics"]  # fmt: skip
# Where a change feed starts: the `after` of a poller's first read.
FEED_FROM_START = "start"
_FEED: Literal["feed"] = "feed"
_CursorName = ListName | Literal["feed"]
_NAMES = frozenset({_FEED, *get_args(ListName)})
# The lists whose cursor, before cursors named their list, was a bare id.
_BARE_ID_LISTS = frozenset({"integrations", "automations", "executions", "rejections",
                            "conversations"})  # fmt: skip
_MAX_ARRIVAL = 2**63 - 1  # SQLite's largest integer; PostgreSQL's transaction ids stay below
_RESTART = "leave cursor out to list from the first page"
_NOT_OURS = "not a next_cursor of ours"


@dataclass(frozen=True)
class Listing:
    """A list's cursors: its name, and the digest of the query they page."""

    name: _CursorName
    digest: str
    bound: str  # what the digest covers, for the message of a cursor of another query

    @classmethod
    def of(cls, name: _CursorName, account_id: UUID, **query: object) -> Listing:
        """The cursors of list `name` for the account's `query`: the path's id and the
        filters, by name (None for one not given)."""
        scope = {"account": str(account_id)} | {
            k: None if v is None else str(v) for k, v in query.items()
        }
        digest = hashlib.blake2b(orjson.dumps(scope), digest_size=6).digest()
        *names, last = scope
        bound = f"another {', '.join(names)} or {last}" if names else f"another {last}"
        return cls(name, base64.urlsafe_b64encode(digest).decode(), bound)

    def encode(self, *position: str) -> str:
        """The cursor to the rows after `position` (the last row's sort key)."""
        return _encode(self.name, self.digest, *position)

    def position(self, cursor: str, size: int) -> list[str]:
        """The `size` parts of the position in a cursor of this list and query;
        `InvalidQuery` naming `cursor` for any other."""
        parts = _parts(cursor, "cursor")
        if parts[0] in _NAMES:
            if parts[0] != self.name:
                _refuse("cursor", f"{_whose(parts[0])}, not of this list ({self.name})")
            if len(parts) != size + 2:
                _refuse("cursor", _NOT_OURS)
            if parts[1] != self.digest:
                _refuse("cursor", f"a next_cursor of this list for {self.bound}: repeat the "
                        f"query it came from, or {_RESTART}")  # fmt: skip
            return parts[2:]
        if self.name == "events" and len(parts) == size:
            return parts  # an events cursor of before lists named theirs
        if len(parts) == 1 and _is_uuid(parts[0]):  # an id list's cursor of before
            _refuse("cursor", f"{_bare_id(self.name)}: {_RESTART}")
        _refuse("cursor", _NOT_OURS)


def decode_id_cursor(cursor: str | None, listing: Listing) -> UUID | None:
    """The id in a cursor of `listing`'s id list (None for none); `InvalidQuery` naming
    `cursor` for any other."""
    if cursor is None:
        return None
    [ident] = listing.position(cursor, 1)
    return _uuid(ident, "cursor")


def encode_name_cursor(name: str, listing: Listing) -> str:
    """The cursor to the rows after the one named `name` in `listing`'s list by name: the
    name in base64url, since a metric's may hold the "|" between a cursor's parts."""
    return listing.encode(_encode(name))


def decode_name_cursor(cursor: str | None, listing: Listing) -> str | None:
    """The name in a cursor of `listing`'s list by name (None for none); `InvalidQuery`
    naming `cursor` for any other."""
    if cursor is None:
        return None
    [text] = listing.position(cursor, 1)
    name = _text(text, "cursor")
    # ours is the canonical encoding of a name, which holds no control character
    if _encode(name) != text or any(unicodedata.category(ch) == "Cc" for ch in name):
        _refuse("cursor", _NOT_OURS)
    return name


def decode_event_cursor(cursor: str | None, listing: Listing) -> tuple[datetime, UUID] | None:
    """(occurred_at, id) in a cursor of `listing`'s events list (None for none);
    `InvalidQuery` naming `cursor` for any other."""
    if cursor is None:
        return None
    when, ident = listing.position(cursor, 2)
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        _refuse("cursor", _NOT_OURS)
    # Ours hold a time in UTC; one outside years 1-9999 there is not ours (and would
    # overflow the store's conversion to UTC).
    if moment.utcoffset() is None or in_utc(moment) is None:
        _refuse("cursor", _NOT_OURS)
    return moment, _uuid(ident, "cursor")


def encode_feed_cursor(position: FeedPosition, account_id: UUID) -> str:
    """The `next_cursor` of a page of the account's change feed."""
    return Listing.of(_FEED, account_id).encode(str(position.arrival), str(position.event_id))


def decode_feed_cursor(cursor: str, account_id: UUID) -> FeedPosition:
    """The feed position of an `after` of the account's feed; `InvalidQuery` naming
    `after` if it is neither a feed cursor of ours for the account nor `start`."""
    if cursor == FEED_FROM_START:
        return FEED_START
    parts = _parts(cursor, "after")
    if parts[0] in _NAMES - {_FEED}:
        _refuse("after", f"{_whose(parts[0])}: pass it as cursor, without after")
    if parts[0] == _FEED and len(parts) == 4:
        if parts[1] != Listing.of(_FEED, account_id).digest:
            _refuse("after", "a next_cursor of the change feed of another account: pass one "
                    f"this account's feed handed out, or {FEED_FROM_START!r}")  # fmt: skip
        parts = parts[:1] + parts[2:]
    # parts is now ["feed", arrival, id]: bound and checked, or of an earlier release
    if len(parts) == 3 and parts[0] == _FEED and _is_arrival(parts[1]):
        return FeedPosition(int(parts[1]), _uuid(parts[2], "after"))
    _refuse("after", f"not a next_cursor of the feed, nor {FEED_FROM_START!r}")


def _encode(*parts: str) -> str:
    return base64.urlsafe_b64encode("|".join(parts).encode()).decode().rstrip("=")


def _parts(cursor: str, field: str) -> list[str]:
    """The parts of a cursor's text; `InvalidQuery` naming `field` if it is not base64 of
    UTF-8."""
    return _text(cursor, field).split("|")


def _text(encoded: str, field: str) -> str:
    """The UTF-8 text in base64url `encoded`; `InvalidQuery` naming `field` if it holds none."""
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors too
        _refuse(field, _NOT_OURS)


def _uuid(text: str, field: str) -> UUID:
    if not _is_uuid(text):
        _refuse(field, _NOT_OURS)
    return UUID(text)


def _is_uuid(text: str) -> bool:
    try:
        UUID(text)
    except ValueError:
        return False
    return True


def _is_arrival(text: str) -> bool:
    # at most 19 digits before int(): one of thousands raises, past Python's limit
    return text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= _MAX_ARRIVAL


def _bare_id(name: str) -> str:
    """What a bare id, an id list's cursor from before cursors named their list, is to
    list `name`: maybe one of its own, or surely another list's."""
    if name in _BARE_ID_LISTS:
        return "a cursor of an earlier release, which names no list"
    return (
        f"a cursor of another list, of an earlier release (the {name} list's were never a bare id)"
    )


def _whose(name: str) -> str:
    return f"a next_cursor of the {'change feed' if name == _FEED else f'{name} list'}"


def _refuse(field: str, message: str) -> NoReturn:
    raise InvalidQuery([FieldError(field, "invalid_cursor", message)]) from None
