"""The cross-entropy suite: registered, byte counts, peers' call signatures, and a quick CPU run end to
end (gate and timing of ours and eager, with peak memory)."""

from __future__ import annotations

import torch

from kernel_pytorch.benchmark.ceilings import Ceilings
from kernel_pytorch.benchmark.suites import cross_entropy as CE
from kernel_pytorch.benchmark.suites import get_suite, runner, suite_names

CEILINGS = Ceilings(device="cpu", copy_gbps=10.0, copy_bytes=1, matmul_tflops=0.1, matmul_shape=(1, 1, 1),
                    matmul_dtype="float32", torch_version=torch.__version__, measured_at="now")


def test_registered_with_counts() -> None:
    assert "cross_entropy" in suite_names() and get_suite("cross_entropy") is CE
    s = CE.tokens_vocab(8192, 128256, "")
    # read the logits (and targets), write the gradient: the 4.2 GB at 8192 x 128256 bf16
    assert CE.CROSS_ENTROPY.pass_bytes(s, 2, "fwd+bwd") == 2 * 8192 * 128256 * 2 + 8 * 8192
    f = CE.tokens_hidden_vocab(8192, 4096, 128256, "")
    assert CE.FUSED_LINEAR_CROSS_ENTROPY.pass_flops(f, "fwd+bwd") == 6 * 8192 * 4096 * 128256
    t = CE.CROSS_ENTROPY.make_inputs(CE.CE_QUICK["cpu"], torch.bfloat16, torch.device("cpu"), 0)
    assert t["target"].dtype == torch.int64 and (t["target"] == -100).any()
    # Liger's forward(lin_weight, _input, target)
    assert CE.FUSED_LINEAR_CROSS_ENTROPY.liger.call == ("weight", "x", "target")


def test_quick_cpu_run_gates_and_times_both_ops() -> None:
    r = runner.run(CE.SUITE, device="cpu", providers=("ours", "eager"), quick=True, ceilings=CEILINGS)
    for op in CE.SUITE.ops:
        rows = r.find(op=op)
        assert rows and all(x.ok for x in rows), [(x.provider, x.status, x.note) for x in rows]
        assert all(x.median_ms > 0 and x.peak_mem_bytes is not None for x in rows)


def test_gate_shape_caps_the_fp64_logits() -> None:
    """Llama-3 at 8192 tokens gates at its own shape; 16384 tokens and the fused loss's Gemma-3 shape on
    the first tokens whose logits fit GATE_LOGITS."""
    from kernel_pytorch.benchmark.suites.cross_entropy import GATE_LOGITS, gate_shape, tokens_hidden_vocab, tokens_vocab

    assert gate_shape(tokens_vocab(8192, 128256, "a")) == tokens_vocab(8192, 128256, "a")
    assert gate_shape(tokens_vocab(16384, 128256, "a")).tokens == 8192
    g = gate_shape(tokens_hidden_vocab(8192, 3840, 262144, "b"))
    assert g.tokens == 4096 and g.hidden == 3840 and g.vocab == 262144 and g.tokens * g.vocab <= GATE_LOGITS
