"""Recompile causes: which change made Dynamo compile a frame again, read from the guard torch
recorded as failed (its kind, the input and dim it names, the user line it points at)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.findings import Location
from kernel_pytorch.assistant.locate import location_of
from kernel_pytorch.assistant.records import CompileRecord


@dataclass(frozen=True)
class Cause:
    """Why one recompilation happened.

    Attributes:
        kind: "dynamic-dim", "python-scalar", "dtype", "device", "requires-grad", "grad-mode",
            "type-change", "stride", "rank", "container-length", "shape-guard", "object-identity" or
            "other".
        name: the input as torch names it in the guard ("x", "args[0]"), when there is one.
        dim: the dimension, for shape causes.
        guard: the failed guard, as torch printed it.
        location: the user line torch attributes the guard to, when it does.
    """

    kind: str
    name: str | None
    dim: int | None
    guard: str
    location: Location | None = None
    after_graph_break: bool = False


_ENTRY = re.compile(r"^\s*\d+/(\d+): ", re.M)
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')

# (kind, pattern); the first group is the input name, the second (if any) the dim
_TENSOR_GUARDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dynamic-dim", re.compile(r"tensor '([^']+)' size mismatch at index (\d+)")),
    ("stride", re.compile(r"tensor '([^']+)' stride mismatch at index (\d+)")),
    ("dtype", re.compile(r"tensor '([^']+)' dtype mismatch")),
    ("device", re.compile(r"tensor '([^']+)' (?:device|dispatch ?key ?set) mismatch", re.I)),
    ("requires-grad", re.compile(r"tensor '([^']+)' requires_grad mismatch")),
    ("rank", re.compile(r"tensor '([^']+)' (?:rank|dim|ndim) mismatch")),
    ("type-change", re.compile(r"expected type of '([^']+)' to be a tensor type")),
    ("container-length", re.compile(r"len\(([^)]+)\) == \d+")),
)


def failed_guard(reason: str) -> str:
    """The guard that failed against the frame's first compile ("N/0"), user stack trimmed.

    Torch lists one failed guard per cached entry, newest first. Each sweep call differs from the
    example in one thing only, so the failure against the first entry, compiled for the example,
    names that thing; failures against later entries may name earlier changes instead.
    """
    pieces = _ENTRY.split(reason.strip())
    # re.split with a group: [text before the first entry, attempt, block, attempt, block, ...]
    blocks = [(int(pieces[i]), pieces[i + 1]) for i in range(1, len(pieces) - 1, 2)]
    block = min(blocks, key=lambda b: b[0])[1] if blocks else reason
    block = block.strip().split("\nUser stack trace:")[0]
    # torch pads each guard with "   # <source line>  # <file>:<line>"; the location is kept elsewhere
    return "\n".join(re.sub(r"\s{2,}#.*$", "", line).rstrip() for line in block.splitlines()).strip()


def classify_recompile(record: CompileRecord, ctx: AnalysisContext) -> Cause:
    """The cause of one recompilation, from the guard text torch recorded for it."""
    reason = record.recompile_reason or ""
    guard = failed_guard(reason)
    frame = _USER_FRAME.search(reason)
    loc = location_of(frame.group(1), int(frame.group(2)), frame.group(3)) if frame else None
    for kind, pattern in _TENSOR_GUARDS:
        m = pattern.search(guard)
        if m:
            dim = int(m.group(2)) if m.lastindex and m.lastindex >= 2 else None
            return Cause(kind, m.group(1), dim, guard, loc, record.after_graph_break)
    if re.search(r"grad_mode|GradMode|grad mode", guard):
        return Cause("grad-mode", None, None, guard, loc)
    # `scale == 0.5` or `L['scale'] == 0.5`: a Python value specialised as a constant
    m = re.match(r"^\s*((?:L\['[^']+'\])|[A-Za-z_][\w.\[\]']*)\s*==\s*([^\s#]+)", guard)
    if m:
        key = ctx.resolve_input(m.group(1))
        if key is not None and isinstance(ctx.input_value(key), (int, float)):
            return Cause("python-scalar", m.group(1), None, guard, loc)
        return Cause("object-identity", m.group(1), None, guard, loc)
    if re.search(r"___check_obj_id|___check_type_id|ID_MATCH|TYPE_MATCH|id\(", guard):
        return Cause("object-identity", None, None, guard, loc)
    if re.search(r"\bs\d+\b|size\(\)\[\d+\]|\bEq\(|\bNe\(|<=|>=", guard):
        return Cause("shape-guard", None, None, guard, loc)
    return Cause("other", None, None, guard, loc)


# causes that dynamic=True removes: sizes and Python numbers become symbols instead of constants
SHAPE_LIKE = frozenset({"dynamic-dim", "shape-guard", "python-scalar", "container-length"})
