"""Attention calls that lost their fast path: `F.scaled_dot_product_attention` given a materialised
causal mask instead of `is_causal=True`, or K/V repeated to the query's head count instead of
`enable_gqa=True`.

The calls are captured from one eager forward of the example inputs (a TorchFunctionMode sees every
SDPA call with its real tensors and the user's stack), and judged by their values, not by names: a mask
is causal when it keeps exactly the lower triangle; K/V are repeated when their heads come in groups of
identical copies. Each such call is then timed as it is and as fixed (the same tensors, `is_causal=True`
without the mask, or the unrepeated K/V with `enable_gqa=True`), so the cost reported is measured.
"""

from __future__ import annotations

import statistics
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from kernel_pytorch.assistant.findings import Finding, Location, Severity
from kernel_pytorch.assistant.locate import user_location
from kernel_pytorch.benchmark.paired import run_rounds
from kernel_pytorch.benchmark.timer import time_fn

MAX_CALLS = 64  # captured calls kept (a model calls SDPA once per layer; the first ones say enough)


@dataclass
class SdpaCall:
    """One captured SDPA call: its tensors (kept for timing) and where the user's code made it."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None
    is_causal: bool
    scale: float | None
    enable_gqa: bool
    location: Location | None


class _Capture(TorchFunctionMode):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.calls: list[SdpaCall] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and len(self.calls) < MAX_CALLS:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
            bound = dict(zip(names, args, strict=False)) | kwargs
            q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
            if all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
                stack = traceback.extract_stack()[:-1]
                # from the model's call on: the frames calling the analyser are no place of the model's
                start = max((i for i, fr in enumerate(stack) if fr.name == "capture_sdpa"), default=-1)
                stack = stack[start + 1 :]
                self.calls.append(SdpaCall(
                    q.detach(), k.detach(), v.detach(),
                    bound.get("attn_mask").detach() if isinstance(bound.get("attn_mask"), torch.Tensor) else None,
                    bool(bound.get("is_causal", False)), bound.get("scale"), bool(bound.get("enable_gqa", False)),
                    user_location(stack, self.model),
                ))
        return func(*args, **kwargs)


def capture_sdpa(ctx: Any) -> list[SdpaCall]:
    """Every SDPA call (up to MAX_CALLS) of one eager forward of the example inputs; [] if it fails."""
    from kernel_pytorch.assistant.inputs import clone_inputs

    mode = _Capture(ctx.module)
    try:
        with torch.no_grad(), mode:
            ctx.module(*clone_inputs(ctx.args), **clone_inputs(ctx.kwargs))
    except Exception:  # the readiness section reports a model that does not run
        return []
    return mode.calls


def is_causal_mask(mask: torch.Tensor | None, lq: int, lk: int) -> bool:
    """Whether `mask` (bool: True keeps; float: 0 keeps, -inf/very negative drops) keeps exactly the
    lower triangle of an (lq, lk) score matrix, for every batch and head it broadcasts over."""
    if mask is None or lq != lk or lq < 2 or mask.shape[-2:] != (lq, lk):
        return False
    keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    tril = torch.ones(lq, lk, dtype=torch.bool, device=mask.device).tril()
    return bool((keep == tril).all())


def repeat_factor(q: torch.Tensor, k: torch.Tensor) -> int:
    """The largest r > 1 such that `k`'s heads are groups of r identical copies (K/V repeated from
    H/r heads to the query's H), else 1. Shapes (B, H, L, E)."""
    h = k.shape[1]
    if k.shape[1] != q.shape[1] or h < 2:
        return 1
    for r in sorted((d for d in range(2, h + 1) if h % d == 0), reverse=True):
        grouped = k.reshape(k.shape[0], h // r, r, *k.shape[2:])
        if bool((grouped == grouped[:, :, :1]).all()):
            return r
    return 1


# rounds of timing the call as made and as fixed in turns (A B, B A, A B): a machine that slows down or
# speeds up meanwhile (other processes, a clock at its power cap) falls on both alike
PAIRED_ROUNDS = 3


def _time_pair(as_is: Any, fixed: Any, device: torch.device) -> tuple[list[float], list[float]]:
    """Each round's median ms of the call as made and as fixed, over `PAIRED_ROUNDS` rounds timed in turns
    (`benchmark.paired.run_rounds`, each turn a `time_fn` median)."""
    def turn(fn: Any) -> list[float]:
        return [time_fn(fn, device=device, warmup_ms=2.0, rep_ms=15.0, flush_l2=False,
                        cpu_min_run_time=0.02).median_ms]

    # (three warm calls each: the first calls pick a kernel and allocate, not what a step pays)
    done, _ = run_rounds({"as_is": as_is, "fixed": fixed}, rounds=PAIRED_ROUNDS, warmup=3, slot=turn)
    return [r.ms["as_is"][0] for r in done], [r.ms["fixed"][0] for r in done]


def _variants(call: SdpaCall, causal: bool, r: int) -> tuple[Any, Any]:
    """(the call as made, the call fixed)."""
    q, k, v, mask = call.q, call.k, call.v, call.mask
    kw = {"scale": call.scale} if call.scale is not None else {}
    as_is = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=call.is_causal, **kw)  # noqa: E731
    if r > 1:
        k, v = k[:, ::r].contiguous(), v[:, ::r].contiguous()
        kw["enable_gqa"] = True
    fixed_mask, fixed_causal = (None, True) if causal else (mask, call.is_causal)
    fixed = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=fixed_mask, is_causal=fixed_causal, **kw)  # noqa: E731
    return as_is, fixed


# a fixed call less than this fraction faster than the call as made, in any round, is no measured gain
# (timing noise): a gain is claimed only where every round shows it
NO_GAIN = 0.03


def sdpa_findings(ctx: Any) -> list[Finding]:
    """The SDPA calls of the example forward that lost a fast path, grouped by source line, each with the
    time per step of the calls as made and as fixed (measured on the captured tensors)."""
    groups: dict[tuple[str, bool, int], list[tuple[SdpaCall, bool, int]]] = {}
    for call in capture_sdpa(ctx):
        causal = not call.is_causal and is_causal_mask(call.mask, call.q.shape[-2], call.k.shape[-2])
        r = 1 if call.enable_gqa else repeat_factor(call.q, call.k)
        if causal or r > 1:
            groups.setdefault((str(call.location), causal, r), []).append((call, causal, r))
    out = []
    for (_, causal, r), calls in groups.items():
        call = calls[0][0]
        as_is, fixed = _variants(call, causal, r)
        try:
            rounds_before, rounds_after = _time_pair(as_is, fixed, ctx.device)
            before, after = statistics.median(rounds_before), statistics.median(rounds_after)
            tol = 1e-4 if call.q.dtype in (torch.float32, torch.float64) else 3e-2  # bf16/fp16: kernels round apart
            same = torch.allclose(as_is(), fixed(), atol=tol, rtol=tol)
        except Exception as exc:  # an old torch without enable_gqa, a backend refusing the shapes
            before = after = None
            same = None
            error = f"{type(exc).__name__}: {exc}"
        else:
            error = None
        n = len(calls)
        lost = []
        fix = []
        if causal:
            lost.append("a materialised causal mask is passed instead of `is_causal=True`")
            fix.append("drop the mask and pass `is_causal=True` (the flash/efficient kernels skip the masked "
                       "half instead of reading a mask)")
        if r > 1:
            lost.append(f"K/V are repeated {r}x to the query's {call.q.shape[1]} heads")
            fix.append(f"pass the {call.k.shape[1] // r} K/V heads as they are with `enable_gqa=True` "
                       "(no repeat_kv / repeat_interleave copy)")
        shape = "x".join(str(s) for s in call.q.shape)
        # measured, and the fix within noise of the call as made, or slower: information, not a warning
        slower = before is not None and after is not None and any(
            a > b * (1 - NO_GAIN) for b, a in zip(rounds_before, rounds_after))
        if before is not None and after is not None:
            evidence = (f"{n} call(s) per forward at q {shape} ({call.q.dtype}): {before:.3f} ms per call as made, "
                        f"{after:.3f} ms fixed, timed here on the captured tensors"
                        + ("" if same else "; the fixed call's output differs, check the mask"))
            gain_ms = max(before - after, 0.0) * n
            gain = f"{gain_ms:.3f} ms per forward (measured on this device, {n} call(s))"
            if slower:
                gain = (f"none measured on this device ({before:.3f} ms as made, {after:.3f} ms fixed)"
                        + ("; K/V are no longer copied, which saves their memory" if r > 1 else ""))
        else:
            evidence = f"{n} call(s) per forward at q {shape}; the fixed call could not be timed ({error})"
            gain_ms, gain = None, None
        example = ("is_causal=True" if causal else "attn_mask=mask") + (", enable_gqa=True" if r > 1 else "")
        fix_text = "; ".join(fix) + f", e.g. `F.scaled_dot_product_attention(q, k, v, {example})`"
        if slower:  # tried and slower here: reported, not suggested
            evidence += f". Tried: {fix_text}"
        out.append(Finding(
            id="kernel.sdpa-" + ("causal-mask" if causal else "repeat-kv") + ("-repeat-kv" if causal and r > 1 else ""),
            severity=Severity.INFO if slower else Severity.WARNING,
            title=("Attention could take another path (no faster here): " if slower else
                   "Attention loses its fast path: ") + "; ".join(lost),
            evidence=evidence,
            location=call.location,
            suggestion="" if slower else fix_text,
            estimated_gain=gain,
            data={"calls": n, "causal_mask": causal, "repeat": r, "ms_as_made": before, "ms_fixed": after,
                  "gain_ms": gain_ms, "measured": before is not None, "same_output": same,
                  "query_shape": list(call.q.shape), "fix_slower": slower,
                  "fix": "sdpa." + "+".join((["is_causal"] if causal else []) + (["enable_gqa"] if r > 1 else []))},
        ))
    return out


__all__ = ["SdpaCall", "capture_sdpa", "is_causal_mask", "repeat_factor", "sdpa_findings"]
