"""Fuzzing: schemathesis against the gateway's own OpenAPI document, on the simulated engine.

Run from the repository root (the tokenizer must exist: `make models`):

    .venv/bin/python benchmarks/fuzz.py [--cases 1200] [--seed 18]

Starts `sparkgate serve` on one simulated engine (config built here), loads
`/openapi.json`, and for each operation (POST /v1/chat/completions, /v1/completions,
/v1/responses, GET /v1/models) generates cases with schemathesis (Hypothesis underneath):
valid bodies (positive) and bodies that break the schema (negative), in equal parts. Each
response is checked for: not_a_server_error (no 5xx), response_schema_conformance (the
body matches the documented schema of its status: gateway/http/response_docs.py) and
status_code_conformance (the status is a documented one). Prints a table per operation and
mode; exits 1 on any failure. The suite runs a short version (tests/api/test_fuzz.py).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # tests import this module too: leave their sys.path alone
    # Run as a script, Python puts benchmarks/ first on sys.path: the standard library first, then the repository root.
    sys.path.insert(0, os.path.dirname(os.__file__))
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gateway_process import free_port, launch

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "sk-fuzz-key"
MODEL = "sim-tiny"
# Each operation with the modes it is fuzzed in (GET /v1/models has no input to make invalid).
OPERATIONS = (
    ("POST", "/v1/chat/completions", ("positive", "negative")),
    ("POST", "/v1/completions", ("positive", "negative")),
    ("POST", "/v1/responses", ("positive", "negative")),
    ("GET", "/v1/models", ("positive",)),
)
STARTUP_TIMEOUT_S = 300


def gateway_config(port: int, **limits: Any) -> dict[str, Any]:
    """One simulated engine (the box model at 1000x: answers in milliseconds), auth on, the
    real tokenizer of models/tiny-qwen3."""
    from gateway.settings import hash_key

    return {
        "server": {"host": "127.0.0.1", "port": port, "log_level": "warning", "cache_dir": str(ROOT / ".cache")},
        "auth": {"required": True, "keys": [{"name": "fuzzer", "sha256": hash_key(API_KEY)}]},
        "quotas": {"defaults": {"max_concurrency": 64}},
        "models": [
            {
                "name": MODEL,
                "path": str(ROOT / "models" / "tiny-qwen3"),
                "engine": "simulated",
                "simulated": {"model": "Qwen3.6-35B-A3B", "speedup": 1000.0},
                # Short: an answer that runs to the context costs the simulated engine (and the
                # gateway's per-token work) time quadratic in its length, and proves nothing more.
                "max_model_len": 1024,
                "max_num_seqs": 8,
                "kv_cache_bytes": "1GiB",
            }
        ],
        "limits": limits,
    }


@contextlib.contextmanager
def serve(workdir: Path, **limits: Any) -> Iterator[str]:
    """`sparkgate serve` on `gateway_config` until the block exits; yields its base URL."""
    port = free_port()
    config = workdir / "fuzz.yaml"
    config.write_text(yaml.safe_dump(gateway_config(port, **limits)))
    with launch(config, workdir / "fuzz-server.log", port, startup_timeout_s=STARTUP_TIMEOUT_S) as proc:
        yield proc.base_url


@dataclass
class Result:
    """One operation in one generation mode."""

    method: str
    path: str
    mode: str
    cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # check name -> count
    examples: list[str] = field(default_factory=list)  # a few failures, to reproduce

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)


def fuzz(base_url: str, cases_per_run: int, seed: int = 18, log: Any = None) -> list[Result]:
    """Generate and send `cases_per_run` cases per operation and mode; check every response."""
    import requests
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

    checks = [not_a_server_error, response_schema_conformance, status_code_conformance]
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    operations = {(op.method.upper(), op.path): op for op in (r.ok() for r in schema.get_all_operations())}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    results = []
    session = requests.Session()
    hypothesis_settings: dict[str, Any] = {
        "deadline": None,
        "database": None,
        "phases": [Phase.explicit, Phase.generate],
        "suppress_health_check": list(HealthCheck),
    }

    def _runner(strategy: Any, result: Result, positive: bool) -> Any:
        @given(case=strategy)
        def run(case: Any) -> None:
            if positive and isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = MODEL  # a served model: the request runs to the end
            response = case.call(base_url=base_url, headers=headers, session=session, timeout=60)
            result.cases += 1
            result.statuses[response.status_code] += 1
            try:
                case.validate_response(response, checks=checks, headers=headers)
            except Exception as e:  # every failed check is counted, the run goes on
                for name in [type(x).__name__ for x in getattr(e, "exceptions", [e])]:
                    result.failures[name] += 1
                if len(result.examples) < 3:
                    result.examples.append(f"{response.status_code} {case.body!r:.300}: {str(e)[:600]}")

        return run

    for method, path, modes in OPERATIONS:
        op = operations[(method, path)]
        for mode in modes:
            result = Result(method, path, mode)
            run = _runner(op.as_strategy(generation_mode=GenerationMode(mode)), result, mode == "positive")
            hypothesis_seed(seed)(settings(**hypothesis_settings, max_examples=cases_per_run)(run))()
            if log is not None:
                log(f"{method} {path} {mode}: {result.cases} cases, statuses {dict(sorted(result.statuses.items()))}")
            results.append(result)
    return results


def table(results: list[Result]) -> str:
    lines = [
        "| operation | mode | cases | 2xx | 4xx | 5xx | check failures | statuses |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        ok = sum(n for s, n in r.statuses.items() if 200 <= s < 300)
        client = sum(n for s, n in r.statuses.items() if 400 <= s < 500)
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(r.statuses.items()))
        lines.append(
            f"| {r.method} {r.path} | {r.mode} | {r.cases} | {ok} | {client} | {r.server_errors} "
            f"| {sum(r.failures.values())} | {statuses} |"
        )
    total = sum(r.cases for r in results)
    errors = sum(r.server_errors for r in results)
    failed = sum(sum(r.failures.values()) for r in results)
    lines.append(f"| **all** | | **{total}** | | | **{errors}** | **{failed}** | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=150, help="cases per operation and mode (7 runs)")
    parser.add_argument("--seed", type=int, default=18)
    args = parser.parse_args()

    def log(msg: str) -> None:
        print(f"[fuzz {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp)) as base:
        log(f"gateway up at {base}")
        results = fuzz(base, args.cases, args.seed, log)
    print(table(results))
    for r in results:
        for example in r.examples:
            print(f"- {r.method} {r.path} ({r.mode}): {example}")
    print(f"\n{sum(r.cases for r in results)} cases in {time.monotonic() - started:.0f} s")
    bad = any(r.server_errors or r.failures for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
