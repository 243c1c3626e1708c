"""MkDocs hook of the docs site (mkdocs.yml `hooks:`; `make docs`).

- The Reference pages (reference/*.md) are generated in memory from the code by
  tools/docs_reference.py: nothing generated lives in docs/ or in git.
- Benchmark pages that live outside docs/ join the site: BENCHMARKS.md as benchmarks/index.md
  and every benchmarks/results/*.md under the same path, listed under "Run stories" in the nav
  (read from the folder, so a new story needs no edit here or in mkdocs.yml).
- Relative links are resolved where the page lies in the repository, then rewritten for where
  it lies in the site: a link to a page or file of the site points at it; a link to a file of
  the repository that the site does not hold (source code, a config, README.md) becomes its
  path in code, as the docs write paths elsewhere; a link whose target does not exist is left
  for MkDocs to report, so `mkdocs build --strict` fails on it (as on a missing anchor).
  Images the pages show from outside docs/ are copied into the site at their repository path.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote, urlsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the hook is loaded by path: make `tools` importable
    sys.path.insert(0, str(ROOT))

from tools import docs_reference  # noqa: E402

BENCHMARKS_INDEX = "benchmarks/index.md"
RESULTS = "benchmarks/results"
RUN_STORIES = "Run stories"

# Where each page of the site that is not a file of docs/ lies in the repository (site path ->
# repository path, both relative and POSIX). Filled by on_files.
_REPO_PATHS: dict[str, str] = {}


def _benchmark_pages() -> dict[str, str]:
    """site path -> repository path of the benchmark pages outside docs/."""
    pages = {}
    if (ROOT / "BENCHMARKS.md").is_file():
        pages[BENCHMARKS_INDEX] = "BENCHMARKS.md"
    for story in sorted((ROOT / RESULTS).glob("*.md")):
        rel = story.relative_to(ROOT).as_posix()
        pages[rel] = rel
    return pages


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Fill the nav's "Run stories" with every benchmarks/results/*.md (none: no entry)."""
    stories = [site for site in _benchmark_pages() if site.startswith(RESULTS + "/")]
    for section in config.nav or []:
        if not isinstance(section, dict):
            continue
        for children in section.values():
            if not isinstance(children, list):
                continue
            for i, child in enumerate(children):
                if isinstance(child, dict) and RUN_STORIES in child:
                    if stories:
                        children[i] = {RUN_STORIES: stories}
                    else:
                        del children[i]
                    break
    return config


# Markdown links and images, inline (`[text](target "title")`) or reference definitions, and
# the code spans a link inside must not be taken from. Fenced blocks are skipped before this.
_INLINE = re.compile(
    r"(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<bang>!?)\[(?P<text>(?:[^\[\]\n]|\[[^\[\]\n]*\])*)\]"
    r"\(\s*(?P<target><[^>\n]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)(?P<title>\s+(?:\"[^\"\n]*\"|'[^'\n]*'))?\s*\)",
    re.DOTALL,
)
_REFERENCE = re.compile(r"^(?P<lead> {0,3}\[[^\]\n]+\]:[ \t]*)(?P<target><[^>\n]*>|\S+)", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp"}


def _is_relative(target: str) -> bool:
    parts = urlsplit(target)
    return not (parts.scheme or parts.netloc or target.startswith(("/", "#")) or not parts.path)


def _repo_path_of(page_repo_path: str, target_path: str) -> str:
    """The repository path a relative link of a page at `page_repo_path` points at."""
    base = posixpath.dirname(page_repo_path)
    return posixpath.normpath(posixpath.join(base, unquote(target_path)))


def _site_path_of(repo_path: str) -> str | None:
    """Where a repository path lies in the site, if it has a place there (existing or not)."""
    for site, repo in _REPO_PATHS.items():
        if repo == repo_path:
            return site
    if repo_path.startswith("docs/"):
        return repo_path.removeprefix("docs/")
    return None


def _split_fences(markdown: str) -> list[tuple[bool, str]]:
    """(is code, text) chunks: fenced code blocks apart from the rest."""
    chunks: list[tuple[bool, str]] = []
    fence: str | None = None
    current: list[str] = []
    for line in markdown.splitlines(keepends=True):
        m = _FENCE.match(line)
        if fence is None and m:
            if current:
                chunks.append((False, "".join(current)))
            current, fence = [line], m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
            current.append(line)
            chunks.append((True, "".join(current)))
            current, fence = [], None
        else:
            current.append(line)
    if current:
        chunks.append((fence is not None, "".join(current)))
    return chunks


class LinkRewriter:
    """Rewrites one page's relative links (see the module's docstring)."""

    def __init__(self, page_site_path: str, page_repo_path: str, site_paths: set[str]) -> None:
        self.page_site_path = page_site_path
        self.page_repo_path = page_repo_path
        self.site_paths = site_paths

    def target(self, target: str) -> tuple[str, str | None]:
        """(the link's new target, or the repository path to write in code instead)."""
        bare = target[1:-1] if target.startswith("<") and target.endswith(">") else target
        if not _is_relative(bare):
            return target, None
        parts = urlsplit(bare)
        repo_path = _repo_path_of(self.page_repo_path, parts.path)
        site_path = _site_path_of(repo_path)
        if site_path is None and repo_path in _ASSETS:
            site_path = repo_path
        if site_path is not None and (site_path in self.site_paths or repo_path.startswith("docs/")):
            # A page or file of the site (or a missing one under docs/: MkDocs names it).
            rel = posixpath.relpath(site_path, posixpath.dirname(self.page_site_path) or ".")
            return rel + (f"#{parts.fragment}" if parts.fragment else ""), None
        if not repo_path.startswith("../") and (ROOT / repo_path).exists():
            return target, repo_path  # a file of the repository that the site does not hold
        return target, None  # missing: left for MkDocs to report

    def inline(self, m: re.Match[str]) -> str:
        if m.group("code"):
            return m.group(0)
        new, code = self.target(m.group("target"))
        text = m.group("text")
        if code is None:
            title = m.group("title") or ""
            return f"{m.group('bang')}[{text}]({new}{title})"
        if m.group("bang"):
            return m.group(0)  # an image of a file the site does not hold: MkDocs reports it
        shown = text.strip()
        if "`" in shown:
            return shown
        written = urlsplit(m.group("target").strip("<>")).path
        if shown in (code, written, PurePosixPath(code).name):
            return f"`{code}`"
        return f"{text} (`{code}`)"

    def reference(self, m: re.Match[str]) -> str:
        new, code = self.target(m.group("target"))
        # A reference definition cannot become code: it points at the file's path as text.
        return m.group("lead") + (new if code is None else m.group("target"))

    def rewrite(self, markdown: str) -> str:
        out = []
        for is_code, chunk in _split_fences(markdown):
            if not is_code:
                chunk = _INLINE.sub(self.inline, chunk)
                chunk = _REFERENCE.sub(self.reference, chunk)
            out.append(chunk)
        return "".join(out)


# Images outside docs/ that pages show: repository path -> copied into the site at that path.
_ASSETS: set[str] = set()


def _images_outside_docs(markdown: str, page_repo_path: str) -> set[str]:
    found = set()
    for is_code, chunk in _split_fences(markdown):
        if is_code:
            continue
        for m in _INLINE.finditer(chunk):
            if m.group("code") or not m.group("bang"):
                continue
            target = m.group("target").strip("<>")
            if not _is_relative(target):
                continue
            repo_path = _repo_path_of(page_repo_path, urlsplit(target).path)
            in_repo = not repo_path.startswith("../") and (ROOT / repo_path).is_file()
            if in_repo and not repo_path.startswith("docs/") and Path(repo_path).suffix.lower() in _IMAGE_SUFFIXES:
                found.add(repo_path)
    return found


def on_files(files: Files, config: MkDocsConfig) -> Files:
    _REPO_PATHS.clear()
    _ASSETS.clear()
    for site_path, make in docs_reference.PAGES.items():
        files.append(File.generated(config, site_path, content=make()))
        _REPO_PATHS[site_path] = f"docs/{site_path}"  # as if it lay in docs/
    for site_path, repo_path in _benchmark_pages().items():
        files.append(File.generated(config, site_path, abs_src_path=str(ROOT / repo_path)))
        _REPO_PATHS[site_path] = repo_path
    pages = [(f.abs_src_path, _page_repo_path(f)) for f in files.documentation_pages()]
    for abs_src, repo_path in pages:
        if abs_src is not None:
            _ASSETS.update(_images_outside_docs(Path(abs_src).read_text(), repo_path))
    for repo_path in sorted(_ASSETS):
        if files.get_file_from_path(repo_path) is None:
            files.append(File.generated(config, repo_path, abs_src_path=str(ROOT / repo_path)))
    return files


def _page_repo_path(file: File) -> str:
    return _REPO_PATHS.get(file.src_uri, f"docs/{file.src_uri}")


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files, **_: Any) -> str:
    site_paths = {f.src_uri for f in files}
    return LinkRewriter(page.file.src_uri, _page_repo_path(page.file), site_paths).rewrite(markdown)
