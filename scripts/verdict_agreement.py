"""The analyser's compile verdict against a careful eager/compiled timing, over a corpus of models.

For each model (forward, eval mode, no_grad): the analyser's kernel-efficiency section alone (where the
verdict lives: `CompilerOptimizationAssistant(AnalysisOptions(train=False), sections=["kernel_efficiency"])`),
and a careful timing of the same model, eager against `torch.compile` (default backend and mode), in turns:
- CUDA: per call, a 256 MB buffer written (the L2 flushed), a synchronise, then CUDA events around the
  call (the host's launch time counts: the GPU starts idle); medians of the calls. Then the same again
  queued (`careful_queued`): the flush and the call enqueued with no synchronise between calls, as do_bench
  and a training loop run them, so the host's launch time overlaps the device's work; the table gives the
  agreement against both.
- CPU: perf_counter per call, medians.
A model is decisive when the careful medians differ by more than 10%; the verdict agrees when it names
the faster side ("compile" or "eager"). "no difference" or "unreliable" on a decisive model is no sign,
counted against the strict agreement rate.

The corpus: the built-in models, Hugging Face families built from small configs at two sizes,
torchvision models (when importable), and the KernelBench-style problems of benchmarks/verdict_corpus/.
On CUDA, worker processes compile the next models (filling Inductor's on-disk caches) while one at a
time, under a lock, is timed and analysed, so one GPU run covers the corpus; each model has a
compile and a measurement budget, and is skipped with the reason past either or past --budget-s.
While one worker measures, the others are stopped (SIGSTOP to their process groups, their compile pools
included; SIGCONT after): most of the corpus is launch-bound, and compiles running beside a measurement
moved its host-side time by up to 2x in both directions between the careful timing and the analyser's
(benchmarks/results/verdict_agreement_h100.json, whose run had no such pause).

usage: python scripts/verdict_agreement.py --out DIR [--device cuda|cpu] [--limit N] [--only a,b]
       python scripts/verdict_agreement.py --direct NAME --device cpu   (one careful timing, JSON on stdout)
Results: DIR/verdict_agreement.json and DIR/verdict_agreement.md, rewritten after every model.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "benchmarks" / "verdict_corpus"
DECISIVE = 0.10  # careful medians further apart than this make a model decisive
QUEUED_SYNC_ROUNDS = 10  # the queued protocol reads its events (and lets the queue drain) this often
CAREFUL_CUDA_S = 0.6  # per protocol on CUDA: two protocols in about the time one took (corpus run of ~8 min)
FLUSH_BYTES = 256 * 2**20

Inputs = Any  # a tuple of positional arguments or a dict of keyword arguments


@dataclass(frozen=True)
class Entry:
    name: str
    source: str  # "problem", "builtin", "hf", "torchvision"
    build: Callable[[], tuple[Any, Inputs]]  # (model on the CPU, inputs on the CPU)


# ----- the corpus -------------------------------------------------------------------------------------

def _problem(path: Path) -> Callable[[], tuple[Any, Inputs]]:
    def build() -> tuple[Any, Inputs]:
        import torch

        spec = importlib.util.spec_from_file_location(f"verdict_corpus_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
        torch.manual_seed(0)
        return mod.Model(*mod.get_init_inputs()), tuple(mod.get_inputs())

    return build


def _builtin(name: str) -> Callable[[], tuple[Any, Inputs]]:
    def build() -> tuple[Any, Inputs]:
        from kernel_pytorch.models import build_model

        model, inputs = build_model(name)
        return model, tuple(inputs)

    return build


def _dec(h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, **extra: Any) -> dict[str, Any]:
    return dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=inter, vocab_size=vocab, **extra)


def _enc(h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, **extra: Any) -> dict[str, Any]:
    return dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=inter,
                vocab_size=vocab, **extra)


def _head_dim(h: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> dict[str, Any]:
    return _dec(h, layers, heads, kv, inter, vocab, head_dim=h // heads)


# (family, config class, model class, config kwargs from (hidden, layers, heads, kv heads, ffn, vocab), input)
HF_FAMILIES: tuple[tuple[str, str, str, Callable[..., dict[str, Any]], str], ...] = (
    ("llama", "LlamaConfig", "LlamaForCausalLM", _dec, "ids"),
    ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", _dec, "ids"),
    ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", _head_dim, "ids"),
    ("mistral", "MistralConfig", "MistralForCausalLM", _dec, "ids"),
    ("gemma", "GemmaConfig", "GemmaForCausalLM", _head_dim, "ids"),
    ("gemma2", "Gemma2Config", "Gemma2ForCausalLM", _head_dim, "ids"),
    ("phi3", "Phi3Config", "Phi3ForCausalLM", lambda *a: _dec(*a, pad_token_id=0), "ids"),
    ("olmo", "OlmoConfig", "OlmoForCausalLM", _dec, "ids"),
    ("stablelm", "StableLmConfig", "StableLmForCausalLM", _dec, "ids"),
    ("phi", "PhiConfig", "PhiForCausalLM", _dec, "ids"),
    ("gpt2", "GPT2Config", "GPT2LMHeadModel",
     lambda h, n, a, kv, i, v: dict(n_embd=h, n_layer=n, n_head=a, n_inner=i, vocab_size=v), "ids"),
    ("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", _enc, "ids"),
    ("opt", "OPTConfig", "OPTForCausalLM", lambda h, n, a, kv, i, v: dict(
        hidden_size=h, num_hidden_layers=n, num_attention_heads=a, ffn_dim=i, vocab_size=v, word_embed_proj_dim=h),
     "ids"),
    ("falcon", "FalconConfig", "FalconForCausalLM",
     lambda h, n, a, kv, i, v: dict(hidden_size=h, num_hidden_layers=n, num_attention_heads=a, vocab_size=v), "ids"),
    ("bloom", "BloomConfig", "BloomForCausalLM",
     lambda h, n, a, kv, i, v: dict(hidden_size=h, n_layer=n, n_head=a, vocab_size=v), "ids"),
    ("gptj", "GPTJConfig", "GPTJForCausalLM", lambda h, n, a, kv, i, v: dict(
        n_embd=h, n_layer=n, n_head=a, n_inner=i, vocab_size=v, rotary_dim=h // a // 2), "ids"),
    ("bert", "BertConfig", "BertModel", _enc, "ids"),
    ("roberta", "RobertaConfig", "RobertaModel", lambda *a: _enc(*a, pad_token_id=1), "ids"),
    ("distilbert", "DistilBertConfig", "DistilBertModel",
     lambda h, n, a, kv, i, v: dict(dim=h, n_layers=n, n_heads=a, hidden_dim=i, vocab_size=v), "ids"),
    ("electra", "ElectraConfig", "ElectraModel", lambda *a: _enc(*a, embedding_size=a[0]), "ids"),
    ("albert", "AlbertConfig", "AlbertModel", lambda *a: _enc(*a, embedding_size=a[0]), "ids"),
    ("vit", "ViTConfig", "ViTModel", lambda h, n, a, kv, i, v: dict(
        hidden_size=h, num_hidden_layers=n, num_attention_heads=a, intermediate_size=i, image_size=64, patch_size=8),
     "image"),
    ("convnext", "ConvNextConfig", "ConvNextModel",
     lambda h, n, a, kv, i, v: dict(hidden_sizes=[h // 4, h // 2, h, h], depths=[1, 1, n, 1]), "image"),
    ("resnet", "ResNetConfig", "ResNetModel", lambda h, n, a, kv, i, v: dict(
        hidden_sizes=[h // 4, h // 2, h, h], depths=[1, 1, n, 1], embedding_size=h // 4), "image"),
)
# (suffix, hidden, layers, heads, kv heads, ffn, vocab, batch, sequence or image side): a launch-bound
# size and one where the kernels take the time
HF_SIZES = (("small", 64, 2, 4, 2, 128, 1024, 2, 32), ("medium", 512, 4, 8, 4, 1408, 8192, 4, 256))


def _hf(family: str, config_cls: str, model_cls: str, kwargs: Callable[..., dict[str, Any]], kind: str,
        size: tuple[Any, ...]) -> Callable[[], tuple[Any, Inputs]]:
    def build() -> tuple[Any, Inputs]:
        import torch
        import transformers

        _, h, layers, heads, kv, inter, vocab, batch, seq = size
        torch.manual_seed(0)
        config = getattr(transformers, config_cls)(**kwargs(h, layers, heads, kv, inter, vocab))
        model = getattr(transformers, model_cls)(config)
        if kind == "ids":
            ids = torch.randint(0, vocab, (batch, seq))
            return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        return model, {"pixel_values": torch.randn(batch, 3, 64, 64)}

    return build


TORCHVISION = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "squeezenet1_1",
               "shufflenet_v2_x1_0", "regnet_y_400mf", "densenet121")


def _torchvision(name: str) -> Callable[[], tuple[Any, Inputs]]:
    def build() -> tuple[Any, Inputs]:
        import torch
        import torchvision

        torch.manual_seed(0)
        return getattr(torchvision.models, name)(weights=None), (torch.randn(8, 3, 224, 224),)

    return build


def corpus() -> list[Entry]:
    """Every model, cheapest kinds first (a --limit takes the first ones)."""
    order = ("pointwise_chain", "tiny_scale", "loop_small_ops", "tiny_linear", "small_mlp_stack")
    rank = {name: i for i, name in enumerate(order)}
    files = sorted(PROBLEMS.glob("*.py"), key=lambda p: (rank.get(p.stem, len(order)), p.stem))
    out = [Entry(p.stem, "problem", _problem(p)) for p in files]
    out += [Entry(n, "builtin", _builtin(n)) for n in ("llama-tiny", "gpt2-tiny", "vit-tiny", "resnet-tiny",
                                                       "gpt2-small", "resnet18", "vit-b16")]
    out += [Entry(f"tv-{n}", "torchvision", _torchvision(n)) for n in TORCHVISION]
    for f in HF_FAMILIES:
        out += [Entry(f"hf-{f[0]}-{size[0]}", "hf", _hf(*f, size)) for size in HF_SIZES]
    return out


# ----- timing ---------------------------------------------------------------------------------------

def _call(fn: Callable[..., Any], inputs: Inputs) -> Any:
    """`fn` called with the inputs: keyword arguments for a dict, else positional ones."""
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


def careful_timing(eager: Callable[[], Any], compiled: Callable[[], Any], device: Any, budget_s: float = 1.0,
                   rounds: tuple[int, int] = (20, 300), queued: bool = False) -> dict[str, float]:
    """Medians (ms) of `eager` and `compiled` timed in turns (the order alternating), after three warm
    calls each: at least rounds[0] rounds, then until budget_s or rounds[1]. See the module docstring.
    `queued` (CUDA): no synchronise per call, the flush and the calls queued as they come (do_bench's way;
    the events are read every QUEUED_SYNC_ROUNDS rounds)."""
    import torch

    cuda = device.type == "cuda"
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device) if cuda else None
    for _ in range(3):
        eager(), compiled()
    if cuda:
        torch.cuda.synchronize(device)
    times: tuple[list[float], list[float]] = ([], [])
    pending: list[tuple[int, Any, Any]] = []
    start = time.perf_counter()
    r = 0
    while r < rounds[0] or (r < rounds[1] and time.perf_counter() - start < budget_s):
        for i, fn in ((0, eager), (1, compiled)) if r % 2 == 0 else ((1, compiled), (0, eager)):
            if cuda:
                flush.zero_()  # type: ignore[union-attr]
                if not queued:
                    torch.cuda.synchronize(device)
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                fn()
                end.record()
                pending.append((i, begin, end))
                if not queued:
                    end.synchronize()
            else:
                t0 = time.perf_counter()
                fn()
                times[i].append((time.perf_counter() - t0) * 1e3)
        r += 1
        if cuda and (not queued or r % QUEUED_SYNC_ROUNDS == 0):
            torch.cuda.synchronize(device)
            for i, begin, end in pending:
                times[i].append(begin.elapsed_time(end))
            pending.clear()
    if pending:
        torch.cuda.synchronize(device)
        for i, begin, end in pending:
            times[i].append(begin.elapsed_time(end))
    e, c = statistics.median(times[0]), statistics.median(times[1])
    return {"eager_ms": e, "compiled_ms": c, "speedup": e / c, "rounds": r}


@contextlib.contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after `seconds`."""
    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took more than {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _prepare(entry: Entry, device: Any) -> tuple[Any, Inputs]:
    from kernel_pytorch._tree import move

    model, inputs = entry.build()
    return model.to(device).eval(), move(inputs, device, None)


def warm_compile(model: Any, inputs: Inputs) -> Callable[[], Any]:
    """The model compiled (default backend and mode) and called once under no_grad: the compiled step."""
    import torch

    compiled = torch.compile(model)
    with torch.no_grad():
        _call(compiled, inputs)
    return compiled


def careful(model: Any, compiled: Any, inputs: Inputs, device: Any, queued: bool = False) -> dict[str, float]:
    """`careful_timing` of the eager and the compiled model under no_grad; on CUDA, where each model is timed
    by both protocols while the other workers wait, CAREFUL_CUDA_S of rounds each (at least 20 rounds)."""
    import torch

    budget = CAREFUL_CUDA_S if device.type == "cuda" else 1.0
    with torch.no_grad():
        return careful_timing(partial(_call, model, inputs), partial(_call, compiled, inputs), device,
                              budget_s=budget, queued=queued)


def verdict(entry: Entry, model: Any, inputs: Inputs) -> dict[str, Any]:
    """The analyser's verdict section on the model: {"verdict": ...} or {"error": why there is none}."""
    import kernel_pytorch as kp

    assistant = kp.CompilerOptimizationAssistant(kp.AnalysisOptions(train=False), sections=["kernel_efficiency"])
    report = assistant.analyze_component(model, inputs, name=entry.name)
    found = [f for f in report.kernel_efficiency if f.id == "verdict.compile"]
    row: dict[str, Any] = {}
    if not found:
        why = [f"{f.title}: {f.evidence}" for f in report.kernel_efficiency if f.id in ("kernel.not-measured",)
               or f.id.startswith("analysis-error")]
        row["error"] = "no verdict: " + ("; ".join(why) or "the kernel section gave none")
        return row
    v = found[0].data
    main = next(p for p in v["passes"] if p["pass"] == v["pass"])
    row["verdict"] = {"verdict": v["verdict"], "speedup": main["speedup"], "low": main["speedup_low"],
                      "high": main["speedup_high"], "eager_ms": main["eager_ms"], "compiled_ms": main["compiled_ms"],
                      "why": main.get("unreliable_why")}
    return row


def _sign(careful: dict[str, Any] | None, verdict: dict[str, Any] | None) -> tuple[bool | None, bool | None]:
    """(decisive: careful medians > DECISIVE apart, agree: the verdict names the faster side); None where
    not measured (agree: also where not decisive)."""
    if careful is None or verdict is None:
        return None, None
    s = careful["speedup"]
    decisive = s > 1 + DECISIVE or s < 1 / (1 + DECISIVE)
    faster = "compile" if s > 1 else "eager"
    return decisive, (verdict["verdict"] == faster) if decisive else None


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """Adds decisive and agree against the careful timing (`_sign`), and the same against its queued
    variant on CUDA (decisive_queued, agree_queued): a call timed from an idle device adds its host's
    launch time whole, where calls queued back to back (a training loop, do_bench) overlap it with the
    device's work, so launch-bound models can come out on either side by protocol."""
    decisive, agree = _sign(row.get("careful"), row.get("verdict"))
    out = {**row, "decisive": decisive, "agree": agree}
    if "careful_queued" in row:
        out["decisive_queued"], out["agree_queued"] = _sign(row["careful_queued"], row.get("verdict"))
    return out


@contextlib.contextmanager
def _quiet(groups: Any) -> Iterator[None]:
    """The other workers' process groups (`groups`: their ids, 0 for none) stopped while this one measures."""
    others = [g for g in (groups or []) if g > 0 and g != os.getpgrp()]
    stopped = []
    try:
        for g in others:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGSTOP)
                stopped.append(g)
        if stopped:
            time.sleep(0.05)  # signals land asynchronously: let them before the clock starts
        yield
    finally:
        for g in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(g, signal.SIGCONT)


def run_one(entry: Entry, device: Any, compile_s: float, measure_s: float, lock: Any = None,
            groups: Any = None) -> dict[str, Any]:
    """One model's row: the warm compile, then (under `lock`, when given, with the process groups in `groups`
    stopped) the careful timing and the verdict."""
    import torch

    row: dict[str, Any] = {"name": entry.name, "source": entry.source}
    t0 = time.perf_counter()
    try:
        with _deadline(compile_s, "building and compiling"):
            model, inputs = _prepare(entry, device)
            compiled = warm_compile(model, inputs)
        with (lock if lock is not None else contextlib.nullcontext(), _quiet(groups),
              _deadline(measure_s, "the measurement")):
            row["careful"] = careful(model, compiled, inputs, device)
            if device.type == "cuda":  # the same calls queued, not each from an idle device: see judge()
                row["careful_queued"] = careful(model, compiled, inputs, device, queued=True)
            del compiled  # the analyser compiles afresh (from the caches the warm compile filled)
            torch._dynamo.reset()
            row.update(verdict(entry, model, inputs))
    except ImportError as exc:
        row["skipped"] = f"not importable: {exc}"
    except Exception as exc:  # one model's failure is a row of the table, not the end of the run
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return judge(row)


# ----- workers and the table --------------------------------------------------------------------------

def _worker(names: Any, results: Any, lock: Any, groups: Any, device: str, compile_s: float,
            measure_s: float) -> None:
    os.setpgrp()  # a process group of its own, which its compile pool joins: stopped as one while another measures
    import torch

    entries = {e.name: e for e in corpus()}
    dev = torch.device(device)
    while True:
        name = names.get()
        if name is None:
            return
        results.put(run_one(entries[name], dev, compile_s, measure_s, lock, groups))


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    decisive = [r for r in rows if r.get("decisive")]
    agree = [r for r in decisive if r["agree"]]
    signed = [r for r in decisive if r["verdict"]["verdict"] in ("compile", "eager")]
    out = {"models": len(rows), "measured": sum(1 for r in rows if r.get("verdict")), "decisive": len(decisive),
           "agree": len(agree), "agreement": len(agree) / len(decisive) if decisive else None,
           "signed_verdicts": len(signed),
           "agreement_of_signed": sum(1 for r in signed if r["agree"]) / len(signed) if signed else None}
    queued = [r for r in rows if r.get("decisive_queued")]
    if queued:
        hits = sum(1 for r in queued if r["agree_queued"])
        out["queued"] = {"decisive": len(queued), "agree": hits, "agreement": hits / len(queued)}
    return out


def write(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    s = summary(rows)
    (out / "verdict_agreement.json").write_text(json.dumps({"meta": meta, "summary": s, "rows": rows}, indent=1))
    pct = lambda x: "-" if x is None else f"{100 * x:.0f}%"  # noqa: E731
    lines = [
        f"# Compile verdict against a careful timing ({meta['device_name']}, {meta['date']}, {meta['commit']})",
        "",
        f"torch {meta['torch']}. Careful timing: {meta['method']}. Decisive: careful medians more than "
        f"{100 * DECISIVE:.0f}% apart. Agreement: the verdict names the faster side.",
        "",
        f"**{s['agree']} of {s['decisive']} decisive models agree ({pct(s['agreement'])})**; of the decisive "
        f"models with a compile/eager verdict, {pct(s['agreement_of_signed'])}. {s['measured']} of "
        f"{s['models']} models measured.",
    ]
    if "queued" in s:
        q = s["queued"]
        lines += ["", f"Against the same calls queued back to back (no synchronise per call, do_bench's way): "
                      f"**{q['agree']} of {q['decisive']} decisive models agree ({pct(q['agreement'])})**."]
    lines += [
        "",
        "| model | source | careful eager ms | careful compiled ms | careful speedup | queued speedup | verdict "
        "| verdict speedup (band) | agrees | agrees (queued) | s | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, v = r.get("careful"), r.get("verdict")
        cells = [r["name"], r["source"]]
        cq = r.get("careful_queued")
        cells += [f"{c['eager_ms']:.4g}", f"{c['compiled_ms']:.4g}", f"{c['speedup']:.2f}x"] if c else ["-"] * 3
        cells.append(f"{cq['speedup']:.2f}x" if cq else "-")
        cells += [v["verdict"], f"{v['speedup']:.2f}x ({v['low']:.2f}-{v['high']:.2f})"] if v else ["-", "-"]
        for key in ("agree", "agree_queued"):
            cells.append("-" if r.get(key) is None else ("yes" if r[key] else "**no**"))
        cells.append(str(r.get("seconds", "-")))
        note = r.get("skipped") or r.get("error") or (v or {}).get("why") or ""
        cells.append(note.replace("|", "/")[:160])
        lines.append("| " + " | ".join(cells) + " |")
    (out / "verdict_agreement.md").write_text("\n".join(lines) + "\n")


def _meta(device: Any, method: str) -> dict[str, Any]:
    import subprocess

    import torch

    from kernel_pytorch.benchmark.ceilings import device_name

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"device": str(device), "device_name": device_name(device), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "commit": commit.stdout.strip() or "unknown", "method": method,
            "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--limit", type=int, default=None, help="only the first N models of the corpus")
    p.add_argument("--only", default=None, help="comma-separated model names")
    p.add_argument("--budget-s", type=float, default=520.0,
                   help="the whole run; models not finished by then are skipped")
    p.add_argument("--compile-s", type=float, default=150.0, help="per model: building and the warm compile")
    p.add_argument("--measure-s", type=float, default=60.0, help="per model: the careful timing and the analyser")
    p.add_argument("--workers", type=int, default=None, help="compiling processes (default: 4 on CUDA, 0 on the CPU: "
                   "everything in this process)")
    p.add_argument("--direct", default=None, help="print one model's careful timing as JSON and exit")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    entries = corpus()
    if args.direct:
        entry = next(e for e in entries if e.name == args.direct)
        model, inputs = _prepare(entry, device)
        compiled = warm_compile(model, inputs)
        print(json.dumps(careful(model, compiled, inputs, device)))
        return 0
    if args.out is None:
        p.error("--out is required")
    if args.only:
        wanted = args.only.split(",")
        entries = [e for e in entries if e.name in wanted]
    entries = entries[: args.limit] if args.limit else entries
    args.out.mkdir(parents=True, exist_ok=True)
    method = ("CUDA events per call after a 256 MB L2 flush and a synchronise, eager and compiled in turns, medians, "
              "the other workers stopped"
              if device.type == "cuda" else "perf_counter per call, eager and compiled in turns, medians")
    meta = _meta(device, method)
    end = time.perf_counter() + args.budget_s
    rows: dict[str, dict[str, Any]] = {}
    workers = args.workers if args.workers is not None else (4 if device.type == "cuda" else 0)

    def done(row: dict[str, Any]) -> None:
        rows[row["name"]] = row
        write(args.out, [rows[e.name] for e in entries if e.name in rows], meta)
        print(f"{row['name']}: {row.get('verdict', {}).get('verdict', '-')} careful "
              f"{row.get('careful', {}).get('speedup', float('nan')):.2f}x agree={row.get('agree')} "
              f"{row.get('skipped') or row.get('error') or ''} ({row['seconds']} s)", flush=True)

    if workers == 0:
        for e in entries:
            left = end - time.perf_counter()
            if left < 5:
                done({"name": e.name, "source": e.source, "skipped": "budget spent", "seconds": 0.0})
                continue
            done(run_one(e, device, min(args.compile_s, left), min(args.measure_s, left)))
    else:
        _run_workers(entries, device, workers, args, end, done)
    s = summary([rows[e.name] for e in entries])
    print(json.dumps(s))
    return 0


def _run_workers(entries: list[Entry], device: Any, n: int, args: Any, end: float,
                 done: Callable[[dict[str, Any]], None]) -> None:
    """Run the entries in `n` spawned workers; at `end` the workers are stopped and what is left is
    skipped. Inductor's compile pool is kept small per worker, so the compiles leave the measuring
    process cores of its own."""
    import multiprocessing as mp

    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "2")
    ctx = mp.get_context("spawn")
    names, results, lock = ctx.Queue(), ctx.Queue(), ctx.Lock()
    groups = ctx.Array("i", n)  # each worker's process group (its pid, once it has started)
    for e in entries:
        names.put(e.name)
    for _ in range(n):
        names.put(None)
    procs = [ctx.Process(target=_worker, args=(names, results, lock, groups, str(device), args.compile_s,
                                               args.measure_s), daemon=True) for _ in range(n)]
    for i, proc in enumerate(procs):
        proc.start()
        groups[i] = proc.pid
    pending = {e.name for e in entries}
    import queue

    while pending and time.perf_counter() < end:
        try:
            row = results.get(timeout=1.0)
        except queue.Empty:
            if not any(proc.is_alive() for proc in procs):
                break
            continue
        pending.discard(row["name"])
        done(row)
    for proc in procs:
        if proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped worker acts on SIGTERM only once continued
            proc.terminate()
    for e in entries:
        if e.name in pending:
            done({"name": e.name, "source": e.source, "seconds": 0.0,
                  "skipped": "budget spent (or its worker died)"})


if __name__ == "__main__":
    sys.exit(main())
