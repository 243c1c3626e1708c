"""The docs site's Reference pages follow the code (tools/docs_reference.py, `make docs`), and
the site's hook rewrites links for where a page lies in the site (tools/docs_site.py).

Each "new X appears" test adds an X the page has never seen (a settings field, a metric, an
error code, a command) and finds it in the generated page, with no page edited; each also
checks the page without it lacks it, so the test fails if the page stops following the code."""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any

import pytest
import typer
from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, Field

from gateway.errors import GatewayError, InvalidRequest
from gateway.http import metrics as gateway_metrics
from gateway.settings import ServerSettings, Settings
from tools import docs_reference as ref


def row(page: str, first_cell: str) -> list[str]:
    """The cells of the table row whose first cell is `first_cell` (code span included)."""
    for line in page.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in the page")


def has_row(page: str, first_cell: str) -> bool:
    try:
        row(page, first_cell)
    except AssertionError:
        return False
    return True


# A config field's first cell: its path linking to its anchor, and the anchor itself unless
# the field's section heading has it.
FIELD_CELL = re.compile(r"^\[`(?P<path>[^`]+)`\]\(#(?P<link>[^)]+)\)(?:\{#(?P<id>[^}]+)\})?$")


def field_rows(page: str) -> dict[str, list[str]]:
    """The config page's field rows by path (each row's cells, the first as it is written)."""
    out = {}
    for line in page.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        m = FIELD_CELL.match(cells[0]) if cells else None
        if m:
            out[m["path"]] = cells
    return out


def field_row(page: str, path: str) -> list[str]:
    """A config field's cells, the first as its path in code (`server.port`)."""
    cells = field_rows(page).get(path)
    assert cells is not None, f"no row {path!r} in the page"
    return [f"`{path}`", *cells[1:]]


def undescribed(page: str) -> list[str]:
    return [path for path, cells in field_rows(page).items() if not cells[3]]


# -- config ----------------------------------------------------------------------------------------


class ServerWithKnob(ServerSettings):
    """The server, with knobs."""

    # How long the new knob waits before it turns; a comment is all a field needs.
    knob_wait_s: float = Field(2.5, gt=0)
    knob_mode: str = Field("slow", description="The knob's mode, from Field(description=...).")
    knob_colour: str = "red"


class SettingsWithKnob(Settings):
    server: ServerWithKnob = ServerWithKnob()


def test_a_new_settings_field_appears_in_the_config_page() -> None:
    page = ref.config_page(roots=[SettingsWithKnob])
    cells = field_row(page, "server.knob_wait_s")
    assert cells[1:] == [
        "`float` (> 0)",
        "`2.5`",
        "How long the new knob waits before it turns; a comment is all a field needs.",
    ]
    assert field_row(page, "server.knob_mode")[3] == "The knob's mode, from Field(description=...)."
    assert "server.knob_wait_s" not in field_rows(ref.config_page())


def test_every_config_field_has_a_description() -> None:
    # A field needs a comment above it or on its line (or Field(description=...)); a section
    # field may lean on its model's docstring.
    assert undescribed(ref.config_page()) == []
    # The check sees a field written without one.
    assert undescribed(ref.config_page(roots=[SettingsWithKnob])) == ["server.knob_colour"]


def test_each_config_field_has_an_anchor() -> None:
    page = ref.config_page()
    rows = field_rows(page)
    headings = set(re.findall(r"^#+ .* \{#([^}]+)\}$", page, re.MULTILINE))
    declared = [m["id"] for m in (FIELD_CELL.match(cells[0]) for cells in rows.values()) if m and m["id"]]
    assert len(declared) == len(set(declared)), "an anchor is declared twice"
    assert not set(declared) & headings
    for path, cells in rows.items():
        m = FIELD_CELL.match(cells[0])
        assert m is not None
        # Each row links to its own anchor: one its cell declares, or its section's heading.
        assert m["link"] == (m["id"] or m["link"]), path
        assert m["id"] is not None or m["link"] in headings, path

    # The anchor is the root's and the path's, without `[]` and `<name>`.
    def anchor(path: str) -> str:
        m = FIELD_CELL.match(rows[path][0])
        assert m is not None
        return m["id"] or m["link"]

    assert anchor("server.port") == "settings.server.port"
    assert anchor("models[].latency.tpot_s") == "settings.models.latency.tpot_s"
    assert anchor("routing.classes.<name>.ttft_s") == "settings.routing.classes.ttft_s"
    assert anchor("efficiency.gemm") == "box-file-settings.efficiency.gemm"
    assert rows["auth"][0] == "[`auth`](#settings.auth)"  # a section: its heading
    assert "### `auth` {#settings.auth}" in page


def _paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        out.append(prefix + name)
        nested = ref._nested_model(info.annotation)
        if nested is not None:
            out += _paths(nested, ref._child_path(prefix.rstrip("."), name, info.annotation) + ".")
    return out


def test_every_settings_field_is_in_the_config_page_once_per_model() -> None:
    page = ref.config_page()
    documented = set(field_rows(page))
    # A model met again (a team's `defaults` are `quotas.defaults`' fields) is named, not repeated.
    assert "The same fields at `quotas.teams[].defaults`." in page
    for path in _paths(Settings):
        if not path.startswith("quotas.teams[].defaults."):
            assert path in documented, path
    # Box files are documented too; a required field says so, an omitted section what it holds.
    assert "efficiency.gemm" in documented
    assert field_row(page, "models[].name")[2] == "required"
    assert field_row(page, "auth")[2] == '`{"required": false}`'


# -- metrics ---------------------------------------------------------------------------------------


def test_a_new_metric_appears_in_the_metrics_page() -> None:
    registry = ref.scrape_registry()
    assert not has_row(ref.metrics_page(registry), "`sparkgate_widgets_total`")
    Counter("sparkgate_widgets", "Widgets the gateway made.", ["model", "colour"], registry=registry)
    cells = row(ref.metrics_page(registry), "`sparkgate_widgets_total`")
    assert cells[1:] == ["counter", "`model`, `colour`", "Widgets the gateway made."]


def test_a_new_live_metric_appears_in_the_metrics_page(monkeypatch: pytest.MonkeyPatch) -> None:
    auth = gateway_metrics.LiveCollector._auth

    def with_one_more(self: Any) -> Any:
        yield from auth(self)
        yield GaugeMetricFamily("sparkgate_knobs", "Knobs turned now.", labels=["model"])

    assert not has_row(ref.metrics_page(), "`sparkgate_knobs`")
    monkeypatch.setattr(gateway_metrics.LiveCollector, "_auth", with_one_more)
    assert row(ref.metrics_page(), "`sparkgate_knobs`")[1:] == ["gauge", "`model`", "Knobs turned now."]


def test_the_metrics_page_lists_every_family_a_scrape_names() -> None:
    registry = ref.scrape_registry()
    page = ref.metrics_page(registry)
    from prometheus_client import generate_latest

    typed = re.findall(r"^# TYPE (\S+) (\S+)$", generate_latest(registry).decode(), re.MULTILINE)
    assert len(typed) > 40
    for name, kind in typed:
        exposed = f"{name}_total" if kind == "counter" and not name.endswith("_total") else name
        assert row(page, f"`{exposed}`")[1] == kind
    assert row(page, "`sparkgate_requests_total`")[2] == "`model`, `outcome`"
    assert row(page, "`sparkgate_queued_requests`")[1:3] == ["gauge", "`model`"]


# -- errors ----------------------------------------------------------------------------------------


def test_a_code_raised_in_the_source_appears_in_the_errors_page(tmp_path: Path) -> None:
    (tmp_path / "new_route.py").write_text(
        "from gateway.errors import InvalidRequest\n\n\n"
        "def check() -> None:\n"
        '    raise InvalidRequest("Widgets are not served here.", code="widget_refused")\n'
    )
    assert not has_row(ref.errors_page(), "`widget_refused`")
    cells = row(ref.errors_page(source_dirs=[tmp_path]), "`widget_refused`")
    assert cells[1:4] == ["400", "`invalid_request_error`", "`InvalidRequest`"]
    assert cells[4].endswith("new_route.py:5")


def test_a_new_error_class_appears_in_the_errors_page() -> None:
    class Teapot(GatewayError):
        """The gateway is a teapot."""

        status = 418
        type = "invalid_request_error"
        default_code = "teapot"

    try:
        page = ref.errors_page()
        assert row(page, "`Teapot`")[1:] == [
            "`GatewayError`",
            "418",
            "`invalid_request_error`",
            "`teapot`",
            "The gateway is a teapot.",
        ]
        assert row(page, "`teapot`")[1:4] == ["418", "`invalid_request_error`", "`Teapot`"]
    finally:
        del Teapot
        gc.collect()  # out of GatewayError.__subclasses__() for the tests after this one
    assert not has_row(ref.errors_page(), "`Teapot`")


def test_the_errors_page_has_the_codes_of_the_code() -> None:
    page = ref.errors_page()
    assert row(page, "`missing_api_key`")[1:4] == ["401", "`invalid_request_error`", "`AuthenticationFailed`"]
    assert row(page, "`queue_timeout`")[1:4] == ["503", "`server_error`", "`Overloaded`"]  # admission
    assert row(page, "`insufficient_quota`")[1:4] == ["429", "`insufficient_quota`", "`RateLimited`"]  # quota
    assert "request validation" in row(page, "`invalid_type`")[4]
    assert row(page, "`InvalidRequest`")[2:5] == ["400", "`invalid_request_error`", "`invalid_value`"]
    assert InvalidRequest.status == 400


# -- CLI -------------------------------------------------------------------------------------------


def test_a_new_command_appears_in_the_cli_page() -> None:
    app = typer.Typer(help="A tool.")

    @app.command()
    def serve() -> None:
        """Serve."""

    assert not has_row(ref.cli_page(app, prog="tool"), "[`tool frobnicate`](#tool-frobnicate)")

    @app.command()
    def frobnicate(level: int = typer.Option(3, help="How hard")) -> None:
        """Frobnicate the widgets."""

    page = ref.cli_page(app, prog="tool")
    assert row(page, "[`tool frobnicate`](#tool-frobnicate)")[1] == "Frobnicate the widgets."
    assert row(page, "`--level <int>`")[1] == "How hard [default: 3]"


def test_the_cli_page_has_every_command_of_sparkgate() -> None:
    page = ref.cli_page()
    for command in ("serve", "plan", "check", "prepare-models", "keys create", "keys usage"):
        assert f"## `sparkgate {command}`" in page, command
    assert row(page, "`-c, --config <path>`")[1].startswith("YAML config file")


# -- the hook's links ------------------------------------------------------------------------------


@pytest.fixture
def rewriter() -> Any:
    from tools import docs_site

    def make(site_path: str, repo_path: str) -> Any:
        docs_site._REPO_PATHS.clear()
        docs_site._REPO_PATHS.update({"benchmarks/index.md": "BENCHMARKS.md"})
        docs_site._REPO_PATHS.update({"benchmarks/results/flood.md": "benchmarks/results/flood.md"})
        site = {"index.md", "routing.md", "guide/keys.md", "benchmarks/index.md", "benchmarks/results/flood.md"}
        return docs_site.LinkRewriter(site_path, repo_path, site)

    return make


def test_links_point_where_the_page_lies_in_the_site(rewriter: Any) -> None:
    bench = rewriter("benchmarks/index.md", "BENCHMARKS.md")
    assert bench.rewrite("[r](docs/routing.md#glossary)") == "[r](../routing.md#glossary)"
    assert bench.rewrite("[f](benchmarks/results/flood.md)") == "[f](results/flood.md)"
    story = rewriter("benchmarks/results/flood.md", "benchmarks/results/flood.md")
    assert story.rewrite("[back](../../BENCHMARKS.md)") == "[back](../index.md)"
    page = rewriter("guide/keys.md", "docs/guide/keys.md")
    assert page.rewrite("[r](../routing.md)") == "[r](../routing.md)"
    assert page.rewrite("[web](https://example.com/x.md)") == "[web](https://example.com/x.md)"


def test_links_to_repository_files_become_code_and_missing_ones_stay(rewriter: Any) -> None:
    page = rewriter("routing.md", "docs/routing.md")
    assert page.rewrite("see [the app](../gateway/app.py).") == "see the app (`gateway/app.py`)."
    assert page.rewrite("[`gateway/app.py`](../gateway/app.py)") == "`gateway/app.py`"
    assert page.rewrite("[../config/default.yaml](../config/default.yaml#L3)") == "`config/default.yaml`"
    # Missing: left for `mkdocs build --strict` to report (a doc page, or a source file).
    assert page.rewrite("[gone](../gateway/gone.py)") == "[gone](../gateway/gone.py)"
    assert page.rewrite("[gone](guide/gone.md)") == "[gone](guide/gone.md)"
    # Code is never rewritten.
    code = "```\n[app](../gateway/app.py)\n```\nand `[app](../gateway/app.py)`\n"
    assert page.rewrite(code) == code
