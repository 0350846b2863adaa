"""What a finding says about each fusable pattern kind: its title, what the pattern does today, the fix
(naming the kernel_pytorch component through `components`, "(in development)" until it exists), and
its severity. `fusion` groups the located matches (`Instance`) and writes the findings from these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel_pytorch.assistant.components import component
from kernel_pytorch.assistant.estimates import fmt_bytes
from kernel_pytorch.assistant.findings import Location, Severity
from kernel_pytorch.assistant.fusion.graph import LARGE_VOCAB, Match


@dataclass(frozen=True)
class Instance:
    """One match, located: its function (as the source names it, else its module's class), its
    module and what it costs (eager) against the fused replacement."""

    match: Match
    location: Location | None
    function: str
    module_path: str
    module_type: str
    ops: int
    kernels: int
    bytes_today: int
    bytes_saved: int

    @property
    def kernels_saved(self) -> int:
        return max(0, self.kernels - self.match.fused_kernels)


@dataclass(frozen=True)
class Kind:
    """How findings of one pattern kind read (each a function of the first instance; the title also of the
    number of instances)."""

    title: Callable[[Instance, int], str]
    today: Callable[[Instance], str]
    fix: Callable[[Instance], str]
    severity: Severity = Severity.INFO
    compiles_away: bool = False  # Inductor fuses it under torch.compile (elementwise chains)


def _shape(shape: Any) -> str:
    return "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")" if shape else "?"


def _in(inst: Instance) -> str:
    return f"in `{inst.function}`"


def _many(n: int) -> str:
    return f" ({n} places)" if n > 1 else ""


# the patterns `optimize(rewrite=True)` replaces where they are written (kernel_pytorch.optimize.rewrite:
# weighted RMSNorms and the residual add before one, gated SiLU/GELU, a parameter bias before an
# activation, rotate-half RoPE of q and k, attention written out, a linear head into cross-entropy), said in
# those findings' fixes
_REWRITE = (
    "Or leave the code as it is: `model, report = kernel_pytorch.optimize(model, inputs, rewrite=True)` "
    "replaces the pattern where it is written (its common spellings) with the fused op, validated against "
    "the original and reverted if it fails; `report.rewrites` lists each line it rewrote."
)


def _rms_fix(inst: Instance) -> str:
    d = inst.match.details
    eps = f", eps={d['eps']}" if d.get("eps") is not None else ""
    rms, affine = component("rms_norm"), "" if d.get("weighted") else ", elementwise_affine=False"
    new = (
        f"{rms.short}({d['hidden']}{eps}{affine})" if rms.available else f"torch.nn.RMSNorm({d['hidden']}{eps}{affine})"
    )
    applies = f" {_REWRITE}" if d.get("weighted") else ""
    if "norm" not in inst.module_type.lower():  # written inline in a bigger module's forward, not a norm module
        return (
            f"In `{inst.module_type}.forward`, compute the norm with `torch.nn.functional.rms_norm(x, "
            f"({d['hidden']},), weight{eps})`, or hold a `{new}` child (its `weight` the one used now) and call it; "
            f"{rms.named()} runs it as one kernel, forward and backward.{applies}"
        )
    return (
        f"Replace each `{inst.module_type}` with `{new}` (the same `weight`: "
        f"`new.load_state_dict(old.state_dict())`); {rms.named()} runs it as one kernel, forward and backward. "
        f"Inline code: `torch.nn.functional.rms_norm(x, (D,), weight, eps)`.{applies}"
    )


def _ln_fix(inst: Instance) -> str:
    d, ln = inst.match.details, component("layer_norm")
    new = f"{ln.short}({d['hidden']})" if ln.available else f"torch.nn.LayerNorm({d['hidden']})"
    return (
        f"Replace the handwritten norm with `{new}` (weight and bias copied) or call "
        f"`torch.nn.functional.layer_norm(x, (D,), weight, bias, eps)`; {ln.named()} fuses it, forward and backward."
    )


def _pending(key: str, today: str) -> str:
    """The fix naming component `key`: its call when it exists, else what works meanwhile."""
    comp = component(key)
    if comp.available:
        return f"{comp.named()}: `{comp.short}`."
    return f"{today}; {comp.named()} will do it in one kernel."


def _rope_fix() -> str:
    comp = component("rope")
    if not comp.available:
        return _pending("rope", "`model = torch.compile(model)` fuses the chain today")
    return (f"`q, k = kp.functional.apply_rotary(q, k, cos, sin)` rotates q and k in one kernel, forward and "
            f"backward, from the same cos/sin ({comp.named()} makes them). {_REWRITE} (The spelling it takes: "
            "transformers' `apply_rotary_pos_emb` written out, q and k rotated by one cos/sin unsqueezed at the "
            "heads' dim.)")


def _act_fix(inst: Instance) -> str:
    act = inst.match.details.get("act")
    key = "swiglu" if act == "silu" else "geglu"
    comp = component(key)
    if comp.available:
        mlp = component("gated_mlp").short
        return f"`{comp.short}(gate, up)` in place of `{act}(gate) * up` (or `{mlp}.from_module(mlp)`). {_REWRITE}"
    return (
        f"`model = torch.compile(model)` fuses `{act}(gate) * up` today; {comp.named()} also recomputes "
        f"{act} in the backward instead of saving it ({component('gated_mlp').named()} wraps the whole MLP)."
    )


def _attention_fix(inst: Instance) -> str:
    d = inst.match.details
    mask = ", attn_mask=mask" if d.get("masked") else ""
    scale = ", scale=scale" if d.get("scaled") else ""
    return (
        f"`out = torch.nn.functional.scaled_dot_product_attention(q, k, v{mask}{scale})` (`is_causal=True` in "
        f"place of a causal mask) never materialises the scores; {component('attention').named()} wraps it. "
        f"{_REWRITE} (The spelling it takes: `softmax(q @ k.transpose(-2, -1)` times a number or divided by one "
        "(`/ math.sqrt(d)`), plus an additive float mask or `.masked_fill(mask, float('-inf'))`, `dim=-1) @ v` "
        "on 4-D q, k, v, a dropout with p=0 between; the scale and mask carried as written.)"
    )


def _loop_fix(inst: Instance) -> str:
    return (
        "Attend for every position and head at once: `out = torch.nn.functional.scaled_dot_product_attention(q, k, "
        f"v, is_causal=True)` on (batch, heads, seq, head_dim) tensors, in one call instead of one per iteration "
        "(`is_causal` only where the loop masked future positions); "
        f"{component('attention').named()} does this with a static KV cache for decoding."
    )


def _ce_fix(inst: Instance) -> str:
    comp = component("linear_cross_entropy")
    if comp.available:
        return (f"`loss = {comp.short}()(hidden, lm_head.weight, targets)` computes the loss without the logits. "
                f"{_REWRITE} (The spelling it takes: a head written `F.linear(h, W)`, `h @ W.T` or a bias-free "
                "`nn.Linear` called (`self.lm_head(h)`), the loss "
                "with reduction 'mean' or 'sum', no class weights.)")
    return (
        f"{comp.named()} computes the loss chunk by chunk without ever holding the logits; meanwhile "
        "`torch.compile` of the loss fuses the fp32 cast and the softmax but still writes the logits."
    )


def _bias_fix(inst: Instance) -> str:
    act = inst.match.details.get("act")
    if inst.match.details.get("linear_without_bias"):
        return (
            f"Give the Linear its bias (`nn.Linear(in_features, out_features, bias=True)`): the GEMM adds it in "
            f"its epilogue and `{act}` runs alone; {component('bias_act').named()} fuses bias and {act} too. "
            f"{_REWRITE}"
        )
    return f"{_pending('bias_act', f'`model = torch.compile(model)` fuses the bias add into `{act}` today')} {_REWRITE}"


COMPONENT = {
    "rms-norm": "rms_norm",
    "layer-norm": "layer_norm",
    "rope": "rope",
    "attention": "attention",
    "attention-loop": "attention",
    "gqa-repeat": "attention",
    "residual-norm": "add_rms_norm",
    "bias-act": "bias_act",
    "linear-cross-entropy": "linear_cross_entropy",
}

KINDS: dict[str, Kind] = {
    "rms-norm": Kind(
        lambda i, n: f"Handwritten RMSNorm {_in(i)}{_many(n)}: one fused kernel does its {i.kernels} kernels",
        lambda i: f"mean of squares, rsqrt and scale written out over the last dim ({i.match.details['hidden']})",
        _rms_fix,
        compiles_away=True,
    ),
    "layer-norm": Kind(
        lambda i, n: f"Handwritten LayerNorm {_in(i)}{_many(n)}: one fused kernel does its {i.kernels} kernels",
        lambda i: f"mean, variance and normalisation written out over the last dim ({i.match.details['hidden']})",
        _ln_fix,
        compiles_away=True,
    ),
    "gated-act": Kind(
        lambda i, n: f"`{i.match.details['act']}(gate) * up` {_in(i)}{_many(n)}: a gated MLP in two kernels",
        lambda i: (
            f"the activation's output {_shape(i.match.details.get('shape'))} is written, then read back by the multiply"
        ),
        _act_fix,
        compiles_away=True,
    ),
    "rope": Kind(
        lambda i, n: f"Rotate-half rotary embedding {_in(i)}{_many(n)}: {i.kernels} kernels per tensor",
        lambda i: (
            f"`x * cos + rotate_half(x) * sin` on x {_shape(i.match.details.get('shape'))}: a negated "
            "copy, a concatenation, two multiplies and an add"
        ),
        lambda i: _rope_fix(),
        compiles_away=True,
    ),
    "attention": Kind(
        lambda i, n: (
            f"Attention written out {_in(i)}{_many(n)}: the scores "
            f"{_shape(i.match.details.get('scores'))} are materialised"
        ),
        lambda i: (
            "`softmax(q @ k.T"
            + (" scaled" if i.match.details.get("scaled") else "")
            + (" + mask" if i.match.details.get("masked") else "")
            + ") @ v` writes and reads the full score matrix"
        ),
        _attention_fix,
        severity=Severity.WARNING,
    ),
    "attention-loop": Kind(
        lambda i, n: f"Attention computed in a Python loop {_in(i)} ({n} iterations per forward)",
        lambda i: (
            f"the same `softmax(q @ k.T) @ v` runs once per iteration (over positions or heads; scores "
            f"{_shape(i.match.details.get('scores'))} each), a loop Dynamo unrolls into one small subgraph per "
            "iteration"
        ),
        _loop_fix,
        severity=Severity.WARNING,
    ),
    "gqa-repeat": Kind(
        lambda i, n: f"K/V repeated x{i.match.details['n_rep']} to the query's head count {_in(i)}{_many(n)}",
        lambda i: (
            f"grouped-query attention copies K and V {_shape(i.match.details.get('kv_shape'))} to "
            f"{i.match.details['n_rep']}x the heads, and attention then reads every copy"
        ),
        lambda i: (
            "Pass the un-repeated K and V with `torch.nn.functional.scaled_dot_product_attention(q, k, v, "
            f"enable_gqa=True)` (torch >= 2.5); {component('attention').named()} does GQA without the copy."
        ),
    ),
    "residual-norm": Kind(
        lambda i, n: f"Residual add followed by an RMSNorm {_in(i)}{_many(n)}",
        lambda i: "the sum is written, then read back by the norm",
        lambda i: (
            f"`hidden, residual = {component('add_rms_norm').short}({i.match.details['hidden']}"
            + (f", eps={i.match.details['eps']}" if i.match.details.get("eps") is not None else "")
            + f")(hidden, residual)` in place of the add and the norm ({component('add_rms_norm').named()}; "
            f"same `weight` as the norm it replaces). {_REWRITE}"
        ),
        compiles_away=True,
    ),
    "bias-act": Kind(
        lambda i, n: f"Bias added before `{i.match.details['act']}` {_in(i)}{_many(n)}: two passes for one",
        lambda i: (
            f"`{i.match.details['act']}(x + bias)` on x {_shape(i.match.details.get('shape'))} writes the "
            "sum, then reads it back"
        ),
        _bias_fix,
        compiles_away=True,
    ),
    "linear-cross-entropy": Kind(
        lambda i, n: f"Logits over a {i.match.details['vocab']}-word vocabulary materialised for the loss {_in(i)}",
        lambda i: (
            f"the ({i.match.details['tokens']}, {i.match.details['vocab']}) logits "
            f"({fmt_bytes(i.match.details['logits_bytes'])}) are written, cast and read by cross-entropy (vocabularies "
            f"from {LARGE_VOCAB} words up are worth never materialising)"
        ),
        _ce_fix,
        severity=Severity.WARNING,
    ),
}


__all__ = ["COMPONENT", "KINDS", "Instance", "Kind"]
