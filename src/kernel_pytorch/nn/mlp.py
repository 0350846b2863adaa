"""MLP modules: the gated MLP of Llama/Mistral/Qwen2/Gemma/Phi-3/Falcon-H1 and Linear -> activation -> Linear.

`GatedMLP` keeps transformers' parameter names (`gate_proj`, `up_proj`, `down_proj`), so the MLP part
of a Llama, Mistral, Qwen2, Gemma or Falcon-H1 checkpoint loads into it unchanged. With
`fuse_gate_up=True` it holds one `gate_up_proj` Linear of (2I, H) = [W_gate; W_up] and runs gate and up
as one GEMM, while its state_dict still carries the split names (state-dict hooks translate both ways),
so checkpoints stay interchangeable with the unfused module and with transformers'. Phi-3's packed
`gate_up_proj` checkpoints load into either form too; `state_dict_layout="packed"` saves in that layout.
Falcon-H1's `mlp_multipliers` are `gate_multiplier` and `down_multiplier`: plain floats of the module, as
in transformers' FalconH1MLP, so they add nothing to the state_dict.

`MLP` is the plain `fc1 -> activation -> fc2` block (CLIP, SigLIP, Phi-2 names) whose fc1 bias is
added by the fused bias + activation kernel. `names=` holds the two Linears under other names
(`LINEAR_NAMES`: GPT-NeoX's and Falcon's `dense_h_to_4h` / `dense_4h_to_h`), so those checkpoints'
keys load unchanged too.

Neither module has a torch class to subclass (STYLE rule 4): the modules they replace are
transformers', matched by parameter names. `backend` may be set on an instance as on the norms.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kernel_pytorch import functional as F
from kernel_pytorch.functional import Backend
from kernel_pytorch.nn._recompute import recompute_norm_outputs
from kernel_pytorch.reference._act_checks import check_activation, check_multiplier

_GATE, _UP, _PACKED = "gate_proj.", "up_proj.", "gate_up_proj."
# (first, second) Linear names of the fc -> act -> fc MLPs `MLP.from_module` recognises
LINEAR_NAMES = (("fc1", "fc2"), ("dense_h_to_4h", "dense_4h_to_h"))
# transformers' activation modules (ACT2FN) whose math is one of ours; the name alone decides, and
# optimize()'s probe checks the module computes it
_HF_ACTIVATIONS = {"GELUActivation": "gelu", "GELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh",
                   "SiLUActivation": "silu"}


def _layout_check(layout: str) -> str:
    if layout not in ("split", "packed"):
        raise ValueError(f"state_dict_layout must be 'split' or 'packed' (got {layout!r})")
    return layout


def _keep_down_last(state_dict: dict, prefix: str) -> None:
    """Move down_proj's entries behind the gate/up ones just rewritten (the module's own order)."""
    if hasattr(state_dict, "move_to_end"):
        for key in [k for k in state_dict if k.startswith(prefix + "down_proj.")]:
            state_dict.move_to_end(key)


def _save_hook(module: GatedMLP, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """state_dict post-hook: write the gate/up projections in `module.state_dict_layout`, in the order
    transformers' modules list them (gate weight, gate bias, up weight, up bias, then down_proj)."""
    fused = module.fuse_gate_up
    if (module.state_dict_layout == "split") != fused:
        return  # the parameters already carry the names of the layout asked for
    fields = ("weight", "bias")
    if fused:
        packed = {f: state_dict.pop(prefix + _PACKED + f, None) for f in fields}
        # copies, not views: safetensors refuses tensors that share memory
        halves = {f: t.chunk(2, dim=0) for f, t in packed.items() if t is not None}
        for i, name in enumerate((_GATE, _UP)):
            for f, pair in halves.items():
                state_dict[prefix + name + f] = pair[i].clone()
    else:
        split = {f: (state_dict.pop(prefix + _GATE + f, None), state_dict.pop(prefix + _UP + f, None))
                 for f in fields}
        for f, (gate, up) in split.items():
            if gate is not None and up is not None:
                state_dict[prefix + _PACKED + f] = torch.cat([gate, up], dim=0)
    _keep_down_last(state_dict, prefix)


def _load_hook(module: GatedMLP, state_dict: dict, prefix: str, local_metadata: dict, strict: bool,
               missing_keys: list, unexpected_keys: list, error_msgs: list) -> None:
    """load_state_dict pre-hook: accept the split names and the packed one, whichever the module holds."""
    for name in ("weight", "bias"):
        gate_key, up_key, packed_key = (prefix + p + name for p in (_GATE, _UP, _PACKED))
        if module.fuse_gate_up and packed_key not in state_dict and gate_key in state_dict and up_key in state_dict:
            state_dict[packed_key] = torch.cat([state_dict.pop(gate_key), state_dict.pop(up_key)], dim=0)
        elif not module.fuse_gate_up and packed_key in state_dict and gate_key not in state_dict:
            packed = state_dict.pop(packed_key)
            if packed.shape[0] % 2:
                error_msgs.append(f"{packed_key} holds [gate; up] rows, so an even number of them "
                                  f"(got shape {tuple(packed.shape)})")
                continue
            state_dict[gate_key], state_dict[up_key] = packed.chunk(2, dim=0)


class GatedMLP(torch.nn.Module):
    """down_proj(act(gate_proj(x) * m_g) * up_proj(x)) * m_d, transformers' LlamaMLP (m_g = m_d = 1) and
    FalconH1MLP, on kernel_pytorch's kernels.

    Args:
        hidden_size: H.
        intermediate_size: I.
        activation: "silu" (SwiGLU), "gelu", "gelu_tanh" (GEGLU), "relu", or transformers' names
            ("swish", "gelu_pytorch_tanh").
        bias: biases on all three projections (Llama's `mlp_bias`).
        fuse_gate_up: hold gate and up as one (2I, H) `gate_up_proj` and run them as one GEMM.
        state_dict_layout: "split" (gate_proj/up_proj, Llama) or "packed" (gate_up_proj, Phi-3): the
            names state_dict() writes. load_state_dict() accepts either.
        device, dtype: of the parameters.
        gate_multiplier: m_g, applied to gate_proj's output before the activation (Falcon-H1's
            mlp_multipliers[0]); a finite real number.
        down_multiplier: m_d, applied to down_proj's output (mlp_multipliers[1]).
    forward: x (..., H) -> (..., H) of x's dtype. While recording gradients on CUDA only x and the
    gate/up outputs stay alive for the backward (functional/mlp.py), multipliers or not.
    """

    backend: Backend = "auto"

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        activation: str = "silu",
        bias: bool = False,
        fuse_gate_up: bool = False,
        state_dict_layout: Literal["split", "packed"] = "split",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        gate_multiplier: float = 1.0,
        down_multiplier: float = 1.0,
    ) -> None:
        super().__init__()
        self.activation = check_activation(activation)
        self.gate_multiplier = check_multiplier("gate_multiplier", gate_multiplier)
        self.down_multiplier = check_multiplier("down_multiplier", down_multiplier)
        self.state_dict_layout = _layout_check(state_dict_layout)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.fuse_gate_up = bool(fuse_gate_up)
        kw = {"bias": bias, "device": device, "dtype": dtype}
        if self.fuse_gate_up:
            self.gate_up_proj = torch.nn.Linear(hidden_size, 2 * intermediate_size, **kw)
        else:
            self.gate_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
            self.up_proj = torch.nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = torch.nn.Linear(intermediate_size, hidden_size, **kw)
        self.register_state_dict_post_hook(_save_hook)
        self.register_load_state_dict_pre_hook(_load_hook)

    def forward(self, x: Tensor) -> Tensor:
        down = self.down_proj
        projs = (self.gate_up_proj,) if self.fuse_gate_up else (self.gate_proj, self.up_proj)
        if not _all_linear(down, *projs):
            return self._by_modules(x)
        with recompute_norm_outputs():  # where x is a norm's output, its input is kept instead
            if self.fuse_gate_up:
                gu = self.gate_up_proj
                return F.gated_mlp_packed(x, gu.weight, down.weight, self.activation, gate_up_bias=gu.bias,
                                          down_bias=down.bias, gate_multiplier=self.gate_multiplier,
                                          down_multiplier=self.down_multiplier, backend=self.backend)
            gate, up = self.gate_proj, self.up_proj
            return F.gated_mlp(x, gate.weight, up.weight, down.weight, self.activation, gate_bias=gate.bias,
                               up_bias=up.bias, down_bias=down.bias, gate_multiplier=self.gate_multiplier,
                               down_multiplier=self.down_multiplier, backend=self.backend)

    def _by_modules(self, x: Tensor) -> Tensor:
        """Projections that are not torch Linears (QuantizedLinear, a LoRA layer) run as themselves,
        around our gated activation."""
        options = {"gate_multiplier": self.gate_multiplier, "backend": self.backend}
        if self.fuse_gate_up:
            h = F.gated_act_packed(self.gate_up_proj(x), self.activation, **options)
        else:
            h = F.gated_act(self.gate_proj(x), self.up_proj(x), self.activation, **options)
        y = self.down_proj(h)
        return y if self.down_multiplier == 1.0 else y * self.down_multiplier

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"activation={self.activation!r}, fuse_gate_up={self.fuse_gate_up}{multipliers_repr(self)}")

    @classmethod
    def from_module(cls, mlp: torch.nn.Module, activation: str | None = None) -> GatedMLP:
        """A GatedMLP computing what an HF-style gated MLP computes, SHARING its parameters.

        Recognised by structure, not class: `gate_proj` + `up_proj` + `down_proj` Linears (LlamaMLP,
        MistralMLP, Qwen2MLP, GemmaMLP, FalconH1MLP) or `gate_up_proj` + `down_proj` (Phi3MLP: ours is
        then fused and saves in the packed layout). The activation is `activation` if given, else the
        source's activation module when it is torch's (nn.SiLU, nn.GELU, nn.ReLU), else its
        `config.hidden_act`. The multipliers are the source's `gate_multiplier` and `down_multiplier`
        attributes where it has them (FalconH1MLP's), else 1. The returned module holds the very
        Parameter objects of `mlp` (same device, dtype and storage: training either trains both); copy
        them for an independent one.

        Raises:
            TypeError: `mlp` lacks those projections, or one is not a torch.nn.Linear.
            TypeError, ValueError: a `gate_multiplier` or `down_multiplier` that is not a finite number.
            ValueError: shapes that do not form a gated MLP, or an activation we do not run.
        """
        packed = hasattr(mlp, "gate_up_proj")
        names = ("gate_up_proj", "down_proj") if packed else ("gate_proj", "up_proj", "down_proj")
        projs = [_linear(mlp, n) for n in names]
        hidden = projs[0].in_features
        inter = projs[0].out_features // 2 if packed else projs[0].out_features
        if packed and projs[0].out_features % 2:
            raise ValueError(f"gate_up_proj holds [gate; up] rows, so an even number (got {projs[0].out_features})")
        if not packed and (projs[1].in_features, projs[1].out_features) != (hidden, inter):
            raise ValueError(f"up_proj must map {hidden} -> {inter} as gate_proj does "
                             f"(got {projs[1].in_features} -> {projs[1].out_features})")
        if (projs[-1].in_features, projs[-1].out_features) != (inter, hidden):
            raise ValueError(f"down_proj must map {inter} -> {hidden} (got {projs[-1].in_features} -> "
                             f"{projs[-1].out_features})")
        biased = {p.bias is not None for p in projs}
        if len(biased) != 1:
            raise ValueError("the projections must all have a bias or all have none")
        act = activation if activation is not None else _activation_of(mlp, ("act_fn", "activation_fn", "act"))
        ours = cls(hidden, inter, act, bias=biased.pop(), fuse_gate_up=packed,
                   state_dict_layout="packed" if packed else "split", device="meta",
                   gate_multiplier=getattr(mlp, "gate_multiplier", 1.0),
                   down_multiplier=getattr(mlp, "down_multiplier", 1.0))
        for name, src in zip(names, projs):
            dst = getattr(ours, name)
            dst.weight = src.weight
            if src.bias is not None:
                dst.bias = src.bias
        return ours


class MLP(torch.nn.Module):
    """fc2(act(fc1(x))) with fc1's bias added by the fused bias + activation kernel.

    Args:
        hidden_size: H.
        intermediate_size: I.
        activation: "gelu", "gelu_tanh", "silu", "relu" (or transformers' names).
        bias: biases on fc1 and fc2.
        device, dtype: of the parameters.
        names: the attribute (and state_dict) names of fc1 and fc2: ("fc1", "fc2") as CLIP's, SigLIP's
            and Phi-2's MLPs have them, ("dense_h_to_4h", "dense_4h_to_h") as GPT-NeoX's and Falcon's.
    forward: x (..., H) -> (..., H) of x's dtype.
    """

    backend: Backend = "auto"

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "gelu", bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None, *,
                 names: tuple[str, str] = LINEAR_NAMES[0]) -> None:
        super().__init__()
        self.activation = check_activation(activation)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        if len(names) != 2 or len(set(names)) != 2 or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(f"names must be two different attribute names (got {names!r})")
        self.names = tuple(names)
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.add_module(names[0], torch.nn.Linear(hidden_size, intermediate_size, **kw))
        self.add_module(names[1], torch.nn.Linear(intermediate_size, hidden_size, **kw))

    def forward(self, x: Tensor) -> Tensor:
        fc1, fc2 = self._modules[self.names[0]], self._modules[self.names[1]]
        if not _all_linear(fc1, fc2):  # QuantizedLinear, a LoRA layer: the projections run as themselves
            return fc2(F.bias_act(fc1(x), None, self.activation, backend=self.backend))
        return F.bias_act_mlp(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, self.activation, backend=self.backend)

    def extra_repr(self) -> str:
        names = "" if self.names == LINEAR_NAMES[0] else f", names={self.names!r}"
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"activation={self.activation!r}{names}")

    @classmethod
    def from_module(cls, mlp: torch.nn.Module, activation: str | None = None,
                    names: tuple[str, str] | None = None) -> MLP:
        """An MLP sharing the parameters of a module with fc1/fc2 Linears under `names`, by default the
        first pair of `LINEAR_NAMES` it has (CLIPMLP, SiglipMLP, PhiMLP: fc1/fc2; GPTNeoXMLP, FalconMLP:
        dense_h_to_4h/dense_4h_to_h), kept under those names; activation as in `GatedMLP.from_module`
        (its module `activation_fn`/`act`/`act_fn`, transformers' GELU/SiLU modules included)."""
        if names is None:
            names = next((pair for pair in LINEAR_NAMES if all(hasattr(mlp, n) for n in pair)), LINEAR_NAMES[0])
        first, second = names
        fc1, fc2 = _linear(mlp, first), _linear(mlp, second)
        if (fc2.in_features, fc2.out_features) != (fc1.out_features, fc1.in_features):
            raise ValueError(f"{second} must map {fc1.out_features} -> {fc1.in_features} "
                             f"(got {fc2.in_features} -> {fc2.out_features})")
        if (fc1.bias is None) != (fc2.bias is None):
            raise ValueError(f"{first} and {second} must both have a bias or both have none")
        act = activation if activation is not None else _activation_of(mlp, ("activation_fn", "act", "act_fn"))
        ours = cls(fc1.in_features, fc1.out_features, act, bias=fc1.bias is not None, device="meta", names=names)
        for name, src in zip(names, (fc1, fc2)):
            dst = getattr(ours, name)
            dst.weight = src.weight
            if src.bias is not None:
                dst.bias = src.bias
        return ours


def _all_linear(*modules: torch.nn.Module) -> bool:
    """Whether every projection is a torch Linear, whose weight our fused paths read directly."""
    return all(isinstance(m, torch.nn.Linear) for m in modules)


def _linear(mlp: torch.nn.Module, name: str) -> torch.nn.Linear:
    """mlp.<name>, which must be a torch.nn.Linear with a floating (out, in) weight."""
    proj = getattr(mlp, name, None)
    if not isinstance(proj, torch.nn.Linear):
        got = "nothing" if proj is None else type(proj).__name__
        raise TypeError(f"{type(mlp).__name__}.{name} must be a torch.nn.Linear (got {got})")
    w = proj.weight
    if not w.is_floating_point() or tuple(w.shape) != (proj.out_features, proj.in_features):
        raise TypeError(f"{type(mlp).__name__}.{name}.weight must be a floating ({proj.out_features}, "
                        f"{proj.in_features}) tensor (got {w.dtype}, {tuple(w.shape)}): a quantized Linear?")
    return proj


def multipliers_repr(mlp: torch.nn.Module) -> str:
    """A GatedMLP's multipliers that are not 1, as its repr names them (", gate_multiplier=0.7"); "" for
    a module without them."""
    values = ((n, getattr(mlp, n, 1.0)) for n in ("gate_multiplier", "down_multiplier"))
    return "".join(f", {n}={v!r}" for n, v in values if v != 1.0)


def _activation_of(mlp: torch.nn.Module, attrs: tuple[str, ...]) -> str:
    """Our name for the activation `mlp` applies: torch's or transformers' activation module, else
    config.hidden_act."""
    for attr in attrs:
        fn = getattr(mlp, attr, None)
        if type(fn).__module__.startswith("transformers.") and type(fn).__name__ in _HF_ACTIVATIONS:
            return _HF_ACTIVATIONS[type(fn).__name__]
        if isinstance(fn, torch.nn.SiLU):
            return "silu"
        if isinstance(fn, torch.nn.ReLU):
            return "relu"
        if isinstance(fn, torch.nn.GELU):
            return "gelu_tanh" if fn.approximate == "tanh" else "gelu"
    hidden_act = getattr(getattr(mlp, "config", None), "hidden_act", None)
    if isinstance(hidden_act, str):
        return check_activation(hidden_act)
    raise ValueError(f"cannot tell {type(mlp).__name__}'s activation (no torch or transformers activation module "
                     f"and no config.hidden_act); pass activation=")
