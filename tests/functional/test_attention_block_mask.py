"""functional/_flex.py's block masks from key intervals: the same tensors as create_block_mask (which
evaluates the mask over Q x K) for causal, window and document masks, documents in any layout; Flex
outputs with them match the reference; built without the Q x K grid, traced whole by torch.compile and
(CUDA) captured in a CUDA graph."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from kernel_pytorch import functional as F
from kernel_pytorch import reference as R
from kernel_pytorch.functional import _flex
from kernel_pytorch.tolerances import tolerance_for
from tests.grid import randn

FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
          "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def _docs(*lengths: int) -> torch.Tensor:
    """(K,) ids 0, 1, ... of consecutive documents of the given lengths."""
    return torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])


LAYOUTS = {  # (B, K) ids; K = 640 (5 blocks of 128) unless the layout says otherwise
    "equal": (torch.arange(640) // 128)[None],
    "ragged": _docs(5, 300, 17, 190, 128)[None],
    "one": torch.zeros(1, 640, dtype=torch.long),
    "unaligned": _docs(100, 100, 100, 340)[None].expand(2, -1),  # an expanded view, as attention() passes it
    "per_row": torch.stack([_docs(640), _docs(64, 576), _docs(250, 250, 140), _docs(*[10] * 64)]),
    "padding": torch.cat([_docs(200, 300), torch.full((140,), -1)])[None],  # a trailing run of pad ids
    "descending": 9 - _docs(129, 255, 256)[None],
    "short": _docs(90, 110)[None],  # K = 200: one full and one short key block
}


def _assert_same(got, want) -> None:
    assert got.seq_lengths == want.seq_lengths and got.BLOCK_SIZE == want.BLOCK_SIZE
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.is_contiguous() and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def _both(q_len: int, kv_len: int, **opts):
    ids = opts.get("seq_ids")
    got = _flex.block_mask(q_len, kv_len, **opts)
    mod = _flex._mask_mod(q_len, kv_len, is_causal=opts.get("is_causal", False), window=opts.get("window"),
                          seq_ids=ids, keep=None)
    want = create_block_mask(mod, None if ids is None else ids.shape[0], None, q_len, kv_len, device="cpu")
    return got, want


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("opts", [{}, {"is_causal": True}, {"window": 150}], ids=["docs", "causal", "window"])
@pytest.mark.parametrize("q_len", [None, 1, 330], ids=["square", "decode", "tail"])
def test_document_masks_equal_create_block_mask(layout: str, opts: dict, q_len: int | None) -> None:
    ids = LAYOUTS[layout]
    kv_len = ids.shape[1]
    _assert_same(*_both(min(q_len or kv_len, kv_len), kv_len, seq_ids=ids, **opts))


@pytest.mark.parametrize("opts", [{"is_causal": True}, {"window": 1}, {"window": 200}], ids=str)
@pytest.mark.parametrize("lengths", [(512, 512), (300, 700), (1, 129)], ids=str)
def test_shape_masks_equal_create_block_mask(opts: dict, lengths: tuple[int, int]) -> None:
    _assert_same(*_both(*lengths, **opts))


def test_an_id_in_two_runs_keeps_its_tiles() -> None:
    """Ids that come back after another document (the rule is "same id", wherever it is): that row's
    tiles are the causal ones, all partial, so every non-empty tile of the exact mask is still visited."""
    ids = torch.stack([_docs(200, 200, 240), torch.cat([_docs(200, 200), torch.zeros(240, dtype=torch.long)])])
    got, want = _both(640, 640, seq_ids=ids, is_causal=True)
    dense_got, dense_want = got.to_dense(), want.to_dense()  # (B, 1, n_q, n_kv): 1 where visited
    torch.testing.assert_close(dense_got[0], dense_want[0], rtol=0, atol=0)  # contiguous row: exact
    assert (dense_got[1] >= dense_want[1]).all() and int(got.full_kv_num_blocks[1].sum()) == 0
    assert torch.equal(dense_got[1, 0], torch.ones(5, 5, dtype=torch.int32).tril())


def test_documents_never_evaluate_the_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    def grid(*args, **kwargs):
        raise AssertionError("create_block_mask evaluates the mask over Q x K")

    monkeypatch.setattr(_flex, "create_block_mask", grid)
    mask = _flex.block_mask(4096, 4096, is_causal=True, seq_ids=(torch.arange(4096) // 512)[None].expand(4, -1))
    assert mask.kv_num_blocks.shape == (4, 1, 32) and int(mask.full_kv_num_blocks[0, 0, -1]) == 3


def test_flex_with_document_masks_matches_the_reference() -> None:
    """Flex forward on CPU (unfused in eager) with documents across and inside 128-blocks, per-row
    layouts, an id in two runs, a window, and decoding-style queries."""
    b, hq, hk, t = 2, 4, 2, 300
    tol = tolerance_for(torch.float32)
    ids = torch.stack([_docs(7, 150, 143), torch.cat([_docs(100, 100), torch.zeros(100, dtype=torch.long)])])
    q, k, v = randn(b, hq, t, 16), randn(b, hk, t, 16), randn(b, hk, t, 16)
    cases = [({"seq_ids": ids, "is_causal": True}, q), ({"seq_ids": ids}, q),
             ({"seq_ids": ids[:1], "window": 64}, q[:, :, -140:])]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # flex's unfused-eager warning
        for opts, qq in cases:
            want = dict(opts, seq_ids=opts["seq_ids"].expand(b, -1))
            torch.testing.assert_close(F.attention(qq, k, v, backend="flex", **opts), R.attention(qq, k, v, **want),
                                       atol=tol.atol, rtol=tol.rtol)


def test_the_build_compiles_in_one_graph() -> None:
    """fullgraph=True: no graph break, no host sync, and no recompilation for new ids of the same shape."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    def build(ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        mask = _flex.block_mask(400, 400, is_causal=True, seq_ids=ids)
        return tuple(getattr(mask, name) for name in FIELDS)

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(build, fullgraph=True, backend=counter)
    for ids in (_docs(100, 300)[None], _docs(129, 1, 270)[None], LAYOUTS["padding"][0, :400][None]):
        for got, want in zip(compiled(ids), build(ids)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert counter.frame_count == 1


def test_eager_document_masks_build_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager callers on COMPILED_BUILD devices (CUDA) get the compiled ops' mask: the same tensors as
    create_block_mask for new ids, batch sizes and windows (one compile, then one dynamic one)."""
    monkeypatch.setattr(_flex, "COMPILED_BUILD", ("cpu",))
    monkeypatch.setattr(_flex, "_compile_failed", [])
    calls = []
    compiled = _flex._compiled_range_tensors()
    monkeypatch.setattr(_flex, "_compiled_range_tensors", lambda: lambda *a: calls.append(a) or compiled(*a))
    for layout, opts in (("ragged", {"is_causal": True}), ("unaligned", {"is_causal": True}),
                         ("per_row", {"window": 150})):
        got, want = _both(640, 640, seq_ids=LAYOUTS[layout], **opts)
        _assert_same(got, want)
    assert len(calls) == 3 and not _flex._compile_failed


def test_a_failing_compiled_build_falls_back_to_eager_ops(monkeypatch, caplog) -> None:
    def broken(*args):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(_flex, "COMPILED_BUILD", ("cpu",))
    monkeypatch.setattr(_flex, "_compile_failed", [])
    monkeypatch.setattr(_flex, "_compiled_range_tensors", lambda: broken)
    with caplog.at_level("WARNING", logger="kernel_pytorch"):
        for _ in range(2):
            got, want = _both(640, 640, seq_ids=LAYOUTS["ragged"], is_causal=True)
            _assert_same(got, want)
    assert len(_flex._compile_failed) == 1
    assert "building it with eager ops" in caplog.text


@pytest.mark.cuda
def test_cuda_build_is_captured_in_a_cuda_graph() -> None:
    """No host sync: the build records into a CUDA graph, and a replay on other ids gives their mask."""
    ids = LAYOUTS["per_row"].cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _flex.block_mask(640, 640, is_causal=True, seq_ids=ids, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _flex.block_mask(640, 640, is_causal=True, seq_ids=ids, device="cuda")
    ids.copy_(torch.stack([_docs(300, 340), _docs(1, 639), _docs(*[128] * 5), _docs(333, 307)]))
    graph.replay()
    mod = _flex._mask_mod(640, 640, is_causal=True, window=None, seq_ids=ids, keep=None)
    _assert_same(captured, create_block_mask(mod, 4, None, 640, 640, device="cuda"))


def test_fused_flex_retries_with_smaller_tiles_when_shared_memory_runs_out(monkeypatch) -> None:
    # torch 2.11 on the H100 picked a bf16 head_dim-64 config needing more shared memory than the GPU has
    monkeypatch.setattr(_flex, "_small_tiles", set())
    calls = []

    def run(q, k, v, kernel_options=None, **kwargs):
        calls.append(kernel_options)
        if kernel_options is None:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: Required: 245760")
        return q + 1

    q = torch.randn(1, 2, 4, 8)
    out = _flex.run_fused(run, q, q, q, score_mod=None, block_mask=None, scale=None, enable_gqa=False)
    assert torch.equal(out, q + 1) and calls == [None, _flex.SMALL_TILES]
    _flex.run_fused(run, q, q, q, score_mod=None, block_mask=None, scale=None, enable_gqa=False)
    assert calls[2:] == [_flex.SMALL_TILES]  # remembered: no second failing compile

    def broken(q, k, v, **kwargs):
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        _flex.run_fused(broken, q.double(), q, q, score_mod=None, block_mask=None, scale=None, enable_gqa=False)
