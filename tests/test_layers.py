"""The package's layers (docs/architecture.md): no module imports a layer above its own, and no modules
import each other (in a ring of any length), at module level, inside a function or for type checking."""

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
    ("nn", "models", "optim", "distributed"),
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


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if p.parent != PKG or p.name != "__init__.py")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_no_import_runs_up(path: Path) -> None:
    module = _module_name(path)
    own = layer_of(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS and docs/architecture.md"
    upward = sorted(
        name for name in _imports(path)
        if name.startswith("kernel_pytorch.") and (layer_of(name) or 0) > own
    )
    assert not upward, f"{module} (layer {LAYERS[own]}) imports from above: {upward}"


def test_layer_lookup() -> None:
    assert LAYERS[layer_of("kernel_pytorch.benchmark.suites.norm")] == ("benchmark.suites",)
    assert LAYERS[layer_of("kernel_pytorch.benchmark.timer")] == ("benchmark",)
    assert layer_of("kernel_pytorch") is None


def import_graph(package: Path = PKG) -> dict[str, set[str]]:
    """module -> the package's modules it imports (every import: module level, in functions, under
    TYPE_CHECKING). `from a.b import c` counts as `a.b.c` when that is a module, else `a.b`. A package's
    `__init__` importing its own children, and a module importing a package above it, are left out."""
    files = {_module_name(f): f for f in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        graph[module] = set()
        for name in _imports(path):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module and not name.startswith(module + ".") and not module.startswith(name + "."):
                graph[module].add(name)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a ring (the graph's strongly
    connected components of more than one module), each sorted, sorted by their first module."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    groups = {tuple(sorted({m} | {n for n in reach[m] if m in reach.get(n, ())})) for m in graph if m in reach[m]}
    return sorted(list(g) for g in groups)


def test_no_import_cycles() -> None:
    cycles = [" <-> ".join(c) for c in import_cycles(import_graph())]
    assert not cycles, "modules that import each other (move the shared piece down):\n" + "\n".join(cycles)


def test_cycle_finder() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "a"}, "f": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["d", "e"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []
    graph = import_graph()
    # an import in a function
    assert "kernel_pytorch.assistant.kernels.profiler" in graph["kernel_pytorch.optimize.compile_steps"]
    assert "kernel_pytorch.validation" in graph["kernel_pytorch.optimize.report"]  # under TYPE_CHECKING
    assert "kernel_pytorch.deploy._quantized" in graph["kernel_pytorch.deploy.loading"]  # `from pkg import module`
    assert "kernel_pytorch.validation.compare" not in graph["kernel_pytorch.validation"]  # a package's own children
