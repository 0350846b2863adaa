"""What `optimize()` returns beside the model: every change it made, kept or reverted, every module a
rule recognised and left alone, every graph rewrite (`rewrite=`) at its source line, the modules holding
sharded parameters (left as they are, not offered to the rules), the compile steps, and the final
validation. Printable as text (`str(report)`) and JSON-able (`report.to_dict()`, `report.to_json()`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kernel_pytorch._tree import Recorded

if TYPE_CHECKING:
    from kernel_pytorch.validation import ValidationResult

Status = Literal["applied", "reverted", "skipped"]

# Why a model's modules holding sharded parameters are left as they are (optimize/swap.py's docstring)
SHARDED_REASON = (
    "already sharded (fully_shard, FSDP) or parallelized (parallelize_module): FSDP puts the unsharded "
    "parameters on these module objects for each forward and backward, and a tensor-parallel plan's hooks sit "
    "on them, so a new module would compute with the shards or skip the plan; call kernel_pytorch.optimize() "
    "before sharding")


def _paths(paths: list[str]) -> str:
    return ", ".join(paths[:4]) + (f", ... ({len(paths)} in all)" if len(paths) > 4 else "")


@dataclass
class Change(Recorded):
    """One module a rule looked at: `path` in the model ("model.layers.0.input_layernorm"), the rule,
    the classes before and after, and what became of it (`status`) and why (`reason`, `detail`)."""

    path: str
    rule: str
    family: str
    before: str
    after: str | None
    status: Status
    reason: str
    detail: str = ""  # for a revert: the validation failure that caused it


@dataclass
class Rewrite(Recorded):
    """One graph rewrite: pattern `kind` ("rms-norm", "gated-act") at `location` ("file.py:12", the line
    the analyser's finding names) in the forward of the module at `path`, `count` matches there, replaced
    by `after`; what became of it (`status`) and why (`reason`, `detail`)."""

    path: str
    kind: str
    family: str
    module: str
    after: str
    location: str
    count: int
    status: Status
    reason: str
    detail: str = ""  # for a revert: the validation failure that caused it


@dataclass
class CompileStep(Recorded):
    """One compile-side fix (regional, mark_dynamic, channels_last, cuda_graphs, tf32): applied, reverted or skipped,
    with the measurement that decided it (None when nothing was measured, and `reason` says so)."""

    name: str
    status: Status
    reason: str
    measured: dict[str, float] | None = None


@dataclass
class OptimizeReport:
    """Everything `optimize()` did. `changes` holds one entry per module a rule matched."""

    changes: list[Change] = field(default_factory=list)
    compile_steps: list[CompileStep] = field(default_factory=list)
    validation: ValidationResult | None = None
    validated: bool = False
    # input name -> dims kept dynamic by the mark_dynamic step; `kernel_pytorch.save` writes them as
    # the manifest's dynamic_dims
    dynamic_dims: dict[str, list[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # paths of the modules holding sharded parameters of their own (DTensors, or under FSDP; "" for the model
    # itself): not offered to the rules, left as they are for SHARDED_REASON
    sharded: list[str] = field(default_factory=list)
    # graph rewrites (`optimize(rewrite=...)`), kept and reverted
    rewrites: list[Rewrite] = field(default_factory=list)

    def applied(self) -> list[Change]:
        return [c for c in self.changes if c.status == "applied"]

    def reverted(self) -> list[Change]:
        return [c for c in self.changes if c.status == "reverted"]

    def skipped(self) -> list[Change]:
        return [c for c in self.changes if c.status == "skipped"]

    def counts(self) -> dict[str, int]:
        """rule -> number of modules it replaced (kept changes only)."""
        out: dict[str, int] = {}
        for c in self.applied():
            out[c.rule] = out.get(c.rule, 0) + 1
        return out

    @property
    def passed(self) -> bool:
        """True when the returned model passed validation (or nothing needed validating)."""
        return self.validation is None or self.validation.passed

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": len(self.applied()),
            "reverted": len(self.reverted()),
            "skipped": len(self.skipped()),
            "sharded": list(self.sharded),
            "counts": self.counts(),
            "changes": [c.to_dict() for c in self.changes],
            "rewrites": [r.to_dict() for r in self.rewrites],
            "compile": [s.to_dict() for s in self.compile_steps],
            "dynamic_dims": {k: list(v) for k, v in self.dynamic_dims.items()},
            "validated": self.validated,
            "passed": self.passed,
            "validation": self.validation.to_dict() if self.validation is not None else None,
            "notes": list(self.notes),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def summary(self, validation: bool = True) -> str:
        """The report as text: kept changes grouped by rule, reverts and skips with their reasons,
        compile steps, notes, and (with `validation`) the validation summary."""
        lines = [f"optimize: {len(self.applied())} modules replaced, {len(self.reverted())} reverted, "
                 f"{len(self.skipped()) + len(self.sharded)} left alone"]
        if self.rewrites:
            kept = sum(r.status == "applied" for r in self.rewrites)
            lines[0] += f"; {kept} rewrites kept, {len(self.rewrites) - kept} reverted"
        groups: dict[tuple[str, str], list[str]] = {}
        for c in self.applied():
            groups.setdefault((c.rule, c.reason), []).append(c.path)
        for (rule, reason), paths in groups.items():
            lines.append(f"  [{rule}] {reason}: {_paths(paths)}")
        for c in self.reverted():
            lines.append(f"  REVERTED [{c.rule}] {c.path} ({c.before}): {c.detail or c.reason}")
        alone: dict[tuple[str, str], list[str]] = {}
        for c in self.skipped():
            alone.setdefault((c.rule, c.reason), []).append(c.path)
        for (rule, reason), paths in alone.items():
            lines.append(f"  left alone [{rule}] {reason}: {_paths(paths)}")
        if self.sharded:
            paths = [p or "the model itself" for p in self.sharded]
            lines.append(f"  left alone [sharded] {SHARDED_REASON}: {_paths(paths)}")
        for r in self.rewrites:
            times = f" ({r.count} matches)" if r.count > 1 else ""
            at = f"{r.location} in `{r.path or r.module}`"
            if r.status == "applied":
                lines.append(f"  rewrite [{r.kind}] {at}{times}: -> {r.after}")
            else:
                lines.append(f"  REVERTED rewrite [{r.kind}] {at}: {r.detail or r.reason}")
        for s in self.compile_steps:
            measured = ""
            if s.measured:
                measured = " (" + ", ".join(f"{k} {v:.4g}" for k, v in s.measured.items()) + ")"
            lines.append(f"  compile {s.name}: {s.status}: {s.reason}{measured}")
        if self.dynamic_dims:
            lines.append("  dynamic dims: " + ", ".join(f"{k} {v}" for k, v in self.dynamic_dims.items()))
        lines += [f"  note: {n}" for n in self.notes]
        kept = any(r.status == "applied" for r in (*self.rewrites, *self.compile_steps))
        if not self.validated and not (self.applied() or kept):
            lines.append("  validation: not run: nothing was changed")
        elif not self.validated:
            lines.append("  validation: not run (validate=False): the changes are unchecked")
        elif validation and self.validation is not None:
            lines.append("validation of the returned model against the original:")
            lines.append(self.validation.summary())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


__all__ = ["SHARDED_REASON", "Change", "CompileStep", "OptimizeReport", "Rewrite", "Status"]
