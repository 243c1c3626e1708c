"""The compose files against the gateway they run: each file as `docker-compose config` reads it
(Debian's docker-compose parses without a Docker engine; .ci/run installs it), then its wiring
checked against the settings the containers would load: env overrides that name real fields,
ports, health checks on the real probe routes, the config and model directories mounted where
the command and the config look, Redis, the engine host on spark-2, the GPU reservation, the
`monitoring` profile, and a Prometheus and Grafana dashboard that use metrics /metrics serves."""

from __future__ import annotations

import functools
import importlib.util
import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fastapi import APIRouter
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

from gateway.app import create_app
from gateway.engine_host import router as engine_host_router
from gateway.http.ops import router as ops_router
from gateway.settings import ServerSettings, Settings, load_settings
from tests.conftest import MODELS, ROOT

CPU = "docker-compose.yml"
SPARK_1 = "deploy/dgx-spark/docker-compose.yml"
SPARK_2 = "deploy/dgx-spark/docker-compose.spark-2.yml"
FILES = (CPU, SPARK_1, SPARK_2)
GPU_FILES = (SPARK_1, SPARK_2)
ENGINE_TOKEN = "compose-test-engine-token"  # the secret the DGX files require from .env
DEFAULT_TOKEN_ENV = "SPARKGATE_ENGINE_TOKEN"  # `sparkgate engine-host --token-env`'s default
MONITORING = "monitoring"

Service = dict[str, Any]


# -- reading the files ----------------------------------------------------------------------


def _compose(args: list[str], env: dict[str, str], tmp: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail("docker-compose is not installed: `apt-get install docker-compose` (.ci/run installs it)")
    # An empty env file and a bare environment: neither an operator's .env nor this shell's
    # variables may change what the files say.
    empty = tmp / "empty.env"
    empty.write_text("")
    bare = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp), **env}
    return subprocess.run(
        [exe, "--env-file", str(empty), *args], cwd=ROOT, env=bare, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def compose_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compose")


@pytest.fixture(scope="module")
def configs(compose_tmp: Path) -> dict[str, dict[str, Any]]:
    """Each file as `docker-compose config` prints it (variables filled in, paths absolute)."""
    out = {}
    for f in FILES:
        r = _compose(["-f", f, "config"], {DEFAULT_TOKEN_ENV: ENGINE_TOKEN}, compose_tmp)
        assert r.returncode == 0, f"docker-compose -f {f} config: {r.stderr}"
        out[f] = yaml.safe_load(r.stdout)
    return out


def services(config: dict[str, Any]) -> dict[str, Service]:
    s: dict[str, Service] = config["services"]
    return s


def one(config: dict[str, Any], kind: str) -> tuple[str, Service]:
    """The service that is the gateway, the engine host, redis, prometheus or grafana."""

    def is_kind(svc: Service) -> bool:
        cmd = svc.get("command") or []
        image = str(svc.get("image", ""))
        if kind == "gateway":
            return "sparkgate" in str(cmd[:1]) and "serve" in cmd
        if kind == "engine-host":
            return "engine-host" in cmd
        return image.split("/")[-1].startswith(kind)

    found = [(n, s) for n, s in services(config).items() if is_kind(s)]
    assert len(found) == 1, f"expected one {kind} service, found {[n for n, _ in found]}"
    return found[0]


def _volumes(svc: Service) -> list[tuple[str, PurePosixPath]]:
    """(source, target) of each mount; docker-compose 1.x prints short syntax, v2 long."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((str(v.get("source", "")), PurePosixPath(v["target"])))
        else:
            parts = str(v).split(":")
            out.append((parts[0], PurePosixPath(parts[1])))
    return out


def mount_of(svc: Service, path: PurePosixPath) -> tuple[str, PurePosixPath] | None:
    """The mount that holds `path` in the container (the deepest), as (source, target)."""
    holders = [(src, dst) for src, dst in _volumes(svc) if path == dst or dst in path.parents]
    return max(holders, key=lambda m: len(m[1].parts), default=None)


def host_file(svc: Service, path: PurePosixPath) -> Path:
    """Where a container path's file comes from on the host (a bind mount into the repo)."""
    m = mount_of(svc, path)
    assert m is not None, f"{path} is not mounted"
    src, dst = m
    assert src.startswith("/"), f"{path} comes from the named volume {src!r}, not from the repository"
    return Path(src) / path.relative_to(dst)


def ports(svc: Service) -> list[tuple[str, int, int]]:
    """(host ip, published port, container port) of each published port."""
    out = []
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            out.append((str(p.get("host_ip", "")), int(p["published"]), int(p["target"])))
        else:
            m = re.fullmatch(r"(?:(.+):)?(\d+):(\d+)(?:/\w+)?", str(p))
            assert m is not None, f"port {p!r} publishes no fixed host port"
            out.append((m.group(1) or "", int(m.group(2)), int(m.group(3))))
    return out


def env(svc: Service) -> dict[str, str]:
    e = svc.get("environment") or {}
    if isinstance(e, list):
        e = dict(item.split("=", 1) for item in e)
    return {k: str(v) for k, v in e.items()}


def host_network(svc: Service) -> bool:
    return svc.get("network_mode") == "host"


def loopback(host: str) -> bool:
    """Whether an address is this host's loopback ("" or a name: no)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def option(cmd: list[str], name: str) -> str | None:
    for i, arg in enumerate(cmd):
        if arg == name:
            return cmd[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


@functools.cache
def workdir(dockerfile: Path) -> PurePosixPath:
    lines = [ln.split(None, 1)[1] for ln in dockerfile.read_text().splitlines() if ln.startswith("WORKDIR ")]
    assert lines, f"{dockerfile} has no WORKDIR"
    return PurePosixPath(lines[-1].strip())


def dockerfile(svc: Service) -> Path:
    build = svc["build"]
    path = Path(build["context"]) / str(build.get("dockerfile", "Dockerfile"))
    assert path.is_file(), f"the build's Dockerfile {path} does not exist"
    return path


# -- what the containers would load ---------------------------------------------------------


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_class(arg)
        if found is not None:
            return found
    return None


def settings_field(var: str) -> list[str]:
    """The settings field an env override names (SPARKGATE_SERVER__PORT: server.port); fails
    for a name pydantic-settings would silently ignore or reject."""
    assert var.startswith("SPARKGATE_")
    parts = var.removeprefix("SPARKGATE_").lower().split("__")
    model: type[BaseModel] | None = Settings
    for i, part in enumerate(parts):
        assert model is not None and part in model.model_fields, f"{var}: {'.'.join(parts[: i + 1])} is no setting"
        model = _model_class(model.model_fields[part].annotation)
    return parts


def secret_vars(settings: Settings, cmd: list[str]) -> set[str]:
    """Variables the process reads besides its settings: the engine hosts' tokens."""
    names = {m.remote.token_env for m in settings.models if m.remote is not None}
    if "engine-host" in cmd:
        names.add(option(cmd, "--token-env") or DEFAULT_TOKEN_ENV)
    return names


def load(svc: Service) -> tuple[Settings, PurePosixPath]:
    """The settings the service's command loads, env overrides applied, and the config's
    directory in the container (relative model paths resolve against its parent)."""
    cmd = svc["command"]
    config_arg = option(cmd, "--config") or option(cmd, "-c")
    assert config_arg is not None, f"{cmd} names no --config"
    in_container = workdir(dockerfile(svc)) / config_arg
    source = host_file(svc, in_container)
    assert source.is_file(), f"{config_arg} would be read from {source}, which does not exist"
    assert source.resolve().is_relative_to(ROOT / "config"), f"{source} is not one of the repository's configs"
    with pytest.MonkeyPatch.context() as mp:
        for k in [k for k in os.environ if k.startswith("SPARKGATE_")]:
            mp.delenv(k)
        for k, v in env(svc).items():
            mp.setenv(k, v)
        settings = load_settings(source)
    return settings, in_container.parent


def setting(settings: Settings, path: list[str]) -> Any:
    value: Any = settings
    for part in path:
        value = getattr(value, part)
    return value


# -- checks shared by the gateway and the engine host ----------------------------------------


def check_env_overrides(svc: Service, settings: Settings) -> None:
    secrets = secret_vars(settings, svc["command"])
    for var, raw in env(svc).items():
        if not var.startswith("SPARKGATE_") or var in secrets:
            continue
        path = settings_field(var)
        value = setting(settings, path)
        assert str(value) == raw or value == yaml.safe_load(raw), f"{var}={raw} did not reach {'.'.join(path)}"
    for var in secrets:
        assert env(svc).get(var), f"${var} (an engine host's token) is not set for the container"


def check_listens(svc: Service, settings: Settings, probe: str, routes: list[str]) -> None:
    """Reachable on the config's port, and the health check asks the real probe route there."""
    port = settings.server.port
    if host_network(svc):
        assert not svc.get("ports"), "ports are ignored with host networking"
    else:
        assert settings.server.host in ("0.0.0.0", "::"), f"server.host {settings.server.host} is unreachable"
        assert port in [target for _, _, target in ports(svc)], f"server.port {port} is not published"
    test = " ".join(svc["healthcheck"]["test"])
    m = re.search(r"https?://([\w.\-]+):(\d+)(/[\w/\-]*)", test)
    assert m is not None, f"the health check requests no URL: {test}"
    assert loopback(m.group(1)) and int(m.group(2)) == port, f"the health check asks {m.group(0)}, not port {port}"
    assert m.group(3) == probe and probe in routes, f"the health check asks {m.group(3)}, not {probe}"


def check_models_mounted(svc: Service, settings: Settings, config_dir: PurePosixPath) -> None:
    for m in settings.models:
        path = PurePosixPath(m.path)
        in_container = path if path.is_absolute() else config_dir.parent / path
        mount = mount_of(svc, in_container)
        assert mount is not None, f"model {m.name}: {in_container} is in no volume"
        assert mount[1] != config_dir, f"model {m.name}: {in_container} is in the config mount"


def check_drains(svc: Service) -> None:
    """SIGTERM reaches sparkgate (exec form, init as PID 1) and it gets longer than the drain."""
    grace = re.fullmatch(r"(\d+)s", str(svc["stop_grace_period"]))
    assert grace is not None and int(grace.group(1)) >= ServerSettings().drain_grace_s + 10
    assert svc["init"] is True and svc.get("stop_signal", "SIGTERM") == "SIGTERM"
    assert isinstance(svc["command"], list)


def paths(router: APIRouter) -> list[str]:
    return [str(getattr(r, "path", "")) for r in router.routes]


def reserves_gpu(svc: Service) -> bool:
    devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    nvidia = any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    return nvidia or svc.get("runtime") == "nvidia"


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.parametrize("file", [CPU, SPARK_1])
def test_gateway(configs: dict[str, dict[str, Any]], file: str) -> None:
    config = configs[file]
    _, gw = one(config, "gateway")
    settings, config_dir = load(gw)
    check_env_overrides(gw, settings)
    check_listens(gw, settings, "/ready", paths(ops_router))
    check_models_mounted(gw, settings, config_dir)
    check_drains(gw)
    assert reserves_gpu(gw) == (file in GPU_FILES)
    assert not gw.get("profiles"), "the gateway must start without a profile"


@pytest.mark.parametrize("file", [CPU, SPARK_1])
def test_redis(configs: dict[str, dict[str, Any]], file: str) -> None:
    config = configs[file]
    _, gw = one(config, "gateway")
    name, redis = one(config, "redis")
    settings, _ = load(gw)
    assert settings.quotas.store == "redis"
    url = urlsplit(settings.quotas.redis_url)
    assert url.hostname is not None
    if host_network(gw):
        # The gateway sees the host's ports: Redis must be published there, on loopback only.
        published = [(ip, p) for ip, p, target in ports(redis) if target == 6379]
        assert published and all(loopback(ip) for ip, _ in published), "Redis must be published on loopback only"
        assert loopback(url.hostname) and url.port in [p for _, p in published], f"{url.geturl()} misses Redis"
    else:
        assert (url.hostname, url.port or 6379) == (name, 6379), f"{url.geturl()} is not the {name} service"
    assert gw["depends_on"][name]["condition"] == "service_healthy"
    assert redis["healthcheck"]["test"][-2:] == ["redis-cli", "ping"]
    assert any(dst == PurePosixPath("/data") for _, dst in _volumes(redis)), "Redis data is in no volume"


def test_engine_host_on_spark_2(configs: dict[str, dict[str, Any]]) -> None:
    _, host = one(configs[SPARK_2], "engine-host")
    settings, config_dir = load(host)
    check_env_overrides(host, settings)
    check_listens(host, settings, "/engine/v1/health", paths(engine_host_router))
    check_models_mounted(host, settings, config_dir)
    check_drains(host)
    assert reserves_gpu(host)
    # spark-1's gateway reaches this host with its token at the address its config names.
    _, gw = one(configs[SPARK_1], "gateway")
    gw_settings, _ = load(gw)
    remote = [m for m in gw_settings.models if m.engine == "remote"]
    assert remote, "config/dgx-spark.yaml has no remote model"
    hosted = {m.name for m in settings.models}
    token_env = option(host["command"], "--token-env") or DEFAULT_TOKEN_ENV
    for m in remote:
        assert m.remote is not None and m.name in hosted, f"spark-2 does not host {m.name}"
        assert urlsplit(m.remote.address).port == settings.server.port, f"{m.remote.address}: not the host's port"
        assert m.remote.token_env == token_env
        assert env(gw)[m.remote.token_env] == env(host)[token_env]


@pytest.mark.parametrize("file", GPU_FILES)
def test_the_engine_token_is_required(compose_tmp: Path, file: str) -> None:
    r = _compose(["-f", file, "config"], {}, compose_tmp)
    assert r.returncode != 0 and DEFAULT_TOKEN_ENV in r.stderr


@pytest.mark.parametrize("file", [CPU, SPARK_1])
def test_monitoring_profile(configs: dict[str, dict[str, Any]], compose_tmp: Path, file: str) -> None:
    config = configs[file]
    for kind in ("prometheus", "grafana"):
        name, svc = one(config, kind)
        assert svc.get("profiles") == [MONITORING], f"{name} must run only with --profile {MONITORING}"
    for name, svc in services(config).items():
        if not svc.get("profiles"):
            assert "prometheus" not in str(svc.get("image")) and "grafana" not in str(svc.get("image")), name
    r = _compose(["-f", file, "config", "--profiles"], {DEFAULT_TOKEN_ENV: ENGINE_TOKEN}, compose_tmp)
    assert r.returncode == 0 and r.stdout.split() == [MONITORING]


@pytest.mark.parametrize("file", [CPU, SPARK_1])
def test_prometheus_scrapes_the_gateway(configs: dict[str, dict[str, Any]], file: str) -> None:
    config = configs[file]
    gw_name, gw = one(config, "gateway")
    _, prom = one(config, "prometheus")
    settings, _ = load(gw)
    argv = [*(prom.get("entrypoint") or []), *(prom.get("command") or [])]
    config_file = option(" ".join(argv).split(), "--config.file")
    assert config_file is not None
    scrape = yaml.safe_load(host_file(prom, PurePosixPath(config_file)).read_text())
    jobs = [j for j in scrape["scrape_configs"] if j["job_name"] == "sparkgate"]
    assert len(jobs) == 1 and jobs[0].get("metrics_path", "/metrics") == "/metrics"
    targets = [t for sc in jobs[0]["static_configs"] for t in sc["targets"]]
    assert len(targets) == 1
    host, _, port = targets[0].rpartition(":")
    served = settings.server.port
    assert int(port) == served, f"Prometheus scrapes port {port}, the gateway serves {served}"
    if host_network(prom):
        assert host_network(gw) and loopback(host), f"{targets[0]} is not the gateway on this host"
    else:
        assert host == gw_name, f"{targets[0]} is not the {gw_name} service"
    token = settings.metrics.token
    if token is None:
        # /metrics answers loopback clients only without a token.
        assert host_network(prom) and loopback(host), "without metrics.token Prometheus must scrape over loopback"
    else:
        # The token file Prometheus reads is written, by its entrypoint, from the gateway's token.
        token_file = jobs[0]["authorization"]["credentials_file"]
        script = " ".join(argv)
        m = re.search(r"\"?\$\$?\{?(\w+)\}?\"?\s*>\s*" + re.escape(token_file), script)
        assert m is not None, f"nothing writes {token_file}"
        assert env(prom)[m.group(1)] == token
        assert mount_of(prom, PurePosixPath(token_file)) is not None


@pytest.mark.parametrize("file", [CPU, SPARK_1])
def test_grafana_reaches_prometheus(configs: dict[str, dict[str, Any]], file: str) -> None:
    config = configs[file]
    prom_name, prom = one(config, "prometheus")
    _, grafana = one(config, "grafana")
    argv = " ".join([*(prom.get("entrypoint") or []), *(prom.get("command") or [])]).split()
    listen = option(argv, "--web.listen-address") or ":9090"
    listen_host, _, listen_port = listen.rpartition(":")
    url = urlsplit(env(grafana)["PROMETHEUS_URL"])
    assert url.port == int(listen_port)
    if host_network(grafana):
        assert host_network(prom) and url.hostname is not None and loopback(url.hostname)
    else:
        assert url.hostname == prom_name and listen_host in ("", "0.0.0.0")
    provisioning = host_file(grafana, PurePosixPath("/etc/grafana/provisioning"))
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert datasource["url"] == "${PROMETHEUS_URL}"
    provider = yaml.safe_load((provisioning / "dashboards" / "sparkgate.yml").read_text())["providers"][0]
    dashboards = host_file(grafana, PurePosixPath(provider["options"]["path"]))
    for path in dashboards.glob("*.json"):
        for panel in json.loads(path.read_text())["panels"]:
            if "datasource" in panel:
                assert panel["datasource"]["uid"] == datasource["uid"], f"{path.name}: {panel['title']}"
    assert list(dashboards.glob("*.json")), f"no dashboard in {dashboards}"


# -- the dashboard's metric names -------------------------------------------------------------

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "sum", "avg", "min", "max", "count", "topk", "bottomk", "rate", "irate", "increase", "delta",
    "histogram_quantile", "clamp_min", "clamp_max", "abs", "time",
}  # fmt: skip
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exposed_names(families: dict[str, str]) -> set[str]:
    return {name + suffix for name, kind in families.items() for suffix in SUFFIXES.get(kind, ("",))}


@pytest.fixture(scope="module")
def gateway_metrics() -> set[str]:
    """Every sparkgate_* name /metrics serves: rendered by a gateway on the replay engine
    (routing on, so that its metrics are there too)."""
    settings = Settings(
        auth={"required": False},
        routing={"enabled": True},
        models=[{"name": "replay", "engine": "replay", "path": str(MODELS / "tiny-qwen3")}],
    )
    with TestClient(create_app(settings), client=("127.0.0.1", 40000)) as c:
        r = c.get("/metrics")
    assert r.status_code == 200
    return exposed_names({f.name: f.type for f in text_string_to_metric_families(r.text)})


@pytest.fixture(scope="module")
def vllm_metrics() -> set[str]:
    """vLLM's metric names, from its Prometheus logger's source (the in-process engines'
    `vllm:*`, which the gateway's /metrics passes on); no engine needs to start for them."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    found = re.findall(r"_(gauge|counter|histogram)_cls\(\s*name=\"(vllm:[\w:]+)\"", source)
    assert found
    return exposed_names({name: kind for kind, name in found})


def metric_names(expr: str) -> Iterator[str]:
    """The metric names in a PromQL expression (anything that is neither a function nor a keyword)."""
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    expr = re.sub(r"label_values\(([\w:]+),\s*\w+\)", r"\1", expr)  # a variable's query: its label goes
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)  # selectors, ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)
    for word in re.findall(r"[A-Za-z_:][\w:]*", expr):
        if word not in PROMQL_WORDS:
            yield word


def test_metric_names_reads_promql() -> None:
    expr = 'sum by (model, le) (rate(sparkgate_ttft_seconds_bucket{model=~"$model"}[$__rate_interval])) / vllm:x'
    assert list(metric_names(expr)) == ["sparkgate_ttft_seconds_bucket", "vllm:x"]
    assert list(metric_names("label_values(sparkgate_engine_up, model)")) == ["sparkgate_engine_up"]


def test_dashboard_metrics_exist(gateway_metrics: set[str], vllm_metrics: set[str]) -> None:
    exposed = gateway_metrics | vllm_metrics
    assert "sparkgate_requests_total" in exposed and "sparkgate_ttft_seconds_bucket" in exposed
    dashboards = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
    assert dashboards
    used: set[str] = set()
    for path in dashboards:
        dash = json.loads(path.read_text())
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        exprs += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
        for expr in exprs:
            unknown = [n for n in metric_names(expr) if n not in exposed]
            assert not unknown, f"{path.name}: {unknown} are not on /metrics ({expr})"
            used.update(metric_names(expr))
    assert any(n.startswith("vllm:") for n in used) and any(n.startswith("sparkgate_") for n in used)


# -- the images -------------------------------------------------------------------------------


def test_gpu_image_keeps_the_base_images_vllm(configs: dict[str, dict[str, Any]]) -> None:
    for file in GPU_FILES:
        for svc in services(configs[file]).values():
            if "build" in svc:
                assert dockerfile(svc) == ROOT / "deploy" / "Dockerfile.gpu"
    text = (ROOT / "deploy" / "Dockerfile.gpu").read_text()
    base = re.search(r"^ARG VLLM_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None and base.group(1).startswith("nvcr.io/nvidia/vllm:")
    assert re.search(r"^FROM \$\{VLLM_IMAGE\}$", text, re.MULTILINE)
    run = " ".join(re.findall(r"^RUN (.*)$", text.replace("\\\n", " "), re.MULTILINE))
    # Installing the cuda extra (or vllm) would let pip replace the container's GB10 builds.
    assert "--no-deps ." in run and "[cuda]" not in run and not re.search(r"install[^&]*\bvllm\b", run)
