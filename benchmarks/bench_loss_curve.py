"""Training curves of the built-in Llama with the fused linear cross-entropy against the unfused loss.

    python benchmarks/bench_loss_curve.py                        # 50 steps; CUDA bf16 when present, else CPU fp32
    python benchmarks/bench_loss_curve.py --out benchmarks/results --device cuda --dtype bfloat16

Two runs from the same initial weights on the same batches, AdamW: one computes its loss as the model
does (lm_head, then fp32 cross-entropy on the logits, `models._common.causal_lm_loss`), the other feeds
the decoder's hidden states and lm_head's weight to `kernel_pytorch.functional.fused_linear_cross_entropy`
(Triton on CUDA, the registered op's CPU kernel on CPU). The batches are learnable sequences (each a
random start and stride modulo the vocabulary), so the loss falls and any drift in the fused gradients
would show in the curve. Writes loss_curve.{json,md,png}: both curves and their largest relative gap.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_pytorch import functional as kpf  # noqa: E402
from kernel_pytorch.benchmark.ceilings import device_name  # noqa: E402
from kernel_pytorch.models.llama import LlamaConfig, LlamaForCausalLM  # noqa: E402

CONFIG = LlamaConfig(vocab_size=2048, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=352)


def batches(steps: int, batch: int, seq: int, vocab: int, device: torch.device) -> list[torch.Tensor]:
    """`steps` batches (batch, seq) of sequences start + stride * t (mod vocab), every 16th label ignored."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        start = torch.randint(0, vocab, (batch, 1), generator=g)
        stride = torch.randint(1, 8, (batch, 1), generator=g)
        out.append(((start + stride * torch.arange(seq)) % vocab).to(device))
    return out


def fused_loss(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    """The model's loss through the fused op: hidden (B, T, D) -> next-token mean CE, fp32."""
    hidden = model.model(ids)
    labels = ids[:, 1:].clone()
    labels[:, ::16] = -100
    return kpf.fused_linear_cross_entropy(hidden[:, :-1].reshape(-1, hidden.shape[-1]), model.lm_head.weight,
                                          labels.reshape(-1))


def unfused_loss(model: LlamaForCausalLM, ids: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[:, 1::16] = -100  # the same positions as fused_loss's ids[:, 1:][:, ::16]
    return model(ids, labels)


def train(loss_fn, steps: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[float]:  # noqa: ANN001
    torch.manual_seed(0)
    model = LlamaForCausalLM(CONFIG)
    model.init_weights(torch.Generator().manual_seed(0))
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for ids in steps:
        loss = loss_fn(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def run(steps: int, device: torch.device, dtype: torch.dtype, batch: int = 8, seq: int = 64) -> dict:
    """Both curves and their comparison, as written to loss_curve.json."""
    data = batches(steps, batch, seq, CONFIG.vocab_size, device)
    t0 = time.perf_counter()
    unfused = train(unfused_loss, data, device, dtype)
    fused = train(fused_loss, data, device, dtype)
    gap = max(abs(a - b) / abs(b) for a, b in zip(fused, unfused))
    return {"device": device_name(device), "dtype": str(dtype).removeprefix("torch."), "steps": steps,
            "batch": batch, "seq": seq, "config": str(CONFIG), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "wall_s": round(time.perf_counter() - t0, 1),
            "unfused": unfused, "fused": fused, "max_relative_gap": gap}


def write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_curve.json").write_text(json.dumps(result, indent=1) + "\n")
    first, last = result["unfused"][0], result["unfused"][-1]
    (out / "loss_curve.md").write_text(
        f"# Training curve: fused linear cross-entropy vs the unfused loss ({result['device']})\n\n"
        f"{result['date']}, torch {result['torch']}, {result['dtype']}, {result['steps']} AdamW steps of "
        f"{result['batch']} x {result['seq']} tokens; built-in Llama {result['config']}.\n\n"
        f"Unfused loss {first:.4f} -> {last:.4f}; fused {result['fused'][0]:.4f} -> {result['fused'][-1]:.4f}; "
        f"largest relative gap between the curves at any step: {result['max_relative_gap']:.2e}.\n\n"
        "| step | unfused | fused |\n| --- | --- | --- |\n"
        + "".join(f"| {i} | {a:.5f} | {b:.5f} |\n" for i, (a, b) in enumerate(zip(result["unfused"], result["fused"]))))
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return
    fig = Figure(figsize=(6, 3.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(result["unfused"], label="lm_head + cross_entropy (unfused)")
    ax.plot(result["fused"], "--", label="fused_linear_cross_entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{result['device']}, {result['dtype']}: max relative gap {result['max_relative_gap']:.1e}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss_curve.png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--out", default="bench-results/loss_curve", help="output directory")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    result = run(args.steps, device, dtype)
    write(result, Path(args.out))
    print(f"unfused {result['unfused'][0]:.4f} -> {result['unfused'][-1]:.4f}; fused {result['fused'][0]:.4f} -> "
          f"{result['fused'][-1]:.4f}; max relative gap {result['max_relative_gap']:.2e}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
