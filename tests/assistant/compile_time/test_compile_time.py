"""Compile time: phases from torch's own instrumentation, cache counters, regional-compilation advice."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.assistant.compile_time.compile_time import analyze_compile_time, find_repeated_blocks, mode_advice
from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.findings import Finding, Severity
from tests.assistant import zoo


def _compile_time(model: torch.nn.Module, *args: object, **options: object) -> list[Finding]:
    return analyze_compile_time(AnalysisContext(model, args, options=AnalysisOptions(**options)))


def _get(findings: list[Finding], finding_id: str) -> Finding:
    (hit,) = [f for f in findings if f.id == finding_id]
    return hit


@pytest.fixture(scope="module")
def inductor() -> list[Finding]:
    """The one Inductor compile of this test module (about 5 s on a 2-core CPU)."""
    torch.manual_seed(0)
    return _compile_time(zoo.TwoBlocks(), torch.randn(2, 4, 16))


def test_inductor_phases_are_present_non_negative_and_add_up(inductor: list[Finding]) -> None:
    phases = _get(inductor, "compile-time.phases")
    seconds = phases.data["phases"]
    assert set(seconds) == {
        "dynamo",
        "cache_keys",
        "aot_autograd",
        "inductor_lowering",
        "autotune",
        "inductor_codegen",
        "kernel_compile",
    }
    assert all(v >= 0 for v in seconds.values())
    total = phases.data["total_s"]
    assert total > 0
    assert sum(seconds.values()) == pytest.approx(total, rel=0.05, abs=1e-3)
    # compiling happens inside the first call, so it cannot take longer than that call
    assert total <= phases.data["first_call_s"]
    assert seconds["dynamo"] > 0
    cache = _get(inductor, "compile-time.cache").data
    # Inductor either compiled the graph (miss) or reused it from the on-disk cache (hit)
    if not cache["aot_autograd_cache"]["hit"]:
        assert seconds["inductor_lowering"] + seconds["inductor_codegen"] > 0
    assert cache["fx_graph_cache"]["hit"] + cache["fx_graph_cache"]["miss"] >= 1 or cache["aot_autograd_cache"]["hit"]
    assert phases.data["steady_call_s"] > 0


def test_slowest_phase_is_named_with_advice(inductor: list[Finding]) -> None:
    slowest = _get(inductor, "compile-time.slowest-phase")
    seconds = _get(inductor, "compile-time.phases").data["phases"]
    assert slowest.data["phase"] == max(seconds, key=seconds.get)
    assert slowest.suggestion
    assert slowest.severity in (Severity.INFO, Severity.WARNING)


def test_repeated_blocks_get_regional_compilation(inductor: list[Finding]) -> None:
    regional = _get(inductor, "compile-time.regional")
    assert regional.data["count"] == 3 and regional.data["block_type"] == "Mlp"
    assert "block.compile()" in regional.suggestion
    assert "estimate" in (regional.estimated_gain or "")


def test_find_repeated_blocks() -> None:
    assert find_repeated_blocks(zoo.Clean()) is None
    blocks = find_repeated_blocks(zoo.TwoBlocks(n=4))
    assert blocks is not None and (blocks.path, blocks.count) == ("blocks", 4)
    assert blocks.param_fraction == pytest.approx(1.0)


def test_aot_eager_has_no_inductor_phases() -> None:
    findings = _compile_time(zoo.Clean(), torch.randn(4, 16), backend="aot_eager")
    seconds = _get(findings, "compile-time.phases").data["phases"]
    assert seconds["aot_autograd"] > 0
    assert seconds["inductor_lowering"] == seconds["inductor_codegen"] == seconds["kernel_compile"] == 0
    assert "no compile cache" in _get(findings, "compile-time.cache").title.lower()


def test_a_failing_backend_is_a_finding() -> None:
    def broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("lowering exploded")

    findings = _compile_time(zoo.Clean(), torch.randn(4, 16), backend=broken)
    failed = _get(findings, "compile-time.failed")
    assert failed.severity is Severity.ERROR and "lowering exploded" in failed.evidence


def test_skipped_when_turned_off() -> None:
    findings = _compile_time(zoo.Clean(), torch.randn(4, 16), measure_compile_time=False)
    assert [f.id for f in findings] == ["compile-time.skipped"]


def test_mode_advice() -> None:
    tuned = mode_advice("max-autotune", "cuda", 12.0, 40.0)
    assert tuned is not None and "30%" in tuned.title
    cpu_graphs = mode_advice("reduce-overhead", "cpu", 0.0, 5.0)
    assert cpu_graphs is not None and cpu_graphs.severity is Severity.WARNING
    assert mode_advice(None, "cuda", 0.0, 5.0) is not None
    assert mode_advice(None, "cpu", 0.0, 5.0) is None


class _Block(torch.nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


class _Stages(torch.nn.Module):
    """`stages[1].blocks`: a digit in the path, a first block that differs, and a small head."""

    def __init__(self) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList(
            [torch.nn.Identity(), torch.nn.Module()]  # the second holds the blocks
        )
        self.stages[1].blocks = torch.nn.Sequential(_Block(8), _Block(), _Block(), _Block())
        self.head = torch.nn.Linear(16, 2)


def _compiled(blocks: list[torch.nn.Module]) -> list[bool]:
    return [getattr(b, "_compiled_call_impl", None) is not None for b in blocks]


@pytest.mark.parametrize(
    "model, code, compiled",
    [
        (torch.nn.Sequential(_Block(), _Block(), _Block()), "for block in model: block.compile()", [True] * 3),
        (_Stages(), "for block in model.stages[1].blocks[1:4]: block.compile()", [False, True, True, True]),
        (
            torch.nn.Sequential(_Block(), torch.nn.ReLU(), _Block(), torch.nn.ReLU(), _Block()),
            "for block in (model[0], model[2], model[4]): block.compile()",
            [True, False, True, False, True],
        ),
    ],
    ids=["root", "digit-path-slice", "listed"],
)
def test_regional_code_runs_and_compiles_exactly_the_repeated_blocks(
    model: torch.nn.Module, code: str, compiled: list[bool]
) -> None:
    blocks = find_repeated_blocks(model)
    assert blocks is not None and blocks.code() == code
    exec(blocks.code(), {"model": model})  # as printed
    container = model if not blocks.path else model.get_submodule(blocks.path)
    assert _compiled(list(container)) == compiled


def test_no_regional_advice_for_siblings_or_a_small_share() -> None:
    class Siblings(torch.nn.Module):  # two identical LayerNorms held by the root, not by a container
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(64), torch.nn.LayerNorm(64)
            self.mlp = torch.nn.Linear(64, 64)

    assert find_repeated_blocks(Siblings()) is None
    small = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Sequential(_Block(4), _Block(4)))
    assert find_repeated_blocks(small) is None  # 2 blocks, well under a quarter of the parameters
    # MobileNet-like: two alike stages among different ones, 40% of the parameters but not a stack of blocks
    lin = torch.nn.Linear
    pipeline = torch.nn.Sequential(lin(64, 65), lin(65, 64), _Block(64), _Block(64), lin(64, 63))
    assert find_repeated_blocks(pipeline) is None
    stack = torch.nn.Sequential(lin(64, 65), lin(65, 64), *(_Block(64) for _ in range(3)))
    assert find_repeated_blocks(stack) is not None


def test_slowest_phase_advice_leaves_out_regional_compilation_without_repeated_blocks() -> None:
    findings = _compile_time(zoo.Clean(), torch.randn(4, 16), backend="eager")
    assert "Regional" not in _get(findings, "compile-time.slowest-phase").suggestion
    assert not [f for f in findings if f.id == "compile-time.regional"]


def test_nothing_compiled_is_one_finding_without_advice() -> None:
    class Gru(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = torch.nn.GRU(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rnn(x)[0]

    if torch._dynamo.config.allow_rnn:  # pragma: no cover - a torch that traces RNNs by default
        pytest.skip("this torch traces nn.GRU")
    findings = _compile_time(Gru(), torch.randn(5, 2, 8), backend="eager")
    assert [f.id for f in findings] == ["compile-time.nothing-compiled"]
    assert not findings[0].suggestion and findings[0].data["frames"] >= 1
