"""Tracked links: create them (for a contact, a campaign, an automation's message) and
follow them (a redirect to the stored URL, and Link Clicked for the link's contact).

The rules (tokens, targets, preview fetchers, the click event) are pure, in
`sinal.integrations.links`. A click on a link made without a contact is redirected and
records nothing: an event needs a contact, and no later fact could name one for it (a
kept rejection could never be replayed). Recording a click never stands in the way of its
redirect: if the store fails, the click is logged and lost, the person still arrives.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import cast
from uuid import UUID

from sinal.errors import FieldError, InvalidLink, SinalError, StoreError
from sinal.ids import new_id
from sinal.integrations.links import (
    click_event,
    is_preview_fetcher,
    is_token,
    new_token,
    target_url_problem,
)
from sinal.ledger import Ledger
from sinal.store.automations import AutomationStore
from sinal.store.messaging import Link, MessagingStore

__all__ = ["MAX_CAMPAIGN_LENGTH", "create_link", "follow_link", "short_url"]

log = logging.getLogger("sinal.links")

MAX_CAMPAIGN_LENGTH = 200
_TOKEN_ATTEMPTS = 5


def _store(ledger: Ledger) -> MessagingStore:
    return cast(MessagingStore, ledger.store)


def short_url(base_url: str, link: Link) -> str:
    """The link's short URL under `base_url` (".../l/{token}")."""
    return f"{base_url.rstrip('/')}/l/{link.token}"


def create_link(
    ledger: Ledger,
    account_id: UUID,
    *,
    url: str,
    contact_id: UUID | str | None = None,
    campaign: str | None = None,
    automation_execution_id: UUID | str | None = None,
) -> Link:
    """A new tracked link to `url` (absolute http(s)); raises `InvalidLink` naming every
    bad field (a contact or execution of another account is one that does not exist)."""
    errors: list[FieldError] = []
    problem = target_url_problem(url)
    if problem is not None:
        errors.append(FieldError("url", "invalid_url", problem))
    contact = _contact_id(ledger, account_id, contact_id, errors)
    execution = _execution_id(ledger, account_id, automation_execution_id, errors)
    clean_campaign = _campaign(campaign, errors)
    if errors:
        raise InvalidLink(errors)
    for _ in range(_TOKEN_ATTEMPTS):  # 96 random bits: a second attempt never happens
        link = Link(
            account_id=account_id, id=new_id(), token=new_token(), url=url, contact_id=contact,
            campaign=clean_campaign, automation_execution_id=execution,
            created_at=ledger.clock(),
        )  # fmt: skip
        if _store(ledger).create_link(link):
            return link
    raise StoreError("no free link token found")


def follow_link(
    ledger: Ledger, token: str, *, user_agent: str | None, is_click: bool = True
) -> Link | None:
    """The link a short URL names (None: unknown or malformed token). A click by a person
    (`is_click`, not a preview fetcher) on a link with a contact records Link Clicked."""
    if not is_token(token):
        return None
    link = _store(ledger).find_link(token)
    if link is None or link.contact_id is None or not is_click:
        return link
    if is_preview_fetcher(user_agent):
        return link
    event = click_event(
        account_id=link.account_id, contact_id=link.contact_id, link_id=link.id, url=link.url,
        campaign=link.campaign, automation_execution_id=link.automation_execution_id,
        user_agent=user_agent, now=ledger.clock(),
    )  # fmt: skip
    try:
        ledger.emit(event)
    except SinalError:
        log.exception("recording a click on link %s failed; redirecting anyway", link.id)
    return link


def _contact_id(
    ledger: Ledger, account_id: UUID, raw: UUID | str | None, errors: list[FieldError]
) -> UUID | None:
    if raw is None:
        return None
    ident = _uuid(raw)
    if ident is None or ledger.get_contact(account_id, ident) is None:
        errors.append(FieldError("contact_id", "not_found", f"no contact {raw}"))
        return None
    return ident


def _execution_id(
    ledger: Ledger, account_id: UUID, raw: UUID | str | None, errors: list[FieldError]
) -> UUID | None:
    if raw is None:
        return None
    ident = _uuid(raw)
    store = cast(AutomationStore, ledger.store)
    if ident is None or store.get_execution(account_id, ident) is None:
        errors.append(
            FieldError("automation_execution_id", "not_found", f"no automation execution {raw}")
        )
        return None
    return ident


def _campaign(raw: str | None, errors: list[FieldError]) -> str | None:
    if raw is None:
        return None
    text = " ".join(unicodedata.normalize("NFC", raw).split())
    if len(text) > MAX_CAMPAIGN_LENGTH:
        message = f"campaign is at most {MAX_CAMPAIGN_LENGTH} characters"
        errors.append(FieldError("campaign", "too_long", message))
    elif any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text):
        message = "campaign must not contain control characters"
        errors.append(FieldError("campaign", "control_characters", message))
    return text or None


def _uuid(raw: UUID | str) -> UUID | None:
    if isinstance(raw, UUID):
        return raw
    try:
        return UUID(raw)
    except ValueError:
        return None
