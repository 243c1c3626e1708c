"""The docs site's Reference pages, generated from the code at build time so they cannot drift.

    python -m tools.docs_reference config|metrics|cli|errors   # print one page's Markdown

`make docs` builds them in memory (the hook tools/docs_site.py adds them to the site as
reference/*.md); nothing generated is written to docs/ or committed. Each page reads what the
gateway itself uses:

- config: the pydantic models of gateway/settings.py, walked from `Settings` (the config file)
  and `BoxFileSettings` (a box file), plus any model there that neither reaches. A field's
  description is its `Field(description=...)`, else the comments on and just above its line
  in the source, else (for a section) its model's docstring; a test fails on a field with
  none. Each field's row has an anchor, `<root>.<path>` without `[]` and `<name>`
  (`settings.server.port`, `settings.models.latency.tpot_s`); a section field's is its heading.
- metrics: the Prometheus registry a running app scrapes (`Metrics` with its `LiveCollector`, gateway/http/metrics.py
  bound to an app state with no models): name, type, help and labels.
- cli: the typer app of gateway/cli.py, as click sees it: commands, help and options.
- errors: the `GatewayError` hierarchy of gateway/errors.py (status, type, code), the codes
  raised with `code="..."` anywhere in gateway/ (found in the source), the validation handler's
  codes, and the admission and quota refusals as `from_reject` and `from_quota_refusal` turn
  them into errors.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

GENERATED_NOTE = (
    "<!-- Generated from the code by tools/docs_reference.py at `make docs`: edit the code, not this page. -->\n"
)


_CODE_SPAN = re.compile(r"(`+).+?\1")


def _cell(text: str) -> str:
    """Text safe in a Markdown table cell: one line, pipes escaped (a code span keeps its own:
    Python-Markdown's tables split no cell inside one)."""
    text = " ".join(text.split())
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [text[last : m.start()].replace("|", "\\|"), m.group(0)]
        last = m.end()
    return "".join([*out, text[last:].replace("|", "\\|")])


def _code(text: str) -> str:
    """An inline code span for any text (backticks inside get a longer fence)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


# -- config ----------------------------------------------------------------------------------------


@functools.cache
def _field_comments(cls: type) -> dict[str, str]:
    """Each field's comments in the class's source: the comment lines just above it, then those
    at the end of its lines. {} when the source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}  # line -> its comment's text
    code_lines: set[int] = set()  # lines with code on them
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            for line in range(tok.start[0], tok.end[0] + 1):
                code_lines.add(line)
    tree = ast.parse(source)
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    out: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        above: list[str] = []
        line = stmt.lineno - 1
        while line in comments and line not in code_lines:
            above.insert(0, comments[line])
            line -= 1
        end = stmt.end_lineno or stmt.lineno
        trailing = [comments[n] for n in range(stmt.lineno, end + 1) if n in comments and n in code_lines]
        text = " ".join([*above, *trailing]).strip()
        if text:
            out[stmt.target.id] = text
    return out


def _field_description(model: type, name: str, info: Any) -> str:
    if info.description:
        return str(info.description)
    for cls in model.__mro__:  # the class that declares the field (a key's limits: KeyLimits)
        if name in getattr(cls, "__annotations__", {}):
            text = _field_comments(cls).get(name)
            if text:
                return text
    nested = _nested_model(info.annotation)
    return _first_paragraph(nested.__doc__) if nested is not None else ""


def _is_model(t: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(t, type) and issubclass(t, BaseModel)


def _nested_model(annotation: Any) -> type | None:
    """The model a field's value holds (itself, optional, or as a list's or mapping's items)."""
    if _is_model(annotation):
        return typing.cast(type, annotation)
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _child_path(path: str, name: str, annotation: Any) -> str:
    """How a nested model's fields are written under this field: `a.b`, `a.b[]`, `a.b.<name>`."""
    full = f"{path}.{name}" if path else name
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _child_path(path, name, inner[0]) if len(inner) == 1 else full
    if origin in (tuple, list):
        return full + "[]"
    if origin is dict:
        return full + ".<name>"
    return full


def type_name(t: Any) -> str:
    """A field's type as a YAML author reads it: `int | null`, `list[str]`, `"a" | "b"`."""
    if t is type(None):
        return "null"
    if t is Any:
        return "any"
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (tuple, list):
        item = args[0] if args else Any
        return f"list[{type_name(item)}]"
    if origin is dict:
        return f"mapping[{type_name(args[0])}, {type_name(args[1])}]" if args else "mapping"
    if _is_model(t):
        return "section"
    if isinstance(t, type):
        return t.__name__
    return str(t).replace("typing.", "")


def _constraints(info: Any) -> str:
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "min_length": "min length", "max_length": "max length"}
    parts = []
    for meta in info.metadata:
        for attr, sign in signs.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            parts.append(f"matches {pattern}")
    return ", ".join(parts)


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def default_text(info: Any) -> str:
    """A field's default as YAML would write it; `required` when it has none."""
    from pydantic import BaseModel

    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True, validated_data={})
    if isinstance(value, BaseModel):
        # An omitted section: its own fields' defaults, except where this field's default differs.
        changed = value.model_dump(mode="json", exclude_defaults=True)
        return _json(changed) if changed else "(its fields' defaults)"
    if isinstance(value, dict):
        return _json({k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in value.items()})
    if isinstance(value, tuple):
        value = list(value)
    return _json(value)


@dataclasses.dataclass
class Section:
    model: type
    path: str  # where it first appears ("" at the top)
    anchor: str
    also: list[str] = dataclasses.field(default_factory=list)


def _walk(root: type, prefix: str) -> list[Section]:
    """The root's sections depth first, each model once (where it first appears)."""
    sections: dict[type, Section] = {}
    order: list[Section] = []

    def visit(model: type, path: str) -> None:
        if model in sections:
            sections[model].also.append(path)
            return
        anchor = f"{prefix}.{path}" if path else prefix
        anchor = anchor.replace("[]", "").replace(".<name>", "")
        sections[model] = s = Section(model, path, anchor)
        order.append(s)
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            nested = _nested_model(info.annotation)
            if nested is not None:
                visit(nested, _child_path(path, name, info.annotation))

    visit(root, "")
    return order


CONFIG_ROOTS: list[tuple[str, str, str]] = [
    # (class name in gateway.settings, title, what it configures)
    ("Settings", "The config file", "`config/*.yaml`, read by `sparkgate serve --config FILE`"),
    ("BoxFileSettings", "Box files", "`config/boxes/*.yaml`, read by `sparkgate plan --box FILE`"),
]


def config_page(roots: Sequence[type] | None = None, module: types.ModuleType | None = None) -> str:
    """Every field of the settings models: dotted path, type, default, description."""
    if module is None:
        module = importlib.import_module("gateway.settings")
    titles = {name: (title, what) for name, title, what in CONFIG_ROOTS}
    explicit = roots
    if roots is None:
        roots = [getattr(module, name) for name, _, _ in CONFIG_ROOTS]
    lines = [
        GENERATED_NOTE,
        "# Configuration",
        "",
        "Every field of the settings models (`gateway/settings.py`), generated from the code: its",
        "dotted path, type, default and description. A YAML config is validated once into these",
        "models at start-up; an unknown key is an error. Environment variables override the file:",
        "`SPARKGATE_` and the path with `__` between levels, e.g. `SPARKGATE_SERVER__PORT=9000`.",
        "",
        "In a path, `[]` stands for each item of a list and `<name>` for each key of a mapping.",
        "A section's default is what an omitted section holds: its own fields' defaults, unless",
        "the default names other values.",
        "",
    ]
    # Models of the module that no root reaches are documented too (a new file's schema).
    name = module.__name__
    extra = [obj for obj in vars(module).values() if _is_model(obj) and obj.__module__ == name]
    extra = [obj for obj in extra if not obj.__name__.startswith("_")]
    walked: set[type] = set()
    parts: list[tuple[type, list[Section]]] = []
    pending = list(roots)
    while pending:
        root = pending.pop(0)
        if root in walked:
            continue
        sections = [s for s in _walk(root, _slug(root.__name__)) if s.model not in walked]
        walked |= {s.model for s in sections}
        parts.append((root, sections))
        if not pending and explicit is None:
            pending = [m for m in extra if m not in walked]
    anchors = {s.model: s.anchor for _, sections in parts for s in sections}
    headings = set(anchors.values())
    for root, sections in parts:
        title, what = titles.get(root.__name__, (root.__name__, ""))
        lines += [f"## {title} {{#{_slug(root.__name__)}}}", ""]
        if what:
            lines += [f"{what}.", ""]
        for s in sections:
            lines += _section(s, anchors, headings)
    return "\n".join(lines).rstrip() + "\n"


def _slug(name: str) -> str:
    return "".join("-" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(name))


def field_anchor(section_anchor: str, name: str) -> str:
    """A field's anchor on the config page: its section's, dot, its name (`settings.server.port`)."""
    return f"{section_anchor}.{name}"


def _field_cell(path: str, anchor: str, headings: set[str]) -> str:
    """The field's path, linking to its own anchor, so that a row can be linked to and its link
    copied. A section field's anchor is its section's heading (`auth` is `### auth`): one id."""
    link = f"[{_code(path)}](#{anchor})"
    return link if anchor in headings else f"{link}{{#{anchor}}}"


def _section(s: Section, anchors: dict[type, str], headings: set[str]) -> list[str]:
    out = [f"### {_code(s.path)} {{#{s.anchor}}}", ""] if s.path else []
    doc = _first_paragraph(s.model.__doc__) if "__doc__" in vars(s.model) else ""
    if doc:
        out += [doc, ""]
    if s.also:
        out += ["The same fields at " + ", ".join(_code(p) for p in s.also) + ".", ""]
    rows = []
    for name, info in s.model.model_fields.items():  # type: ignore[attr-defined]
        path = f"{s.path}.{name}" if s.path else name
        kind = _code(type_name(info.annotation))
        nested = _nested_model(info.annotation)
        if nested is not None and nested in anchors:
            kind = f"[{kind}](#{anchors[nested]})"
        limits = _constraints(info)
        if limits:
            kind += f" ({limits})"
        default = default_text(info)
        if default != "required" and not default.startswith("("):
            default = _code(default)
        cell = _field_cell(path, field_anchor(s.anchor, name), headings)
        rows.append((cell, kind, default, _field_description(s.model, name, info)))
    out += _table(("field", "type", "default", "description"), rows)
    return [*out, ""]


# -- metrics ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MetricDoc:
    name: str  # as exposed (a counter's `_total` included)
    type: str
    help: str
    labels: tuple[str, ...]


def _empty_state() -> Any:
    """An app state with no models, as `LiveCollector` reads it: every family it yields, none
    of the per-model samples. Real components where they are cheap to build."""
    from gateway.admission import AdmissionMetrics
    from gateway.failed_auth import FailedAuthTable
    from gateway.host_memory import MemInfo, MemoryWatch
    from gateway.quota.gate import QuotaGate
    from gateway.settings import FailedAuthSettings, QuotaSettings
    from policies.memory_guard import GuardLimits

    admission = types.SimpleNamespace(metrics=AdmissionMetrics(), snapshot=lambda name: None)
    return types.SimpleNamespace(
        registry=[],
        admission=admission,
        supervisor=None,
        counters=types.SimpleNamespace(by_model_inflight={}),
        quota=QuotaGate.from_settings(QuotaSettings()),
        failed_auth=FailedAuthTable(FailedAuthSettings()),
        router=types.SimpleNamespace(decisions={}),
        memory=MemoryWatch(MemInfo(), GuardLimits(floor=1), poll_s=1, retry_after_s=1),  # never read
    )


def scrape_registry() -> Any:
    """The registry a running app's GET /metrics renders (with no models)."""
    from gateway.http.metrics import bind
    from gateway.metrics import Metrics
    from gateway.settings import MetricsSettings

    metrics = Metrics(MetricsSettings())
    bind(metrics, _empty_state())
    return metrics.registry


def metric_docs(registry: Any) -> list[MetricDoc]:
    """Every family of a prometheus_client registry, labels included (read off each collector:
    a family with no samples yet still names them)."""
    docs: dict[str, MetricDoc] = {}
    for collector in list(registry._collector_to_names):
        families = [collector] if hasattr(collector, "_labelnames") and hasattr(collector, "_type") else []
        for item in families or list(collector.collect()):
            name = getattr(item, "_name", None) or item.name
            kind = getattr(item, "_type", None) or item.type
            doc = getattr(item, "_documentation", None) or item.documentation
            labels = tuple(getattr(item, "_labelnames", ()))
            exposed = f"{name}_total" if kind == "counter" else name
            docs[exposed] = MetricDoc(exposed, kind, doc, labels)
    return sorted(docs.values(), key=lambda d: d.name)


def metrics_page(registry: Any = None) -> str:
    registry = scrape_registry() if registry is None else registry
    docs = metric_docs(registry)
    lines = [
        GENERATED_NOTE,
        "# Metrics",
        "",
        "Every metric of `GET /metrics` (Prometheus text format; `gateway/metrics.py`), generated",
        "from the registry a running gateway renders. Live state (KV blocks, queues, engine",
        "counters) is read at scrape time; request outcomes and latencies are counted as requests",
        "end. A histogram is exposed as `NAME_bucket`, `NAME_sum` and `NAME_count`. Label values",
        "come from bounded sets only (model names, reasons, SLO classes, at most",
        "`metrics.max_users` users, the rest as `other`); see [the configuration](config.md#settings.metrics)",
        "for who may scrape. An in-process vLLM engine's own `vllm:*` families are passed through",
        "after these.",
        "",
        f"{len(docs)} metrics.",
        "",
    ]
    rows = [(_code(d.name), d.type, ", ".join(_code(label) for label in d.labels) or "—", d.help) for d in docs]
    lines += _table(("metric", "type", "labels", "help"), rows)
    return "\n".join(lines) + "\n"


# -- CLI -------------------------------------------------------------------------------------------


def _commands(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    for name, cmd in group.commands.items():
        full = f"{prefix} {name}"
        if getattr(cmd, "hidden", False):
            continue
        if hasattr(cmd, "commands"):
            yield full, cmd
            yield from _commands(cmd, full)
        else:
            yield full, cmd


def _param_row(param: Any, ctx: Any) -> tuple[str, str]:
    """(the option as --help writes it, its help with default and environment variable)."""
    record = param.get_help_record(ctx)
    if record is not None:
        return _code(record[0]), record[1]
    # An argument: click's help lists none, typer's does.
    name = str(param.name).upper()
    help_text = getattr(param, "help", None) or ""
    return _code(name), (help_text + ("  [required]" if param.required else "")).strip()


def cli_page(app: Any = None, prog: str = "sparkgate") -> str:
    import typer

    if app is None:
        from gateway.cli import app
    group = typer.main.get_command(app)
    lines = [
        GENERATED_NOTE,
        "# Command line",
        "",
        f"Every command of `{prog}` (`gateway/cli.py`, a typer app), generated from the code.",
        f"`{prog} COMMAND --help` prints the same.",
        "",
    ]
    if group.help:
        lines += [_first_paragraph(group.help), ""]
    commands = list(_commands(group, prog)) if hasattr(group, "commands") else [(prog, group)]
    lines += _table(("command", "what it does"), ((f"[{_code(n)}](#{_cmd_anchor(n)})", _help(c)) for n, c in commands))
    lines.append("")
    for name, cmd in commands:
        lines += [f"## {_code(name)} {{#{_cmd_anchor(name)}}}", ""]
        if cmd.help:
            lines += [inspect.cleandoc(cmd.help), ""]
        if hasattr(cmd, "commands"):
            lines += ["Subcommands: " + ", ".join(_code(f"{name} {sub}") for sub in cmd.commands) + ".", ""]
            continue
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        if params:
            # Duck-typed (typer brings its own copy of click): what `--help` prints, row by row.
            ctx = cmd.make_context(name, [], resilient_parsing=True)
            lines += _table(("option", "help"), (_param_row(p, ctx) for p in params))
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _help(cmd: Any) -> str:
    return _first_paragraph(cmd.short_help or cmd.help or "")


def _cmd_anchor(name: str) -> str:
    return name.replace(" ", "-")


# -- errors ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CodeUse:
    code: str
    error: str  # the GatewayError class
    where: str  # a source location, or what produces it


def _subclasses(base: type) -> list[type]:
    out: list[type] = []
    subs: list[type] = base.__subclasses__()
    for sub in subs:
        out.append(sub)
        out += _subclasses(sub)
    return out


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def raised_codes(error_names: set[str], source_dirs: Sequence[Path], root: Path = ROOT) -> list[CodeUse]:
    """Every `SomeError(..., code="...")` call in the Python files under `source_dirs`."""
    uses = []
    for directory in source_dirs:
        for path in sorted(directory.rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                name = _call_name(node.func)
                if name not in error_names:
                    continue
                for kw in node.keywords:
                    if kw.arg == "code" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                        where = path.relative_to(root) if path.is_relative_to(root) else path
                        uses.append(CodeUse(kw.value.value, name, f"{where}:{node.lineno}"))
    return uses


def _validation_codes(errors_module: types.ModuleType) -> list[str]:
    """The codes the request-validation handler returns (`validation_message`'s third item)."""
    fn = getattr(errors_module, "validation_message", None)
    if fn is None:
        return []
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    codes = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and node.value.elts:
            last = node.value.elts[-1]
            if isinstance(last, ast.Constant) and isinstance(last.value, str) and last.value not in codes:
                codes.append(last.value)
    return codes


def errors_page(base: type | None = None, source_dirs: Sequence[Path] | None = None) -> str:
    """The error hierarchy and every code the gateway answers with."""
    import gateway.errors as errors
    import gateway.http.anthropic.errors as anthropic_errors
    import gateway.http.errors as http_errors
    from engine_adapter.base import EngineError, EngineRequestInvalid, EngineUnavailable
    from policies.demand import Reject, RejectReason
    from policies.quotas import Deny, DenyReason

    base = errors.GatewayError if base is None else base
    source_dirs = [ROOT / "gateway"] if source_dirs is None else source_dirs
    classes = [base, *_subclasses(base)]
    by_name = {c.__name__: c for c in classes}

    lines = [
        GENERATED_NOTE,
        "# Errors",
        "",
        "Every error the gateway answers with, generated from `gateway/errors.py` and the code",
        "that raises them. OpenAI's endpoints (and the gateway's own) answer",
        '`{"error": {"message", "type", "param", "code"}}` with the status below; the Messages',
        'API (`/v1/messages`) answers Anthropic\'s `{"type": "error", "error": {"type", "message"}}`',
        "([below](#anthropic)). Tracebacks go to the log, never to the client.",
        "",
        "## The hierarchy",
        "",
    ]
    rows = []
    for c in classes:
        parent = next((b.__name__ for b in c.__bases__ if b in classes), "")
        rows.append(
            (
                _code(c.__name__),
                _code(parent) if parent else "—",
                str(c.status),  # type: ignore[attr-defined]
                _code(c.type),  # type: ignore[attr-defined]
                _code(c.default_code) if c.default_code else "—",  # type: ignore[attr-defined]
                _first_paragraph(c.__doc__) if "__doc__" in vars(c) and c.__doc__ else "",
            )
        )
    lines += _table(("error", "is a", "status", "type", "default code", "what"), rows)
    lines.append("")

    uses: list[CodeUse] = [
        CodeUse(c.default_code, c.__name__, "default")  # type: ignore[attr-defined]
        for c in classes
        if c.default_code  # type: ignore[attr-defined]
    ]
    uses += raised_codes(set(by_name), source_dirs)
    uses += [CodeUse(code, "InvalidRequest", "request validation") for code in _validation_codes(http_errors)]
    produced: list[tuple[str, Any, str]] = []  # (code, the error, what produced it)
    for reason in RejectReason:
        err = errors.from_reject(Reject("-", reason, "-"))
        produced.append((reason.code, err, f"admission: {reason.label}"))
    for deny in DenyReason:
        err = errors.from_quota_refusal("key:x", Deny(deny, 1000, 1, 1), 1)
        produced.append((deny.code, err, f"quota: {deny.label}"))
    for exc in (EngineRequestInvalid("-"), EngineUnavailable("-"), EngineError("-")):
        err = errors.from_exception(exc)
        produced.append((err.code or "", err, f"engine: {type(exc).__name__}"))

    table: dict[str, dict[tuple[int, str, str], list[str]]] = {}
    for use in uses:
        cls = by_name[use.error]
        key = (cls.status, cls.type, use.error)  # type: ignore[attr-defined]
        table.setdefault(use.code, {}).setdefault(key, []).append(use.where)
    for code, err, what in produced:
        key = (err.status, err.error_type, type(err).__name__)
        table.setdefault(code, {}).setdefault(key, []).append(what)

    lines += [
        "## Codes",
        "",
        "Every `code` a response can carry, with its status, `type` and error class, and where",
        "it comes from: the class's default, a source line that raises it, request validation,",
        "an admission or quota refusal, or an engine failure.",
        "",
    ]
    code_rows: list[tuple[str, ...]] = []
    for code in sorted(table):
        for (status, kind, cls_name), where in sorted(table[code].items()):
            code_rows.append((_code(code), str(status), _code(kind), _code(cls_name), ", ".join(dict.fromkeys(where))))
    lines += _table(("code", "status", "type", "error", "from"), code_rows)
    lines += [
        "",
        "## Anthropic's shape {#anthropic}",
        "",
        "The Messages API names the kind of error by the status; an overloaded box (no room, a",
        "queue timeout) answers 529, as Anthropic does when its capacity is full.",
        "",
    ]
    anthropic = sorted(anthropic_errors.TYPES.items())
    lines += _table(("status", "Anthropic type"), ((str(s), _code(t)) for s, t in anthropic))
    lines += [
        "",
        "Any other status is `api_error`.",
    ]
    return "\n".join(lines) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/config.md": config_page,
    "reference/metrics.md": metrics_page,
    "reference/cli.md": cli_page,
    "reference/errors.md": errors_page,
}


def main(argv: Sequence[str]) -> int:
    names = {Path(p).stem: p for p in PAGES}
    if len(argv) != 1 or argv[0] not in names:
        print(f"usage: python -m tools.docs_reference {{{'|'.join(names)}}}", file=sys.stderr)
        return 2
    sys.stdout.write(PAGES[names[argv[0]]]())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
