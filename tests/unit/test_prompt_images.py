"""Images in a prompt (policies/tokens.py): each image's one pad becomes its token count, the
engine gets it back as one pad, and the prefix cache keys an image's positions on its bytes."""

from __future__ import annotations

from engine_adapter.base import EngineRequest, ImageInput, SamplingOptions
from policies import kv, tokens

PAD = 9


def test_each_pad_becomes_its_images_tokens_in_order() -> None:
    prompt = tokens.Prompt(text="t", token_ids=(1, 2, PAD, 3, PAD, 4))
    out = tokens.with_images(prompt, PAD, [(3, "a"), (2, "b")])
    assert isinstance(out, tokens.Prompt)
    assert out.token_ids == (1, 2, PAD, PAD, PAD, 3, PAD, PAD, 4)
    assert out.images == (tokens.PromptImage(2, 3, "a"), tokens.PromptImage(6, 2, "b"))
    assert len(out) == 9 and out.text == "t"


def test_pads_and_images_that_do_not_pair_are_a_value() -> None:
    prompt = tokens.Prompt(text=None, token_ids=(1, PAD, PAD))
    out = tokens.with_images(prompt, PAD, [(4, "a")])
    assert out == tokens.PlaceholderMismatch(pads=2, images=1)
    assert "2 image placeholder tokens for 1 images" in out.message
    assert tokens.with_images(tokens.Prompt(None, (1, 2)), PAD, []) == tokens.Prompt(None, (1, 2))


def test_the_engine_gets_one_pad_per_image_back() -> None:
    prompt = tokens.with_images(tokens.Prompt(None, (1, PAD, 2, PAD)), PAD, [(3, "a"), (4, "b")])
    assert isinstance(prompt, tokens.Prompt)
    request = EngineRequest(
        request_id="r",
        prompt_token_ids=prompt.token_ids,
        sampling=SamplingOptions(max_tokens=1),
        images=tuple(ImageInput(b"", i.sha256, i.offset, i.tokens) for i in prompt.images),
    )
    assert request.compact_ids() == [1, PAD, 2, PAD]
    assert EngineRequest(
        request_id="r", prompt_token_ids=(5, 6), sampling=SamplingOptions(max_tokens=1)
    ).compact_ids() == [5, 6]


def test_the_cache_keys_tell_two_images_of_the_same_size_apart() -> None:
    text = tokens.Prompt(None, tuple(range(100, 140)) + (PAD,) + (7,) * 40)
    one = tokens.with_images(text, PAD, [(32, "red")])
    other = tokens.with_images(text, PAD, [(32, "blue")])
    again = tokens.with_images(text, PAD, [(32, "red")])
    assert isinstance(one, tokens.Prompt) and isinstance(other, tokens.Prompt) and isinstance(again, tokens.Prompt)
    assert one.token_ids == other.token_ids  # the same ids: only the keys differ
    a, b, c = (kv.prefix_keys(p.cache_keys(), 16) for p in (one, other, again))
    assert a[:2] == b[:2]  # the blocks before the image are shared
    assert a[2] != b[2] and a[2:] == c[2:]  # from the image on, only the same image's
    assert text.cache_keys() is text.token_ids
