"""Start vLLM's AsyncLLM (CPU build) on a tiny VL model dir and send chats with one image.

    .venv/bin/python benchmarks/vision_probe/serve_check.py models/tiny-qwen3.5-vl [--dummy]

For each PIL-made image it sends the same chat four ways and prints what vLLM reports
(len(RequestOutput.prompt_token_ids)) next to policies/images.py's prediction:
  text      {"prompt": chat-template text, "multi_modal_data": {"image": img}}
  ids1      TokensPrompt(prompt_token_ids=[... <|vision_start|> <|image_pad|> <|vision_end|> ...], mm data)
            (the gateway's way: tokenize once, one pad per image; vLLM expands it)
  expanded  TokensPrompt with the pads already expanded to N (what vLLM itself produced)
  renderer  vLLM's own chat path: engine.renderer.render_messages(OpenAI message with a data: URL)
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import sys
import time

for k, v in dict(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1").items():
    os.environ.setdefault(k, v)

from policies.images import ImageCost, ImageLimits, VisionSpec, cost  # noqa: E402

UNLIMITED = ImageLimits(max_pixels=10**12)


def spec_of(model_dir: str) -> VisionSpec:
    """The model's image processor, from its preprocessor config."""
    with open(os.path.join(model_dir, "preprocessor_config.json")) as f:
        c = json.load(f)
    size = c.get("size") or {}
    return VisionSpec(
        patch_size=c.get("patch_size", 16),
        merge_size=c.get("merge_size", 2),
        min_pixels=size.get("shortest_edge", c.get("min_pixels", 65_536)),
        max_pixels=size.get("longest_edge", c.get("max_pixels", 16_777_216)),
    )


def _cost(w: int, h: int, spec: VisionSpec) -> ImageCost:
    c = cost(w, h, spec, UNLIMITED)
    assert isinstance(c, ImageCost), c
    return c


def image_pad_tokens(w: int, h: int, spec: VisionSpec) -> int:
    return _cost(w, h, spec).tokens


def image_prompt_tokens(w: int, h: int, spec: VisionSpec) -> int:
    return _cost(w, h, spec).prompt_tokens


SIZES = [(200, 120), (640, 480), (33, 500), (1024, 768), (1920, 1080)]
IMAGE_PAD, VISION_START, VISION_END = 248056, 248053, 248054


def picture(w: int, h: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(w * 10007 + h)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB")


def data_url(img) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def main(model_dir: str, dummy: bool) -> None:
    from vllm import AsyncEngineArgs, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.time()
    args = AsyncEngineArgs(
        model=model_dir,
        dtype="bfloat16",
        enforce_eager=True,
        max_model_len=4096,
        max_num_seqs=4,
        kv_cache_memory_bytes=256 << 20,
        seed=0,
        load_format="dummy" if dummy else "auto",
        limit_mm_per_prompt={"image": 2, "video": 0},
        enable_prefix_caching=True,
    )
    engine = AsyncLLM.from_engine_args(args)
    vc = engine.vllm_config
    cc, sc, mm = vc.cache_config, vc.scheduler_config, vc.model_config.multimodal_config
    print(f"startup {time.time() - t0:.1f}s  arch={vc.model_config.architectures}")
    print(
        f"KV: {cc.num_gpu_blocks} blocks x {cc.block_size}; max_num_batched_tokens={sc.max_num_batched_tokens} "
        f"max_num_encoder_input_tokens={sc.max_num_encoder_input_tokens} encoder_cache_size={sc.encoder_cache_size}"
    )
    print(
        f"mm: limit_per_prompt={mm.limit_per_prompt} mm_processor_cache_gb={mm.mm_processor_cache_gb} "
        f"mm_processor_cache_type={mm.mm_processor_cache_type}"
    )
    renderer = engine.renderer
    try:
        from vllm.multimodal import MULTIMODAL_REGISTRY

        p = MULTIMODAL_REGISTRY.create_processor(vc.model_config)
        hfp = p.info.get_hf_processor()
        print(
            "HF processor:",
            type(hfp).__name__,
            "image:",
            type(hfp.image_processor).__name__,
            "video:",
            type(hfp.video_processor).__name__,
            "tokenizer:",
            type(hfp.tokenizer).__name__,
        )
        print(
            "max image tokens per item (vLLM):",
            p.info.get_max_image_tokens(),
            "image size with most features:",
            p.info.get_image_size_with_most_features(),
        )
    except Exception as e:  # diagnostic only
        print("processor introspection failed:", type(e).__name__, e)

    tok = engine.get_tokenizer()
    cfg = spec_of(model_dir)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    n = 0

    async def run(prompt, label):
        nonlocal n
        n += 1
        t = time.time()
        try:
            outs = [o async for o in engine.generate(prompt, sp, f"{label}-{n}")]
            out = outs[-1]
            return len(out.prompt_token_ids), out.num_cached_tokens, out.prompt_token_ids, time.time() - t
        except Exception as e:
            return f"ERROR {type(e).__name__}: {str(e)[:300]}", None, None, time.time() - t

    messages_tpl = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe the picture."}]}]
    text = tok.apply_chat_template(messages_tpl, tokenize=False, add_generation_prompt=True)
    ids1 = tok.encode(text, add_special_tokens=False)
    base = len(ids1) - 3  # text tokens other than <|vision_start|><|image_pad|><|vision_end|>
    print("chat-template text:", repr(text))
    print("ids1 around image:", ids1[:8], f"(len {len(ids1)}, text-only tokens {base})")

    for w, h in SIZES:
        img = picture(w, h)
        pads = image_pad_tokens(w, h, cfg)
        want = base + image_prompt_tokens(w, h, cfg)
        print(
            f"\n== image {w}x{h}: policies/images.py -> {pads} pads, +2 = {image_prompt_tokens(w, h, cfg)}; "
            f"expected prompt tokens {want}"
        )
        r_text = await run({"prompt": text, "multi_modal_data": {"image": img}}, "text")
        r_ids1 = await run(TokensPrompt(prompt_token_ids=ids1, multi_modal_data={"image": img}), "ids1")
        for label, r in (("text", r_text), ("ids1", r_ids1)):
            print(
                f"  {label:9s} prompt_tokens={r[0]} cached={r[1]} pads={r[2].count(IMAGE_PAD) if r[2] else '-'} "
                f"match={r[0] == want} ({r[3]:.2f}s)"
            )
        if isinstance(r_ids1[0], int):
            expanded = r_ids1[2]
            r = await run(TokensPrompt(prompt_token_ids=list(expanded), multi_modal_data={"image": img}), "expanded")
            print(
                f"  expanded  prompt_tokens={r[0]} cached={r[1]} pads={r[2].count(IMAGE_PAD) if r[2] else '-'} "
                f"(sent {len(expanded)})"
            )
        # vLLM's own OpenAI chat rendering path
        try:
            from vllm.renderers.params import ChatParams

            msgs = [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": data_url(img)}},
                        {"type": "text", "text": "Describe the picture."},
                    ],
                }
            ]
            _, prompt = await renderer.render_messages_async(
                msgs, ChatParams(chat_template_kwargs={"add_generation_prompt": True})
            )
            shown = {k: (v if k in ("prompt",) else type(v).__name__) for k, v in prompt.items()}
            if "prompt_token_ids" in prompt:
                shown["prompt_token_ids"] = (
                    f"{len(prompt['prompt_token_ids'])} ids, pads={prompt['prompt_token_ids'].count(IMAGE_PAD)}"
                )
            print("  renderer prompt:", shown)
            r = await run(prompt, "renderer")
            print(f"  renderer  prompt_tokens={r[0]} match={r[0] == want}")
        except Exception as e:
            print("  renderer failed:", type(e).__name__, str(e)[:300])

    # Two images in one prompt; and a missing placeholder
    a, b = picture(200, 120), picture(33, 500)
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare."}]}]
    ids2 = tok.apply_chat_template(two, tokenize=True, add_generation_prompt=True)
    ids2 = ids2["input_ids"] if hasattr(ids2, "keys") else ids2
    r = await run(TokensPrompt(prompt_token_ids=list(ids2), multi_modal_data={"image": [a, b]}), "two")
    want2 = len(ids2) - 6 + image_prompt_tokens(200, 120, cfg) + image_prompt_tokens(33, 500, cfg)
    print(f"\n== two images 200x120 + 33x500: prompt_tokens={r[0]} expected={want2} match={r[0] == want2}")
    noph = tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": "no image here"}], tokenize=False, add_generation_prompt=True
        ),
        add_special_tokens=False,
    )
    r = await run(TokensPrompt(prompt_token_ids=noph, multi_modal_data={"image": a}), "noph")
    print("== image without placeholder:", r[0])
    r = await run(TokensPrompt(prompt_token_ids=list(ids2), multi_modal_data={"image": [a, b, a]}), "three")
    print("== 3 images > limit_mm_per_prompt=2:", r[0])
    big = picture(4096, 4096)
    r = await run(TokensPrompt(prompt_token_ids=ids1, multi_modal_data={"image": big}), "big")
    print(f"== 4096x4096 ({image_prompt_tokens(4096, 4096, cfg)} image tokens) with max_model_len 4096:", r[0])
    r = await run(
        TokensPrompt(
            prompt_token_ids=ids1,
            multi_modal_data={"image": big},
            mm_processor_kwargs={"size": {"shortest_edge": 65536, "longest_edge": 1024 * 1024}},
        ),
        "bigcap",
    )
    print(
        f"== 4096x4096 with mm_processor_kwargs longest_edge=1024*1024: prompt_tokens={r[0]} "
        f"(policies/images.py: {base + image_prompt_tokens(4096, 4096, VisionSpec(max_pixels=1 << 20))})"
    )
    engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--dummy" in sys.argv))
