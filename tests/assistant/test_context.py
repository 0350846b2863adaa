"""The analysis context and its parts: the shared trace, input copies, per-context sweep state."""

from __future__ import annotations

from collections import namedtuple

import torch
from torch import nn

from kernel_pytorch.assistant.context import AnalysisContext, AnalysisOptions
from kernel_pytorch.assistant.inputs import clone_inputs, infer_input_dims, resize, with_input
from kernel_pytorch.assistant.locate import resumed_function
from kernel_pytorch.assistant.recompiles.sweep import ShapeSweep, default_sizes, shape_sweep
from kernel_pytorch.assistant.records import CompileRecord
from tests.assistant import zoo


def _ctx(model: nn.Module, *args: object) -> AnalysisContext:
    return AnalysisContext(model, args, {}, AnalysisOptions(measure_compile_time=False))


def test_trace_records_graphs_and_breaks() -> None:
    torch.manual_seed(0)
    trace = _ctx(zoo.PrintCall(), torch.randn(4, 16)).trace
    assert trace.error is None and trace.failed_frames == ()
    assert len(trace.graphs) == 2 and all(g.ops for g in trace.graphs)
    assert len(trace.breaks) == 1 and "print" in trace.breaks[0].reason
    assert trace.seconds > 0


def test_trace_of_a_clean_model_is_one_graph() -> None:
    trace = _ctx(zoo.Clean(), torch.randn(4, 16)).trace
    assert (len(trace.graphs), trace.breaks, trace.error) == (1, (), None)


def test_clone_inputs_gives_fresh_tensors_and_keeps_parameters() -> None:
    pair = namedtuple("pair", "a b")
    x, p = torch.randn(3), nn.Parameter(torch.randn(2))
    out = clone_inputs({"x": x, "t": (p, pair(x, 1.5)), "n": 3})
    assert torch.equal(out["x"], x) and out["x"].data_ptr() != x.data_ptr()
    assert isinstance(out["t"][0], nn.Parameter) and out["t"][0].data_ptr() != p.data_ptr()
    assert type(out["t"][1]) is pair and out["t"][1].b == 1.5 and out["n"] == 3


def test_resize_tiles_and_cuts_contiguously() -> None:
    ids = torch.arange(6).view(2, 3)
    assert resize(ids, 1, 5).tolist() == [[0, 1, 2, 0, 1], [3, 4, 5, 3, 4]]
    assert resize(ids.t(), 0, 2).is_contiguous()


def test_input_dims_inferred_for_tokens_and_masks() -> None:
    ids, mask = torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.bool)
    assert infer_input_dims((ids,), {"mask": mask}) == {0: {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}}
    assert infer_input_dims((torch.randn(2, 3, 8, 8),), {}) == {0: {0: "batch"}}


def test_default_sizes_grow_batch_and_shrink_sequence() -> None:
    assert default_sizes("batch", 4) == (4, 8, 12)
    assert default_sizes("seq", 16) == (16, 8, 12)
    assert default_sizes("seq", 2) == (2,)


def test_sweep_is_kept_per_context_and_each_run_once() -> None:
    ctx = _ctx(zoo.Mlp(), torch.randn(2, 8, 16))
    sweep = shape_sweep(ctx)
    assert sweep is shape_sweep(ctx) is ctx.part(ShapeSweep)
    assert sweep.sizes == {"batch": (2, 4, 6), "seq": (8, 4, 6)}
    assert [v.label for v in sweep.variants] == ["example", "batch=4", "batch=6", "seq=4", "seq=6"]
    assert sweep.run() is sweep.run()
    assert shape_sweep(_ctx(zoo.Mlp(), torch.randn(2, 8, 16))) is not sweep


def test_resume_frames_are_named_after_their_function() -> None:
    assert resumed_function("torch_dynamo_resume_in_forward_at_12") == "forward"
    assert resumed_function("forward") is None and resumed_function(None) is None
    assert CompileRecord("1/0", "v", None, co_name="torch_dynamo_resume_in_forward_at_12").after_graph_break


def test_guard_names_resolve_to_inputs_in_every_form() -> None:
    batch = {"x": torch.randn(2, 4), "pair": (torch.randn(2), 3)}
    ctx = AnalysisContext(zoo.Clean(), (torch.randn(2, 16),), {"batch": batch, "scale": 0.5})
    assert ctx.resolve_input("x") == 0 and ctx.resolve_input("L['x']") == 0 and ctx.resolve_input("args[0]") == 0
    for name in ("scale", "kwargs['scale']", "L['kwargs']['scale']", 'L["kwargs"]["scale"]'):
        assert ctx.resolve_input(name) == "scale", name
    for name in ("L['batch']['x']", "kwargs['batch']['x']", "L['kwargs']['batch']['x']", "batch.x"):
        assert ctx.resolve_input(name) == ("batch", "['x']"), name
    assert ctx.resolve_input("L['batch']['pair'][0]") == ("batch", "['pair'][0]")
    assert ctx.resolve_input("L['self'].proj") is None and ctx.resolve_input("kwargs['nope']") is None
    assert ctx.input_name(("batch", "['pair'][0]")) == "batch['pair'][0]"
    assert torch.equal(ctx.input_value(("batch", "['x']")), batch["x"])


def test_nested_tensors_get_dims_and_are_replaced_in_a_copy() -> None:
    x, mask = torch.randn(2, 8, 16), torch.ones(2, 8, dtype=torch.bool)
    args = ({"x": x, "mask": mask},)
    assert infer_input_dims(args, {}) == {(0, "['x']"): {0: "batch", 1: "seq"}, (0, "['mask']"): {0: "batch", 1: "seq"}}
    new_args, _ = with_input(args, {}, (0, "['x']"), resize(x, 0, 4))
    assert new_args[0]["x"].shape == (4, 8, 16) and new_args[0]["mask"] is mask
    assert args[0]["x"] is x  # the example is left as it was
    sweep = shape_sweep(_ctx(nn.Identity(), {"x": x, "mask": mask}))
    assert {v.label for v in sweep.variants} >= {"batch=4", "seq=4"}


def test_sequence_first_rnn_inputs_have_the_batch_at_dim_1() -> None:
    gru = nn.GRU(8, 16)  # batch_first=False: (T, B, F)
    assert infer_input_dims((torch.randn(16, 2, 8),), {}, gru) == {0: {0: "seq", 1: "batch"}}
    tagger = nn.Sequential(nn.Embedding(10, 8), nn.LSTM(8, 8))
    ids = torch.zeros(16, 2, dtype=torch.long)
    assert infer_input_dims((ids,), {}, tagger) == {0: {0: "seq", 1: "batch"}}
    # batch-first recurrent layers, or features of another size, keep the (B, T, ...) reading
    assert infer_input_dims((torch.randn(2, 16, 8),), {}, nn.GRU(8, 16, batch_first=True)) == {
        0: {0: "batch", 1: "seq"}
    }
    assert infer_input_dims((torch.randn(2, 16, 4),), {}, gru) == {0: {0: "batch", 1: "seq"}}
