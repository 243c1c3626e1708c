"""Shared fixtures. Which gateway a test should use, cheapest first:

- `replay_app` / `in_process(cfg)`: the ASGI app in this process (replay or simulated engines),
  no port; an SDK takes its `http` as `http_client`. For anything that needs no real socket.
- `replay_server`: the replay config behind a real `sparkgate serve`, for the whole session
  (coding-agent CLIs, clients that hang up mid-stream).
- `server`: two real vLLM CPU engines behind one server, for the whole session (`engine` tests).
- A module's own servers: a module-level `side_by_side(request, tmp) -> list[Launch]` and a
  module fixture taking them from `fleet`, which starts every module's servers side by side
  (`ENGINES = n` for servers with vLLM engines: those start in waves). Build configs with
  `tests.configs.shipped_config(name, **overrides)` where a shipped config plus changes will do.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests import exit_with_parent
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
API_KEY = "sk-test-key"
OTHER_KEY = "sk-test-other"
RAW_KEY = "sk-test-raw"  # prompt normalization off
OTHER_MAX_CONTEXT = 256
DENSE = "tiny-dense"
MOE = "tiny-moe"
STARTUP_TIMEOUT_S = 420
DENSE_MAX_LEN = 32768  # long enough that an un-aborted request would run for over a minute
MESSAGES_SHORT = [{"role": "user", "content": "hi"}]


# Each distinct failure, in full, for CI to print last: its output keeps only the tail, where
# a failed fixture (e.g. a server that did not start, with its log) would otherwise be lost.
FAILURES = Path(os.environ.get("SPARKGATE_TEST_FAILURES") or ROOT / ".cache" / "test-failures.txt")  # per process
_seen_failures: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    FAILURES.parent.mkdir(parents=True, exist_ok=True)
    FAILURES.write_text("")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not report.failed:
        return
    text = report.longreprtext
    key = text[-2000:]  # one fixture's error repeats for every test that uses it
    with FAILURES.open("a") as f:
        if key in _seen_failures:
            f.write(f"{report.when} of {report.nodeid}: failed as above\n")
            return
        _seen_failures.add(key)
        f.write(f"==== {report.when} of {report.nodeid}\n")
        for log_path in list(_live_logs):  # what the servers said went wrong, not all they said
            f.write(f"---- {log_path.name}: its last warnings and errors\n{_log_problems(log_path)}\n")
        f.write(f"---- the failure\n{text[-8000:]}\n")  # last: CI's tail keeps the end


_live_logs: list[Path] = []  # the logs of the servers `launch` runs now


# The coverage gate (`--cov=policies`, 100%) is about the policies' own unit tests, and
# coverage's C tracer costs every line the other tests run, policies or not. So only tests/unit
# is measured, less its modules marked `no_cover` (pytest-cov's marker: coverage pauses while
# their tests run).
UNIT = ROOT / "tests" / "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if UNIT not in item.path.parents:
            item.add_marker(pytest.mark.no_cover)


def _log_problems(log_path: Path, lines: int = 15) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError as e:
        return f"(unreadable: {e})"
    kept = [line for line in text.splitlines() if re.search(r"WARNING|ERROR|CRITICAL|Traceback|Error:", line)]
    return "\n".join(line[:400] for line in kept[-lines:]) or "(none)"


# One pooled client: polling with a new client per call costs the test process
# CPU it may not get while the engines spin on both cores. And a long timeout: a gateway
# beside busy CPU engines has gone unanswered for 11 s (CI, test_overload with httpx's 5 s).
_STATS_CLIENT = httpx.Client(timeout=60)


@dataclass(frozen=True)
class Server:
    base_url: str
    log_path: Path
    proc: subprocess.Popen[bytes]
    config: Path | None = None  # what it serves

    @property
    def api(self) -> str:
        return f"{self.base_url}/v1"

    def requests_logged(self) -> list[dict[str, str]]:
        """The gateway's request log lines (`sparkgate.request`), as key=value fields."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines if "sparkgate.request: request " in line]

    def stats(self, key: str = API_KEY) -> dict:  # type: ignore[type-arg]
        """/sparkgate/stats as `key` sees it (polled by tests: one pooled client)."""
        r = _STATS_CLIENT.get(f"{self.base_url}/sparkgate/stats", headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


def server_section(port: int, **extra: Any) -> dict[str, Any]:
    """A test config's `server:`: loopback, info logs, the tree's caches."""
    return {"host": "127.0.0.1", "port": port, "log_level": "info", "cache_dir": str(ROOT / ".cache"), **extra}


def server_config(tmp: Path, port: int) -> Path:
    """config/default.yaml (the embedded CPU default: its quotas, admission and limits) on
    `port`, with the tests' keys, fewer choices a request (max_n), and its vLLM model as the
    two tiny engines side by side, one core each: DENSE (a long context, so that an un-aborted
    request runs for minutes) and MOE (random weights, a short context)."""
    from gateway.settings import hash_key
    from tests.configs import shipped_config, write_config

    cfg = shipped_config(
        "default",
        server={"port": port, "engine_start": "parallel"},  # each engine on its own core
        auth={
            "keys": [
                {"name": "tester", "sha256": hash_key(API_KEY)},
                # A key with its own limits: a short context and the batch class.
                {"name": "other", "sha256": hash_key(OTHER_KEY), "max_context": OTHER_MAX_CONTEXT, "priority": "batch"},
                {"name": "raw", "sha256": hash_key(RAW_KEY), "normalize_prompts": False},
            ]
        },
        limits={"max_n": 4},
    )
    # Overrides change named items, they add none: the two are the shipped vLLM model, changed
    # (the shipped replay model is left out: the replay tests have their own server).
    shipped = next(m for m in cfg["models"] if m["name"] == "sparkgate-tiny")
    cfg["models"] = [
        {
            **shipped,
            "name": DENSE,
            "aliases": ["dense-alias"],
            "max_model_len": DENSE_MAX_LEN,
            "kv_cache_bytes": "64MiB",
            "cpu_cores": "0",
        },
        {
            **shipped,
            "name": MOE,
            "aliases": [],
            "path": "models/tiny-qwen3-moe",
            "load_format": "dummy",
            "max_model_len": 2048,
            "max_num_seqs": 4,
            "kv_cache_bytes": "32MiB",
            "cpu_cores": "1" if (os.cpu_count() or 1) > 1 else "0",
        },
    ]
    return write_config(cfg, tmp, "sparkgate-test.yaml")


def open_post(server: Server, path: str, payload: dict, key: str = API_KEY) -> socket.socket:  # type: ignore[type-arg]
    """POST over a raw socket, so the test decides exactly when the client hangs up
    (an HTTP client may read on, or drain the body, before it closes)."""
    body = json.dumps(payload).encode()
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
        + f"Authorization: Bearer {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return sock


@dataclass(frozen=True)
class Launch:
    """One `sparkgate serve` (or another serving command) to run on a config."""

    config: Path
    log_path: Path
    port: int
    command: str = "serve"
    health: str = "/ready"
    env: dict[str, str] | None = None


@contextlib.contextmanager
def launch(
    config: Path,
    log_path: Path,
    port: int,
    command: str = "serve",
    health: str = "/ready",
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Run `sparkgate serve` (or another serving command) on a config until the block
    exits; fail fast with its log."""
    with launch_all(Launch(config, log_path, port, command, health, env)) as (server,):
        yield server


def config_launch(cfg: dict[str, Any], tmp: Path, **kw: Any) -> Launch:
    """A `Launch` of `cfg` (a dict, e.g. from tests.configs.shipped_config) on its
    `server.port`, written to and logging into `tmp`."""
    from tests.configs import write_config

    return Launch(write_config(cfg, tmp), tmp / "server.log", cfg["server"]["port"], **kw)


@dataclass
class _Started:
    """One server process `launch_all` or the fleet started, and its log file."""

    spec: Launch
    proc: subprocess.Popen[bytes]
    log: Any
    server: Server | None = None


def _start(spec: Launch) -> _Started:
    log = spec.log_path.open("wb")
    proc = subprocess.Popen(
        # It ends with this process, killed or not (tests/exit_with_parent.py).
        exit_with_parent.command("gateway.cli", spec.command, "--config", str(spec.config)),
        cwd=ROOT,
        env=None if spec.env is None else {**os.environ, **spec.env},
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its own process group (killpg below), but the same session: on this kernel a busy
        # engine in another session (autogroup) can stall the test client for seconds.
        process_group=0,
    )
    return _Started(spec, proc, log)


def _ready(started: _Started, deadline: float) -> Server:
    started.server = _wait_ready(started.spec, started.proc, deadline)
    _live_logs.append(started.spec.log_path)
    return started.server


def _stop_all(started: list[_Started]) -> None:
    for one in started:
        if one.server is not None:
            _live_logs.remove(one.spec.log_path)
    # The first SIGINT drains (gateway/drain.py): requests a test left running may go on
    # for the grace; a second one aborts them, so a teardown never waits that out.
    for one in started:
        with contextlib.suppress(ProcessLookupError):  # a test may have killed it already
            os.killpg(one.proc.pid, signal.SIGINT)
    for one in started:
        _stop(one.proc)
        one.log.close()
        if os.environ.get("SPARKGATE_TEST_SHOW_LOG"):
            print(one.spec.log_path.read_text()[-3000:])


@contextlib.contextmanager
def launch_all(*launches: Launch) -> Iterator[list[Server]]:
    """Start every server at once, then wait until each is ready: servers whose engines sit
    on different cores start side by side, not one after another."""
    started: list[_Started] = []
    try:
        started.extend(_start(spec) for spec in launches)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        yield [_ready(one, deadline) for one in started]
    finally:
        _stop_all(started)


# A module's servers that the session starts side by side with every other module's (`fleet`):
# a module-level function `side_by_side(request, tmp) -> list[Launch]`, the module's servers.
SIDE_BY_SIDE = "side_by_side"


# A module whose servers start vLLM engines says how many (`ENGINES = n`): those are not all
# started at once (a tiny engine's server holds ~3 GiB), but in waves of at most this many
# engines: a wave of the modules that run next starts as soon as the one before it is ready, so
# it starts while that wave's modules run, not when its own first module needs it.
ENGINES = "ENGINES"
WAVE_ENGINES = 2  # one per core: an engine's start is mostly one core's work


class Fleet:
    """The servers of every module this session runs that has a `side_by_side` function,
    started side by side and waited for together: a server's start is mostly one core's work
    (imports, the tokenizer, an engine's load), so N of them side by side on 2 cores take
    about half the time of N one after another. Servers without vLLM engines (and the
    session's own) all start at the first module's need; those with engines (`ENGINES`) in
    waves. A module takes its own with `servers` (they stop when its block exits); a server
    that failed to start fails only its module."""

    def __init__(self, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._request = request
        self._tmp = tmp_path_factory
        self._started: dict[str, list[_Started]] = {}
        self._failed: dict[str, BaseException] = {}
        self._waiting: list[tuple[str, Any]] = []  # engine modules not started yet, in run order
        self._starting: set[str] = set()  # modules whose servers were started, not yet awaited

    def start(self) -> None:
        items = [item for item in self._request.session.items if "fleet" in item.fixturenames]  # type: ignore[attr-defined]
        first: dict[str, Callable[[Path], list[Launch]]] = {}
        for name, make_session in SESSION_SERVERS.items():  # the session's own, if a test uses them
            if any(_uses_conftest_fixture(item, name) for item in items):
                first[name] = make_session
        for module in dict.fromkeys(item.module for item in items if _uses_module_fleet(item)):  # type: ignore[attr-defined]
            if getattr(module, SIDE_BY_SIDE, None) is None:
                continue
            if getattr(module, ENGINES, 0):
                self._waiting.append((module.__name__, module))
            else:
                first[module.__name__] = self._maker(module)
        self._launch(first)
        if self._waiting:
            self._spawn_wave(self._waiting[0][0])

    def _maker(self, module: Any) -> Callable[[Path], list[Launch]]:
        return lambda tmp: getattr(module, SIDE_BY_SIDE)(self._request, tmp)  # type: ignore[no-any-return]

    def _launch(self, makers: dict[str, Callable[[Path], list[Launch]]]) -> None:
        self._spawn(makers)
        self._await(list(makers))

    def _spawn(self, makers: dict[str, Callable[[Path], list[Launch]]]) -> None:
        for name, make in makers.items():
            self._started[name] = [_start(spec) for spec in make(self._tmp.mktemp(name.rsplit(".", 1)[-1]))]
            self._starting.add(name)

    def _await(self, names: list[str]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for name in names:
            self._starting.discard(name)
            try:
                for one in self._started[name]:
                    _ready(one, deadline)
            except Exception as e:  # its module fails with it, not the one that asked first
                self._failed[name] = e

    def _spawn_wave(self, module: str) -> None:
        """Start `module`'s servers, with those of the engine modules that run next, up to
        WAVE_ENGINES engines in all."""
        at = next(i for i, (name, _) in enumerate(self._waiting) if name == module)
        wave = [self._waiting.pop(at)]
        engines = getattr(wave[0][1], ENGINES)
        while at < len(self._waiting) and engines + getattr(self._waiting[at][1], ENGINES) <= WAVE_ENGINES:
            engines += getattr(self._waiting[at][1], ENGINES)
            wave.append(self._waiting.pop(at))
        self._spawn({name: self._maker(mod) for name, mod in wave})

    @contextlib.contextmanager
    def servers(self, module: str) -> Iterator[list[Server]]:
        if module not in self._started and any(name == module for name, _ in self._waiting):
            self._spawn_wave(module)
        if module in self._starting:
            self._await([name for name in self._started if name in self._starting])
            if self._waiting:  # the next wave starts while this one's modules run
                self._spawn_wave(self._waiting[0][0])
        started = self._started.pop(module, None)
        if started is None:
            raise RuntimeError(f"{module} has no `{SIDE_BY_SIDE}` servers (or took them already)")
        try:
            if module in self._failed:
                raise self._failed.pop(module)
            yield [one.server for one in started if one.server is not None]
        finally:
            _stop_all(started)

    def close(self) -> None:
        for started in self._started.values():
            _stop_all(started)
        self._started.clear()


def _uses_module_fleet(item: pytest.Item) -> bool:
    """Does `item` use a fixture of its own module that takes the fleet (its module's servers)?"""
    infos = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
    module = item.module.__name__  # type: ignore[attr-defined]
    return any(defs and defs[-1].func.__module__ == module and "fleet" in defs[-1].argnames for defs in infos.values())


def _uses_conftest_fixture(item: pytest.Item, name: str) -> bool:
    """Does `item` use this file's fixture `name` (not a module's own of that name)?"""
    defs = item._fixtureinfo.name2fixturedefs.get(name)  # type: ignore[attr-defined]
    return bool(defs) and defs[-1].func.__module__ == __name__


@pytest.fixture(scope="session")
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(request, tmp_path_factory)
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.close()


def wanted(request: pytest.FixtureRequest, fixture: str, module: str, at_least: int = 1) -> int:
    """How many of the session's tests in `module` (a name) use `fixture` (at least `at_least`)."""
    items = request.session.items
    uses = sum(1 for item in items if item.module.__name__ == module and fixture in item.fixturenames)  # type: ignore[attr-defined]
    return max(at_least, uses)


def _wait_ready(spec: Launch, proc: subprocess.Popen[bytes], deadline: float) -> Server:
    base = f"http://127.0.0.1:{spec.port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{spec.log_path.read_text()[-5000:]}")
        try:
            if httpx.get(f"{base}{spec.health}", timeout=2).status_code == 200:
                return Server(base_url=base, log_path=spec.log_path, proc=proc, config=spec.config)
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not start in {STARTUP_TIMEOUT_S}s:\n{spec.log_path.read_text()[-5000:]}")
        time.sleep(0.2)  # a start is polled, not waited out: ~40 starts in the suite


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the server only, not its engines
            os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class RedisServer:
    """A real redis-server (Debian's package) on a free port, its data in a temp dir.
    Append-only, fsynced every second: a stop (SIGTERM) flushes it, so a stop/start keeps what
    was written, and no write waits on the disk (an fsync per write stalled Redis past the
    replicas' 2 s timeout under the 300-request load test)."""

    def __init__(self, data_dir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: `apt-get install redis-server` (.ci/run does it)")
        self.binary = binary
        self.dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "everysec", "--protected-mode", "no"]
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [self.binary, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=exit_with_parent.pdeathsig(),  # it ends with this process, killed or not
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start:\n{(self.dir / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def two_engine_launch(tmp: Path) -> Launch:
    """`sparkgate serve` on `server_config`: the two tiny vLLM engines, in `tmp`."""
    port = free_port()
    return Launch(server_config(tmp, port), tmp / "server.log", port)


def sdk_client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.api, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def server(fleet: Fleet) -> Iterator[Server]:
    """The two tiny vLLM engines behind one server, for the whole session (started with the
    fleet: beside the other servers it needs)."""
    with fleet.servers("server") as (srv,):
        yield srv


REPLAY = "replay"  # a replay engine, tool calls read as Qwen3's JSON form (the tiny template's)
REPLAY_XML = "replay-xml"  # the same recordings, tool calls read as the XML form
# The same recordings with a coding agent's context: Claude Code sends a ~12K-token prompt
# and asks 32,000 output tokens (the replay engine holds no KV: a long context costs nothing).
REPLAY_AGENTS = "replay-agents"
AGENT_MAX_LEN = 131072


def replay_dict(port: int | None = None) -> dict[str, Any]:
    """config/replay.yaml (replay engines, engine_adapter/replay.py: recorded Qwen turns, no
    weights) with the tests' key, on `port` (else a free one), its model under three names."""
    from gateway.settings import hash_key
    from tests.configs import shipped_config

    cfg = shipped_config("replay", auth={"keys": [{"name": "tester", "sha256": hash_key(API_KEY)}]})
    if port is not None:
        cfg["server"]["port"] = port
    # Overrides change named items, they add none: the three are the shipped one, renamed.
    shipped = cfg["models"][0]
    cfg["models"] = [
        {**shipped, "name": REPLAY, "max_model_len": 4096},
        {**shipped, "name": REPLAY_XML, "max_model_len": 4096, "tool_parser": "qwen3_xml"},
        {**shipped, "name": REPLAY_AGENTS, "max_model_len": AGENT_MAX_LEN},
    ]
    return cfg


def replay_config(tmp: Path, port: int) -> Path:
    out = tmp / "sparkgate-replay.yaml"
    out.write_text(yaml.safe_dump(replay_dict(port)))
    return out


@pytest.fixture(scope="session")
def replay_server(fleet: Fleet) -> Iterator[Server]:
    """The replay config behind a real server (a subprocess on a port): for what needs a socket
    (a client that hangs up, a coding agent's CLI, uvicorn's own behaviour); else `replay_app`."""
    with fleet.servers("replay_server") as (srv,):
        yield srv


def replay_launch(tmp: Path) -> Launch:
    port = free_port()
    return Launch(replay_config(tmp, port), tmp / "server.log", port)


# The session's servers, each started with the fleet if a test of the session uses it.
SESSION_SERVERS: dict[str, Callable[[Path], list[Launch]]] = {
    "server": lambda tmp: [two_engine_launch(tmp)],
    "replay_server": lambda tmp: [replay_launch(tmp)],
}


@dataclass(frozen=True)
class App:
    """The gateway's ASGI app in this process (`gateway.app.create_app`), no server and no port:
    it starts in about a second where a `sparkgate serve` subprocess takes several. `http` is an
    httpx.Client (Starlette's TestClient) that sends every request straight to the app; an SDK
    takes it as its `http_client` (`sdk`). A streamed answer arrives whole, so what needs a real
    socket (a client that hangs up mid-stream, a CLI, uvicorn's logs) uses a server instead."""

    http: httpx.Client
    base_url: str = "http://testserver"

    @property
    def api(self) -> str:
        return f"{self.base_url}/v1"

    def sdk(self, key: str = API_KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.api, api_key=key, http_client=self.http, max_retries=0)

    def stats(self, key: str = API_KEY) -> dict:  # type: ignore[type-arg]
        r = self.http.get("/sparkgate/stats", headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


@contextlib.contextmanager
def in_process(cfg: dict[str, Any], **create: Any) -> Iterator[App]:
    """The gateway on config `cfg` (a dict, e.g. from tests.configs.shipped_config) in this
    process, its engines started, until the block exits; `create`: more of create_app's
    arguments (e.g. `surfaces`)."""
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings

    # As a server would answer: an error in the app is a 500, not an exception in the test.
    with TestClient(create_app(Settings(**cfg), **create), raise_server_exceptions=False) as http:
        yield App(http)


@pytest.fixture(scope="module")
def replay_app() -> Iterator[App]:
    """`replay_server`'s config (the replay engines, API_KEY) in this process: see `App`."""
    with in_process(replay_dict()) as app:
        yield app


@pytest.fixture(scope="session")
def client(server: Server) -> openai.OpenAI:
    return sdk_client(server)


@pytest.fixture(scope="session")
def aclient(server: Server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.api, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def hf_tokenizer():  # type: ignore[no-untyped-def]
    """An independent tokenizer (transformers, not the server's) to check counts."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODELS / "tiny-qwen3"))
