"""Latency-SLO routing between two real vLLM CPU engines of different speed.

`deep` is the better model by config but paced to at least 100 ms per token (the same
tiny model as `quick`, which decodes in well under 50 ms per token on any machine this
runs on); both profiles claim 8 ms per token. The router must learn deep's real decode
speed from what it observes and then send `auto` traffic that needs a fast decode to
quick, while traffic with a loose objective still gets deep.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.settings import hash_key
from tests.conftest import MODELS, Fleet, Launch, Server, free_port, server_section

KEY = "sk-route-user"
SUBSTITUTE_KEY = "sk-route-flexible"
ADMIN_KEY = "sk-route-admin"
SNAPPY_TPOT_S = 0.05  # between the two engines' decode speeds, with a margin either way
DEEP_PACE_S = 0.1  # deep's slowest: twice the objective on a machine of any speed
MESSAGES = [{"role": "user", "content": "Tell me a story."}]

pytestmark = pytest.mark.engine


def _model(name: str, path: str, quality: float, core: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "path": str(MODELS / path),
        "max_model_len": 4096,
        "max_num_seqs": 4,
        "kv_cache_bytes": "64MiB",
        "cpu_cores": core,
        "quality": quality,
        # Both profiles claim 8 ms per token: only observation can tell them apart.
        "latency": {"prefill_tokens_per_s": 20_000, "ttft_overhead_s": 0.05, "tpot_s": 0.008},
        **extra,
    }


ENGINES = 2  # vLLM engines its server starts: the fleet starts it in a wave


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    port = free_port()
    second = "1" if (os.cpu_count() or 1) > 1 else "0"
    cfg = {
        "server": server_section(port, engine_start="parallel"),  # each engine on its own core
        "auth": {
            "required": True,
            "keys": [
                {"name": "user", "sha256": hash_key(KEY)},
                {"name": "flexible", "sha256": hash_key(SUBSTITUTE_KEY), "allow_substitution": True},
            ],
            "admin_keys": [{"name": "ops", "sha256": hash_key(ADMIN_KEY)}],
        },
        "routing": {
            "enabled": True,
            "classes": {"snappy": {"ttft_s": 5.0, "tpot_s": SNAPPY_TPOT_S}, "relaxed": {"deadline_s": 600}},
            "default_class": "snappy",
            "window": 4,
        },
        "models": [
            _model("quick", "tiny-qwen3", 1, second),
            _model("deep", "tiny-qwen3", 2, "0", token_pace_s=DEEP_PACE_S),
        ],
    }
    path = tmp / "routing.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return [Launch(path, tmp / "gateway.log", port)]


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


@pytest.fixture(scope="module", autouse=True)
def first_auto(gateway: Server) -> Any:
    """The gateway's first `auto` request, made before any test of this module runs (autouse),
    whatever their order: routed while the router has observed nothing."""
    return ask(gateway, "auto")


def ask(server: Server, model: str, key: str = KEY, slo: str | None = None, max_tokens: int = 24) -> Any:
    client = openai.OpenAI(base_url=server.api, api_key=key, max_retries=0)
    headers = {"X-Sparkgate-SLO": slo} if slo else None
    return client.chat.completions.with_raw_response.create(
        model=model,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        extra_body={"ignore_eos": True},
        extra_headers=headers,
    )


def routing_stats(server: Server) -> dict[str, Any]:
    r = httpx.get(f"{server.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    r.raise_for_status()
    return r.json()["routing"]  # type: ignore[no-any-return]


def test_router_learns_engine_speed_and_routes_by_it(gateway: Server, first_auto: Any) -> None:
    # Before any observation both look equally fast: `auto` takes the better model.
    first = first_auto
    assert first.headers["x-sparkgate-model"] == "deep"
    assert first.headers["x-sparkgate-slo"] == "snappy"
    assert first.headers["x-sparkgate-route"] == "best: meets snappy"
    assert float(first.headers["x-sparkgate-predicted-tpot-ms"]) < SNAPPY_TPOT_S * 1000
    assert first.parse().usage.completion_tokens == 24

    # It watched deep decode at several times its profile: now `auto` degrades to quick.
    learned = routing_stats(gateway)["models"]["deep"]
    assert learned["observations"] >= 2 and learned["idle_tpot_s"] > SNAPPY_TPOT_S, learned
    second = ask(gateway, "auto")
    assert second.headers["x-sparkgate-model"] == "quick"
    assert second.headers["x-sparkgate-route"].startswith("degraded from deep (TPOT ")
    for _ in range(3):  # quick's observations confirm its profile: it keeps meeting snappy
        assert ask(gateway, "auto").headers["x-sparkgate-model"] == "quick"
    quick = routing_stats(gateway)["models"]["quick"]
    assert quick["observations"] >= 4 and quick["idle_tpot_s"] < SNAPPY_TPOT_S, quick

    # A loose objective (a request header) still gets the better model.
    relaxed = ask(gateway, "auto", slo="relaxed")
    assert relaxed.headers["x-sparkgate-model"] == "deep" and relaxed.headers["x-sparkgate-slo"] == "relaxed"
    # `fast` takes the quickest predicted.
    assert ask(gateway, "fast", slo="relaxed").headers["x-sparkgate-model"] == "quick"


def test_explicit_model_is_honoured_or_refused_early(gateway: Server) -> None:
    ask(gateway, "deep", slo="relaxed")  # deep's speed is known (also when this test runs alone)
    # Named explicitly, deep is not swapped for another model: it cannot meet snappy even
    # idle, so the answer is an early 429 that tells the client not to retry.
    with pytest.raises(openai.RateLimitError) as err:
        ask(gateway, "deep")
    assert err.value.status_code == 429
    body = err.value.response.json()["error"]
    assert body["code"] == "slo_unattainable" and "even when idle" in body["message"]
    assert err.value.response.headers["x-should-retry"] == "false"
    # A key that allows substitution gets quick instead, and is told so.
    swapped = ask(gateway, "deep", key=SUBSTITUTE_KEY)
    assert swapped.headers["x-sparkgate-model"] == "quick"
    assert swapped.headers["x-sparkgate-route"] == "substituted: meets snappy"
    # An unknown class is the request's fault.
    with pytest.raises(openai.BadRequestError) as bad:
        ask(gateway, "auto", slo="warp-speed")
    assert bad.value.response.json()["error"]["code"] == "invalid_slo_class"


def test_routing_aliases_are_listed_as_models(gateway: Server) -> None:
    models = openai.OpenAI(base_url=gateway.api, api_key=KEY).models.list()
    assert [m.id for m in models.data] == ["quick", "deep", "auto", "best", "fast"]
    with pytest.raises(openai.NotFoundError):
        ask(gateway, "no-such-model")


def test_a_key_created_with_a_class_uses_it_and_an_unknown_class_is_refused(gateway: Server) -> None:
    def create(slo_class: str) -> httpx.Response:
        body = {"user": "dana", "limits": {"slo_class": slo_class}}
        auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.post(f"{gateway.base_url}/sparkgate/admin/keys", json=body, headers=auth, timeout=30)

    typo = create("relaxd")
    assert typo.status_code == 400, typo.text
    error = typo.json()["error"]
    assert error["code"] == "invalid_slo_class" and error["param"] == "limits.slo_class"
    assert error["message"] == "Unknown SLO class 'relaxd'; use one of: relaxed, snappy."
    made = create("relaxed")
    assert made.status_code == 201, made.text
    assert ask(gateway, "auto", key=made.json()["key"]).headers["x-sparkgate-slo"] == "relaxed"
