"""The shared test grid: shapes, dtypes and input makers every op test reuses (STYLE rule 7)."""

from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# (leading shape, row width): a single element row, odd widths, a power of two, a wide row that
# takes the looping path once the norm config's max_fused_cols is lowered, several leading dims.
ROW_SHAPES = (
    ((1,), 1),
    ((3,), 7),
    ((5,), 33),
    ((2, 3), 128),
    ((4,), 257),
    ((2, 1, 3), 64),
)

def randn(*shape: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
          scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    """Random normal inputs (never zeros), drawn in fp32 and rounded once to `dtype`."""
    return (torch.randn(*shape, device=device) * scale + offset).to(dtype)


def strided_rows(lead: tuple[int, ...], cols: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """A (..., cols) view whose rows are strided: the first `cols` columns of a wider tensor."""
    wide = randn(*lead, cols + 5, dtype=dtype, device=device)
    return wide[..., :cols]


def device_under_test() -> str:
    """Where the Triton launchers run: CUDA when present, else the CPU interpreter."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def compile_and_count_breaks(fn, *args) -> tuple[object, int]:
    """Run `fn` under torch.compile(fullgraph=True) and return (result, graph breaks seen by explain)."""
    import torch._dynamo

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    out = torch.compile(fn, fullgraph=True)(*args)
    return out, explanation.graph_break_count


class Poisoned:
    """Context manager: every `torch.empty`/`empty_like` inside returns NaN-filled memory, so an
    output element a kernel forgets to write shows up as NaN."""

    def __enter__(self) -> Poisoned:
        self._empty, self._empty_like = torch.empty, torch.empty_like

        def empty(*args, **kwargs):
            t = self._empty(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        def empty_like(*args, **kwargs):
            t = self._empty_like(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        torch.empty, torch.empty_like = empty, empty_like
        return self

    def __exit__(self, *exc) -> None:
        torch.empty, torch.empty_like = self._empty, self._empty_like
