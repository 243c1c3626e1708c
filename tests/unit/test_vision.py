"""Which models take images (gateway/vision.py), read from a model directory and its settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_adapter.tiny_model import ARCHITECTURES, PREPROCESSOR
from gateway.settings import ImageFetchSettings, ModelSettings
from gateway.vision import engine_args, spec_of, vision_of
from policies.images import VisionSpec


def model_dir(tmp_path: Path, *, vision: bool = True, **config: Any) -> Path:
    cfg = dict(ARCHITECTURES["qwen3_5_vl"] if vision else ARCHITECTURES["qwen3"], **config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if vision:
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return tmp_path


def settings(**kw: Any) -> ModelSettings:
    return ModelSettings.model_validate({"name": "m", "path": "x", **kw})


def test_a_vision_model_in_process_takes_images(tmp_path: Path) -> None:
    fetch = ImageFetchSettings(enabled=True, allow_hosts=("a.test",))
    v = vision_of(settings(images={"max_images": 3}), model_dir(tmp_path), fetch)
    assert v.enabled and v.image_token_id == 248056 and v.spec == VisionSpec() and v.fetch is fetch
    assert v.limits.max_images == 3
    assert engine_args(settings(images={"max_images": 3}), tmp_path) == {
        "limit_mm_per_prompt": {"image": 3, "video": 0}
    }


@pytest.mark.parametrize(
    ("kw", "config", "why"),
    [
        ({"images": {"enabled": False}}, {}, "images are turned off for it"),
        ({"engine_args": {"language_model_only": True}}, {}, "served language_model_only"),
        ({}, {"language_model_only": True}, "served language_model_only"),
        ({"engine": "replay"}, {}, "its engine (replay) does not carry images"),
        ({"images": {"max_images": 0}}, {}, "images.max_images is 0"),
    ],
)
def test_why_a_vision_model_takes_none(tmp_path: Path, kw: dict[str, Any], config: dict[str, Any], why: str) -> None:
    v = vision_of(settings(**kw), model_dir(tmp_path, **config))
    assert not v.enabled and v.refusal is not None and why in v.refusal


def test_a_text_model_has_no_vision_encoder(tmp_path: Path) -> None:
    v = vision_of(settings(), model_dir(tmp_path, vision=False))
    assert v.refusal == "it has no vision encoder"
    assert vision_of(settings(), tmp_path / "missing").refusal == "it has no vision encoder"
    assert engine_args(settings(), tmp_path) == {}


def test_a_vision_model_with_images_off_loads_no_encoder(tmp_path: Path) -> None:
    assert engine_args(settings(images={"enabled": False}), model_dir(tmp_path)) == {"language_model_only": True}
    # The operator's own choice stands.
    given = settings(images={"enabled": False}, engine_args={"language_model_only": False})
    assert engine_args(given, tmp_path) == {}


def test_the_engines_processor_overrides_are_counted_too() -> None:
    assert spec_of(PREPROCESSOR).max_pixels == 16_777_216
    assert spec_of(PREPROCESSOR, {"max_pixels": 1 << 20}).max_pixels == 1 << 20
    size = {"size": {"shortest_edge": 4096, "longest_edge": 1 << 20}}
    assert spec_of(PREPROCESSOR, size) == VisionSpec(min_pixels=4096, max_pixels=1 << 20)
    assert spec_of({"min_pixels": 100, "max_pixels": 200, "patch_size": 14}) == VisionSpec(
        patch_size=14, min_pixels=100, max_pixels=200
    )
