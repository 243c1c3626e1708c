"""Prompts that hit the prefix cache: a semantics-preserving normalization of chat requests.

vLLM reuses a prompt's KV only for whole blocks whose token chain from the very
start is identical to one it has seen. Chat traffic breaks that chain early and
often. This module rewrites a chat request (pure: messages in, messages out) so
that what is shared comes first and stays byte-identical across requests and turns:

1. Leading system / developer instructions are merged into one system message at
   the very start. A system message in the middle of the conversation stays where
   it is, because it applies from there on.
2. Tool definitions get a canonical form: keys sorted at every depth, tools
   ordered by name. Lists keep their order (an enum's order may matter).
3. Volatile lines in those leading instructions (a timestamp, a date, a UUID, a
   request id; the patterns are configurable) move out of the shared prefix into
   a short system note at the end of the conversation (before an assistant
   message the client wants continued), so the model still sees them. At the end:
   the next request then shares everything this one had but the note, the latest
   user message (a pasted document, say) and whatever followed it (an agent's
   tool calls and results, a system turn) included; a note anywhere earlier would
   end the shared chain there, at every turn.
4. Past assistant turns are rendered as the model produced them. When the
   template's generation prompt carries a prefix that its history rendering drops
   (Qwen3's empty `<think>` block when thinking is off), that prefix is put back
   on past turns, so the next turn's prompt extends the previous one token for
   token. Which prefix, if any, is probed from the template once (gateway side).

Never: reorder user, assistant and tool turns relative to each other, or drop or
change their content. `tests/unit/test_prefix.py` checks both on every rewrite.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

# Each matches a whole volatile fragment; a line containing one is moved.
DEFAULT_VOLATILE_PATTERNS: tuple[str, ...] = (
    r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?\b",  # ISO date/time
    r"\b\d{1,2}:\d{2}(?::\d{2})?\s*(?:[AaPp][Mm]|UTC|GMT)?\b",  # clock times
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",  # UUIDs
    r"\b(?:request|req|trace|session|correlation)[ _-]?id\b\s*[:=#]?\s*\S+",  # request ids
    r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* +\d{1,2},? +\d{4}\b",  # "November 29, 2026"
    r"\b\d{1,2} +(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* +\d{4}\b",  # "29 Nov 2026"
    r"^x-anthropic-billing-header:",  # Claude Code's first system line: a hash per request (cch=...)
)
NOTE_HEADER = "Context for this turn (moved from the instructions):"


@dataclass(frozen=True, slots=True)
class PrefixPolicy:
    """What to normalize (per model, overridable per key)."""

    merge_system: bool = True
    canonical_tools: bool = True
    move_volatile: bool = True
    volatile_patterns: tuple[str, ...] = DEFAULT_VOLATILE_PATTERNS
    stable_history: bool = True


@dataclass(frozen=True, slots=True)
class Normalized:
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    moved: tuple[str, ...] = ()  # volatile lines moved to the note
    changes: tuple[str, ...] = field(default=())  # what was done: merge_system, tools, volatile, history


def normalize(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    policy: PrefixPolicy,
    *,
    history_prefix: str = "",
) -> Normalized:
    """The request, rewritten so its stable parts come first and render identically.

    `history_prefix`: what the template's generation prompt puts before the model's
    output but its rendering of a past assistant turn leaves out (probed per template
    and request settings; "" when the two agree).
    """
    out: list[Message] = [dict(m) for m in messages]
    changes: list[str] = []
    moved: tuple[str, ...] = ()

    lead = 0
    while lead < len(out) and out[lead].get("role") == "system":
        lead += 1
    if policy.merge_system and lead > 1:
        texts = [_text(m) for m in out[:lead]]
        out[:lead] = [{"role": "system", "content": "\n\n".join(t for t in texts if t)}]
        lead = 1
        changes.append("merge_system")

    if policy.move_volatile and lead:
        patterns = [re.compile(p, re.IGNORECASE) for p in policy.volatile_patterns]
        kept_lines: list[str] = []
        moved_lines: list[str] = []
        for m in out[:lead]:
            text = _text(m)
            keep: list[str] = []
            for line in text.split("\n"):
                (moved_lines if any(p.search(line) for p in patterns) else keep).append(line)
            kept_lines.append("\n".join(keep).strip("\n"))
        if moved_lines:
            for m, text in zip(out[:lead], kept_lines, strict=True):
                m["content"] = text
            moved = tuple(moved_lines)
            note = {"role": "system", "content": NOTE_HEADER + "\n" + "\n".join(moved_lines)}
            out.insert(len(out) - 1 if _prefill(out) else len(out), note)
            changes.append("volatile")

    if policy.stable_history and history_prefix:
        marker = history_prefix.split("\n", 1)[0]  # e.g. "<think>": the turn already has its block
        # Past turns only: an assistant message that ends the conversation is a prefill the
        # client wants continued, rendered as given; one followed by its tool results is past.
        last = len(out) - 1 if _prefill(out) else len(out)
        for i, m in enumerate(out):
            content = m.get("content")
            past = i < last and m.get("role") == "assistant"
            if past and isinstance(content, str) and content and not content.startswith(marker):
                m["content"] = history_prefix + content
                if "history" not in changes:
                    changes.append("history")

    canon = None
    if tools:
        given = [dict(t) for t in tools]
        canon = given
        if policy.canonical_tools:
            canon = sorted((_canonical(t) for t in given), key=_tool_name)
            if [json.dumps(t) for t in canon] != [json.dumps(t) for t in given]:
                changes.append("tools")
    return Normalized(out, canon, moved, tuple(changes))


def _prefill(messages: Sequence[Mapping[str, Any]]) -> bool:
    """The conversation ends with an assistant message: the client wants it continued."""
    return bool(messages) and messages[-1].get("role") == "assistant"


def _text(m: Mapping[str, Any]) -> str:
    content = m.get("content")
    return content if isinstance(content, str) else ""


def _canonical(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _tool_name(tool: Mapping[str, Any]) -> str:
    fn = tool.get("function")
    return str(fn.get("name", "")) if isinstance(fn, Mapping) else ""


def conversation(messages: Sequence[Mapping[str, Any]], history_prefix: str = "") -> list[tuple[str, str]]:
    """The turns that must survive any rewrite, in order: (role, content) of every
    non-system message, without a history prefix a rewrite may have put back."""
    return [
        (str(m.get("role")), _text(m).removeprefix(history_prefix) if m.get("role") == "assistant" else _text(m))
        for m in messages
        if m.get("role") != "system"
    ]


def instructions(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every non-empty line of every system message, for "nothing dropped" checks."""
    return [line for m in messages if m.get("role") == "system" for line in _text(m).split("\n") if line.strip()]


def cacheable_tokens(prompt_tokens: int, block_size: int) -> int:
    """The prompt tokens a later request can reuse from this one's KV: whole blocks
    only, and never the last prompt token (vLLM always recomputes it)."""
    if prompt_tokens <= 1:
        return 0
    return (prompt_tokens - 1) // block_size * block_size
