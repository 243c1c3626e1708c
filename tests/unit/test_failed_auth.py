"""Failed-authentication throttling: the policy (values in, values out), the bounded table
that applies it, and the redaction that keeps keys out of what the gateway says."""

from __future__ import annotations

import asyncio
import logging

import pytest
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from gateway.cli import proxy_options
from gateway.errors import AuthenticationFailed, AuthThrottled
from gateway.failed_auth import FailedAuthTable
from gateway.logs import RedactSecrets
from gateway.redaction import redact, redacted_url
from gateway.settings import FailedAuthSettings, ServerSettings
from policies.failed_auth import ALLOW, Block, ClientRecord, FailureLimits, check, client_key, failed, forgettable

LIMITS = FailureLimits(max_failures=3, window_s=10.0, block_s=30.0)


def fail_times(times: list[float], limits: FailureLimits = LIMITS) -> ClientRecord | None:
    record: ClientRecord | None = None
    for t in times:
        record = failed(record, limits, t)
    return record


def test_max_failures_within_the_window_block_for_block_s() -> None:
    two = fail_times([0.0, 1.0])
    assert two is not None and not two.blocked and check(two, 2.0) is ALLOW
    three = failed(two, LIMITS, 2.0)
    assert three.blocked
    assert check(three, 2.0) == Block(retry_after_s=30.0)
    assert check(three, 31.5) == Block(retry_after_s=0.5)
    assert check(three, 32.0) is ALLOW  # the block has ended


def test_failures_spread_beyond_the_window_never_block() -> None:
    record = fail_times([0.0, 5.0, 10.0, 15.0, 20.0, 25.0])  # a new window at 10 and at 20
    assert record is not None and not record.blocked and record.failures == 2  # 20.0 and 25.0


def test_failures_while_blocked_do_not_extend_the_block() -> None:
    blocked = fail_times([0.0, 1.0, 2.0])
    assert blocked is not None and blocked.blocked_until == 32.0
    assert failed(blocked, LIMITS, 20.0) == blocked
    assert check(failed(blocked, LIMITS, 31.0), 32.0) is ALLOW


def test_after_a_block_a_client_starts_afresh() -> None:
    blocked = fail_times([0.0, 1.0, 2.0])
    assert blocked is not None and forgettable(blocked, LIMITS, 32.0)
    again = failed(blocked, LIMITS, 40.0)
    assert (again.failures, again.window_start, again.blocked) == (1, 40.0, False)


def test_one_failure_blocks_when_max_failures_is_one() -> None:
    assert failed(None, FailureLimits(1, 10.0, 5.0), 0.0).blocked


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # the same /64: the same client
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("fe80::1%eth0", "fe80::/64"),
        ("testclient", "testclient"),
        (None, "unknown"),
    ],
)
def test_client_keys(address: str | None, key: str) -> None:
    assert client_key(address) == key


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def table(clock: Clock, **settings: float) -> FailedAuthTable:
    defaults: dict[str, float] = {"max_failures": 3, "window_s": 10.0, "block_s": 30.0, "max_clients": 100}
    return FailedAuthTable(FailedAuthSettings(**(defaults | settings)), clock=clock)


async def wrong() -> str:
    raise AuthenticationFailed("Incorrect API key provided.")


async def missing() -> str:
    raise AuthenticationFailed("no key", code="missing_api_key")


async def right() -> str:
    return "alice"


async def test_a_blocked_client_gets_429_with_a_correct_key_and_others_do_not() -> None:
    clock = Clock()
    t = table(clock)
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            await t.guarded("attacker", wrong)
        assert await t.guarded("neighbour", right) == "alice"  # a success resets no one
    with pytest.raises(AuthThrottled) as e:
        await t.guarded("attacker", right)  # the key is not even looked at
    assert e.value.status == 429 and e.value.code == "too_many_failed_authentications"
    assert e.value.headers["Retry-After"] == "30" and e.value.headers["retry-after-ms"] == "30000"
    assert await t.guarded("neighbour", right) == "alice"
    clock.now = 29.2
    with pytest.raises(AuthThrottled) as e:
        await t.guarded("attacker", right)
    assert e.value.headers["Retry-After"] == "1"  # rounded up, never 0
    assert t.blocked_clients == 1
    clock.now = 30.0
    assert await t.guarded("attacker", right) == "alice"
    assert t.blocked_clients == 0
    assert dict(t.failures) == {"invalid": 3, "blocked": 2}


async def test_a_success_does_not_reset_the_own_count() -> None:
    """One valid key between guesses must not buy an attacker more guesses."""
    t = table(Clock())
    for _ in range(2):
        with pytest.raises(AuthenticationFailed):
            await t.guarded("x", wrong)
        await t.guarded("x", right)
    with pytest.raises(AuthenticationFailed):
        await t.guarded("x", wrong)
    with pytest.raises(AuthThrottled):
        await t.guarded("x", right)


async def test_a_missing_key_is_counted_but_does_not_block() -> None:
    t = table(Clock())
    for _ in range(10):
        with pytest.raises(AuthenticationFailed):
            await t.guarded("x", missing)
    assert await t.guarded("x", right) == "alice"
    assert t.failures["missing"] == 10 and len(t) == 0


async def test_rotating_addresses_cannot_grow_the_table_or_free_a_block() -> None:
    clock = Clock()
    t = table(clock, max_clients=50)
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            await t.guarded("blocked-one", wrong)
    for i in range(10_000):  # an attacker with many addresses, one failure each
        with pytest.raises(AuthenticationFailed):
            await t.guarded(f"10.{i // 256}.{i % 256}.1", wrong)
        assert len(t) <= 50
    with pytest.raises(AuthThrottled):
        await t.guarded("blocked-one", right)


async def test_expired_records_are_dropped_first() -> None:
    clock = Clock()
    t = table(clock, max_clients=3)
    for name in ("a", "b"):
        with pytest.raises(AuthenticationFailed):
            await t.guarded(name, wrong)
    clock.now = 11.0  # a's and b's windows have passed
    for name in ("c", "d"):
        with pytest.raises(AuthenticationFailed):
            await t.guarded(name, wrong)
    assert len(t) == 2


async def test_attempts_once_blocked_count_as_blocked() -> None:
    t = table(Clock(), max_failures=5)

    async def attempt() -> None:
        with pytest.raises((AuthenticationFailed, AuthThrottled)):
            await t.guarded("x", wrong)

    await asyncio.gather(*(attempt() for _ in range(20)))
    assert t.failures["invalid"] == 5 and t.failures["blocked"] == 15


def test_settings_bound_the_table() -> None:
    assert FailedAuthSettings().max_clients == 10_000
    with pytest.raises(ValueError):
        FailedAuthSettings(max_clients=0)


def test_uvicorn_reads_x_forwarded_for_only_from_trusted_proxies() -> None:
    import uvicorn

    async def app(scope: object, receive: object, send: object) -> None:
        pass

    default = uvicorn.Config(app, **proxy_options(()))
    default.load()
    assert not isinstance(default.loaded_app, ProxyHeadersMiddleware)  # uvicorn's own default: trust 127.0.0.1
    proxied = uvicorn.Config(app, **proxy_options(("10.0.0.5",)))
    proxied.load()
    assert isinstance(proxied.loaded_app, ProxyHeadersMiddleware)
    assert "127.0.0.1" not in proxied.loaded_app.trusted_hosts and "10.0.0.5" in proxied.loaded_app.trusted_hosts


def test_trusted_proxies_are_addresses_or_networks() -> None:
    assert ServerSettings().trusted_proxies == ()  # X-Forwarded-For ignored by default
    assert ServerSettings(trusted_proxies=("10.0.0.5", "10.1.0.0/16", "::1")).trusted_proxies[1] == "10.1.0.0/16"
    for bad in ("*", "proxy.local", "10.0.0.0/33"):
        with pytest.raises(ValueError, match="trusted_proxies"):
            ServerSettings(trusted_proxies=(bad,))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("The model 'sk-proj-abcdefgh123' does not exist", "The model '[redacted]' does not exist"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: [redacted]"),
        ("sk-short and nothing else", "sk-short and nothing else"),
        ("no secrets here", "no secrets here"),
    ],
)
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_redacted_urls() -> None:
    assert redacted_url("redis://:pw@127.0.0.1:6379/0") == "redis://***@127.0.0.1:6379/0"
    assert redacted_url("http://user:pw@spark-2:8001/x") == "http://***@spark-2:8001/x"
    assert redacted_url("http://spark-2:8001") == "http://spark-2:8001"


def test_the_log_filter_keeps_uvicorns_access_arguments_unpackable() -> None:
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/v1/models?key=sk-abcdefgh12345", "1.1", 200), None,
    )  # fmt: skip
    assert RedactSecrets().filter(record)
    assert isinstance(record.args, tuple) and len(record.args) == 5
    assert record.getMessage() == '127.0.0.1:5000 - "GET /v1/models?key=[redacted] HTTP/1.1" 200'


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("203.0.113.7", "203.0.113.7"),  # IPv4: the address
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),  # IPv6: its /64
        ("fe80::1%eth0", "fe80::/64"),  # a zone id is dropped
        ("::ffff:198.51.100.9", "198.51.100.9"),  # IPv4-mapped: as IPv4
        ("testclient", "testclient"),  # not an address: its own key
        ("/run/sparkgate.sock" * 10, ("/run/sparkgate.sock" * 10)[:64]),  # bounded
        (None, "unknown"),
        ("", "unknown"),
    ],
)
def test_whose_failures_a_peer_s_are(address: str | None, key: str) -> None:
    assert client_key(address) == key
