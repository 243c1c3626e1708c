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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.text.formats import (
    ReasoningFormat,
    ReasoningStart,
    ToolFormat,
    detect_reasoning_format,
    detect_tool_format,
    reasoning_format,
    tool_format,
)
from policies.tokens import ChatTokenizer

_MARK = "\u2063sparkgate-probe\u2063"
_F = TypeVar("_F", ToolFormat, ReasoningFormat)


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

    tool_format: str | None = None  # the family of its tool calls (gateway/text/formats); None: not parsed
    reasoning_format: str | None = None  # the family of its think block; None: it does not think
    think_end_id: int | None = None

    @property
    def reasoning(self) -> bool:
        """The model thinks (in its family's think block)."""
        return self.reasoning_format is not None

    def reasoning_start(self, prompt_text: str) -> ReasoningStart:
        """Where the output starts, read off the rendered prompt: inside a think block the
        prompt opened ("open"), after one it closed (thinking off: "none"), or undecided,
        the model choosing whether to think ("maybe"); "none" for a model that does not think."""
        if self.reasoning_format is None:
            return "none"
        return reasoning_format(self.reasoning_format).reasoning_start(prompt_text)


def output_formats(tokenizer: Any, tool_parser: str, reasoning_parser: str) -> OutputFormats:
    """The configured formats, or ("auto") those the chat template shows: the first family,
    in the registry's order, that recognizes it ("none", or no family's: not parsed)."""
    template = getattr(tokenizer, "chat_template", None)
    text = template if isinstance(template, str) else json.dumps(template or "")
    tool = _pick(tool_parser, text, tool_format, detect_tool_format)
    thinks = _pick(reasoning_parser, text, reasoning_format, detect_reasoning_format)
    return OutputFormats(
        tool_format=None if tool is None else tool.name,
        reasoning_format=None if thinks is None else thinks.name,
        think_end_id=None if thinks is None else thinks.think_end_id(tokenizer),
    )


def _pick(name: str, template: str, named: Callable[[str], _F], detect: Callable[[str], _F | None]) -> _F | None:
    if name == "auto":
        return detect(template)
    return None if name == "none" else named(name)
