"""No module-level tuning state: launch knobs live in the families' frozen configs (ops/tuning.py), and
nothing outside src/ tunes a kernel by assigning a module attribute."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "src" / "kernel_pytorch" / "ops"

# module-level literals in ops/ that are not launch knobs, each with why
CONSTANTS = {
    "CALL_KEYS": "the direct launcher's cache size, a memory bound, not a launch choice",
    "MAX_PLANS": "the plan cache's size, a memory bound",
    "_MAX_TABLES": "the block-table cache's size, a memory bound",
    "_BLOCK_D": "sum_partials' column block: fixes the summation order, so bitwise determinism, not tuned",
    "_BLOCK_P": "sum_partials' row chunk: fixes the summation order, as _BLOCK_D",
    "_TL_DTYPES": "the torch -> Triton dtype table",
}

# module attributes outside ops/ that tests replace, none of them a kernel's launch knob, each with why
NOT_TUNING = {
    "STEPS": "the analyser's list of analyses: a test adds one that raises",
    "GATE_MAX_ELEMENTS": "the benchmark gate's sample size: tests shrink it to small shapes",
    "RTOL_ROWS": "the quantization tolerance's row block: a test checks the blocked sum equals the whole",
    "COMPILED_BUILD": "which devices build document masks compiled: tests take the CPU through that path",
}


def _literal(node: ast.expr) -> bool:
    """A bare number, string, bool or None, or a dict/list/set display: the shapes tuning globals took."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return True
    if isinstance(node, ast.BinOp):
        return _literal(node.left) and _literal(node.right)
    return isinstance(node, (ast.Dict, ast.List, ast.Set))


def test_no_tuning_literals_in_ops() -> None:
    found = []
    for path in sorted(OPS.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets, value = [], None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            for target in targets:
                name = getattr(target, "id", "")
                upper = re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name)
                cache = isinstance(value, ast.Dict) and not value.keys  # an empty dict: a cache, keyed on configs
                if upper and value is not None and _literal(value) and not cache and name not in CONSTANTS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert not found, "module-level launch knobs outside the tuning configs:\n" + "\n".join(found)


_ASSIGN = re.compile(r"^\s*[A-Za-z_][\w.]*\.[A-Z][A-Z0-9_]+\s*=[^=]")
_PATCH = re.compile(r"monkeypatch\.setattr\([^,]+,\s*[\"'][A-Z][A-Z0-9_]+[\"']")


def test_nothing_tunes_by_assigning_a_module_attribute() -> None:
    found = []
    for top in ("tests", "benchmarks", "scripts", "src"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                hit = _ASSIGN.match(line) or _PATCH.search(line)
                if hit and not any(f'"{name}"' in line or f".{name} " in line for name in NOT_TUNING):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "tuning by module attribute (use kernel_pytorch.ops.tuning.override):\n" + "\n".join(found)


MAX_LAUNCHER_PARAMETERS = 8
_LAUNCHER = re.compile(r"launch|_launch\w*|plan|build_plan|\w+_plan")


def _parameters(fn: ast.FunctionDef) -> int:
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def test_launchers_take_records_not_long_argument_lists() -> None:
    """The internal launchers and launch planners of ops/ (`launch`, `_launch*`, `plan`, `build_plan`,
    `*_plan`) take at most MAX_LAUNCHER_PARAMETERS parameters: a call's tensors, sizes and flags travel
    as one record (rope's call.py, quant_matmul's Operands, gated_act's Streams), not a long positional
    list where two swapped ints of the same type go unnoticed. Registered ops' entry points keep their
    schema's arguments and are not launchers by this rule."""
    found = []
    for path in sorted(OPS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and _LAUNCHER.fullmatch(node.name):
                if _parameters(node) > MAX_LAUNCHER_PARAMETERS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {_parameters(node)}")
    assert not found, f"launchers over {MAX_LAUNCHER_PARAMETERS} parameters:\n" + "\n".join(found)
