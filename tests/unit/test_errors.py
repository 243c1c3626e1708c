from engine_adapter.base import EngineError, EngineRequestInvalid, EngineUnavailable
from gateway.errors import (
    ContextLengthExceeded,
    EngineUnavailableError,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    from_exception,
)


def test_body_shape() -> None:
    body = ModelNotFound("nope", param="model").body()
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
