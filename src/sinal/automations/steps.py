"""Running automation steps: the outside world (WhatsApp Cloud API, AI, webhooks) and the
contact's own data (tags, conversations). Each runner returns a `StepOutcome`; the
dispatcher records it.

Failures are sorted by what happened, then by whether sending again is safe:

- `StepFailed(retry=True)`: definitely not done, and may work later: no connection could be
  made (refused, a name that does not resolve), or the server refused it for now (408,
  429, and the WhatsApp API's rate limits: `sinal.integrations.whatsapp_api`; for a
  webhook, 409 too: its receiver is still processing a request with the same
  Idempotency-Key, `_webhook_refused`). A `Retry-After` on such an answer (and on a 5xx a
  webhook or the AI endpoint retries) rides along as `retry_after`, which the dispatcher
  honours within its retry policy's bounds (`backoff.honour_retry_after`).
- `StepFailed(retry=False)`: refused, and will be again as configured (no WhatsApp
  connection, a 4xx such as an undeliverable message or an expired token).
- `OutcomeUnknown`: the request left and no answer says what became of it: no answer in
  time, the connection broken off, a 5xx (the server failed, maybe after acting). A
  WhatsApp send is never repeated on it, since the Cloud API has no idempotency key: the
  execution stops as `unknown`, for an operator to check and revive. A webhook carries its
  `Idempotency-Key`, and `ai_respond`'s question to the AI endpoint is harmless to ask
  again: both are retried (`StepFailed(retry=True)`); only a send to WhatsApp is unknown.

Whatever else goes wrong in a step (a host name IDNA refuses, a header value that is not
ASCII, a database error, a bug) happened before its request could leave, or `_post` says
otherwise: `run_step` raises it as `StepFailed(retry=True)`, an attempt like any other;
but the database refusing what a step records (`UnstorableInput`: a tag with its event,
say) fails alike on every attempt, and is `StepFailed(retry=False)`. A schema fault
(`SchemaViolation`: sinal's own statement refused, a schema changed under it) stays
retried: an operator's migration or fix makes the next attempt pass. A configuration one
(`StoreMisconfigured`: a privilege sinal's role lacks, a file it cannot write) is raised
as it is: the dispatcher leaves the step pending, not counted as an attempt, until the
operator's grant or fix lets it pass. A step's own event
(a send's Message Sent, recorded with the step's outcome) the database refuses fails
nothing: the step is recorded completed, and the event kept as a rejection
(`AutomationStore.finish_steps`).

Sending steps with ``track_links`` replace the URLs of their text with tracked short links
before the send, through the context's `links` (`sinal.links.StepLinks`): keyed by
(execution, step, URL), so a step run again after a failed send sends the same ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, Literal, Protocol
from urllib.parse import urlsplit
from uuid import UUID

import httpx
import orjson

from sinal import catalog as c
from sinal.automations.backoff import parse_retry_after
from sinal.automations.matching import ContactData, evaluate_filters, template_context
from sinal.automations.model import (
    AddTag,
    AiRespond,
    CloseConversation,
    FilterStep,
    RemoveTag,
    SendMessage,
    SendTemplate,
    Step,
    Wait,
    Webhook,
    signing_key,
)
from sinal.automations.templates import render_text, render_value
from sinal.errors import (
    ConfigurationError,
    InvalidLink,
    RetryLater,
    SecretUnreadable,
    SinalError,
    StoreError,
    StoreMisconfigured,
    UnstorableInput,
)
from sinal.events import EmitEvent, build_unique_event_id, decimal_text, stamp
from sinal.integrations.links import rewrite_urls
from sinal.integrations.whatsapp import sent_callback_data
from sinal.integrations.whatsapp_api import read_refusal
from sinal.keyring import (
    Keyring,
    SealedSecret,
    open_value,
    webhook_header_place,
    webhook_secret_place,
)
from sinal.store.automations import Claim, Execution, Integration

log = logging.getLogger("sinal.steps")

DEFAULT_WHATSAPP_API = "https://graph.facebook.com/v21.0"

# Steps whose side effect happens outside sinal and cannot be repeated safely.
EXTERNAL_SENDS = frozenset({"send_message", "send_template", "ai_respond"})
# Bytes of an answer read at most. WhatsApp's and the AI endpoint's are far smaller, and a
# webhook's is only quoted when it refuses: no server fills a worker's memory.
MAX_ANSWER: Final = 1024 * 1024


class StepFailed(SinalError):
    """The step did not happen; `retry` says whether trying again can help, and
    `retry_after` (seconds) how long the server asked to wait first, if it did."""

    def __init__(self, message: str, *, retry: bool, retry_after: float | None = None) -> None:
        self.retry = retry
        self.retry_after = retry_after
        super().__init__(message)


class OutcomeUnknown(SinalError):
    """The request left, no answer came: the side effect may or may not have happened.
    `retry_after`: the seconds a 5xx's `Retry-After` asked to wait, if it did."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        self.retry_after = retry_after
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What a step did: its result, the event it emits, and how the execution goes on."""

    result: dict[str, Any] = field(default_factory=dict)
    emit: EmitEvent | None = None
    event_id: UUID | None = None  # the event the step recorded with its change, if not `emit`
    control: Literal["continue", "wait", "stop"] = "continue"
    resume_at: datetime | None = None
    reason: str | None = None


class LinkMaker(Protocol):
    """Makes the tracked links of a step's message (`sinal.links.StepLinks`)."""

    def __call__(
        self, execution: Execution, step_index: int, url: str, campaign: str | None
    ) -> str:
        """The short URL standing for `url` in the step's message, the same on every run;
        raises `ConfigurationError`, `InvalidLink` or `StoreError`."""
        ...


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a runner may use."""

    claim: Claim
    index: int
    now: datetime
    http: httpx.Client
    # kind -> the account's live connections of that kind, oldest first
    integrations: Callable[[str], Sequence[Integration]]
    change_tag: Callable[[str, bool, EmitEvent], None]  # (tag, add, event) in one transaction
    # (key, event of closing conversation <id>) -> (its id, the event's id), or None when
    # none was open: the close and its event in one transaction, once per key
    close_conversation: Callable[
        [str, Callable[[UUID], EmitEvent]], tuple[UUID, UUID | None] | None
    ]
    # the phone_number_id of the business number the contact last wrote to, or None
    inbound_number: Callable[[], str | None] = lambda: None
    allow_private_webhooks: bool = False
    links: LinkMaker | None = None  # None: steps with track_links fail (not retried)
    keyring: Keyring | None = None  # opens the sealed signing secrets of webhook steps

    @property
    def template_data(self) -> dict[str, object]:
        """The event and contact, as templates see them."""
        return template_context(self.claim.event, self.contact_view)

    @property
    def contact_view(self) -> ContactData:
        """The contact as filters and templates see it."""
        contact = self.claim.contact
        return ContactData(
            id=contact.id, name=contact.name, email=contact.email, phone=contact.phone,
            tags=self.claim.tags,
        )  # fmt: skip

    def event(self, metric: str, *, entity_type: str, key: str = "", **fields: Any) -> EmitEvent:
        """An event emitted by this step: source `automation`, carrying the execution, with a
        unique id per (execution, step[, key]) so a resumed step never records it twice."""
        e = self.claim.execution
        return EmitEvent(
            account_id=e.account_id,
            contact_id=e.contact_id,
            metric_name=metric,
            source="automation",
            source_id=self._source_id(key),
            entity_type=entity_type,
            automation_execution_id=e.id,
            properties={
                "automation_id": str(e.automation_id),
                "automation_execution_id": str(e.id),
                "trigger_event_id": str(e.event_id),
                **fields.pop("properties", {}),
            },
            **fields,
        )

    def event_key(self, entity_type: str, key: str = "") -> str:
        """The `unique_event_id` of the step's `event` of this entity type (and key)."""
        return build_unique_event_id("automation", entity_type, self._source_id(key))

    def _source_id(self, key: str) -> str:
        suffix = f":{key}" if key else ""
        return f"{self.claim.execution.id}:{self.index}{suffix}"


def run_step(step: Step, ctx: StepContext) -> StepOutcome:
    """Run one step; raises `StepFailed`, `OutcomeUnknown` or `RetryLater`, whatever failed."""
    runner = _RUNNERS[step.type]
    try:
        return runner(step, ctx)
    except (StepFailed, OutcomeUnknown, RetryLater):
        raise
    except SecretUnreadable as exc:  # SINAL_SECRET_KEYS lacks a key: retried, may be fixed
        raise StepFailed(str(exc), retry=True) from exc
    except UnstorableInput as exc:
        # The database refused what the step writes with its event (a tag and its Tag
        # Added, a close and its Conversation Closed, in one transaction): nothing was
        # written, and would not be on any attempt. Dead, saying why, for an operator to
        # fix the cause and revive it (`retry_dead`).
        raise StepFailed(f"the database refused what the step records: {exc}",
                         retry=False) from exc  # fmt: skip
    except StoreMisconfigured:
        # A privilege sinal's role lacks, a file it cannot write: nothing was written, and
        # no attempt passes until the operator's fix. Not an attempt: the dispatcher
        # leaves the step pending, its attempts as they were, so that no execution ends
        # dead for an operator's REVOKE (`Dispatcher._wait_for_operator`).
        raise
    # A `SchemaViolation` (sinal's own statement refused: a trigger or column changed
    # under it, a migration missing) is left to the branch below on purpose,
    # retried with backoff: the input is fine and the cause is the database's, which an
    # operator fixes once for every execution (a migration, a grant), each then going on
    # at its next attempt without a revival; the attempt wrote nothing (the change and its
    # event commit together), the traceback is logged for the bug it may be, and the
    # policy's attempts still end it dead should nobody fix it.
    except Exception as exc:  # before any request left: `_post` sorts what happens after
        log.warning("step %d of execution %s failed unexpectedly", ctx.index,
                    ctx.claim.execution.id, exc_info=True)  # fmt: skip
        raise StepFailed(f"the step failed: {_describe(exc)}", retry=True) from exc


def _send_message(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, SendMessage)
    text = render_text(step.text, ctx.template_data)
    if not text.strip():
        raise StepFailed("the message rendered empty", retry=False)
    links = _Links(ctx, step.track_links, step.campaign)
    text = links.track(text)
    payload = {"type": "text", "text": {"preview_url": False, "body": text}}
    sent = _whatsapp_send(ctx, payload, number=step.phone_number_id)
    return StepOutcome(
        result={**sent.result(), "text": text, **links.result()},
        emit=ctx.event(c.METRIC_MESSAGE_SENT, entity_type="message", entity_id=sent.wamid,
                       properties={**sent.properties(), "text": text}),
    )  # fmt: skip


def _send_template(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, SendTemplate)
    data = ctx.template_data
    rendered = render_value(list(step.components), data)
    components: list[Any] = list(rendered) if isinstance(rendered, list) else []
    links = _Links(ctx, step.track_links, step.campaign)
    if step.parameters:
        texts = [links.track(render_text(p, data)) for p in step.parameters]
        components.append({"type": "body", "parameters": [{"type": "text", "text": t}
                                                          for t in texts]})  # fmt: skip
    template: dict[str, Any] = {"name": step.name, "language": {"code": step.language}}
    if components:
        template["components"] = components
    sent = _whatsapp_send(ctx, {"type": "template", "template": template}, is_template=True,
                          number=step.phone_number_id)  # fmt: skip
    return StepOutcome(
        result={**sent.result(), "template": step.name, **links.result()},
        emit=ctx.event(c.METRIC_TEMPLATE_SENT, entity_type="message", entity_id=sent.wamid,
                       properties={**sent.properties(), "template_name": step.name,
                                   "language": step.language}),
    )  # fmt: skip


def _ai_respond(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, AiRespond)
    ai = next(iter(ctx.integrations("ai")), None)
    if ai is None:
        raise StepFailed("the account has no AI connection (POST /v1/integrations)", retry=False)
    links = _Links(ctx, step.track_links, step.campaign)
    data = ctx.template_data
    question = render_text(step.prompt, data) if step.prompt else _event_text(ctx)
    messages = [{"role": "user", "content": question}]
    if step.system_prompt:
        messages.insert(0, {"role": "system", "content": render_text(step.system_prompt, data)})
    body: dict[str, Any] = {"model": ai.settings.get("model"), "messages": messages}
    if step.max_tokens:
        body["max_tokens"] = step.max_tokens
    base = str(ai.settings.get("base_url", "")).rstrip("/")
    try:
        answer = _post_json(ctx, f"{base}/chat/completions", body, ai.secrets.get("api_key"))
    except OutcomeUnknown as exc:  # a question, not a send: nothing went to the contact
        raise StepFailed(str(exc), retry=True, retry_after=exc.retry_after) from exc
    try:
        # a NUL shows nothing to the contact, and no event may hold one
        reply = str(answer["choices"][0]["message"]["content"]).replace("\x00", "").strip()
    except (KeyError, IndexError, TypeError) as exc:
        raise StepFailed("the AI endpoint answered without choices[0].message", retry=True) from exc
    if not reply:
        raise StepFailed("the AI endpoint answered with an empty message", retry=True)
    # the AI call is harmless to repeat; from here on the send is the side effect
    reply = links.track(reply)
    payload = {"type": "text", "text": {"preview_url": False, "body": reply}}
    sent = _whatsapp_send(ctx, payload, number=step.phone_number_id)
    return StepOutcome(
        result={**sent.result(), "text": reply, "model": ai.settings.get("model"),
                **links.result()},
        emit=ctx.event(c.METRIC_AI_RESPONSE_SENT, entity_type="message", entity_id=sent.wamid,
                       properties={**sent.properties(), "text": reply}),
    )  # fmt: skip


def _tag(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, AddTag | RemoveTag)
    add = isinstance(step, AddTag)
    metric = c.METRIC_TAG_ADDED if add else c.METRIC_TAG_REMOVED
    event = ctx.event(metric, entity_type="tag", entity_id=step.tag, key=step.tag,
                      properties={"tag": step.tag})  # fmt: skip
    ctx.change_tag(step.tag, add, event)  # the tag and its event commit together
    return StepOutcome(result={"tag": step.tag, "added" if add else "removed": True})


def _close_conversation(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, CloseConversation)

    def closed(conversation_id: UUID) -> EmitEvent:
        return ctx.event(c.METRIC_CONVERSATION_CLOSED, entity_type="conversation",
                         entity_id=str(conversation_id),
                         properties={"conversation_id": str(conversation_id)})  # fmt: skip

    # The close and its event commit together, once per step: run again (its worker died
    # before the step's record), the step finds the conversation it closed.
    found = ctx.close_conversation(ctx.event_key("conversation"), closed)
    if found is None:
        return StepOutcome(result={"closed": None})
    conversation_id, event_id = found
    return StepOutcome(result={"closed": str(conversation_id)}, event_id=event_id)


def _webhook(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, Webhook)
    # Checked once, and the connection goes to an address checked: a second lookup by httpx
    # could answer otherwise (DNS rebinding) and reach an internal service.
    addresses = None if ctx.allow_private_webhooks else refuse_private_target(step.url)
    e = ctx.claim.execution
    event = ctx.claim.event
    body = {
        "automation_id": str(e.automation_id),
        "execution_id": str(e.id),
        "event": {
            "id": str(event.id), "metric": event.metric_name, "contact_id": str(event.contact_id),
            "value": None if event.value is None else decimal_text(event.value),
            "currency": event.currency, "source": event.source,
            "occurred_at": stamp(event.occurred_at), "properties": event.properties,
        },
    }  # fmt: skip
    # The receiver dedupes on the key, which is what makes resending safe: after a crash,
    # and after a request that may or may not have arrived. Names are case-insensitive:
    # the step's own `idempotency-key` would go out beside this one.
    headers = httpx.Headers(_opened_headers(step, ctx))
    key = f"{e.id}:{ctx.index}"
    headers["Idempotency-Key"] = key
    content = orjson.dumps(body)
    secret = _opened_secret(step, ctx)
    if secret is not None:
        headers.update(sign_webhook(signing_key(secret), key, int(time.time()), content))
    try:
        answer = _post(ctx, step.url, content, headers, addresses, refused=_webhook_refused)
    except OutcomeUnknown as exc:
        raise StepFailed(f"{exc}; sent again with the same Idempotency-Key", retry=True,
                         retry_after=exc.retry_after) from exc  # fmt: skip
    status = answer.status_code
    if 300 <= status < 400:
        # not followed: where it points was never checked (a private address, say)
        raise StepFailed(
            f"{_host(step.url)} answered {status}, a redirect, which webhooks do not follow; "
            "give the step the URL it points to",
            retry=False,
        )
    return StepOutcome(result={"status": status})


def _opened_secret(step: Webhook, ctx: StepContext) -> str | None:
    """The step's signing secret, opened if it is stored sealed (`SecretUnreadable` when
    no key of the ring opens it: the step fails, retried, before anything is sent)."""
    automation = ctx.claim.automation
    place = webhook_secret_place(automation.account_id, automation.id)
    return None if step.secret is None else _opened(step.secret, ctx, place)


def _opened_headers(step: Webhook, ctx: StepContext) -> dict[str, str]:
    """The step's headers, each value opened if it is stored sealed (as the secret is)."""
    a = ctx.claim.automation
    return {name: _opened(value, ctx, webhook_header_place(a.account_id, a.id, name))
            for name, value in step.headers}  # fmt: skip


def _opened(value: str | SealedSecret, ctx: StepContext, place: str) -> str:
    """A value of a step as given (stored in plaintext), or opened for `place`."""
    if isinstance(value, str):
        return value
    return str(open_value(ctx.keyring, value.as_dict(), place))


def _webhook_refused(answer: _Answer, url: str) -> StepFailed:
    """A 4xx from a webhook's receiver: as from anyone (`_refused`), but for 409 Conflict.
    Sent with an Idempotency-Key, a 409 means a request with that key is still being
    processed (the IETF Idempotency-Key draft, Stripe): an earlier attempt, which timed out
    here, is running there. Its outcome is the receiver's to tell, so the same request is
    sent again later, and a receiver done with it answers as it did the first time."""
    if answer.status_code == 409:
        return StepFailed(
            f"{_host(url)} answered 409 Conflict: a request with this Idempotency-Key is still "
            "being processed there; sent again later with the same key" + _asked(answer),
            retry=True,
            retry_after=answer.retry_after,
        )
    return _refused(answer, url)


def sign_webhook(key: bytes, message_id: str, timestamp: int, content: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of a request whose body is `content`: `webhook-id`
    (the Idempotency-Key, the same on every attempt), `webhook-timestamp` (Unix seconds of
    this attempt, by the wall clock the receiver compares it with) and `webhook-signature`,
    `v1,` and the base64 of the HMAC-SHA256, keyed by the secret's bytes, of
    `{id}.{timestamp}.{body}`."""
    signed = f"{message_id}.{timestamp}.".encode() + content
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode("ascii"),
    }


def _wait(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, Wait)
    until = step.until or ctx.now + timedelta(seconds=step.seconds or 0)
    return StepOutcome(result={"until": stamp(until)}, control="wait", resume_at=until)


def _filter(step: Any, ctx: StepContext) -> StepOutcome:
    assert isinstance(step, FilterStep)
    verdict = evaluate_filters(step.conditions, ctx.claim.event, ctx.contact_view)
    if verdict.matched:
        return StepOutcome(result={"matched": True})
    return StepOutcome(result={"matched": False}, control="stop", reason=verdict.message)


_RUNNERS: Mapping[str, Callable[[Any, StepContext], StepOutcome]] = {
    "send_message": _send_message,
    "send_template": _send_template,
    "ai_respond": _ai_respond,
    "add_tag": _tag,
    "remove_tag": _tag,
    "close_conversation": _close_conversation,
    "webhook": _webhook,
    "wait": _wait,
    "filter": _filter,
}


class _Links:
    """A sending step's tracked links: `track` swaps the URLs of a text for short links
    (when the step tracks them); `result` lists what it made, for the step's record."""

    def __init__(self, ctx: StepContext, enabled: bool, campaign: str | None) -> None:
        if enabled and ctx.links is None:
            raise StepFailed("this worker cannot make tracked links (track_links)", retry=False)
        self.ctx = ctx
        self.enabled = enabled
        self.campaign = campaign or ctx.claim.automation.name
        self.made: dict[str, str] = {}  # url -> short URL

    def track(self, text: str) -> str:
        """`text`, its http(s) URLs replaced by tracked short links when the step asks."""
        return rewrite_urls(text, self._short) if self.enabled else text

    def result(self) -> dict[str, Any]:
        """The links made, as the step's result shows them."""
        if not self.made:
            return {}
        return {"links": [{"url": url, "short_url": short} for url, short in self.made.items()]}

    def _short(self, url: str) -> str:
        assert self.ctx.links is not None
        try:
            short = self.ctx.links(self.ctx.claim.execution, self.ctx.index, url, self.campaign)
        except StoreError as exc:  # nothing was sent yet: trying again is safe
            raise StepFailed(f"could not record a tracked link: {exc}", retry=True) from exc
        except (ConfigurationError, InvalidLink) as exc:
            raise StepFailed(f"could not make a tracked link: {exc}", retry=False) from exc
        if short != url:
            self.made[url] = short
        return short


@dataclass(frozen=True, slots=True)
class _Sent:
    """A WhatsApp message the Cloud API took: its wamid, the contact's phone it went to and
    the business number it went out from."""

    wamid: str
    phone: str
    phone_number_id: str

    def result(self) -> dict[str, Any]:
        """The step's result."""
        return {"wamid": self.wamid, "phone_number_id": self.phone_number_id}

    def properties(self) -> dict[str, Any]:
        """The send event's properties."""
        return {"phone": self.phone, "wa_message_id": self.wamid,
                "phone_number_id": self.phone_number_id}  # fmt: skip


def _whatsapp_sender(ctx: StepContext, chosen: str | None) -> Integration:
    """The WhatsApp connection a message to the contact goes out through: the number the
    contact last wrote to (a WhatsApp conversation is per business number, and a free-form
    message is refused outside that number's 24-hour window), else the step's
    `phone_number_id` (`chosen`), else the account's oldest connection."""
    connections = ctx.integrations("whatsapp")
    if not connections:
        raise StepFailed("the account has no WhatsApp connection (POST /v1/integrations)",
                         retry=False)  # fmt: skip
    numbers: dict[str, Integration] = {}
    for wa in connections:  # oldest first: a number connected twice is its oldest's
        numbers.setdefault(str(wa.settings.get("phone_number_id")), wa)
    if len(connections) > 1 or chosen is not None:  # one number: nothing to choose
        talked_to = ctx.inbound_number()
        if talked_to is not None and talked_to in numbers:
            return numbers[talked_to]
    if chosen is None:
        return connections[0]
    if chosen in numbers:
        return numbers[chosen]
    raise StepFailed(
        f"the step's phone_number_id {chosen} is none of the account's WhatsApp connections "
        "(disconnected since the automation was saved?), and the contact has written to "
        "none of them",
        retry=False,
    )


def _whatsapp_send(
    ctx: StepContext,
    message: dict[str, Any],
    *,
    is_template: bool = False,
    number: str | None = None,
) -> _Sent:
    """POST {api_base_url}/{phone_number_id}/messages through `_whatsapp_sender`'s
    connection (`number`: the step's choice); what the API took.

    The message carries callback data naming the contact, its kind, the automation and the
    execution: Meta echoes it in the message's statuses, which may arrive before this
    step's send event is recorded."""
    wa = _whatsapp_sender(ctx, number)
    phone = ctx.claim.contact.phone
    if not phone:
        raise StepFailed("the contact has no phone number", retry=False)
    base = str(wa.settings.get("api_base_url") or DEFAULT_WHATSAPP_API).rstrip("/")
    sender = str(wa.settings.get("phone_number_id"))
    url = f"{base}/{sender}/messages"
    e = ctx.claim.execution
    callback = sent_callback_data(e.contact_id, is_template=is_template,
                                  sent_by=(e.automation_id, e.id))  # fmt: skip
    body = {"messaging_product": "whatsapp", "recipient_type": "individual",
            "to": phone.lstrip("+"), **message, "biz_opaque_callback_data": callback}  # fmt: skip
    # Meta's own API (the default) is no address of the account's choosing: not looked up
    is_meta = base == DEFAULT_WHATSAPP_API
    token = wa.secrets.get("access_token")
    try:
        answer = _post_json(ctx, url, body, token, is_trusted=is_meta, refused=_whatsapp_refused)
    except OutcomeUnknown as exc:  # the Cloud API has no idempotency key to resend with
        raise OutcomeUnknown(f"{exc}; not sent again, so the contact gets no duplicate") from exc
    try:
        return _Sent(str(answer["messages"][0]["id"]), phone, sender)
    except (KeyError, IndexError, TypeError) as exc:
        # a 2xx without a message id: it may have been accepted; do not send again blindly
        raise OutcomeUnknown("the WhatsApp API answered without messages[0].id") from exc


def _post_json(
    ctx: StepContext,
    url: str,
    body: dict[str, Any],
    token: Any,
    *,
    is_trusted: bool = False,
    refused: _Refusal | None = None,
) -> Any:
    """POST `body` to a connection's URL, its answer parsed. The account sets a connection's
    base URL as it sets a webhook's: unless `is_trusted`, it is checked alike as the request
    leaves (`refuse_private_target`), and a new connection goes to the address checked.
    A 4xx answer becomes `refused`'s `StepFailed` (by default, `_refused`'s)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    addresses = None
    if not (is_trusted or ctx.allow_private_webhooks):
        addresses = refuse_private_target(url)
    answer = _post(ctx, url, orjson.dumps(body), headers, addresses, refused=refused)
    if not answer.complete:
        raise OutcomeUnknown(
            f"{url} answered {answer.status_code} with more than {MAX_ANSWER} bytes, or too "
            "slowly; it was not read"
        )
    try:
        return orjson.loads(answer.content)
    except orjson.JSONDecodeError as exc:
        raise OutcomeUnknown(f"{url} answered {answer.status_code} with no JSON") from exc


@dataclass(frozen=True, slots=True)
class _Answer:
    """A response's status and the start of its body."""

    status_code: int
    content: bytes  # at most `MAX_ANSWER` bytes
    encoding: str
    complete: bool  # the whole body, read in the time it had
    retry_after: float | None = None  # seconds its Retry-After asks to wait (None: none)

    @property
    def text(self) -> str:
        """The body read, as text."""
        return self.content.decode(self.encoding, "replace")


# Makes the `StepFailed` of a 4xx answer from a URL: whether trying again can help.
_Refusal = Callable[[_Answer, str], StepFailed]


def _read(response: httpx.Response, seconds: float | None, now: datetime) -> _Answer:
    """The status, `Retry-After` (from `now`) and up to `MAX_ANSWER` bytes of the body,
    read for at most `seconds`: the client's timeout bounds each read, not their sum, and a
    server trickling its answer would hold the step (and a worker's thread) as long as it
    liked."""
    deadline = None if seconds is None else time.monotonic() + seconds
    body = bytearray()
    complete = True
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > MAX_ANSWER or (deadline is not None and time.monotonic() > deadline):
            complete = False
            break
    retry_after = parse_retry_after(response.headers.get("Retry-After"), now)
    return _Answer(response.status_code, bytes(body[:MAX_ANSWER]), response.encoding or "utf-8",
                   complete, retry_after)  # fmt: skip


def _post(
    ctx: StepContext,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    addresses: Sequence[str] | None = None,
    *,
    refused: _Refusal | None = None,
) -> _Answer:
    """POST, sorting every failure by whether the request may have been delivered; with
    `addresses`, a new connection goes to the first of them (see `_NewConnectionGate`).
    The answer is read up to `MAX_ANSWER` bytes, for at most the timeout once it began.
    A 5xx is `OutcomeUnknown`; a 4xx, `refused`'s `StepFailed` (by default, `_refused`'s)."""
    gate = _NewConnectionGate(url, ctx.http.timeout.connect, addresses)
    sent = httpx.Headers({"Content-Type": "application/json"})
    sent.update(headers)  # case-insensitively: a `content-type` given replaces ours
    try:
        with ctx.http.stream(
            "POST", url, content=content, headers=sent, extensions={"trace": gate.trace}
        ) as response:
            answer = _read(response, ctx.http.timeout.read, ctx.now)
    except StepFailed:  # the gate refused the address connected to, before anything was sent
        raise
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise StepFailed(f"could not connect to {_host(url)}: {exc}", retry=True) from exc
    except httpx.TimeoutException as exc:
        raise OutcomeUnknown(f"{_host(url)} did not answer in time ({exc})") from exc
    except httpx.HTTPError as exc:
        raise OutcomeUnknown(f"the request to {_host(url)} broke off: {exc}") from exc
    except Exception as exc:  # not httpx's own: a host IDNA refuses, a header not ASCII, ...
        host, what = _host(url), _describe(exc)
        if gate.may_have_left:
            raise OutcomeUnknown(f"the request to {host} broke off: {what}") from exc
        raise StepFailed(f"could not send to {host}: {what}", retry=True) from exc
    finally:
        gate.release()
    if answer.status_code >= 500:
        # the server failed while handling the request: maybe before it acted, maybe after
        said = answer.text[:300].strip()
        raise OutcomeUnknown(
            f"{_host(url)} answered {answer.status_code}, a server error: the request may or "
            "may not have been carried out" + (f": {said}" if said else "") + _asked(answer),
            retry_after=answer.retry_after,
        )
    if answer.status_code >= 400:
        raise (refused or _refused)(answer, url)
    return answer


def _refused(answer: _Answer, url: str) -> StepFailed:
    """A 4xx from anyone: 408 (the server, or its proxy, gave up waiting for the request)
    and 429 say "not now" (and maybe for how long: `Retry-After`); the rest, "not like
    this"."""
    if answer.status_code in (408, 429):
        return StepFailed(f"{_host(url)} answered {answer.status_code}" + _asked(answer),
                          retry=True, retry_after=answer.retry_after)  # fmt: skip
    return StepFailed(
        f"{_host(url)} refused the request ({answer.status_code}): {answer.text[:300]}",
        retry=False,
    )


def _asked(answer: _Answer) -> str:
    """What an answer's `Retry-After` asked, for a step's error ("" when it has none)."""
    if answer.retry_after is None:
        return ""
    return f" (Retry-After: {answer.retry_after:.0f} s)"


def _whatsapp_refused(answer: _Answer, url: str) -> StepFailed:
    """A 4xx from the WhatsApp Cloud API: no message left; Meta's error code says whether
    one may leave later (a rate limit) or will be refused again (an undeliverable message,
    an expired token)."""
    refusal = read_refusal(answer.status_code, answer.content)
    if refusal.is_temporary:
        return StepFailed(f"{_host(url)} refused the message for now {refusal}", retry=True)
    return StepFailed(f"{_host(url)} refused the message {refusal}", retry=False)


class _NewConnectionGate:
    """A process opens new connections to one host one at a time.

    The worker runs many steps at once. Requests on kept-alive connections go out in
    parallel, but a request that opens a connection holds its host's turn until the answer
    begins (the server has accepted it). A server that closes every connection (HTTP/1.0,
    small servers with a listen backlog of 5) is then never flooded with parallel connects:
    past its backlog those stall a second on SYN retries and, now and then, come back as
    resets after the request left — which a send has to count as "may have been sent".

    Given `addresses` (a webhook's, checked by `refuse_private_target`), the gate also pins
    a new connection to the first of them: httpcore passes its `connect_tcp` arguments to
    the trace hook and then connects with them, so the hook swaps the host name for the
    address. The URL, its pool key, the Host header and TLS (SNI and the certificate) keep
    the name, so a kept-alive connection only serves the name it was verified for. Should
    httpcore ever stop honouring the swap, the peer is checked once the connection is made,
    before a byte is sent, and anything unchecked is refused. A connection to a proxy
    (HTTPS_PROXY) is left alone: the proxy resolves the name, and has to refuse for itself.
    """

    _turns: ClassVar[dict[str, threading.Lock]] = {}
    _turns_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self, url: str, timeout: float | None, addresses: Sequence[str] | None = None
    ) -> None:
        parts = urlsplit(url)
        self._key = f"{parts.scheme}://{parts.netloc}"
        self._host = parts.hostname or ""
        self._addresses = addresses
        # the host as httpcore connects to it (IDNA-encoded): a connection elsewhere is to a
        # proxy, which resolves the name itself and is left alone
        self._raw_host = "" if addresses is None else httpx.URL(url).raw_host.decode("ascii")
        self._pinned = False
        self._timeout = -1 if timeout is None else timeout
        self._held: threading.Lock | None = None
        self.may_have_left = False  # the request began to be written

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: take the turn at connect (pinning it to the addresses
        checked, when given), give it back at the answer; note when the request goes out."""
        if event.endswith(".send_request_headers.started"):  # http11. or http2.
            self.may_have_left = True
        elif event == "connection.connect_tcp.started":
            self._pinned = self._addresses is not None and info.get("host") == self._raw_host
            if self._pinned and self._addresses:
                info["host"] = self._addresses[0]  # the very dict httpcore connects with
            with self._turns_lock:
                turn = self._turns.setdefault(self._key, threading.Lock())
            # past the connect timeout, go anyway: the gate is politeness, not a guarantee
            if turn.acquire(timeout=self._timeout):
                self._held = turn
        elif event == "connection.connect_tcp.complete" and self._pinned:
            self._refuse_unchecked_peer(info["return_value"])
        elif event.startswith("http11.receive_response_headers."):
            self.release()

    def _refuse_unchecked_peer(self, stream: Any) -> None:
        assert self._addresses is not None
        peer = ipaddress.ip_address(stream.get_extra_info("server_addr")[0])
        if peer not in {ipaddress.ip_address(a) for a in self._addresses}:
            stream.close()
            raise StepFailed(
                f"{self._host} connected to {peer}, not to an address checked; refused",
                retry=True,
            )

    def release(self) -> None:
        """Give the turn back (idempotent)."""
        held, self._held = self._held, None
        if held is not None:
            held.release()


def refuse_private_target(url: str) -> list[str]:
    """Refuse URLs whose host resolves to a private, loopback, link-local or reserved address
    (webhooks, and the base URLs of WhatsApp and AI connections); the addresses it resolves
    to, every one checked."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except UnicodeError as exc:  # a label empty or over 63 characters: never resolves
        raise StepFailed(f"cannot resolve {host}: {exc}", retry=False) from exc
    except OSError as exc:
        raise StepFailed(f"cannot resolve {host}: {exc}", retry=True) from exc
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not _is_public(address):
            raise StepFailed(
                f"{host} resolves to {address}, a private or local address; requests there "
                "are refused (SINAL_ALLOW_PRIVATE_WEBHOOKS=true allows them)",
                retry=False,
            )
    return [str(info[4][0]) for info in infos]


# IPv6 prefixes that reach IPv4 addresses through a translator: NAT64's well-known prefix
# (the address in the last 32 bits; on AWS it reaches the VPC's private IPv4 addresses), its
# local-use prefix (never global), and IPv4-compatible addresses (deprecated).
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


def _is_public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether `address` is global unicast, and so is the IPv4 address it stands for (an
    IPv6 one reaching IPv4 through NAT64 or 6to4: Python's `is_global` judges the prefix,
    so 64:ff9b::a9fe:a9fe, which reaches 169.254.169.254, is "global")."""
    if not address.is_global or address.is_multicast:
        return False
    if isinstance(address, ipaddress.IPv4Address):
        return True
    if address in _LOCAL_NAT64:
        return False
    if address in _NAT64 or address in _IPV4_COMPATIBLE:
        return _is_public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    embedded = address.ipv4_mapped or address.sixtofour
    return embedded is None or _is_public(embedded)


def _host(url: str) -> str:
    return urlsplit(url).netloc or url


def _describe(exc: Exception) -> str:
    """An unforeseen exception as a step's error: its kind and its message."""
    return f"{type(exc).__name__}: {exc}"


def _event_text(ctx: StepContext) -> str:
    properties = ctx.claim.event.properties
    return str(properties.get("text") or properties.get("caption") or ctx.claim.event.metric_name)
