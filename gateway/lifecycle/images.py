"""A request's images, from its parts to the engine: which models may take them, reading each
(bounded, off the event loop), and placing their tokens in the rendered prompt.

    sources (the parts, in template order) -> seeing (only models that take images)
      -> read (bytes, format, size, every pixel decoded once) -> placed (each image's pad
      repeated to the tokens the chosen model's processor makes of it) -> engine images

Everything is refused before any hold is taken: 400 (413 for bytes) in the asking API's shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from engine_adapter.base import ImageInput
from gateway import image_fetch, images
from gateway.errors import InvalidRequest
from gateway.registry import ServedModel
from policies import tokens
from policies.images import ImageRefusal, admit_count, cost

# Where an image may stand: OpenAI takes them in user messages, Anthropic also in tool results.
IMAGE_ROLES = frozenset({"user", "tool"})


@dataclass(frozen=True)
class ImageSource:
    """An image part of a request, before it is read: where it is and what it says."""

    param: str  # the part's path in the request, for its errors
    url: str  # a data URL, or an http(s) one (fetched where the operator allows it)


def seeing(candidates: list[ServedModel], sources: Sequence[ImageSource], requested: str) -> list[ServedModel]:
    """The candidates that take images, when the request has any (routing then picks among
    them); none: 400 naming the model and why it takes none."""
    if not sources:
        return candidates
    able = [c for c in candidates if c.vision.enabled]
    if not able:
        first = candidates[0]
        named = requested if requested == first.name else f"{requested}' ('{first.name}"
        raise InvalidRequest(
            f"The model '{named}' does not take images: {first.vision.refusal}.",
            param=sources[0].param,
            code="images_not_supported",
        )
    return able


def _read_all(
    served: ServedModel, sources: Sequence[ImageSource], raws: Sequence[bytes | None]
) -> list[images.ReadImage]:
    vision = served.vision
    read = []
    for index, (source, raw) in enumerate(zip(sources, raws, strict=True)):
        param = f"{source.param}.url"
        if raw is None:  # a data URL: decoded here, off the event loop
            raw = images.data_url_bytes(source.url, vision.limits, param, index)
        read.append(images.read(raw, vision.spec, vision.limits, param, index))
    return read


def _inline(url: str) -> bool:
    """A data URL (the scheme is case-insensitive): read from the request itself."""
    return url[:5].lower() == "data:"


async def _fetched(served: ServedModel, source: ImageSource) -> bytes | None:
    """An http(s) image's bytes, where the operator allows fetching it; None for a data URL."""
    if _inline(source.url):
        return None
    vision = served.vision
    return await image_fetch.fetch(source.url, vision.fetch, vision.limits.max_bytes, f"{source.param}.url")


async def read(served: ServedModel, sources: Sequence[ImageSource]) -> list[images.ReadImage]:
    """Each image checked and decoded, within `served`'s limits: fetched first where it is a
    URL (all of them at once), then decoded, which takes milliseconds to tens of them per
    image, in a worker thread."""
    if not sources:
        return []
    if (refusal := admit_count(len(sources), served.vision.limits)) is not None:
        raise InvalidRequest(refusal.message, param=sources[-1].param, code=refusal.reason.value)
    for source in sources:  # every URL's refusal before any fetch starts
        if not _inline(source.url):
            image_fetch.check_url(source.url, served.vision.fetch, f"{source.param}.url")
    raws = await asyncio.gather(*(_fetched(served, s) for s in sources))
    return await asyncio.to_thread(_read_all, served, sources, raws)


def placed(
    served: ServedModel, prompt: tokens.Prompt, read: Sequence[images.ReadImage], param: str = "messages"
) -> tokens.Prompt:
    """The prompt with each image's tokens as `served`'s processor makes them. A model that
    takes images also gets this check without any: its image token in a message's text would
    otherwise reach the engine as an image with no pixels."""
    vision = served.vision
    if not vision.enabled or (not read and vision.image_token_id not in prompt.token_ids):
        return prompt
    counts = []
    for index, image in enumerate(read):
        priced = cost(image.width, image.height, vision.spec, vision.limits, index)
        if isinstance(priced, ImageRefusal):  # a routed model's own limits may be lower
            raise InvalidRequest(priced.message, param=param, code=priced.reason.value)
        counts.append((priced.tokens, image.sha256))
    out = tokens.with_images(prompt, vision.image_token_id, counts)
    if isinstance(out, tokens.PlaceholderMismatch):
        raise InvalidRequest(out.message, param=param, code="invalid_image_placeholder")
    return out


def engine_images(prompt: tokens.Prompt, read: Sequence[images.ReadImage]) -> tuple[ImageInput, ...]:
    return tuple(
        ImageInput(data=image.data, sha256=image.sha256, offset=at.offset, tokens=at.tokens)
        for image, at in zip(read, prompt.images, strict=True)
    )
