import json

import pytest

from engine_adapter.base import EngineError, EngineRequestInvalid, EngineUnavailable
from gateway.errors import (
    AuthenticationFailed,
    ContextLengthExceeded,
    EngineUnavailableError,
    GatewayError,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    PermissionDenied,
    RateLimited,
    RequestTooLarge,
    from_exception,
)
from gateway.http.anthropic.routes import SURFACE as ANTHROPIC
from gateway.http.openai.routes import SURFACE as OPENAI
from gateway.http.responses.routes import SURFACE as RESPONSES
from gateway.http.surface import DEFAULT, openai_body, surface_of


def test_body_shape() -> None:
    body = openai_body(ModelNotFound("nope", param="model"))
    assert body == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}
    }


def test_context_length_is_a_400_with_its_code() -> None:
    e = ContextLengthExceeded("too long")
    assert e.status == 400 and e.code == "context_length_exceeded"


def test_engine_errors_map() -> None:
    bad = from_exception(EngineRequestInvalid("bad logprobs"))
    assert isinstance(bad, InvalidRequest) and bad.status == 400
    dead = from_exception(EngineUnavailable("dead"))
    assert isinstance(dead, EngineUnavailableError) and dead.status == 503 and dead.headers["Retry-After"]
    assert from_exception(EngineError("other")).status == 503


def test_bugs_become_a_500_without_details() -> None:
    e = from_exception(KeyError("secret internals"))
    assert isinstance(e, InternalError) and e.status == 500
    assert "secret" not in e.message


def test_quota_refusals_speak_the_sdk_s_language() -> None:
    from gateway.errors import from_quota_refusal
    from policies.quotas import Deny, DenyReason

    rpm = from_quota_refusal("key:k1", Deny(DenyReason.RPM, 1500, 60, 60), 100)
    assert (rpm.status, rpm.code, rpm.error_type) == (429, "rate_limit_exceeded", "requests")
    assert rpm.headers["Retry-After"] == "2" and rpm.headers["retry-after-ms"] == "1500"
    assert "x-should-retry" not in rpm.headers and "requests per minute" in rpm.message
    spent = from_quota_refusal("team:lab", Deny(DenyReason.MONTHLY, 3_600_000 * 50, 10, 10), 5)
    assert (spent.code, spent.error_type, spent.headers["x-should-retry"]) == (
        "insufficient_quota",
        "insufficient_quota",
        "false",
    )
    assert "team lab" in spent.message and "resets in 2.1" in spent.message
    big = from_quota_refusal("key:k1", Deny(DenyReason.TPM_TOO_LARGE, 0, 100, 500), 500)
    assert "Retry-After" not in big.headers and big.headers["x-should-retry"] == "false" and big.error_type == "tokens"
    held = from_quota_refusal("key:k1", Deny(DenyReason.DAILY_IN_FLIGHT, 1000, 100, 90), 20)
    assert held.code == "rate_limit_exceeded" and "in flight" in held.message
    conc = from_quota_refusal("key:k1", Deny(DenyReason.CONCURRENCY, 1000, 2, 2), 20)
    assert "concurrent requests" in conc.message and openai_body(conc)["error"]["type"] == "requests"


@pytest.mark.parametrize(
    ("err", "status", "kind"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (AuthenticationFailed("who?"), 401, "authentication_error"),
        (PermissionDenied("no"), 403, "permission_error"),
        (ModelNotFound("nope"), 404, "not_found_error"),
        (RequestTooLarge("big"), 413, "request_too_large"),
        (RateLimited("slow down", headers={"Retry-After": "3"}), 429, "rate_limit_error"),
        (Overloaded("the box is full"), 529, "overloaded_error"),
        (EngineUnavailableError("down"), 503, "api_error"),
        (InternalError("bug"), 500, "api_error"),
    ],
)
def test_anthropic_shape(err: GatewayError, status: int, kind: str) -> None:
    r = ANTHROPIC.response(err)
    assert r.status_code == status
    assert json.loads(r.body) == {"type": "error", "error": {"type": kind, "message": err.message}}
    assert dict(r.headers).items() >= {k.lower(): v for k, v in err.headers.items()}.items()
    assert OPENAI.response(err).status_code == err.status  # OpenAI's shape keeps its status


def test_the_path_picks_the_surface_and_so_the_shape() -> None:
    surfaces = (OPENAI, RESPONSES, ANTHROPIC)
    assert surface_of("/v1/messages", surfaces) is surface_of("/v1/messages/count_tokens", surfaces) is ANTHROPIC
    assert surface_of("/v1/chat/completions", surfaces) is OPENAI
    assert surface_of("/v1/responses/resp_1", surfaces) is RESPONSES
    assert surface_of("/", surfaces) is surface_of("/sparkgate/admin/keys", surfaces) is DEFAULT
    assert DEFAULT.error_body is OPENAI.error_body is RESPONSES.error_body  # OpenAI's shape, but on Messages


def test_a_lifecycle_error_names_the_field_the_client_sent() -> None:
    err = InvalidRequest("Invalid 'max_tokens': must be at least 1, got 0.", param="max_tokens")
    assert RESPONSES.renamed(err).param == "max_output_tokens"
    assert err.message == "Invalid 'max_output_tokens': must be at least 1, got 0."
    moved = ContextLengthExceeded("The prompt in 'messages[3].content' is too long.", param="messages[3].content")
    assert RESPONSES.renamed(moved).param == "input"  # its items may sit elsewhere in the client's input
    assert "'input'" in moved.message
    kept = InvalidRequest("Invalid 'seed'.", param="seed")
    assert RESPONSES.renamed(kept) is kept and kept.param == "seed"
    assert OPENAI.renamed(InvalidRequest("x", param="max_tokens")).param == "max_tokens"
