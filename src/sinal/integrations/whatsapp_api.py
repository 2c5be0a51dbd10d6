"""The WhatsApp Cloud API's refusals of a send: for now, or for good. Pure: no I/O.

`POST /{phone_number_id}/messages` answers an error as Graph API errors are written,
``{"error": {"code": 131026, "message": "(#131026) Message undeliverable", "error_data":
{"details": "..."}}}``, and Meta asks clients to act on ``code`` (not on the HTTP status,
nor on the title in ``message``): https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes

A 4xx answer means the API refused the request: no message left. Whether a later attempt
can succeed depends on the code. Throttling and the platform's own passing trouble clear by
themselves: `is_temporary`. Everything else (a malformed or disallowed message, a recipient
who cannot receive it, an expired token, an account restricted or unpaid) fails again
until someone changes the step or the connection. A 5xx is no refusal: the request may
have been carried out before the server failed, whatever its code says, so it is never
read here (the step settles it as `unknown`). The Cloud API has no idempotency key: a
message is sent again only if it certainly was not sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import orjson

__all__ = ["TEMPORARY_CODES", "SendRefusal", "read_refusal"]

# Meta's codes that refuse a message for now, not for good. Meta documents no Retry-After
# (nor another delay) with them: 130429 comes back until the number is within its
# throughput again, so the execution's backoff paces the next attempt.
TEMPORARY_CODES: Final = frozenset(
    {
        4,  # API Too Many Calls: the app's call rate limit
        80007,  # the WhatsApp Business Account's rate limit
        130429,  # Cloud API message throughput reached
        131048,  # spam rate limit: sends from this number restricted for a while
        131056,  # (business, consumer) pair rate limit: too many messages to this contact
        2,  # API Service: downtime or overload
        131000,  # something went wrong: an unknown error, "try again"
        131016,  # service unavailable
        131057,  # the business account is in maintenance mode (a throughput upgrade)
        133004,  # server temporarily unavailable
    }
)
# HTTP statuses that say "not now" whatever the code: the server gave up waiting for the
# request (408), or throttled it (429).
_TEMPORARY_STATUSES: Final = frozenset({408, 429})
# Characters of an answer quoted in a reason, at most.
_QUOTED: Final = 300


@dataclass(frozen=True, slots=True)
class SendRefusal:
    """A 4xx answer to a send: Meta's code (None when the body carries none), what it
    said, and whether trying again later can succeed."""

    status: int
    code: int | None
    reason: str
    is_temporary: bool

    def __str__(self) -> str:
        code = "" if self.code is None else f", error {self.code}"
        return f"({self.status}{code}): {self.reason}"


def read_refusal(status: int, content: bytes) -> SendRefusal:
    """What a 4xx answer of `status` with body `content` says about the send."""
    error = _error(content)
    code = error.get("code") if error is not None else None
    if isinstance(code, bool) or not isinstance(code, int):
        code = None
    reason = _reason(error) if error is not None else None
    if not reason:
        reason = content.decode("utf-8", "replace")[:_QUOTED]
    is_temporary = status in _TEMPORARY_STATUSES or code in TEMPORARY_CODES
    return SendRefusal(status, code, reason, is_temporary)


def _error(content: bytes) -> dict[str, Any] | None:
    """The body's ``error`` object, if it is Graph's error shape."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else None


def _reason(error: dict[str, Any]) -> str:
    """Meta's message and, when it adds something, its details: "(#131026) Message
    undeliverable: Unable to deliver the message..."."""
    message = error.get("message")
    data = error.get("error_data")
    details = data.get("details") if isinstance(data, dict) else None
    parts = [str(p) for p in (message, details) if isinstance(p, str) and p.strip()]
    if len(parts) == 2 and parts[1] in parts[0]:
        parts.pop()
    return ": ".join(parts)[:_QUOTED]
