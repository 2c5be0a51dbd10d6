"""Query parameters a `/v1` route does not take are refused, not ignored.

A misspelt filter (`GET /v1/events?metrc=Order%20Paid`) silently answered every event:
a report or an export built on it counted the wrong rows. Each `/v1` route answers 422
`unknown_parameter` naming the parameter and the ones it takes, as a body's unknown field
is 422. A parameter given twice (`?metric=A&metric=B`) is 422 `repeated_parameter`:
every parameter takes one value, and the route read only the last one, silently. Routes
outside `/v1` (`/l/{token}`, the providers' webhooks) keep ignoring them: a
short link shared with `?utm_source=…` appended must still redirect.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import parse_qsl

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from sinal.api.errors import problem_responses
from sinal.errors import FieldError, InvalidQuery

__all__ = ["refuse_unknown_query"]

# Where a route's refusal says where the parameter is taken: a contact's timeline is the
# events list of one contact, whose filters people try on it.
_ELSEWHERE = {
    "/v1/contacts/{contact_id}/timeline": (
        "; to filter a contact's events by metric or time, list them with GET "
        "/v1/events?contact_id=…&metric=…&since=…"
    ),
}


def refuse_unknown_query(app: FastAPI) -> None:
    """Wrap every `/v1` route so that a query parameter it does not declare is a 422 (and
    say so in its OpenAPI answers). Every app made shares the routers' route objects
    (`create_app` puts them on its router as they are): a route is wrapped once."""
    [(status, answer)] = problem_responses(InvalidQuery).items()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.path.startswith("/v1/"):
            if not isinstance(route.app, QueryChecked):
                names = tuple(_query_names(route.dependant))
                route.app = QueryChecked(route.app, names, _ELSEWHERE.get(route.path, ""))
            route.responses.setdefault(status, answer)


def _query_names(dependant: Dependant) -> list[str]:
    names = [param.alias for param in dependant.query_params]
    for sub in dependant.dependencies:
        names.extend(_query_names(sub))
    return names


class QueryChecked:
    """A route's ASGI app, behind a check of its query: a parameter not in `known` is 422."""

    def __init__(self, handler: ASGIApp, known: tuple[str, ...], elsewhere: str = "") -> None:
        self.handler = handler
        self.known = known
        self.elsewhere = elsewhere  # where such parameters are taken, if said

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string", b"")
        if query:
            _check(query.decode("latin-1"), self.known, self.elsewhere)
        await self.handler(scope, receive, send)


def _check(query: str, known: tuple[str, ...], elsewhere: str) -> None:
    names = Counter(name for name, _ in parse_qsl(query, keep_blank_values=True))
    unknown = [name for name in names if name not in known]
    takes = f"this route takes {', '.join(known)}" if known else "this route takes none"
    takes += elsewhere
    errors = [FieldError(name, "unknown_parameter", f"unknown query parameter; {takes}"
                         + (_KEY_IN_HEADER if name.lower() in _KEY_NAMES else ""))
              for name in unknown]  # fmt: skip
    errors += [
        FieldError(name, "repeated_parameter", f"{name} is given {times} times; give it once")
        for name, times in names.items()
        if times > 1 and name in known
    ]
    if errors:
        raise InvalidQuery(errors)


# A key sent as many APIs take it, in the query: it is refused as any unknown parameter (a
# key in a URL ends up in logs), saying where it goes.
_KEY_NAMES = frozenset({"api_key", "apikey", "api-key", "key", "token", "access_token"})
_KEY_IN_HEADER = "; an API key goes in the Authorization header: Authorization: Bearer <key>"
