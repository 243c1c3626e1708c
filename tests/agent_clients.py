"""The coding agents the team uses, as they ship: Claude Code and Codex CLI from the npm
registry, pinned, installed once into the tree's cache (`.cache/agents`)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PREFIX = ROOT / ".cache" / "agents"
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.332"
CODEX = "@openai/codex@0.171.0"
PACKAGES = (CLAUDE_CODE, CODEX)


def _installed() -> bool:
    return all((PREFIX / "node_modules" / ".bin" / b).exists() for b in ("claude", "codex")) and all(
        (PREFIX / "node_modules" / p.rsplit("@", 1)[0] / "package.json").exists() for p in PACKAGES
    )


def install() -> Path:
    """The clients' `.bin` folder; installs them first if needed (one process at a time).
    No Node or no registry is an error, never a skip: CI must run these."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RuntimeError("Node.js and npm are needed for the coding-agent tests (Debian: apt-get install nodejs npm)")
    PREFIX.mkdir(parents=True, exist_ok=True)
    with (PREFIX / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        versions_file = PREFIX / ".versions"
        if not (_installed() and versions_file.exists() and versions_file.read_text() == " ".join(PACKAGES)):
            subprocess.run(
                [npm, "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", "--no-save", *PACKAGES],
                check=True,
                env={**os.environ, "npm_config_update_notifier": "false"},
                timeout=900,
            )
            versions_file.write_text(" ".join(PACKAGES))
    return PREFIX / "node_modules" / ".bin"


if __name__ == "__main__":  # .ci/run and `make agents` install them ahead of the tests
    print(install())


def codex_home(home: Path, config: Path, *options: str) -> dict[str, dict[str, Any]]:
    """Make `home` a CODEX_HOME as the README tells users to (`sparkgate codex-config` for the
    gateway serving `config`, with `options` such as `--model` or `--url`): its config.toml and
    model catalog. The catalog's entries by model name."""
    home.mkdir(parents=True, exist_ok=True)
    catalog = home / "sparkgate-models.json"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "codex-config",
            "--config",
            str(config),
            "--catalog",
            str(catalog),
            *options,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (home / "config.toml").write_text(made.stdout)
    return {m["slug"]: m for m in json.loads(catalog.read_text())["models"]}
