"""kernel_pytorch.functional's backend resolution: backends resolve as documented, the reason is
logged once, and backend='triton' says why it cannot run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import kernel_pytorch
from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional._dispatch import _resolve
from tests.grid import randn
from tests.ops.norm_helpers import assert_close


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_triton_backend_on_cpu_raises_with_the_reason() -> None:
    with pytest.raises(ValueError, match="backend='triton' cannot run rms_norm: tensors are on cpu"):
        F.rms_norm(randn(4, 8), randn(8), backend="triton")


def test_auto_on_cpu_logs_once_why(caplog: pytest.LogCaptureFixture) -> None:
    from kernel_pytorch._env import log_once

    log_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="kernel_pytorch"):
        F.rms_norm(randn(4, 8, dtype=torch.float64), randn(8, dtype=torch.float64))
        F.rms_norm(randn(4, 8, dtype=torch.float64), randn(8, dtype=torch.float64))
    messages = [r.getMessage() for r in caplog.records if "rms_norm" in r.getMessage()]
    assert len(messages) == 1 and "using the reference" in messages[0]


@pytest.mark.cuda
def test_triton_backend_on_cuda_matches_reference() -> None:
    x = randn(64, 4096, dtype=torch.bfloat16, device="cuda").requires_grad_()
    w = randn(4096, dtype=torch.bfloat16, device="cuda", offset=1.0).requires_grad_()
    y = F.rms_norm(x, w, backend="triton")
    assert_close(y, R.rms_norm(x, w), "y")
    with pytest.raises(ValueError, match="float64"):
        F.rms_norm(x.double(), w.double(), backend="triton")


def test_resolve_paths_on_cpu() -> None:
    """On CPU tensors: the registered op (its CPU kernel is the reference) for kernel dtypes, eager or
    compiling; the reference for other dtypes; backend='triton' refused under compile too."""
    x32, x64 = randn(2, 4), randn(2, 4, dtype=torch.float64)
    assert _resolve("reference", "op", x32, False) == "reference"
    assert _resolve("auto", "op", x32, False) == "op"
    assert _resolve("auto", "op", x64, False) == "reference"
    assert _resolve("auto", "op", x32, True) == "op"
    assert _resolve("auto", "op", x64, True) == "reference"
    with pytest.raises(ValueError, match="backend='triton' cannot run op on cpu tensors"):
        _resolve("triton", "op", x32, True)
    with pytest.raises(ValueError, match="backend must be one of"):
        _resolve("fast", "op", x32, True)


def test_kernels_are_imported_by_the_first_call_that_needs_them() -> None:
    """`import kernel_pytorch` leaves kernel_pytorch.ops (Triton, the ops' registration) out; the
    reference backend never imports it; the first compiled call registers the ops while Dynamo traces,
    so the graph names the op."""
    script = textwrap.dedent(
        """
        import sys
        import torch
        import kernel_pytorch as kp

        assert "kernel_pytorch.ops" not in sys.modules
        x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
        kp.functional.rms_norm(x, w, backend="reference").sum().backward()
        assert "kernel_pytorch.ops" not in sys.modules
        targets = []

        def capture(gm, example_inputs):
            targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
            return gm.forward

        y = torch.compile(lambda x, w: kp.functional.rms_norm(x, w), backend=capture, fullgraph=True)(x, w)
        assert "kernel_pytorch.rms_norm_fwd" in targets, targets
        y.sum().backward()
        print("OK")
        """
    )
    src = str(Path(kernel_pytorch.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("OK"), proc.stdout[-3000:] + proc.stderr[-3000:]
