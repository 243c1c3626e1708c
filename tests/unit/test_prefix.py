"""policies/prefix.py: stable parts first and identical across requests; the conversation untouched."""

import itertools
import json
import random
from collections import Counter

import pytest

from policies import prefix
from policies.prefix import NOTE_HEADER, PrefixPolicy, normalize

ON = PrefixPolicy()
THINK = "<think>\n\n</think>\n\n"
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {}}}}},
    {"type": "function", "function": {"name": "calc", "parameters": {"properties": {"x": {}}, "type": "object"}}},
]


def system(stamp: str) -> str:
    return f"You are the team's assistant.\nCurrent time: {stamp}\nAnswer briefly."


def check_invariants(before: list[dict], after: list[dict], history_prefix: str = "") -> None:  # type: ignore[type-arg]
    """Same turns in the same order, nothing dropped from the instructions."""
    assert prefix.conversation(after, history_prefix) == prefix.conversation(before)
    moved = Counter(line for line in prefix.instructions(after) if line != NOTE_HEADER)
    assert moved == Counter(prefix.instructions(before))


def test_volatile_lines_move_to_a_note_at_the_end() -> None:
    msgs = [
        {"role": "system", "content": system("2026-11-29T17:33:05Z")},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "what time is it?"},
    ]
    out = normalize(msgs, None, ON)
    assert out.messages[0]["content"] == "You are the team's assistant.\nAnswer briefly."
    assert out.messages[4] == {"role": "system", "content": f"{NOTE_HEADER}\nCurrent time: 2026-11-29T17:33:05Z"}
    assert out.messages[3]["content"] == "what time is it?" and out.moved == ("Current time: 2026-11-29T17:33:05Z",)
    assert "volatile" in out.changes
    check_invariants(msgs, out.messages)
    # Another user, another second: the shared prefix is now identical.
    other = normalize([{"role": "system", "content": system("2026-11-29T18:01:59Z")}, msgs[1]], None, ON)
    assert other.messages[0] == out.messages[0]


@pytest.mark.parametrize(
    "line",
    [
        "Today is 2026-11-29.",
        "Now: 17:33 UTC",
        "request_id: 7f9c2b1e",
        "Trace-ID=abc",
        "session 3f2b8c1e-9a4d-4e5f-8a7b-1c2d3e4f5a6b",
        "Date: November 29, 2026",
        "It is 29 Nov 2026 here.",
        "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=sdk-cli; cch=4f1e2;",  # Claude Code
    ],
)
def test_default_patterns(line: str) -> None:
    out = normalize([{"role": "system", "content": f"Be kind.\n{line}"}, {"role": "user", "content": "x"}], None, ON)
    assert out.moved == (line,) and out.messages[0]["content"] == "Be kind."


def test_user_turns_are_never_rewritten() -> None:
    msgs = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "My id is req-id: 42 at 10:30"}]
    out = normalize(msgs, None, ON)
    assert out.messages == msgs and out.changes == ()


def test_leading_instructions_merge_but_mid_conversation_system_stays() -> None:
    msgs = [
        {"role": "system", "content": "Be kind."},
        {"role": "system", "content": "Use metric units."},  # a "developer" message
        {"role": "user", "content": "a"},
        {"role": "system", "content": "From now on, answer in French."},
        {"role": "user", "content": "b"},
    ]
    out = normalize(msgs, None, ON)
    assert out.messages[0] == {"role": "system", "content": "Be kind.\n\nUse metric units."}
    assert out.messages[2] == msgs[3] and len(out.messages) == 4
    check_invariants(msgs, out.messages)


def test_tools_get_one_canonical_form() -> None:
    shuffled = [json.loads(json.dumps(t)) for t in reversed(TOOLS)]
    shuffled[0]["function"] = {"parameters": shuffled[0]["function"]["parameters"], "name": "calc"}
    a = normalize([{"role": "user", "content": "x"}], TOOLS, ON)
    b = normalize([{"role": "user", "content": "x"}], shuffled, ON)
    assert json.dumps(a.tools) == json.dumps(b.tools) and "tools" in a.changes
    assert [t["function"]["name"] for t in a.tools or []] == ["calc", "weather"]
    canon = normalize([{"role": "user", "content": "x"}], a.tools, ON)
    assert "tools" not in canon.changes  # already canonical
    off = normalize([{"role": "user", "content": "x"}], shuffled, PrefixPolicy(canonical_tools=False))
    assert off.tools == shuffled


def test_past_assistant_turns_render_as_generated() -> None:
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "A"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nB"},  # already has its block
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "partial"},  # a prefill to continue: as given
    ]
    out = normalize(msgs, None, ON, history_prefix=THINK)
    assert [m["content"] for m in out.messages] == ["a", THINK + "A", msgs[2]["content"], "b", "partial"]
    assert out.changes == ("history",)
    check_invariants(msgs, out.messages, THINK)
    assert normalize(msgs, None, PrefixPolicy(stable_history=False), history_prefix=THINK).messages == msgs


def test_an_agent_s_next_request_shares_all_but_the_note() -> None:
    """Tool calls, their results and system turns after the latest user message stay before
    the note, so the next request (one more call, or the next user turn) extends this one up
    to its note; an assistant message the client wants continued stays last."""
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "ls"}}]}
    first = [
        {"role": "system", "content": system("2026-11-29T17:33:05Z")},
        {"role": "user", "content": "list the files"},
        {"role": "system", "content": "# Environment\ncwd: /work"},  # Claude Code's system turn
    ]
    then = [*first, call, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    later = [*then, {"role": "assistant", "content": "One file."}, {"role": "user", "content": "thanks"}]
    sources = (first, then, later)
    runs = [normalize(m, None, ON).messages for m in sources]
    for source, run in zip(sources, runs, strict=True):
        assert run[-1]["content"].startswith(NOTE_HEADER)
        check_invariants(source, run)
    for before, after in itertools.pairwise(runs):
        assert after[: len(before) - 1] == before[:-1]
    prefill = [*first, {"role": "assistant", "content": "Sure:"}]
    out = normalize(prefill, None, ON).messages
    assert out[-1] == prefill[-1] and out[-2]["content"].startswith(NOTE_HEADER)


def test_an_assistant_turn_followed_by_its_tool_results_is_past() -> None:
    call = {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "c1", "function": {"name": "ls"}}]}
    msgs = [{"role": "user", "content": "a"}, call, {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}]
    out = normalize(msgs, None, ON, history_prefix=THINK)
    assert out.messages[1]["content"] == THINK + "Let me look." and out.changes == ("history",)


def test_off_changes_nothing() -> None:
    msgs = [{"role": "system", "content": system("2026-11-29T17:33:05Z")}, {"role": "user", "content": "x"}]
    off = PrefixPolicy(merge_system=False, canonical_tools=False, move_volatile=False, stable_history=False)
    out = normalize(msgs, TOOLS, off, history_prefix=THINK)
    assert out.messages == msgs and out.tools == TOOLS and out.changes == ()


def test_random_conversations_keep_their_turns_and_instructions() -> None:
    rng = random.Random(5)
    lines = ["Be kind.", "Now: 2026-01-02 03:04", "uuid 3f2b8c1e-9a4d-4e5f-8a7b-1c2d3e4f5a6b", "Rules: none."]
    for _ in range(300):
        msgs: list[dict] = []  # type: ignore[type-arg]
        for _ in range(rng.randint(0, 3)):
            msgs.append({"role": "system", "content": "\n".join(rng.sample(lines, rng.randint(1, 3)))})
        for i in range(rng.randint(0, 6)):
            role = rng.choice(["user", "assistant", "user", "tool", "system"])
            msgs.append({"role": role, "content": f"{role} {i} at 10:30"})
        out = normalize(msgs, None, ON, history_prefix=rng.choice(["", THINK]))
        check_invariants(msgs, out.messages, THINK if "history" in out.changes else "")
        assert sum(m["role"] == "system" and m["content"].startswith(NOTE_HEADER) for m in out.messages) <= 1


@pytest.mark.parametrize(
    ("p", "bs", "want"), [(0, 16, 0), (1, 16, 0), (16, 16, 0), (17, 16, 16), (33, 16, 32), (1300, 640, 1280)]
)
def test_cacheable_tokens_are_whole_blocks_before_the_last_token(p: int, bs: int, want: int) -> None:
    assert prefix.cacheable_tokens(p, bs) == want


def test_odd_tools_keep_working() -> None:
    odd = [{"type": "retrieval"}, {"type": "function", "function": {"name": "a", "enum": ["z", "y"]}}]
    out = normalize([{"role": "user", "content": "x"}], odd, ON)
    # Lists keep their order: an enum's order may mean something.
    assert out.tools == [{"type": "retrieval"}, {"function": {"enum": ["z", "y"], "name": "a"}, "type": "function"}]
