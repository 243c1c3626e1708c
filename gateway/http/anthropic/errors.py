"""Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`: the kind named
by the status, 400 invalid_request_error, 401 authentication_error, 403 permission_error,
404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500 api_error; an
`Overloaded` box (no room, queue timeout, host memory low) is 529 overloaded_error, as
Anthropic answers when its capacity is full. In a stream, the same body as an `error` event."""

from __future__ import annotations

from typing import Any

from gateway.errors import GatewayError, Overloaded
from gateway.http.sse import sse
from gateway.redaction import redact

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def status(err: GatewayError) -> int:
    return 529 if isinstance(err, Overloaded) else err.status


def body(err: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": TYPES.get(status(err), "api_error"), "message": redact(err.message)}}


def stream_error(err: GatewayError) -> str:
    return sse(body(err), named=True)
