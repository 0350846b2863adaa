"""The package's layers (docs/architecture.md): no module imports a layer above its own, at module level
or inside a function."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmark.test_layering import PKG, _imports

# Bottom to top. A module may import its own layer and the layers below it. The benchmark package is
# two layers: its measurement tools sit below the analyser and validation, its suites above them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_env", "_tree", "_errors", "tolerances"),
    ("reference",),
    ("ops",),
    ("functional",),
    ("nn", "models", "optim"),
    ("benchmark",),
    ("assistant",),
    ("validation",),
    ("benchmark.suites",),
    ("optimize",),
    ("deploy",),
    ("cli",),
)


def layer_of(module: str) -> int | None:
    """The layer index of a `kernel_pytorch.*` module (the longest matching prefix), None for the root."""
    rel = module.removeprefix("kernel_pytorch").lstrip(".")
    best: tuple[int, int] | None = None
    for index, names in enumerate(LAYERS):
        for name in names:
            if rel == name or rel.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (index, len(name))
    return best[0] if best else None


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if p.parent != PKG or p.name != "__init__.py")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_runs_up(path: Path) -> None:
    module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
    own = layer_of(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    upward = sorted(
        name for name in _imports(path)
        if name.startswith("kernel_pytorch.") and (layer_of(name) or 0) > own
    )
    assert not upward, f"{module} (layer {LAYERS[own]}) imports from above: {upward}"


def test_layer_lookup() -> None:
    assert LAYERS[layer_of("kernel_pytorch.benchmark.suites.norms")] == ("benchmark.suites",)
    assert LAYERS[layer_of("kernel_pytorch.benchmark.timer")] == ("benchmark",)
    assert layer_of("kernel_pytorch") is None
