"""Every error's HTTP answer, from one table: `application/problem+json` (RFC 9457).

```
{"type": "/problems/invalid-event", "title": "The event is invalid", "status": 422,
 "detail": "metric: metric_name must not be empty",
 "errors": [{"field": "metric", "code": "empty", "message": "..."}]}
```

`type` is stable (clients branch on it); `errors` lists one entry per bad field, its
`field` a JSON path into the request (`events[3].properties.items[0].price`) or the name
of a query parameter. A rejected event adds `reason` and `rejection_id` (it is kept and
can be replayed).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, get_args
from uuid import uuid4

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Match

from sinal.automations.model import InvalidAutomation
from sinal.contacts import InvalidIdentities, InvalidIdentity
from sinal.errors import (
    AccountNotFound,
    ContactNotFound,
    ConversationClosed,
    FieldError,
    IdentityConflict,
    InvalidAccount,
    InvalidContact,
    InvalidEvent,
    InvalidIntegration,
    InvalidLink,
    InvalidQuery,
    SchemaOutOfDate,
    SchemaViolation,
    SecretUnreadable,
    SignatureMismatch,
    StoreError,
    StoreMisconfigured,
    StoreUnavailable,
    UnstorableInput,
    UnstorableText,
)
from sinal.logs import ThrottledLog

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("sinal.api")


class ApiError(Exception):
    """An answer decided by the API layer itself (auth, body, routing)."""

    def __init__(
        self,
        detail: str,
        errors: Iterable[FieldError] = (),
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = tuple(errors)
        self.extra = extra


class Unauthorized(ApiError):
    """No key, a malformed, unknown or revoked key."""


class Forbidden(ApiError):
    """The key lacks the route's scope."""


class NotFound(ApiError):
    """No such resource in this account (another account's id looks the same)."""


class InvalidHeader(ApiError):
    """A request header no sender could mean (a webhook's delivery id of several KB)."""


class MalformedBody(ApiError):
    """The body is not JSON at all."""


class PayloadTooLarge(ApiError):
    """The body is over the route's limit."""


class UnsupportedMediaType(ApiError):
    """The body is not declared as JSON."""


class InvalidInput(ApiError):
    """JSON that breaks the rules: NaN, duplicate keys, wrong types, unknown fields."""


class Rejected(ApiError):
    """A valid event that could not be recorded (unknown contact); kept for replay."""


class Conflict(ApiError):
    """The request conflicts with the current state."""


class VerificationFailed(ApiError):
    """A webhook subscription handshake with the wrong verify token (or none)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One row of the table: the answer's status, `type` slug and title, the
    `WWW-Authenticate` challenge it carries (only where a credential is expected), and
    whether a 503 says when to try again (`Retry-After`: only where a retry may pass)."""

    status: int
    slug: str
    title: str
    challenge: str | None = None
    retry: bool = True


# The one table. Looked up along the exception's MRO, so subclasses inherit an answer.
PROBLEMS: dict[type[BaseException], Problem] = {
    # Before MalformedBody: the OpenAPI title of a plain 400 is the last row's.
    InvalidHeader: Problem(400, "invalid-header", "A request header is invalid"),
    MalformedBody: Problem(400, "malformed-json", "The body is not valid JSON"),
    Unauthorized: Problem(401, "unauthorized", "A valid API key is required", "Bearer"),
    # No challenge: a webhook proves itself by its HMAC signature, not by a bearer token.
    SignatureMismatch: Problem(401, "invalid-signature", "The webhook signature does not match"),
    AccountNotFound: Problem(401, "unauthorized", "A valid API key is required", "Bearer"),
    Forbidden: Problem(403, "forbidden", "The API key lacks the scope this route needs"),
    VerificationFailed: Problem(403, "verification-failed", "The verify token does not match"),
    NotFound: Problem(404, "not-found", "No such resource"),
    ContactNotFound: Problem(404, "not-found", "No such resource"),
    Conflict: Problem(409, "conflict", "The request conflicts with the current state"),
    ConversationClosed: Problem(409, "conversation-closed", "The conversation is closed"),
    IdentityConflict: Problem(409, "identity-conflict", "The identity names another contact"),
    PayloadTooLarge: Problem(413, "payload-too-large", "The body is too large"),
    UnsupportedMediaType: Problem(415, "unsupported-media-type", "The body must be JSON"),
    InvalidInput: Problem(422, "invalid-input", "The body breaks the request's rules"),
    InvalidEvent: Problem(422, "invalid-event", "The event is invalid"),
    InvalidContact: Problem(422, "invalid-contact", "The contact is invalid"),
    InvalidIdentity: Problem(422, "invalid-contact", "The contact is invalid"),
    InvalidIdentities: Problem(422, "invalid-contact", "The contact is invalid"),
    InvalidAccount: Problem(422, "invalid-account", "The account settings are invalid"),
    InvalidAutomation: Problem(422, "invalid-automation", "The automation is invalid"),
    InvalidIntegration: Problem(422, "invalid-integration", "The integration is invalid"),
    InvalidQuery: Problem(422, "invalid-query", "The query parameters are invalid"),
    InvalidLink: Problem(422, "invalid-link", "The link is invalid"),
    RequestValidationError: Problem(422, "invalid-query", "The query parameters are invalid"),
    Rejected: Problem(422, "event-rejected", "The event was not recorded"),
    # Before StoreError (their parent): the input is at fault, and a retry cannot help.
    UnstorableText: Problem(422, "unstorable-text", "The request holds a NUL character"),
    UnstorableInput: Problem(422, "unstorable-input", "The database refused the request's data"),
    SchemaOutOfDate: Problem(503, "schema-out-of-date", "The database needs `sinal migrate`"),
    # Before StoreError: what sinal itself wrote broke its schema, a bug, whatever the input.
    SchemaViolation: Problem(500, "internal-error", "Something went wrong on our side"),
    # The server's keys (SINAL_SECRET_KEYS) cannot open a stored secret: its operator's to
    # fix; the answer names no key (webhook routes answer anyone), the log line does.
    SecretUnreadable: Problem(
        503, "secret-unreadable", "A stored secret cannot be opened with the server's keys"
    ),
    # Before StoreError: the database's configuration refuses sinal (a privilege, a file
    # not writable), its operator's to fix; not a bug (500), and no retry helps until then.
    StoreMisconfigured: Problem(
        503,
        "database-misconfigured",
        "The database refuses what sinal needs; its operator must fix it",
        retry=False,
    ),
    StoreError: Problem(503, "store-unavailable", "The database is unavailable; retry"),
    Exception: Problem(500, "internal-error", "Something went wrong on our side"),
}
_BY_STATUS = {
    404: PROBLEMS[NotFound],
    405: Problem(405, "method-not-allowed", "The route does not accept this method"),
}


def problem_for(exc: BaseException) -> Problem:
    """The table's row for an exception (the nearest class in its MRO)."""
    for cls in type(exc).__mro__:
        if cls in PROBLEMS:
            return PROBLEMS[cls]
    return PROBLEMS[Exception]


def problem_response(
    problem: Problem,
    detail: str,
    errors: Sequence[FieldError] = (),
    *,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """The problem+json answer."""
    body: dict[str, Any] = {
        "type": f"/problems/{problem.slug}",
        "title": problem.title,
        "status": problem.status,
        "detail": detail,
        "errors": [e.as_dict() for e in errors],
    }
    if instance is not None:
        body["instance"] = instance
    body.update({k: v for k, v in extra.items() if v is not None})
    return Response(
        orjson.dumps(body), status_code=problem.status, media_type=PROBLEM_JSON, headers=headers
    )


def _allowed(request: Request) -> str:
    """The methods of every route of the request's path, sorted ("GET, POST")."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is Match.PARTIAL:  # the path matched, not the method
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def handle_error(request: Request, exc: Exception) -> Response:
    """Any exception as problem+json (registered for Exception and HTTPException)."""
    path = request.url.path
    if isinstance(exc, ClientDisconnect):  # nobody to answer, nothing wrong on our side
        return Response(status_code=CLIENT_CLOSED)
    if isinstance(exc, HTTPException):
        problem = _BY_STATUS.get(exc.status_code) or Problem(exc.status_code, "http", str(exc))
        headers = dict(exc.headers) if exc.headers else None
        detail = str(exc.detail)
        if exc.status_code == 405 and headers and headers.get("Allow"):
            # "Method Not Allowed" named no way out; Starlette's Allow names the methods of
            # the path's first route alone (PUT /v1/contacts said GET, not POST)
            headers["Allow"] = _allowed(request) or headers["Allow"]
            detail = f"{path} takes {headers['Allow']}, not {request.method}"
        elif exc.status_code == 404 and detail == "Not Found":  # no route: "Not Found" alone
            detail = f"no route answers {path}: /docs lists the API's routes"
        return problem_response(problem, detail, instance=path, headers=headers)
    if isinstance(exc, SchemaViolation):
        exc = await _out_of_date(request) or exc
    problem = problem_for(exc)
    errors = _errors_of(exc)
    headers = None if problem.challenge is None else {"WWW-Authenticate": problem.challenge}
    if problem.status == 503 and problem.retry:
        headers = {"Retry-After": RETRY_AFTER}
    if isinstance(exc, StoreUnavailable | SchemaOutOfDate):
        _unavailable.log(request.method, path, exc)
    elif isinstance(exc, StoreMisconfigured):  # the operator's to fix: no traceback
        _misconfigured.log(request.method, path, exc)
    elif isinstance(exc, UnstorableInput):  # a check validation lacks: worth a look
        log.warning("%s %s: the database refused the request's data: %s", request.method,
                    path, exc)  # fmt: skip
    elif isinstance(exc, SecretUnreadable):  # a configuration, not a bug: no traceback
        log.error("%s %s: answered 503: %s", request.method, path, exc)
    extra = dict(exc.extra) if isinstance(exc, ApiError) else {}
    if problem.status == 503 and isinstance(exc, StoreError):
        extra["code"] = exc.code  # what is wrong with the database, for a program
    if problem.status >= 500 and not isinstance(
        exc, StoreUnavailable | SchemaOutOfDate | SecretUnreadable | StoreMisconfigured
    ):
        # a bug (or a statement the database failed): the answer names its log line, which
        # holds the traceback, by an id that tells the client nothing else
        extra["error_id"] = error_id = uuid4().hex
        log.error("%s %s failed (error_id %s)", request.method, path, error_id, exc_info=exc)
    detail = _detail(exc, problem, errors)
    return problem_response(problem, detail, errors, instance=path, headers=headers, **extra)


async def _out_of_date(request: Request) -> SchemaOutOfDate | None:
    """`SchemaOutOfDate` when the database lacks migrations this code needs (a server
    started with `--no-migrate`, say): a statement that failed on the schema then asks for
    `sinal migrate`, as /readyz does, instead of being answered as a bug."""
    svc = getattr(request.app.state, "service", None)
    if svc is None:
        return None
    try:
        await svc.probe(svc.ledger.check_schema)
    except SchemaOutOfDate as exc:
        return exc
    except StoreError:  # the database cannot tell now: the statement's error stands
        return None
    return None


# The status recorded (in metrics; never received) for a request whose client closed the
# connection before its body arrived: nginx's "client closed request".
CLIENT_CLOSED = 499

# Seconds a client is told to wait before sending a request answered 503 again.
RETRY_AFTER = "2"


class _ThrottledLog(ThrottledLog):
    """Requests the database could not serve (503), logged as one line at most every
    `interval` seconds with the number left out: an outage met by thousands of requests a
    second must not write a traceback for each (a bug's 500 still gets its own). The line
    says what happened (`says`, in which "{code}" stands for the error's `code`), then
    the error's message, which names the fix where there is one."""

    def __init__(
        self,
        says: str = "the database is unavailable",
        level: int = logging.WARNING,
        interval: float = 10.0,
    ) -> None:
        super().__init__(log, interval)
        self.says = says
        self.level = level

    def log(self, method: str, path: str, exc: BaseException) -> None:
        says = self.says.format(code=getattr(exc, "code", ""))
        self.write(self.level, "%s %s: %s, answered 503: %s", method, path, says, exc)


# Requests are answered on one thread: the event loop's.
_unavailable = _ThrottledLog()
# An error: nothing gets better until an operator acts.
_misconfigured = _ThrottledLog("the database refuses what sinal needs ({code})", logging.ERROR)


def _errors_of(exc: BaseException) -> tuple[FieldError, ...]:
    if isinstance(exc, RequestValidationError):
        return tuple(pydantic_errors(exc.errors(), query=True))
    if isinstance(exc, IdentityConflict):
        return (FieldError(exc.field, "identity_taken", str(exc)),)
    if isinstance(exc, InvalidIdentity):
        return (FieldError(exc.field, exc.code, exc.message),)
    if isinstance(exc, InvalidIdentities):
        return tuple(FieldError(e.field, e.code, e.message) for e in exc.errors)
    errors: tuple[FieldError, ...] = getattr(exc, "errors", ())
    return errors if isinstance(errors, tuple) else ()


def _detail(exc: BaseException, problem: Problem, errors: Sequence[FieldError]) -> str:
    if isinstance(exc, StoreMisconfigured):  # the fix, in words naming no table nor path
        return exc.fix
    if problem.status >= 500 or type(exc) is UnstorableInput:
        # Never echo a driver's message: it may name tables, hosts or data.
        return problem.title
    if isinstance(exc, AccountNotFound):
        return "the API key's account no longer exists"
    if errors:
        return "; ".join(f"{e.field}: {e.message}" for e in errors[:10])
    return str(exc) or problem.title


def pydantic_errors(
    errors: Iterable[Any],
    *,
    prefix: str = "",
    query: bool = False,
    model: type[BaseModel] | None = None,
) -> list[FieldError]:
    """Pydantic's (or FastAPI's) error list as FieldErrors with JSON paths; with the
    `model` validated, an unknown field's message names the fields its object takes."""
    found: list[FieldError] = []
    for error in errors:
        loc = list(error.get("loc", ()))
        if query and loc and loc[0] in ("query", "path", "header", "body"):
            loc = loc[1:]
        field = json_path(loc, prefix)
        code = str(error.get("type", "invalid"))
        message = str(error.get("msg", "invalid"))
        if code == "extra_forbidden" and model is not None and loc:
            message = _unknown_field(model, loc, prefix)
        elif code in _JSON_TYPES and "input" in error:
            message = f"expected {_JSON_TYPES[code]}, got {_json_kind(error['input'])}"
        elif code == "model_type":  # pydantic's says "… or instance of EventIn", our class
            message = "expected an object"
        if query and code.startswith("datetime"):
            message += _plus_as_space(error.get("input"))
        found.append(FieldError(field or "body", code, message))
    return found


# A body's value of the wrong JSON type, in JSON's words: pydantic said "Input should be a
# valid dictionary or instance of ContactIdentities" (a Python class) for `"contact": "x"`,
# and never what it got. The input is only named by its type (it may be personal data).
_JSON_TYPES = {
    "string_type": "a string",
    "dict_type": "an object",
    "model_type": "an object",
    "list_type": "an array",
    "bool_type": "true or false",
    "int_type": "an integer",
}


def _json_kind(value: object) -> str:
    """What a parsed JSON value is, as JSON names it ("a number", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


# A time whose offset lost its "+": "…T00:00:00 03:00", as "+03:00" typed in a URL arrives.
_SPACED_OFFSET = re.compile(r"\d (\d\d(?::?\d\d)?)$")


def _plus_as_space(raw: object) -> str:
    """The hint for a query's time whose offset's "+" arrived as a space, as a URL's query
    decodes it (`since=…T00:00:00+03:00`): pydantic said only "unexpected extra
    characters", and the request as typed shows a valid time."""
    found = _SPACED_OFFSET.search(raw) if isinstance(raw, str) else None
    if found is None:
        return ""
    offset = found[1]
    return (
        f"; a '+' in a URL's query reads as a space: send +{offset} as %2B{offset}, "
        "or the time in UTC with Z"
    )


def _unknown_field(model: type[BaseModel], loc: Sequence[Any], prefix: str) -> str:
    """The message of an unknown field: "unknown field 'x'; the body takes a, b", as an
    unknown query parameter's names the ones its route takes (`sinal.api.query_params`)."""
    owner = _model_at(model, loc[:-1])
    named = f"unknown field {str(loc[-1])!r}"
    if owner is None:  # not reached through models alone (an item of a dict): say less
        return named
    where = json_path(loc[:-1], prefix) or "the body"
    takes = ", ".join(f.alias or name for name, f in owner.model_fields.items())
    return f"{named}; {where} takes {takes}"


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model of the object at `loc` inside `model` (list indexes step into items)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        if field is None:
            return None
        current = _model_in(field.annotation)
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or inside `X | None`, `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def json_path(loc: Iterable[Any], prefix: str = "") -> str:
    """("properties", "items", 0, "price") -> "properties.items[0].price"."""
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


class FieldProblem(BaseModel):
    """One bad field."""

    field: str
    code: str
    message: str


class ProblemBody(BaseModel):
    """An error answer (RFC 9457 problem details)."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldProblem]
    reason: str | None = None
    rejection_id: str | None = None
    code: str | None = Field(
        None,
        description="With a 503 of the database's: what is wrong, for a program to branch "
        "on (database_unavailable, snapshot_too_old, schema_out_of_date, "
        "insufficient_privilege, database_read_only, …)",
    )
    error_id: str | None = Field(
        None,
        description="With an answer of ours whose traceback was logged (a 500: a bug): the "
        "id of that log line, to quote when reporting it",
    )


def problem_responses(*statuses: int | type[Exception]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the given error statuses (or errors: the status and
    title of their row, where rows share a status)."""
    content = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/ProblemBody"}}}
    titles = {p.status: p.title for p in [*PROBLEMS.values(), *_BY_STATUS.values()]}
    rows = [(s, titles.get(s, "Error")) if isinstance(s, int) else
            (PROBLEMS[s].status, PROBLEMS[s].title) for s in statuses]  # fmt: skip
    return {status: {"description": title, "content": content} for status, title in rows}
