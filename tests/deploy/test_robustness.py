"""Regression suite for the ways compiled custom kernels break in users' hands: our ops (rms_norm,
layer_norm, swiglu, rotary, cross_entropy) in one block under torch.compile with activation
checkpointing, compiled autograd, the max-autotune and reduce-overhead modes, dynamic shapes, and in a
fresh process that loads the compile caches. Each compares the loss and every gradient with the
reference backend in eager (the tolerance table, reordered sums allowed).

CPU notes: the cheap `aot_eager` backend covers tracing, functionalization and the autograd
registration (where these failures live); Inductor runs where the mode or the cache needs it, on a
two-op block (its C++ build is the slow part). On the CPU "reduce-overhead" has no CUDA graphs to
record and runs as the default mode; the CUDA graph and autotuning cases are the `cuda` tests.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils.checkpoint import checkpoint

from kernel_pytorch import functional as F
from kernel_pytorch.tolerances import compare_reordered

ROOT = Path(__file__).resolve().parents[2]
# B*T must differ from every other size (DH, D): with dynamic=True, duck sizing gives equal sizes one
# symbol, and the second call's target length then no longer matches it (a recompile)
B, T, H, DH = 2, 5, 2, 8
D = H * DH  # model width, also the number of classes the loss sees
PARAMS = ("w_norm", "w_ln", "b_ln", "w_gate", "w_up")


def rotary_tables(t: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(t, DH) cos and sin as transformers' RotaryEmbedding builds them (halves repeated)."""
    inv = 1.0 / (10000 ** (torch.arange(0, DH, 2, dtype=torch.float32, device=device) / DH))
    angles = torch.outer(torch.arange(t, dtype=torch.float32, device=device), inv)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def block(x: torch.Tensor, w_norm: torch.Tensor, w_ln: torch.Tensor, b_ln: torch.Tensor, w_gate: torch.Tensor,
          w_up: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, target: torch.Tensor,
          backend: str = "auto") -> torch.Tensor:
    """x (B, T, D) -> scalar loss through every op family: norm, norm, gated act, rotary, loss."""
    b, t, _ = x.shape
    h = F.layer_norm(F.rms_norm(x, w_norm, backend=backend), w_ln, b_ln, backend=backend)
    g = F.swiglu(h @ w_gate, h @ w_up, backend=backend)
    q = g.view(b, t, H, DH).transpose(1, 2)
    k = h.view(b, t, H, DH).transpose(1, 2)
    q, k = F.apply_rotary(q, k, cos, sin, backend=backend)
    logits = (q + k).transpose(1, 2).reshape(b * t, D)
    return F.cross_entropy(logits, target, backend=backend)


def norm_and_loss(x: torch.Tensor, w_norm: torch.Tensor, target: torch.Tensor, backend: str = "auto",
                  **unused: torch.Tensor) -> torch.Tensor:
    """A two-op block for the Inductor cases: Inductor's C++ build on the CPU takes ~15 s for this
    and ~60 s for `block` on a shared 2-core machine."""
    h = F.rms_norm(x, w_norm, backend=backend)
    return F.cross_entropy(h.flatten(0, 1), target, backend=backend)


def make_inputs(b: int = B, t: int = T, seed: int = 0, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Leaves for `block`: x and the parameters require grad; tables and targets do not."""
    gen = torch.Generator().manual_seed(seed)
    draw = lambda *shape, scale=1.0: (torch.randn(*shape, generator=gen) * scale).to(device)
    cos, sin = rotary_tables(t, device)
    out = {"x": draw(b, t, D), "w_norm": 1 + draw(D, scale=0.1), "w_ln": 1 + draw(D, scale=0.1),
           "b_ln": draw(D, scale=0.1), "w_gate": draw(D, D, scale=1 / math.sqrt(D)),
           "w_up": draw(D, D, scale=1 / math.sqrt(D))}
    for v in out.values():
        v.requires_grad_(True)
    return {**out, "cos": cos, "sin": sin, "target": torch.randint(0, D, (b * t,), generator=gen).to(device)}


def loss_and_grads(fn: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor],
                   backward: Callable[[], Any] = contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """{"loss": ..., "grad x": ..., "grad w_norm": ...} of one forward and backward of `fn` (the
    backward inside the context `backward()` returns)."""
    leaves = {k: v.detach().clone().requires_grad_(v.requires_grad) for k, v in inputs.items()}
    loss = fn(**leaves)
    with backward():
        loss.backward()
    return {"loss": loss.detach(), **{f"grad {k}": v.grad for k, v in leaves.items() if v.grad is not None}}


def assert_matches_reference(fn: Callable[..., torch.Tensor], inputs: dict[str, torch.Tensor],
                             backward: Callable[[], Any] = contextlib.nullcontext,
                             reference: Callable[..., torch.Tensor] | None = None) -> None:
    """`fn`'s loss and gradients against `reference` (default: `block` on the reference backend)."""
    got = loss_and_grads(fn, inputs, backward)
    want = loss_and_grads(reference or functools.partial(block, backend="reference"), inputs)
    assert set(got) == set(want) and "grad x" in want
    if reference is None:
        assert set(want) == {"loss", "grad x", *(f"grad {p}" for p in PARAMS)}
    for name, expected in want.items():
        result = compare_reordered(got[name], expected)
        assert result.passed, result.message(name)


def _checkpointed(**kw: torch.Tensor) -> torch.Tensor:
    return checkpoint(block, **kw, use_reentrant=False)


def test_activation_checkpointing_compiled() -> None:
    assert_matches_reference(torch.compile(_checkpointed, backend="aot_eager", fullgraph=True), make_inputs())


def _compiled_autograd(compiler_fn: Callable[..., Any]) -> Any:
    """Compiled autograd's context manager: `_enable` in current torch, `enable` in older releases (the
    `compiled_autograd` config flag needs `loss.backward()` traced inside the compiled frame, which
    torch 2.13 graph-breaks on unless `trace_autograd_ops` is set, a flag older torch lacks)."""
    import torch._dynamo.compiled_autograd as ca

    return (getattr(ca, "_enable", None) or ca.enable)(compiler_fn)


def test_compiled_autograd() -> None:
    from torch._dynamo.utils import counters

    forward = torch.compile(block, backend="aot_eager")

    def backward_compiler(graph: torch.fx.GraphModule) -> Any:
        return torch.compile(graph, backend="aot_eager", fullgraph=True)

    before = counters["compiled_autograd"]["captures"]
    assert_matches_reference(forward, make_inputs(seed=1), lambda: _compiled_autograd(backward_compiler))
    assert counters["compiled_autograd"]["captures"] > before


def test_dynamic_shapes_second_size_does_not_recompile() -> None:
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(block, backend=counter, dynamic=True)
    assert_matches_reference(compiled, make_inputs(B, T, seed=2))
    frames = counter.frame_count
    assert_matches_reference(compiled, make_inputs(B + 1, T + 3, seed=3))
    assert counter.frame_count == frames  # (Dynamo may restart its first analysis: not a recompile)


# Run twice, in two fresh processes with one program each (as a user's job would be): "save" compiles and
# writes the cache artifacts, "load" loads them into an empty cache dir and compiles again. Both check the
# result against the reference. (Artifacts saved from this test process after the other deploy tests ran
# missed in a fresh process, so the saving side is a fresh process too; Inductor's and Dynamo's configs
# were unchanged, the differing key input is not pinned down.)
CACHE_SCRIPT = textwrap.dedent("""
    import functools, json, sys
    import torch
    from torch._dynamo.utils import counters
    from tests.deploy.test_robustness import assert_matches_reference, make_inputs, norm_and_loss
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "load":
        torch.compiler.load_cache_artifacts(open(path, "rb").read())
    # on the CPU reduce-overhead has no CUDA graphs to record: Inductor's default path, checked here
    assert_matches_reference(torch.compile(norm_and_loss, mode="reduce-overhead"), make_inputs(seed=5),
                             reference=functools.partial(norm_and_loss, backend="reference"))
    if mode == "save":
        artifacts, info = torch.compiler.save_cache_artifacts()
        assert info.inductor_artifacts, "the compile recorded no Inductor artifacts to save"
        open(path, "wb").write(artifacts)
    print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"],
                      "misses": counters["inductor"]["fxgraph_cache_miss"]}))
""")


def _cache_run(mode: str, artifacts: Path, cache_dir: Path) -> dict[str, int]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", CACHE_SCRIPT, mode, str(artifacts)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_reduce_overhead_and_compile_caches_in_a_fresh_process(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts.bin"
    # empty cache dirs each: the first compiles from scratch, the second finds only the artifacts
    assert _cache_run("save", artifacts, tmp_path / "first")["misses"] >= 1
    stats = _cache_run("load", artifacts, tmp_path / "second")
    assert stats["hits"] >= 1 and stats["misses"] == 0, stats


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_gpu_modes(mode: str) -> None:
    # max-autotune benchmarks Triton GEMM templates around our kernels and, like reduce-overhead,
    # records CUDA graphs. On the CPU it would tune only Inductor's C++ GEMM templates (none of ours;
    # 50 s for `block` here), so these modes are tested on the GPU only
    compiled = torch.compile(block, mode=mode)
    for seed in (6, 7):  # the second call replays the recorded graph
        assert_matches_reference(compiled, make_inputs(seed=seed, device="cuda"))
