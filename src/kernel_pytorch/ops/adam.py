"""Adam's and AdamW's update over many tensors in one launch, registered as `kernel_pytorch::adam_`
(mutating params, exp_avgs, exp_avg_sqs and max_exp_avg_sqs in place).

Math (reference/adam.py, torch.optim.Adam / AdamW(fused=True)'s): in fp32, for each element,
    g = -g (maximize);  p -= (lr * wd) * p (AdamW) or g += wd * p (Adam)
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  v_max = max(v_max, v) (amsgrad, used for v below)
    p -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
with p, m, v (v_max) rounded once to their dtypes. Bytes: p, g, m, v read, p, m, v written: 7 passes
(9 with amsgrad).

Plan. The tensors of one call share their dtypes and their step, so the update's scalars are kernel
arguments. A pointer table (T, 6) int64 holds each tensor's p, g, m, v, v_max addresses (0 without
amsgrad) and numel, and a block table (B, 2) int32 names the tensor and block of each program: one launch
covers every tensor, each program one BLOCK of one tensor, unmasked except a tensor's last block. torch's
fused AdamW runs multi_tensor_apply instead: a few hundred 64K-element chunks per launch, 44 launches for the 0.9B
parameters of the e2e Llama, on the H200 at 52% of copy inside the e2e step (e2e_profile_*.txt) and 65%
alone, where this kernel runs at 99% (benchmarks/results/probes/adam/probe_adamw_h200.log).

The op is a `torch.library.custom_op`, opaque to torch.compile: the kernel reads addresses, which a
traced (fake) tensor does not have, so there is no `triton_op` body to trace. Its non-CUDA kernel is
the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernel_pytorch.ops import tuning
from kernel_pytorch.reference.adam import adam_, adam_scalars


@dataclass(frozen=True)
class AdamConfig:
    """The Adam kernel's launch knobs (the "adam" tuning family; benchmarks/probes/probe_adamw.py sweeps them on
    the e2e Llama's parameters).

    Fields:
        block, num_warps: elements per program and its warps. 1024 x 4 ran the kernels of a step at
            99.1% of copy, against 98.4% for 2048 x 8 and at most 88.2% for larger blocks (H200,
            2026-11-29, benchmarks/results/probes/adam/probe_adamw_h200.log, run 2).
        precise_math: IEEE square root and divisions (torch's fused kernel's) rather than the fast fp32
            forms (<= 2 ulp of the update term, below one rounding of a bf16 or fp16 parameter). Off: the
            IEEE ones are instruction sequences with a slow path, several per element, and bound the
            kernel by its arithmetic (2048 x 8 at 82.2% of copy against 98.4%, the same run).
    """

    block: int = 1024
    num_warps: int = 4
    precise_math: bool = False


tuning.register("adam", AdamConfig())

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _adam_update(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, offs, n, lr_wd, wd, sign, step_size, bc2_sqrt, beta1,
                 beta2, eps, MASKED: tl.constexpr, DECOUPLED: tl.constexpr, AMSGRAD: tl.constexpr,
                 PRECISE: tl.constexpr):
    mask = offs < n if MASKED else None
    p = tl.load(p_ptr + offs, mask=mask).to(tl.float32)
    g = sign * tl.load(g_ptr + offs, mask=mask).to(tl.float32)  # sign: -1 with maximize
    m = tl.load(m_ptr + offs, mask=mask).to(tl.float32)
    v = tl.load(v_ptr + offs, mask=mask).to(tl.float32)
    if DECOUPLED:
        p = p - lr_wd * p
    else:
        g = g + wd * p
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    denom = v
    if AMSGRAD:
        denom = tl.maximum(tl.load(vmax_ptr + offs, mask=mask).to(tl.float32), v)
        tl.store(vmax_ptr + offs, denom.to(vmax_ptr.dtype.element_ty), mask=mask)
    if PRECISE:
        p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(denom), bc2_sqrt) + eps)
    else:  # Triton's `/` and sqrt are the approximate forms
        p = p - step_size * m / (tl.sqrt(denom) / bc2_sqrt + eps)
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)
    tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _adam_kernel(table, blocks, lr_wd, wd, sign, step_size, bc2_sqrt, beta1, beta2, eps,
                 P_DTYPE: tl.constexpr, G_DTYPE: tl.constexpr, M_DTYPE: tl.constexpr, V_DTYPE: tl.constexpr,
                 VMAX_DTYPE: tl.constexpr, BLOCK: tl.constexpr, DECOUPLED: tl.constexpr, AMSGRAD: tl.constexpr,
                 PRECISE: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.load(blocks + 2 * pid).to(tl.int64)
    start = tl.load(blocks + 2 * pid + 1).to(tl.int64) * BLOCK
    row = table + 6 * t
    # every address is 16-byte aligned (the launcher checks): the loads vectorise
    p_ptr = tl.multiple_of(tl.load(row).to(tl.pointer_type(P_DTYPE)), 16)
    g_ptr = tl.multiple_of(tl.load(row + 1).to(tl.pointer_type(G_DTYPE)), 16)
    m_ptr = tl.multiple_of(tl.load(row + 2).to(tl.pointer_type(M_DTYPE)), 16)
    v_ptr = tl.multiple_of(tl.load(row + 3).to(tl.pointer_type(V_DTYPE)), 16)
    vmax_ptr = tl.multiple_of(tl.load(row + 4).to(tl.pointer_type(VMAX_DTYPE)), 16)
    n = tl.load(row + 5)
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= n:
        _adam_update(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, offs, n, lr_wd, wd, sign, step_size, bc2_sqrt, beta1,
                     beta2, eps, MASKED=False, DECOUPLED=DECOUPLED, AMSGRAD=AMSGRAD, PRECISE=PRECISE)
    else:
        _adam_update(p_ptr, g_ptr, m_ptr, v_ptr, vmax_ptr, offs, n, lr_wd, wd, sign, step_size, bc2_sqrt, beta1,
                     beta2, eps, MASKED=True, DECOUPLED=DECOUPLED, AMSGRAD=AMSGRAD, PRECISE=PRECISE)


# (numels, config block, device) -> the block table: the same parameters give the same table every step (a few
# sets at once: an optimizer's dtype groups, or two optimizers, each keep theirs)
_BLOCK_TABLES: dict[tuple, Tensor] = {}
_MAX_TABLES = 8


def _block_table(numels: tuple[int, ...], block: int, device: torch.device) -> Tensor:
    key = (numels, block, device)
    table = _BLOCK_TABLES.get(key)
    if table is None:
        counts = torch.tensor([-(-n // block) for n in numels], dtype=torch.int64)
        which = torch.repeat_interleave(torch.arange(len(numels)), counts)
        first = torch.cumsum(counts, 0) - counts
        index = torch.arange(int(counts.sum())) - torch.repeat_interleave(first, counts)
        if max(counts.tolist(), default=0) > 2**31:
            raise ValueError(f"a tensor of {max(numels)} elements has more than 2^31 blocks of {block}")
        table = torch.stack([which, index], 1).to(torch.int32).to(device)
        if len(_BLOCK_TABLES) >= _MAX_TABLES:
            _BLOCK_TABLES.pop(next(iter(_BLOCK_TABLES)))
        _BLOCK_TABLES[key] = table
    return table


def _address_table(rows: list[tuple[int, ...]], device: torch.device) -> Tensor:
    """The (T, 6) int64 table on `device`, copied from pinned memory without waiting for the device
    (the caching host allocator keeps the pinned block until the copy has run)."""
    host = torch.tensor(rows, dtype=torch.int64)
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host


_NAMES = ("params", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")


def _check(lists: tuple[list[Tensor], ...]) -> None:
    """Equal lengths, one kernel dtype per list, and each tensor contiguous, aligned and like its parameter."""
    params = lists[0]
    for name, ts in zip(_NAMES, lists):
        if len(ts) != len(params):
            raise ValueError(f"{name} has {len(ts)} tensors, params {len(params)}")
        kinds = {t.dtype for t in ts}
        if len(kinds) != 1 or next(iter(kinds)) not in _TL_DTYPES:
            raise TypeError(f"{name} must share one dtype of {', '.join(map(str, _TL_DTYPES))} (got {kinds})")
    device = params[0].device
    for i, group in enumerate(zip(*lists, strict=True)):
        for name, t in zip(_NAMES, group):
            if t.device != device or t.shape != params[i].shape or not t.is_contiguous() or t.data_ptr() % 16:
                raise ValueError(f"{name}[{i}] must be contiguous, 16-byte aligned, on {device} and of shape "
                                 f"{tuple(params[i].shape)} (got {t.device}, {tuple(t.shape)}, "
                                 f"contiguous={t.is_contiguous()}, address % 16 = {t.data_ptr() % 16})")


def adam_step(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
              max_exp_avg_sqs: list[Tensor] | None, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float, step: float, decoupled: bool = True, maximize: bool = False, *,
              check: bool = True, config: AdamConfig | None = None) -> None:
    """One launch of the update over every tensor (the module docstring); in place.

    Args:
        params, grads, exp_avgs, exp_avg_sqs: equal-length lists; the i-th of each have one shape, are
            contiguous and 16-byte aligned; each list has one dtype (fp32, bf16 or fp16).
        max_exp_avg_sqs: the same, with amsgrad; None without it.
        step: the update's step count (>= 1), the same for every tensor.
        decoupled: AdamW's weight decay (True) or Adam's, through the gradient (False).
        check: check the lists (False: the caller has; optim.Adam checks each tensor as it groups them).
        config: the launch config (None: the one in force, `tuning.current("adam")`).
    """
    if not params:
        return
    amsgrad = max_exp_avg_sqs is not None
    lists = (params, grads, exp_avgs, exp_avg_sqs) + ((max_exp_avg_sqs,) if amsgrad else ())
    if check:
        _check(lists)
    device = params[0].device
    maxes = max_exp_avg_sqs if amsgrad else params  # without amsgrad the column is never read
    rows = [(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), w.data_ptr() if amsgrad else 0, p.numel())
            for p, g, m, v, w in zip(params, grads, exp_avgs, exp_avg_sqs, maxes)]
    dtypes = [_TL_DTYPES[ts[0].dtype] for ts in lists]
    numels = tuple(r[5] for r in rows)
    cfg = config or tuning.current("adam")
    blocks = _block_table(numels, cfg.block, device)
    table = _address_table(rows, device)
    step_size, bc2_sqrt = adam_scalars(lr, beta1, beta2, step)
    _adam_kernel[(blocks.shape[0],)](
        table, blocks, lr * weight_decay, weight_decay, -1.0 if maximize else 1.0, step_size, bc2_sqrt, beta1,
        beta2, eps, P_DTYPE=dtypes[0], G_DTYPE=dtypes[1], M_DTYPE=dtypes[2], V_DTYPE=dtypes[3],
        VMAX_DTYPE=dtypes[4] if amsgrad else dtypes[3], BLOCK=cfg.block, DECOUPLED=decoupled, AMSGRAD=amsgrad,
        PRECISE=cfg.precise_math, num_warps=cfg.num_warps,
    )


@torch.library.custom_op("kernel_pytorch::adam_",
                         mutates_args=("params", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"))
def adam_op(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
            max_exp_avg_sqs: list[Tensor], lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
            step: float, decoupled: bool = True, maximize: bool = False) -> None:
    """The update in place: the kernel on CUDA, the reference elsewhere. `max_exp_avg_sqs` is empty
    without amsgrad (an op schema has no optional list)."""
    args = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs or None, lr, beta1, beta2, eps, weight_decay,
            step, decoupled, maximize)
    if params and params[0].device.type == "cuda":
        adam_step(*args)
    else:
        adam_(*args)


@adam_op.register_fake
def _(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step,
      decoupled=True, maximize=False) -> None:
    return None
