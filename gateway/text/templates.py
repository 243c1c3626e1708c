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
from dataclasses import dataclass
from typing import Any

from gateway.text.assistant import THINK_END, ToolFormat
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


@dataclass(frozen=True)
class OutputFormats:
    """How a model writes tool calls and reasoning: what its output parser needs."""

    tool_format: ToolFormat | None = None
    reasoning: bool = False  # the model thinks in <think>...</think>
    think_end_id: int | None = None


def output_formats(tokenizer: Any, tool_parser: str, reasoning_parser: str) -> OutputFormats:
    """The configured formats, or ("auto") those the chat template shows."""
    template = getattr(tokenizer, "chat_template", None)
    text = template if isinstance(template, str) else json.dumps(template or "")
    tool: ToolFormat | None
    if tool_parser == "auto":
        tool = "qwen3_xml" if "<function=" in text else "hermes" if "<tool_call>" in text else None
    else:
        tool = None if tool_parser == "none" else tool_parser  # type: ignore[assignment]
    thinks = "<think>" in text if reasoning_parser == "auto" else reasoning_parser == "qwen3"
    end_id = None
    if thinks:
        ids = tokenizer.encode(THINK_END, add_special_tokens=False)
        end_id = ids[0] if len(ids) == 1 else None
    return OutputFormats(tool_format=tool, reasoning=thinks, think_end_id=end_id)


def reasoning_start(prompt_text: str) -> str:
    """Where the output starts, from the prompt's last assistant header on: inside a think
    block the prompt opened ("open"), after one it closed (thinking off: "none"), or
    undecided, the model choosing whether to think ("maybe")."""
    tail = prompt_text[prompt_text.rfind("<|im_start|>assistant") :] if "<|im_start|>" in prompt_text else prompt_text
    opened, closed = tail.rfind("<think>"), tail.rfind(THINK_END)
    if closed != -1 and closed > opened:
        return "none"
    if opened != -1:
        return "open"
    return "maybe"
