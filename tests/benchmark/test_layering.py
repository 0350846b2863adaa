"""No import runs back up: the measurement tools never import validation; validation never imports the
suites; `import kernel_pytorch.benchmark` loads neither the suites nor their runner."""

from __future__ import annotations

import ast
from pathlib import Path

import kernel_pytorch

PKG = Path(kernel_pytorch.__file__).resolve().parent
BENCHMARK = PKG / "benchmark"
SUITES = BENCHMARK / "suites"


def _import_nodes(tree: ast.Module, top_level: bool) -> list[ast.Import | ast.ImportFrom]:
    if not top_level:
        return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    found, todo = [], list(tree.body)
    while todo:  # module-level statements, including those under if/try, not function bodies
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
    return found


def _imports(path: Path, top_level: bool = False) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved); with `top_level`
    only those that run when it is imported."""
    package = ".".join(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path)), top_level):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}
    return names


def _module_file(name: str) -> Path | None:
    rel = Path(*name.split(".")[1:])
    for f in (PKG / rel / "__init__.py", (PKG / rel).with_suffix(".py")):
        if f.is_file():
            return f
    return None


def _importers(files: list[Path], target: str) -> list[str]:
    return [str(f.relative_to(PKG)) for f in files
            if any(n == target or n.startswith(target + ".") for n in _imports(f))]


def test_measurement_tools_never_import_validation() -> None:
    tools = [f for f in BENCHMARK.rglob("*.py") if SUITES not in f.parents]
    assert {f.name for f in tools} >= {"timer.py", "ceilings.py", "memory.py", "results.py", "module.py", "plots.py"}
    assert _importers(tools, "kernel_pytorch.validation") == []
    # the check itself sees imports: the runner (above validation) does import it
    assert _importers([SUITES / "runner.py", SUITES / "gate.py"], "kernel_pytorch.validation")


def test_validation_never_imports_the_suites() -> None:
    assert _importers(list((PKG / "validation").rglob("*.py")), "kernel_pytorch.benchmark.suites") == []


def test_importing_benchmark_loads_no_suite() -> None:
    # follow what `import kernel_pytorch.benchmark` runs, through the benchmark package's own modules
    seen: set[str] = set()
    todo = ["kernel_pytorch.benchmark"]
    while todo:
        name = todo.pop()
        f = _module_file(name)
        if name in seen or f is None or not name.startswith("kernel_pytorch.benchmark"):
            continue
        seen.add(name)
        todo += sorted(_imports(f, top_level=True))
    assert {"kernel_pytorch.benchmark.timer", "kernel_pytorch.benchmark.module"} <= seen
    assert not [n for n in seen if n.startswith("kernel_pytorch.benchmark.suites")]
