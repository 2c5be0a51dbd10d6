"""The URLs sinal keeps to send a request or a person to later, checked when they are given.

Two policies, one set of rules:

- `target_url_problem`: a URL opened as it is given — a webhook step's ``url`` (sinal
  POSTs to it) and a tracked link's target (a person's browser is sent there).
- `base_url_problem`: a connection's base URL (WhatsApp's ``api_base_url``, an AI
  connection's ``base_url``), which sinal appends paths to (``/chat/completions``): a
  target URL with no query or fragment, which the appended path would land inside.

The rules both apply: at most 2,048 characters; no spaces or control characters (HTTP
clients refuse them or send something else: httpx refuses a tab or a DEL, reads a URL
that starts with a space as a relative one, and `urlsplit` silently drops tabs and
newlines, so a host checked with one is not the host requested), nor an invisible
bidirectional control, which shows the URL as another one; http or https, in any
case; a host, and a port from 1 to 65535 when one is given; no user name or password (a
URL is shown and logged, and httpx sends them as Basic auth in place of a connection's
token); and a host an HTTP client can connect to (`_host_problem`).

Where a host resolves is no rule here: DNS may answer otherwise once the URL is saved.
sinal's own requests are checked as they leave (`sinal.automations.steps.
refuse_private_target`); a link sends a person, not sinal, so its target may be any host.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import SplitResult, urlsplit

import idna

__all__ = [
    "MAX_URL_LENGTH",
    "UrlProblem",
    "base_url_problem",
    "target_url_problem",
    "with_ascii_host",
]

MAX_URL_LENGTH: Final = 2048  # what every browser and WhatsApp still open
_IPV4_STYLE: Final = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")  # httpx checks these


@dataclass(frozen=True, slots=True)
class UrlProblem:
    """Why a URL is refused: `code` is ``unsupported_scheme`` for a scheme other than
    http(s), else ``invalid_url``; `message` names the field."""

    code: Literal["invalid_url", "unsupported_scheme"]
    message: str


def target_url_problem(url: str, field: str = "url") -> UrlProblem | None:
    """Why `url` cannot be opened as given (a webhook step's url, a link's target), or
    None; `field` names it in the message."""
    problem = _text_problem(url, field)
    if problem is not None:
        return UrlProblem("invalid_url", problem)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # a malformed IPv6 address
        return UrlProblem("invalid_url", f"{field} is not a valid URL: {exc}")
    if parts.scheme not in ("http", "https"):  # urlsplit lowercases it
        return UrlProblem(
            "unsupported_scheme", f"{field} must be absolute and start with http:// or https://"
        )
    problem = _parts_problem(parts, field)
    return None if problem is None else UrlProblem("invalid_url", problem)


def base_url_problem(url: str, field: str) -> UrlProblem | None:
    """Why `url` cannot be a connection's base URL, which paths are appended to, or None;
    `field` names it in the message."""
    problem = target_url_problem(url, field)
    if problem is None and ("?" in url or "#" in url):  # "/v1?" too: its query is empty
        problem = UrlProblem(
            "invalid_url", f"{field} must have no query or fragment: paths are appended to it"
        )
    return problem


def with_ascii_host(url: str) -> str:
    """`url` (one `target_url_problem` accepts) with an internationalized host in the
    ASCII form (IDNA 2008, "xn--…") that is requested and that browsers show for a
    look-alike: "https://аpple.com/" with a Cyrillic "а" is "https://xn--pple-43d.com/",
    not a URL that prints as Apple's. The rest of the URL is kept as given."""
    if url.isascii():
        return url
    parts = urlsplit(url)
    if parts.hostname is None or parts.hostname.isascii():
        return url
    # No user name and no IPv6 brackets here (refused; ASCII): the netloc is the host and
    # an optional ":port", and it follows the scheme's "//".
    given = parts.netloc.partition(":")[0]
    start = url.index("//") + 2
    try:
        ascii_host = idna.encode(parts.hostname).decode("ascii")  # as `_host_problem` does
    except UnicodeError:  # kept before a newer idna refused it: redirected as kept
        return url
    return url[:start] + ascii_host + url[start + len(given) :]


def _text_problem(url: str, field: str) -> str | None:
    if len(url) > MAX_URL_LENGTH:
        return f"{field} is longer than {MAX_URL_LENGTH} characters"
    # Cs: a lone surrogate, which no URL (nor a database) can hold
    if any(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cs") for ch in url):
        return f"{field} contains spaces or control characters; percent-encode them"
    if _BIDI_CONTROLS.search(url) is not None:
        return (
            f"{field} contains an invisible bidirectional control character (U+200E, U+200F, "
            "U+202A to U+202E, U+2066 to U+2069): it shows the URL as another one"
        )
    return None


# RFC 3987 (4.1): an IRI must not hold them. "https://loja.example/\u202egpj.exe" is shown
# as ".../exe.jpg", and a link's target was kept and shown with one.
_BIDI_CONTROLS = re.compile("[\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _parts_problem(parts: SplitResult, field: str) -> str | None:
    """What is wrong with an http(s) URL's authority (host, port, user), or None."""
    host = parts.hostname
    if not host:
        return f"{field} has no host; give an absolute URL, like https://example.com/path"
    if parts.username is not None or parts.password is not None:
        return (
            f"{field} must not carry a user name or password: a URL is shown and logged "
            "(send credentials in headers or a connection's secrets)"
        )
    try:
        port = parts.port  # ValueError past 65535 or not a number
    except ValueError:
        port = 0
    if port == 0:  # a port given as ":" is None, the scheme's own
        return f"{field}'s port must be a number from 1 to 65535"
    problem = _host_problem(host)
    return None if problem is None else f"{field}'s host {host!r} {problem}"


def _host_problem(host: str) -> str | None:
    """Why an HTTP client cannot connect to `host` (a URL's host name, as `urlsplit` gives
    it), or None. Checked as httpx and then the resolver encode it: an internationalized
    name by IDNA 2008, an IPv4-looking one as an address, and every label of the result
    must have 1 to 63 characters (Python's IDNA codec, what `socket.getaddrinfo` applies)."""
    if _IPV4_STYLE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "is not an IPv4 address"
        return None
    try:
        ascii_host = host if host.isascii() else idna.encode(host).decode("ascii")
        ascii_host.encode("idna")
    except idna.IDNAError as exc:
        return f"is not a valid internationalized domain name ({exc})"
    except UnicodeError:
        return "has an empty label or one longer than 63 characters"
    return None
