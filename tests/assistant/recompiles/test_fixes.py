"""Recompile fixes: inputs that share a dim marked together, keyword and nested inputs fixed like
positional ones, guards of other frames kept off the model's inputs, and a fix that did not verify
replaced by the reason (never printed as the fix)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.findings import Finding
from kernel_pytorch.assistant.recompiles.fixes import explain_guard
from kernel_pytorch.assistant.recompiles.recompiles import analyze_recompilations


def _analyze(model: nn.Module, args: tuple = (), kwargs: dict | None = None, **options: Any) -> list[Finding]:
    options.setdefault("shapes", {"batch": (4,)})
    ctx = AnalysisContext(model, args, kwargs, options=AnalysisOptions(measure_compile_time=False, **options))
    return analyze_recompilations(ctx)


def _causes(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.id not in ("recompile.summary", "recompile.limit")]


def _summary(findings: list[Finding]) -> Finding:
    (summary,) = [f for f in findings if f.id == "recompile.summary"]
    return summary


class Head(nn.Module):
    """Logits and targets share the batch dim."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)

    def forward(self, x: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(self.proj(x), targets)


def test_inputs_sharing_the_batch_are_marked_together() -> None:
    findings = _analyze(Head(), (torch.randn(2, 8), torch.randint(0, 4, (2,))))
    summary = _summary(findings)
    assert summary.data["fix"] == "torch._dynamo.mark_dynamic(x, 0); torch._dynamo.mark_dynamic(targets, 0)"
    assert summary.data["recompiles_after"] == 0
    (cause,) = _causes(findings)
    assert cause.title == "Recompiles when batch (dim 0) of `x`, `targets` changes"
    assert cause.data["inputs"] == ["x", "targets"] and cause.data["recompiles_after"] == 0
    assert "mark_dynamic(x, 0); torch._dynamo.mark_dynamic(targets, 0)" in cause.suggestion


def _returns_dict(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        return {"out": fn(self, *args, **kwargs)}

    return wrapper


class WrappedHead(Head):
    """`Head` behind a (*args, **kwargs) decorator, like transformers' `can_return_tuple`."""

    @_returns_dict
    def forward(self, x: Tensor, targets: Tensor, scale: float = 1.0) -> Tensor:
        return F.cross_entropy(self.proj(x), targets) * scale


def test_keyword_inputs_behind_a_wrapper_are_fixed_like_positional_ones() -> None:
    kwargs = {"x": torch.randn(2, 8), "targets": torch.randint(0, 4, (2,)), "scale": 0.5}
    findings = _analyze(WrappedHead(), kwargs=kwargs)
    by_kind = {f.data["kind"]: f for f in _causes(findings)}
    assert set(by_kind) == {"dynamic-dim", "python-scalar"}
    dim = by_kind["dynamic-dim"]
    assert "kwargs['" in dim.data["guard"] and dim.data["inputs"] == ["x", "targets"]
    assert dim.data["recompiles_after"] == 0
    scalar = by_kind["python-scalar"]
    assert scalar.data["input"] == "scale" and scalar.data["recompiles_after"] == 0
    assert "scale=torch.tensor(scale)" in scalar.suggestion
    assert _summary(findings).data["recompiles_after"] == 0


@dataclasses.dataclass
class Batch:
    x: Tensor
    mask: Tensor


class DataclassInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, batch: Batch) -> Tensor:
        return (self.proj(batch.x) * batch.mask).sum(-1)


def test_tensors_inside_a_dataclass_argument_are_swept_and_named() -> None:
    batch = Batch(torch.randn(2, 8), torch.ones(2, 1))
    findings = _analyze(DataclassInput(), (batch,))
    (cause,) = _causes(findings)
    assert cause.data["inputs"] == ["batch.x", "batch.mask"] and cause.data["recompiles_after"] == 0
    assert "torch._dynamo.mark_dynamic(batch.x, 0)" in cause.suggestion
    assert not getattr(batch.x, "_dynamo_dynamic_indices", None)  # the example stays unmarked


def _loss(logits: Tensor, labels: Tensor) -> Tensor:
    torch._dynamo.graph_break()
    return F.cross_entropy(logits, labels)


class InnerLoss(Head):
    """The loss runs in frames of its own (a graph break inside it), whose local `labels` shares the
    name of the model's input."""

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        return _loss(self.proj(x), labels)


def test_a_guard_of_another_frame_is_not_the_input_of_the_same_name() -> None:
    findings = _analyze(InnerLoss(), (torch.randn(2, 8), torch.randint(0, 4, (2,))))
    inner = [f for f in _causes(findings) if "frame" in f.data]
    assert inner, [f.title for f in findings]
    assert all(f.data["input"] == "labels" and "(a value live across a graph break)" in f.title for f in inner)
    assert all("dynamic=True" in f.suggestion for f in inner)
    assert _summary(findings).data["recompiles_after"] == 0


class SizeBranch(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        if x.shape[0] == 2:  # the code needs the exact batch size: nothing makes it dynamic
            return x * 2
        return x * 3


@contextlib.contextmanager
def _torch_log_records() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    names = ["torch._guards", "torch._dynamo", "torch.fx.experimental.symbolic_shapes"]
    for name in names:
        logging.getLogger(name).addHandler(handler)
    try:
        yield records
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)


def test_a_fix_that_failed_is_not_the_fix_and_says_why_quietly() -> None:
    with _torch_log_records() as records:
        findings = _analyze(SizeBranch(), (torch.randn(2, 8),))
    assert not [r.getMessage() for r in records]  # no ConstraintViolationError dump
    summary = _summary(findings)
    assert summary.data["recompiles_after"] is None
    assert "ConstraintViolationError" in summary.data["attempts"]["targeted"]["errors"][0]
    assert "specialises that size to the constant 2" in summary.evidence
    (cause,) = _causes(findings)
    assert "recompiles_after" not in cause.data and "mark_dynamic(" not in cause.suggestion
    assert "constant 2" in cause.data["unverified_reason"] and "a branch on it" in cause.data["unverified_reason"]
    assert "TORCH_LOGS" in cause.suggestion


class Attention(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def test_duck_sizing_under_dynamic_true_is_named_and_verified() -> None:
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))  # batch == heads == 2: one symbol under dynamic=True
    findings = _analyze(Attention(), (q, k, v), dynamic=True)
    (cause,) = _causes(findings)
    assert cause.data["kind"] == "shape-guard" and "duck sizing" in cause.title
    assert cause.data["recompiles_after"] == 0
    assert "use_duck_shape = False" in _summary(findings).data["fix"]


def test_a_remaining_guard_is_explained_with_what_would_remove_it() -> None:
    ctx = AnalysisContext(SizeBranch(), (torch.randn(2, 8),))
    bounded = explain_guard("2 <= L['x'].size()[0] <= 15", ctx)
    assert "bounds dim 0 of `x` to 2..15" in bounded and "mark_dynamic(x, 0, min=2, max=15)" in bounded
    assert "duck sizing" in explain_guard("L['x'].size()[1] == L['x'].size()[0]", ctx)
    assert "needs it exactly" in explain_guard("tensor 'x' size mismatch at index 0", ctx, dynamic=True)
    assert explain_guard("___odd_guard()", ctx).startswith("no fix found")
