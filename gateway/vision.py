"""Whether a served model takes images, and how it prices them: read once at start from its
directory (config.json's `vision_config` and `image_token_id`, preprocessor_config.json's
resize bounds) and its settings (`images.enabled`, `engine_args.language_model_only`).

A model that does not take images still has a `Vision` value, with the reason as its
`refusal`: the 400 that answers an image names the model and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.settings import ImageFetchSettings, ModelSettings
from policies.images import ImageLimits, VisionSpec

# Engines that carry an image to the model: vLLM in this process or on another box (the engine
# host's wire carries the bytes), and the simulated one, which needs only the prompt's length.
# A stock vLLM server takes token ids (vllm-server), the replay engine recorded text.
IMAGE_ENGINES = frozenset({"vllm", "remote", "simulated"})


@dataclass(frozen=True)
class Vision:
    spec: VisionSpec
    limits: ImageLimits
    image_token_id: int = -1
    refusal: str | None = None  # why this model takes no image; None: it takes them
    fetch: ImageFetchSettings = field(default_factory=ImageFetchSettings)  # images by http(s) URL (off)

    @property
    def enabled(self) -> bool:
        return self.refusal is None


NO_VISION = Vision(VisionSpec(), ImageLimits(), refusal="it has no vision encoder")


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def spec_of(preprocessor: dict[str, Any], overrides: dict[str, Any] | None = None) -> VisionSpec:
    """The image processor's resize bounds (`size.shortest_edge` / `longest_edge`, which are
    pixel counts, or the older `min_pixels` / `max_pixels`) and patch arithmetic; `overrides`:
    vLLM's `mm_processor_kwargs`, which the engine applies over the config (so must the count)."""
    preprocessor = {**preprocessor, **(overrides or {})}
    size = {**(preprocessor.get("size") or {})}
    for key, name in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if overrides and key in overrides:  # a flat override wins over the config's `size`
            size[name] = overrides[key]
    default = VisionSpec()
    return VisionSpec(
        patch_size=int(preprocessor.get("patch_size", default.patch_size)),
        merge_size=int(preprocessor.get("merge_size", default.merge_size)),
        min_pixels=int(size.get("shortest_edge", preprocessor.get("min_pixels", default.min_pixels))),
        max_pixels=int(size.get("longest_edge", preprocessor.get("max_pixels", default.max_pixels))),
    )


def vision_of(model: ModelSettings, model_dir: Path, fetch: ImageFetchSettings | None = None) -> Vision:
    """What `model`, served from `model_dir`, does with an image."""
    limits = model.images.limits
    config = _json(model_dir / "config.json")
    spec = spec_of(_json(model_dir / "preprocessor_config.json"), model.engine_args.get("mm_processor_kwargs"))
    pad = config.get("image_token_id")
    if model.images.enabled is False:
        return Vision(spec, limits, refusal="images are turned off for it (images.enabled: false)")
    if "vision_config" not in config or not isinstance(pad, int):
        return Vision(spec, limits, refusal="it has no vision encoder")
    if model.engine_args.get("language_model_only") or config.get("language_model_only"):
        return Vision(spec, limits, refusal="it is served language_model_only")
    if model.engine not in IMAGE_ENGINES:
        return Vision(spec, limits, refusal=f"its engine ({model.engine}) does not carry images")
    if limits.max_images == 0:
        return Vision(spec, limits, refusal="images.max_images is 0")
    return Vision(spec, limits, image_token_id=pad, fetch=fetch or ImageFetchSettings())


def engine_args(model: ModelSettings, model_dir: Path) -> dict[str, Any]:
    """vLLM's multimodal arguments for the model: at most `max_images` images and no video
    when it takes images; its language model alone (no vision encoder loaded, no encoder cache
    profiled) when it could but images are turned off."""
    config = _json(model_dir / "config.json")
    if "vision_config" not in config or "language_model_only" in model.engine_args:
        return {}
    vision = vision_of(model, model_dir)
    if vision.enabled:
        return {"limit_mm_per_prompt": {"image": vision.limits.max_images, "video": 0}}
    return {"language_model_only": True}
