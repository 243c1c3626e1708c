"""An image a client sent, read before it costs anything: its bytes from a data URL or base64,
its format and size from its header, and then its pixels, each step bounded.

The order is what keeps a hostile image cheap: the encoded size is checked before the base64
is decoded, the width and height are read from the header (Pillow's `open` is lazy) and
checked against the limits before a pixel is decoded, and only then is it decoded whole, so
that a corrupt file is refused here and not by the engine. A decompression bomb (a small PNG
that declares a huge bitmap) is refused on its declared size. Decoding takes milliseconds to
tens of them: callers run `read` in a worker thread, off the event loop.

Refusals are `InvalidRequest` (code `invalid_image`, `image_too_large`, ...) or, for bytes,
`RequestTooLarge`: each surface writes them in its own shape, naming the part (`param`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from gateway.errors import GatewayError, InvalidRequest, RequestTooLarge
from policies.images import ImageCost, ImageLimits, ImageRefusal, VisionSpec, admit_bytes, cost

# What Qwen's processor reads and vLLM's image loader opens; animated GIFs give their first frame.
FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP"})
_DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,", re.I)


@dataclass(frozen=True)
class ReadImage:
    """An image that decodes, within the limits: what the engine is sent and what it costs."""

    data: bytes  # as the client encoded it (PNG, JPEG...): vLLM decodes it again
    format: str
    width: int
    height: int
    sha256: str  # the same bytes, the same hash: what a repeated image's cache hit keys on
    cost: ImageCost


def _refused(refusal: ImageRefusal, param: str) -> GatewayError:
    cls = RequestTooLarge if refusal.reason.status == 413 else InvalidRequest
    return cls(refusal.message, param=param, code=refusal.reason.value)


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_image")


def data_url_bytes(url: str, limits: ImageLimits, param: str, index: int = 0) -> bytes:
    """The bytes of a `data:image/...;base64,...` URL (the only URL read without fetching)."""
    m = _DATA_URL.match(url)
    if m is None or not m.group("b64"):
        raise _invalid("An image URL must be a base64 data URL (data:image/png;base64,...).", param)
    media = (m.group("type") or "").lower()
    if media and not media.startswith("image/"):
        raise _invalid(f"The data URL's media type is '{media}', not an image.", param)
    return base64_bytes(url[m.end() :], limits, param, index)


def base64_bytes(text: str, limits: ImageLimits, param: str, index: int = 0) -> bytes:
    """Strict base64 (Anthropic's `source.data`, a data URL's payload), its size checked first."""
    # Three bytes for every four characters: the size is known before anything is decoded.
    if (refusal := admit_bytes(len(text) * 3 // 4, limits, index)) is not None:
        raise _refused(refusal, param)
    try:
        raw = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(f"Image {index} is not valid base64.", param) from None
    if not raw:
        raise _invalid(f"Image {index} is empty.", param)
    return raw


def read(raw: bytes, spec: VisionSpec, limits: ImageLimits, param: str, index: int = 0) -> ReadImage:
    """Check and decode one image's bytes; its cost to the model. Blocking: run it in a thread."""
    if (refusal := admit_bytes(len(raw), limits, index)) is not None:
        raise _refused(refusal, param)
    with warnings.catch_warnings():
        # Pillow warns (then raises) past its own bomb limit; the pixel limit below is lower.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(raw)) as img:  # lazy: the header only
                fmt = (img.format or "").upper()
                width, height = img.size
                if fmt not in FORMATS:
                    raise _invalid(
                        f"Image {index} is {fmt or 'of an unknown format'}; send PNG, JPEG, WEBP, GIF or BMP.",
                        param,
                    )
                priced = cost(width, height, spec, limits, index)
                if isinstance(priced, ImageRefusal):
                    raise _refused(priced, param)
                img.load()  # every pixel: a truncated or corrupt file fails here, not in the engine
        except GatewayError:
            raise
        except Image.DecompressionBombError:  # Pillow's own limit, far above ours: refused on its header
            raise InvalidRequest(
                f"Image {index} declares more pixels than Pillow decodes; at most {limits.max_pixels:,} are allowed.",
                param=param,
                code="image_too_large",
            ) from None
        except UnidentifiedImageError:
            raise _invalid(f"Image {index} is not an image this server can read.", param) from None
        except (OSError, SyntaxError, ValueError) as e:  # Pillow's "broken data stream", "truncated"
            raise _invalid(f"Image {index} could not be decoded: {e}.", param) from None
    return ReadImage(raw, fmt, width, height, hashlib.sha256(raw).hexdigest(), priced)
