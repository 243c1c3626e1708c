"""`sparkgate serve | engine-host | check | plan | prepare-models | codex-config | hash-key |
keys create|list|revoke|usage`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    import uvicorn

    from gateway.drain import Drain, DrainingServer
    from gateway.settings import Settings

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="sparkgate: OpenAI-compatible gateway over in-process vLLM."
)

DEFAULT_CONFIG = "config/default.yaml"


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file")]


def _load(config: Path) -> Settings:
    """The config, validated; exit 2 with the reason when it is not."""
    from gateway.settings import load_settings

    try:
        return load_settings(config)
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        typer.echo(f"sparkgate: invalid config {config}:\n{e}", err=True)
        raise typer.Exit(2) from None


def _settings_to_serve(config: Path) -> Settings:
    """The config, validated, its model directories and secrets present, its memory plan applied."""
    from policies.memory_plan import PlanDoesNotFit

    settings = _load(config)
    if missing := settings.missing_model_dirs():
        lines = "\n  ".join(missing)
        typer.echo(
            f"sparkgate: cannot serve:\n  {lines}\n"
            "Build the embedded default models with `make models`, or point `path` at a model directory.",
            err=True,
        )
        raise typer.Exit(2)
    if missing := settings.missing_secrets():
        typer.echo("sparkgate: cannot serve:\n  " + "\n  ".join(missing), err=True)
        raise typer.Exit(2)
    if lacking := _vllm_lacks(settings):
        typer.echo("sparkgate: cannot serve:\n  " + "\n  ".join(lacking), err=True)
        raise typer.Exit(2)
    plan = settings.memory_plan()
    if isinstance(plan, PlanDoesNotFit):
        typer.echo(f"sparkgate: cannot serve: {plan.message}", err=True)
        raise typer.Exit(2)
    if plan is not None:
        settings = settings.with_kv_plan(plan)
        typer.echo("sparkgate: memory plan\n" + "\n".join(plan.lines), err=True)
    return settings


def _vllm_lacks(settings: Settings) -> list[str]:
    """What the in-process engines need of vLLM that the installed one lacks (vLLM refuses some
    of it only after loading the weights, some not at all)."""
    from gateway import vllm_versions

    if not any(m.vllm_features() for m in settings.local_models()):
        return []
    here = vllm_versions.installed()
    if here is None:
        return ["vLLM is not installed here (`make setup`, or the CUDA build on a GPU box)"]
    return [why for m in settings.local_models() for why in m.vllm_lacks(here.version)]


def _run(
    settings: Settings,
    app_factory: Callable[[Settings, Drain], Any],
    host: str | None,
    port: int | None,
    access_log: bool,
) -> None:
    import uvicorn

    from gateway import runtime_env
    from gateway.drain import SHUTDOWN_WAIT_S, Drain

    server = settings.server.model_copy(update={k: v for k, v in {"host": host, "port": port}.items() if v is not None})
    from gateway import logs

    cache = Path(settings.base_dir) / server.cache_dir
    log_config = logs.configure(server.log_level, server.log_format, cache)
    runtime_env.configure(cache)
    sock = _bind(server.host, server.port)
    drain = Drain(server.drain_grace_s)
    config = uvicorn.Config(
        app_factory(settings, drain),
        host=server.host,
        port=server.port,
        log_level=server.log_level,
        # SIGTERM drains first (gateway/drain.py); this is only uvicorn's last wait after it.
        timeout_graceful_shutdown=int(SHUTDOWN_WAIT_S),
        timeout_keep_alive=int(server.keep_alive_s),
        access_log=access_log,
        log_config=log_config,
        **proxy_options(server.trusted_proxies),
    )
    # SIGTERM or Ctrl-C: drained, then a clean return (exit 0); while the engines start: at once.
    server_ = _server(config, drain)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is a clean stop
        server_.run(sockets=[sock])
    if not server_.started:
        raise typer.Exit(3)  # as uvicorn.run: stopped before serving (an engine failed to start)


def _server(config: uvicorn.Config, drain: Drain) -> DrainingServer:
    """The server, draining on signals once it serves (gateway/drain.py). Before that, while
    its engines start, a signal ends it at once (`_stop_starting`): uvicorn would only stop once
    the start is over, and an engine's start (minutes of weights, compilation and graph capture
    on a GPU; 20-35 s for a tiny one on a CPU) cannot be cut short from here: it runs in a
    thread, and in engine processes that handle no signal while in a long native call."""
    from gateway.drain import DrainingServer

    class Server(DrainingServer):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.started:
                _stop_starting(sig)
            super().handle_exit(sig, frame)

    return Server(config, drain)


def _stop_starting(sig: int) -> NoReturn:
    """Asked to stop before serving: kill the engine processes being started (nothing ran on
    them; the processes this one started, theirs and so on) and exit 0, as a drain does."""
    logging.getLogger("sparkgate").warning(
        "%s while the engines start: stopping them, and exiting", signal.Signals(sig).name
    )
    _kill_descendants(keep=_resource_tracker())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _kill_descendants(keep: int | None = None) -> None:
    """SIGKILL every process below this one but `keep`. Stopped first (SIGSTOP), until no new
    one shows up: a stopped process starts no other, so none escapes while its parent dies."""
    stopped: set[int] = set()
    while new := [pid for pid in _descendants(os.getpid()) if pid not in stopped and pid != keep]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped.update(new)
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """The processes below `root`: its children, theirs, and so on (Linux's /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone meanwhile
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def _resource_tracker() -> int | None:
    """multiprocessing's resource tracker, if this process started one (the engines' processes
    share it): left to exit by itself once they are gone, unlinking the shared memory they
    left."""
    from multiprocessing import resource_tracker

    pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    return pid if isinstance(pid, int) else None


def proxy_options(trusted_proxies: tuple[str, ...]) -> dict[str, Any]:
    """uvicorn's X-Forwarded-For handling: only from the configured proxies. Left alone, uvicorn
    trusts 127.0.0.1, and any local process could pick the address its failures count against."""
    if not trusted_proxies:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": list(trusted_proxies)}


def _bind(host: str, port: int) -> socket.socket:
    """The server's port, bound before any engine starts (it listens once they are up).

    uvicorn binds only after the app's startup, minutes of weight loading on a Spark: a port
    already in use would be found only then, and meanwhile the engines' own sockets and
    connections may take the free port from the ephemeral range."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        typer.echo(f"sparkgate: cannot serve on {host}:{port}: {e.strerror or e}", err=True)
        raise typer.Exit(2) from None
    logging.getLogger("sparkgate").info("serving on http://%s:%d once the engines are up", host, sock.getsockname()[1])
    return sock


@app.command()
def serve(
    config: ConfigOpt = Path(DEFAULT_CONFIG),
    host: Annotated[str | None, typer.Option(help="Override server.host")] = None,
    port: Annotated[int | None, typer.Option(help="Override server.port")] = None,
) -> None:
    """Start the engines and serve the OpenAI API."""
    settings = _settings_to_serve(config)

    def factory(s: Settings, drain: Drain) -> Any:
        from gateway.app import create_app

        return create_app(s, drain=drain)

    _run(settings, factory, host, port, access_log=settings.server.access_log)


@app.command("engine-host")
def engine_host(
    config: ConfigOpt,
    host: Annotated[str | None, typer.Option(help="Override server.host")] = None,
    port: Annotated[int | None, typer.Option(help="Override server.port")] = None,
    token_env: Annotated[str, typer.Option(help="Environment variable with the token gateways present")] = (
        "SPARKGATE_ENGINE_TOKEN"
    ),
) -> None:
    """Serve this box's engines to gateways on other boxes (no OpenAI API here)."""
    token = os.environ.get(token_env, "")
    if not token:
        typer.echo(f"sparkgate: cannot host engines: ${token_env} is not set (the gateways' shared token)", err=True)
        raise typer.Exit(2)
    settings = _settings_to_serve(config)
    remote = [m.name for m in settings.models if m.engine == "remote"]
    if remote:
        typer.echo(f"sparkgate: cannot host engines: {', '.join(remote)} are remote here", err=True)
        raise typer.Exit(2)

    def factory(s: Settings, drain: Drain) -> Any:
        from gateway.engine_host import create_host_app

        return create_host_app(s, token, drain=drain)

    # No access log: every gateway polls stats several times a second.
    _run(settings, factory, host, port, access_log=False)


@app.command("prepare-models")
def prepare_models(
    root: Annotated[Path, typer.Option(help="Where model dirs go")] = Path("models"),
    force: Annotated[bool, typer.Option(help="Rebuild even if present")] = False,
) -> None:
    """Build the tiny local models (real Qwen tokenizer, random weights); no download."""
    from engine_adapter.tiny_model import prepare

    for path in prepare(root, force=force):
        typer.echo(f"ready: {path}")


@app.command()
def plan(
    config: Annotated[Path, typer.Option("--config", "-c", help="A config with simulated models")] = Path(
        "config/sim-dgx-spark.yaml"
    ),
    boxes: Annotated[int, typer.Option(help="Boxes to place the models on")] = 2,
    box: Annotated[
        str, typer.Option(help="The box: a built-in one (dgx-spark, h200) or a box file (YAML, config/boxes/)")
    ] = "dgx-spark",
    mix: Annotated[str | None, typer.Option(help="Workload shares, e.g. chat=0.7,document=0.1,summary=0.2")] = None,
    target: Annotated[float, typer.Option(help="SLO attainment a placement must keep")] = 0.95,
    per_user: Annotated[float, typer.Option(help="Requests per user per minute, for the users column")] = 1.0,
    duration: Annotated[float, typer.Option(help="Simulated seconds of arrivals per load and seed")] = 600.0,
    seeds: Annotated[int, typer.Option(min=1, help="Runs per load (seeds 1..N), pooled")] = 3,
    max_rate: Annotated[float, typer.Option(help="Highest load tried, requests/s")] = 1.0,
    step: Annotated[float, typer.Option(help="Load step, requests/s")] = 0.05,
    out: Annotated[Path, typer.Option(help="The HTML page with the plot")] = Path("plan.html"),
    two_sparks: Annotated[
        bool,
        typer.Option(
            "--two-sparks",
            help="Compare Flash-Next's placements on two DGX Sparks: table on NVMe, TP=2 over both, "
            "or two models only (memory per box, SLO attainment, the recommended one)",
        ),
    ] = False,
) -> None:
    """Capacity planner: requests/s and users each placement sustains within the SLOs."""
    import dataclasses

    from gateway.plan import planner
    from gateway.plan.fleet import DEFAULT_WORKLOAD
    from gateway.settings import load_box

    settings = _load(config)
    try:
        box_spec, serving = load_box(box)
    except (OSError, ValueError) as e:
        typer.echo(f"sparkgate: invalid box {box}:\n{e}", err=True)
        raise typer.Exit(2) from None
    if any(m.simulated is None for m in settings.models):
        typer.echo("sparkgate: plan needs every model's `simulated` section (its box-model key)", err=True)
        raise typer.Exit(2)
    kinds = list(DEFAULT_WORKLOAD)
    if mix:
        try:
            shares = {k: float(v) for k, v in (p.split("=") for p in mix.split(","))}
        except ValueError:
            typer.echo(f"sparkgate: --mix wants name=share pairs, got {mix!r}", err=True)
            raise typer.Exit(2) from None
        unknown = set(shares) - {k.name for k in kinds}
        if unknown:
            typer.echo(f"sparkgate: unknown kinds {sorted(unknown)}; known: {[k.name for k in kinds]}", err=True)
            raise typer.Exit(2)
        kinds = [dataclasses.replace(k, share=shares.get(k.name, 0.0)) for k in kinds if shares.get(k.name, 0.0) > 0]
    rates = [round(step * i, 4) for i in range(1, int(max_rate / step + 1e-9) + 1)]
    rows = []
    typer.echo(f"box: {box_spec.name}; serving: {serving}", err=True)
    if two_sparks:
        from gateway.plan import two_sparks as two

        try:
            options = two.options(settings.models, box=box_spec, serving=serving)
        except ValueError as e:
            typer.echo(f"sparkgate: {e}", err=True)
            raise typer.Exit(2) from None
        by_key = {}
        for o in options:
            if not o.fits:
                continue
            by_key[o.key] = planner.sustain(
                o.placement, settings.routing, kinds, target=target, rates=rates, duration_s=duration, seeds=seeds
            )
            typer.echo(f"  ({o.key}) {o.placement.name}: {by_key[o.key].sustained_rps:.2f} req/s", err=True)
        typer.echo("\n".join(two.report(options, by_key, target=target, per_user=per_user, total=two.SPARK_MEMTOTAL)))
        rows = list(by_key.values())
        out.write_text(planner.html(rows, kinds, target, per_user, box_spec))
        typer.echo(f"plot: {out}")
        return
    for placement in planner.placements(settings.models, boxes, box_spec, serving):
        row = planner.sustain(
            placement, settings.routing, kinds, target=target, rates=rates, duration_s=duration, seeds=seeds
        )
        typer.echo(f"  {placement.name}: {row.sustained_rps:.2f} req/s", err=True)
        rows.append(row)
    typer.echo("\n".join(planner.table(rows, target, per_user)))
    out.write_text(planner.html(rows, kinds, target, per_user, box_spec))
    typer.echo(f"plot: {out}")


@app.command()
def check(
    config: Annotated[Path | None, typer.Argument(help="The YAML config to check")] = None,
    skip_local: Annotated[
        bool,
        typer.Option(
            "--skip-local",
            help="Skip what depends on this machine (model directories, tokenizers, token variables): "
            "for a config meant for another box",
        ),
    ] = False,
    live: Annotated[
        str | None,
        typer.Option(
            "--live",
            help="A running gateway's URL: run its canary (each model's answer cold and from the prefix "
            "cache, compared) and print the results; exit 1 if a model is degraded",
        ),
    ] = None,
    key: Annotated[
        str | None, typer.Option(help="An admin key for --live", envvar="SPARKGATE_ADMIN_KEY", show_envvar=True)
    ] = None,
    model: Annotated[str | None, typer.Option(help="--live: only this model")] = None,
) -> None:
    """Validate a config offline and print its plan: exit 0, or 2 with one `error [code] ...` line per problem.
    With --live URL, run a running gateway's canary instead."""
    from gateway.check import check_config

    if live is not None:
        _live_canary(live, key, model)
        if config is None:
            return
    if config is None:
        typer.echo("sparkgate check: give a CONFIG to check, or --live URL", err=True)
        raise typer.Exit(2)
    report = check_config(config, skip_local=skip_local)
    if report.plan:
        typer.echo("\n".join(report.plan))
    if report.skipped:
        typer.echo(f"skipped (--skip-local): {', '.join(report.skipped)}", err=not report.ok)
    for w in report.warnings:
        typer.echo(f"warning [known_issue] {w}", err=True)
    if report.ok:
        typer.echo(f"ok: {config}")
        return
    for p in report.problems:
        typer.echo(p.line(), err=True)
    typer.echo(f"sparkgate: {len(report.problems)} problem(s) in {config}", err=True)
    raise typer.Exit(2)


def _live_canary(url: str, key: str | None, model: str | None) -> None:
    """POST /sparkgate/admin/canary and print each model's result; exit 1 if one is degraded
    (or the canary could not run on it), 2 if the gateway refused or could not be reached."""
    import httpx

    if not key:
        typer.echo("sparkgate check --live: an admin key is required (--key or SPARKGATE_ADMIN_KEY)", err=True)
        raise typer.Exit(2)
    try:
        r = httpx.post(
            url.rstrip("/") + "/sparkgate/admin/canary",
            params={} if model is None else {"model": model},
            headers={"Authorization": f"Bearer {key}"},
            timeout=None,  # the canary waits its turn in admission like any request
        )
    except httpx.HTTPError as e:
        typer.echo(f"sparkgate check --live: {url}: {e}", err=True)
        raise typer.Exit(2) from None
    if r.status_code != 200:
        typer.echo(f"sparkgate check --live: {url} answered {r.status_code}: {r.text}", err=True)
        raise typer.Exit(2)
    results: dict[str, Any] = r.json()["results"]
    for name, res in results.items():
        typer.echo(f"{res['status']:>8} {name}: {res['reason']}")
    if any(res["status"] in ("degraded", "error") for res in results.values()):
        raise typer.Exit(1)


@app.command("codex-config")
def codex_config(
    config: ConfigOpt = Path(DEFAULT_CONFIG),
    url: Annotated[str | None, typer.Option(help="The gateway as Codex reaches it (default: server.host:port)")] = None,
    model: Annotated[str | None, typer.Option(help="Codex's default model (default: the first one)")] = None,
    catalog: Annotated[
        Path | None,
        typer.Option(help="Where to write the model catalog (default: $CODEX_HOME/sparkgate-models.json)"),
    ] = None,
    key_env: Annotated[str, typer.Option(help="The variable Codex reads the API key from")] = "SPARKGATE_API_KEY",
) -> None:
    """Print a Codex CLI config.toml for this gateway; write its model catalog (each model's context)."""
    from gateway import codex

    settings = _load(config)
    from gateway.vision import vision_of

    models = [
        codex.CodexModel(
            m.name,
            min(m.max_model_len, m.max_context or m.max_model_len),
            images=vision_of(m, settings.model_path(m), settings.image_fetch).enabled,
        )
        for m in settings.models
    ]
    names = [m.name for m in models]
    if model is not None and model not in names:
        typer.echo(f"sparkgate: no model {model!r} in {config} (its models: {', '.join(names)})", err=True)
        raise typer.Exit(2)
    if catalog is None:
        catalog = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex") / "sparkgate-models.json"
    if url is None:
        host = settings.server.host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        url = f"http://{f'[{host}]' if ':' in host else host}:{settings.server.port}"
    catalog.parent.mkdir(parents=True, exist_ok=True)
    catalog.write_text(json.dumps(codex.catalog(models), indent=2) + "\n")
    typer.echo(f"sparkgate: wrote {catalog}", err=True)
    typer.echo(
        codex.config_toml(model=model or names[0], base_url=url, catalog_path=str(catalog.resolve()), key_env=key_env),
        nl=False,
    )


@app.command("hash-key")
def hash_key_cmd(key: str) -> None:
    """Print the sha256 of an API key, the form `auth.keys[].sha256` stores."""
    from gateway.settings import hash_key

    typer.echo(hash_key(key))


keys_app = typer.Typer(
    no_args_is_help=True,
    help="Manage API keys and read usage through a running gateway's admin API (an admin key).",
)
app.add_typer(keys_app, name="keys")

Url = Annotated[str, typer.Option("--url", envvar="SPARKGATE_URL", help="The gateway")]
AdminKeyOpt = Annotated[str, typer.Option("--admin-key", envvar="SPARKGATE_ADMIN_KEY", help="An auth.admin_keys key")]
DEFAULT_URL = "http://127.0.0.1:8000"


def _admin_call(method: str, url: str, admin_key: str, path: str, **kw: Any) -> Any:
    import httpx

    if not admin_key:
        typer.echo("sparkgate: an admin key is needed: --admin-key or SPARKGATE_ADMIN_KEY", err=True)
        raise typer.Exit(2)
    try:
        r = httpx.request(
            method, url.rstrip("/") + path, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30, **kw
        )
    except httpx.HTTPError as e:
        typer.echo(f"sparkgate: cannot reach {url}: {e}", err=True)
        raise typer.Exit(1) from None
    if r.status_code >= 400:
        try:
            msg = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = r.text
        typer.echo(f"sparkgate: {r.status_code}: {msg}", err=True)
        raise typer.Exit(1)
    return r.json()


@keys_app.command("create")
def keys_create(
    user: Annotated[str, typer.Option(help="The person the key belongs to")],
    url: Url = DEFAULT_URL,
    admin_key: AdminKeyOpt = "",
    team: Annotated[str | None, typer.Option(help="A team from quotas.teams (its limits are inherited)")] = None,
    name: Annotated[str | None, typer.Option(help="A label, e.g. laptop")] = None,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="Input + output tokens per minute")] = None,
    daily_tokens: Annotated[int | None, typer.Option(help="Tokens per UTC day")] = None,
    monthly_tokens: Annotated[int | None, typer.Option(help="Tokens per calendar month")] = None,
    max_concurrency: Annotated[int | None, typer.Option(help="Requests in flight at once")] = None,
    allowed_model: Annotated[list[str] | None, typer.Option(help="Repeat for each model allowed")] = None,
    max_context: Annotated[int | None, typer.Option(help="Prompt + max_tokens")] = None,
    priority: Annotated[str | None, typer.Option(help="interactive or batch")] = None,
    slo_class: Annotated[str | None, typer.Option(help="Default latency class")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole record as JSON")] = False,
) -> None:
    """Create a key. The key is printed once; only its hash is stored."""
    limits = {
        "rpm": rpm,
        "tpm": tpm,
        "daily_tokens": daily_tokens,
        "monthly_tokens": monthly_tokens,
        "max_concurrency": max_concurrency,
        "allowed_models": allowed_model or None,
        "max_context": max_context,
        "priority": priority,
        "slo_class": slo_class,
    }
    body = {"user": user, "team": team, "name": name, "limits": {k: v for k, v in limits.items() if v is not None}}
    out = _admin_call("POST", url, admin_key, "/sparkgate/admin/keys", json=body)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(f"id:   {out['id']}\nuser: {out['user']}\nteam: {out['team'] or '-'}")
    typer.echo(f"key:  {out['key']}\n(shown once: store it now)")


@keys_app.command("list")
def keys_list(
    url: Url = DEFAULT_URL,
    admin_key: AdminKeyOpt = "",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List keys (config and store), never their hashes."""
    out = _admin_call("GET", url, admin_key, "/sparkgate/admin/keys")
    if as_json:
        typer.echo(json.dumps(out["data"], indent=2))
        return
    typer.echo(f"{'ID':<22} {'USER':<16} {'TEAM':<12} {'SOURCE':<7} {'STATUS':<8} LIMITS")
    for k in out["data"]:
        status = "revoked" if k["revoked_at"] else "active"
        limits = " ".join(f"{n}={v}" for n, v in k["limits"].items())
        typer.echo(f"{k['id']:<22} {k['user']:<16} {k['team'] or '-':<12} {k['source']:<7} {status:<8} {limits}")


@keys_app.command("revoke")
def keys_revoke(key_id: str, url: Url = DEFAULT_URL, admin_key: AdminKeyOpt = "") -> None:
    """Revoke a key: every replica refuses it from its next request on."""
    out = _admin_call("DELETE", url, admin_key, f"/sparkgate/admin/keys/{key_id}")
    typer.echo(f"revoked {out['id']} ({out['user']})")


@keys_app.command("usage")
def keys_usage(
    url: Url = DEFAULT_URL,
    admin_key: AdminKeyOpt = "",
    key_id: Annotated[str | None, typer.Option("--key-id")] = None,
    user: Annotated[str | None, typer.Option()] = None,
    team: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Usage today, this month and in the rate window, for a key, a user or a team."""
    params = {k: v for k, v in {"key_id": key_id, "user": user, "team": team}.items() if v is not None}
    typer.echo(json.dumps(_admin_call("GET", url, admin_key, "/sparkgate/admin/usage", params=params), indent=2))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
