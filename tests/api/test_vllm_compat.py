"""What scripts written for `vllm serve` and OpenAI's spec expect of the answers (on the replay
engine): `GET /version`, a string `system_fingerprint`, a named `service_tier` or a 400, and a
405 that says which methods the URL takes."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import API_KEY, REPLAY, App

HI: Any = [{"role": "user", "content": "hi"}]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def client(replay_app: App) -> openai.OpenAI:
    return replay_app.sdk()


def test_version_answers_like_vllm_s(replay_app: App) -> None:
    r = replay_app.http.get("/version")
    assert r.status_code == 200
    body = r.json()
    assert body["version"].startswith("0.") and body["sparkgate"]  # vLLM's version, then ours


def test_system_fingerprint_is_a_string(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=REPLAY, messages=HI, max_tokens=8)
    assert isinstance(r.system_fingerprint, str) and r.system_fingerprint
    chunks = list(client.chat.completions.create(model=REPLAY, messages=HI, max_tokens=8, stream=True))
    assert all(isinstance(c.system_fingerprint, str) for c in chunks)
    done = client.completions.create(model=REPLAY, prompt="hi", max_tokens=4)
    assert isinstance(done.system_fingerprint, str)


def test_service_tier_is_one_of_openai_s(client: openai.OpenAI, replay_app: App) -> None:
    assert client.chat.completions.create(model=REPLAY, messages=HI, max_tokens=4, service_tier="auto").choices
    body = {"model": REPLAY, "messages": HI, "max_tokens": 4, "service_tier": ""}
    r = replay_app.http.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "service_tier"
    r = replay_app.http.post("/v1/responses", json={"model": REPLAY, "input": "hi", "service_tier": "x"}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "service_tier"


def test_a_method_the_url_does_not_take_is_405_with_allow(replay_app: App) -> None:
    for method in ("TRACE", "PUT", "GET"):
        r = replay_app.http.request(method, "/v1/chat/completions", headers=AUTH)
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["code"] == "method_not_allowed"


def test_completion_logprobs_zero_carry_the_sampled_token(client: openai.OpenAI) -> None:
    r = client.completions.create(model=REPLAY, prompt="hi", max_tokens=6, logprobs=0)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.top_logprobs is not None
    assert [list(top or {}) for top in lp.top_logprobs] == [[t] for t in lp.tokens]
