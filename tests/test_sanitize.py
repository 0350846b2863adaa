"""tests/_sanitize.py, the interpreter's out-of-bounds check (KP_SANITIZE=1 runs every kernel test under it)."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from tests._sanitize import sanitized

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="checks Triton's CPU interpreter")


@triton.jit
def _shifted_copy(X, Y, shift, n, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if MASKED:
        tl.store(Y + offs, tl.load(X + offs + shift, mask=offs + shift < n, other=0.0), mask=offs < n)
    else:
        tl.store(Y + offs, tl.load(X + offs + shift))


def test_an_unmasked_read_past_the_end_fails_naming_the_kernel() -> None:
    x, y = torch.randn(8), torch.empty(8)
    with sanitized(), pytest.raises(Exception, match="_shifted_copy: 3 load"):
        _shifted_copy[(1,)](x, y, 3, 8, BLOCK=8, MASKED=False)


def test_masked_and_in_bounds_accesses_pass() -> None:
    x, y = torch.randn(8), torch.empty(8)
    with sanitized():
        _shifted_copy[(1,)](x, y, 3, 8, BLOCK=8, MASKED=True)
        _shifted_copy[(1,)](x, y, 0, 8, BLOCK=8, MASKED=False)
    assert torch.equal(y, x)
    import triton.runtime.interpreter as interp

    assert getattr(interp.GridExecutor, "_kp_sanitized", None) is None  # unchecked again outside
