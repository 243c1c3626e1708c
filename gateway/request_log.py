"""One record per HTTP request, written once when its response has ended (a stream ends long
after its handler returned), to the logger `sparkgate.request`.

`RequestLogMiddleware` opens a `RequestLog` for every request (the probes /health and /ready
aside), puts it on the request's state, and writes it when the app is done with the request:
answered, rejected (auth, validation, quota, admission: the error handlers note the error),
streamed to the end, or left by its client. Along the way the route notes the model asked,
auth the caller, and `answer` the job and its holds (`Running`): the job's meter has the
tokens, the first output's time and the finish reasons once the engine is done.

The request id is the client's `x-request-id` when it gives a usable one (at most 128 letters,
digits and `._:/+=@-`: nothing that could forge a field of a text log line; nothing shaped like
an API key), else the job's id, else a generated one; the response carries it in
`X-Request-Id`. Never logged: the API key (only its id), the prompt, the output.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.redaction import looks_secret, redact

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.lifecycle import Job, Running

log = logging.getLogger("sparkgate.request")

HEADER = "x-request-id"
# Probes, scrapes and the dashboard's polling (every second or few).
QUIET_PATHS = frozenset({"/health", "/ready", "/metrics", "/sparkgate/dashboard/data"})
_USABLE_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")


def client_request_id(value: str | None) -> str | None:
    """The client's request id, if usable (1..128 of `A-Za-z0-9._:/+=@-`, not key-shaped);
    else None, and the gateway makes its own: an id is echoed and logged, so it must not
    carry a secret or break the log line."""
    if value is None:
        return None
    value = value.strip()
    return value if _USABLE_ID.fullmatch(value) and not looks_secret(value) else None


@dataclass
class RequestLog:
    """What one request did, filled in along its lifecycle."""

    method: str
    path: str
    client_id: str | None = None  # the client's x-request-id, when usable
    started: float = field(default_factory=time.monotonic)
    generated_id: str = field(default_factory=lambda: f"req-{uuid.uuid4().hex}")
    principal: Principal | None = None
    model: str | None = None  # as asked
    job: Job | None = None
    running: Running | None = None
    status: int | None = None
    error_code: str | None = None
    reject_reason: str | None = None  # the quota's or admission's reason label, for a refusal

    @property
    def request_id(self) -> str:
        if self.client_id is not None:
            return self.client_id
        return self.job.id if self.job is not None else self.generated_id

    def failed(self, err: Any) -> None:
        """A GatewayError answered this request (noted by the error handlers)."""
        self.error_code = err.code
        self.reject_reason = err.reason

    def record(self, now: float | None = None) -> dict[str, Any]:
        end = time.monotonic() if now is None else now
        p, job, running = self.principal, self.job, self.running
        meter = None if job is None else job.meter
        rec: dict[str, Any] = {
            "request_id": self.request_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "error_code": self.error_code or (None if meter is None else meter.error_code),
            "key_id": None if p is None else p.key_id,
            "user": None if p is None else p.name,
            "team": None if p is None else p.team,
            "model": None if self.model is None else redact(self.model),  # the client's text
            "served_model": None if job is None else job.served.name,
            "slo_class": None if job is None or job.route is None else job.route.slo,
            "stream": None if job is None else job.stream,
            "prompt_tokens": None if meter is None else meter.prompt_tokens,
            "cached_tokens": None if meter is None else meter.cached_tokens,
            "output_tokens": None if meter is None else meter.completion_tokens,
            "reasoning_tokens": None if meter is None else meter.reasoning_tokens,
            "admission": self._admission(),
            "queue_wait_ms": None if running is None else round(running.ticket.waited_s * 1000, 1),
            "ttft_ms": None,
            "total_ms": round((end - self.started) * 1000, 1),
            "finish_reason": None,
            "outcome": self._outcome(),
        }
        if meter is not None:
            if meter.first_output_at is not None:
                rec["ttft_ms"] = round((meter.first_output_at - self.started) * 1000, 1)
            if meter.finish_reasons:
                rec["finish_reason"] = ",".join(dict.fromkeys(meter.finish_reasons))
        return rec

    def _admission(self) -> str | None:
        """admitted (at once) | queued (admitted after a wait) | rejected:<reason>; None: not asked."""
        if self.running is not None:
            return "queued" if self.running.ticket.waited_s > 0.001 else "admitted"
        if self.reject_reason is not None:
            return f"rejected:{self.reject_reason}"
        return None

    def _outcome(self) -> str:
        """ok | client_left | error."""
        if self.status == 499:
            return "client_left"
        if self.status is None or self.status >= 400 or self.error_code is not None:
            return "error"
        if self.job is not None and self.job.meter.error_code is not None:
            return "error"  # failed after a stream's status line
        if self.running is not None and not self.running.returned:
            return "client_left"  # a stream its client did not read to the end
        return "ok"

    def write(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return  # request lines are off (log_level above info): build nothing
        rec = self.record()
        text = " ".join(f"{k}={v}" for k, v in rec.items() if v is not None)
        log.info("request %s", text, extra={"fields": rec, "event": "request"})


def of(request: Request) -> RequestLog | None:
    """The request's log record (None outside the middleware, e.g. in a unit test's app)."""
    # From the scope: `request.state` builds a State object per request, for one lookup.
    found = request.scope.get("state", {}).get("request_log")
    return found if isinstance(found, RequestLog) else None


def note_caller(request: Request, principal: Principal) -> None:
    if (rl := of(request)) is not None:
        rl.principal = principal


def note_model(request: Request, model: str) -> None:
    if (rl := of(request)) is not None:
        rl.model = model


def note_job(request: Request, job: Job, running: Running | None = None) -> None:
    if (rl := of(request)) is not None:
        rl.job = job
        if running is not None:
            rl.running = running


def note_error(request: Request, err: Any) -> None:
    if (rl := of(request)) is not None:
        rl.failed(err)


class RequestLogMiddleware:
    """Open each request's record, set X-Request-Id on its response, write the record at the end."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        given = None
        for k, v in scope["headers"]:
            if k == HEADER.encode():
                given = client_request_id(v.decode("latin-1"))
        rl = RequestLog(method=scope["method"], path=scope["path"], client_id=given)
        log.debug("start %s %s %s", rl.method, rl.path, rl.client_id or "(no client id)")
        scope.setdefault("state", {})["request_log"] = rl

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                rl.status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER.encode()]
                headers.append((b"x-request-id", rl.request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except asyncio.CancelledError:  # the server gave up on it: its client went away
            if rl.status is None:
                rl.status = 499
            raise
        except BaseException:
            if rl.status is None:
                rl.status, rl.error_code = 500, rl.error_code or "internal_error"
            raise
        finally:
            try:
                rl.write()
            except Exception:  # the log must never break a response
                logging.getLogger(__name__).exception("request log failed")
