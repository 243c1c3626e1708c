"""policies/images.py: an image's cost equals what Qwen's own image processor makes of it, and
refusals are values."""

from __future__ import annotations

import itertools

import pytest
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from policies.images import (
    MAX_ASPECT,
    ImageCost,
    ImageLimits,
    ImageRefusal,
    ImageRefusalReason,
    VisionSpec,
    admit_bytes,
    admit_count,
    cost,
    resize,
)

SPEC = VisionSpec()
LIMITS = ImageLimits()
SIDES = [1, 15, 16, 17, 31, 32, 33, 48, 100, 120, 200, 255, 256, 257, 480, 500, 640, 1000, 1080, 1920, 4000, 4096]


@pytest.mark.parametrize(("width", "height"), list(itertools.product(SIDES, SIDES)))
def test_resize_is_the_processor_s_smart_resize(width: int, height: int) -> None:
    if max(width, height) / min(width, height) > MAX_ASPECT:
        pytest.skip("refused before resizing")
    h, w = smart_resize(height, width, factor=SPEC.factor, min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)
    assert resize(width, height, SPEC) == (w, h)


def test_tokens_are_the_merged_patches() -> None:
    small = cost(200, 120, SPEC, LIMITS)  # scaled up to at least min_pixels (65,536)
    assert isinstance(small, ImageCost)
    assert small.width * small.height >= SPEC.min_pixels and small.width % 32 == small.height % 32 == 0
    assert small.tokens == (small.width // 16) * (small.height // 16) // 4
    vga = cost(640, 480, SPEC, LIMITS)
    assert vga == ImageCost(640, 480, 300) and vga.prompt_tokens == 302  # 40 x 30 patches, 2 x 2 merged
    huge = cost(4096, 4096, SPEC, LIMITS)  # exactly max_pixels: kept
    assert isinstance(huge, ImageCost) and huge.tokens == 256 * 256 // 4
    over = cost(6000, 4000, SPEC, ImageLimits(max_pixels=10**8), 0)  # allowed in, scaled down
    h, w = smart_resize(4000, 6000, factor=SPEC.factor, min_pixels=SPEC.min_pixels, max_pixels=SPEC.max_pixels)
    assert over == ImageCost(w, h, (w // 16) * (h // 16) // 4) and w * h <= SPEC.max_pixels


def test_refusals_are_values_with_their_reason_and_status() -> None:
    empty = cost(0, 10, SPEC, LIMITS, index=2)
    assert isinstance(empty, ImageRefusal) and empty.reason is ImageRefusalReason.EMPTY and empty.index == 2
    big = cost(5000, 5000, SPEC, LIMITS, index=1)
    assert isinstance(big, ImageRefusal) and big.reason is ImageRefusalReason.TOO_MANY_PIXELS
    assert "25,000,000" in big.message or "5000x5000" in big.message
    thin = cost(10, 3000, SPEC, LIMITS)
    assert isinstance(thin, ImageRefusal) and thin.reason is ImageRefusalReason.ASPECT
    assert admit_count(LIMITS.max_images, LIMITS) is None
    many = admit_count(LIMITS.max_images + 1, LIMITS)
    assert many is not None and many.reason.status == 400 and many.reason.value == "too_many_images"
    assert admit_bytes(LIMITS.max_bytes, LIMITS) is None
    heavy = admit_bytes(LIMITS.max_bytes + 1, LIMITS, index=3)
    assert heavy is not None and heavy.reason.status == 413 and heavy.index == 3
