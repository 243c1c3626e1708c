"""Fuzzing in the suite: schemathesis against the gateway's OpenAPI document (a short run of
benchmarks/fuzz.py, which runs over 1,000 cases; its last result is in BENCHMARKS.md), and
the image cases (every image payload in every place of chat, Responses and Anthropic's
Messages, to a vision model and a text model, and seeded mixes). Fails on any 5xx, on any
response that its document (or its surface's error shape) does not describe, on a valid
image refused or an invalid one taken, and on anything held after the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.fuzz import (
    IMAGE_CODES,
    OPERATIONS,
    QUOTED_SURROGATES,
    explicit_image_cases,
    fuzz,
    fuzz_images,
    gateway_config,
    image_table,
    table,
)
from tests.conftest import Fleet, Launch, Server, config_launch, free_port

CASES = 8  # per operation and mode: 56 cases
IMAGE_MIXES = 100  # seeded mixes of several images, after the explicit image cases


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


def test_images_never_get_a_server_error_and_nothing_stays_held(gateway: Server) -> None:
    result = fuzz_images(gateway.base_url, IMAGE_MIXES, seed=18)
    report = image_table(result)
    assert result.cases > len(explicit_image_cases()), report
    assert result.server_errors == 0 and not result.failures, "\n".join([report, *result.failures[:40]])
    # The cases reached each refusal of the image path, and valid images ran on the engine,
    # streamed too: a run that stopped short of the reader would pass the checks above.
    missing = IMAGE_CODES - set(result.codes)
    assert not missing, (missing, report)
    assert result.statuses[200] > 100 and result.streams > 20, report


def test_a_lone_surrogate_that_an_error_quotes_gets_a_400(gateway: Server) -> None:
    result = fuzz_images(gateway.base_url, 0, payloads=QUOTED_SURROGATES)
    assert result.cases == len(explicit_image_cases(QUOTED_SURROGATES))
    assert result.server_errors == 0 and not result.failures, "\n".join(result.failures[:20])
