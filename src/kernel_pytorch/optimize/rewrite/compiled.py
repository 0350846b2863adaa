"""The rewrites as a torch.compile pass, for a model compiled without `optimize()`: Inductor's pre-grad
custom pass (`torch._inductor.config.pre_grad_custom_pass`) matches the same patterns on Dynamo's graph
and puts our registered ops in their place, before autograd, so the backward is ours too.

    from kernel_pytorch.optimize.rewrite.compiled import inductor_options
    model = torch.compile(model, options=inductor_options())

Nothing validates a compiled graph against the original here, so a match is rewritten only where the
example values Dynamo recorded say our op takes them (`Pattern.fits`: shapes, dtypes, devices) and a cast
literal is x's own dtype. Where the ops cannot run (Triton missing), the pass changes nothing and logs so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch.fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.fx.passes.utils.matcher_utils import InternalMatch
from torch.fx.subgraph_rewriter import replace_pattern_with_filters

from kernel_pytorch._env import log_once
from kernel_pytorch._errors import short_error
from kernel_pytorch.functional._dispatch import kernels_ready
from kernel_pytorch.optimize.rewrite import patterns_of
from kernel_pytorch.optimize.rewrite.pattern import Pattern, arguments, dtype_ok, example, prepared, proven, target_name


class RewritePass(CustomGraphPass):
    """Inductor pre-grad pass replacing the patterns of `families` (True: all; names: `FAMILIES`).

    `counts` holds, per pattern kind, the matches rewritten in the graphs this pass has seen, and under
    "<kind>.causal" those of them whose mask was carried as causal (`Pattern.finish`).
    """

    def __init__(self, families: bool | str | Iterable[str] = True) -> None:
        self.patterns: tuple[Pattern, ...] = patterns_of(families)
        self.counts: dict[str, int] = {}

    def __call__(self, graph: torch.fx.Graph) -> None:
        if not self.patterns:
            return
        if not kernels_ready():
            log_once("kernel_pytorch rewrite pass: the registered ops cannot run here (Triton is missing); "
                     "graphs left as they are")
            return
        gm = graph.owning_module
        if gm is None:
            return
        names = {target_name(n) for n in graph.nodes}
        for p in self.patterns:
            if p.calls <= names:
                with prepared(gm, p):
                    done = replace_pattern_with_filters(gm, p.graph, p.op_replacement, [_fits(p)])
                if done:
                    self.counts[p.kind] = self.counts.get(p.kind, 0) + len(done)
                    carried = p.finish(gm, True) if p.finish is not None else 0
                    if carried:
                        self.counts[f"{p.kind}.causal"] = self.counts.get(f"{p.kind}.causal", 0) + carried
                    _refresh_examples(gm)

    def uuid(self) -> Any:
        """Inductor's cache key for this pass: the rewrite package's source and the patterns chosen."""
        digest = hashlib.sha256()
        for file in sorted(Path(__file__).parent.glob("*.py")):
            digest.update(file.read_bytes())
        digest.update(",".join(p.name for p in self.patterns).encode())
        return digest.hexdigest()


def _refresh_examples(gm: torch.fx.GraphModule) -> None:
    """Example values for the nodes a replacement made (`val`, from the placeholders' fake tensors), so a
    later pattern can judge a match that reads them (a residual stream our add + norm wrote). Where the
    graph cannot be propagated, those nodes stay without, and matches reading them are not made."""
    inputs = [example(n) for n in gm.graph.nodes if n.op == "placeholder"]
    mode = next((v.fake_mode for v in inputs if isinstance(v, FakeTensor)), None)
    if mode is None or any(v is None for v in inputs):
        return
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    except Exception as exc:  # a graph FakeTensorProp cannot run: the later matches are judged without
        log_once(f"kernel_pytorch rewrite pass: example values not refreshed ({short_error(exc, 200)})")


def _fits(p: Pattern) -> Any:
    def keep(match: InternalMatch, original: torch.fx.Graph, pattern: torch.fx.Graph) -> bool:
        bound = arguments(match)
        return dtype_ok(p, bound) and proven(p, bound) and p.fits({k: example(v) for k, v in bound.items()})
    return keep


def inductor_options(families: bool | str | Iterable[str] = True) -> dict[str, Any]:
    """Inductor options installing the rewrite pass: `torch.compile(model, options=inductor_options())`
    (a new pass object per call; merge with other options, e.g. `{**INDUCTOR_OPTIONS, **inductor_options()}`)."""
    return {"pre_grad_custom_pass": RewritePass(families)}


__all__ = ["RewritePass", "inductor_options"]
