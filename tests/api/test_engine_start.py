"""The session server starts its two vLLM engines side by side (`server.engine_start:
parallel`): each engine's core process still gets its own cores (the CPU build reads them from
the environment it inherits), and each engine keeps its own vLLM metrics (test_metrics.py)."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import Server

pytestmark = pytest.mark.engine  # starts vLLM engines


def test_engines_start_side_by_side_each_on_its_own_cores(server: Server) -> None:
    log = server.log_path.read_text(errors="replace")
    model_of = dict(re.findall(r"EngineCore pid=(\d+)\).*Initializing a V1 LLM engine.*?model='[^']*/([^'/]+)'", log))
    cores_of = dict(re.findall(r"EngineCore pid=(\d+)\).*core ids=\[([\d, ]+)\]", log))
    bound = {model_of[pid]: cores for pid, cores in cores_of.items()}
    assert bound == {"tiny-qwen3": "0", "tiny-qwen3-moe": "1" if (os.cpu_count() or 1) > 1 else "0"}, log[-3000:]
    # Side by side: the second engine began (its config resolved) before the first was ready.
    lines = log.splitlines()
    began = [i for i, line in enumerate(lines) if "Resolved architecture" in line]
    ready = [i for i, line in enumerate(lines) if re.search(r"engine tiny-[\w-]+ ready in", line)]
    assert len(began) == 2 and len(ready) == 2 and max(began) < min(ready), (began, ready)
