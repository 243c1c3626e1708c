"""Fuzzing in the suite: schemathesis against the gateway's OpenAPI document (a short run of
benchmarks/fuzz.py, which runs over 1,000 cases; its last result is in BENCHMARKS.md).
Fails on any 5xx and on any response that its document does not describe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.fuzz import OPERATIONS, fuzz, gateway_config, table
from tests.conftest import Fleet, Launch, Server, config_launch, free_port

CASES = 8  # per operation and mode: 56 cases


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    return [config_launch(gateway_config(free_port()), tmp)]


@pytest.fixture(scope="module")
def gateway(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (srv,):
        yield srv


def test_no_server_errors_and_every_response_as_documented(gateway: Server) -> None:
    results = fuzz(gateway.base_url, CASES)
    report = table(results)
    assert len(results) == sum(len(modes) for _, _, modes in OPERATIONS)
    assert all(r.cases == CASES for r in results), report
    assert sum(r.server_errors for r in results) == 0, report
    failures = [f"{r.method} {r.path} ({r.mode}): {e}" for r in results for e in r.examples]
    assert not any(r.failures for r in results), "\n".join([report, *failures])
    # The run exercised both sides: answers that ran on the engine, and refusals.
    assert sum(r.statuses[200] for r in results) > 0 and sum(r.statuses[400] for r in results) > 0, report
