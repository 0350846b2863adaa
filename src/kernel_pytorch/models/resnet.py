"""A ResNet image classifier in plain torch, with torchvision's module names.

Shapes: B batch, C = in_channels, H x W image, K classes, w = width (64 in the standard nets).

    stem: conv1 7x7/2 -> bn1 -> relu -> maxpool 3x3/2             (B, w, H/4, W/4)
    layer1..layer4: stages of BasicBlock (2 convs 3x3) or Bottleneck (1x1, 3x3, 1x1, 4x wider out);
        layer2..4 halve the resolution and double the width
    logits = fc(avgpool(x).flatten(1))                            (B, K)

Any H, W >= 32 works: the pooling is adaptive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from kernel_pytorch.models._common import zero_

BlockKind = Literal["basic", "bottleneck"]


@dataclass(frozen=True)
class ResNetConfig:
    """Depth and width of a ResNet. Defaults are the `tiny` CPU preset."""

    block: BlockKind = "basic"
    layers: tuple[int, int, int, int] = (1, 1, 1, 1)
    width: int = 8
    in_channels: int = 3
    num_classes: int = 10
    image_size: int = 32

    def __post_init__(self) -> None:
        if self.block not in ("basic", "bottleneck"):
            raise ValueError(f"block must be 'basic' or 'bottleneck', not {self.block!r}")
        if len(self.layers) != 4:
            raise ValueError(f"layers must have 4 stage depths, got {self.layers}")

    @classmethod
    def tiny(cls) -> ResNetConfig:
        """CPU demo size: one BasicBlock per stage, width 8, 32x32 images."""
        return cls()

    @classmethod
    def resnet18(cls) -> ResNetConfig:
        """ResNet-18 (~11.7M parameters)."""
        return cls(block="basic", layers=(2, 2, 2, 2), width=64, num_classes=1000, image_size=224)

    @classmethod
    def resnet50(cls) -> ResNetConfig:
        """ResNet-50 (~25.6M parameters)."""
        return cls(block="bottleneck", layers=(3, 4, 6, 3), width=64, num_classes=1000, image_size=224)


def _conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def _conv1x1(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """relu(x' + bn2(conv2(relu(bn1(conv1(x)))))), x' = downsample(x) or x.

    forward: (B, c_in, H, W) -> (B, planes, H / stride, W / stride).
    """

    expansion = 1

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(c_in, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride here, as torchvision's v1.5) -> 1x1 expand by 4, plus the shortcut.

    forward: (B, c_in, H, W) -> (B, 4 * planes, H / stride, W / stride).
    """

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(c_in, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """ResNet classifier. forward: images (B, C, H, W) -> logits (B, num_classes)."""

    def __init__(self, config: ResNetConfig) -> None:
        super().__init__()
        self.config = config
        block: type[BasicBlock] | type[Bottleneck] = BasicBlock if config.block == "basic" else Bottleneck
        w = config.width
        self.conv1 = nn.Conv2d(config.in_channels, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        c_in = w
        stages = []
        for i, depth in enumerate(config.layers):
            planes, stride = w * 2**i, 1 if i == 0 else 2
            blocks: list[nn.Module] = []
            for j in range(depth):
                c_out = planes * block.expansion
                downsample = None
                if j == 0 and (stride != 1 or c_in != c_out):
                    downsample = nn.Sequential(_conv1x1(c_in, c_out, stride), nn.BatchNorm2d(c_out))
                blocks.append(block(c_in, planes, stride if j == 0 else 1, downsample))
                c_in = c_out
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, config.num_classes)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """He init for convs (fan-out, ReLU gain), unit BatchNorm with fresh running stats, N(0, 0.01) fc."""
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(
                    module.weight, mode="fan_out", nonlinearity="relu", generator=generator
                )
            elif isinstance(module, nn.BatchNorm2d):
                module.weight.fill_(1.0)
                zero_(module.bias)
                module.reset_running_stats()
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.01, generator=generator)
                zero_(module.bias)

    def forward(self, images: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


__all__ = ["BasicBlock", "Bottleneck", "ResNet", "ResNetConfig"]
