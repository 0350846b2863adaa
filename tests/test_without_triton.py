"""Where Triton is missing (macOS, Windows), `import kernel_pytorch` works and the modules and functions
run the pure-torch reference, forward and backward, eager and compiled; backend='triton' says Triton is
not installed. Each case runs in a fresh interpreter with Triton hidden before anything imports it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernel_pytorch

SRC = Path(kernel_pytorch.__file__).resolve().parents[1]

# How Triton is hidden. "finder-raises": a meta-path finder raises ImportError for triton and triton.*
# (so does importlib.util.find_spec). "spec-then-fails": the finder returns a spec whose loader raises
# ImportError (find_spec finds it; the import fails). "no-spec": sys.modules["triton"] = None
# (find_spec answers None; the import fails).
HIDE = textwrap.dedent(
    """
    import importlib.abc, importlib.machinery, importlib.util, sys

    MODE = sys.argv[1]


    class _Fails(importlib.abc.Loader):
        def create_module(self, spec):
            raise ImportError(f"{spec.name} is hidden for the test")

        def exec_module(self, module):
            raise ImportError(f"{module.__name__} is hidden for the test")


    class _HideTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "triton" and not name.startswith("triton."):
                return None
            if MODE == "finder-raises":
                raise ImportError(f"{name} is hidden for the test")
            return importlib.machinery.ModuleSpec(name, _Fails())


    if MODE == "no-spec":
        sys.modules["triton"] = None
        assert importlib.util.find_spec("triton") is None
    else:
        sys.meta_path.insert(0, _HideTriton())
        if MODE == "spec-then-fails":
            assert importlib.util.find_spec("triton") is not None
    try:
        import triton  # noqa: F401
    except ImportError:
        pass
    else:
        raise AssertionError("triton is still importable")
    """
)

CHECKS = textwrap.dedent(
    """
    import logging

    import pytest
    import torch

    logging.basicConfig(level=logging.INFO, format="LOG %(message)s", stream=sys.stdout)

    import kernel_pytorch as kp
    from kernel_pytorch import _env, reference as R

    assert _env.triton_version() is None
    assert _env.triton_status("cpu") == (False, "triton is not installed"), _env.triton_status("cpu")
    assert "kernel_pytorch.ops" not in sys.modules

    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, requires_grad=True)
    r = torch.randn(2, 3, 16, requires_grad=True)
    dy = torch.randn(2, 3, 16)
    rms, ln = kp.nn.RMSNorm(16, eps=1e-6), kp.nn.LayerNorm(16)
    w = torch.randn(16, requires_grad=True)
    q, k = x.view(2, 3, 1, 16), r.view(2, 3, 1, 16)
    cos, sin = kp.nn.RotaryEmbedding(16)(x, torch.arange(3)[None])
    emb, idx = kp.nn.Embedding(7, 16), torch.tensor([[1, 2, 2], [6, 0, 2]])
    gmlp, fused, mlp = kp.nn.GatedMLP(16, 24), kp.nn.GatedMLP(16, 24, "gelu_tanh", fuse_gate_up=True), kp.nn.MLP(16, 24)
    cases = {
        "RMSNorm": (lambda: rms(x), lambda: R.rms_norm(x, rms.weight, 1e-6), (x, rms.weight)),
        "LayerNorm": (lambda: ln(x), lambda: R.layer_norm(x, ln.weight, ln.bias, 1e-5), (x, ln.weight, ln.bias)),
        "add_rms_norm": (
            lambda: sum(kp.functional.add_rms_norm(x, r, w)),
            lambda: sum(R.add_rms_norm(x, r, w, 1e-6)),
            (x, r, w),
        ),
        "apply_rotary": (
            lambda: sum(o.view(2, 3, 16) for o in kp.functional.apply_rotary(q, k, cos, sin, unsqueeze_dim=2)),
            lambda: sum(o.view(2, 3, 16) for o in R.rope(q, k, cos, sin, unsqueeze_dim=2)),
            (x, r),
        ),
        "Embedding": (lambda: emb(idx), lambda: R.embedding(idx, emb.weight), (emb.weight,)),
        "GatedMLP": (
            lambda: gmlp(x),
            lambda: R.gated_mlp(x, gmlp.gate_proj.weight, gmlp.up_proj.weight, gmlp.down_proj.weight, "silu"),
            (x, *gmlp.parameters()),
        ),
        "GatedMLP fused": (
            lambda: fused(x),
            lambda: R.gated_mlp_packed(x, fused.gate_up_proj.weight, fused.down_proj.weight, "gelu_tanh"),
            (x, *fused.parameters()),
        ),
        "MLP": (
            lambda: mlp(x),
            lambda: R.mlp(x, mlp.fc1.weight, mlp.fc1.bias, mlp.fc2.weight, mlp.fc2.bias, "gelu"),
            (x, *mlp.parameters()),
        ),
    }
    eager_only = {"GatedMLP", "MLP"}  # their compiled graphs add nothing GatedMLP fused's does not (time)
    for name, (ours, ref, wrt) in cases.items():
        runs = (ours,) if name in eager_only else (ours, torch.compile(ours, fullgraph=True, backend="aot_eager"))
        for run in runs:
            out, want = run(), ref()
            torch.testing.assert_close(out, want, msg=name)
            for got, expected in zip(torch.autograd.grad(out, wrt, dy), torch.autograd.grad(want, wrt, dy)):
                torch.testing.assert_close(got, expected, msg=name)
    # attention runs on torch's own kernels: nothing of it needs Triton
    attn = kp.nn.Attention(16, 4, 2)
    xa = torch.randn(2, 5, 16, requires_grad=True)
    attn(xa, attention_mask=torch.ones(2, 5)).sum().backward()
    assert xa.grad is not None and torch.isfinite(xa.grad).all()
    # the cross-entropy family: scalar losses, gradients for an upstream gradient != 1
    t = torch.tensor([[1, 0, -100], [15, 3, 7]])
    lw = torch.randn(16, 16, requires_grad=True)
    losses = {
        "cross_entropy": (lambda: kp.functional.cross_entropy(x, t, label_smoothing=0.1),
                          lambda: R.cross_entropy(x, t, None, R.CrossEntropyOptions(label_smoothing=0.1)), (x,)),
        "fused_linear_cross_entropy": (lambda: kp.functional.fused_linear_cross_entropy(x, lw, t),
                                       lambda: R.fused_linear_cross_entropy(x, lw, t), (x, lw)),
    }
    for name, (ours, ref, wrt) in losses.items():
        for run in (ours, torch.compile(ours, fullgraph=True, backend="aot_eager")):
            out, want = run(), ref()
            torch.testing.assert_close(out, want, msg=name)
            g = torch.tensor(0.5)
            for got, expected in zip(torch.autograd.grad(out, wrt, g), torch.autograd.grad(want, wrt, g)):
                torch.testing.assert_close(got, expected, msg=name)
    for call in (
        lambda: kp.functional.cross_entropy(x, t, backend="triton"),
        lambda: kp.functional.fused_linear_cross_entropy(x, lw, t, backend="triton"),
        lambda: kp.functional.rms_norm(x, w, backend="triton"),
        lambda: kp.functional.layer_norm(x, backend="triton"),
        lambda: kp.functional.add_rms_norm(x, r, w, backend="triton"),
        lambda: kp.functional.apply_rotary(q, k, cos, sin, unsqueeze_dim=2, backend="triton"),
        lambda: kp.functional.embedding(idx, emb.weight, backend="triton"),
    ):
        with pytest.raises(ValueError, match="backend='triton' cannot run .*: triton is not installed"):
            call()
    assert "kernel_pytorch.ops" not in sys.modules
    print("OK")
    """
)


@pytest.mark.parametrize("mode", ["finder-raises", "spec-then-fails", "no-spec"])
def test_reference_path_runs_without_triton(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", HIDE + CHECKS, mode], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout[-3000:] + proc.stderr[-3000:]
    # backend="auto" says once per function why it runs the reference
    for op in ("rms_norm", "layer_norm", "add_rms_norm", "cross_entropy", "fused_linear_cross_entropy"):
        logged = [line for line in proc.stdout.splitlines() if line.startswith(f"LOG kernel_pytorch.{op}:")]
        why = "Triton path inactive (triton is not installed); using the reference"
        assert logged == [f"LOG kernel_pytorch.{op}: {why}"]
