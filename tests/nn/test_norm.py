"""Drop-in norm modules: same constructor, parameters, state_dict and repr as torch's; same function."""

from __future__ import annotations

import pytest
import torch

import kernel_pytorch as kp
from kernel_pytorch import reference as R
from kernel_pytorch.tolerances import fp64_budget
from tests.grid import compile_and_count_breaks, randn
from tests.ops.norm_helpers import assert_close, assert_compiles_like_eager

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "ours,theirs,kwargs",
    [
        (kp.nn.RMSNorm, torch.nn.RMSNorm, {"normalized_shape": 64, "eps": 1e-6}),
        (kp.nn.RMSNorm, torch.nn.RMSNorm, {"normalized_shape": (4, 16)}),
        (kp.nn.RMSNorm, torch.nn.RMSNorm, {"normalized_shape": 64, "elementwise_affine": False}),
        (kp.nn.LayerNorm, torch.nn.LayerNorm, {"normalized_shape": 64}),
        (kp.nn.LayerNorm, torch.nn.LayerNorm, {"normalized_shape": 64, "bias": False}),
        (kp.nn.LayerNorm, torch.nn.LayerNorm, {"normalized_shape": (4, 16), "elementwise_affine": False}),
    ],
)
def test_drop_in_matches_torch(ours, theirs, kwargs) -> None:
    a, b = ours(**kwargs).to(DEV), theirs(**kwargs).to(DEV)
    assert isinstance(a, theirs)
    assert repr(a) == repr(b)
    assert list(a.state_dict()) == list(b.state_dict())
    with torch.no_grad():
        for p in a.parameters():
            p.copy_(randn(*p.shape, offset=1.0))
    b.load_state_dict(a.state_dict())
    shape = kwargs["normalized_shape"]
    shape = (shape,) if isinstance(shape, int) else shape
    x1 = randn(2, 3, *shape, device=DEV).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    y1, y2 = a(x1), b(x2)
    assert y1.shape == y2.shape
    assert_close(y1, y2, "y")
    dy = randn(*y1.shape, device=DEV)
    y1.backward(dy)
    y2.backward(dy)
    assert_close(x1.grad, x2.grad, "dx")
    for (name, p1), p2 in zip(a.named_parameters(), b.parameters()):
        assert_close(p1.grad, p2.grad, f"d{name}")


@pytest.mark.parametrize("ours,theirs", [(kp.nn.RMSNorm, torch.nn.RMSNorm), (kp.nn.LayerNorm, torch.nn.LayerNorm)])
@pytest.mark.parametrize("scale,eps", [(1e-4, 1e-6), (1.0, 0.1)], ids=["rows_near_zero", "large_eps"])
def test_eps_inside_the_square_root_as_torch(ours, theirs, scale: float, eps: float) -> None:
    """Rows near zero and a large eps, where eps added outside the square root shows: against torch's
    own module (on the GPU this is the kernel; on the CPU the reference)."""
    a, b = ours(64, eps=eps).to(DEV), theirs(64, eps=eps).to(DEV)
    x1 = randn(3, 64, device=DEV, scale=scale).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    y1, y2 = a(x1), b(x2)
    assert_close(y1, y2, "y")
    dy = randn(3, 64, device=DEV)
    y1.backward(dy)
    y2.backward(dy)
    assert_close(x1.grad, x2.grad, "dx")


def test_modules_compile_without_breaks() -> None:
    model = torch.nn.Sequential(kp.nn.LayerNorm(32), torch.nn.Linear(32, 32), kp.nn.RMSNorm(32)).to(DEV)
    x = randn(4, 32, device=DEV)
    out, breaks = compile_and_count_breaks(model, x)
    assert breaks == 0
    assert_close(out, model(x), "compiled")


def test_fused_add_rms_norm_loads_a_llama_state_dict() -> None:
    """HF's LlamaRMSNorm keys are `weight` (and `variance_epsilon` is an attribute)."""
    m = kp.nn.FusedAddRMSNorm(32, eps=1e-5).to(DEV)
    m.load_state_dict({"weight": randn(32, offset=1.0)})
    assert m.variance_epsilon == 1e-5
    x, r = randn(2, 5, 32, device=DEV), randn(2, 5, 32, device=DEV)
    y, h = m(x, r)
    assert_close(h, x + r, "h")
    assert_close(y, kp.functional.rms_norm(x + r, m.weight, 1e-5, backend="reference"), "y")


def test_gemma_offset_starts_at_identity() -> None:
    m = kp.nn.FusedAddRMSNorm(16, offset=1.0)
    assert torch.equal(m.weight.detach(), torch.zeros(16))
    x = randn(3, 16)
    y, _ = m(x, torch.zeros_like(x))
    assert_close(y, kp.functional.rms_norm(x, torch.ones(16), 1e-6), "y")


def test_shape_mismatch_names_normalized_shape() -> None:
    with pytest.raises(ValueError, match="normalized_shape"):
        kp.nn.LayerNorm((4, 16))(randn(2, 64))


def test_backend_can_be_pinned_per_instance() -> None:
    m = kp.nn.RMSNorm(8)
    m.backend = "reference"
    x = randn(2, 8)
    assert_close(m(x), kp.reference.rms_norm(x, m.weight, torch.finfo(torch.float32).eps), "y")
    with pytest.raises(ValueError, match="backend must be one of"):
        m.backend = "fast"
        m(x)


# --- casting: where a bf16/fp16 result rounds ------------------------------------------------------


def test_rms_norm_rounds_as_torch_by_default_and_is_as_close_to_fp64() -> None:
    """bf16 kp.nn.RMSNorm() rounds once, as torch.nn.RMSNorm does: it matches torch's module by the
    table and is no further from fp64 than torch's own bf16 module; casting="llama" (HF's rounding,
    the drop-in's old default) is further."""
    x = randn(16, 512, dtype=torch.bfloat16, device=DEV, scale=3.0)
    theirs = torch.nn.RMSNorm(512, eps=1e-6, device=DEV, dtype=torch.bfloat16)
    with torch.no_grad():
        theirs.weight.copy_(randn(512, dtype=torch.bfloat16, scale=0.5, offset=1.0))
    ours, llama = (
        kp.nn.RMSNorm(512, eps=1e-6, device=DEV, dtype=torch.bfloat16, casting=c) for c in ("torch", "llama")
    )
    ours.load_state_dict(theirs.state_dict())
    llama.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        y_torch, y_ours, y_llama = theirs(x), ours(x), llama(x)
    ref64 = R.rms_norm(x.double(), theirs.weight.detach().double(), 1e-6)
    assert_close(y_ours, y_torch, "y")
    assert fp64_budget(y_ours, y_torch, ref64, factor=1.0).passed
    err = {name: float((y.double() - ref64).abs().max()) for name, y in (("torch", y_torch), ("ours", y_ours),
                                                                       ("llama", y_llama))}
    assert err["ours"] <= err["torch"] < err["llama"], err  # on CPU 0.016, 0.016 (bitwise torch's), 0.025


@pytest.mark.parametrize("casting", ["llama", "gemma", "torch", "none"])
def test_casting_reaches_the_functional(casting: str) -> None:
    x, r = randn(3, 32, dtype=torch.bfloat16, device=DEV, scale=3.0), randn(3, 32, dtype=torch.bfloat16, device=DEV)
    offset = 1.0 if casting == "gemma" else 0.0
    norm = kp.nn.RMSNorm(32, eps=1e-6, dtype=torch.bfloat16, device=DEV, casting=casting)
    fused = kp.nn.FusedAddRMSNorm(32, offset=offset, dtype=torch.bfloat16, device=DEV, casting=casting)
    with torch.no_grad():
        for m in (norm, fused):
            m.weight.copy_(randn(32, dtype=torch.bfloat16, scale=0.5, offset=1.0 - offset))
        assert_close(norm(x), R.rms_norm(x, norm.weight, 1e-6, 0.0, casting), "y")
        y, h = fused(x, r)
        y_ref, h_ref = R.add_rms_norm(x, r, fused.weight, 1e-6, offset, casting)
    assert_close(y, y_ref, "y")
    assert_close(h, h_ref, "h")


def test_llama_casting_matches_llama_rms_norm() -> None:
    """casting="llama": the rounding of HF's LlamaRMSNorm (here models.llama's copy of it)."""
    from kernel_pytorch.models.llama import LlamaRMSNorm

    hf = LlamaRMSNorm(64, eps=1e-5).to(DEV, torch.bfloat16)
    with torch.no_grad():
        hf.weight.copy_(randn(64, dtype=torch.bfloat16, scale=0.5, offset=1.0))
    ours = kp.nn.RMSNorm(64, eps=1e-5, device=DEV, dtype=torch.bfloat16, casting="llama")
    fused = kp.nn.FusedAddRMSNorm(64, eps=1e-5, device=DEV, dtype=torch.bfloat16)
    ours.load_state_dict(hf.state_dict())
    fused.load_state_dict(hf.state_dict())
    x = randn(8, 64, dtype=torch.bfloat16, device=DEV, scale=3.0)
    with torch.no_grad():
        assert_close(ours(x), hf(x), "y")
        assert_close(fused(x, torch.zeros_like(x))[0], hf(x), "fused y")


def test_none_casting_module_compiles_like_eager() -> None:
    """casting="none" (Liger's math in the input dtype) through the module: eager and
    torch.compile(fullgraph=True) against the reference, forward and backward, in bf16."""
    norm = kp.nn.RMSNorm(48, eps=1e-6, dtype=torch.bfloat16, device=DEV, casting="none")
    assert repr(norm).endswith("casting='none')")
    with torch.no_grad():
        norm.weight.copy_(randn(48, dtype=torch.bfloat16, scale=0.5, offset=1.0))
    x = randn(4, 48, dtype=torch.bfloat16, device=DEV, scale=3.0).requires_grad_()
    assert_close(norm(x), R.rms_norm(x, norm.weight, 1e-6, 0.0, "none"), "y")
    assert_compiles_like_eager(norm, (x,))


def test_casting_in_repr_and_checked_at_construction() -> None:
    assert repr(kp.nn.RMSNorm(8)) == repr(torch.nn.RMSNorm(8))
    assert repr(kp.nn.RMSNorm(8, casting="llama")).endswith("casting='llama')")
    assert "casting" not in repr(kp.nn.FusedAddRMSNorm(8))
    assert repr(kp.nn.FusedAddRMSNorm(8, offset=1.0, casting="gemma")).endswith("casting='gemma')")
    for build in (lambda: kp.nn.RMSNorm(8, casting="half"), lambda: kp.nn.FusedAddRMSNorm(8, casting="fp32")):
        with pytest.raises(ValueError, match="casting must be one of"):
            build()


def test_integer_input_error_names_x() -> None:
    """eps=None takes torch.finfo(x.dtype): an int64 x gets our error naming x, not finfo's."""
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        kp.nn.RMSNorm(8)(torch.ones(2, 8, dtype=torch.int64, device=DEV))


def test_rms_norm_offset_matches_gemma() -> None:
    """offset=1.0 with casting="gemma": transformers' GemmaRMSNorm, weight starting at zero."""
    gemma = pytest.importorskip("transformers.models.gemma.modeling_gemma")
    torch.manual_seed(0)
    hf = gemma.GemmaRMSNorm(16, eps=1e-6)
    ours = kp.nn.RMSNorm(16, eps=1e-6, casting="gemma", offset=1.0)
    assert torch.equal(ours.weight, torch.zeros(16)) and "offset=1.0" in repr(ours)
    with torch.no_grad():
        hf.weight.normal_()
        ours.weight.copy_(hf.weight)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    torch.testing.assert_close(ours.to(torch.bfloat16)(x), hf.to(torch.bfloat16)(x))
