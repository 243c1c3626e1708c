"""gateway/app.py's ENGINES: every engine kind a model's settings may name has its builder."""

from __future__ import annotations

import typing

from gateway.app import ENGINES, build_engine
from gateway.settings import ModelSettings, load_settings
from tests.conftest import ROOT


def test_every_engine_kind_has_a_builder() -> None:
    assert set(ENGINES) == set(typing.get_args(ModelSettings.model_fields["engine"].annotation))


def test_a_model_gets_the_engine_its_kind_names() -> None:
    from engine_adapter.replay import ReplayEngine
    from engine_adapter.simulated import SimulatedEngine

    replay = load_settings(ROOT / "config/replay.yaml")
    assert all(isinstance(build_engine(replay, m), ReplayEngine) for m in replay.models)
    sim = load_settings(ROOT / "config/sim-dgx-spark.yaml")
    assert all(isinstance(build_engine(sim, m), SimulatedEngine) for m in sim.models)
