"""A Vision Transformer (ViT) in plain torch, with timm-style module names.

Shapes: B batch, C = in_channels, S = image_size, P = patch_size, N = (S / P)^2 patches, D = dim, K classes.

    x = patch_embed.proj(pixel_values)                  conv P x P stride P: (B, C, S, S) -> (B, D, S/P, S/P)
    x = cat(cls_token, flatten(x)) + pos_embed          (B, N + 1, D)
    per block: x = x + attn.proj(attn(attn.qkv(norm1(x))))
               x = x + mlp.fc2(gelu(mlp.fc1(norm2(x))))
    logits = head(norm(x)[:, 0])                        (B, K)

The position embeddings are learned for one image size, so inputs must be S x S.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernel_pytorch.models._common import HeadSplit, LayerNormBlock, zero_


@dataclass(frozen=True)
class ViTConfig(HeadSplit):
    """Sizes of a ViT classifier. Defaults are the `tiny` CPU preset."""

    image_size: int = 32
    patch_size: int = 8
    in_channels: int = 3
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    intermediate_size: int = 128
    num_classes: int = 10
    norm_eps: float = 1e-6
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch {self.patch_size}")
        self.check_heads()

    @property
    def num_patches(self) -> int:
        """N = (image_size / patch_size)^2."""
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def vit_b16(cls) -> ViTConfig:
        """ViT-B/16 at 224x224 with a 1000-class head (~86.6M parameters)."""
        return cls(
            image_size=224,
            patch_size=16,
            dim=768,
            n_layers=12,
            n_heads=12,
            intermediate_size=3072,
            num_classes=1000,
        )


class PatchEmbed(nn.Module):
    """Non-overlapping P x P patches to D-dim tokens. (B, C, S, S) -> (B, N, D)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(config.in_channels, config.dim, config.patch_size, stride=config.patch_size)

    def forward(self, pixel_values: Tensor) -> Tensor:
        return self.proj(pixel_values).flatten(2).transpose(1, 2)


class ViTAttention(nn.Module):
    """Bidirectional multi-head self-attention. x (B, N, D) -> (B, N, D)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.num_heads = config.n_heads
        self.head_dim = config.head_dim
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # each (B, H, N, Dh)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class ViTMLP(nn.Module):
    """fc2(gelu(fc1(x))); x (B, N, D) -> (B, N, D)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.dim, config.intermediate_size)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(config.intermediate_size, config.dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ViTBlock(LayerNormBlock):
    """Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(.)). x (B, N, D) -> (B, N, D)."""

    parts = ("norm1", "attn", "norm2", "mlp")

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config.dim, config.norm_eps, ViTAttention(config), ViTMLP(config))


class VisionTransformer(nn.Module):
    """ViT image classifier. forward: pixel_values (B, C, S, S) -> logits (B, num_classes)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbed(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.num_patches + 1, config.dim))
        self.blocks = nn.ModuleList(ViTBlock(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.head = nn.Linear(config.dim, config.num_classes)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """Truncated N(0, 0.02) for weights and embeddings, zero biases, unit LayerNorm scales."""
        std = self.config.initializer_range
        nn.init.trunc_normal_(self.cls_token, std=std, generator=generator)
        nn.init.trunc_normal_(self.pos_embed, std=std, generator=generator)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.trunc_normal_(module.weight, std=std, generator=generator)
                zero_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                zero_(module.bias)

    def forward(self, pixel_values: Tensor) -> Tensor:
        x = self.patch_embed(pixel_values)  # (B, N, D)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat((cls, x), dim=1) + self.pos_embed  # (B, N + 1, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


__all__ = ["PatchEmbed", "ViTAttention", "ViTBlock", "ViTConfig", "ViTMLP", "VisionTransformer"]
