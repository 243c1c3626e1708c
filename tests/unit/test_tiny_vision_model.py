"""The tiny Qwen3.5 vision model's tokenizer and template, as `make models` builds them."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from engine_adapter.tiny_model import ARCHITECTURES, PREPROCESSOR, QWEN3_5, build_tokenizer
from policies.images import VisionSpec


def test_an_image_part_renders_one_pad_between_the_vision_markers(tmp_path: Path) -> None:
    build_tokenizer(tmp_path, QWEN3_5)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "what is "}, {"type": "image"}, {"type": "text", "text": "?"}],
        }
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>user\nwhat is <|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok.encode(text, add_special_tokens=False)
    config = ARCHITECTURES["qwen3_5_vl"]
    assert ids.count(config["image_token_id"]) == 1
    assert config["vision_start_token_id"] in ids and config["vision_end_token_id"] in ids
    assert tok.convert_tokens_to_ids("<|im_end|>") == QWEN3_5.eos_token_id


def test_the_processor_config_is_the_vision_spec_the_gateway_prices_with() -> None:
    size = PREPROCESSOR["size"]
    assert VisionSpec() == VisionSpec(
        patch_size=PREPROCESSOR["patch_size"],
        merge_size=PREPROCESSOR["merge_size"],
        min_pixels=size["shortest_edge"],
        max_pixels=size["longest_edge"],
    )
