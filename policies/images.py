"""What an image costs a Qwen vision model, and whether it may be sent at all: values in, a
value out ("refused" is a value, not an exception).

Qwen's image processor (transformers' `Qwen2VLImageProcessor`, which Qwen3-VL and the Qwen3.5/3.6
models use with 16-pixel patches merged 2 x 2) resizes an image so that both sides are
multiples of `patch_size * merge_size` and its area lies within [min_pixels, max_pixels]
(`smart_resize`), cuts it into patches, and merges each 2 x 2 of them into one token for the
language model. The prompt then holds, per image, `<|vision_start|>`, one `<|image_pad|>` per
merged patch, and `<|vision_end|>`: vLLM expands the one pad the chat template writes to that
many. The same number of tokens is what the vision encoder writes into vLLM's encoder cache.

`resize` is `smart_resize` itself, to the pixel (the same rounding: Python's `round`, which
rounds halves to even): a count that differs by one token from the engine's would make the
gateway's KV reservation and bill wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

# smart_resize refuses an image whose long side is more than 200 times its short side.
MAX_ASPECT = 200.0


@dataclass(frozen=True)
class VisionSpec:
    """A model's image processor, as its preprocessor config says (the Qwen3.6 defaults)."""

    patch_size: int = 16
    merge_size: int = 2
    min_pixels: int = 65_536  # `size.shortest_edge` in the config: a pixel count, despite the name
    max_pixels: int = 16_777_216  # `size.longest_edge`

    @property
    def factor(self) -> int:
        """Both sides of the resized image are multiples of this."""
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class ImageLimits:
    """What one request may send (settings `models[].images`)."""

    max_images: int = 8  # per request
    max_pixels: int = 16_777_216  # width x height of an image as sent (16 megapixels)
    max_bytes: int = 20 * 1024 * 1024  # one image's encoded bytes


class ImageRefusalReason(Enum):
    TOO_MANY = "too_many_images"
    TOO_MANY_PIXELS = "image_too_large"
    TOO_MANY_BYTES = "image_too_large_bytes"
    EMPTY = "empty_image"
    ASPECT = "image_aspect_ratio"

    @property
    def status(self) -> int:
        return 413 if self is ImageRefusalReason.TOO_MANY_BYTES else 400


@dataclass(frozen=True)
class ImageRefusal:
    reason: ImageRefusalReason
    message: str
    index: int | None = None  # which image, in the request's order


@dataclass(frozen=True)
class ImageCost:
    """An image as the model sees it: its resized size and the prompt tokens it becomes."""

    width: int  # resized
    height: int
    tokens: int  # image pad tokens (the merged patches)

    @property
    def prompt_tokens(self) -> int:
        """What it adds to the prompt: its pads between `<|vision_start|>` and `<|vision_end|>`."""
        return self.tokens + 2


def resize(width: int, height: int, spec: VisionSpec) -> tuple[int, int]:
    """(width, height) after Qwen's `smart_resize` (transformers' qwen2_vl image processing)."""
    factor = spec.factor
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > spec.max_pixels:
        beta = math.sqrt((height * width) / spec.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def cost(width: int, height: int, spec: VisionSpec, limits: ImageLimits, index: int = 0) -> ImageCost | ImageRefusal:
    """An image of `width` x `height` pixels (as decoded): its cost, or why it is refused."""
    if width < 1 or height < 1:
        return ImageRefusal(ImageRefusalReason.EMPTY, f"Image {index} has no pixels ({width}x{height}).", index)
    if width * height > limits.max_pixels:
        return ImageRefusal(
            ImageRefusalReason.TOO_MANY_PIXELS,
            f"Image {index} is {width}x{height} pixels; at most {limits.max_pixels:,} pixels are allowed.",
            index,
        )
    if max(width, height) / min(width, height) > MAX_ASPECT:
        return ImageRefusal(
            ImageRefusalReason.ASPECT,
            f"Image {index} is {width}x{height}: its long side may be at most {MAX_ASPECT:g} times its short side.",
            index,
        )
    w, h = resize(width, height, spec)
    patches = (w // spec.patch_size) * (h // spec.patch_size)
    return ImageCost(w, h, patches // (spec.merge_size * spec.merge_size))


def admit_count(images: int, limits: ImageLimits) -> ImageRefusal | None:
    """Too many images in one request?"""
    if images > limits.max_images:
        return ImageRefusal(
            ImageRefusalReason.TOO_MANY,
            f"The request has {images} images; at most {limits.max_images} are allowed.",
        )
    return None


def admit_bytes(size: int, limits: ImageLimits, index: int = 0) -> ImageRefusal | None:
    """An encoded image too large to decode (checked before it is)?"""
    if size > limits.max_bytes:
        return ImageRefusal(
            ImageRefusalReason.TOO_MANY_BYTES,
            f"Image {index} is {size:,} bytes; at most {limits.max_bytes:,} are allowed.",
            index,
        )
    return None
