"""How far a quantized language model's predictions move from the unquantized model's.

    reference = copy.deepcopy(model)                 # before quantizing
    quantize(model, "int8")
    acc = quantized_agreement(reference, model, prompt, stream=tokens)
    print(acc.summary())   # greedy agreement, first divergence, perplexity change, KL, max relative error

Five numbers, all against the reference model on the same tokens:
  - greedy agreement, teacher-forced: the reference continues `tokens` greedily for `new_tokens` tokens;
    both models then read the prompt plus that continuation in one forward, and the agreement is the
    fraction of the generated positions where their argmax tokens are equal. Both read the same
    context at every position, so one early difference does not change what follows.
  - first divergence, free-running: the quantized model continues the prompt greedily on its own; the
    first generated position whose token differs from the reference's continuation (None: none did).
  - perplexity on a token stream, exp(mean next-token cross-entropy), of both models, and the relative
    change ppl_quantized / ppl_reference - 1.
  - the mean KL divergence KL(p_reference || p_quantized) of the next-token distributions over the
    stream's positions, in nats: the number that stays meaningful where absolute perplexity is not
    (random weights, whose perplexity sits near the vocabulary size).
  - the largest logit error over the stream, max|q - ref| / max|ref|, the quantity `expected_rtol`
    predicts (`validate_quantized` allows 2 x rtol of it).
Greedy decoding here re-reads the whole sequence each step (no KV cache), so it works for any model
whose forward maps token ids to logits; it costs new_tokens forwards of up to T + new_tokens tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn

from kernel_pytorch.deploy._quantized import tensors_of
from kernel_pytorch.deploy.quantize import quantized_linears

LogitsFn = Callable[[nn.Module, Tensor], Tensor]


@dataclass(frozen=True)
class QuantAgreement:
    """`quantized_agreement`'s result: the quantized model's predictions against the reference's."""

    new_tokens: int  # greedy tokens generated per sequence
    agreement: float  # teacher-forced: fraction of the B x new_tokens positions with equal argmax
    first_divergence: tuple[int | None, ...]  # free-running, per sequence: first differing position, or None
    stream_tokens: int  # next-token predictions scored on the stream (B x (S - 1))
    ppl_reference: float
    ppl_quantized: float
    ppl_change: float  # ppl_quantized / ppl_reference - 1
    kl: float  # mean KL(reference || quantized) per predicted token, nats
    max_rel_err: float  # max|q - ref| / max|ref| over the stream's logits

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["first_divergence"] = list(self.first_divergence)
        return d

    def summary(self) -> str:
        div = ", ".join("none" if p is None else str(p) for p in self.first_divergence)
        return (f"greedy agreement {self.agreement:.3f} (teacher-forced on the reference's tokens, "
                f"{len(self.first_divergence)} x {self.new_tokens}); free-running first divergence at {div}; "
                f"perplexity {self.ppl_reference:.4g} -> {self.ppl_quantized:.4g} ({self.ppl_change:+.3%}), "
                f"mean KL {self.kl:.3g} nats over {self.stream_tokens} tokens; max rel logit err "
                f"{self.max_rel_err:.3g}")


def model_logits(model: nn.Module, ids: Tensor) -> Tensor:
    """`model(ids)`'s logits (B, T, V): the output itself, its `.logits` (transformers) or its first item."""
    out = model(ids)
    if isinstance(out, Tensor):
        return out
    if isinstance(getattr(out, "logits", None), Tensor):
        return out.logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    raise TypeError(f"the model returned {type(out).__name__}; pass logits_fn=(model, ids) -> logits (B, T, V)")


def greedy(model: nn.Module, tokens: Tensor, new_tokens: int, logits_fn: LogitsFn = model_logits) -> Tensor:
    """`tokens` (B, T) continued by `new_tokens` argmax tokens, each from a forward over the whole
    sequence so far: (B, T + new_tokens)."""
    seq = tokens
    for _ in range(new_tokens):
        nxt = logits_fn(model, seq)[:, -1].argmax(dim=-1, keepdim=True)
        seq = torch.cat([seq, nxt.to(seq.dtype)], dim=1)
    return seq


# stream positions scored at a time: the fp32 temporaries of a 128256-token vocabulary stay near 0.5 GiB each
STATS_ROWS = 1024


def stream_stats(ref: Tensor, q: Tensor, targets: Tensor, rows: int = STATS_ROWS) -> tuple[float, float, float, float]:
    """Sums over the predictions of logits (N, V) on `targets` (N,), in fp32, `rows` rows at a time:
    (reference cross-entropy, quantized cross-entropy, KL(reference || quantized), max|q - ref|)."""
    ce_ref = ce_q = kl = err = 0.0
    for start in range(0, ref.shape[0], rows):
        r, k, t = (x[start:start + rows] for x in (ref, q, targets))
        r_logp, q_logp = torch.log_softmax(r.float(), dim=-1), torch.log_softmax(k.float(), dim=-1)
        ce_ref -= float(r_logp.gather(1, t[:, None]).double().sum())
        ce_q -= float(q_logp.gather(1, t[:, None]).double().sum())
        kl += float((r_logp.exp() * (r_logp - q_logp)).sum(dim=-1).double().sum())
        err = max(err, float((k.float() - r.float()).abs().max()))
    return ce_ref, ce_q, kl, err


def _check_ids(name: str, ids: Tensor, min_len: int) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32):
        raise ValueError(f"{name} must be token ids of shape (B, T), int64 or int32; got "
                         f"{getattr(ids, 'shape', type(ids).__name__)} {getattr(ids, 'dtype', '')}")
    if ids.shape[1] < min_len:
        raise ValueError(f"{name} needs at least {min_len} tokens per sequence, got {ids.shape[1]}")


def quantized_agreement(reference_model: nn.Module, quantized_model: nn.Module, tokens: Tensor, *,
                        new_tokens: int = 64, stream: Tensor | None = None, free_running: bool = True,
                        logits_fn: LogitsFn = model_logits) -> QuantAgreement:
    """Greedy-token agreement, perplexity change and KL divergence of `quantized_model` against
    `reference_model` (the same model unquantized), under no_grad.

    Args:
        reference_model, quantized_model: map token ids (B, T) to logits (B, T, V) through `logits_fn`.
        tokens: the prompt, token ids (B, T), T >= 1, on the models' device.
        new_tokens: greedy tokens generated after the prompt (>= 1).
        stream: token ids (B', S), S >= 2, whose perplexity both models are scored on; default the
            prompt followed by the reference's greedy continuation. Pass held-out text for a trained
            model; for random weights, seeded random tokens.
        free_running: also let the quantized model generate on its own (`first_divergence`); False
            skips those forwards and leaves first_divergence empty.
        logits_fn: (model, ids) -> logits (B, T, V); default `model_logits`.
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1, got {new_tokens}")
    _check_ids("tokens", tokens, 1)
    if stream is not None:
        _check_ids("stream", stream, 2)
    prompt = tokens.shape[1]
    with torch.no_grad():
        seq = greedy(reference_model, tokens, new_tokens, logits_fn)
        # teacher-forced: both read prompt + the reference's tokens; positions prompt-1 .. end-1 predict them
        ctx = seq[:, :-1]
        ref_next = logits_fn(reference_model, ctx)[:, prompt - 1:].argmax(dim=-1)
        q_next = logits_fn(quantized_model, ctx)[:, prompt - 1:].argmax(dim=-1)
        agreement = float((ref_next == q_next).double().mean())
        divergence: tuple[int | None, ...] = ()
        if free_running:
            own = greedy(quantized_model, tokens, new_tokens, logits_fn)[:, prompt:]
            differs = own != seq[:, prompt:]
            divergence = tuple(int(row.nonzero()[0]) if bool(row.any()) else None for row in differs)
        text = seq if stream is None else stream
        ref_logits, q_logits = logits_fn(reference_model, text), logits_fn(quantized_model, text)
        vocab = ref_logits.shape[-1]
        ce_ref, ce_q, kl, err = stream_stats(ref_logits[:, :-1].reshape(-1, vocab),
                                              q_logits[:, :-1].reshape(-1, vocab), text[:, 1:].reshape(-1))
        # the last position predicts nothing on the stream, but its logits count towards the error
        last_err = float((q_logits[:, -1].float() - ref_logits[:, -1].float()).abs().max())
        top = float(ref_logits.float().abs().max())
    n = text[:, 1:].numel()
    ppl_ref, ppl_q = math.exp(ce_ref / n), math.exp(ce_q / n)
    err = max(err, last_err)
    return QuantAgreement(new_tokens=new_tokens, agreement=agreement, first_divergence=divergence,
                          stream_tokens=n, ppl_reference=ppl_ref, ppl_quantized=ppl_q, ppl_change=ppl_q / ppl_ref - 1,
                          kl=kl / n, max_rel_err=err / top if top > 0 else err)


def linear_weight_bytes(model: nn.Module, names: Sequence[str] | None = None) -> int:
    """Bytes of the tensors of `model`'s linear layers `names` (default: its quantized ones, or every
    nn.Linear when none is quantized): a quantized weight by its parts (data, scales, zero points),
    a layer shared under several names once."""
    modules = dict(model.named_modules(remove_duplicate=False))
    if names is None:
        names = quantized_linears(model) or [n for n, m in modules.items() if isinstance(m, nn.Linear)]
    seen: set[int] = set()
    total = 0
    for name in names:
        module = modules[name]
        if id(module) in seen:
            continue
        seen.add(id(module))
        total += sum(t.numel() * t.element_size() for t in tensors_of(module.state_dict()).values())
    return total


__all__ = ["QuantAgreement", "greedy", "linear_weight_bytes", "model_logits", "quantized_agreement", "stream_stats"]
