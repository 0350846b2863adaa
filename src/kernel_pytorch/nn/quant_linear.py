"""`QuantizedLinear`: a Linear layer whose weight is stored weight-only quantized (int8, int4 in groups,
fp8 e4m3) as plain tensors, run by functional.quant_linear (our kernels on CUDA, the reference elsewhere).

    layer = QuantizedLinear.from_linear(linear, "int4", group_size=128)
    y = layer(x)                       # (..., in_features) -> (..., out_features), x's dtype

Not a torch.nn.Linear subclass: it has no float `weight` (code that reads `.weight` would get the
packed bytes' shape wrong), so module-swapping code and torchao's quantize_ leave it alone. State dict
keys: `qweight`, `scale` (and `zero` for int4) buffers, and `bias` as the Linear's. The layout of the
parts is reference/quant_matmul.py's; the buffers are plain tensors, so safetensors, torch.export, AOTInductor
and CUDA graphs take them as they are.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernel_pytorch import functional as F
from kernel_pytorch.functional import Backend
from kernel_pytorch.reference.quant_matmul import SCHEMES, dequantize, part_shapes, quantize


class QuantizedLinear(torch.nn.Module):
    """y = x @ dequant(W).T + bias with W stored quantized.

    Args:
        in_features, out_features, bias: as torch.nn.Linear's.
        scheme: "int8" (a scale per output row), "int4" (groups of `group_size` inputs with zero
            points, two values per byte) or "fp8" (e4m3, a scale per output row).
        group_size: int4's group (32, 64 or 128); ignored by the other schemes.
        device: where the parts go; dtype: the layer's float dtype (the bias's, and int4's scales
            for bf16/fp16), that of the Linear it stands for.
    The parts are left uninitialised (as torch.nn.Linear's weight before its reset): fill them with
    `load_state_dict`, or build the layer with `from_linear`. forward: x (..., in_features) of the
    layer's dtype -> (..., out_features). `backend` may be set on an instance.
    """

    backend: Backend = "auto"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, scheme: str = "int8",
                 group_size: int = 128, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        dtype = dtype or torch.get_default_dtype()
        self.in_features, self.out_features = in_features, out_features
        self.scheme = scheme
        self.group_size = group_size if scheme == "int4" else None
        for name, (shape, part_dtype) in part_shapes(scheme, out_features, in_features, group_size, dtype).items():
            self.register_buffer(name, torch.empty(shape, dtype=part_dtype, device=device))
        if not hasattr(self, "zero"):
            self.zero: Tensor | None = None
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.dtype = dtype

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, scheme: str = "int8", group_size: int = 128) -> QuantizedLinear:
        """`linear`'s weight quantized with `scheme` (reference/quant_matmul.py's quantizers, on the weight's
        device); the bias is `linear`'s own Parameter, shared."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_linear needs a torch.nn.Linear (got {type(linear).__name__})")
        weight = linear.weight
        if not isinstance(weight, Tensor) or type(weight.detach()) is not Tensor or not weight.is_floating_point():
            raise TypeError(f"from_linear needs a Linear with a plain floating weight (got {type(weight).__name__} "
                            f"of dtype {getattr(weight, 'dtype', None)}): already quantized?")
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, scheme=scheme,
                    group_size=group_size, device="meta", dtype=weight.dtype)
        for name, part in quantize(weight, scheme, group_size).items():
            setattr(layer, name, part)
        if linear.bias is not None:
            layer.bias = linear.bias
        return layer

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (torch.nn.Module's signature)
        """Device moves reach the parts; dtype casts (`model.to(torch.bfloat16)`, `.half()`) reach the bias
        and the layer's dtype only: the quantized parts keep theirs (a cast would turn e4m3 bytes and
        fp32 scales into bf16 tensors the kernels do not take, and round the scales)."""
        before = {name: t for name, t in self._buffers.items() if t is not None}
        out = super()._apply(fn, recurse)
        for name, t in before.items():
            after = self._buffers[name]
            if after is not None and after.dtype != t.dtype:
                self._buffers[name] = t.to(after.device)
        self.dtype = fn(torch.empty(0, dtype=self.dtype)).dtype
        return out

    def forward(self, x: Tensor) -> Tensor:
        return F.quant_linear(x, self.qweight, self.scale, self.bias, scheme=self.scheme, zero=self.zero,
                              group_size=self.group_size, backend=self.backend)

    def parts(self) -> dict[str, Tensor]:
        """{"qweight", "scale"} (and "zero" for int4): the buffers that hold the weight."""
        return {name: getattr(self, name) for name in ("qweight", "scale", "zero") if getattr(self, name) is not None}

    def dequantize(self, dtype: torch.dtype | None = None) -> Tensor:
        """The (out_features, in_features) weight the parts stand for, in `dtype` (default the layer's)."""
        return dequantize(self.parts(), self.scheme, self.group_size or 128, torch.float32).to(dtype or self.dtype)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"scheme={self.scheme!r}{group}")
