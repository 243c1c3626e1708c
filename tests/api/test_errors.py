"""Every client error is an OpenAI error object with the right status, type and code."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import API_KEY, DENSE, DENSE_MAX_LEN, MESSAGES_SHORT, MOE, OTHER_KEY, OTHER_MAX_CONTEXT, Server

pytestmark = pytest.mark.engine  # starts vLLM engines


def assert_error(
    exc: openai.APIStatusError, status: int, code: str | None, type_: str = "invalid_request_error"
) -> None:
    assert exc.status_code == status
    body = exc.response.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_
    assert err["code"] == code
    assert err["message"] and "Traceback" not in err["message"]


def test_missing_key_is_401(server: Server) -> None:
    # The SDK refuses to send without a key, so plain HTTP here.
    r = httpx.post(f"{server.api}/chat/completions", json={"model": DENSE, "messages": MESSAGES_SHORT}, timeout=60)
    assert r.status_code == 401
    assert r.json()["error"] == {
        "message": r.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": None,
        "code": "missing_api_key",
    }
    r = httpx.get(f"{server.api}/models", headers={"Authorization": "Basic abc"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_wrong_key_is_401(server: Server) -> None:
    c = openai.OpenAI(base_url=server.api, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        c.chat.completions.create(model=DENSE, messages=MESSAGES_SHORT, max_tokens=1)
    assert_error(e.value, 401, "invalid_api_key")


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-17", messages=MESSAGES_SHORT, max_tokens=1)
    assert_error(e.value, 404, "model_not_found")
    assert e.value.response.json()["error"]["param"] == "model"


def test_prompt_too_long_is_400_context_length_exceeded(client: openai.OpenAI) -> None:
    long = "word " * (DENSE_MAX_LEN + 100)  # one token per word
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DENSE, messages=[{"role": "user", "content": long}])
    assert_error(e.value, 400, "context_length_exceeded")


def test_prompt_plus_max_tokens_too_long(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=DENSE, prompt="hello", max_tokens=DENSE_MAX_LEN)
    assert_error(e.value, 400, "context_length_exceeded")
    assert str(DENSE_MAX_LEN) in e.value.response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
    ],
)
def test_schema_errors_are_400_not_422(client: openai.OpenAI, kwargs: dict, param: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DENSE, messages=MESSAGES_SHORT, **kwargs)
    assert_error(e.value, 400, "invalid_value")
    assert e.value.response.json()["error"]["param"] == param


def test_n_above_the_configured_cap(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DENSE, messages=MESSAGES_SHORT, n=5, max_tokens=1)
    assert_error(e.value, 400, "invalid_value")


def test_missing_messages(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=DENSE, messages=[])
    assert_error(e.value, 400, "invalid_value")


def test_bad_role_and_unsupported_content(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=DENSE, messages=[{"role": "wizard", "content": "hi"}])  # type: ignore[misc,list-item]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=DENSE,
            messages=[
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
            ],
        )
    assert_error(e.value, 400, "unsupported_content")
    # A text model answers an image with the model's name and why (before the image is read).
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=DENSE,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )
    assert_error(e.value, 400, "images_not_supported")
    assert f"'{DENSE}' does not take images: it has no vision encoder" in e.value.message


def test_out_of_vocabulary_token_ids(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=DENSE, prompt=[1, 2, 10_000_000], max_tokens=1)
    assert_error(e.value, 400, "invalid_value")


def test_raw_http_errors(server: Server) -> None:
    h = {"Authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{server.api}/chat/completions", content=b"{not json", headers=h, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(f"{server.api}/chat/completions", json={"messages": MESSAGES_SHORT}, headers=h, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_required_parameter"
    assert r.json()["error"]["param"] == "model"
    r = httpx.get(f"{server.base_url}/v1/nothing-here", headers=h, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(f"{server.api}/chat/completions", headers=h, timeout=60)
    assert r.status_code == 405 and "error" in r.json()
    r = httpx.post(f"{server.api}/chat/completions", json=[1, 2], headers=h, timeout=60)
    assert r.status_code == 400 and "error" in r.json()


def test_health_needs_no_key(server: Server) -> None:
    r = httpx.get(f"{server.base_url}/health", timeout=60)
    assert r.status_code == 200 and r.json() == {"status": "ok"}  # liveness: nothing more
    r = httpx.get(f"{server.base_url}/ready", timeout=60)
    assert r.status_code == 200 and r.json()["ready"] is True
    assert {name: m["state"] for name, m in r.json()["models"].items()} == {DENSE: "up", MOE: "up"}


def test_key_context_limit_is_400_context_length_exceeded(server: Server) -> None:
    other = openai.OpenAI(base_url=server.api, api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        other.chat.completions.create(model=DENSE, messages=MESSAGES_SHORT, max_tokens=OTHER_MAX_CONTEXT)
    assert_error(e.value, 400, "context_length_exceeded")
    assert f"maximum context length is {OTHER_MAX_CONTEXT} tokens" in e.value.response.json()["error"]["message"]
    # Without max_tokens the key's context bounds the output instead.
    r = other.chat.completions.with_raw_response.create(model=DENSE, messages=MESSAGES_SHORT, max_tokens=8)
    assert r.status_code == 200


def test_unknown_priority_class_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=DENSE, messages=MESSAGES_SHORT, max_tokens=4, extra_headers={"X-Sparkgate-Priority": "urgent"}
        )
    assert_error(e.value, 400, "invalid_priority")
