"""Chapter 3's exercise: the SwiGLU activation's minimum bytes and the share of the copy ceiling."""

from __future__ import annotations


def swiglu_min_bytes(tokens: int, inter: int, element_size: int) -> tuple[int, int]:
    """(forward, backward) minimum bytes of silu(gate) * up over tokens x inter elements."""
    e = tokens * inter * element_size
    return 3 * e, 5 * e  # fwd: gate, up in, h out; bwd: dh, gate, up in, d_gate, d_up out


def pct_of_copy(ms: float, nbytes: int, copy_gbps: float) -> float:
    """The share of the copy ceiling a call moving `nbytes` in `ms` milliseconds reaches, in percent."""
    return 100.0 * nbytes / (ms * 1e-3) / 1e9 / copy_gbps


SOLUTION = (swiglu_min_bytes, pct_of_copy)
