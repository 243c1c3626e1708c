"""gateway/images.py on real image files made with Pillow: what decodes is priced as the
processor prices it; every bad image is a clear 4xx before its pixels cost anything."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from gateway.errors import InvalidRequest, RequestTooLarge
from gateway.images import base64_bytes, data_url_bytes, read
from policies.images import ImageCost, ImageLimits, VisionSpec, cost

SPEC = VisionSpec()
LIMITS = ImageLimits()


def encoded(width: int, height: int, fmt: str = "PNG", mode: str = "RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (width, height), color=1 if mode == "1" else (200, 30, 60)).save(buf, format=fmt)
    return buf.getvalue()


def data_url(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


@pytest.mark.parametrize(("width", "height", "fmt"), [(640, 480, "PNG"), (200, 120, "JPEG"), (33, 500, "WEBP")])
def test_an_image_is_priced_as_the_processor_prices_it(width: int, height: int, fmt: str) -> None:
    raw = encoded(width, height, fmt)
    got = read(data_url_bytes(data_url(raw, f"image/{fmt.lower()}"), LIMITS, "p"), SPEC, LIMITS, "p")
    assert (got.format, got.width, got.height, got.data) == (fmt, width, height, raw)
    assert got.cost == cost(width, height, SPEC, LIMITS) and isinstance(got.cost, ImageCost)
    again = read(raw, SPEC, LIMITS, "p")
    assert again.sha256 == got.sha256  # the same bytes hash the same: a repeated image is recognised


def refused(exc: type[Exception], call: object) -> Exception:
    with pytest.raises(exc) as e:
        call()  # type: ignore[operator]
    return e.value


def test_bad_data_and_urls_are_400_invalid_image_naming_the_part() -> None:
    param = "messages[0].content[1].image_url"
    for url in ("https://example.com/cat.png", "data:image/png,notbase64", "data:text/plain;base64,aGk="):
        err = refused(InvalidRequest, lambda u=url: data_url_bytes(u, LIMITS, param))
        assert isinstance(err, InvalidRequest) and err.code == "invalid_image" and err.param == param
    bad_b64 = refused(InvalidRequest, lambda: base64_bytes("%%%not-base64", LIMITS, "source.data"))
    assert "not valid base64" in str(bad_b64)
    assert "empty" in str(refused(InvalidRequest, lambda: base64_bytes("", LIMITS, "source.data")))
    not_image = refused(InvalidRequest, lambda: read(b"GIF89a but not really", SPEC, LIMITS, "p"))
    assert "not an image" in str(not_image)
    truncated = encoded(64, 64, "PNG")[:-40]
    assert "could not be decoded" in str(refused(InvalidRequest, lambda: read(truncated, SPEC, LIMITS, "p")))
    tiff = encoded(64, 64, "TIFF")
    assert "send PNG, JPEG" in str(refused(InvalidRequest, lambda: read(tiff, SPEC, LIMITS, "p")))


def test_limits_are_checked_before_decoding() -> None:
    bomb = encoded(6000, 6000, "PNG", mode="1")  # a few KB declaring 36 megapixels
    assert len(bomb) < 100_000
    err = refused(InvalidRequest, lambda: read(bomb, SPEC, LIMITS, "p"))
    assert isinstance(err, InvalidRequest) and err.code == "image_too_large"
    # Past Pillow's own limit (179 megapixels) its open refuses it: the same answer.
    huge = encoded(20000, 10000, "PNG", mode="1")
    err = refused(InvalidRequest, lambda: read(huge, SPEC, LIMITS, "p"))
    assert isinstance(err, InvalidRequest) and err.code == "image_too_large"
    thin = refused(InvalidRequest, lambda: read(encoded(3000, 10), SPEC, LIMITS, "p"))
    assert isinstance(thin, InvalidRequest) and thin.code == "image_aspect_ratio"
    small = ImageLimits(max_bytes=1000)
    big = base64.b64encode(encoded(200, 200, "PNG", mode="RGB") + b"\0" * 2000).decode()
    too_big = refused(RequestTooLarge, lambda: base64_bytes(big, small, "p"))
    assert isinstance(too_big, RequestTooLarge) and too_big.status == 413 and too_big.code == "image_too_large_bytes"
    assert isinstance(refused(RequestTooLarge, lambda: read(b"\0" * 1001, SPEC, small, "p")), RequestTooLarge)


def test_a_model_s_image_settings_are_its_limits() -> None:
    from gateway.settings import ModelSettings

    model = ModelSettings(name="m", path="models/x", images={"max_images": 2, "max_bytes": "1MiB"})
    assert model.images.enabled is None  # as the model's config says
    assert model.images.limits == ImageLimits(max_images=2, max_pixels=16_777_216, max_bytes=1024 * 1024)
    assert ModelSettings(name="m", path="models/x").images.limits == ImageLimits()
