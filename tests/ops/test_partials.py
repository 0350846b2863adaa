"""The fixed-order partial reduction (ops/_common/partials.py) against an fp64 column sum, on the interpreter
on CPU and on the GPU; bitwise-equal across runs."""

from __future__ import annotations

import pytest
import torch

from kernel_pytorch.ops._common.partials import sum_partials
from tests.grid import device_under_test, randn
from tests.ops.norm_helpers import assert_close


@pytest.mark.parametrize(("k", "parts", "cols"), [(1, 1, 1), (1, 5, 33), (2, 37, 130), (2, 64, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sum_partials_matches_fp64(k: int, parts: int, cols: int, dtype: torch.dtype) -> None:
    dev = device_under_test()
    buf = randn(k, parts, cols, device=dev)
    outs = sum_partials(buf if k > 1 else buf[0], (dtype,) * k)
    assert len(outs) == k
    for i, out in enumerate(outs):
        assert out.shape == (cols,) and out.dtype == dtype
        assert_close(out, buf[i].double().sum(0).to(dtype), f"sum {i}")
    again = sum_partials(buf if k > 1 else buf[0], (dtype,) * k)
    assert all(torch.equal(a, b) for a, b in zip(outs, again))


@pytest.mark.cuda
def test_sum_partials_eager_launch_matches_traceable_launch() -> None:
    buf = randn(2, 264, 4096, device="cuda")
    traced = sum_partials(buf, (torch.bfloat16, torch.float32))
    for _ in range(2):  # the second call takes the cached-binary launch
        direct = sum_partials(buf, (torch.bfloat16, torch.float32), eager=True)
        assert all(torch.equal(a, b) for a, b in zip(traced, direct))


def test_sum_partials_never_passes_one_output_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Traced, each written argument of a user Triton kernel is functionalized on its own: one tensor passed
    as both outputs made Inductor return the unwritten copy as the sum (a garbage RMSNorm weight gradient
    under torch.compile on the H100)."""
    from kernel_pytorch.ops._common import partials as _partials

    seen = []
    monkeypatch.setattr(_partials, "_sum_partials", lambda grid, part, a, b, *args, **kw: seen.append((a, b)))
    parts = torch.randn(3, 8)
    (out,) = _partials.sum_partials(parts, (torch.float32,))
    a, b = seen[0]
    assert a is out and b is not a and b.untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
