"""Tracked links (the seed's "Link rastreado clicado"): tokens, targets, clicks. Pure.

A link's short URL ends in ``/l/{token}``; the token is random (96 bits), so a short URL
cannot be guessed from another. A click is redirected to the URL stored with the link —
never to one taken from the request — and recorded as Link Clicked (source ``tracking``).

Automation steps that track their links (``track_links``) replace each http(s) URL of
their message with a short URL: `rewrite_urls` finds them as a reader would, leaving
sentence punctuation, WhatsApp's formatting marks and unbalanced closing brackets outside
(``(https://x.com/a).`` → ``https://x.com/a``), ending a URL at an emoji, another symbol
or punctuation outside ASCII (``https://x.com/promo🔥`` → ``https://x.com/promo``), and
leaving other schemes (``mailto:``, ``tel:``) alone.

Link-preview fetchers (WhatsApp's ``WhatsApp/…``, Facebook's ``facebookexternalhit`` and
``Facebot``, and the other chat apps' bots) fetch a link as soon as it is sent: they are
redirected like anyone, but they are not clicks; nor is a browser's prefetch or prerender of
the link (``Sec-Purpose: prefetch``), which the person may never open, nor a request
without a User-Agent (every browser sends one; scripts and scanners may not). Two clicks are two
events, except that one link's clicks within the same second are taken as one request fired
twice (the event's unique id carries the second).
"""

from __future__ import annotations

import re
import secrets
import unicodedata
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final
from uuid import UUID

from sinal.catalog import METRIC_LINK_CLICKED
from sinal.events import EmitEvent
from sinal.urls import target_url_problem

__all__ = [
    "MAX_CAMPAIGN_LENGTH",
    "SOURCE",
    "TOKEN_LENGTH",
    "click_event",
    "find_urls",
    "is_prefetch",
    "is_preview_fetcher",
    "is_token",
    "new_token",
    "rewrite_urls",
]

SOURCE: Final = "tracking"
TOKEN_BYTES: Final = 12  # 96 random bits
TOKEN_LENGTH: Final = 16  # base64url of 12 bytes, no padding
MAX_USER_AGENT: Final = 512
MAX_CAMPAIGN_LENGTH: Final = 200

# An http(s) URL in a message: from its scheme (not glued to a letter, digit or path before
# it; "_" may open italics) to the first space or character a URL never holds raw; `_trim`
# then takes back the tail.
_URL_IN_TEXT = re.compile(r"(?<![^\W_])(?<!/)https?://[^\s<>\"`]+", re.IGNORECASE)
# Ends a sentence or a WhatsApp format (*bold*, _italic_, ~strike~) rather than the URL.
_TRAILING: Final = frozenset(".,;:!?'\"*_~…»”’")
_OPENERS: Final = {")": "(", "]": "[", "}": "{"}

_TOKEN = re.compile(rf"[A-Za-z0-9_-]{{{TOKEN_LENGTH}}}")
# Matched case-insensitively anywhere in the User-Agent, except WhatsApp's, which is a
# prefix: WhatsApp's in-app browser mentions "WhatsApp/" later in a real browser's UA.
_PREVIEW_PREFIXES: Final = ("whatsapp/",)
_PREVIEW_MARKERS: Final = (
    "facebookexternalhit",
    "facebot",
    "telegrambot",
    "slackbot",
    "twitterbot",
    "discordbot",
    "linkedinbot",
    "skypeuripreview",
)

# A browser's speculative fetch: Sec-Purpose (a list: "prefetch", "prefetch;prerender"), and
# the older Purpose / X-Purpose (Chrome, Safari: "prefetch", "preview") and X-Moz (Firefox).
_PREFETCH_HEADERS: Final = ("sec-purpose", "purpose", "x-purpose", "x-moz")
_PREFETCH_PURPOSES: Final = frozenset({"prefetch", "prerender", "preview"})


def new_token() -> str:
    """A fresh, unguessable link token (16 URL-safe characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def is_token(text: str) -> bool:
    """Whether `text` has a token's shape (anything else is answered 404 unread)."""
    return _TOKEN.fullmatch(text) is not None


def find_urls(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of the http(s) URLs in a message that could be a link's
    target; trailing punctuation, unbalanced closing brackets and what follows an emoji
    stay outside."""
    spans: list[tuple[int, int]] = []
    match = _URL_IN_TEXT.search(text)
    while match is not None:
        start = match.start()
        end = start + len(_trim(_cut(match.group())))  # past the scheme: always > start
        if target_url_problem(text[start:end]) is None:
            spans.append((start, end))
        # From the URL's end, not the match's: another URL may follow an emoji at once.
        match = _URL_IN_TEXT.search(text, end)
    return spans


def rewrite_urls(text: str, replace: Callable[[str], str]) -> str:
    """`text` with each URL `find_urls` finds replaced by `replace(url)`."""
    parts: list[str] = []
    done = 0
    for start, end in find_urls(text):
        parts += [text[done:start], replace(text[start:end])]
        done = end
    parts.append(text[done:])
    return "".join(parts)


def _cut(url: str) -> str:
    """`url` up to the first character no one types in a URL but many type after one:
    emoji and other symbols (with their joiners and variation selectors) and punctuation
    outside ASCII (``。``, ``」``, ``»``). Letters, digits and accents of any script stay
    (``/promoção``)."""
    for index, char in enumerate(url):
        if not char.isascii() and not _is_word_char(char):
            return url[:index]
    return url


def _is_word_char(char: str) -> bool:
    category = unicodedata.category(char)
    if category in ("Mn", "Mc"):  # accents, but not an emoji's variation selector
        return not ("\ufe00" <= char <= "\ufe0f" or "\U000e0100" <= char <= "\U000e01ef")
    return category[0] in ("L", "N")


def _trim(url: str) -> str:
    """`url` without what ends the sentence around it: punctuation, format marks, and a
    closing bracket it did not open (a Wikipedia ``/Foo_(bar)`` keeps its own)."""
    while url:
        last = url[-1]
        opener = _OPENERS.get(last)
        if last in _TRAILING or (opener is not None and url.count(last) > url.count(opener)):
            url = url[:-1]
        else:
            break
    return url


def is_preview_fetcher(user_agent: str | None) -> bool:
    """Whether the request comes from a chat app's link-preview fetcher, not a person."""
    agent = (user_agent or "").strip().lower()
    return agent.startswith(_PREVIEW_PREFIXES) or any(m in agent for m in _PREVIEW_MARKERS)


def is_prefetch(headers: Mapping[str, str]) -> bool:
    """Whether the request is a browser's prefetch or prerender, not the person opening the
    link (`headers` looked up by lowercase name, as Starlette's are)."""
    for name in _PREFETCH_HEADERS:
        value = headers.get(name)
        if value and _PREFETCH_PURPOSES.intersection(
            token.strip().lower() for token in re.split(r"[,;]", value)
        ):
            return True
    return False


def click_event(
    *,
    account_id: UUID,
    contact_id: UUID,
    link_id: UUID,
    url: str,
    campaign: str | None,
    automation_execution_id: UUID | None,
    user_agent: str | None,
    now: datetime,
) -> EmitEvent:
    """Link Clicked for one click at `now`: once per link and second (a double-fired
    request is one click; two clicks a second apart are two)."""
    properties = {
        "url": url,
        "link_id": str(link_id),
        "campaign": campaign,
        "user_agent": None if user_agent is None else user_agent[:MAX_USER_AGENT],
    }
    if automation_execution_id is not None:
        properties["automation_execution_id"] = str(automation_execution_id)
    return EmitEvent(
        account_id=account_id,
        contact_id=contact_id,
        metric_name=METRIC_LINK_CLICKED,
        source=SOURCE,
        source_id=f"{link_id}:{int(now.timestamp())}",
        entity_type="link",
        entity_id=str(link_id),
        occurred_at=now,
        # The step that made the link is a property, not the event's execution: a click is
        # the person's act, and it must be able to trigger automations.
        properties=properties,
    )
