import pytest

from gateway.auth import KeyRing
from gateway.errors import AuthenticationFailed, PermissionDenied
from gateway.quota import KeyRecord
from gateway.settings import (
    AdminKey,
    ApiKey,
    AuthSettings,
    KeyLimits,
    PooledLimits,
    QuotaSettings,
    TeamSettings,
    hash_key,
)

QUOTAS = QuotaSettings(
    defaults=KeyLimits(rpm=100, max_context=4096),
    teams=(
        TeamSettings(
            name="research", defaults=KeyLimits(rpm=10, tpm=5000, priority="batch"), pooled=PooledLimits(daily_tokens=9)
        ),
    ),
)
STORED = {
    hash_key("sk-stored"): KeyRecord(
        id="key_s", sha256=hash_key("sk-stored"), user="carol", team="research", limits=KeyLimits(tpm=7)
    ),
    hash_key("sk-revoked"): KeyRecord(id="key_r", sha256=hash_key("sk-revoked"), user="dave", revoked_at=1.0),
}


async def lookup(sha: str) -> KeyRecord | None:
    return STORED.get(sha)


RING = KeyRing(
    AuthSettings(
        keys=(
            ApiKey(name="alice", sha256=hash_key("sk-a")),
            ApiKey(name="bob", sha256=hash_key("sk-b"), team="research", rpm=50),
        ),
        admin_keys=(AdminKey(name="root", sha256=hash_key("sk-admin")),),
    ),
    QUOTAS,
    lookup,
)


async def test_valid_keys_resolve_to_their_users() -> None:
    assert (await RING.authenticate("Bearer sk-a")).name == "alice"
    assert (await RING.authenticate("bearer sk-b")).name == "bob"
    assert (await RING.authenticate("Bearer sk-stored")).key_id == "key_s"


async def test_limits_inherit_key_then_team_then_defaults() -> None:
    alice = await RING.authenticate("Bearer sk-a")
    assert (alice.limits.rpm, alice.limits.tpm, alice.max_context, alice.priority) == (100, None, 4096, "interactive")
    bob = await RING.authenticate("Bearer sk-b")
    assert (bob.limits.rpm, bob.limits.tpm, bob.max_context, bob.priority) == (50, 5000, 4096, "batch")
    assert bob.pooled.daily_tokens == 9 and bob.team_scope == "team:research" and alice.team_scope is None
    carol = await RING.authenticate("Bearer sk-stored")
    assert (carol.limits.rpm, carol.limits.tpm, carol.name, carol.key_scope) == (10, 7, "carol", "key:key_s")


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Bearer ", "missing_api_key"),
        ("Bearer sk-c", "invalid_api_key"),
        ("Bearer sk-revoked", "invalid_api_key"),
        ("Bearer sk-admin", "invalid_api_key"),  # admin keys open the admin API only
        ("Basic sk-a", "invalid_api_key"),
        ("sk-a", "invalid_api_key"),
    ],
)
async def test_rejections(header: str | None, code: str) -> None:
    with pytest.raises(AuthenticationFailed) as e:
        await RING.authenticate(header)
    assert e.value.code == code and e.value.status == 401


async def test_admin_key_opens_admin_only() -> None:
    assert await RING.authenticate_admin("Bearer sk-admin") == "root"
    with pytest.raises(PermissionDenied):
        await RING.authenticate_admin("Bearer sk-a")  # a user's key: 403
    with pytest.raises(AuthenticationFailed):
        await RING.authenticate_admin("Bearer sk-nobody")  # unknown: 401


async def test_allowed_models_match_any_name() -> None:
    ring = KeyRing(
        AuthSettings(keys=(ApiKey(name="x", sha256=hash_key("sk-x"), allowed_models=("fast",)),)), QuotaSettings()
    )
    p = await ring.authenticate("Bearer sk-x")
    assert p.may_use(("big", "fast")) and not p.may_use(("big",))


async def test_auth_off_is_anonymous() -> None:
    ring = KeyRing(AuthSettings(required=False), QuotaSettings())
    assert (await ring.authenticate(None)).name == "anonymous"
