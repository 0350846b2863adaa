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
        name: the input as torch names it in the guard ("x", "args[0]", "kwargs['x']"), when there is one.
        dim: the dimension, for shape causes.
        guard: the failed guard, as torch printed it.
        location: the user line torch attributes the guard to, when it does.
        after_graph_break: the frame is code Dynamo resumes after a graph break.
        variant: the label of the sweep call that recompiled ("batch=4").
        frame: the code name of the frame that recompiled (`forward`, `wrapper`, `loss_function`).
        root: the frame is the component's own entry frame, so the names in its guards are the
            component's inputs; in any other frame (resumed after a graph break, or a function Dynamo
            compiled on its own) they are that frame's locals, which may merely share a name.
    """

    kind: str
    name: str | None
    dim: int | None
    guard: str
    location: Location | None = None
    after_graph_break: bool = False
    variant: str | None = None
    frame: str | None = None
    root: bool = True


_ENTRY = re.compile(r"^\s*\d+/(\d+): ", re.M)
_USER_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')

# (kind, pattern); the first group is the input name, the second (if any) the dim
# names are matched lazily up to the quote before the guard's words, so they may hold quotes themselves:
# tensor 'kwargs['input_ids']' size mismatch ... names `kwargs['input_ids']`
_TENSOR_GUARDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dynamic-dim", re.compile(r"tensor '(.+?)' size mismatch at index (\d+)")),
    ("stride", re.compile(r"tensor '(.+?)' stride mismatch at index (\d+)")),
    ("dtype", re.compile(r"tensor '(.+?)' dtype mismatch")),
    ("device", re.compile(r"tensor '(.+?)' (?:device|dispatch ?key ?set) mismatch", re.I)),
    ("requires-grad", re.compile(r"tensor '(.+?)' requires_grad mismatch")),
    ("rank", re.compile(r"tensor '(.+?)' (?:rank|dim|ndim) mismatch")),
    ("type-change", re.compile(r"expected type of '(.+?)' to be a tensor type")),
    ("container-length", re.compile(r"len\(([^)]+)\) == \d+")),
)


def failed_guard(reason: str) -> str:
    """The guard that failed against the oldest cache entry the reason lists, user stack trimmed.

    Torch 2.13 lists the failure against the newest entry only (older versions one per entry, newest
    first), and a call that hits an entry moves it to the front. The sweep calls the example before
    each variant, so the entry the reason lists is the example's, and the variant differs from the
    example in one thing only: the failed guard names that thing. Where several entries are listed,
    the oldest is the example's; failures against later entries may name earlier changes instead.
    """
    pieces = _ENTRY.split(reason.strip())
    # re.split with a group: [text before the first entry, attempt, block, attempt, block, ...]
    blocks = [(int(pieces[i]), pieces[i + 1]) for i in range(1, len(pieces) - 1, 2)]
    block = min(blocks, key=lambda b: b[0])[1] if blocks else reason
    block = block.strip().split("\nUser stack trace:")[0]
    # torch pads each guard with "   # <source line>  # <file>:<line>"; the location is kept elsewhere
    return "\n".join(re.sub(r"\s{2,}#.*$", "", line).rstrip() for line in block.splitlines()).strip()


# `___check_type_id(s, 94...)`: a value that is no tensor (or was none at the first call) changed its type
_TYPE_ID = re.compile(r"___check_type_id\((.+?), \d+\)")
_SELF = re.compile(r"L\[.self.\]|self\b")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*(?:e-?\d+)?|inf|nan)", re.I)
# `scale == 0.5`, `L['scale'] == 0.5`, `kwargs['scale'] == 0.5`: a Python value specialised as a constant
_EQUALS = re.compile(r"""^\s*([A-Za-z_][\w.\[\]'"]*)\s*==\s*([^\s#]+)""")


def classify_recompile(record: CompileRecord, ctx: AnalysisContext, root_frame: int | None = None) -> Cause:
    """The cause of one recompilation, from the guard text torch recorded for it.

    Args:
        record: the compile.
        ctx: the context (for the types of the inputs a guard names).
        root_frame: Dynamo's index of the component's entry frame in this sweep (the frame of its first
            compile); a record of another frame gets `root=False`. None: every frame counts as the root.
    """
    reason = record.recompile_reason or ""
    guard = failed_guard(reason)
    frame = _USER_FRAME.search(reason)
    loc = location_of(frame.group(1), int(frame.group(2)), frame.group(3)) if frame else None
    root = not record.after_graph_break and (root_frame is None or record.frame in (None, root_frame))
    where = {"variant": record.variant, "frame": record.co_name, "root": root}
    for kind, pattern in _TENSOR_GUARDS:
        m = pattern.search(guard)
        if m:
            dim = int(m.group(2)) if m.lastindex and m.lastindex >= 2 else None
            return Cause(kind, m.group(1), dim, guard, loc, record.after_graph_break, **where)
    if re.search(r"grad_mode|GradMode|grad mode", guard):
        return Cause("grad-mode", None, None, guard, loc, record.after_graph_break, **where)
    m = _TYPE_ID.search(guard)
    # an input (a local, in another frame) whose type changed, say 0.5 then 2 or a tensor; a module
    # attribute's type check stays object identity
    if m and (ctx.resolve_input(m.group(1)) is not None if root else not _SELF.match(m.group(1))):
        return Cause("type-change", m.group(1), None, guard, loc, record.after_graph_break, **where)
    m = _EQUALS.match(guard)
    if m:
        if root:
            key = ctx.resolve_input(m.group(1))
            scalar = key is not None and isinstance(ctx.input_value(key), (int, float))
        else:  # a local of another frame: a number compared with a name that is not an attribute
            scalar = _NUMBER.fullmatch(m.group(2)) is not None and not _SELF.match(m.group(1))
        if scalar:
            return Cause("python-scalar", m.group(1), None, guard, loc, record.after_graph_break, **where)
        return Cause("object-identity", m.group(1), None, guard, loc, record.after_graph_break, **where)
    if re.search(r"___check_obj_id|___check_type_id|ID_MATCH|TYPE_MATCH|id\(", guard):
        return Cause("object-identity", None, None, guard, loc, record.after_graph_break, **where)
    if re.search(r"\bs\d+\b|size\(\)\[\d+\]|\bEq\(|\bNe\(|<=|>=", guard):
        return Cause("shape-guard", None, None, guard, loc, record.after_graph_break, **where)
    return Cause("other", None, None, guard, loc, record.after_graph_break, **where)


# causes that dynamic=True removes: sizes and Python numbers become symbols instead of constants
SHAPE_LIKE = frozenset({"dynamic-dim", "shape-guard", "python-scalar", "container-length"})
