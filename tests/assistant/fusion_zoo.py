"""Small models each holding one fusable pattern (the line carries a `# FUSE:<kind>` marker), and
models whose paths are already fused (no marker: they must yield no fusion finding)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import kernel_pytorch as kp


class HandRMSNorm(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, D)
        var = x.pow(2).mean(-1, keepdim=True)  # FUSE:rms-norm
        return self.weight * (x * torch.rsqrt(var + 1e-6))


class HandLayerNorm(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(d)), nn.Parameter(torch.randn(d))

    def forward(self, x: Tensor) -> Tensor:
        mu = x.mean(-1, keepdim=True)  # FUSE:layer-norm
        d = x - mu
        var = (d * d).mean(-1, keepdim=True)
        return d / torch.sqrt(var + 1e-5) * self.weight + self.bias


class SwiGLU(nn.Module):
    def __init__(self, d: int = 32, h: int = 64) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, h, bias=False), nn.Linear(d, h, bias=False), nn.Linear(h, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))  # FUSE:gated-act


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RoPE(nn.Module):
    def forward(self, q: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # q: (B, H, T, Dh)
        return q * cos + rotate_half(q) * sin  # FUSE:rope


class ManualAttention(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + mask  # FUSE:attention
        return torch.softmax(scores, dim=-1) @ v


class LoopAttention(nn.Module):
    """Decoding written as a Python loop: one query position at a time against the keys so far."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # (B, T, D) each
        outs = []
        for t in range(q.shape[1]):
            p = torch.softmax(q[:, t : t + 1] @ k[:, : t + 1].transpose(-2, -1), dim=-1)  # FUSE:attention-loop
            outs.append(p @ v[:, : t + 1])
        return torch.cat(outs, dim=1)


class GQA(nn.Module):
    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # q (B, H, T, D), k/v (B, Hkv, T, D)
        n = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(n, dim=1)  # FUSE:gqa-repeat
        v = v.repeat_interleave(n, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class ResidualNorm(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.lin, self.norm = nn.Linear(d, d), nn.RMSNorm(d)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.lin(x)  # FUSE:residual-norm
        return self.norm(h) + h


class BiasGelu(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.lin, self.bias = nn.Linear(d, 64, bias=False), nn.Parameter(torch.randn(64))

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.lin(x) + self.bias)  # FUSE:bias-act


class LMHeadLoss(nn.Module):
    def __init__(self, d: int = 16, vocab: int = 40000) -> None:
        super().__init__()
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, h: Tensor, labels: Tensor) -> Tensor:  # h (N, D), labels (N,)
        logits = self.head(h)
        return F.cross_entropy(logits.float(), labels)  # FUSE:linear-cross-entropy


class AlreadyFused(nn.Module):
    """Every pattern above through the library call that already fuses it: no finding."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.n1, self.n2, self.n3 = nn.RMSNorm(d), kp.nn.RMSNorm(d), nn.LayerNorm(d)
        self.lin = nn.Linear(d, d)

    def forward(self, x: Tensor) -> Tensor:  # x: (B, T, D) with D = 32
        y = self.n3(self.n2(self.n1(x)))
        y = F.rms_norm(y, (y.shape[-1],), eps=1e-6)
        y = F.gelu(self.lin(y))
        q = y.view(y.shape[0], y.shape[1], 4, 8).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return o.transpose(1, 2).reshape_as(x) + F.silu(y)


def inputs(name: str) -> tuple[Tensor, ...]:
    """Example inputs for the model class `name`."""
    b, t, d, h = 2, 8, 32, 4
    x = torch.randn(b, t, d)
    q = torch.randn(b, h, t, 16)
    kv = torch.randn(b, 2, t, 16)
    return {
        "RoPE": (q, torch.randn(t, 16), torch.randn(t, 16)),
        "ManualAttention": (q, q.clone(), q.clone(), torch.zeros(t, t)),
        "LoopAttention": (torch.randn(b, 6, 16), torch.randn(b, 6, 16), torch.randn(b, 6, 16)),
        "GQA": (q, kv, kv.clone()),
        "LMHeadLoss": (torch.randn(6, 16), torch.randint(0, 40000, (6,))),
    }.get(name, (x,))


def line_of(marker: str) -> int:
    """1-based line of the line ending in `# FUSE:<marker>` in this file."""
    with open(__file__) as f:
        hits = [i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# FUSE:{marker}")]
    assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
    return hits[0]


PATTERNS: dict[str, type[nn.Module]] = {
    "rms-norm": HandRMSNorm,
    "layer-norm": HandLayerNorm,
    "gated-act": SwiGLU,
    "rope": RoPE,
    "attention": ManualAttention,
    "attention-loop": LoopAttention,
    "gqa-repeat": GQA,
    "residual-norm": ResidualNorm,
    "bias-act": BiasGelu,
    "linear-cross-entropy": LMHeadLoss,
}
