"""The error vocabulary: one hierarchy, and the translations into it of admission, quota and
engine refusals. Pure: no HTTP and no logging here. Each API surface writes these in its own
error shape (gateway/http/surface.py: OpenAI's by default, Anthropic's for Messages), and
gateway/http/errors.py answers them.

    GatewayError                      status  type                    code
     +-- InvalidRequest                 400   invalid_request_error   (given, e.g. invalid_value, invalid_type)
     |    +-- ContextLengthExceeded     400   invalid_request_error   context_length_exceeded
     |    +-- MalformedBody             400   invalid_request_error   invalid_json | invalid_encoding |
     |                                                                json_too_deep | unsupported_content_type |
     |                                                                invalid_content_encoding
     +-- RequestTooLarge                413   invalid_request_error   request_too_large
     +-- UnsupportedEncoding            415   invalid_request_error   unsupported_content_encoding
     +-- AuthenticationFailed           401   invalid_request_error   invalid_api_key
     +-- PermissionDenied               403   invalid_request_error   permission_denied
     +-- ModelNotFound                  404   invalid_request_error   model_not_found
     +-- RouteNotFound                  404   invalid_request_error   not_found
     +-- ResponseNotFound               404   invalid_request_error   response_not_found
     +-- MethodNotAllowed               405   invalid_request_error   method_not_allowed
     +-- ShareUnavailable               409   invalid_request_error   engine_share_unavailable
     +-- RateLimited                    429   requests | tokens       rate_limit_exceeded
     +-- AuthThrottled                  429   invalid_request_error   too_many_failed_authentications
     |                                      insufficient_quota      insufficient_quota
     +-- SloUnattainable                429   server_overloaded       slo_unattainable
     +-- Overloaded                     503   server_error            server_overloaded (or queue_timeout)
     |    +-- MemoryLow                 503   server_error            server_overloaded (host memory below box.min_free)
     +-- QuotaUnavailable               503   server_error            quota_unavailable
     +-- EngineUnavailableError         503   server_error            engine_unavailable
     +-- StoreUnavailable               503   server_error            store_unavailable
     +-- ShuttingDown                   503   server_error            server_shutting_down
     +-- InternalError                  500   server_error            internal_error

Anthropic's shape names the kind by the status, and an `Overloaded` box is its 529
(gateway/http/anthropic/errors.py).

Engine errors (`engine_adapter.base.EngineError`) and admission rejections
(`policies.admission.Reject`, a value) are translated here too (and quota
refusals, `policies.quotas.Deny`), so routes
never catch them. An unexpected exception becomes `InternalError`, with no detail for the
client; whoever answers it logs its traceback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import ClassVar

from engine_adapter.base import EngineError, EngineOverloaded, EngineRequestInvalid, EngineUnavailable
from policies.demand import Reject, RejectReason
from policies.quotas import Deny, DenyReason


def _retry_after(seconds: float) -> str:
    """A Retry-After value: whole seconds, rounded up, at least 1 (0 would mean "now")."""
    return str(max(1, math.ceil(seconds)))


retry_after_header = _retry_after  # for the modules that build an error's headers themselves


class GatewayError(Exception):
    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.error_type = error_type or self.type
        self.param = param
        self.code = code or self.default_code
        self.headers = headers or {}
        self.reason: str | None = None  # the admission reason's metric label, when it is one

    def renamed(self, names: Mapping[str, str]) -> GatewayError:
        """This error as a surface whose fields are named otherwise reports it: `names` maps
        chat's parameter (`max_tokens`, `messages`) to the surface's (`max_output_tokens`,
        `input`). A path below a renamed parameter is cut to it (the surface's translation may
        have moved its items), and the message quotes the surface's name."""
        if self.param is None:
            return self
        head = re.split(r"[.\[]", self.param, maxsplit=1)[0]
        name = names.get(head)
        if name is None or name == self.param:
            return self
        self.message = self.message.replace(f"'{self.param}'", f"'{name}'").replace(f"'{head}'", f"'{name}'")
        self.param = name
        return self


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    default_code = "context_length_exceeded"


class MalformedBody(InvalidRequest):
    """A body that is not a JSON document this gateway reads (gateway/http/body_limits.py)."""

    default_code = "invalid_json"


class RequestTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    default_code = "request_too_large"


class UnsupportedEncoding(GatewayError):
    """A request body in a Content-Encoding this gateway cannot decode (gateway/http/body_limits.py)."""

    status = 415
    type = "invalid_request_error"
    default_code = "unsupported_content_encoding"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "invalid_request_error"
    default_code = "permission_denied"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "model_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class ResponseNotFound(GatewayError):
    """A stored response (/v1/responses) that does not exist, expired, or is another user's:
    one answer for all three, so a caller cannot learn that someone else's id exists."""

    status = 404
    type = "invalid_request_error"
    default_code = "response_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class ShareUnavailable(GatewayError):
    """An engine host cannot grant a gateway the share of its engine it asked for:
    other gateways' live claims hold the rest (see gateway/engine_host.py)."""

    status = 409
    type = "invalid_request_error"
    default_code = "engine_share_unavailable"


class RateLimited(GatewayError):
    status = 429
    type = "requests"
    default_code = "rate_limit_exceeded"


class AuthThrottled(GatewayError):
    """Too many failed authentications from this client address (gateway/failed_auth.py):
    refused, a correct key included, until the block ends."""

    status = 429
    type = "invalid_request_error"
    default_code = "too_many_failed_authentications"

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(
            f"Too many failed authentications from your address. Try again in {_human(retry_after_s)}.",
            headers={
                "Retry-After": _retry_after(retry_after_s),
                "retry-after-ms": str(math.ceil(retry_after_s * 1000)),
            },
        )


class SloUnattainable(GatewayError):
    """No model is predicted to meet the request's latency objective. With a wait, the
    load is the reason (retry then); without one, no model could meet it even idle."""

    status = 429
    type = "server_overloaded"
    default_code = "slo_unattainable"

    def __init__(self, message: str, *, retry_after_s: float | None) -> None:
        if retry_after_s is None:
            headers = {"x-should-retry": "false"}
        else:
            headers = {"Retry-After": _retry_after(retry_after_s), "retry-after-ms": str(round(retry_after_s * 1000))}
        super().__init__(message, headers=headers)
        self.retry_after_s = retry_after_s


class Overloaded(GatewayError):
    status = 503
    type = "server_error"
    default_code = "server_overloaded"


class MemoryLow(Overloaded):
    """The box's available host memory is below `box.min_free` (gateway/host_memory.py): no
    new work until it comes back, so that the unified-memory box does not wedge."""

    def __init__(self, *, available: int, floor: int, retry_after_s: float) -> None:
        gib = 1024**3
        super().__init__(
            f"The server is low on memory ({available / gib:.1f} GiB available, below its floor of "
            f"{floor / gib:.1f} GiB) and takes no new requests until it recovers. Please try again "
            f"in {_human(retry_after_s)}.",
            headers={"Retry-After": _retry_after(retry_after_s), "retry-after-ms": str(round(retry_after_s * 1000))},
        )
        self.reason = "host_memory_low"


class QuotaUnavailable(GatewayError):
    status = 503
    type = "server_error"
    default_code = "quota_unavailable"


class EngineUnavailableError(GatewayError):
    status = 503
    type = "server_error"
    default_code = "engine_unavailable"


class StoreUnavailable(GatewayError):
    """The stored-responses backend (Redis) cannot be reached."""

    status = 503
    type = "server_error"
    default_code = "store_unavailable"


class ShuttingDown(GatewayError):
    """The server is draining (SIGTERM, gateway/drain.py): no new work, or this request
    was aborted at the end of the drain."""

    status = 503
    type = "server_error"
    default_code = "server_shutting_down"


class InternalError(GatewayError):
    status = 500
    type = "server_error"
    default_code = "internal_error"


def from_reject(reject: Reject, retry_after_s: float | None = None) -> GatewayError:
    """An admission decision "no" -> the error the client sees (status and code from the reason)."""
    reason = reject.reason
    headers = {"Retry-After": _retry_after(retry_after_s)} if retry_after_s is not None else {}
    cls: type[GatewayError]
    if reason.status == 429:
        cls = RateLimited
    elif reason is RejectReason.POOL_CLOSED:
        cls = EngineUnavailableError
        if retry_after_s is None:
            headers["x-should-retry"] = "false"  # left down (see /ready): the SDK's retries cannot help
    elif reason.status == 503:
        cls = Overloaded
    else:
        cls = InvalidRequest
    err = cls(reject.message, code=reason.code, headers=headers)
    err.reason = reason.label
    return err


_LIMIT_NAMES = {
    DenyReason.CONCURRENCY: "concurrent requests",
    DenyReason.RPM: "requests per minute (RPM)",
    DenyReason.TPM: "tokens per minute (TPM)",
    DenyReason.TPM_TOO_LARGE: "tokens per minute (TPM)",
    DenyReason.DAILY_IN_FLIGHT: "tokens per day",
    DenyReason.MONTHLY_IN_FLIGHT: "tokens per month",
    DenyReason.DAILY: "tokens per day",
    DenyReason.MONTHLY: "tokens per month",
}


def from_quota_refusal(scope: str, d: Deny, cost: int) -> GatewayError:
    """A store's "no" -> the 429 the client sees, with headers the OpenAI SDK acts on."""
    what = _LIMIT_NAMES[d.reason]
    who = scope.replace(":", " ", 1)
    retry_s = d.retry_after_ms / 1000
    if d.reason is DenyReason.TPM_TOO_LARGE:
        msg = f"Request too large for {who} on {what}: limit {d.limit}, requested {cost} (prompt + max_tokens)."
    elif d.reason in (DenyReason.DAILY, DenyReason.MONTHLY):
        msg = (
            f"You exceeded your quota of {what} for {who}: limit {d.limit}, used or held {d.current}, "
            f"this request needs up to {cost}. It resets in {_human(retry_s)}."
        )
    elif d.reason in (DenyReason.DAILY_IN_FLIGHT, DenyReason.MONTHLY_IN_FLIGHT):
        msg = (
            f"Rate limit reached for {who} on {what}: limit {d.limit}, used or held by requests in flight "
            f"{d.current}, this request needs up to {cost}. Please try again in {_human(retry_s)}."
        )
    else:
        msg = (
            f"Rate limit reached for {who} on {what}: limit {d.limit}, current {d.current}. "
            f"Please try again in {_human(retry_s)}."
        )
    headers = {"x-sparkgate-quota-limit": d.reason.label}
    if d.retry_after_ms > 0:
        headers["Retry-After"] = _retry_after(retry_s)
        headers["retry-after-ms"] = str(d.retry_after_ms)
    if not d.reason.retryable:
        headers["x-should-retry"] = "false"  # waiting a few seconds will not help
    if d.reason.code == "insufficient_quota":
        kind = "insufficient_quota"
    elif d.reason in (DenyReason.CONCURRENCY, DenyReason.RPM):
        kind = "requests"
    else:
        kind = "tokens"
    err = RateLimited(msg, code=d.reason.code, headers=headers, error_type=kind)
    err.reason = f"quota_{d.reason.label}"
    return err


def _human(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3g}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f} days"


def unexpected(exc: BaseException) -> bool:
    """An exception the vocabulary does not name (a bug): `from_exception` hides it behind
    `InternalError`, and whoever answers it logs its traceback."""
    return not isinstance(exc, GatewayError | EngineError)


def from_exception(exc: BaseException) -> GatewayError:
    """Any exception -> the GatewayError a client should see."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, EngineRequestInvalid):
        return InvalidRequest(str(exc))
    if isinstance(exc, EngineOverloaded):  # an engine host's memory guard: overloaded, as here
        retry = exc.retry_after_s
        return Overloaded(str(exc), headers={} if retry is None else {"Retry-After": _retry_after(retry)})
    if isinstance(exc, EngineUnavailable):
        return EngineUnavailableError(str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, EngineError):
        return EngineUnavailableError(str(exc))
    return InternalError("The server had an error while processing your request.")
