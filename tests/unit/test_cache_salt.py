"""Tenant isolation of the prefix cache: which salt a request gets."""

from types import SimpleNamespace

import pytest

from gateway.auth import Principal
from gateway.lifecycle.prepare import _cache_salt
from gateway.settings import PrefixSettings


@pytest.mark.parametrize(
    ("isolation", "team", "want"),
    [("none", "lab", None), ("team", "lab", "team:lab"), ("team", None, "user:ann"), ("user", "lab", "user:ann")],
)
def test_salt(isolation: str, team: str | None, want: str | None) -> None:
    served = SimpleNamespace(settings=SimpleNamespace(prefix=PrefixSettings(cache_isolation=isolation)))  # type: ignore[arg-type]
    assert _cache_salt(served, Principal("ann", "k1", team)) == want  # type: ignore[arg-type]


def test_bad_volatile_pattern_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        PrefixSettings(volatile_patterns=("(unclosed",))
