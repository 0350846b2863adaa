"""Export an (optimized) model: a `torch.export` program and an AOTInductor package.

    model, report = kernel_pytorch.optimize(model, (ids,))
    program = export(model, (ids,))             # kernel_pytorch::* nodes, batch/seq dims dynamic
    torch.export.save(program, "model.pt2")
    path = aoti_package(program, (ids,), "model_aoti.pt2")
    runner = load_package(path)                 # in another process too; runner(ids) -> logits

Our kernels are registered torch ops, so the exported graph holds them as `kernel_pytorch::*` nodes
and a loader must have them registered: `load_program` and `load_package` import `kernel_pytorch.ops`
first. On CUDA an AOTInductor package carries our Triton kernels compiled in; on the CPU the ops'
bodies run their reference math, so the package holds C++ code only.

Dynamic dims. `dynamic="auto"` makes the batch and sequence dims dynamic as the analyser sees them:
the dims its recompile findings name (`findings=`, from `CompilerOptimizationAssistant`), else the
dims it infers as batch and sequence from the inputs (`assistant.inputs.infer_input_dims`, the same
dims its shape sweep varies and its mark_dynamic fixes mark). Each becomes `Dim.AUTO`, so a dim the
model specialises (a fixed position table, a size-1 example) stays static instead of failing the
export. A dict `{input: {dim: name}}` (input a position or keyword) marks exactly those dims, and
dims given the same name share one symbol; `None` exports static shapes.

Every export is checked against eager on fresh inputs: other values and, for each dynamic dim,
another size (the example's plus one, within the program's range), compared with the tolerance table.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from kernel_pytorch._tree import as_inputs, flatten, split_inputs
from kernel_pytorch.tolerances import Comparison, compare_reordered

log = logging.getLogger(__name__)

# {input (position or keyword): {dim: name}}; dims of the same name share one symbol
DynamicDims = Mapping[int | str, Mapping[int, str]]
Dynamic = Literal["auto"] | DynamicDims | None

OP_NAMESPACE = "kernel_pytorch"


class ExportMismatch(AssertionError):
    """The exported program does not match the eager model on fresh inputs."""


def _from_findings(model: nn.Module, args: tuple, kwargs: dict, findings: Any) -> dict[int | str, dict[int, str]]:
    """The (input, dim) pairs the analyser's `recompile.dynamic-dim` findings name, by input name."""
    from kernel_pytorch.assistant.inputs import positional_names

    items = findings.findings() if hasattr(findings, "findings") else list(findings)
    names = positional_names(model)
    out: dict[int | str, dict[int, str]] = {}
    for f in items:
        if f.id != "recompile.dynamic-dim" or f.data.get("dim") is None:
            continue
        dim = int(f.data["dim"])
        for name in f.data.get("inputs") or [f.data.get("input")]:
            key: int | str | None = name if name in kwargs else None
            if key is None and name in names and names.index(name) < len(args):
                key = names.index(name)
            if key is not None:
                out.setdefault(key, {})[dim] = f"dim{dim}"
    return out


def dynamic_dims(model: nn.Module, example_inputs: Any, dynamic: Dynamic = "auto",
                 findings: Any = None) -> dict[int | str, dict[int, str]]:
    """The dims `export` makes dynamic: {input (position or keyword): {dim: name}}.

    Args:
        model: the model to export.
        example_inputs: tuple of args, dict of kwargs or one tensor.
        dynamic: "auto" (the analyser's findings, else its inferred batch/seq dims), a dict, or None.
        findings: an analyser `Report` or its findings; only `recompile.dynamic-dim` ones are used.
    """
    if dynamic is None:
        return {}
    if dynamic != "auto":
        return {k: {int(d): str(n) for d, n in v.items()} for k, v in dict(dynamic).items()}
    args, kwargs = split_inputs(as_inputs(example_inputs))
    if findings is not None:
        return _from_findings(model, args, kwargs, findings)
    from kernel_pytorch.assistant.inputs import infer_input_dims

    inferred = infer_input_dims(args, kwargs, model)
    # whole tensor arguments only: torch.export's dynamic_shapes mirror the argument structure
    return {k: {d: kind for d, kind in dims.items() if kind in ("batch", "seq")}
            for k, dims in inferred.items() if isinstance(k, (int, str)) and dims}


def _shapes_spec(model: nn.Module, args: tuple, kwargs: dict, dims: Mapping[int | str, Mapping[int, str]],
                 auto: bool) -> Any:
    """torch.export's `dynamic_shapes` for `dims`: Dim.AUTO each (auto), else one named Dim per name.
    A tuple for positional calls, else a dict by the forward's parameter names."""
    if not dims:
        return None
    named: dict[str, Any] = {}

    def spec(key: int | str, value: Any) -> Any:
        if key not in dims or not isinstance(value, Tensor):
            return None
        if auto:
            return {d: Dim.AUTO for d in dims[key]}
        return {d: named.setdefault(n, Dim(n)) for d, n in dims[key].items()}

    if not kwargs:
        return tuple(spec(i, a) for i, a in enumerate(args))
    from kernel_pytorch.assistant.inputs import positional_names

    names = positional_names(model)
    return {**{names[i]: spec(i, a) for i, a in enumerate(args)}, **{k: spec(k, v) for k, v in kwargs.items()}}


def export(
    model: nn.Module,
    example_inputs: Any,
    *,
    dynamic: Dynamic = "auto",
    strict: bool = False,
    findings: Any = None,
    check: bool = True,
) -> ExportedProgram:
    """`torch.export` of `model` (optimized or not), checked against eager on fresh inputs.

    Args:
        model: the model, e.g. as `kernel_pytorch.optimize` returns it; put in eval mode first for
            inference (dropout is traced as it is).
        example_inputs: tuple of args, dict of kwargs or one tensor, as the model is called.
        dynamic: "auto", a dict {input: {dim: name}} or None (static); see the module docstring.
        strict: torch.export's strict mode (trace with Dynamo); the default traces with Python.
        findings: the analyser's report (or findings) for dynamic="auto".
        check: run the program and the model on fresh inputs and raise `ExportMismatch` on a mismatch.
    Returns:
        The `ExportedProgram`; `torch.export.save` writes it, `load_program` reads it back.
    """
    args, kwargs = split_inputs(as_inputs(example_inputs))
    dims = dynamic_dims(model, example_inputs, dynamic, findings)
    shapes = _shapes_spec(model, args, kwargs, dims, auto=dynamic == "auto")
    log.info("export: dynamic dims %s", dims or "none")
    # blocks optimize() compiled in place run eagerly while traced: export makes its own graph
    compiled = {m: m._compiled_call_impl for m in model.modules() if getattr(m, "_compiled_call_impl", None)}
    try:
        for m in compiled:
            m._compiled_call_impl = None
        program = torch.export.export(model, args, kwargs, dynamic_shapes=shapes, strict=strict)
    finally:
        for m, impl in compiled.items():
            m._compiled_call_impl = impl
    if check:
        result = check_program(program, model, example_inputs)
        if not result.passed:
            raise ExportMismatch(result.summary())
    return program


def our_ops(program: ExportedProgram) -> list[str]:
    """The `kernel_pytorch::*` ops the program's graph calls, e.g. ["kernel_pytorch::rms_norm_fwd"]."""
    found: list[str] = []
    for node in program.graph.nodes:
        name = getattr(node.target, "name", None)
        op = name() if callable(name) else None
        if node.op == "call_function" and op and op.split("::")[0] == OP_NAMESPACE and op not in found:
            found.append(op)
    return found


def _fresh_sizes(program: ExportedProgram, placeholders: list[Any], leaves: list[Any]) -> dict[Any, int]:
    """{symbol: new size}: the example's size plus one (minus one at the range's top) per free symbol."""
    sizes: dict[Any, int] = {}
    for node, leaf in zip(placeholders, leaves):
        val = node.meta.get("val")
        if not isinstance(leaf, Tensor) or not isinstance(val, Tensor):
            continue
        for size, example in zip(val.shape, leaf.shape):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if expr is None or not getattr(expr, "is_Symbol", False) or expr in sizes:
                continue
            bounds = program.range_constraints.get(expr)
            upper = bounds.upper if bounds is not None else example + 1
            sizes[expr] = example + 1 if example + 1 <= upper else example - 1
    return sizes


def _fresh_tensor(leaf: Tensor, shape: Sequence[int], gen: torch.Generator) -> Tensor:
    """New values shaped `shape`: integers within the example's range, floats with its mean and spread."""
    if leaf.dtype == torch.bool:
        return (torch.rand(shape, generator=gen) < 0.5).to(leaf.device)
    if not leaf.is_floating_point():
        lo, hi = int(leaf.min()), int(leaf.max())
        return torch.randint(lo, hi + 1, tuple(shape), generator=gen, dtype=leaf.dtype).to(leaf.device)
    x = leaf.detach().float()
    std = float(x.std()) if x.numel() > 1 else 1.0
    out = torch.randn(tuple(shape), generator=gen) * (std or 1.0) + float(x.mean())
    return out.to(device=leaf.device, dtype=leaf.dtype)


def fresh_inputs(program: ExportedProgram, example_inputs: Any, seed: int = 1) -> tuple[tuple, dict]:
    """(args, kwargs) like the example's with new values and, for each dynamic dim, another size."""
    args, kwargs = split_inputs(as_inputs(example_inputs))
    spec = program.call_spec.in_spec
    if spec is not None and kwargs:  # the program's placeholders follow its own keyword order
        kids = spec.children() if hasattr(spec, "children") else spec.children_specs  # torch >= 2.13 / older
        kwargs = {k: kwargs[k] for k in kids[1].context}
    leaves, tree = pytree.tree_flatten((args, kwargs))
    users = set(program.graph_signature.user_inputs)
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in users]
    sizes = _fresh_sizes(program, placeholders, leaves)
    gen = torch.Generator().manual_seed(seed)
    fresh = []
    for node, leaf in zip(placeholders, leaves):
        val = node.meta.get("val")
        if not isinstance(leaf, Tensor) or not isinstance(val, Tensor):
            fresh.append(leaf)
            continue
        shape = [int(s.node.expr.subs(sizes)) if isinstance(s, torch.SymInt) else int(s) for s in val.shape]
        fresh.append(_fresh_tensor(leaf, shape, gen))
    return pytree.tree_unflatten(fresh, tree)


@dataclass(frozen=True)
class ExportCheck:
    """The exported program against the eager model on fresh inputs, leaf by leaf."""

    shapes: dict[str, tuple[int, ...]]  # input leaf -> shape of the fresh input
    comparisons: list[tuple[str, Comparison]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.errors and all(c.passed for _, c in self.comparisons)

    def summary(self) -> str:
        lines = [f"exported program vs eager on fresh inputs {self.shapes}: {'ok' if self.passed else 'MISMATCH'}"]
        lines += [f"  {c.message(name)}" for name, c in self.comparisons] + [f"  {e}" for e in self.errors]
        return "\n".join(lines)


def check_program(program: ExportedProgram, model: nn.Module, example_inputs: Any, seed: int = 1) -> ExportCheck:
    """Run `program` and `model` on `fresh_inputs` and compare every output leaf (the tolerance table
    of its dtype, applied to the largest magnitude: the program may order sums otherwise)."""
    args, kwargs = fresh_inputs(program, example_inputs, seed)
    shapes = {name: tuple(t.shape) for name, t in flatten((args, kwargs), "inputs") if isinstance(t, Tensor)}
    with torch.no_grad():
        expected = model(*args, **kwargs)
        actual = program.module()(*args, **kwargs)
    got, want = dict(flatten(actual)), dict(flatten(expected))
    if list(got) != list(want):
        return ExportCheck(shapes, errors=[f"outputs differ in structure: {list(got)} vs {list(want)}"])
    comparisons, errors = [], []
    for name, e in want.items():
        a = got[name]
        if isinstance(e, Tensor) and e.is_floating_point():
            comparisons.append((name, compare_reordered(a, e)))
        elif isinstance(e, Tensor) and not torch.equal(a, e):
            errors.append(f"{name}: integer/bool outputs differ")
    return ExportCheck(shapes, comparisons, errors)


def load_program(path: str | Path) -> ExportedProgram:
    """`torch.export.load` with kernel_pytorch's ops registered first (the graph calls them)."""
    import kernel_pytorch.ops  # noqa: F401  registers torch.ops.kernel_pytorch.*

    return torch.export.load(str(path))


def aoti_package(model_or_program: nn.Module | ExportedProgram, example_inputs: Any, path: str | Path,
                 *, dynamic: Dynamic = "auto", findings: Any = None) -> Path:
    """Compile an AOTInductor package (`torch._inductor.aoti_compile_and_package`) to `path` (.pt2).

    Args:
        model_or_program: an `ExportedProgram`, or a model `export` is called on first.
        example_inputs: as for `export` (used to export a model; ignored for a program).
        path: the package file to write; its directory is created.
        dynamic, findings: as for `export`, when a model is given.
    Returns:
        The package's path; `load_package` loads it (in any process, on the device it was built for).
    """
    program = model_or_program
    if not isinstance(program, ExportedProgram):
        program = export(program, example_inputs, dynamic=dynamic, findings=findings)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from torch._inductor import aoti_compile_and_package

    return Path(aoti_compile_and_package(program, package_path=str(path)))


@functools.cache
def share_cxx_runtime() -> bool:
    """Put the C++ runtime this process already has (libstdc++, loaded by torch) into the global symbol
    scope; True when it did, False where there is none to share (not Linux, or no libstdc++ loaded).

    Why: Python loads torch's libraries with RTLD_LOCAL, so their libstdc++ is not in the global scope.
    A package's .so built by a compiler that links libstdc++ statically (a GCC installed outside the
    system paths, as CXX=/opt/gcc/bin/g++ on our H200 host) then lists no libstdc++ and resolves each
    C++ runtime symbol on its own: some to its static copy, some to the process's. Two halves of
    std::locale meet in the package's first std::regex (AOTInductorModel's device-string parse) and the
    process faults (SIGSEGV in std::__detail::_Compiler, benchmarks/results/probes/deploy/
    probe_aoti_toolchain_h200.log). With the process's libstdc++ global, every such symbol binds to it,
    as with LD_PRELOAD of it, and the package loads. RTLD_NOLOAD: only a libstdc++ already loaded is
    promoted, never another one loaded."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return False
    return True


def load_package(path: str | Path) -> Any:
    """Load an AOTInductor package (`torch._inductor.aoti_load_package`); call the result like the
    model (`runner(*args, **kwargs)`). Registers kernel_pytorch's ops first, and shares the process's
    C++ runtime with the package (`share_cxx_runtime`)."""
    from torch._inductor import aoti_load_package

    import kernel_pytorch.ops  # noqa: F401  the package's graph may name them

    share_cxx_runtime()
    return aoti_load_package(str(path))


@dataclass(frozen=True)
class PackageLoad:
    """How loading an AOTInductor package in a fresh process ended (`try_package`)."""

    ok: bool
    returncode: int | None  # negative: killed by that signal (-11: SIGSEGV); None: timed out
    detail: str  # the child's last output lines

    def summary(self) -> str:
        if self.ok:
            return "loads in a fresh process"
        if self.returncode is None:
            return f"loading timed out in a fresh process: {self.detail}"
        if self.returncode < 0:
            import signal

            name = signal.Signals(-self.returncode).name if -self.returncode in signal.valid_signals() else "a signal"
            return f"the loader was killed by {name} in a fresh process: {self.detail}"
        return f"loading failed in a fresh process (exit {self.returncode}): {self.detail}"


def try_package(path: str | Path, timeout_s: float = 300.0) -> PackageLoad:
    """Load the package at `path` in a fresh Python process (by `load_package`) and report how that
    ended, so a loader that crashes the process (as torch 2.11's own did for every CUDA package on a
    host whose compiler links libstdc++ statically, before `share_cxx_runtime`) is found without taking
    the caller's process down. Call before `load_package` where a crash would cost more than the
    seconds a fresh process takes."""
    import subprocess

    script = ("import sys\nfrom kernel_pytorch.deploy import load_package\n"
              "load_package(sys.argv[1])\nprint('loaded')\n")
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])  # the kernel_pytorch this process imported
    env["PYTHONPATH"] = src + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                              env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return PackageLoad(False, None, f"no result after {timeout_s:.0f} s")
    tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])[-400:]
    return PackageLoad(done.returncode == 0 and "loaded" in done.stdout, done.returncode, tail)


__all__ = [
    "OP_NAMESPACE",
    "PackageLoad",
    "Dynamic",
    "DynamicDims",
    "ExportCheck",
    "ExportMismatch",
    "aoti_package",
    "check_program",
    "dynamic_dims",
    "export",
    "fresh_inputs",
    "load_package",
    "load_program",
    "our_ops",
    "share_cxx_runtime",
    "try_package",
]
