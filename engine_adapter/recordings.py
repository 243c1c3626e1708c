"""Recorded Qwen3 assistant turns that the replay engine (engine_adapter/replay.py) streams.

A random-weight tiny model never decides to think or to call a tool, so tests and demos
that need those turns replay these texts instead. Each is written exactly as a Qwen3 model
emits it after the chat template's `<|im_start|>assistant\\n` (the EOS `<|im_end|>` is not
part of the text: the engine appends its token). A prompt picks one with the tag
`[[replay:NAME]]` (the last tag in the prompt wins); without a tag it gets `answer`.

Tests assert on these exact texts: `RECORDINGS[name]` is the whole visible output.
"""

from __future__ import annotations

import re

DEFAULT_RECORDING = "answer"
# `[[replay:NAME]]` anywhere in the prompt text; the last occurrence picks the recording.
TAG = re.compile(r"\[\[replay:([^\]\s]*)\]\]")


def tag(name: str) -> str:
    """The tag that selects recording `name`, to put in a user message."""
    return f"[[replay:{name}]]"


_WEATHER_PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
_WEATHER_ROME = '{"name": "get_weather", "arguments": {"city": "Rome"}}'

ANSWER = "The capital of France is Paris."

THINK = (
    "<think>\n"
    "The user asks for the capital of France. France's capital and largest city is Paris.\n"
    "</think>\n\n"
    "The capital of France is Paris."
)

CALL = f"<tool_call>\n{_WEATHER_PARIS}\n</tool_call>"

PARALLEL = f"<tool_call>\n{_WEATHER_PARIS}\n</tool_call>\n<tool_call>\n{_WEATHER_ROME}\n</tool_call>"

THINK_CALL = (
    "<think>\n"
    "The user wants the weather in Paris. I should call get_weather with the city Paris.\n"
    "</think>\n\n"
    f"<tool_call>\n{_WEATHER_PARIS}\n</tool_call>"
)

# Broken JSON inside the call: a parser must not invent a call from it.
MALFORMED = 'Let me check the weather.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>'

XML_CALL = (
    "<tool_call>\n"
    "<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n"
    "</function>\n"
    "</tool_call>"
)

# Qwen3.5+ when the prompt already opened the think block: no leading `<think>`.
THINK_OPEN = (
    "The user asks for the capital of France. France's capital and largest city is Paris.\n"
    "</think>\n\n"
    "The capital of France is Paris."
)

# About 300 tokens of plain text: room to disconnect mid-stream or to hit max_tokens.
LONG = "\n".join(f"{i}. Sentence number {i} of a long answer keeps the stream going." for i in range(1, 20))

# Multi-byte characters split across tokens (a flag, CJK): the incremental decode must hold
# back a partial character until the token that completes it.
UNICODE = "Paris 🇫🇷 is the capital of France; Tokyo 東京 is the capital of Japan. Café au lait, naïve."

# Coding agents' sessions, one text per turn: turn k answers a prompt with k tool results
# after its tag (an agent runs the call, then asks again with its result).
# Claude Code runs its Bash tool, then the model answers from its output.
CLAUDE_BASH = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo sparkgate-$((6*7))", '
    '"description": "Print a marker"}}\n</tool_call>',
    "The command printed sparkgate-42.",
)
# Codex CLI applies a patch with its freeform `apply_patch` tool (offered to the model as a
# function of one string, `input`), then the model says what it did.
CODEX_PATCH = (
    '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n*** Add File: '
    'hello.txt\\n+hello from sparkgate\\n*** End Patch\\n"}}\n</tool_call>',
    "I created hello.txt.",
)
# Codex CLI's namespaced tools (multi_agent_v1's wait_agent) are offered as functions named
# `{namespace}__{name}`: the model waits for a sub-agent, then reports.
CODEX_WAIT = (
    '<tool_call>\n{"name": "multi_agent_v1__wait_agent", "arguments": {"targets": ["agent-1"], '
    '"timeout_ms": 30000}}\n</tool_call>',
    "The agent finished.",
)
SCRIPTS: dict[str, tuple[str, ...]] = {"claude_bash": CLAUDE_BASH, "codex_patch": CODEX_PATCH, "codex_wait": CODEX_WAIT}
TOOL_RESPONSE = "<tool_response>"  # how the Qwen templates open a tool's result

RECORDINGS: dict[str, str] = {
    "answer": ANSWER,
    "think": THINK,
    "call": CALL,
    "parallel": PARALLEL,
    "think_call": THINK_CALL,
    "malformed": MALFORMED,
    "xml_call": XML_CALL,
    "think_open": THINK_OPEN,
    "long": LONG,
    "unicode": UNICODE,
    **{f"{name}#{k}": text for name, turns in SCRIPTS.items() for k, text in enumerate(turns)},
}


def select(prompt_text: str) -> str:
    """The recording a prompt asks for: its last `[[replay:NAME]]` tag, else `answer`; for a
    script, its turn `NAME#k`, k the tool results after the tag (its last turn at most).
    A name that is not a recording is returned as is (the engine rejects it)."""
    tags = list(TAG.finditer(prompt_text))
    if not tags:
        return DEFAULT_RECORDING
    name = tags[-1].group(1)
    turns = SCRIPTS.get(name)
    if turns is None:
        return name
    k = prompt_text[tags[-1].end() :].count(TOOL_RESPONSE)
    return f"{name}#{min(k, len(turns) - 1)}"
