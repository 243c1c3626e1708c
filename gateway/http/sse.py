"""Server-sent events and object ids, written one way for every API surface."""

from __future__ import annotations

import json
import uuid
from typing import Any


def sse(data: dict[str, Any] | str, *, named: bool = False) -> str:
    """One event: `data: <json>` (OpenAI's chat and completions streams; a str is sent as it
    is, e.g. `[DONE]`), or with `named` an `event: <its type>` line first (the Responses and
    Messages streams, whose clients dispatch on it)."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {data['type']}\n" if named and isinstance(data, dict) else ""
    return f"{head}data: {payload}\n\n"


def new_id(prefix: str) -> str:
    """`<prefix>_<32 random hex digits>`: a Responses object's id (`resp_`, `msg_`, `fc_`...)."""
    return f"{prefix}_{uuid.uuid4().hex}"
