"""The hot route without the framework's per-request machinery.

`POST /v1/events` is most of the traffic. FastAPI spends more CPU per request on route
matching, dependency solving and its exception layers than the handler spends on the
event, and the handler needs none of them (it takes only the request). This middleware
calls the same handler directly, answers its errors from the same table, and marks the
request with the same route, so metrics, errors and the OpenAPI schema are unchanged.
Every other request goes through FastAPI (one with a query string too: the route answers
its parameters 422, `query_params`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import BaseRoute

from sinal.api.errors import handle_error
from sinal.api.metrics import ASGIApp, Receive, Scope, Send
from sinal.api.routes.events import post_event


class IngestFastPath:
    """Pure ASGI middleware: POST /v1/events straight to its handler."""

    def __init__(self, app: ASGIApp, route: BaseRoute) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != "/v1/events"
            or scope["method"] != "POST"
            or scope.get("query_string")  # it takes none: FastAPI's route refuses them
        ):
            await self.app(scope, receive, send)
            return
        scope["route"] = self.route
        request = Request(scope, receive)
        try:
            response = await post_event(request)
        except Exception as exc:  # the same table answers; a bug (500) is logged there
            response = await handle_error(request, exc)
        await response(scope, receive, send)
