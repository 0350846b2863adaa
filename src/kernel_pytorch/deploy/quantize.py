"""Weight-only quantization after `optimize()`, validated per scheme and checked for determinism.

    model, _ = kernel_pytorch.optimize(model, inputs)
    reference = copy.deepcopy(model)
    quantize(model, "int8")                         # torchao's quantize_ on every nn.Linear, in place
    quantize(model, "int4", backend="kernel_pytorch", group_size=128)   # or our own kernels
    check = validate_quantized(reference, model, inputs, "int8")     # within quant_rtol of the model
    report = quant_determinism(reference, inputs, "int8")            # which step, if any, is not bitwise

Two backends, the same scheme names (weight-only: activations stay in the model's dtype):
  backend="torchao" (the default): torchao's configs on the Linears' weights (tensor subclasses)
    int8  Int8WeightOnlyConfig: one int8 per weight, a scale per output row (symmetric absmax)
    fp8   Float8WeightOnlyConfig: float8_e4m3fn weights, a scale per output row
    int4  Int4WeightOnlyConfig(group_size=32): 4-bit weights, a scale per 32 inputs; needs torchao's
          int4 kernels for the device (`available_schemes()` says whether this install has them)
  backend="kernel_pytorch": each nn.Linear swapped for nn.QuantizedLinear (plain-tensor parts, our
    Triton kernels, reference/quant_matmul.py's quantizers)
    int8  a scale per output row (symmetric, max|W| / 127)
    fp8   e4m3 weights, a scale per output row
    int4  groups of `group_size` (32, 64, 128; default 128) inputs with a scale and a zero point each
Our modules keep their `nn.Linear` children (GatedMLP's gate/up/down projections), so both backends find
them after optimize() as before; GatedMLP runs projections that are not Linears as modules.

torchao is an optional extra: `pip install 'kernel-pytorch[quant]'`. Without it the torchao backend
raises ImportError saying so; the kernel_pytorch backend does not need it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import call, flatten
from kernel_pytorch.deploy import _packed
from kernel_pytorch.deploy._quantized import INSTALL_HINT, SCHEME_ATTR, _torchao, is_subclass, same_tensors, tensors_of
from kernel_pytorch.deploy.export import export, our_ops
from kernel_pytorch.reference.quant_matmul import rounding_step
from kernel_pytorch.tolerances import BUDGET_FACTOR, tolerance_for
from kernel_pytorch.validation import ValidationResult, validate_optimization
from kernel_pytorch.validation.inputs import inputs_for
from kernel_pytorch.validation.runs import bitwise_equal

SCHEMES = ("int8", "fp8", "int4")
BACKENDS = ("torchao", "kernel_pytorch")

# Quantized output vs the unquantized model: max|q - ref| <= atol(dtype) + 2 rtol x max|ref|, per
# output tensor (a weight's rounding error scales with its row's largest weight, not with each output
# element, so the bound is on the tensor's largest magnitude, as for reordered sums). rtol is derived
# from the model itself (`quant_rtol`): each quantized layer adds rounding noise to its output, and
# the noise of many layers adds up, so a fixed number cannot hold from one layer to a deep model.
INT4_GROUP = 32  # inputs per int4 scale (quant_config)
# expected_rtol reads a weight this many rows at a time: its fp64 temporaries stay small (an LM head of
# 128256 x 2048 would take several GiB at once)
RTOL_ROWS = 4096


def _check_backend(backend: str, group_size: int | None) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "torchao" and group_size is not None:
        raise ValueError(f"group_size is the kernel_pytorch backend's; torchao's int4 takes groups of {INT4_GROUP}")


def rounding_variance(weight: Tensor, scheme: str, *, backend: str = "torchao",
                      group_size: int | None = None) -> Tensor:
    """The expected squared rounding error of each weight of an (out, in) matrix under `scheme`, fp64.

    Every weight is rounded to the nearest point of the scheme's grid, so its error is uniform over
    one step of that grid, of variance step^2 / 12. torchao's grids:
      int8: symmetric, one scale per output row: step = absmax(row) / 127.5
      fp8: float8_e4m3fn after scaling each row to an absmax of 448: step = 2^(e - 3) x scale, with e
           the scaled weight's binary exponent (at least -6: the subnormals' fixed step)
      int4: asymmetric, one scale per INT4_GROUP inputs: step = (max - min) / 15 of the group
    backend="kernel_pytorch": reference.quant_matmul.rounding_step, the steps our quantizers choose
    (int4 in groups of `group_size`, default 128, with zero in every group's range).
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
    _check_backend(backend, group_size)
    if backend == "kernel_pytorch":
        step = rounding_step(weight, scheme, _packed.DEFAULT_GROUP if group_size is None else group_size)
        return step * step / 12
    w = weight.detach().to(torch.float64).reshape(weight.shape[0], -1)
    if scheme == "int8":
        step = w.abs().amax(dim=1, keepdim=True) / 127.5
        return (step * step / 12).expand_as(w)
    if scheme == "fp8":
        scale = w.abs().amax(dim=1, keepdim=True) / 448.0
        y = (w / scale.clamp_min(torch.finfo(torch.float64).tiny)).abs()
        exponent = torch.floor(torch.log2(y.clamp_min(2.0 ** -9))).clamp_min(-6)
        step = torch.exp2(exponent - 3) * scale
        return step * step / 12
    groups = w.reshape(w.shape[0], -1, INT4_GROUP) if w.shape[1] % INT4_GROUP == 0 else w.unsqueeze(1)
    step = (groups.amax(dim=-1, keepdim=True) - groups.amin(dim=-1, keepdim=True)) / 15
    return (step * step / 12).expand_as(groups).reshape(w.shape)


def quantized_linears(model: nn.Module) -> list[str]:
    """Names of `model`'s quantized linear layers: nn.Linear modules whose weight is a quantized tensor
    (a torchao subclass), and nn.QuantizedLinear layers (the kernel_pytorch backend)."""
    ours = _packed.quantized_modules(model)
    return [name for name, m in model.named_modules() if (isinstance(m, nn.Linear) and is_subclass(m.weight))
            or name in ours]


def expected_rtol(model: nn.Module, scheme: str, names: Sequence[str] | None = None, *, backend: str = "torchao",
                  group_size: int | None = None, groups: dict[str, int | None] | None = None) -> tuple[float, int]:
    """The relative output error quantizing `model`'s linear layers `names` (default: every nn.Linear)
    with `scheme` (of `backend`, int4 in groups of `group_size`, or per layer `groups[name]`) is expected
    to cause, from the float weights the model has now; and how many layers.

    Each quantized linear layer adds its weights' rounding noise to its output, of relative size
    e_i = sqrt(sum `rounding_variance`(W_i) / ||W_i||^2). Independent noise adds in quadrature and the
    normalisations of a residual network keep it relative, so rtol = sqrt(sum_i e_i^2): it grows with
    the square root of the depth. Measured (CPU, bf16): the largest logit error over rtol x the largest
    logit is 0.42-0.50 on the built-in Llama with 1 to 8 layers, 0.94 (int8) and 0.78 (fp8) on an
    8-layer, hidden-2048 HF Llama with vocabulary 128256; checks allow tolerances.BUDGET_FACTOR x rtol.
    """
    modules = dict(model.named_modules())
    if names is None:
        names = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
    total = 0.0
    for name in names:
        w = modules[name].weight.detach()
        energy = variance = 0.0
        group = (groups or {}).get(name, group_size)
        for start in range(0, w.shape[0], RTOL_ROWS):  # every scheme scales within a row: blocks of rows
            rows = w[start:start + RTOL_ROWS]
            energy += float(rows.to(torch.float64).pow(2).sum())
            variance += float(rounding_variance(rows, scheme, backend=backend, group_size=group).sum())
        if energy > 0:
            total += variance / energy
    return total ** 0.5, len(names)


def quant_rtol(original: nn.Module, quantized: nn.Module, scheme: str) -> tuple[float, int]:
    """`expected_rtol` of the layers `quantized` has quantized, from `original`'s own weights (so a
    faulty quantization cannot widen its own tolerance); a model quantized by the kernel_pytorch backend
    with its layers' own group sizes."""
    ours = _packed.quantized_modules(quantized)
    if ours:
        groups = {name: layer.group_size for name, layer in ours.items()}
        return expected_rtol(original, scheme, quantized_linears(quantized), backend="kernel_pytorch", groups=groups)
    return expected_rtol(original, scheme, quantized_linears(quantized))


def quant_config(scheme: str) -> Any:
    """torchao's config object for `scheme` ("int8", "fp8", "int4")."""
    q = _torchao()
    if scheme == "int8":
        return q.Int8WeightOnlyConfig()
    if scheme == "fp8":
        return q.Float8WeightOnlyConfig()
    if scheme == "int4":
        return q.Int4WeightOnlyConfig(group_size=32)
    raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")


def quantize(model: nn.Module, scheme: str = "int8", *,
             filter_fn: Callable[[nn.Module, str], bool] | None = None, backend: str = "torchao",
             group_size: int | None = None) -> nn.Module:
    """Quantize `model`'s linear weights in place; returns the model.

    Args:
        model: typically as `kernel_pytorch.optimize` returned it.
        scheme: "int8", "fp8" or "int4" (see the module docstring).
        filter_fn: which modules to quantize, `(module, fqn) -> bool`; default every `nn.Linear`.
        backend: "torchao" (torchao's `quantize_`, tensor-subclass weights) or "kernel_pytorch" (each
            Linear swapped for nn.QuantizedLinear; returns the new layer when `model` is itself a Linear).
        group_size: int4's group with the kernel_pytorch backend (32, 64 or 128; default 128).
    The scheme is recorded on the model, for `kernel_pytorch.save` to put in its manifest.

    Raises:
        ImportError: torchao is not installed and the backend is torchao (the message says how to install it).
        ValueError: an unknown scheme or backend, a group size torchao does not take.
    """
    _check_backend(backend, group_size)
    if backend == "kernel_pytorch":
        model = _packed.swap_linears(model, scheme, group_size, filter_fn)
    else:
        _torchao().quantize_(model, quant_config(scheme), filter_fn=filter_fn)
    setattr(model, SCHEME_ATTR, scheme)
    return model


def available_schemes(device: str | torch.device = "cpu", backend: str = "torchao") -> dict[str, str]:
    """{scheme: "" if it runs here, else why not}: each quantizes and runs a small Linear on `device`."""
    _check_backend(backend, None)
    if backend == "torchao":
        _torchao()
    out: dict[str, str] = {}
    for scheme in SCHEMES:
        try:
            layer = quantize(nn.Linear(64, 32, device=device, dtype=torch.bfloat16), scheme, backend=backend)
            layer(torch.randn(2, 64, device=device, dtype=torch.bfloat16))
            out[scheme] = ""
        except Exception as exc:
            out[scheme] = short_error(exc, 200)
    return out


@dataclass(frozen=True)
class QuantCheck:
    """One output tensor of the quantized model against the unquantized one, for one seed."""

    seed: int
    name: str
    passed: bool
    max_abs_err: float
    allowed: float


@dataclass(frozen=True)
class QuantValidation:
    """`validate_optimization` of the quantized model, judged by the scheme's tolerance."""

    scheme: str
    rtol: float  # quant_rtol: from the rounding of `layers` quantized linear layers
    checks: list[QuantCheck]
    result: ValidationResult  # validate_optimization's own (its verdict uses the unquantized table)
    errors: list[str] = field(default_factory=list)
    layers: int = 0

    @property
    def passed(self) -> bool:
        return not self.errors and bool(self.checks) and all(c.passed for c in self.checks)

    def summary(self) -> str:
        head = (f"{self.scheme} weight-only vs unquantized: {'PASS' if self.passed else 'FAIL'} "
                f"(max|q - ref| <= atol + {BUDGET_FACTOR:g} x {self.rtol:.3g} x max|ref|; {self.rtol:.3g} = "
                f"quant_rtol, the expected error of rounding {self.layers} quantized layers)")
        rows = [f"  seed {c.seed} {c.name}: max abs err {c.max_abs_err:.3g} (allowed {c.allowed:.3g})"
                for c in self.checks]
        det = self.result.determinism
        if det is not None:
            rows.append(f"  two runs bitwise identical: {det.deterministic}")
        return "\n".join([head, *rows, *(f"  error: {e}" for e in self.errors)])


def validate_quantized(original: nn.Module, quantized: nn.Module, inputs: Any, scheme: str,
                       seeds: Sequence[int] = (0, 1)) -> QuantValidation:
    """Compare `quantized` with the unquantized `original` (outputs, inference) with
    `validate_optimization`, then judge each output within atol + BUDGET_FACTOR x `quant_rtol` x its
    largest magnitude (twice the error the weights' rounding is expected to cause, as `fp64_budget`
    allows twice eager's error).

    Args:
        original: the model before quantization (e.g. a deepcopy taken after optimize()).
        quantized: the same model quantized.
        inputs: example inputs (tuple of args, dict of kwargs, one tensor or `seed -> inputs`).
        scheme: whose tolerance applies.
        seeds: the first uses the inputs as given, later ones redraw them.
    """
    rtol, layers = quant_rtol(original, quantized, scheme)
    result = validate_optimization(original, quantized, inputs, seeds=tuple(seeds), check_gradients=False,
                                   reference="none", check_performance=False, check_compile=False,
                                   check_determinism=True)
    corr = result.correctness_check
    checks: list[QuantCheck] = []
    errors = list(corr.errors)
    if layers == 0:
        errors.append("the quantized model has no quantized linear layer (quantize() changed nothing)")
    for seed, tensor_checks in corr.checks.items():
        with torch.no_grad():
            # the seed's inputs as validation used them (given ones where the drawn ones did not run)
            first = seeds[0] if seed in corr.given_inputs_seeds else seed
            ref = dict(flatten(call(original, inputs_for(inputs, first, seeds[0], original))))
        for c in tensor_checks:
            expected = ref.get(c.name)
            if c.method in ("structure", "value") or not isinstance(expected, Tensor):
                checks.append(QuantCheck(seed, c.name, c.passed, c.max_abs_err, 0.0))
                continue
            allowed = tolerance_for(expected.dtype).atol + BUDGET_FACTOR * rtol * float(expected.detach().abs().max())
            checks.append(QuantCheck(seed, c.name, c.max_abs_err <= allowed, c.max_abs_err, allowed))
    return QuantValidation(scheme, rtol, checks, result, errors, layers)


@dataclass(frozen=True)
class Step:
    """One determinism step: what was repeated, whether the repeat was bitwise identical, the detail."""

    name: str
    identical: bool
    detail: str


@dataclass(frozen=True)
class QuantDeterminism:
    """Quantize twice, export twice, run twice: which steps repeat bit for bit."""

    scheme: str
    steps: list[Step]

    @property
    def deterministic(self) -> bool:
        return all(s.identical for s in self.steps)

    def summary(self) -> str:
        rows = [f"  {s.name}: {'identical' if s.identical else 'DIFFERS'} ({s.detail})" for s in self.steps]
        return "\n".join([f"{self.scheme} determinism: {'all steps bitwise' if self.deterministic else 'NOT'}",
                          *rows])


def _graph(program: torch.export.ExportedProgram) -> list[str]:
    return [node.format_node() for node in program.graph.nodes]


def _repeat(name: str, fn: Callable[[], tuple[bool, str]]) -> Step:
    try:
        return Step(name, *fn())
    except Exception as exc:
        return Step(name, False, f"failed: {short_error(exc, 300)}")


def quant_determinism(model: nn.Module, inputs: Any, scheme: str, *, backend: str = "torchao",
                      group_size: int | None = None) -> QuantDeterminism:
    """Quantize two copies of `model` (unquantized, e.g. after optimize()) and compare the quantized
    tensors and scales; export one twice and compare graphs node for node and weights; run the model
    and the program twice each on `inputs` and compare outputs bit for bit. backend, group_size: as
    `quantize`'s.

    Returns:
        The steps in that order; a step that differs (or fails) is named with what differed.
    """
    first, second = (quantize(copy.deepcopy(model), scheme, backend=backend, group_size=group_size)
                     for _ in range(2))
    steps = [_repeat("quantize twice: quantized tensors and scales",
                     lambda: same_tensors(tensors_of(first.state_dict()), tensors_of(second.state_dict())))]
    first.eval()
    programs: list[torch.export.ExportedProgram] = []

    def export_twice() -> tuple[bool, str]:
        programs.extend(export(first, inputs, dynamic=None) for _ in range(2))
        a, b = (_graph(p) for p in programs)
        if a != b:
            where = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) if len(a) == len(b) else -1
            return False, f"graphs differ ({len(a)} vs {len(b)} nodes; first difference at node {where})"
        weights = [tensors_of({**p.state_dict, **p.constants}) for p in programs]
        same, detail = same_tensors(*weights)
        ops = ", ".join(our_ops(programs[0])) or "no kernel_pytorch ops"
        return same, f"{len(a)} nodes identical ({ops}); weights: {detail}"

    steps.append(_repeat("export twice: graph and weights", export_twice))

    def outputs_twice(fn: Callable[..., Any]) -> tuple[bool, str]:
        with torch.no_grad():
            a, b = (dict(flatten(call(fn, inputs))) for _ in range(2))
        tensors = [n for n, t in a.items() if isinstance(t, Tensor)]
        differ = [n for n in tensors if not bitwise_equal(a[n], b[n])]
        return not differ, (f"{', '.join(differ)} differ" if differ else f"{len(tensors)} outputs bitwise identical")

    steps.append(_repeat("run twice: the quantized model's outputs", lambda: outputs_twice(first)))
    if programs:
        steps.append(_repeat("run twice: the exported program's outputs",
                             lambda: outputs_twice(programs[0].module())))
    return QuantDeterminism(scheme, steps)


__all__ = [
    "BACKENDS",
    "INSTALL_HINT",
    "INT4_GROUP",
    "SCHEMES",
    "QuantCheck",
    "QuantDeterminism",
    "QuantValidation",
    "Step",
    "available_schemes",
    "quant_config",
    "quant_determinism",
    "expected_rtol",
    "quant_rtol",
    "quantize",
    "quantized_linears",
    "rounding_variance",
    "tensors_of",
    "validate_quantized",
]
