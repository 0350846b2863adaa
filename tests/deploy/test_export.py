"""`deploy.export`: our ops as `kernel_pytorch::*` nodes, dynamic dims from the analyser, the program
against eager on fresh inputs, save/load, and AOTInductor packages (CPU here; the GPU test carries our
Triton kernels inside the package)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import kernel_pytorch as kp
from kernel_pytorch.assistant.findings import Finding, Severity
from kernel_pytorch.deploy import (
    aoti_package,
    check_program,
    dynamic_dims,
    export,
    fresh_inputs,
    load_package,
    load_program,
    our_ops,
    try_package,
)
from kernel_pytorch.models import build_model
from kernel_pytorch.tolerances import compare_reordered

ROOT = Path(__file__).resolve().parents[2]


class Tiny(nn.Module):
    """(B, T, 16) -> (B, T, 8): a norm our rules swap and a projection; the smallest AOTI model."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(16)
        self.proj = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


@pytest.fixture(scope="module")
def llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model, inputs = build_model("llama-tiny")
    model, report = kp.optimize(model, inputs, seeds=(0,))
    assert report.passed
    return model, inputs


@pytest.fixture(scope="module")
def llama_program(llama: tuple[nn.Module, tuple]) -> torch.export.ExportedProgram:
    model, inputs = llama
    return export(model, inputs)


def test_our_ops_are_kernel_pytorch_nodes(llama_program: torch.export.ExportedProgram) -> None:
    namespaces = {node.target.namespace for node in llama_program.graph.nodes
                  if node.op == "call_function" and hasattr(node.target, "namespace")}
    assert "kernel_pytorch" in namespaces
    assert set(our_ops(llama_program)) >= {"kernel_pytorch::rms_norm_fwd", "kernel_pytorch::gated_act_fwd"}


def test_auto_makes_batch_and_seq_dynamic(llama: tuple[nn.Module, tuple], llama_program) -> None:
    model, inputs = llama
    assert dynamic_dims(model, inputs) == {0: {0: "batch", 1: "seq"}}
    (ids,) = llama_program.graph_signature.user_inputs
    val = next(n for n in llama_program.graph.nodes if n.name == ids).meta["val"]
    assert all(isinstance(s, torch.SymInt) for s in val.shape)
    args, _ = fresh_inputs(llama_program, inputs)
    assert args[0].shape == (inputs[0].shape[0] + 1, inputs[0].shape[1] + 1)
    assert check_program(llama_program, model, inputs).passed


def test_dims_from_the_analysers_findings(llama: tuple[nn.Module, tuple]) -> None:
    model, inputs = llama
    found = Finding(id="recompile.dynamic-dim", severity=Severity.WARNING, title="Recompiles when seq changes",
                    evidence="", data={"dim": 1, "inputs": ["input_ids"]})
    assert dynamic_dims(model, inputs, findings=[found]) == {0: {1: "dim1"}}
    program = export(model, inputs, findings=[found])
    args, _ = fresh_inputs(program, inputs)
    assert args[0].shape == (inputs[0].shape[0], inputs[0].shape[1] + 1)  # only the seq dim varies


def test_caller_dims_and_static(llama: tuple[nn.Module, tuple]) -> None:
    model, inputs = llama
    batch_only = export(model, inputs, dynamic={0: {0: "batch"}})
    assert fresh_inputs(batch_only, inputs)[0][0].shape == (3, inputs[0].shape[1])
    static = export(model, inputs, dynamic=None)
    assert fresh_inputs(static, inputs)[0][0].shape == inputs[0].shape


def test_mismatch_is_reported(llama_program) -> None:
    other, inputs = build_model("llama-tiny", seed=1)
    result = check_program(llama_program, other, inputs)
    assert not result.passed and "MISMATCH" in result.summary()


def test_save_and_load_program(llama: tuple[nn.Module, tuple], llama_program, tmp_path: Path) -> None:
    model, inputs = llama
    torch.export.save(llama_program, tmp_path / "model.pt2")
    loaded = load_program(tmp_path / "model.pt2")
    assert our_ops(loaded) == our_ops(llama_program)
    assert check_program(loaded, model, inputs).passed


# AOTInductor on the CPU: ~15 s for this model on a 2-core machine (C++ compile), so one package shared
@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, torch.Tensor, Path]:
    torch.manual_seed(0)
    model, x = Tiny().eval(), torch.randn(2, 5, 16)
    model, _ = kp.optimize(model, (x,), seeds=(0,))
    path = aoti_package(model, (x,), tmp_path_factory.mktemp("aoti") / "tiny.pt2")
    return model, x, path


def test_aoti_package_runs_fresh_sizes(tiny_package: tuple[nn.Module, torch.Tensor, Path]) -> None:
    model, _, path = tiny_package
    runner = load_package(path)
    x = torch.randn(3, 7, 16)  # another batch and sequence length than the example
    with torch.no_grad():
        assert compare_reordered(runner(x), model(x)).passed


def test_aoti_package_loads_in_a_fresh_process(tiny_package, tmp_path: Path) -> None:
    model, _, path = tiny_package
    x = torch.randn(4, 3, 16)
    with torch.no_grad():
        torch.save({"x": x, "y": model(x)}, tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import torch
        from kernel_pytorch.deploy import load_package
        from kernel_pytorch.tolerances import compare_reordered
        io = torch.load({str(tmp_path / "io.pt")!r})
        result = compare_reordered(load_package({str(path)!r})(io["x"]), io["y"])
        print(result.message("package"))
        raise SystemExit(0 if result.passed else 1)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_try_package_reports_how_a_fresh_load_ended(tiny_package, tmp_path: Path) -> None:
    _, _, path = tiny_package
    good = try_package(path)
    assert good.ok and good.returncode == 0 and "fresh process" in good.summary()
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(path.read_bytes()[:1000])  # truncated: the loader raises, the child exits 1
    bad = try_package(broken)
    assert not bad.ok and bad.returncode == 1 and "failed in a fresh process (exit 1)" in bad.summary()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the global symbol scope of Linux's loader")
def test_share_cxx_runtime_makes_torchs_libstdcxx_global() -> None:
    """After the call the C++ runtime torch loaded answers a lookup in the global scope (where a package
    built with a statically linked libstdc++ binds its C++ symbols), and nothing else was loaded."""
    script = textwrap.dedent("""
        import ctypes, torch
        from kernel_pytorch.deploy import share_cxx_runtime
        maps = lambda: sorted({l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l})
        loaded = maps()
        assert loaded, "torch loads libstdc++"
        assert share_cxx_runtime() is True and share_cxx_runtime() is True
        ctypes.CDLL(None)._ZNSt6locale7classicEv  # raises AttributeError where not global
        assert maps() == loaded, (maps(), loaded)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.cuda
def test_aoti_package_on_the_gpu_carries_our_triton_kernels(tmp_path: Path) -> None:
    model, inputs = build_model("llama-tiny", device="cuda", dtype=torch.bfloat16)
    model, report = kp.optimize(model, inputs, seeds=(0,))
    assert report.passed
    program = export(model, inputs)
    path = aoti_package(program, inputs, tmp_path / "llama.pt2")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        text = "".join(z.read(n).decode(errors="ignore") for n in names
                       if n.endswith((".cpp", ".json", ".h")))
    # our Triton kernel is compiled into the package and launched by it (not an Inductor kernel)
    assert "rms_norm_fwd_kernel" in text or any("rms_norm_fwd_kernel" in n for n in names)
    # a fresh process first: a loader that faults (as torch's own did on the H200 host before
    # load_package shared the process's libstdc++, probes/deploy/probe_aoti_toolchain_h200.log) fails the test
    # with its summary instead of ending the session
    fresh = try_package(path)
    assert fresh.ok, fresh.summary()
    runner = load_package(path)
    ids = torch.randint(0, 512, (3, 17), device="cuda")
    with torch.no_grad():
        out, expected = runner(ids), model(ids)
    assert out.device.type == "cuda"
    assert compare_reordered(out, expected).passed
