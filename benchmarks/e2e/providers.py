"""The end-to-end benchmark's providers: a base provider, and named variants of it.

A provider is written `BASE[+VARIANT...]`: `ours+compile`, `ours+compile+adamw`,
`ours+compile+adamw+two_pass_ce`, `ours + static cache + compile+reference`. The base says how the model is
built and compiled (`TRAIN_BASES`, `GENERATE_BASES`); each variant (`VARIANTS`) changes one field of a frozen
`Variant`, which says what the row changes on its base: the optimizer, the `use_cache` argument, the
backends of the optimized model's modules, the kernel configs (`kernel_pytorch.ops.tuning`) in force
while the row runs, the batch (packed documents) and the sharding. The written form, with the variants
in `VARIANTS`' order, is the row's provider label in the results; the variants may be written in any
order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

Kind = Literal["train", "generate"]

# how each training base builds its model (the family's HF *ForCausalLM unless said otherwise)
TRAIN_BASES: Mapping[str, str] = {
    "eager": "the HF model, eager",
    "torch.compile": "the HF model through torch.compile(model)",
    "ours": "the HF model after kernel_pytorch.optimize(), eager",
    "ours+compile": "ours, then torch.compile(model, options=kernel_pytorch.optimize.INDUCTOR_OPTIONS)",
    "liger": "the HF model after Liger-Kernel's patch for its family (apply_liger_kernel_to_llama ...; in a child "
             "process)",
    "liger+compile": "liger, then torch.compile(model)",
    "builtin": "kernel_pytorch.models.llama of the same size, optimized, then torch.compile(model) (Llama only)",
    "torch.compile-cg": "torch.compile(model, mode='reduce-overhead'): CUDA graphs (opt-in)",
    "ours+compile-cg": "ours, then torch.compile(model, mode='reduce-overhead') (opt-in)",
    "ours+compile-reuse": "ours, then torch.compile(model) with Inductor's default options (opt-in)",
}
DEFAULT_PROVIDERS = ("eager", "torch.compile", "ours", "ours+compile", "liger", "liger+compile", "builtin")

# the generate() rows: prefill + greedy decode, batch 1
GENERATE_BASES: Mapping[str, str] = {
    "ours": "the optimized HF model with transformers' DynamicCache, uncompiled",
    "ours + static cache + compile": "the optimized HF model with the static cache, which generate() compiles",
    "hf static cache + compile": "the HF model with the static cache, which generate() compiles",
}
GENERATE_PROVIDERS = tuple(GENERATE_BASES)


def optimized(base: str) -> bool:
    """Whether the base's model went through kernel_pytorch.optimize() (its modules have a `backend`)."""
    return base.startswith("ours") or base == "builtin"


@dataclass(frozen=True)
class Variant:
    """What a row changes on its base provider; the defaults change nothing.

    Fields:
        optimizer: "torch": torch.optim.AdamW (fused=True on CUDA); "kernel_pytorch":
            kernel_pytorch.optim.AdamW (the same update, one launch).
        use_cache: the `use_cache` argument of the model's call; None: not passed (the model's default).
        norms: the optimized model's RMSNorms: "default" as optimize() leaves them; "reference": backend
            "reference" (plain torch ops, which a compiled graph hands to Inductor, in every mode);
            "op": compiled_norm "op" (our registered op in a compiled training graph too).
        reference: every optimized module with a `backend` (norms, MLP, embedding, RoPE) on "reference".
        ce_kernel: the fused linear cross-entropy's forward kernel where the one-read kernel applies:
            "one_read" (the default config) or "two_pass" (tuning family "fused_linear_cross_entropy",
            one_read=False, for the row).
        packed: the batch's rows hold documents of random lengths (e2e/batches.py), position_ids restarting
            at each, each document's first label -100; the call passes use_cache=False unless `use_cache`
            says otherwise (transformers reads the documents only from a call without a cache).
        shard: "fsdp2": the model under FSDP2, torchtitan's recipe (e2e/distributed.py: fp32 parameters
            sharded over the world, bf16 compute on CUDA, a compiling base compiled per decoder layer);
            "tp": under tensor and sequence parallelism over the world (kernel_pytorch.distributed's Llama
            plan: our styles on the optimized model, torch's on the others), compiled whole after it.
    """

    optimizer: Literal["torch", "kernel_pytorch"] = "torch"
    use_cache: bool | None = None
    norms: Literal["default", "reference", "op"] = "default"
    reference: bool = False
    ce_kernel: Literal["one_read", "two_pass"] = "one_read"
    packed: bool = False
    shard: Literal["none", "fsdp2", "tp"] = "none"

    def __post_init__(self) -> None:
        if self.reference and self.norms != "default":
            raise ValueError(f"reference=True already puts the norms on the reference math; norms={self.norms!r} "
                             "contradicts it")

    def tuning_changes(self) -> dict[str, dict[str, Any]]:
        """The kernel config fields this variant sets, by tuning family: {family: {field: value}}."""
        return {"fused_linear_cross_entropy": {"one_read": False}} if self.ce_kernel == "two_pass" else {}

    @contextlib.contextmanager
    def tuning(self) -> Iterator[None]:
        """The row's kernel configs in force for the block (`tuning.changed` of each family in
        `tuning_changes`); nothing changes for a variant that sets none."""
        from kernel_pytorch.ops import tuning

        with contextlib.ExitStack() as stack:
            for family, fields in self.tuning_changes().items():
                stack.enter_context(tuning.changed(family, **fields))
            yield

    def call_kwargs(self) -> dict[str, Any]:
        """Keyword arguments every call of the model gets (besides the batch's input_ids, labels and
        position_ids)."""
        # packed rows need it for transformers to mask per document, and a DTensor model for its KV cache
        # (which mixes plain tensors with DTensor keys)
        use_cache = False if (self.packed or self.shard == "tp") and self.use_cache is None else self.use_cache
        return {} if use_cache is None else {"use_cache": use_cache}

    def apply(self, model: torch.nn.Module) -> torch.nn.Module:
        """Set the optimized `model`'s modules as `norms` and `reference` say; returns the model."""
        from kernel_pytorch.nn import RMSNorm

        if self.reference:
            reference_backends(model)
        elif self.norms == "reference":
            reference_backends(model, (RMSNorm,))
        elif self.norms == "op":
            for m in model.modules():
                if isinstance(m, RMSNorm):
                    m.compiled_norm = "op"
        return model

    def make_optimizer(self, model: torch.nn.Module, dev: torch.device) -> torch.optim.Optimizer:
        """The row's AdamW over the model's parameters (lr 1e-5)."""
        if self.optimizer == "kernel_pytorch":
            from kernel_pytorch.optim import AdamW

            return AdamW(model.parameters(), lr=1e-5, backend="triton" if dev.type == "cuda" else "auto")
        return torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev.type == "cuda")


def reference_backends(model: torch.nn.Module, kinds: tuple[type, ...] | None = None) -> int:
    """Set `backend = "reference"` on the optimized model's modules that have one (of `kinds`, or all):
    their math as plain torch ops, which a compiled graph hands to Inductor. Returns how many."""
    count = 0
    for m in model.modules():
        if isinstance(getattr(type(m), "backend", None), str) and (kinds is None or isinstance(m, kinds)):
            m.backend = "reference"
            count += 1
    return count


@dataclass(frozen=True)
class NamedVariant:
    """One `+NAME` of the provider syntax: the `Variant` fields it sets and where it applies."""

    name: str
    fields: tuple[tuple[str, Any], ...]  # (Variant field, value) pairs
    kinds: tuple[Kind, ...]  # the row kinds it applies to
    optimized_only: bool  # only on a base whose model went through optimize()
    help: str  # one line for --help
    was: str = ""  # the spelling it replaces, named by the error an old spelling gets


VARIANTS: tuple[NamedVariant, ...] = (
    NamedVariant("adamw", (("optimizer", "kernel_pytorch"),), ("train",), False,
                 "stepped by kernel_pytorch.optim.AdamW (one launch) instead of torch's AdamW(fused=True)"),
    NamedVariant("no_cache", (("use_cache", False),), ("train",), False,
                 "the model called with use_cache=False (what optimize()'s forward passes in training)", "nocache"),
    NamedVariant("reference_norms", (("norms", "reference"),), ("train", "generate"), True,
                 "the RMSNorms on the reference math (backend 'reference'), which a compiled graph fuses", "inorm"),
    NamedVariant("op_norms", (("norms", "op"),), ("train",), True,
                 "the RMSNorms keep our registered op in a compiled training graph (compiled_norm 'op')",
                 "opnorm"),
    NamedVariant("reference", (("reference", True),), ("train", "generate"), True,
                 "every module with a backend (norms, MLP, embedding, RoPE) on the reference math", "ref"),
    NamedVariant("two_pass_ce", (("ce_kernel", "two_pass"),), ("train",), True,
                 "the fused loss runs the two-pass cross-entropy kernel (fused_linear_cross_entropy one_read=False)",
                 "twopass"),
    NamedVariant("packed", (("packed", True),), ("train",), False,
                 "packed rows: documents of random lengths (seeded), position_ids restarting at each, use_cache=False"),
    NamedVariant("fsdp2", (("shard", "fsdp2"),), ("train",), False,
                 "under FSDP2 (fully_shard per decoder layer and the root, bf16 compute, fp32 parameters; a "
                 "compiling base compiled per layer); under torchrun, sharded over the world"),
    NamedVariant("tp", (("shard", "tp"),), ("train",), False,
                 "under tensor + sequence parallelism (kernel_pytorch.distributed.tensor_parallel over the world, "
                 "then compiled whole); under torchrun, the world is the tensor-parallel group"),
)
_BY_NAME = {v.name: v for v in VARIANTS}
_RENAMED = {v.was: v.name for v in VARIANTS if v.was}


@dataclass(frozen=True)
class Provider:
    """A parsed provider: the base and the named variants (in `VARIANTS`' order)."""

    base: str
    variants: tuple[str, ...] = ()
    kind: Kind = "train"

    @property
    def label(self) -> str:
        """The written form: the row's provider in the results, and what `parse` reads back."""
        return self.base + "".join(f"+{name}" for name in self.variants)

    @property
    def variant(self) -> Variant:
        """The `Variant` the named variants make together."""
        return Variant(**{k: v for name in self.variants for k, v in _BY_NAME[name].fields})

    def __str__(self) -> str:
        return self.label


def _bases(kind: Kind) -> Mapping[str, str]:
    return TRAIN_BASES if kind == "train" else GENERATE_BASES


def _split_base(text: str, kind: Kind) -> tuple[str, str]:
    """(the longest base `text` starts with, followed by its end or "+"; the rest)."""
    what = "training provider" if kind == "train" else "generate provider"
    for base in sorted(_bases(kind), key=len, reverse=True):
        if text == base or text.startswith(base + "+") or text.startswith(base + " +"):
            return base, text[len(base):]
    raise ValueError(f"unknown {what} {text!r}; bases: {', '.join(_bases(kind))} (then +VARIANT: "
                     f"{', '.join(_BY_NAME)}; `python benchmarks/bench_e2e.py --help` lists them)")


def parse(text: str, kind: Kind = "train") -> Provider:
    """`BASE[+VARIANT...]` as a `Provider`. Raises ValueError for an unknown base or variant, a variant that
    does not apply to the base, two variants setting one field, and the replaced spellings (naming the new one)."""
    text = text.strip()
    base, rest = _split_base(text, kind)
    names: list[str] = []
    tokens = rest.split("+")[1:]
    for token in tokens:
        name = token.strip()
        if name in _RENAMED or (name and token != name):
            new = _RENAMED.get(name, name)
            old = f"'+{name}' is the former name of '+{new}'" if name in _RENAMED else f"write '+{new}'"
            spaces = " (no spaces)" if token != name else ""
            fixed = base + "".join(f"+{_RENAMED.get(t.strip(), t.strip())}" for t in tokens)
            raise ValueError(f"{text!r}: {old}{spaces}: {fixed!r}")
        if name not in _BY_NAME:
            raise ValueError(f"{text!r}: unknown variant {name!r}; variants: {', '.join(_BY_NAME)}")
        spec = _BY_NAME[name]
        if kind not in spec.kinds:
            raise ValueError(f"{text!r}: variant {name!r} applies to {' and '.join(spec.kinds)} rows only")
        if spec.optimized_only and not optimized(base):
            raise ValueError(f"{text!r}: variant {name!r} changes the optimized model's modules or kernels; "
                             f"{base!r} is not optimized (use an 'ours' base or 'builtin')")
        for other in names:
            if {k for k, _ in _BY_NAME[other].fields} & {k for k, _ in spec.fields}:
                same = f"variant {name!r} is given twice" if other == name else \
                    f"variants {other!r} and {name!r} set the same field of Variant"
                raise ValueError(f"{text!r}: {same}")
        names.append(name)
    if ("fsdp2" in names or "tp" in names) and base.endswith("-cg"):
        raise ValueError(f"{text!r}: a sharded variant does not take a CUDA-graph base (the collectives run "
                         "between the graphs' replays)")
    provider = Provider(base, tuple(sorted(names, key=list(_BY_NAME).index)), kind)
    provider.variant  # noqa: B018 (a contradiction between fields raises here, not at the row)
    return provider


def parse_list(text: str, kind: Kind = "train") -> tuple[Provider, ...]:
    """A comma-separated list of providers (empty entries dropped)."""
    return tuple(parse(p, kind) for p in text.split(",") if p.strip())


def describe() -> str:
    """The provider syntax, every base and every variant, one line each (the --help epilog)."""
    width = max(len(n) for n in (*TRAIN_BASES, *GENERATE_BASES, *_BY_NAME)) + 2
    lines = ["providers are written BASE[+VARIANT...]; the written form, variants in the order below, is the "
             "row's label", "", "training bases (--providers, --paired, --profile):"]
    lines += [f"  {name:<{width}}{text}" for name, text in TRAIN_BASES.items()]
    lines += ["", "generate bases (--generate-providers):"]
    lines += [f"  {name:<{width}}{text}" for name, text in GENERATE_BASES.items()]
    lines += ["", "variants (+NAME; 'ours' means a base optimized by kernel_pytorch: ours*, builtin, ours for "
              "generate):"]
    for v in VARIANTS:
        where = "/".join(v.kinds) + (", ours" if v.optimized_only else "")
        lines.append(f"  {v.name:<{width}}[{where}] {v.help}")
    return "\n".join(lines)

