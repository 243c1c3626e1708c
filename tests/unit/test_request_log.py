"""The request log's pieces without a server: ids, readiness, the JSON formatter."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace
from typing import Any

from gateway.canary_state import Book, Result
from gateway.http.ops import readiness
from gateway.logs import JsonFormatter
from gateway.request_log import RequestLog, client_request_id


def test_a_client_request_id_is_used_only_when_safe_and_short() -> None:
    assert client_request_id("abc-123") == "abc-123"
    assert client_request_id("  4f1c:run/7+a=b@x.y_z  ") == "4f1c:run/7+a=b@x.y_z"
    assert client_request_id("spaced id") is None
    assert client_request_id("x status=200 user=admin") is None  # would forge a text log's fields
    assert client_request_id('x"}') is None
    assert client_request_id("sk-proj-abcdefgh1234") is None  # key-shaped: never echoed or logged
    assert client_request_id("x" * 128) == "x" * 128
    assert client_request_id("x" * 129) is None
    assert client_request_id("") is None
    assert client_request_id("bad\nid") is None
    assert client_request_id("é") is None
    assert client_request_id(None) is None


def test_a_request_without_a_job_has_a_generated_id_and_no_usage() -> None:
    rl = RequestLog(method="GET", path="/v1/models")
    rl.status = 200
    rec = rl.record(now=rl.started + 0.25)
    assert rec["request_id"].startswith("req-") and rec["total_ms"] == 250.0
    assert rec["outcome"] == "ok" and rec["prompt_tokens"] is None and rec["admission"] is None
    given = RequestLog(method="GET", path="/", client_id="mine")
    assert given.record()["request_id"] == "mine"


def _state(*, healthy: bool = True, quota_down: bool = False, on_outage: str = "closed", draining: bool = False) -> Any:
    engine = SimpleNamespace(is_healthy=healthy)
    quota = SimpleNamespace(is_down=quota_down, settings=SimpleNamespace(on_outage=on_outage))
    return SimpleNamespace(
        registry=[SimpleNamespace(name="tiny", engine=engine)],
        quota=quota,
        draining=draining,
        supervisor=None,
        canary=Book(),
        memory=None,
    )


def test_readiness_names_every_reason() -> None:
    assert readiness(_state()) == ([], [])
    assert readiness(None) == (["starting"], [])
    reasons, _ = readiness(_state(healthy=False, quota_down=True, draining=True))
    assert reasons == ["engine tiny: unavailable", "quota store: redis unreachable", "draining"]
    # Fail-open serves on local limits while Redis is away: ready, with a warning.
    reasons, warnings = readiness(_state(quota_down=True, on_outage="open"))
    assert reasons == [] and warnings == ["quota store: redis unreachable (serving on local limits)"]
    # A model the canary found degraded still serves: a warning.
    state = _state()
    state.canary.record(Result("tiny", "degraded", "tool calls differ", 0.0))
    assert readiness(state) == ([], ["model tiny: degraded (canary: tool calls differ)"])


def test_the_json_formatter_writes_one_object_a_line() -> None:
    fmt = JsonFormatter()
    plain = logging.LogRecord("x.y", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    out = json.loads(fmt.format(plain))
    assert out["level"] == "WARNING" and out["logger"] == "x.y" and out["msg"] == "hello world"
    req = logging.LogRecord("sparkgate.request", logging.INFO, __file__, 1, "request %s", ("a=1",), None)
    req.fields = {"request_id": "r1", "status": 200}
    out = json.loads(fmt.format(req))
    assert out["msg"] == "request" and out["request_id"] == "r1" and out["status"] == 200
    try:
        raise ValueError("boom")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed\nhere", (), sys.exc_info())
    line = fmt.format(failed)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exc"]
