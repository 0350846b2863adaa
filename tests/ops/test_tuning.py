"""The tuning registry: overrides nest, end with their block, reach every thread, and reject bad input."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from kernel_pytorch.ops import tuning


@dataclasses.dataclass(frozen=True)
class _Knobs:
    block: int = 1024
    schedule: str = "flat"


@dataclasses.dataclass
class _Mutable:
    block: int = 1


@pytest.fixture
def family():
    name = "test_family_knobs"
    tuning.register(name, _Knobs())
    yield name
    tuning._DEFAULTS.pop(name, None)


def test_override_nests_and_ends_with_its_block(family):
    assert tuning.current(family) == _Knobs()
    with tuning.changed(family, block=256):
        assert tuning.current(family).block == 256
        with tuning.override(**{family: _Knobs(block=64, schedule="tile")}):
            assert tuning.current(family) == _Knobs(64, "tile")
        assert tuning.current(family) == _Knobs(256, "flat")
    assert tuning.current(family) == _Knobs()


def test_override_ends_on_error(family):
    with pytest.raises(RuntimeError), tuning.changed(family, block=8):
        raise RuntimeError("boom")
    assert tuning.current(family).block == 1024


def test_override_reaches_every_thread(family):
    # process-wide, as the module constants were: a CUDA backward runs on the engine's own threads
    seen = []
    with tuning.changed(family, block=32):
        t = threading.Thread(target=lambda: seen.append(tuning.current(family).block))
        t.start()
        t.join()
    assert seen == [32] and tuning.current(family).block == 1024


def test_bad_input_is_named(family):
    with pytest.raises(ValueError, match="unknown tuning family 'nope'"):
        tuning.current("nope")
    with pytest.raises(TypeError, match="needs a _Knobs"):
        with tuning.override(**{family: _Mutable()}):
            pass
    with pytest.raises(TypeError, match="unexpected keyword|no field"):
        with tuning.changed(family, blokc=3):
            pass
    with pytest.raises(TypeError, match="frozen"):
        tuning.register("test_mutable", _Mutable())
    with pytest.raises(ValueError, match="already has"):
        tuning.register(family, _Knobs(block=2))
