"""Graph breaks: what kind each one is (from torch's reason text and the line it points at), the fix
for that kind, and one entry per distinct break (Dynamo reports some several times).

`readiness` turns them into findings; a frame Dynamo gives up on is classified the same way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from kernel_pytorch.assistant.dynamo import readable
from kernel_pytorch.assistant.findings import Location
from kernel_pytorch.assistant.locate import describe, is_library_file, user_location
from kernel_pytorch.assistant.records import BreakRecord


@dataclass(frozen=True)
class BreakKind:
    """What a graph break is: a short kind name, the operation in words, and the fix for it."""

    kind: str
    operation: str
    fix: str


_FIXES: dict[str, str] = {
    "item": (
        "Keep the value a tensor: use the 0-dim tensor in tensor arithmetic (`x * s` rather than "
        "`x * s.item()`, `torch.clamp` rather than `min()` on a Python number). If the Python number is "
        "really needed, let Dynamo capture it: `torch._dynamo.config.capture_scalar_outputs = True` "
        "before compiling."
    ),
    "tolist": (
        "Keep the values a tensor (index it or use tensor ops instead of a Python list). For integer "
        "tensors `torch._dynamo.config.capture_scalar_outputs = True` lets Dynamo trace `.tolist()`."
    ),
    "data-dependent-branch": (
        "Python `if`/`while` on a tensor's value needs that value on the host. Compute both sides and "
        "select: `y = torch.where(cond, a, b)`; when the branches do different work use "
        "`torch.cond(cond, true_fn, false_fn, (x,))`; or decide outside the model and pass a flag."
    ),
    "print": (
        "Remove the print from forward, or guard it: `if not torch.compiler.is_compiling(): print(...)` "
        "(Dynamo drops the block), or move it into a helper decorated with `@torch.compiler.disable`."
    ),
    "logging": (
        "Remove the logging/warnings call from forward, or guard it with "
        "`if not torch.compiler.is_compiling():`, or move it into a helper decorated with "
        "`@torch.compiler.disable`."
    ),
    "numpy": (
        "Replace the NumPy call with its torch equivalent (torch.interp-style code with "
        "torch.searchsorted, torch.where, torch.sort, torch.histc, ...) so the data stays a tensor on "
        "the device and inside the graph."
    ),
    "dynamic-shape-op": (
        "The output's size depends on the data (nonzero, unique, boolean-mask indexing). Use a "
        "fixed-size formulation (`torch.where(mask, x, 0)` instead of `x[mask]`), or let Dynamo trace "
        "it: `torch._dynamo.config.capture_dynamic_output_shape_ops = True`."
    ),
    "unsupported-builtin": (
        "Dynamo cannot trace this call. Move it out of forward (compute it once in __init__, or pass "
        "its result as an input), replace it with a torch operation, or wrap it in a helper decorated "
        "with `@torch.compiler.disable` so only that helper runs eagerly."
    ),
    "user-break": "Remove the explicit `torch._dynamo.graph_break()` call.",
    "compiler-disabled": (
        "The code calls a function excluded with `torch.compiler.disable`; remove the decorator if the "
        "function is traceable, else keep it out of the hot path."
    ),
    "rnn": (
        "`torch._dynamo.config.allow_rnn = True` before compiling: Dynamo then traces nn.LSTM, nn.GRU "
        "and nn.RNN into the graph (experimental in torch, so compare the outputs once)."
    ),
    "nested-break": (
        "Fix the graph break inside the function this line calls: Dynamo cannot resume in the middle of "
        "an inlined call, so a break in there stops this caller's graph too."
    ),
    "other": (
        "Rewrite the line with torch operations, or move it into a helper decorated with "
        "`@torch.compiler.disable` so only the helper runs eagerly; `TORCH_LOGS=\"graph_breaks\"` prints "
        "Dynamo's full reason with its stack."
    ),
}

_OPERATIONS: dict[str, str] = {
    "item": "Tensor.item() / Python number from a tensor",
    "tolist": "Tensor.tolist()",
    "data-dependent-branch": "`if`/`while` on a tensor value",
    "print": "print()",
    "logging": "logging / warnings call",
    "numpy": "NumPy call",
    "dynamic-shape-op": "operator with a data-dependent output shape",
    "user-break": "torch._dynamo.graph_break()",
    "compiler-disabled": "call of a torch.compiler.disable'd function",
    "rnn": "LSTM/GRU/RNN module (Dynamo traces it only with allow_rnn)",
    "nested-break": "a call whose callee breaks the graph",
    "other": "untraceable operation",
}


_WHY: dict[str, str] = {
    "data-dependent-branch": "Python control flow on a tensor's value: Dynamo cannot know which branch to "
    "trace without the value, so it stops the graph, runs the test eagerly and resumes",
    "item": "A Python number read from a tensor needs the value on the host, so the graph stops there",
    "print": "print() has side effects Dynamo does not trace",
    "nested-break": "A graph break inside a function called from this line: Dynamo cannot resume in the "
    "middle of an inlined call, so the caller stops at this line too",
}

_RNN = re.compile(r"wrap RNN, GRU, or LSTM|allow_rnn", re.I)
RNN = BreakKind("rnn", _OPERATIONS["rnn"], _FIXES["rnn"])


def _first_line(reason: str) -> str:
    return reason.strip().splitlines()[0].strip() if reason.strip() else ""


_CLASS_REPR = re.compile(r"<class '([\w.]+)'>")
_OBJECT_REPR = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def plain(text: str) -> str:
    """`text` with Python's raw reprs named plainly: `<class 'x.Y'>` and `<x.Y object at 0x...>` -> `x.Y`,
    and Dynamo's source names as the user's code spells them (`dynamo.readable`)."""
    return readable(_OBJECT_REPR.sub(r"\1", _CLASS_REPR.sub(r"\1", text)))


def torch_explanation(reason: str) -> tuple[str, list[str]]:
    """(torch's one-line type plus its Explanation, its Hints) from a graph-break reason text."""
    head = _first_line(reason)
    explanation = re.search(r"Explanation:\s*(.+)", reason)
    hints = [plain(h.strip()) for h in re.findall(r"Hint:\s*(.+)", reason)]
    text = head if not explanation else f"{head}: {explanation.group(1).strip()}"
    return plain(text), hints


def classify_break(reason: str, code: str | None) -> BreakKind:
    """The kind of a graph break from torch's reason text and the source line it points at."""
    low = reason.lower()
    line = (code or "").strip()
    builtin = re.search(r"builtin operator `([^`]+)`", reason) or re.search(
        r"trace the (?:python )?builtin `([^`]+?)\.?`", reason, re.I
    )
    name = builtin.group(1) if builtin else None

    def kind(k: str, operation: str | None = None) -> BreakKind:
        return BreakKind(k, operation or _OPERATIONS[k], _FIXES[k])

    if _RNN.search(reason):
        return kind("rnn")
    if low.startswith("step_unsupported"):
        return kind("nested-break")
    if "graph_break()" in low:
        return kind("user-break")
    if "compiler.disable" in low or "disabled function" in low:
        return kind("compiler-disabled")
    if name == "print" or (not name and re.match(r"print\s*\(", line)):
        return kind("print")
    head = _first_line(reason).lower()
    if (
        "logging" in head
        or "logger" in head
        or (name or "").endswith("warnings.warn")
        or re.search(r"\b(log|logger|logging|warnings)\.\w+\(", line)
    ):
        return kind("logging")
    if "tolist" in low:
        return kind("tolist")
    if ".item()" in low or "tensor.item" in low or "_local_scalar_dense" in low or "capture_scalar_outputs" in low:
        return kind("item")
    if (
        "generic_jump" in low
        or "data-dependent branching" in low
        or "data dependent control flow" in low
        or "data-dependent control flow" in low
        or (re.match(r"(if|elif|while)\b", line) and "tensor" in low)
    ):
        return kind("data-dependent-branch")
    if "numpy" in low or "ndarray" in low:
        func = re.search(r"\b(np|numpy)\.([\w.]+)", line)
        return kind("numpy", f"NumPy call `{func.group(0)}`" if func else None)
    if "dynamic shape operator" in low or "capture_dynamic_output_shape_ops" in low:
        op = re.search(r"Operator `([^`]+)`", reason)
        return kind("dynamic-shape-op", f"`{op.group(1)}` (output shape depends on data)" if op else None)
    if name or "marked as skipped" in low or "builtin" in low:
        return kind("unsupported-builtin", f"`{name}`" if name else "unsupported builtin")
    _, hints = torch_explanation(reason)
    other = kind("other", _first_line(reason) or None)
    # torch's own hint, where it gives one, is the most precise fix for a kind we do not know
    return BreakKind(other.kind, other.operation, hints[0]) if hints else other


_LOGGER_METHOD = re.compile(r"method: <Logger [^>]*>\.(\w+)")


def library_fix(kind: BreakKind, reason: str, location: Location | None) -> str | None:
    """The fix for a break inside a library's code, which the user cannot edit: the setting that
    makes Dynamo skip a library's logging call; None when the kind's own fix applies."""
    if location is None or not is_library_file(location.file) or kind.kind != "logging":
        return None
    method = _LOGGER_METHOD.search(reason)
    target = f"logging.Logger.{method.group(1)}" if method else "warnings.warn" if "warn" in reason else None
    if target is None:
        return None
    fix = (
        f"The call is in library code ({describe(location)}), not yours: "
        f"`torch._dynamo.config.ignore_logging_functions.add({target})` before compiling makes Dynamo "
        "skip it (the message is then not logged under torch.compile)."
    )
    if "loss_type=" in reason:  # transformers' PreTrainedModel.loss_function, loss_type unset
        fix += ' Here `model.loss_type = "ForCausalLM"` also removes it: transformers logs only an unset loss type.'
    return fix


@dataclass(frozen=True)
class Break:
    """One distinct graph break: its kind, where (with `via` inside a library), torch's words, how many
    call paths reach it, and the callers it also stops (their breaks merged into this one)."""

    kind: BreakKind
    location: Location | None
    explanation: str
    hints: tuple[str, ...]
    count: int
    reason: str = ""
    callers: tuple[Location, ...] = ()


_Stack = tuple[tuple[str, int | None], ...]


def dedupe_breaks(records: Sequence[BreakRecord], model: nn.Module | None = None) -> list[Break]:
    """One entry per (kind, file, line), in first-seen order, counting the distinct call paths to it.

    Dynamo may record one break several times (it restarts the frame's analysis after a break); the
    same stack counts once, the same line reached from two call sites counts twice. A caller stopped by
    a break inside a function it inlined (`step_unsupported`) is merged into that break.

    Args:
        records: the trace's breaks, each with its user stack (outermost frame first).
        model: the model under analysis, for `via` on breaks inside a library (see `user_location`).
    """
    merged: dict[tuple[str, str, int], Break] = {}
    stacks: dict[tuple[str, str, int], set[_Stack]] = {}
    nested: list[tuple[_Stack, Location | None]] = []
    for rec in records:
        loc = user_location(list(rec.frames), model)
        kind = classify_break(rec.reason, loc.code if loc else None)
        stack = tuple((fr.filename, fr.lineno) for fr in rec.frames)
        if kind.kind == "nested-break":
            nested.append((stack, loc))
        key = (kind.kind, loc.file if loc else "", loc.line if loc else -1)
        stacks.setdefault(key, set()).add(stack)
        if key not in merged:
            explanation, hints = torch_explanation(rec.reason)
            if "Explanation:" not in rec.reason and kind.kind in _WHY:
                # older torch messages name only the bytecode ("generic_jump ..."); say what it means
                explanation = f"{_WHY[kind.kind]} (torch: {explanation})"
            merged[key] = Break(kind, loc, explanation, tuple(hints), 0, rec.reason)
    callers: dict[tuple[str, str, int], list[Location]] = {}
    for stack, loc in nested:
        deeper = next(
            (k for k, ss in stacks.items() if k[0] != "nested-break" and any(_extends(s, stack) for s in ss)), None
        )
        if deeper is not None and loc is not None:
            if loc not in callers.setdefault(deeper, []):
                callers[deeper].append(loc)
            merged.pop(("nested-break", loc.file, loc.line), None)
    return [
        dataclasses.replace(b, count=_call_sites(stacks[key]), callers=tuple(callers.get(key, ())))
        for key, b in merged.items()
    ]


def _extends(longer: _Stack, stack: _Stack) -> bool:
    """True when `longer` runs through every frame of `stack`, in order, and goes deeper."""
    n = len(stack)
    return len(longer) > n and any(longer[i : i + n] == stack for i in range(len(longer) - n))


def _call_sites(stacks: set[_Stack]) -> int:
    """Distinct stacks, not counting one that is the tail of a longer one (Dynamo re-reports a break
    from the resumed inner frame with only that frame on its stack)."""
    return sum(1 for s in stacks if not any(len(o) > len(s) and o[len(o) - len(s) :] == s for o in stacks))
