"""The drain's logic (gateway/drain.py, gateway/http/draining.py) without a server process:
when it waits, when it aborts, what a refused client gets. The whole path through a real
`sparkgate serve` is tests/api/test_drain.py."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.drain import Drain, DrainingServer, Phase
from gateway.engine_host import host_refuses
from gateway.errors import GatewayError
from gateway.http.draining import DrainingMiddleware


class Request_:
    """A running request as the drain sees it: it ends when told, or when aborted."""

    def __init__(self, drain: Drain) -> None:
        self.aborted: GatewayError | None = None
        self.done = drain.track(self)

    def abort(self, error: GatewayError) -> None:
        self.aborted = error
        asyncio.get_running_loop().call_soon(lambda: self.done())  # it winds down a moment later


async def test_the_drain_ends_as_soon_as_running_requests_finish() -> None:
    drain = Drain(grace_s=600)
    a, b = Request_(drain), Request_(drain)
    run = asyncio.ensure_future(drain.run())
    await asyncio.sleep(0.01)
    assert drain.draining and drain.phase is Phase.DRAINING and not run.done()
    a.done()
    a.done()  # idempotent
    await asyncio.sleep(0.01)
    assert not run.done() and drain.running == 1
    b.done()
    await asyncio.wait_for(run, 5)  # long before the grace
    assert a.aborted is None and b.aborted is None


async def test_the_end_of_the_grace_aborts_what_still_runs() -> None:
    drain = Drain(grace_s=0.05)
    slow = Request_(drain)
    await asyncio.wait_for(drain.run(), 5)
    assert slow.aborted is not None and slow.aborted.status == 503
    assert slow.aborted.code == "server_shutting_down" and "aborted" in slow.aborted.message
    assert drain.phase is Phase.ABORTING and drain.running == 0


async def test_abort_cuts_the_grace_short_and_aborts_late_arrivals() -> None:
    drain = Drain(grace_s=600)
    running = Request_(drain)
    run = asyncio.ensure_future(drain.run())
    await asyncio.sleep(0.01)
    drain.abort()  # a second SIGTERM
    await asyncio.wait_for(run, 5)
    assert running.aborted is not None
    late = Request_(drain)  # admitted in the same instant: aborted as it registers
    assert late.aborted is not None


async def test_queued_requests_are_told_when_the_drain_begins() -> None:
    drain = Drain()
    waiting = asyncio.ensure_future(drain.stopped())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    drain.begin()
    await asyncio.wait_for(waiting, 5)


def _app(drain: Drain, refuses: object = None) -> httpx.AsyncClient:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    routes = [Route(p, ok, methods=["GET", "POST"]) for p in ("/health", "/ready", "/v1/models", "/engine/v1/m/stats")]
    routes.append(Route("/engine/v1/m/generate", ok, methods=["POST"]))
    inner = Starlette(routes=routes)
    app = DrainingMiddleware(inner, drain) if refuses is None else DrainingMiddleware(inner, drain, refuses)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


async def test_while_draining_new_requests_get_503_and_probes_are_served() -> None:
    drain = Drain()
    async with _app(drain) as http:
        assert (await http.get("/v1/models")).status_code == 200
        drain.begin()
        r = await http.get("/v1/models")
        assert r.status_code == 503
        assert r.json()["error"] == {
            "message": "The server is shutting down and takes no new requests; retry shortly.",
            "type": "server_error",
            "param": None,
            "code": "server_shutting_down",
        }
        assert r.headers["retry-after"] == "5" and r.headers["connection"] == "close"
        health = await http.get("/health")
        assert health.status_code == 200 and health.headers["connection"] == "close"


async def test_a_draining_engine_host_refuses_only_new_work() -> None:
    drain = Drain()
    drain.begin()
    async with _app(drain, host_refuses) as http:
        assert (await http.post("/engine/v1/m/generate")).status_code == 503
        assert (await http.get("/engine/v1/m/stats")).status_code == 200


async def test_signals_drain_then_abort_then_force_and_never_kill_the_process() -> None:
    drain = Drain(grace_s=600)
    server = DrainingServer(uvicorn.Config(Starlette()), drain)
    running = Request_(drain)
    server.started = True
    server._loop = asyncio.get_running_loop()
    server.handle_exit(signal.SIGTERM, None)
    await asyncio.sleep(0.05)
    assert drain.phase is Phase.DRAINING and not server.should_exit and running.aborted is None
    server.handle_exit(signal.SIGTERM, None)
    for _ in range(100):
        if server.should_exit:
            break
        await asyncio.sleep(0.01)
    assert running.aborted is not None and server.should_exit and not server.force_exit
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit
    assert server._captured_signals == []  # not raised again after serving: a clean exit 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_starting_stops_once_started_without_killing(sig: signal.Signals) -> None:
    server = DrainingServer(uvicorn.Config(Starlette()), Drain())
    server.handle_exit(sig, None)
    assert server.should_exit and server._captured_signals == []


def test_docker_gives_the_drain_its_time() -> None:
    """Docker sends SIGTERM to sparkgate itself and waits longer than the drain's grace
    before its SIGKILL (which would cut the streams the drain is finishing)."""
    import json
    import re
    from pathlib import Path

    import yaml

    from gateway.settings import ServerSettings

    root = Path(__file__).resolve().parents[2]
    service = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]["sparkgate"]
    grace = re.fullmatch(r"(\d+)s", service["stop_grace_period"])
    assert grace is not None and int(grace.group(1)) >= ServerSettings().drain_grace_s + 10
    assert service["init"] is True and service.get("stop_signal", "SIGTERM") == "SIGTERM"
    cmd = next(line for line in (root / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    assert isinstance(json.loads(cmd.removeprefix("CMD ")), list)  # exec form: no shell in between
