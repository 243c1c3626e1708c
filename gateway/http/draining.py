"""While the server drains (gateway/drain.py), refuse new requests before any route runs.

A refused request gets 503 `server_shutting_down` with Retry-After and `Connection: close`
(so a client's pooled connection is not reused here, and a load balancer's next try goes
elsewhere). Probes and observability stay served: /health (the process is alive), /ready
(which says 503 "draining"), /metrics and /sparkgate/stats. Responses of the requests still
running also carry `Connection: close` from then on.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import request_log
from gateway.drain import Drain, shutting_down
from gateway.http.errors import surface_for

Refused = Callable[[Scope], bool]  # whether a request is new work to refuse while draining

STILL_SERVED = frozenset({"/health", "/ready", "/metrics", "/sparkgate/stats"})


def gateway_refuses(scope: Scope) -> bool:
    return scope["path"] not in STILL_SERVED


class DrainingMiddleware:
    def __init__(self, app: ASGIApp, drain: Drain, refuses: Refused = gateway_refuses) -> None:
        self.app = app
        self.drain = drain
        self.refuses = refuses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.drain.draining:
            await self.app(scope, receive, send)
            return
        if self.refuses(scope):
            err = shutting_down()
            request = Request(scope)
            request_log.note_error(request, err)  # the request's log line says why
            await surface_for(request).response(err)(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)
