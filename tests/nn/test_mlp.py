"""MLP modules against transformers' own: LlamaMLP, GemmaMLP (GEGLU, tanh), Phi3MLP (packed gate_up_proj)
and FalconH1MLP (gate and down multipliers) from tiny random configs, and CLIPMLP for the bias + activation
MLP: outputs and every gradient within the tolerance table, state dicts loading both ways in both layouts,
parameters shared by from_module, torch.compile(fullgraph=True) without graph breaks, and the errors."""

from __future__ import annotations

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch.functional import activation as act_mod
from kernel_pytorch.functional import mlp as mlp_mod
from tests.grid import compile_and_count_breaks, device_under_test, randn
from tests.ops.norm_helpers import assert_close

transformers = pytest.importorskip("transformers")

H, I = 16, 24  # noqa: E741
DIMS = {"hidden_size": H, "intermediate_size": I, "num_attention_heads": 2, "num_key_value_heads": 2}
FALCON_H1 = {"gate_multiplier": 0.7, "down_multiplier": 1.9}  # its config's mlp_multipliers


def _hf(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        from transformers.models.llama.modeling_llama import LlamaConfig, LlamaMLP
        return LlamaMLP(LlamaConfig(**DIMS)).to(dtype)
    if kind == "llama_bias":
        from transformers.models.llama.modeling_llama import LlamaConfig, LlamaMLP
        return LlamaMLP(LlamaConfig(**DIMS, mlp_bias=True)).to(dtype)
    if kind == "gemma":
        from transformers.models.gemma.modeling_gemma import GemmaConfig, GemmaMLP
        return GemmaMLP(GemmaConfig(**DIMS, hidden_act="gelu_pytorch_tanh", head_dim=8)).to(dtype)
    if kind == "falcon_h1":
        from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Config, FalconH1MLP
        return FalconH1MLP(FalconH1Config(**DIMS, mlp_multipliers=list(FALCON_H1.values()))).to(dtype)
    from transformers.models.phi3.modeling_phi3 import Phi3Config, Phi3MLP
    return Phi3MLP(Phi3Config(**DIMS)).to(dtype)


def _same_function(ours: torch.nn.Module, theirs: torch.nn.Module, dtype: torch.dtype, what: str,
                   device: str = "cpu") -> None:
    """Output, dx and every parameter gradient of `ours` against `theirs` for one input and upstream grad."""
    x = randn(2, 3, H, dtype=dtype, device=device).requires_grad_()
    y, want = ours(x), theirs(x)
    assert_close(y, want, f"{what} y")
    dy = randn(*y.shape, dtype=dtype, device=device)
    got = torch.autograd.grad(y, [x, *ours.parameters()], dy)
    exp = torch.autograd.grad(want, [x, *theirs.parameters()], dy)
    assert_close(got[0], exp[0], f"{what} dx")
    ours_grads = dict(zip([n for n, _ in ours.named_parameters()], got[1:]))
    for (name, _), e in zip(theirs.named_parameters(), exp[1:]):
        if name.startswith(("gate_proj.", "up_proj.")) and name not in ours_grads:  # ours fused
            half = 0 if name.startswith("gate_proj.") else 1
            g = ours_grads["gate_up_proj." + name.split(".")[1]].chunk(2, dim=0)[half]
        elif name.startswith("gate_up_proj.") and name not in ours_grads:  # theirs packed, ours split
            field = name.split(".")[1]
            g = torch.cat([ours_grads["gate_proj." + field], ours_grads["up_proj." + field]])
        else:
            g = ours_grads[name]
        assert_close(g, e, f"{what} d{name}")


@pytest.mark.parametrize("kind,dtype", [("llama", torch.float32), ("llama_bias", torch.float32),
                                        ("gemma", torch.bfloat16), ("phi3", torch.float32),
                                        ("falcon_h1", torch.float32), ("falcon_h1", torch.bfloat16)])
def test_from_module_shares_parameters_and_matches(kind: str, dtype: torch.dtype) -> None:
    hf = _hf(kind, dtype)
    ours = kp.nn.GatedMLP.from_module(hf)
    assert ours.activation == ("gelu_tanh" if kind == "gemma" else "silu")
    assert ours.fuse_gate_up == (kind == "phi3")
    multipliers = FALCON_H1 if kind == "falcon_h1" else {"gate_multiplier": 1.0, "down_multiplier": 1.0}
    assert (ours.gate_multiplier, ours.down_multiplier) == tuple(multipliers.values())
    for (name, p), (hf_name, q) in zip(ours.named_parameters(), hf.named_parameters()):
        assert name == hf_name and p is q  # the very Parameter objects: shared, not copied
    _same_function(ours, hf, dtype, kind)
    assert list(ours.state_dict()) == list(hf.state_dict())  # Phi-3's source saves packed


@pytest.mark.parametrize("kind", ["llama_bias", "gemma", "phi3", "falcon_h1"])
@pytest.mark.parametrize("fuse", [False, True])
def test_state_dicts_load_both_ways(kind: str, fuse: bool) -> None:
    """An HF checkpoint loads into ours (either form), ours matches it, and ours' checkpoint loads into HF."""
    hf = _hf(kind)
    act = "gelu_pytorch_tanh" if kind == "gemma" else "silu"
    layout = "packed" if kind == "phi3" else "split"
    ours = kp.nn.GatedMLP(H, I, act, bias=kind == "llama_bias", fuse_gate_up=fuse, state_dict_layout=layout,
                          **(FALCON_H1 if kind == "falcon_h1" else {}))
    ours.load_state_dict(hf.state_dict())
    _same_function(ours, hf, torch.float32, f"{kind} fuse={fuse}")
    sd = ours.state_dict()
    assert list(sd) == list(hf.state_dict())
    fresh = _hf(kind)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    fresh.load_state_dict(sd)
    for (name, a), b in zip(fresh.state_dict().items(), hf.state_dict().values()):
        assert torch.equal(a, b), name


def test_fused_split_checkpoints_are_copies_in_the_module_order() -> None:
    ours = kp.nn.GatedMLP(H, I, bias=True, fuse_gate_up=True)
    sd = ours.state_dict()
    assert list(sd) == ["gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias",
                        "down_proj.weight", "down_proj.bias"]
    w = ours.gate_up_proj.weight
    assert torch.equal(torch.cat([sd["gate_proj.weight"], sd["up_proj.weight"]]), w)
    assert sd["gate_proj.weight"].untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    nested = torch.nn.Sequential(kp.nn.GatedMLP(H, I, fuse_gate_up=True))
    nested.load_state_dict({"0." + k: v for k, v in kp.nn.GatedMLP(H, I).state_dict().items()})
    assert sorted(nested.state_dict()) == ["0.down_proj.weight", "0.gate_proj.weight", "0.up_proj.weight"]


def test_block_path_of_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA eager path (whole-block function, launchers on the interpreter here) of a fused module."""
    for module in (mlp_mod, act_mod):
        monkeypatch.setattr(module, "_resolve", lambda backend, op, x, compiling: "eager")
    for kind in ("phi3", "falcon_h1"):  # on the launchers' device: CUDA, or the interpreter's CPU
        hf = _hf(kind).to(device_under_test())
        _same_function(kp.nn.GatedMLP.from_module(hf), hf, torch.float32, f"{kind} block", device_under_test())


@pytest.mark.parametrize("kind", ["llama_bias", "phi3", "falcon_h1", "clip"])
def test_hooked_projections_run_as_modules(kind: str) -> None:
    """A hook on a projection (parallelize_module's, a LoRA wrapper's): the block calls the projections as
    modules, so the hooks run, and still computes the source's function."""
    if kind == "clip":
        from transformers.models.clip.modeling_clip import CLIPMLP, CLIPVisionConfig

        torch.manual_seed(0)
        hf = CLIPMLP(CLIPVisionConfig(hidden_size=H, intermediate_size=I, hidden_act="gelu", num_attention_heads=2))
        ours, names = kp.nn.MLP.from_module(hf), ("fc1", "fc2")
    else:
        hf = _hf(kind)
        ours = kp.nn.GatedMLP.from_module(hf)
        names = ("gate_up_proj", "down_proj") if kind == "phi3" else ("gate_proj", "up_proj", "down_proj")
    seen = []
    for name in names:
        getattr(ours, name).register_forward_hook(lambda m, args, out, name=name: seen.append(name))
    _same_function(ours, hf, torch.float32, f"{kind} hooked")
    assert seen == list(names), seen


def test_modules_compile_without_breaks() -> None:
    """One graph for both GatedMLP forms (one compile keeps the test short; the bias + activation MLP's
    op compiles in tests/functional/test_activation.py)."""
    model = torch.nn.Sequential(kp.nn.GatedMLP(H, I, "gelu_tanh", **FALCON_H1),
                                kp.nn.GatedMLP(H, I, fuse_gate_up=True, bias=True))
    x = randn(4, H).requires_grad_()
    out, breaks = compile_and_count_breaks(model, x)
    assert breaks == 0
    want = model(x)
    assert_close(out, want, "compiled")
    dy, wrt = randn(4, H), (x, *model.parameters())
    for n, a, e in zip(range(len(wrt)), torch.autograd.grad(out, wrt, dy), torch.autograd.grad(want, wrt, dy)):
        assert_close(a, e, f"compiled grad {n}")


def test_module_saves_x_gate_up_not_h() -> None:
    """Training keeps x (once), gate and up (the fused form: gate_up) for the backward, not h = act(gate) * up."""
    for model, widths in ((kp.nn.GatedMLP(H, I, bias=True), [H, I, I]),
                          (kp.nn.GatedMLP(H, I, "gelu", fuse_gate_up=True), [H, 2 * I]),
                          (kp.nn.GatedMLP(H, I, bias=True, **FALCON_H1), [H, I, I])):
        saved: list[tuple[int, ...]] = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: saved.append(tuple(t.shape)) or t,
                                                      lambda t: t):
            model(randn(5, H).requires_grad_())
        assert sorted(s for s in saved if s[0] == 5) == sorted((5, w) for w in widths)


def test_export_with_multipliers() -> None:
    """torch.export keeps the registered gated activation, the gate multiplier its argument, and the down
    multiplier on the Linear's output."""
    model, x = kp.nn.GatedMLP(H, I, **FALCON_H1), randn(3, H)
    ep = torch.export.export(model, (x,))
    assert "kernel_pytorch.gated_act_fwd" in str(ep.graph) and "0.7" in str(ep.graph)
    assert_close(ep.module()(x), model(x), "exported")


def test_multipliers_in_repr_only_when_not_one_and_never_in_the_state_dict() -> None:
    plain, scaled = kp.nn.GatedMLP(H, I), kp.nn.GatedMLP(H, I, **FALCON_H1)
    assert "multiplier" not in repr(plain)
    assert "gate_multiplier=0.7, down_multiplier=1.9" in repr(scaled)
    assert "down_multiplier" not in repr(kp.nn.GatedMLP(H, I, gate_multiplier=0.5))
    assert list(scaled.state_dict()) == list(plain.state_dict())
    scaled.load_state_dict(plain.state_dict())  # a Llama-style checkpoint loads; the multipliers stay
    assert (scaled.gate_multiplier, scaled.down_multiplier) == (0.7, 1.9)
    assert kp.nn.GatedMLP(H, I, down_multiplier=2).down_multiplier == 2.0  # an int is taken as a float


def test_bias_act_mlp_matches_clip_mlp() -> None:
    from transformers.models.clip.modeling_clip import CLIPMLP, CLIPVisionConfig

    torch.manual_seed(0)
    hf = CLIPMLP(CLIPVisionConfig(hidden_size=H, intermediate_size=I, hidden_act="gelu", num_attention_heads=2))
    ours = kp.nn.MLP.from_module(hf)
    assert ours.fc1.weight is hf.fc1.weight and ours.activation == "gelu"
    _same_function(ours, hf, torch.float32, "clip")
    fresh = kp.nn.MLP(H, I, "gelu")
    fresh.load_state_dict(hf.state_dict())
    _same_function(fresh, hf, torch.float32, "clip loaded")


def test_activation_from_a_torch_module_and_errors() -> None:
    class Plain(torch.nn.Module):
        def __init__(self, act: torch.nn.Module) -> None:
            super().__init__()
            self.gate_proj, self.up_proj = torch.nn.Linear(H, I, bias=False), torch.nn.Linear(H, I, bias=False)
            self.down_proj, self.act_fn = torch.nn.Linear(I, H, bias=False), act

    assert kp.nn.GatedMLP.from_module(Plain(torch.nn.GELU("tanh"))).activation == "gelu_tanh"
    assert kp.nn.GatedMLP.from_module(Plain(torch.nn.Tanh()), activation="relu").activation == "relu"
    with pytest.raises(ValueError, match="pass activation="):
        kp.nn.GatedMLP.from_module(Plain(torch.nn.Tanh()))
    bad = Plain(torch.nn.SiLU())
    bad.up_proj = torch.nn.Linear(H, I + 1, bias=False)
    with pytest.raises(ValueError, match="up_proj"):
        kp.nn.GatedMLP.from_module(bad)
    with pytest.raises(TypeError, match="gate_proj must be a torch.nn.Linear"):
        kp.nn.GatedMLP.from_module(torch.nn.Module())
    with pytest.raises(ValueError, match="activation"):
        kp.nn.GatedMLP(H, I, "quick_gelu")
    with pytest.raises(ValueError, match="state_dict_layout"):
        kp.nn.GatedMLP(H, I, state_dict_layout="fused")
    with pytest.raises(ValueError, match="gate_multiplier must be finite"):
        kp.nn.GatedMLP(H, I, gate_multiplier=float("nan"))
    odd = Plain(torch.nn.SiLU())
    odd.down_multiplier = "2"
    with pytest.raises(TypeError, match="down_multiplier must be a real number"):
        kp.nn.GatedMLP.from_module(odd)
    with pytest.raises(RuntimeError, match="gate_up_proj.weight holds"):
        kp.nn.GatedMLP(H, I).load_state_dict({"gate_up_proj.weight": torch.zeros(2 * I + 1, H),
                                             "down_proj.weight": torch.zeros(H, I)})


def test_compiled_backward_receives_x_gate_up_not_h() -> None:
    """What torch.compile's partition (min-cut, as Inductor's) keeps for the backward: x, gate and up;
    h is recomputed in the backward, not saved (before gated_down the composed Linear saved it); the
    multipliers add nothing to it."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd

    saved: list[tuple[int, ...]] = []

    def bw_compiler(gm, example_inputs):
        saved.extend(tuple(n.meta["val"].shape) for n in gm.graph.nodes
                     if n.op == "placeholder" and not n.name.startswith("tangents"))
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward), bw_compiler=bw_compiler,
                           partition_fn=min_cut_rematerialization_partition)
    torch._dynamo.reset()
    model, x = kp.nn.GatedMLP(H, I, "gelu", **FALCON_H1), randn(5, H).requires_grad_()
    torch.compile(model, backend=backend, fullgraph=True)(x).sum().backward()
    assert sorted(s for s in saved if s and s[0] == 5) == [(5, H), (5, I), (5, I)]
