"""Drop-in norm modules: same constructor, parameters, state_dict and repr as torch's; same function."""

from __future__ import annotations

import pytest
import torch

import kernel_pytorch as kp
from tests.grid import compile_and_count_breaks, randn
from tests.ops.norm_helpers import assert_close

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
