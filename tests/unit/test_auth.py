import pytest

from gateway.auth import ANONYMOUS, KeyRing
from gateway.errors import AuthenticationFailed
from gateway.settings import ApiKey, AuthSettings, hash_key

RING = KeyRing(
    AuthSettings(keys=(ApiKey(name="alice", sha256=hash_key("sk-a")), ApiKey(name="bob", sha256=hash_key("sk-b"))))
)


def test_valid_keys_resolve_to_their_names() -> None:
    assert RING.authenticate("Bearer sk-a").name == "alice"
    assert RING.authenticate("bearer sk-b").name == "bob"


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Bearer ", "missing_api_key"),
        ("Bearer sk-c", "invalid_api_key"),
        ("Basic sk-a", "invalid_api_key"),
        ("sk-a", "invalid_api_key"),
    ],
)
def test_rejections(header: str | None, code: str) -> None:
    with pytest.raises(AuthenticationFailed) as e:
        RING.authenticate(header)
    assert e.value.code == code and e.value.status == 401


def test_auth_off_is_anonymous() -> None:
    assert KeyRing(AuthSettings(required=False)).authenticate(None) is ANONYMOUS
