"""Tracked links: create them (for a contact, a campaign, an automation's message) and
follow them (a redirect to the stored URL, and Link Clicked for the link's contact).

Automation steps with ``track_links`` make theirs through `StepLinks`, the same
`create_link` as ``POST /v1/links``, keyed by (execution, step, URL): a step run again
after a failed send gets the same links back, never a second set.

The rules are pure: tokens, preview fetchers and the click event in
`sinal.integrations.links`, targets (checked as a webhook step's url) in `sinal.urls`. A
click on a link made without a contact is redirected and records nothing: an event needs a
contact, and no later fact could name one for it (a kept rejection could never be
replayed). Recording a click never stands in the way of its redirect: if the store fails,
the click is logged and lost, the person still arrives.
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import replace
from typing import cast
from uuid import UUID, uuid5

from sinal.errors import (
    ConfigurationError,
    ContactNotFound,
    FieldError,
    InvalidLink,
    SinalError,
    StoreError,
)
from sinal.ids import new_id
from sinal.integrations.links import (
    MAX_CAMPAIGN_LENGTH,
    click_event,
    is_preview_fetcher,
    is_token,
    new_token,
)
from sinal.ledger import Ledger
from sinal.store.automations import AutomationStore, Execution
from sinal.store.messaging import Link, MessagingStore
from sinal.urls import target_url_problem, with_ascii_host

__all__ = ["MAX_CAMPAIGN_LENGTH", "StepLinks", "create_link", "follow_link", "short_url"]

log = logging.getLogger("sinal.links")

_TOKEN_ATTEMPTS = 5
# The namespace of the ids of keyed links (uuid5 of account and key).
_KEYED_LINKS = UUID("6f1b3c2e-5a4d-4e8f-9b7a-2c1d0e3f4a5b")


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
    key: str | None = None,
) -> Link:
    """A new tracked link to `url` (absolute http(s)); raises `InvalidLink` naming every
    bad field (a contact or execution of another account is one that does not exist).

    With a `key`, the account's link made with that key before (if any) is returned
    instead of a new one: its id is derived from the key, its token still random."""
    errors: list[FieldError] = []
    problem = target_url_problem(url)
    if problem is not None:  # one code for every bad target, as documented
        errors.append(FieldError("url", "invalid_url", problem.message))
    else:
        url = with_ascii_host(url)  # a look-alike host is kept and shown as "xn--…"
    contact = _contact_id(ledger, account_id, contact_id, errors)
    execution = _execution_id(ledger, account_id, automation_execution_id, errors)
    clean_campaign = _campaign(campaign, errors)
    if errors:
        raise InvalidLink(errors)
    ident = new_id() if key is None else uuid5(_KEYED_LINKS, f"{account_id}:{key}")
    for _ in range(_TOKEN_ATTEMPTS):  # 96 random bits: a second attempt never happens
        link = Link(
            account_id=account_id, id=ident, token=new_token(), url=url, contact_id=contact,
            campaign=clean_campaign, automation_execution_id=execution,
            created_at=ledger.clock(),
        )  # fmt: skip
        try:
            saved = _store(ledger).save_link(link)
        except ContactNotFound:  # erased since it was checked above
            raise InvalidLink([_no_contact(contact_id)]) from None
        if saved is not None:
            return saved
    raise StoreError("no free link token found")


class StepLinks:
    """The tracked links of automation steps' messages (a step's `StepContext.links`): one
    per (execution, step, URL), for the execution's contact, carrying the execution's id
    and the campaign, with short URLs on `base_url` (SINAL_PUBLIC_URL)."""

    def __init__(self, ledger: Ledger, base_url: str) -> None:
        self.ledger = ledger
        self.base_url = base_url.rstrip("/")

    def __call__(
        self, execution: Execution, step_index: int, url: str, campaign: str | None
    ) -> str:
        """The short URL standing for `url` in step `step_index`'s message (the same one
        on every run of the step); raises `ConfigurationError` without a public URL."""
        if not self.base_url:
            raise ConfigurationError(
                "tracked links need SINAL_PUBLIC_URL (the base of their short URLs) on the worker"
            )
        if url.startswith(f"{self.base_url}/l/"):
            return url  # already one of ours: never a link to a link
        link = create_link(
            self.ledger, execution.account_id, url=url, contact_id=execution.contact_id,
            campaign=campaign, automation_execution_id=execution.id,
            key=f"automation:{execution.id}:{step_index}:{url}",
        )  # fmt: skip
        return short_url(self.base_url, link)


def follow_link(
    ledger: Ledger, token: str, *, user_agent: str | None, is_click: bool = True
) -> Link | None:
    """The link a short URL names (None: unknown or malformed token). A click by a person
    (`is_click`, with a User-Agent, not a preview fetcher's) on a link with a contact records
    Link Clicked."""
    if not is_token(token):
        return None
    link = _store(ledger).find_link(token)
    if link is None:
        return None
    # a link kept with its target's host as typed (before it was stored as "xn--…") is
    # redirected, and its clicks recorded, with the host as requested
    link = replace(link, url=with_ascii_host(link.url))
    if link.contact_id is None or not is_click:
        return link
    # Every browser (WhatsApp's and the other apps' in-app ones too) names itself; a request
    # without a User-Agent is a script or a scanner, and must not start click automations.
    if not (user_agent or "").strip() or is_preview_fetcher(user_agent):
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
        errors.append(_no_contact(raw))
        return None
    return ident


def _no_contact(raw: UUID | str | None) -> FieldError:
    return FieldError("contact_id", "not_found", f"no contact {raw}")


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
