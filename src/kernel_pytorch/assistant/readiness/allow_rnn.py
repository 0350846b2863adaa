"""The allow_rnn check: Dynamo gives up on nn.LSTM / nn.GRU / nn.RNN unless
`torch._dynamo.config.allow_rnn = True`; this re-runs the example call with it set, as one graph
(`fullgraph=True`), and compares the outputs with the eager model's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from kernel_pytorch._errors import short_error
from kernel_pytorch._tree import flatten
from kernel_pytorch.assistant.context import AnalysisContext
from kernel_pytorch.assistant.dynamo import GraphRecorder, fresh_dynamo
from kernel_pytorch.assistant.inputs import clone_inputs
from kernel_pytorch.tolerances import compare_reordered


@dataclass(frozen=True)
class RnnCheck:
    """What `allow_rnn = True` gave on the example call.

    Attributes:
        verified: one graph with fullgraph=True and outputs equal to eager's (within the tolerance
            table's entry for their dtype, sums reordered).
        graphs: graphs Dynamo compiled with it.
        ops: FX ops in those graphs.
        problem: why it did not verify (the error, or the output that differs); "" when it did.
        seconds: time the check took.
    """

    verified: bool
    graphs: int
    ops: int
    problem: str
    seconds: float


def _outputs_differ(compiled: object, eager: object) -> str:
    """ "" when every leaf matches; else the first leaf that does not, in words."""

    ours, ref = flatten(compiled), flatten(eager)
    if [p for p, _ in ours] != [p for p, _ in ref]:
        return "the compiled model returns another structure than the eager one"
    for (path, a), (_, b) in zip(ours, ref):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            continue
        if a.shape != b.shape:
            return f"{path}: shape {list(a.shape)} compiled, {list(b.shape)} eager"
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return f"{path}: values differ"
            continue
        result = compare_reordered(a.float(), b.float(), a.dtype)
        if not result.passed:
            return result.message(path)
    return ""


def check_allow_rnn(ctx: AnalysisContext) -> RnnCheck:
    """Compile the example call with `allow_rnn=True` and `fullgraph=True` (trace backend), compare
    with eager. Built once per context (`ctx.part(check_allow_rnn)`)."""
    ctx.progress("re-tracing with torch._dynamo.config.allow_rnn = True")
    start = time.perf_counter()
    recorder = GraphRecorder(ctx.options.trace_backend)
    problem = ""
    devices = [ctx.device] if ctx.device.type == "cuda" else []
    # both calls from one seed: a model left in training mode draws the same dropout masks
    with fresh_dynamo(allow_rnn=True), torch.random.fork_rng(devices=devices):
        torch.manual_seed(0)
        compiled = torch.compile(ctx.module, backend=recorder, fullgraph=True, dynamic=ctx.options.dynamic)
        try:
            out = ctx.call(compiled, clone_inputs(ctx.args), clone_inputs(ctx.kwargs))
        except Exception as exc:
            problem = short_error(exc, 300)
    if not problem:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            torch.manual_seed(0)
            ref = ctx.call(ctx.module, clone_inputs(ctx.args), clone_inputs(ctx.kwargs))
        problem = _outputs_differ(out, ref)
    graphs = len(recorder.graphs)
    ops = sum(len(g.ops) for g in recorder.graphs)
    ok = not problem and graphs >= 1
    if not problem and not ok:
        problem = "Dynamo compiled no graph"
    return RnnCheck(ok, graphs, ops, problem, time.perf_counter() - start)
