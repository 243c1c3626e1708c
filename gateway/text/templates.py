"""What a chat template does to past assistant turns, probed by rendering (not assumed).

Qwen3-style templates end the generation prompt with text the model's answer
follows (`<think>\\n\\n</think>\\n\\n` when thinking is off) but render the same
answer in the history without it. The next turn's prompt then stops matching the
tokens the engine cached for the previous turn right where that answer starts.
`history_prefix` finds that text, and checks that putting it back in front of a
past answer makes the history render exactly like generation did.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from policies.tokens import ChatTokenizer

_MARK = "\u2063sparkgate-probe\u2063"


def history_prefix(tokenizer: ChatTokenizer, template_kwargs: Mapping[str, Any] | None) -> str:
    """The text to put back before past answers ("" when generation and history agree,
    or when the template would not keep it)."""
    try:
        key = json.dumps(dict(template_kwargs or {}), sort_keys=True, default=str)
    except (TypeError, ValueError):
        return ""
    cached = _PROBED.get((id(tokenizer), key))
    if cached is None:
        cached = _PROBED[(id(tokenizer), key)] = _probe(tokenizer, key)
    return cached


# (tokenizer, template kwargs) -> prefix. Tokenizers live as long as the process.
_PROBED: dict[tuple[int, str], str] = {}


def _probe(tokenizer: ChatTokenizer, kwargs_json: str) -> str:
    kwargs = json.loads(kwargs_json)
    user = {"role": "user", "content": "hi"}

    def render(messages: list[dict[str, str]], generation: bool) -> str:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False, **kwargs)
        return text if isinstance(text, str) else "".join(text)

    try:
        generation = render([user], True)
        history = render([user, {"role": "assistant", "content": _MARK}, user], False)
        before_answer = history[: history.index(_MARK)]
        if not generation.startswith(before_answer):
            return ""
        extra = generation[len(before_answer) :]
        if not extra:
            return ""
        fixed = render([user, {"role": "assistant", "content": extra + _MARK}, user], False)
        return extra if fixed[: fixed.index(_MARK)] == generation else ""
    except Exception:  # a template that cannot render the probe: leave history alone
        return ""
