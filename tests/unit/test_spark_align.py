"""engine_adapter/spark/scheduler.py: vLLM's Mamba "align" mode (hybrid models with prefix caching),
where every prefill chunk but a prompt's last ends on a block boundary."""

from __future__ import annotations

import dataclasses

import pytest

from engine_adapter.spark import MODELS, BoxSim, ModelSpec, Serving, SimConfig, StepResult

HYBRID = MODELS["Qwen3.6-35B-A3B"]  # 30 of its 40 layers are linear attention
# The same shape with full attention only: no linear state, no align mode.
FULL = dataclasses.replace(HYBRID, full_attention_layers=HYBRID.layers, linear_state_bytes=0)
BLOCK = 2096  # the 35B-A3B's block with FP8 KV on the H200
STEP = 4096

Chunks = dict[str, tuple[int, int]]  # request -> (start, tokens) prefilled in one step


def prompt(n: int, tag: int) -> list[int]:
    """A prompt distinct from every other tag's from its first token on."""
    return [100_000 + tag] + [(tag * 7919 + i) % 50_000 + 10 for i in range(1, n)]


def h200_like(model: ModelSpec = HYBRID, *, caching: bool = True, block: int = BLOCK, **kw: int) -> BoxSim:
    """The H200 deployment's scheduler: 4,096-token steps, a one-block long-prefill cap."""
    config = SimConfig(
        max_num_seqs=kw.pop("max_num_seqs", 4),
        max_num_batched_tokens=kw.pop("max_num_batched_tokens", STEP),
        long_prefill_token_threshold=kw.pop("long_prefill_token_threshold", block),
        enable_prefix_caching=caching,
        serving=Serving(block_size=block),
    )
    assert not kw
    return BoxSim(model, config=config)


def trace(sim: BoxSim, results: list[StepResult] | None = None, max_steps: int = 10_000) -> list[Chunks]:
    """Step to idle: each step's prefill chunks (start, tokens) by request (and its result)."""
    steps: list[Chunks] = []
    while sim.has_work and len(steps) < max_steps:
        before = {r.request_id: r.computed for r in sim._running}
        result = sim.step()
        if results is not None:
            results.append(result)
        steps.append(
            {
                r.request_id: (start, r.computed - start)
                for r in sim._running
                if r.computed != (start := before.get(r.request_id, r.cached_tokens))
            }
        )
    assert not sim.has_work
    return steps


def first(steps: list[Chunks], rid: str) -> int:
    return next(i for i, s in enumerate(steps) if rid in s)


def last(steps: list[Chunks], rid: str) -> int:
    return max(i for i, s in enumerate(steps) if rid in s)


def test_a_prompt_longer_than_the_room_waits_for_the_whole_document() -> None:
    """The measured H200 case: the document takes a 2,096-token chunk a step; the 2,000 tokens
    left cannot reach the chat's first block boundary (2,096), so the chat gets nothing until
    the step of the document's last chunk (1,792 tokens) leaves room for a whole block."""
    sim = h200_like()
    sim.submit("doc", prompt(50_000, 1), 4)
    sim.submit("chat", prompt(2400, 2), 4)
    steps = trace(sim)
    doc = [s["doc"][1] for s in steps if "doc" in s]
    assert doc == [BLOCK] * 23 + [50_000 - 23 * BLOCK]
    assert first(steps, "chat") == last(steps, "doc") == 23
    assert steps[23]["chat"] == (0, BLOCK) and steps[24]["chat"] == (BLOCK, 2400 - BLOCK)


@pytest.mark.parametrize("model, caching", [(FULL, True), (HYBRID, False)])
def test_without_align_mode_the_chat_shares_the_first_step(model: ModelSpec, caching: bool) -> None:
    """No linear layers, or prefix caching off: vLLM does not align, chunks fill the step."""
    sim = h200_like(model, caching=caching)
    assert not sim.mamba_align
    sim.submit("doc", prompt(50_000, 1), 4)
    sim.submit("chat", prompt(2400, 2), 4)
    steps = trace(sim)
    assert steps[0] == {"doc": (0, BLOCK), "chat": (0, STEP - BLOCK)}
    assert steps[1] == {"doc": (BLOCK, BLOCK), "chat": (STEP - BLOCK, 2400 - (STEP - BLOCK))}


@pytest.mark.parametrize("tokens, waits", [(1528, False), (STEP - BLOCK, False), (BLOCK + 1, True), (2400, True)])
def test_a_prompt_that_fits_the_room_goes_along(tokens: int, waits: bool) -> None:
    """A prompt of at most the room left is one final chunk, which need not end on a boundary."""
    sim = h200_like()
    sim.submit("doc", prompt(50_000, 1), 4)
    sim.submit("chat", prompt(tokens, 2), 4)
    steps = trace(sim)
    if waits:
        assert "chat" not in steps[0]
    else:
        assert steps[0] == {"doc": (0, BLOCK), "chat": (0, tokens)}


def test_a_waiting_prompt_that_gets_no_chunk_blocks_the_queue_behind_it() -> None:
    """vLLM `break`s on an empty aligned chunk of a waiting request: the short prompt behind the
    chat would fit the room, but nobody overtakes the chat (FCFS)."""
    sim = h200_like()
    sim.submit("doc", prompt(50_000, 1), 4)
    sim.submit("chat", prompt(2400, 2), 4)
    sim.submit("short", prompt(500, 3), 4)
    steps = trace(sim)
    assert steps[0] == {"doc": (0, BLOCK)}
    # The chat's first chunk comes with the document's last; the short prompt takes what is left.
    assert first(steps, "chat") == first(steps, "short") == last(steps, "doc") == 23
    assert steps[23] == {"doc": (23 * BLOCK, 50_000 - 23 * BLOCK), "chat": (0, BLOCK), "short": (0, 208)}


def test_a_running_prefill_sits_out_a_step_its_aligned_chunk_does_not_fit() -> None:
    """In the running loop an empty aligned chunk skips only that request: the decodes before
    and after it still run. Blocks of 125 tokens in 128-token steps: "long" is admitted beside
    "old"'s 1-token last chunk (127 left: one block), then "old"'s 4-position MTP decode leaves 124."""
    sim = h200_like(block=125, max_num_batched_tokens=128, long_prefill_token_threshold=0)
    sim.submit("old", prompt(126, 1), 8)
    sim.step()  # old alone: its one block (125), not 126 past it
    sim.submit("long", prompt(1000, 2), 2, arrival_time=sim.now)
    sim.submit("short", prompt(2, 3), 8, arrival_time=sim.now)
    results: list[StepResult] = []
    steps = trace(sim, results)
    assert steps[0] == {"old": (125, 1), "long": (0, 125), "short": (0, 2)}
    skipped = [i for i, s in enumerate(steps) if i < last(steps, "long") and "long" not in s]
    assert skipped and skipped == list(range(1, len(skipped) + 1))  # from step 1 on, while old decodes
    assert results[1].decode_seqs == 2  # old before it and short after it both decode
    assert all(s["long"][1] == 125 for s in steps[skipped[-1] + 1 : last(steps, "long")])


def test_a_cached_prefix_counts_toward_the_chunks_start() -> None:
    """A waiting request's chunk starts after its cached blocks: with two of them cached, a prompt
    whose uncached rest fits the room is a final chunk and goes beside the document; one whose
    rest needs another block boundary waits."""
    sim = h200_like()
    seed = prompt(3 * BLOCK + 12, 7)
    sim.submit("seed", seed, 2)
    trace(sim)
    sim.submit("doc", prompt(50_000, 1), 4)
    sim.submit("fits", seed[: 2 * BLOCK] + prompt(1900, 8), 4)
    sim.submit("spills", seed[: 2 * BLOCK] + prompt(2400, 9), 4)
    steps = trace(sim)
    assert steps[0] == {"doc": (0, BLOCK), "fits": (2 * BLOCK, 1900)}
    assert first(steps, "spills") == last(steps, "doc")
    assert steps[first(steps, "spills")]["spills"] == (2 * BLOCK, BLOCK)


@pytest.mark.parametrize("block", [16, 1568, BLOCK])
def test_chunks_end_on_block_boundaries_except_the_last(block: int) -> None:
    """Every chunk ends on a block boundary, none crosses the prompt's last one, and only chunks
    past it (the last, or all of a prompt shorter than a block) end anywhere."""
    sim = h200_like(block=block, long_prefill_token_threshold=BLOCK)
    lengths = [50_000, 2400, 1528, 9000, 17, 4096, 3 * block, 3 * block + 1]
    for i, n in enumerate(lengths):
        sim.submit(f"r{i}", prompt(n, i), 16, arrival_time=0.05 * i)
    steps = trace(sim)
    seen = dict.fromkeys(range(len(lengths)), 0)
    for s in steps:
        for rid, (start, n) in s.items():
            i = int(rid[1:])
            assert start == seen[i] and n > 0
            seen[i] += n
            last_boundary = lengths[i] - lengths[i] % block
            assert seen[i] % block == 0 or start >= last_boundary
    assert list(seen.values()) == lengths


def test_a_lone_long_prompt_prefills_a_block_a_step() -> None:
    """Alone, the cap is off, but 4,096 tokens hold one 2,096-token block: vLLM floors to it."""
    sim = h200_like()
    sim.submit("doc", prompt(50_000, 1), 4)
    assert [s["doc"][1] for s in trace(sim) if "doc" in s] == [BLOCK] * 23 + [50_000 - 23 * BLOCK]


def test_settings_that_would_starve_a_long_prompt_are_refused() -> None:
    # vLLM's own check: a block larger than a step never fits (the chunk floors to 0 forever).
    with pytest.raises(ValueError, match=r"block_size \(4112\) must be <= max_num_batched_tokens \(4096\)"):
        h200_like(block=4112, long_prefill_token_threshold=0)
    # A cap under a block: two long prompts would both floor to 0 and never prefill again.
    with pytest.raises(ValueError, match="long_prefill_token_threshold"):
        h200_like(long_prefill_token_threshold=2048)
    # Neither applies without align mode.
    h200_like(FULL, block=4112, long_prefill_token_threshold=2048)
    h200_like(caching=False, block=4112, long_prefill_token_threshold=2048)
