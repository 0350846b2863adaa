"""A benchmark suite as data: one frozen `OpBench` per op, grouped into a `Suite`.

An `OpBench` says everything the runner (`suites/runner.py`) needs to gate and time one op against
its peers; nothing in the runner knows any op by name. Adding a family is one file under `suites/`
holding its specs and `SUITE = Suite(name, specs)`, plus its line in `suites.SUITES`.

Callables in a spec take the input tensors positionally, in `arg_names` order:

    reference(*tensors)             kernel_pytorch.reference (the gate runs it in the input dtype and in fp64)
    eager(*tensors)                 the op as Hugging Face transformers writes it ("eager"; "compile" compiles it)
    ours(*tensors, backend=...)     kernel_pytorch.functional ("ours": "triton" on CUDA, "auto" elsewhere)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class Shape:
    """Named problem sizes and the real model configuration they come from.

    `Shape.of("Llama-3-8B: hidden 4096, 16384 tokens", rows=16384, cols=4096)`; a dim reads as an
    attribute (`shape.rows`) or by name (`shape["rows"]`); `sizes` is the results row's `shape`.
    Any names: (rows, cols) for norms, (batch, heads, tokens, head_dim) for attention, (tokens, vocab).
    """

    dims: tuple[tuple[str, int], ...]
    config: str

    @classmethod
    def of(cls, config: str, **dims: int) -> Shape:
        """A shape from named dims, in the order given."""
        return cls(tuple((k, int(v)) for k, v in dims.items()), config)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.dims)

    @property
    def sizes(self) -> list[int]:
        """The sizes in order: the `shape` list of a results row."""
        return [v for _, v in self.dims]

    @property
    def label(self) -> str:
        """"16384x4096": how tables, charts and progress lines name the shape."""
        return "x".join(map(str, self.sizes))

    def __getitem__(self, name: str) -> int:
        for k, v in self.dims:
            if k == name:
                return v
        raise KeyError(f"shape has no dim {name!r} (dims: {', '.join(self.names)})")

    def __getattr__(self, name: str) -> int:
        # only reached for names that are not fields: the dims (never private names, so copy and
        # pickle probing stay ordinary)
        if name.startswith("_"):
            raise AttributeError(name)
        for k, v in self.__dict__.get("dims", ()):
            if k == name:
                return v
        raise AttributeError(f"shape has no dim {name!r}")


InputFactory = Callable[[Shape, torch.dtype, torch.device, int], dict[str, Tensor]]
"""(shape, dtype, device, seed) -> named input tensors: random (never zeros), drawn on the device."""

Counts = Callable[..., tuple[int, int]]
"""(fwd, added by bwd) for one shape: bytes take (shape, element size), FLOPs take (shape)."""


@dataclass(frozen=True, eq=False)
class ModulePeer:
    """How to build and call a peer library's module (Liger-Kernel's) for one op, or its function.

    Attributes:
        target: "package.module:Class", imported only when the provider runs. It may name a function
            instead ("liger_kernel.transformers.rope:liger_rotary_pos_emb"): that is called with the
            `call` inputs and `init_kwargs` as keywords; init_args, optional_kwargs and params are
            then unused.
        function: the target is an autograd.Function (called through `.apply`) or a function taking
            the `call` inputs, not a module class: no construction and no parameters.
        init_args: constructor positional arguments from the inputs, e.g. `lambda t: (t["x"].shape[-1],)`.
        init_kwargs: constructor keyword arguments always passed (eps=...).
        optional_kwargs: passed only when the constructor takes them (in_place=False, bias=True).
        params: inputs copied into the module's parameters of the same name (weight, bias), or of the
            dotted path `param_paths` gives (gate_weight -> gate_proj.weight); the benchmark
            differentiates those parameters in their place.
        call: inputs passed positionally to the module's forward.
        note: what the results table says about this peer's set-up.
        out_dtype: cast the peer's outputs to this dtype (e.g. float32 where the peer returns a loss in
            the logits' bf16 and torch and ours return fp32): the gate then compares values, not the
            dtype choice; the cast of a 0-d loss adds one tiny kernel to the timed call.
    """

    target: str
    init_args: Callable[[Mapping[str, Tensor]], tuple[Any, ...]]
    call: tuple[str, ...]
    params: tuple[str, ...] = ()
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    optional_kwargs: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    function: bool = False
    param_paths: Mapping[str, str] = field(default_factory=dict)
    out_dtype: torch.dtype | None = None


@dataclass(frozen=True, eq=False)
class ExtraProvider:
    """A provider beyond ours/eager/compile/liger, e.g. "ours-auto" (what a default call gets).

    `make(device)` returns (callable taking the inputs positionally, note), or (None, "") where it
    runs exactly what "ours" runs on that device: then it gets no rows. `floor`: a lower bound that
    does not compute the op (e.g. the bare GEMMs of a fused loss), timed without the correctness gate
    and named so in its rows' note.
    """

    name: str
    make: Callable[[torch.device], tuple[Callable[..., Any] | None, str]]
    floor: bool = False


OURS_CPU_NOTE = "cpu: the registered op's CPU kernel (the reference); Triton runs on CUDA"


@dataclass(frozen=True, eq=False)
class OpBench:
    """One op's benchmark: inputs, what is differentiated, the providers' code, counts and shapes.

    Attributes:
        name: the op as results rows name it ("rms_norm").
        make_inputs: the input factory (`InputFactory`); keys are `arg_names`.
        arg_names: the inputs in call order.
        grad_names: the inputs "fwd+bwd" and the gate differentiate, in order.
        param_names: those of `grad_names` that are parameters: their gradients sum over every
            row, so the gate holds them to the fp64-derived budget with eager as the yardstick.
        out_names: the outputs, in order ("y", "h").
        reference, eager, ours: see the module docstring.
        liger: Liger-Kernel's counterpart, or None where it has none.
        min_bytes: (shape, element size) -> (fwd, bwd) minimum bytes; fwd+bwd counts both.
        flops: shape -> (fwd, bwd) nominal FLOPs (for the roofline chart).
        cuda_shapes, cpu_shapes: the default shape lists, each labelled with its model config.
        quick_shapes: {"cuda": shape, "cpu": shape} for --quick.
        extras: more providers (`ExtraProvider`).
        ours_cpu_note: the note on "ours" rows off CUDA.
        unit_upstream: the timed fwd+bwd passes an upstream gradient of ones, as `loss.backward()` does
            for a loss (whose kernels may skip scaling by 1); the gate still draws a random one, so the
            scaling path is checked. False: a fixed random upstream gradient everywhere.
        gate_shape: shape -> the shape the correctness gate runs at (None: the benchmark shape itself),
            for shapes whose fp64 reference would not fit the device or would take minutes; the rows
            say where the gate ran.
        passes: the passes timed ("fwd" alone for inference-only ops such as a decoding step, whose
            gate then runs forward only: grad_names empty).
    """

    name: str
    make_inputs: InputFactory
    arg_names: tuple[str, ...]
    grad_names: tuple[str, ...]
    param_names: tuple[str, ...]
    out_names: tuple[str, ...]
    reference: Callable[..., Any]
    eager: Callable[..., Any]
    ours: Callable[..., Any]
    liger: ModulePeer | None
    min_bytes: Counts
    flops: Counts
    cuda_shapes: tuple[Shape, ...]
    cpu_shapes: tuple[Shape, ...]
    quick_shapes: Mapping[str, Shape]
    extras: tuple[ExtraProvider, ...] = ()
    ours_cpu_note: str = OURS_CPU_NOTE
    unit_upstream: bool = False
    gate_shape: Callable[[Shape], Shape] | None = None
    passes: tuple[str, ...] = ("fwd", "fwd+bwd")

    def __post_init__(self) -> None:
        unknown = set(self.grad_names) - set(self.arg_names)
        if unknown or not set(self.param_names) <= set(self.grad_names):
            raise ValueError(f"{self.name}: grad_names must be inputs and param_names among them")
        if any("bwd" in p for p in self.passes) and not self.grad_names:
            raise ValueError(f"{self.name}: a backward pass needs grad_names")

    def pass_bytes(self, shape: Shape, element_size: int, pass_name: str) -> int:
        """Minimum bytes of a pass ("fwd", "fwd+bwd", "... (cuda graph)")."""
        fwd, bwd = self.min_bytes(shape, element_size)
        return fwd + bwd if "bwd" in pass_name else fwd

    def pass_flops(self, shape: Shape, pass_name: str) -> int:
        """Nominal FLOPs of a pass."""
        fwd, bwd = self.flops(shape)
        return fwd + bwd if "bwd" in pass_name else fwd


@dataclass(frozen=True)
class Suite:
    """A named group of op benchmarks, run in order by `runner.run`."""

    name: str
    specs: tuple[OpBench, ...]

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.specs)

    @property
    def providers(self) -> tuple[str, ...]:
        """ours, the specs' extra providers, eager, compile, liger."""
        extras = dict.fromkeys(e.name for s in self.specs for e in s.extras)
        return ("ours", *extras, "eager", "compile", "liger")

    def spec(self, op: str) -> OpBench:
        for s in self.specs:
            if s.name == op:
                return s
        raise ValueError(f"unknown op {op!r}; known: {', '.join(self.ops)}")


def generator(device: torch.device, seed: int) -> Callable[..., Tensor]:
    """draw(*size): fp32 standard normals from a generator seeded with `seed` on `device`.

    The generator lives on the device: drawing tens of millions of values on the host for every
    timed row would cost more than the timing (values differ between device types, not between runs).
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    return lambda *size: torch.randn(*size, generator=gen, device=device)


__all__ = ["OURS_CPU_NOTE", "Counts", "ExtraProvider", "InputFactory", "ModulePeer", "OpBench", "Shape", "Suite",
           "generator"]
