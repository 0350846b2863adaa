"""The fusable patterns kernel_pytorch's components implement, found in a captured FX graph.

Each `find_*` takes a `GraphView` and returns its `Match`es: handwritten RMSNorm and LayerNorm,
`silu(a) * b` / `gelu(a) * b`, rotate-half RoPE, manual attention (`softmax(q @ k.T) @ v`, scaled and
masked or not), K/V repeated to the query's head count, a residual add feeding an RMSNorm, a 1-D bias
added before an activation, and a linear layer feeding cross-entropy over a large vocabulary. A match
needs the whole chain; library calls that already fuse it (`F.rms_norm`, `F.layer_norm`,
`F.scaled_dot_product_attention`, a Linear's own bias) are never matched.
"""

from __future__ import annotations

from kernel_pytorch.assistant.fusion.graph import (
    LARGE_VOCAB,
    GraphView,
    Match,
    is_constant,
    last_dim,
    other_operand,
)
from kernel_pytorch.assistant.records import NodeInfo

# ops that may sit between the scores matmul and the softmax (scale, mask, cast) and after it
_SCORE_OPS = ("mul", "div", "add", "sub", "masked_fill", "cast", "where")
_PROB_OPS = ("cast", "dropout", "masked_fill")


def _one_d(node: object, size: int | None) -> bool:
    return isinstance(node, NodeInfo) and node.shape is not None and len(node.shape) == 1 and node.shape[0] == size


def _squared(g: GraphView, node: NodeInfo | None) -> NodeInfo | None:
    """x for `x.pow(2)`, `x ** 2`, `x.square()` or `x * x`; None otherwise."""
    kind = g.kind(node)
    if node is None or kind not in ("pow", "mul"):
        return None
    x = g.arg(node, 0, "input")
    if not isinstance(x, NodeInfo):
        return None
    if kind == "pow":
        return x if node.target == "square" or is_constant(g.arg(node, 1, "exponent"), 2) else None
    ins = g.tensor_inputs(node)
    return x if len(node.inputs) == 2 and len(ins) == 2 and ins[0] is ins[1] else None


def _scale_out(g: GraphView, norm: NodeInfo, size: int | None) -> tuple[NodeInfo, list[NodeInfo], bool]:
    """After the normalising op: an optional cast, then a multiply by a (size,) weight (or by an
    expression of one, `1 + weight`), then an optional (size,) bias add. Returns (the last node,
    the nodes passed, whether a weight was found)."""
    out, nodes, weighted = norm, [], False
    user, casts = g.only_user(out, through=("cast",))
    if g.kind(user) == "mul" and user is not None:
        w = other_operand(g, user, casts[-1] if casts else out)
        if _one_d(w, size):
            _, passed = g.up(w, ("add", "cast"))  # `1 + weight.float()` (Gemma) belongs to the norm
            nodes += [*casts, user, *passed]
            out, weighted = user, True
    user, _ = g.only_user(out)
    if weighted and g.kind(user) == "add" and user is not None and _one_d(other_operand(g, user, out), size):
        nodes.append(user)
        out = user
    return out, nodes, weighted


def find_rms_norms(g: GraphView) -> list[Match]:
    """`x * rsqrt(mean(x^2) + eps)` (or `x / sqrt(...)`), then an optional weight: a handwritten RMSNorm."""
    found = []
    for mean in g.of_kind("mean"):
        x = _squared(g, g.arg(mean, 0, "input"))
        if x is None or x.shape is None or not last_dim(x, g.arg(mean, 1, "dim")):
            continue
        src, casts = g.up(x, ("cast",))
        nodes = [*casts, g.arg(mean, 0, "input"), mean]
        cur, eps = mean, None
        user, _ = g.only_user(cur)
        if g.kind(user) == "add" and user is not None and is_constant(other_operand(g, user, cur)):
            eps, cur = other_operand(g, user, cur), user
            nodes.append(user)
        root, _ = g.only_user(cur)
        if root is None or g.kind(root) not in ("rsqrt", "sqrt"):
            continue
        norm, _ = g.only_user(root)
        want = "mul" if g.kind(root) == "rsqrt" else "div"
        if norm is None or g.kind(norm) != want or g.base(other_operand(g, norm, root)) is not g.base(x):
            continue
        size = x.shape[-1]
        out, scale, weighted = _scale_out(g, norm, size)
        nodes += [root, norm, *scale]
        details = {"hidden": size, "eps": eps, "weighted": weighted, "dtype": src.dtype if src else x.dtype}
        names = frozenset(n.name for n in nodes)
        found.append(Match("rms-norm", mean.name, names, g.boundary_bytes(names), details=details))
    return found


def _variance_of(g: GraphView, node: object, d: NodeInfo, x: NodeInfo) -> list[NodeInfo] | None:
    """The nodes computing the variance behind `node` (`var(x)`, `mean(d^2)`, `mean(d * d)`, plus
    `+ eps`), or None when `node` is not one."""
    if not isinstance(node, NodeInfo):
        return None
    nodes = []
    if g.kind(node) == "add" and isinstance(g.arg(node, 0, "input"), NodeInfo):
        nodes.append(node)
        node = g.arg(node, 0, "input")
    if g.kind(node) == "var" and g.base(g.arg(node, 0, "input")) in (g.base(x), d):
        return [*nodes, node]
    if g.kind(node) == "mean" and _squared(g, g.arg(node, 0, "input")) is d:
        return [*nodes, node, g.arg(node, 0, "input")]
    return None


def find_layer_norms(g: GraphView) -> list[Match]:
    """`(x - mean(x)) * rsqrt(var + eps)` (or `/ sqrt(...)`), then optional weight and bias."""
    found = []
    for mean in g.of_kind("mean"):
        x = g.arg(mean, 0, "input")
        if not isinstance(x, NodeInfo) or x.shape is None or not last_dim(x, g.arg(mean, 1, "dim")):
            continue
        for d in g.users_of(mean):
            if g.kind(d) != "sub" or g.arg(d, 1, "other") is not mean or g.base(g.arg(d, 0, "input")) is not g.base(x):
                continue
            for norm in g.users_of(d):
                root = other_operand(g, norm, d) if g.kind(norm) in ("mul", "div") else None
                want = {"mul": "rsqrt", "div": "sqrt"}.get(g.kind(norm) or "")
                if not isinstance(root, NodeInfo) or g.kind(root) != want:
                    continue
                var = _variance_of(g, g.arg(root, 0, "input"), d, x)
                if var is None:
                    continue
                out, scale, weighted = _scale_out(g, norm, x.shape[-1])
                src, casts = g.up(x, ("cast",))
                names = frozenset(n.name for n in (*casts, mean, d, *var, root, norm, *scale))
                details = {"hidden": x.shape[-1], "weighted": weighted, "dtype": (src or x).dtype}
                found.append(Match("layer-norm", mean.name, names, g.boundary_bytes(names), details=details))
                break
    return found


def find_gated_activations(g: GraphView) -> list[Match]:
    """`act(a) * b` with act SiLU or GELU and b of the same shape: the gated MLP's SwiGLU / GeGLU."""
    found = []
    for mul in g.of_kind("mul"):
        ins = g.tensor_inputs(mul)
        if len(ins) != 2 or ins[0] is ins[1]:
            continue
        for act, up in (ins, ins[::-1]):
            if g.kind(act) not in ("silu", "gelu") or len(g.users_of(act)) != 1 or act.shape != up.shape:
                continue
            gate = g.arg(act, 0, "input")
            if up.shape != mul.shape or g.base(up) is g.base(gate):
                continue
            names = frozenset((act.name, mul.name))
            details = {"act": g.kind(act), "approximate": g.arg(act, 1, "approximate"), "shape": mul.shape}
            found.append(Match("gated-act", mul.name, names, g.boundary_bytes(names), details=details))
            break
    return found


def _half_of(g: GraphView, node: object) -> tuple[NodeInfo | None, list[NodeInfo]]:
    """(x, the nodes) for a slice of x on its last dim: `x[..., :h]`, `x.chunk(2, -1)[i]`, `x.narrow(...)`."""
    if not isinstance(node, NodeInfo):
        return None, []
    if g.kind(node) == "getitem":
        src = g.arg(node, 0)
        if g.kind(src) == "split":
            return g.arg(src, 0, "input"), [node, src]
        return (src, [node]) if isinstance(src, NodeInfo) and src.shape is not None else (None, [])
    if node.target == "narrow":
        return g.arg(node, 0, "input"), [node]
    return None, []


def find_rotate_half_rope(g: GraphView) -> list[Match]:
    """`x * cos + cat(-x2, x1) * sin` with x1, x2 the halves of x: rotary embeddings, rotate-half form."""
    found = []
    for cat in g.of_kind("cat"):
        parts = g.arg(cat, 0, "tensors")
        if not isinstance(parts, tuple) or len(parts) != 2 or cat.shape is None:
            continue
        neg, first = (g.nodes.get(getattr(p, "name", "")) for p in parts)
        dim = g.arg(cat, 1, "dim")
        if g.kind(neg) != "neg" or dim not in (-1, len(cat.shape) - 1) or neg is None:
            continue
        x, halves = _half_of(g, g.arg(neg, 0, "input"))
        x1, halves1 = _half_of(g, first)
        if x is None or x is not x1:
            continue
        m2, _ = g.only_user(cat)
        add, _ = g.only_user(m2) if m2 is not None and g.kind(m2) == "mul" else (None, [])
        if add is None or g.kind(add) != "add":
            continue
        m1 = other_operand(g, add, m2)
        if g.kind(m1) != "mul" or not any(i is x for i in g.tensor_inputs(m1)):
            continue
        names = frozenset(n.name for n in (*halves, *halves1, neg, cat, m2, m1, add))
        details = {"shape": x.shape, "head_dim": x.shape[-1] if x.shape else None}
        found.append(Match("rope", add.name, names, g.boundary_bytes(names), details=details))
    return found


def find_manual_attention(g: GraphView) -> list[Match]:
    """`softmax(q @ k.T [* scale] [+ mask]) @ v`: attention written out, the scores materialised."""
    found = []
    for sm in g.of_kind("softmax"):
        if sm.shape is None or len(sm.shape) < 2:
            continue
        node, between = g.arg(sm, 0, "input"), []
        while isinstance(node, NodeInfo) and g.kind(node) in _SCORE_OPS and len(between) < 6:
            between.append(node)
            node = next((i for i in g.tensor_inputs(node) if i.shape == sm.shape), None)
        if not isinstance(node, NodeInfo) or g.kind(node) != "matmul":
            continue
        qk, after, pv = node, [], None
        cur = sm
        while pv is None:
            user, _ = g.only_user(cur)
            if user is None:
                break
            if g.kind(user) == "matmul" and g.arg(user, 0, "input") is cur:
                pv = user
            elif g.kind(user) in _PROB_OPS:
                after.append(user)
                cur = user
            else:
                break
        if pv is None:
            continue
        k_t = g.arg(qk, 1, "other")
        layout = [k_t] if g.kind(k_t) == "layout" and len(g.users_of(k_t)) == 1 else []
        names = frozenset(n.name for n in (qk, *between, sm, *after, pv, *layout))
        masked = any(g.kind(n) in ("add", "masked_fill", "where") for n in between)
        scaled = any(g.kind(n) in ("mul", "div") for n in between)
        details = {
            "scores": sm.shape,
            "masked": masked,
            "scaled": scaled,
            "dtype": sm.dtype,
            "qk": qk.name,
            "pv": pv.name,
        }
        found.append(Match("attention", qk.name, names, g.boundary_bytes(names), details=details))
    return found


def _repeat(g: GraphView, node: object) -> tuple[list[NodeInfo], NodeInfo | None, int]:
    """(the nodes, the source, the factor) when `node` repeats a tensor's heads (dim 1):
    `x.repeat_interleave(n, 1)` or `x[:, :, None].expand(...).reshape(...)`; ([], None, 1) if not."""
    if not isinstance(node, NodeInfo) or node.shape is None or len(node.shape) < 3:
        return [], None, 1
    if node.target == "repeat_interleave":
        src = g.arg(node, 0, "input")
        if isinstance(src, NodeInfo) and src.shape and src.shape[1] and node.shape[1]:
            return [node], src, node.shape[1] // src.shape[1]
        return [], None, 1
    if g.kind(node) != "view":
        return [], None, 1
    expand = g.arg(node, 0, "input")
    if not isinstance(expand, NodeInfo) or expand.target != "expand":
        return [], None, 1
    inner = g.arg(expand, 0, "input")
    if g.kind(inner) not in ("getitem", "layout") or not isinstance(inner, NodeInfo):
        return [], None, 1
    src = g.arg(inner, 0, "input")
    if not isinstance(src, NodeInfo) or not src.shape or not expand.shape or len(expand.shape) != len(src.shape) + 1:
        return [], None, 1
    return [node, expand, inner], src, expand.shape[2] or 1


def find_repeated_kv(g: GraphView, attention: list[Match]) -> list[Match]:
    """K and V repeated to the query's head count before SDPA or a manual attention: grouped-query
    attention paying a copy of K and V (and reading them `n_rep` times) that `enable_gqa=True` avoids."""
    consumers: list[tuple[object, object]] = [
        (g.arg(n, 1, "key"), g.arg(n, 2, "value")) for n in g.of_kind("scaled_dot_product_attention")
    ]
    for m in attention:
        k, _ = g.up(g.arg(g[m.details["qk"]], 1, "other"), ("layout",))
        consumers.append((k, g.arg(g[m.details["pv"]], 1, "other")))
    found = []
    for k, v in consumers:
        nodes, saved, n_rep, sources = [], 0, 1, []
        for t in (k, v):
            made, src, rep = _repeat(g, t)
            if src is None or rep < 2:
                continue
            nodes += made
            sources.append(src)
            n_rep = rep
            # the copy's traffic, then the consumer reading every head n_rep times instead of once
            saved += sum(g.kernel_bytes(n) for n in made) + (rep - 1) * src.nbytes
        if not nodes:
            continue
        anchor = min(nodes, key=lambda n: g.order[n.name])
        names = frozenset(n.name for n in nodes)
        details = {"n_rep": n_rep, "kv_shape": sources[0].shape, "repeated": len(sources)}
        found.append(Match("gqa-repeat", anchor.name, names, 0, fused_kernels=0, details=details, saved_bytes=saved))
    return found


def find_residual_norms(g: GraphView, rms: list[Match]) -> list[Match]:
    """A residual add whose sum feeds an RMSNorm (handwritten or `F.rms_norm`): one fused kernel adds,
    writes the new residual and normalises, instead of the norm reading the sum back."""
    inputs: list[tuple[NodeInfo, Match | None]] = []
    for m in rms:
        cast_or_pow = [g.nodes[n] for n in m.nodes]
        entry = {i.name: i for n in cast_or_pow for i in g.tensor_inputs(n) if i.name not in m.nodes and i.shape}
        big = [i for i in entry.values() if len(i.shape or ()) > 1]
        if len(big) == 1:
            inputs.append((big[0], m))
    inputs += [(n_in, None) for n in g.of_kind("rms_norm") if isinstance(n_in := g.arg(n, 0, "input"), NodeInfo)]
    found = []
    for s, norm in inputs:
        ins = g.tensor_inputs(s)
        if g.kind(s) != "add" or len(ins) != 2 or any(i.shape != s.shape for i in ins):
            continue
        others = len(g.users_of(s)) > 1
        saved = s.nbytes * (1 if others else 2)  # the norm's read of the sum (and its write, if unused)
        details = {"hidden": (s.shape or (None,))[-1], "eps": norm.details.get("eps") if norm else None}
        found.append(Match("residual-norm", s.name, frozenset((s.name,)), 0, 0, details=details, saved_bytes=saved))
    return found


def find_bias_activations(g: GraphView) -> list[Match]:
    """`act(x + b)` with b a (D,) bias and act GELU, SiLU or ReLU: two elementwise passes for one."""
    found = []
    for act in g.of_kind(*("gelu", "silu", "relu")):
        add = g.arg(act, 0, "input")
        if g.kind(add) != "add" or not isinstance(add, NodeInfo) or len(g.users_of(add)) != 1:
            continue
        ins = g.tensor_inputs(add)
        if len(ins) != 2:
            continue
        x, b = sorted(ins, key=lambda n: len(n.shape or ()), reverse=True)
        if len(x.shape or ()) < 2 or not _one_d(b, (x.shape or (None,))[-1]):
            continue
        names = frozenset((add.name, act.name))
        no_bias_linear = g.kind(x) == "linear" and g.arg(x, 2, "bias") is None
        details = {"act": g.kind(act), "shape": x.shape, "linear_without_bias": no_bias_linear}
        found.append(Match("bias-act", act.name, names, g.boundary_bytes(names), details=details))
    return found


def find_linear_cross_entropy(g: GraphView) -> list[Match]:
    """A linear layer whose (N, V) output, V >= LARGE_VOCAB, goes straight into cross-entropy: the
    logits (and their fp32 copy and gradient) are materialised for a loss that never needs them whole."""
    found = []
    losses = list(g.of_kind("cross_entropy"))
    losses += [n for n in g.of_kind("nll_loss") if g.kind(g.arg(n, 0, "input")) == "log_softmax"]
    for loss in losses:
        head, passed = g.up(g.arg(loss, 0, "input"), ("cast", "view", "layout", "getitem", "contiguous", "log_softmax"))
        if g.kind(head) not in ("linear", "matmul") or head is None or not head.shape:
            continue
        vocab = head.shape[-1]
        if vocab is None or vocab < LARGE_VOCAB:
            continue
        names = frozenset(n.name for n in (head, *passed, loss))
        hidden, weight = (g.arg(head, i) for i in (0, 1))
        fused = sum(n.nbytes for n in (hidden, weight) if isinstance(n, NodeInfo)) + loss.nbytes
        tokens = (head.numel or 0) // vocab
        details = {"vocab": vocab, "tokens": tokens, "logits_bytes": head.nbytes, "dtype": head.dtype}
        found.append(Match("linear-cross-entropy", loss.name, names, fused, details=details))
    return found


def find_all(g: GraphView) -> list[Match]:
    """Every match of every pattern in one graph."""
    layer = find_layer_norms(g)
    # a LayerNorm's variance is a mean of squares too (of the centred x): that part is no RMSNorm
    rms = [m for m in find_rms_norms(g) if not any(m.nodes & ln.nodes for ln in layer)]
    attention = find_manual_attention(g)
    return [
        *rms,
        *layer,
        *find_gated_activations(g),
        *find_rotate_half_rope(g),
        *attention,
        *find_repeated_kv(g, attention),
        *find_residual_norms(g, rms),
        *find_bias_activations(g),
        *find_linear_cross_entropy(g),
    ]
