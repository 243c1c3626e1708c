"""`sparkgate check CONFIG`: a config validated offline, every problem named, and the plan it makes.

It finds at least what `sparkgate serve` refuses at start-up (the settings' validators, then
`cli._settings_to_serve`: model directories, secrets, the memory plan) and more (placement,
remote addresses, tokenizer files, a KV pool too small for max_model_len), without starting
an engine, importing vllm or torch, or touching the network.

"Does not pass" is a value: a `Report` whose problems each have a stable code (CODES) and a
message naming the model or field. Only a config that does not match the schema stops the
checks early: everything else depends on its values.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError, model_validator
from pydantic_core import ErrorDetails

from gateway import vllm_versions
from gateway.redaction import redacted_url
from gateway.settings import ELSEWHERE, ModelSettings, Settings, load_settings, project_root
from gateway.vllm_versions import Version
from policies import known_issues
from policies.memory_plan import MemoryPlan, PlanDoesNotFit, fmt_bytes

CODES = (
    "schema",
    "alias",
    "allowed_models",
    "routing_class",
    "team",
    "engine",
    "remote_address",
    "placement",
    "memory_plan",
    "model_dir",
    "tokenizer",
    "token_env",
    "kv_cache",
    "hybrid_server",
    "vllm_version",
    "known_issue",
)
# What --skip-local leaves out: facts of this machine, not of the config.
LOCAL_CHECKS = ("model directories", "tokenizer files", "KV pool against config.json", "token environment variables")
IN_PROCESS = ("vllm", "replay")  # engines on this gateway's own hardware (simulated ones model any box)
_TOKENIZER_VOCAB = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
# Architectures whose layers are not all full attention (Gated DeltaNet / Mamba state groups).
HYBRID_ARCHITECTURES = ("Qwen3Next", "Qwen3_5", "Qwen4Exp", "Mamba", "Jamba", "NemotronH", "FalconH1", "Zamba")
_FULL_ATTENTION_TYPES = ("full_attention", "attention", "sliding_attention")
MiB = 1024**2


@dataclass(frozen=True, slots=True)
class Problem:
    code: str  # one of CODES
    message: str

    def line(self) -> str:
        return f"error [{self.code}] {self.message}"


@dataclass(frozen=True, slots=True)
class Report:
    config: Path
    problems: tuple[Problem, ...]
    plan: tuple[str, ...]  # readable lines; empty when the config does not match the schema
    skipped: tuple[str, ...]  # checks left out (--skip-local)
    warnings: tuple[str, ...] = ()  # what passes but deserves a look (accepted known issues)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def codes(self) -> set[str]:
        return {p.code for p in self.problems}


class _FieldsOnly(Settings):
    """The settings with their field checks only: the cross-field ones of `Settings` raise at
    the first problem; this module checks them itself, each under its own code."""

    @model_validator(mode="after")
    def _unique_names(self) -> _FieldsOnly:
        return self


def check_config(path: str | Path, *, skip_local: bool = False) -> Report:
    """Every problem of the config at `path`, and its plan (memory per box, KV and slots per model)."""
    path = Path(path)
    skipped = LOCAL_CHECKS if skip_local else ()
    data = _read(path)
    if isinstance(data, Problem):
        return Report(path, (data,), (), skipped)
    try:
        settings: Settings = _FieldsOnly(**data)
    except ValidationError as e:
        return Report(path, tuple(_schema_problems(e, data)), (), skipped)
    if not settings.models:
        return Report(path, (Problem("schema", "models: at least one model is required"),), (), skipped)
    findings = _known_issue_findings(settings, read_local=not skip_local)
    problems = [
        *_name_problems(settings),
        *_allowed_model_problems(settings),
        *_routing_class_problems(settings),
        *_team_problems(settings),
        *_engine_problems(settings),
        *_remote_problems(settings),
        *_placement_problems(settings),
        *_hybrid_server_problems(settings, read_local=not skip_local),
        *_vllm_problems(settings, read_local=not skip_local),
        *_known_issue_problems(findings),
    ]
    plan_problems, memory = _memory_plan(settings)
    problems += plan_problems
    if isinstance(memory, MemoryPlan):
        settings = settings.with_kv_plan(memory)
    kv_problems, tokens = _kv_tokens(settings, read_local=not skip_local)
    problems += kv_problems
    if not skip_local:
        problems += _local_problems(settings)
    if not problems:
        problems += _what_serve_refuses(path)
    warnings = tuple(f.message for f in findings if f.accepted)
    plan = [*_vllm_lines(settings, read_local=not skip_local), *_plan_lines(settings, memory, tokens)]
    return Report(path, tuple(problems), tuple(plan), skipped, warnings)


# -- reading and the schema ------------------------------------------------------------------


def _read(path: Path) -> dict[str, Any] | Problem:
    """The YAML's mapping with `base_dir` set as `load_settings` sets it."""
    try:
        data = yaml.safe_load(path.resolve().read_text()) or {}
    except OSError as e:
        return Problem("schema", f"cannot read {path}: {e.strerror or e}")
    except yaml.YAMLError as e:
        return Problem("schema", f"{path} is not valid YAML: {e}")
    if not isinstance(data, dict):
        return Problem("schema", f"{path}: expected a mapping (server:, models:, ...) at the top level")
    if odd := [k for k in data if not isinstance(k, str)]:
        return Problem("schema", f"{path}: top-level keys are names (server:, models:, ...), not {odd[0]!r}")
    data.setdefault("base_dir", str(project_root(path)))
    return data


def _schema_problems(error: ValidationError, data: dict[str, Any]) -> list[Problem]:
    return [Problem("schema", _schema_message(e, data)) for e in error.errors()]


def _schema_message(error: ErrorDetails, data: dict[str, Any]) -> str:
    """`model 'x': models[0].max_num_seqs: Input should be greater than or equal to 1 (got 0)`."""
    loc = error["loc"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        msg = "unknown field"
    value = error.get("input")
    if error["type"] not in ("missing", "extra_forbidden") and isinstance(value, str | int | float | bool):
        msg += f" (got {value!r})"
    text = msg if not where or msg.startswith(where) else f"{where}: {msg}"
    return _model_named_at(loc, data) + text


def _model_named_at(loc: tuple[int | str, ...], data: dict[str, Any]) -> str:
    """`model 'x': ` when the error is inside a model's entry that has a name."""
    models = data.get("models")
    if len(loc) < 2 or loc[0] != "models" or not isinstance(loc[1], int) or not isinstance(models, list):
        return ""
    entry = models[loc[1]] if loc[1] < len(models) else None
    name = entry.get("name") if isinstance(entry, dict) else None
    return f"model {name!r}: " if isinstance(name, str) else ""


def _what_serve_refuses(path: Path) -> list[Problem]:
    """A last guard: whatever the settings' own validators refuse and the checks above missed."""
    try:
        load_settings(path)
    except (OSError, ValueError) as e:  # pydantic's ValidationError is a ValueError
        return [Problem("schema", str(e))]
    return []


# -- names, routing, keys ---------------------------------------------------------------------


def _name_problems(s: Settings) -> list[Problem]:
    """Model names and aliases each name one model, and no routing alias is also a model's name."""
    problems = []
    owner: dict[str, str] = {}
    for m in s.models:
        for n in m.names:
            if n in owner:
                problems.append(Problem("alias", f"model name {n!r} is used by both {owner[n]!r} and {m.name!r}"))
            owner.setdefault(n, m.name)
    if s.routing.enabled:
        for alias in s.routing.aliases:
            if alias in owner:
                problems.append(
                    Problem("alias", f"routing.aliases: {alias!r} is also a name of model {owner[alias]!r}")
                )
    return problems


def _limits_owners(s: Settings) -> Iterable[tuple[str, Any]]:
    """Each place key limits are written, with how to name it: (field prefix, limits)."""
    yield "quotas.defaults", s.quotas.defaults
    for t in s.quotas.teams:
        yield f"quotas.teams[{t.name}].defaults", t.defaults
    for k in s.auth.keys:
        yield f"auth.keys[{k.name}]", k


def _allowed_model_problems(s: Settings) -> list[Problem]:
    """A key's allowed_models name served models: a typo would leave the key no model at all."""
    names = {n for m in s.models for n in m.names}
    return [
        Problem("allowed_models", f"{where}.allowed_models: {n!r} is not a model's name or alias")
        for where, limits in _limits_owners(s)
        for n in limits.allowed_models or ()
        if n not in names
    ]


def _routing_class_problems(s: Settings) -> list[Problem]:
    if not s.routing.enabled:
        return []  # classes are read only by routing (as the settings' own validator does)
    known = ", ".join(s.routing.classes)
    return [
        Problem("routing_class", f"{where}.slo_class {limits.slo_class!r} is not in routing.classes ({known})")
        for where, limits in _limits_owners(s)
        if limits.slo_class is not None and limits.slo_class not in s.routing.classes
    ]


def _team_problems(s: Settings) -> list[Problem]:
    teams = {t.name for t in s.quotas.teams}
    return [
        Problem("team", f"auth.keys[{k.name}]: team {k.team!r} is not in quotas.teams")
        for k in s.auth.keys
        if k.team is not None and k.team not in teams
    ]


# -- engines ----------------------------------------------------------------------------------


def _engine_problems(s: Settings) -> list[Problem]:
    return [
        Problem("engine", f"model {m.name!r}: engine 'simulated' needs a 'simulated' section (its box-model key)")
        for m in s.models
        if m.engine == "simulated" and m.simulated is None
    ]


def _remote_problems(s: Settings) -> list[Problem]:
    """Each remote engine has an http(s) address with a host and a port. (Its share is checked
    by the schema: one model here is one engine there, addressed by the model's name.)"""
    problems = []
    for m in s.models:
        if m.engine == "vllm-server":
            problems += _vllm_server_problems(m)
        if m.engine != "remote":
            continue
        if m.remote is None:
            msg = "engine 'remote' needs a 'remote' section with the engine host's address"
            problems.append(Problem("remote_address", f"model {m.name!r}: {msg}"))
        elif (why := _address_problem(m.remote.address)) is not None:
            shown = redacted_url(m.remote.address)
            problems.append(Problem("remote_address", f"model {m.name!r}: remote.address {shown!r} {why}"))
    return problems


def _vllm_server_problems(m: ModelSettings) -> list[Problem]:
    if m.vllm_server is None:
        msg = "engine 'vllm-server' needs a 'vllm_server' section with the server's address"
        return [Problem("remote_address", f"model {m.name!r}: {msg}")]
    if (why := _address_problem(m.vllm_server.address, "http://spark-2:8000")) is not None:
        shown = redacted_url(m.vllm_server.address)
        return [Problem("remote_address", f"model {m.name!r}: vllm_server.address {shown!r} {why}")]
    return []


def _address_problem(address: str, example: str = "http://spark-2:8001") -> str | None:
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as e:
        return f"is not a URL: {e}"
    if parts.scheme not in ("http", "https"):
        return f"is not an http(s) URL (e.g. {example})"
    if not parts.hostname:
        return f"has no host (e.g. {example})"
    if port is None:
        return f"has no port: the server's (e.g. {example})"
    return None


def _hybrid_server_problems(s: Settings, *, read_local: bool) -> list[Problem]:
    """A stock vLLM server publishes only its block count (/metrics), so the gateway counts its
    pool as one full-attention group: for a hybrid model (linear-attention / Mamba state groups,
    Flash-Next's ring) that undercounts every request's blocks, and admission over-admits."""
    problems = []
    for m in s.models:
        if m.engine != "vllm-server":
            continue
        why = _hybrid_evidence(s, m, read_local=read_local)
        if why is None:
            continue
        msg = (
            f"model {m.name!r}: engine vllm-server cannot count a hybrid model's KV exactly ({why}): a stock "
            "vLLM server publishes one block count, and this gateway would count its pool as one "
            "full-attention group, missing the per-request state blocks (linear-attention/Mamba groups, "
            "rings), so it over-admits and vLLM preempts. Serve it with `sparkgate engine-host` "
            "(engine: remote) or in-process (engine: vllm), which read the groups from vLLM's own "
            "kv_cache_config; vllm-server would be exact only if it read those groups from the server"
        )
        problems.append(Problem("hybrid_server", msg))
    return problems


def _hybrid_evidence(s: Settings, m: ModelSettings, *, read_local: bool) -> str | None:
    """Why the model is hybrid (its config.json, else the box model's catalogue), or None."""
    if read_local:
        try:
            cfg = json.loads((s.model_path(m) / "config.json").read_text())
        except (OSError, ValueError):
            cfg = None
        if isinstance(cfg, dict):
            return _hybrid_in_config(cfg)
    from engine_adapter.spark import MODELS

    for key, spec in MODELS.items():
        named = key.lower() in (m.name.lower(), Path(m.path).name.lower()) or key.lower() in m.path.lower()
        if named and spec.layers > spec.full_attention_layers:
            full = spec.full_attention_layers
            return f"the box model's {key}: {spec.layers} layers, {full} of them full attention"
    return None


def _hybrid_in_config(cfg: dict[str, Any]) -> str | None:
    sub = cfg.get("text_config")
    text: dict[str, Any] = sub if isinstance(sub, dict) else cfg
    kinds = sorted({str(t) for t in text.get("layer_types") or () if t not in _FULL_ATTENTION_TYPES})
    if kinds:
        return f"config.json layer_types has {', '.join(kinds)}"
    archs = [str(a) for a in cfg.get("architectures") or ()]
    if hybrid := [a for a in archs if a.startswith(HYBRID_ARCHITECTURES)]:
        return f"config.json architecture {hybrid[0]}"
    return None


# -- engine flags with open corruption reports ------------------------------------------------

# The box model's catalogue keys -> vLLM's architecture, for issues specific to one (--skip-local).
_CATALOGUE_ARCHITECTURES = {"Qwen3.8-Flash-Next": "Qwen4Exp", "Qwen3.6-35B-A3B": "Qwen3_5Moe", "Qwen3.8-27B": "Qwen3_5"}


def _known_issue_findings(s: Settings, *, read_local: bool) -> list[known_issues.Finding]:
    """Speculative decoding x prefix caching x hybrid attention against the table of open
    reports (policies/known_issues.py), for each engine whose flags this config sets: vllm in
    this process (or under `sparkgate engine-host`). A remote model's flags are its host's
    config's; a simulated or replayed one has none."""
    version, _ = _target_vllm(s, read_local=read_local)
    out = []
    for m in s.models:
        if m.engine != "vllm":
            continue
        flags = known_issues.EngineFlags(
            model=m.name,
            speculative_method=_speculative_method(m.engine_args.get("speculative_config")),
            prefix_caching=bool(m.engine_args.get("enable_prefix_caching", m.enable_prefix_caching)),
            hybrid=_hybrid_evidence(s, m, read_local=read_local) is not None,
            architecture=_architecture(s, m, read_local=read_local),
            vllm_version=version,
            accepted=m.accept_known_issues,
        )
        out += known_issues.findings(flags)
    return out


def _known_issue_problems(findings: list[known_issues.Finding]) -> list[Problem]:
    return [Problem("known_issue", f.message) for f in findings if not f.accepted]


def _speculative_method(config: Any) -> str | None:
    """engine_args.speculative_config's method (a mapping, or vLLM's JSON string form)."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return known_issues.UNSPECIFIED
    if not config:
        return None
    method = config.get("method") if isinstance(config, dict) else None
    return str(method) if method else known_issues.UNSPECIFIED


def _architecture(s: Settings, m: ModelSettings, *, read_local: bool) -> str | None:
    """config.json's architecture where it is read, else the box model's catalogue's."""
    if read_local:
        try:
            archs = json.loads((s.model_path(m) / "config.json").read_text()).get("architectures")
        except (OSError, ValueError, AttributeError):
            archs = None
        if isinstance(archs, list) and archs:
            return str(archs[0])
    where = f"{m.name} {m.path}".lower()
    return next((a for key, a in _CATALOGUE_ARCHITECTURES.items() if key.lower() in where), None)


# -- placement --------------------------------------------------------------------------------


def _placement_problems(s: Settings) -> list[Problem]:
    if s.placement is None:
        return []
    return [*_placed_once(s), *_kv_gib_on_box(s), *_in_process_at_home(s)]


def _placed_once(s: Settings) -> list[Problem]:
    """Every placed name is a model of this config, every model is placed exactly once."""
    assert s.placement is not None
    problems = []
    names = [m.name for m in s.models]
    boxes = Counter(b.name for b in s.placement.boxes)
    problems += [Problem("placement", f"placement: box {b!r} is listed {n} times") for b, n in boxes.items() if n > 1]
    where: dict[str, list[str]] = {}
    for box in s.placement.boxes:
        for name in box.models:
            where.setdefault(name, []).append(box.name)
    for name, on in where.items():
        if name not in names:
            msg = f"placement: box {on[0]!r} lists {name!r}, which is not a model here (models: {', '.join(names)})"
            problems.append(Problem("placement", msg))
        elif len(on) > 1:
            problems.append(
                Problem("placement", f"placement: model {name!r} is placed {len(on)} times ({', '.join(on)})")
            )
    problems += [Problem("placement", f"placement: model {n!r} is on no box") for n in names if n not in where]
    return problems


def _kv_gib_on_box(s: Settings) -> list[Problem]:
    assert s.placement is not None
    return [
        Problem("placement", f"placement: box {b.name!r} kv_gib names {name!r}, which is not among its models")
        for b in s.placement.boxes
        for name in b.kv_gib
        if name not in b.models
    ]


def gateway_box(s: Settings) -> str | None:
    """This gateway's box in the placement: where its in-process engines are (most of them, the
    first such box on a tie); None without a placement or without in-process engines."""
    boxes = s.boxes()
    homes = Counter(boxes[m.name] for m in s.models if m.engine in IN_PROCESS and m.name in boxes)
    if not homes or s.placement is None:
        return None
    order = [b.name for b in s.placement.boxes]
    return max(homes, key=lambda b: (homes[b], -order.index(b)))


def _in_process_at_home(s: Settings) -> list[Problem]:
    """An engine in this process uses this box's memory: placed elsewhere it must be remote."""
    home, boxes = gateway_box(s), s.boxes()
    if home is None:
        return []
    return [
        Problem(
            "placement",
            f"placement: model {m.name!r} (engine: {m.engine}) is on box {boxes[m.name]!r}, but this gateway's "
            f"in-process engines are on {home!r}: a model on another box must be engine: remote "
            "(served there by `sparkgate engine-host`)",
        )
        for m in s.models
        if m.engine in IN_PROCESS and boxes.get(m.name, home) != home
    ]


# -- memory and KV ----------------------------------------------------------------------------


def _memory_plan(s: Settings) -> tuple[list[Problem], MemoryPlan | PlanDoesNotFit | None]:
    """The whole-box plan serve applies, or why it cannot be made."""
    if s.box is None:
        return [], None
    unknown = [m.name for m in s.local_models() if m.weights_bytes is None]
    if unknown:
        msg = "the memory plan (box:) needs weights_bytes for every model using this box's memory"
        return [Problem("memory_plan", f"model {n!r}: {msg}") for n in unknown], None
    plan = s.memory_plan()
    wrong = [_ple_args_problem(m) for m in s.local_models()]
    problems = [Problem("memory_plan", why) for why in wrong if why is not None]
    if isinstance(plan, PlanDoesNotFit):
        return [*problems, Problem("memory_plan", plan.message)], plan
    return problems, plan


def _ple_args_problem(m: ModelSettings) -> str | None:
    """The table's planned placement is the one vLLM gets: the gateway passes it as
    `--engram-config`, so engine_args.engram_config must not say otherwise."""
    if m.ple_table is None or m.engine != "vllm":
        return None
    engram = m.engine_args.get("engram_config")
    if not isinstance(engram, dict):
        return None
    want = m.ple_table.engram_config()
    wrong = [k for k, v in want.items() if k in engram and engram[k] != v]
    if not wrong:
        return None
    key = wrong[0]
    return (
        f"model {m.name!r}: ple_table.placement {m.ple_table.placement} but engine_args.engram_config.{key} "
        f"is {str(engram[key]).lower()}: set it to {str(want[key]).lower()} (or leave it out: the placement "
        "sets it), or the placement to what vLLM should do"
    )


# -- vLLM versions ----------------------------------------------------------------------------


def _target_vllm(s: Settings, *, read_local: bool) -> tuple[Version | None, str]:
    """The vLLM release the config's engines run (None: unknown), and where that comes from."""
    if s.vllm_version is not None:
        return vllm_versions.parse(s.vllm_version), f"vLLM {s.vllm_version} (the config's vllm_version)"
    here = vllm_versions.installed() if read_local else None
    if here is None:
        why = "none installed here" if read_local else "not read: --skip-local"
        return None, f"vLLM: unknown (no vllm_version in the config; installed: {why})"
    return here.version, f"vLLM {here.text} ({here.distribution}, installed here)"


def _vllm_problems(s: Settings, *, read_local: bool) -> list[Problem]:
    """Every in-process engine's features are in the vLLM it runs; the config's vllm_version is
    a supported one and, when this machine is checked, the one installed."""
    target, _ = _target_vllm(s, read_local=read_local)
    if target is None or not any(m.engine == "vllm" for m in s.models):
        return []
    problems = []
    here = vllm_versions.installed() if read_local else None
    if s.vllm_version is not None and here is not None and here.version[:2] != target[:2]:
        msg = (
            f"vllm_version {s.vllm_version}: this machine has vLLM {here.text} ({here.distribution}); "
            "install the version the config names, or change vllm_version"
        )
        problems.append(Problem("vllm_version", msg))
    if vllm_versions.supported(target) is None:
        known = ", ".join(vllm_versions.show(v.version) for v in vllm_versions.SUPPORTED)
        msg = f"vLLM {vllm_versions.show(target)} is not a supported version ({known}: docs/operator-guide.md)"
        problems.append(Problem("vllm_version", msg))
    return problems + [Problem("vllm_version", why) for m in s.models for why in m.vllm_lacks(target)]


def _vllm_lines(s: Settings, *, read_local: bool) -> list[str]:
    """Which vLLM the config is judged against, the installed one, and what needs a newer one."""
    _, where = _target_vllm(s, read_local=read_local)
    here = vllm_versions.installed()
    lines = [where]
    if s.vllm_version is not None or not read_local:
        shown = f"vLLM {here.text} ({here.distribution})" if here is not None else "none"
        lines.append(f"  installed here: {shown}" + ("" if read_local else " (not compared: --skip-local)"))
    lines += [
        f"  model {m.name!r} needs vLLM >= {vllm_versions.show(vllm_versions.FEATURES[f].since)}: "
        + vllm_versions.FEATURES[f].what
        for m in s.models
        for f in m.vllm_features()
        if f == "ple_disk"
    ]
    return lines


@dataclass(frozen=True, slots=True)
class _Kv:
    bytes: int | None  # the engine's KV pool; None: not known before it starts
    tokens: int | None
    note: str = ""  # why tokens are unknown, or how they were counted


def _kv_tokens(s: Settings, *, read_local: bool) -> tuple[list[Problem], dict[str, _Kv]]:
    problems: list[Problem] = []
    out: dict[str, _Kv] = {}
    for m in s.models:
        kv, problem = _model_kv(s, m, read_local=read_local)
        out[m.name] = kv
        problems += [problem] if problem is not None else []
    return problems, out


def _model_kv(s: Settings, m: ModelSettings, *, read_local: bool) -> tuple[_Kv, Problem | None]:
    if m.engine == "remote":
        share = m.remote.share if m.remote is not None else 1.0
        return _Kv(None, None, f"share {share:g} of the engine host's pool and slots"), None
    if m.engine == "vllm-server":
        share = m.vllm_server.share if m.vllm_server is not None else 1.0
        return _Kv(None, None, f"share {share:g} of the vLLM server's pool, read from its /metrics at start"), None
    if m.engine == "simulated":
        return _simulated_kv(m)
    if m.engine == "replay":
        return _replay_kv(m), None
    if m.kv_cache_bytes is None:
        return _Kv(None, None, "vLLM sizes it at start"), None
    if not read_local:
        return _Kv(m.kv_cache_bytes, None, "tokens: config.json not read (--skip-local)"), None
    return _vllm_kv(s, m, m.kv_cache_bytes)


def _simulated_kv(m: ModelSettings) -> tuple[_Kv, Problem | None]:
    """The box model's pool, built as the simulated engine builds it (pure, cheap)."""
    from engine_adapter.spark import DGX_SPARK, MODELS, STEP_TOKENS, BoxSim, SimConfig

    if m.simulated is None:
        return _Kv(None, None, "no simulated section"), None
    config = SimConfig(
        max_num_seqs=m.max_num_seqs,
        max_num_batched_tokens=m.max_num_batched_tokens or STEP_TOKENS,
        max_model_len=m.max_model_len,
        kv_cache_bytes=m.kv_cache_bytes,
    )
    try:
        sim = BoxSim(MODELS[m.simulated.model], DGX_SPARK, config)
    except ValueError as e:
        return _Kv(m.kv_cache_bytes, None), Problem("kv_cache", f"model {m.name!r}: {e}")
    return _Kv(sim.kv_cache_bytes, sim.kv_spec().capacity_tokens), None


def _replay_kv(m: ModelSettings) -> _Kv:
    from engine_adapter.replay import ReplayEngine, ReplayEngineConfig

    engine = ReplayEngine(ReplayEngineConfig(name=m.name, tokenizer=m.path))  # its pool is fixed
    spec = engine.kv_spec
    return _Kv(spec.kv_cache_bytes, spec.capacity_tokens, "fixed by the replay engine")


def _vllm_kv(s: Settings, m: ModelSettings, kv_bytes: int) -> tuple[_Kv, Problem | None]:
    """Tokens the pool holds, from config.json when every layer is full attention (other
    layouts are the running engine's to tell); a pool short of one max_model_len sequence
    is one vLLM refuses at start."""
    per_token = _kv_bytes_per_token(s.model_path(m) / "config.json", m)
    if isinstance(per_token, str):
        return _Kv(kv_bytes, None, f"tokens: {per_token}"), None
    tokens = kv_bytes // per_token
    kv = _Kv(kv_bytes, tokens, f"at {per_token} B/token from config.json")
    if tokens >= m.max_model_len:
        return kv, None
    msg = (
        f"model {m.name!r}: its KV cache ({_size(kv_bytes)}, {tokens} tokens at {per_token} B/token) cannot hold "
        f"one max_model_len ({m.max_model_len}) sequence, and vLLM refuses to start: raise kv_cache_bytes "
        "(or the box's share) or lower max_model_len"
    )
    return kv, Problem("kv_cache", msg)


def _kv_bytes_per_token(config_json: Path, m: ModelSettings) -> int | str:
    """K and V of every layer for one token, or why they cannot be counted here (sliding
    windows, linear attention and MLA are the running engine's to tell)."""
    try:
        cfg = json.loads(config_json.read_text())
    except OSError:
        return "no config.json here"
    except ValueError:
        return "config.json is not JSON"
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    layers = text.get("num_hidden_layers")
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size", 0) // heads if isinstance(heads, int) else None)
    plain = all(t == "full_attention" for t in text.get("layer_types") or ())
    if not plain or text.get("sliding_window") or "kv_lora_rank" in text:
        return "the engine reports them (not only full-attention layers)"
    elem = _kv_elem_bytes(m, str(text.get("torch_dtype") or text.get("dtype") or "bfloat16"))
    if not (isinstance(layers, int) and isinstance(kv_heads, int) and isinstance(head_dim, int) and elem):
        return "the engine reports them (config.json lacks the attention shape)"
    return 2 * layers * kv_heads * head_dim * elem


def _kv_elem_bytes(m: ModelSettings, config_dtype: str) -> int | None:
    if m.kv_cache_dtype.startswith("fp8"):
        return 1
    if m.kv_cache_dtype != "auto":
        return _DTYPE_BYTES.get(m.kv_cache_dtype)
    return _DTYPE_BYTES.get(config_dtype if m.dtype == "auto" else m.dtype)


# -- this machine: model directories, tokenizers, secrets -----------------------------------


def _local_problems(s: Settings) -> list[Problem]:
    return [p for m in s.models for p in _model_files(s, m)] + [Problem("token_env", x) for x in s.missing_secrets()]


def _model_files(s: Settings, m: ModelSettings) -> list[Problem]:
    """What serve checks (`missing_model_dirs`: config.json, or only tokenizer files for a
    model on another box or replayed), a missing directory named as such, and the tokenizer."""
    path = s.model_path(m)
    if not path.is_dir():
        return [Problem("model_dir", f"model {m.name!r}: {path} does not exist (models[].path)")]
    missing = s.model_copy(update={"models": (m,)}).missing_model_dirs()
    if m.engine in (*ELSEWHERE, "replay") and missing:
        return [Problem("tokenizer", line) for line in missing]
    problems = [Problem("model_dir", line) for line in missing]
    tokenizer = _tokenizer_dir(s, m)
    if (why := _tokenizer_missing(tokenizer)) is not None:
        problems.append(Problem("tokenizer", f"model {m.name!r}: {tokenizer} {why}"))
    return problems


def _tokenizer_dir(s: Settings, m: ModelSettings) -> Path:
    """Where the model's tokenizer loads from (only a vLLM engine reads `tokenizer:`)."""
    if m.engine != "vllm" or m.tokenizer is None:
        return s.model_path(m)
    return s.model_path(m.model_copy(update={"path": m.tokenizer}))


def _tokenizer_missing(d: Path) -> str | None:
    config = d / "tokenizer_config.json"
    if not config.is_file():
        return "has no tokenizer_config.json"
    try:
        if not isinstance(json.loads(config.read_text()), dict):
            return "has a tokenizer_config.json that is not a JSON object"
    except (OSError, ValueError) as e:
        return f"has a tokenizer_config.json that cannot be read: {e}"
    if not any((d / f).is_file() for f in _TOKENIZER_VOCAB):
        return f"has no vocabulary ({', '.join(_TOKENIZER_VOCAB)})"
    return None


# -- the plan ---------------------------------------------------------------------------------


def _size(n: int) -> str:
    return fmt_bytes(n) if n >= 1024**3 else f"{n / MiB:.0f} MiB"


def _plan_lines(s: Settings, memory: MemoryPlan | PlanDoesNotFit | None, kv: dict[str, _Kv]) -> list[str]:
    return [*_box_lines(s, memory), "models:", *(f"  {_model_line(m, kv[m.name])}" for m in s.models)]


def _box_lines(s: Settings, memory: MemoryPlan | PlanDoesNotFit | None) -> list[str]:
    home = gateway_box(s)
    lines = []
    if s.placement is not None:
        lines.append(f"placement {s.placement.name}:")
        lines += [
            f"  {b.name}{' (this gateway)' if b.name == home else ''}: {_box_models(s, b.models)}"
            for b in s.placement.boxes
        ]
    where = f" ({home})" if home else ""
    if isinstance(memory, MemoryPlan):
        lines += [f"memory plan of this gateway's box{where}:", *(f"  {line}" for line in memory.lines)]
    elif isinstance(memory, PlanDoesNotFit):
        lines.append(f"memory plan of this gateway's box{where}: does not fit (see the errors)")
    elif s.box is None:
        lines.append("memory plan: none (no box: section; each engine's KV is its kv_cache_bytes or vLLM's default)")
    return lines


def _box_models(s: Settings, names: Sequence[str]) -> str:
    engines = {m.name: m.engine for m in s.models}
    return ", ".join(f"{n} ({engines.get(n, 'unknown model')})" for n in names) or "no models"


def _model_line(m: ModelSettings, kv: _Kv) -> str:
    if m.engine == "remote" and m.remote is not None:
        where = redacted_url(m.remote.address)
        return f"{m.name}: engine remote at {where}: max_model_len, slots and KV from the engine host ({kv.note})"
    if m.engine == "vllm-server" and m.vllm_server is not None:
        where = redacted_url(m.vllm_server.address)
        return f"{m.name}: engine vllm-server at {where}: slots {m.max_num_seqs}, max_model_len and KV ({kv.note})"
    slots = f"{m.max_num_seqs}" + (f" (admission {m.max_concurrency})" if m.max_concurrency else "")
    size = "unknown" if kv.bytes is None else _size(kv.bytes)
    tokens = f", {kv.tokens} tokens" if kv.tokens is not None else ""
    note = f" ({kv.note})" if kv.note else ""
    return f"{m.name}: engine {m.engine}, max_model_len {m.max_model_len}, slots {slots}, KV {size}{tokens}{note}"
