"""gateway/http/sse.py: the one way every API surface writes an event and an id."""

from __future__ import annotations

import re

from gateway.http.sse import new_id, sse


def test_an_event_is_data_or_named_by_its_type() -> None:
    assert sse({"a": "é", "b": [1, 2]}) == 'data: {"a":"é","b":[1,2]}\n\n'  # compact, not ASCII-escaped
    assert sse("[DONE]") == "data: [DONE]\n\n"
    assert sse({"type": "ping"}, named=True) == 'event: ping\ndata: {"type":"ping"}\n\n'


def test_an_id_is_its_prefix_and_32_random_hex_digits() -> None:
    a, b = new_id("resp"), new_id("resp")
    assert re.fullmatch(r"resp_[0-9a-f]{32}", a) and a != b
