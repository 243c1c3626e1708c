"""Keeping secrets out of what the gateway says: error messages, logs, shown URLs.

API keys are never logged on purpose (only a key's id); these catch what a client or an
operator puts where it does not belong: a key in a model name, a request id or a query
string, a password in a Redis or engine-host URL.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# OpenAI-style keys (sk-..., sk-proj-..., sparkgate's sk-sg-...) and bearer credentials.
_SECRET = re.compile(r"sk-[A-Za-z0-9_\-]{8,}|(?i:bearer)\s+[^\s\"',;]+")
REDACTED = "[redacted]"


def looks_secret(text: str) -> bool:
    return _SECRET.search(text) is not None


def redact(text: str) -> str:
    """`text` with anything shaped like an API key or a bearer credential replaced."""
    if "sk-" not in text and "earer" not in text:  # the common case: no regex run
        return text
    return _SECRET.sub(REDACTED, text)


def redacted_url(url: str) -> str:
    """`url` with its credentials (a password, or a user name that may be a token) shown as
    ***: `redis://:pw@host:6379/0` -> `redis://***@host:6379/0`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return REDACTED
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))
