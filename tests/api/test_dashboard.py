"""/dashboard in a real browser (Debian's chromium through Playwright) on the simulated DGX
Spark gateway under load: the page logs in with the admin key and shows the live numbers
that its data endpoint reports. Its data needs the admin key (401 without, 403 with a user's).

    SPARKGATE_DASHBOARD_PNG=docs/dashboard.png pytest tests/api/test_dashboard.py

also writes the screenshot to docs/dashboard.png (the README's).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.configs import EVERY, shipped_config
from tests.conftest import Fleet, Launch, Server, config_launch

CHROMIUM = Path("/usr/bin/chromium")
USER_KEY = "sk-sparkgate-dev"  # the config's demo user key
ADMIN_KEY = "sk-sparkgate-admin"  # the config's demo admin key
SPEEDUP = 2.0  # slow enough that a request runs for a few seconds
BUDGET = 5_000_000
LOAD_THREADS = 6
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def side_by_side(request: pytest.FixtureRequest, tmp: Path) -> list[Launch]:
    """This module's server, started with the session's others (tests/conftest.py: `fleet`)."""
    return [config_launch(shipped_config("sim-dgx-spark", models={EVERY: {"simulated": {"speedup": SPEEDUP}}}), tmp)]


@pytest.fixture(scope="module")
def sim(fleet: Fleet) -> Iterator[Server]:
    with fleet.servers(__name__) as (server,):
        yield server


def data(server: Server, key: str | None = ADMIN_KEY) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{server.base_url}/sparkgate/dashboard/data", headers=headers, timeout=30)


def test_the_data_needs_the_admin_key(sim: Server) -> None:
    assert data(sim, None).status_code == 401
    assert data(sim, "sk-not-a-key").status_code == 401
    denied = data(sim, USER_KEY)
    assert denied.status_code == 403 and "models" not in denied.text
    assert denied.json()["error"]["code"] == "permission_denied"
    # The page itself is public and carries no data.
    page = httpx.get(f"{sim.base_url}/dashboard", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "qwen3" not in page.text and "/sparkgate/dashboard/data" in page.text
    assert "connect-src 'self'" in page.headers["content-security-policy"]  # the browser test runs under it
    body = data(sim).json()
    assert {m["name"] for m in body["models"]} == {"qwen3.8-27b", "qwen3.8-flash-next", "qwen3.6-35b-a3b"}


CHAT = [{"role": "user", "content": "Tell me about Sparks."}]
DOCUMENT = [{"role": "user", "content": "Answer from this document: " + "the box has unified memory. " * 300}]


def _load(server: Server, key: str, document: bool, stop: threading.Event, errors: list[str]) -> None:
    """Chats (or questions on a ~2K-token document) on `auto` until stopped: each runs a few
    seconds at this speed-up."""
    headers = {"Authorization": f"Bearer {key}"} | ({"X-Sparkgate-SLO": "document"} if document else {})
    body = {"model": "auto", "messages": DOCUMENT if document else CHAT, "max_tokens": 400}
    with httpx.Client(base_url=server.api, headers=headers, timeout=120) as c:
        while not stop.is_set():
            try:
                r = c.post("/chat/completions", json=body)
                if r.status_code != 200:
                    errors.append(r.text[:200])
                    time.sleep(0.5)
            except httpx.HTTPError as e:
                errors.append(repr(e))


def _until(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        out = check()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def test_the_page_shows_the_live_numbers(sim: Server, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (Debian: apt-get install chromium; .ci/run does it)")
    from playwright.sync_api import sync_playwright

    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    made = httpx.post(
        f"{sim.base_url}/sparkgate/admin/keys",
        headers=admin,
        json={"user": "dana", "limits": {"daily_tokens": BUDGET}},
        timeout=30,
    )
    assert made.status_code == 201, made.text
    key = made.json()["key"]
    # A rejection for the page's list: a model that does not exist.
    missing = httpx.post(
        f"{sim.api}/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert missing.status_code == 404
    # And a quota refusal: a key allowed one request a minute, used twice.
    made = httpx.post(
        f"{sim.base_url}/sparkgate/admin/keys", headers=admin, json={"user": "erin", "limits": {"rpm": 1}}, timeout=30
    )
    erin = {"Authorization": f"Bearer {made.json()['key']}"}
    tiny = {"model": "fast", "messages": CHAT, "max_tokens": 4}
    statuses = [
        httpx.post(f"{sim.api}/chat/completions", headers=erin, json=tiny, timeout=60).status_code for _ in "ab"
    ]
    assert statuses == [200, 429]

    stop, errors = threading.Event(), []  # type: ignore[var-annotated]
    threads = [
        threading.Thread(target=_load, args=(sim, key, i % 3 == 2, stop, errors), daemon=True)
        for i in range(LOAD_THREADS)
    ]
    for t in threads:
        t.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(f"{sim.base_url}/dashboard")
            # Without the key: the login form, no data.
            assert page.is_visible("#login") and not page.is_visible("#board")
            page.fill("#key", USER_KEY)  # a user's key is refused
            page.click("#login button")
            _until(
                lambda: page.evaluate("document.getElementById('error').textContent.includes('not an admin key')"),
                30,
                "the page to refuse a user's key",
            )
            assert not page.is_visible("#board")

            page.fill("#key", ADMIN_KEY)
            page.click("#login button")
            page.wait_for_selector("#board:not(.hidden)")
            # Live: requests run and hold KV in the ledger; some have finished (latency dots).
            # (Polled from here: the page's CSP forbids eval, which wait_for_function's polling uses.)
            live = """() => {
                    const t = document.getElementById('totals').dataset;
                    const ttft = document.querySelector('#ttft [data-class="interactive"]');
                    const polls = Number(document.getElementById('board').dataset.polls);
                    return polls >= 2 && Number(t.running) > 0 && Number(t.ledgerBlocks) > 0
                        && ttft && Number(ttft.dataset.count) >= 3;
                }"""
            _until(lambda: page.evaluate(live), 90, "the page to show live load")
            shown = page.evaluate(
                """() => ({
                    totals: {...document.getElementById('totals').dataset},
                    models: [...document.querySelectorAll('#models .model')].map(m => ({...m.dataset})),
                    users: Object.fromEntries([...document.querySelectorAll('#users tr[data-user]')]
                        .map(r => [r.dataset.user, {...r.dataset}])),
                    codes: [...document.querySelectorAll('#rejections tr[data-code]')]
                        .map(r => [3, 4].map(i => r.children[i].textContent).join(' ') + ' ' + r.dataset.code),
                    attained: [...document.querySelectorAll('#attainment tr[data-class]')].map(r => ({...r.dataset})),
                    quota: document.getElementById('quota').dataset.status,
                    polls: Number(document.getElementById('board').dataset.polls),
                })"""
            )
            now = data(sim).json()  # the endpoint at the same time
            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
            if os.environ.get("SPARKGATE_DASHBOARD_PNG"):
                page.wait_for_timeout(45_000)  # the charts' history fills in
                page.screenshot(path=os.environ["SPARKGATE_DASHBOARD_PNG"], full_page=True)
            browser.close()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)

    assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    # The page shows what the endpoint reports: every model, its pool, live load.
    by_name = {m["name"]: m for m in now["models"]}
    assert {m["model"] for m in shown["models"]} == set(by_name)
    for m in shown["models"]:
        assert int(m["poolBlocks"]) == by_name[m["model"]]["kv"]["pool_blocks"] > 0
    assert int(shown["totals"]["running"]) > 0 and int(shown["totals"]["ledgerBlocks"]) > 0
    assert sum(m["running"]["ledger"] for m in now["models"]) > 0
    assert sum(m["kv"]["ledger_blocks"] for m in now["models"]) > 0
    assert sum(int(m["running"]) for m in shown["models"]) == int(shown["totals"]["running"])
    assert shown["polls"] >= 2  # it polls
    # Tokens today against the key's budget, as the usage endpoint counts them.
    dana = shown["users"]["dana"]
    assert int(dana["budget"]) == BUDGET and int(dana["tokensToday"]) > 0
    usage = httpx.get(f"{sim.base_url}/sparkgate/admin/usage", params={"user": "dana"}, headers=admin, timeout=30)
    assert usage.json()["day"]["total_tokens"] >= int(dana["tokensToday"])
    # Who was turned away, and why.
    assert " dana model_not_found" in shown["codes"] and "quota_rpm erin rate_limit_exceeded" in shown["codes"]
    interactive = next(a for a in shown["attained"] if a["class"] == "interactive")
    assert int(interactive["total"]) >= 3
    assert shown["quota"] == "memory"
