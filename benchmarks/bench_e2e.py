"""End-to-end training step of an HF decoder (Llama; `--family qwen3` or `gemma3`): eager, torch.compile,
Liger, Liger + compile, ours (`kernel_pytorch.optimize`), ours + compile and the built-in Llama; plus a
16k-context row and generate rows (prefill + 256 greedy decode tokens). docs/benchmarks.md says more.

    python benchmarks/bench_e2e.py                                  # H100: the benchmark's config, ~4 min
    python benchmarks/bench_e2e.py --out benchmarks/results         # replace the committed results
    python benchmarks/bench_e2e.py --quick --device cpu             # tiny config: checks the pipeline
    python benchmarks/bench_e2e.py --profile eager,ours+compile     # + where the step's time goes
    python benchmarks/bench_e2e.py --family gemma3 --no-long --no-inference   # Gemma 3's layout, same widths
    python benchmarks/bench_e2e.py --seq 4096 --providers torch.compile+packed,ours+compile+packed  # packed rows
    python benchmarks/bench_e2e.py --batch 1 --seq 16384 --providers torch.compile,ours+compile --no-long
    python benchmarks/bench_e2e.py --providers ours+compile+adamw,torch.compile+adamw  # our AdamW's kernel
    python benchmarks/bench_e2e.py --providers= --no-long --generate-providers "ours + static cache + compile+reference"
    python benchmarks/bench_e2e.py --help                           # every base provider and variant, one line each
    torchrun --nproc-per-node 4 benchmarks/bench_e2e.py --providers torch.compile+fsdp2,ours+compile+fsdp2 \
        --no-long --no-inference --scaling-base RESULTS_OF_ONE_GPU/e2e.json  # FSDP2 over 4 GPUs (per-GPU rows)

A provider is a base and named variants, `BASE[+VARIANT...]` (benchmarks/e2e/providers.py: each variant
sets a field of a frozen `Variant`, mapped onto the optimizer, the model's call, the batch, the optimized
modules' backends and the kernel configs of `kernel_pytorch.ops.tuning`); the written form is the row's label.

The step is forward + backward + fused AdamW on (batch x seq) tokens, labels = input_ids (torch's
`AdamW(fused=True)`; `+adamw`: `kernel_pytorch.optim.AdamW`; `+packed`: packed rows of documents,
e2e/batches.py). Each provider gets a fresh model from the same seed, `--warmup` untimed steps (the first
one's time is the warm-up / compile time), then `--steps` timed steps (CUDA: synchronised wall time per
step; the median is reported). Tokens/s = batch * seq / median step time; MFU = model FLOPs per step
(e2e/families.py: 6 x matmul parameters x tokens + the attention pairs scored, within sliding windows and
documents) / step time / the bf16 matmul ceiling measured in the same run. Peak memory is the CUDA
allocator's peak over the timed steps (weights, gradients and optimizer state included); on CPU, the
profiler's allocation trace of one step.

Each provider runs in its own try/except, so one failure (or an out-of-memory) becomes a row with the
reason and the others still run; a provider that does not parse stops the run before any row starts. The
whole run stops starting new providers once `--budget-s` of wall time is spent (default 240 s on CUDA)
and says which rows it skipped; the rows run in the order the target reads them (the training providers,
then the 16k row, then generation). Liger patches transformers' classes for the whole process, so each
Liger row runs in a child process of its own.

Under torchrun (e2e/distributed.py) every training provider takes `+fsdp2` or `+tp`: each rank runs each row
on its GPU, with the same per-GPU batch under FSDP2 (tokens/s and MFU per GPU) and the group's one batch
under tensor parallelism (tokens/s the group's, MFU per GPU), peak memory the largest rank's, rank 0
writes; Liger's rows run last in the process, the 16k-context and generate rows are left out.
`--scaling-base` (the same providers' results on one GPU) gives each row its scaling efficiency.
`--size llama3-8b` is a Llama-3-8B-shaped model, which fits only sharded over several GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the e2e helpers

from e2e import distributed  # noqa: E402
from e2e.batches import doc_lengths, training_batch  # noqa: E402
from e2e.child import failure_name, in_child  # noqa: E402
from e2e.families import FAMILIES, Size, size_of  # noqa: E402
from e2e.generate import inference_row  # noqa: E402
from e2e.models import build, free, loss_of, sync  # noqa: E402
from e2e.profiling import host_phases, profile_steps  # noqa: E402
from e2e.providers import (  # noqa: E402
    DEFAULT_PROVIDERS,
    GENERATE_PROVIDERS,
    Provider,
    describe,
    parse,
    parse_list,
)
from e2e.targets import scaling_notes, target_check  # noqa: E402

from kernel_pytorch.benchmark.ceilings import device_name, measure_ceilings, percent_of, tflops  # noqa: E402
from kernel_pytorch.benchmark.memory import peak_memory  # noqa: E402
from kernel_pytorch.benchmark.memory_peak import record_peak  # noqa: E402
from kernel_pytorch.benchmark.results import PARTIAL_NOTE, BenchmarkResults, Row  # noqa: E402
from kernel_pytorch.benchmark.timer import resolve_device, summarize  # noqa: E402


def train_row(provider: Provider, size: Size, dev: torch.device, dtype: torch.dtype, batch: int, seq: int,
              steps: int, warmup: int, matmul_tflops: float | None, profile_to: Path | None = None) -> Row:
    """`_train_row` with the provider's kernel configs in force (`Variant.tuning`)."""
    with provider.variant.tuning():
        return _train_row(provider, size, dev, dtype, batch, seq, steps, warmup, matmul_tflops, profile_to)


def _rates(row: Row, size: Size, batch: int, seq: int, matmul_tflops: float | None, packed: bool = False) -> str:
    """Fill the timed row's FLOPs (a packed row's attention over its documents), TFLOP/s and % of the matmul
    ceiling; return its tokens/s for the note."""
    row.flops = size.step_flops(batch, seq, doc_lengths(batch, seq) if packed else None)
    row.tflops = tflops(row.flops, row.median_ms)
    if matmul_tflops:
        row.pct_of_matmul = percent_of(row.tflops, matmul_tflops)
    return f"{batch * seq / row.median_ms:.1f}k tok/s"


def mfu_note(row: Row) -> str:
    """"MFU x%" from the row's % of the matmul ceiling ("MFU -" where the ceiling was not measured)."""
    return f"MFU {row.pct_of_matmul:.1f}%" if row.pct_of_matmul is not None else "MFU -"


def training_step(provider: Provider, size: Size, dev: torch.device, dtype: torch.dtype, batch: int,
                  seq: int) -> tuple[Callable[[], torch.Tensor], Callable[[], None], Callable[[], torch.Tensor]]:
    """The provider's model and optimizer, built, as (forward, update, step) closures over one fixed batch
    (e2e/batches.py: token ids, or packed rows for `+packed`): forward returns the loss, update steps the
    optimizer and drops the gradients, step does all three."""
    model = build(provider, size, dev, dtype)
    opt = provider.variant.make_optimizer(model, dev)
    inputs = training_batch(size.vocab, batch, seq, dev, provider.variant.packed)

    graphs = provider.base.endswith("-cg")
    options = provider.variant.call_kwargs()

    def forward() -> torch.Tensor:
        if graphs:  # a new training step: the graphs' previous outputs (the gradients) are consumed
            torch.compiler.cudagraph_mark_step_begin()
        return loss_of(model, inputs, **options)

    def update() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    def step() -> torch.Tensor:
        loss = forward()
        loss.backward()
        update()
        return loss.detach()

    return forward, update, step


def _train_row(provider: Provider, size: Size, dev: torch.device, dtype: torch.dtype, batch: int, seq: int,
               steps: int, warmup: int, matmul_tflops: float | None, profile_to: Path | None = None) -> Row:
    """One provider's training step: timings, memory, tokens/s, warm-up and MFU (in the row's note); with
    `profile_to`, a profiler table of two more steps written there."""
    row = Row(op=f"train step {batch}x{seq}", shape=[batch, seq], config=size.label, dtype=str(dtype).split(".")[-1],
              provider=provider.label, pass_name="fwd+bwd+adamw")
    forward, update, step = training_step(provider, size, dev, dtype, batch, seq)
    graphs = provider.base.endswith("-cg")

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync(dev)
    warm_s = time.perf_counter() - t0
    if dev.type == "cuda":
        # what warm-up cached (compile-time buffers) is released and one more step fills the cache as a
        # step does, so the reserved peak below is the steady state's
        torch.cuda.empty_cache()
        step()
        sync(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    samples = []
    began = time.strftime("%H:%M:%S")
    for _ in range(steps):
        t = time.perf_counter()
        step()
        sync(dev)
        samples.append((time.perf_counter() - t) * 1e3)
    # the timed window in wall-clock time, to line up with a clock/power log of the device (gpu_check's smi.csv)
    if distributed.main_process():
        print(f"timed {provider} {batch}x{seq}: {began} - {time.strftime('%H:%M:%S')}, steps (ms): "
              + " ".join(f"{x:.2f}" for x in samples), flush=True)
    timing = summarize(samples, "wall clock per step, synchronised")
    reserved = ""  # the CUDA allocator's reserved peak beside the allocated one, where it is measured
    row.set_timing(timing)
    if dev.type == "cuda":
        if graphs:  # the graphs' private memory pools do not count as allocated: report what is reserved
            row.peak_mem_bytes = torch.cuda.max_memory_reserved(dev)
            row.peak_mem_method = "cuda allocator reserved peak (CUDA-graph pools included; an upper bound)"
        else:
            row.peak_mem_bytes, row.peak_mem_method = torch.cuda.max_memory_allocated(dev), "cuda allocator peak"
            reserved = f"; reserved {torch.cuda.max_memory_reserved(dev) / 2**20:.0f} MiB"
    else:
        m = peak_memory(step, dev)
        row.peak_mem_bytes, row.peak_mem_method = m.peak_bytes, m.method
    if provider.variant.shard != "none":  # the largest rank's peak (each rank holds its shards)
        peak = distributed.largest(row.peak_mem_bytes, dev)
        row.peak_mem_bytes = None if peak is None else int(peak)
        row.peak_mem_method += "; the largest of the ranks'"
    tok_s = _rates(row, size, batch, seq, matmul_tflops, provider.variant.packed)
    if provider.variant.shard == "tp":  # every rank of the group on the one batch: a GPU does 1/N of the FLOPs
        ranks = distributed.world_size()
        row.tflops = None if row.tflops is None else row.tflops / ranks
        row.pct_of_matmul = None if row.pct_of_matmul is None else row.pct_of_matmul / ranks
        tok_s += f" for the tensor-parallel group of {ranks}"
    docs = f"; {sum(map(len, doc_lengths(batch, seq)))} documents" if provider.variant.packed else ""
    row.note = f"{tok_s}{docs}; warm-up {warm_s:.1f} s ({warmup} steps); {mfu_note(row)}{reserved}"
    if profile_to is not None:
        profile_steps(step, dev, profile_to)
        if dev.type == "cuda":  # the host's side of the step (is the device waiting on Python?), and what is
            # live at the step's peak, by the line that allocated it
            with profile_to.open("a") as f:
                f.write(host_phases(forward, update, step, dev))
            peak = record_peak(step, dev)
            profile_to.with_name(profile_to.name.replace("_profile_", "_memory_")).write_text(
                f"one training step of {provider} ({batch}x{seq}), CUDA allocator trace\n" + peak.table(40) + "\n")
    return row


def paired_rows(pair: tuple[Provider, Provider], size: Size, dev: torch.device, dtype: torch.dtype, rounds: int,
                per_round: int, warmup: int, matmul_tflops: float | None) -> tuple[list[Row], str]:
    """Two providers built in one process and stepped in turns (`benchmark.paired.time_interleaved`: rounds of
    `per_round` steps each, the order reversed every other round), so a drift of the device's clock falls on
    both: a row each (no peak: both models are alive) and a note with the second's tokens/s over the first's,
    pooled and per round."""
    from kernel_pytorch.benchmark.paired import round_ratios, time_interleaved

    for p in pair:
        if p.base.startswith("liger") or p.base.endswith("-cg"):
            raise ValueError(f"{p} cannot be paired (Liger patches transformers for the whole process; CUDA-graph "
                             "providers own their outputs between steps)")
    batch, seq = size.batch, size.seq
    steps = {}
    for p in pair:
        step = training_step(p, size, dev, dtype, batch, seq)[2]

        def with_configs(step: Callable[[], torch.Tensor] = step, p: Provider = p) -> None:
            with p.variant.tuning():  # this provider's kernel configs for its steps only
                step()

        for _ in range(warmup):
            with_configs()
        steps[p.label] = with_configs
    labels = tuple(p.label for p in pair)
    timings, medians = time_interleaved(steps, rounds=rounds, per_round=per_round, sync=lambda: sync(dev))
    rows = []
    packed = {p.label: p.variant.packed for p in pair}
    for p, timing in timings.items():
        row = Row(op=f"paired train step {batch}x{seq}", shape=[batch, seq], config=size.label,
                  dtype=str(dtype).split(".")[-1], provider=p, pass_name="fwd+bwd+adamw")
        row.set_timing(timing)
        other = labels[1] if p == labels[0] else labels[0]
        tok_s = _rates(row, size, batch, seq, matmul_tflops, packed[p])
        row.note = (f"{tok_s}; {mfu_note(row)}; in turns with {other}, {rounds} rounds of {per_round} steps; "
                    "peak: see the train step rows")
        rows.append(row)
    ratios = round_ratios(medians, *labels)
    pooled = timings[labels[0]].median_ms / timings[labels[1]].median_ms
    note = (f"paired ({labels[0]} and {labels[1]} in one process, in turns): {labels[1]} {pooled:.3f}x {labels[0]}'s "
            f"tokens/s over all steps; per round {min(ratios):.3f}-{max(ratios):.3f}x (median "
            f"{statistics.median(ratios):.3f}x, {rounds} rounds)")
    return rows, note


def _failed(row_args: dict, exc: BaseException) -> Row:
    oom = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
    status = "out of memory" if oom else "error"
    name = failure_name(exc)
    return Row(**row_args, status=status, note=f"{name}: {str(exc).splitlines()[0][:200]}" if str(exc) else name)


def run(size: Size, dev: torch.device, dtype: torch.dtype, providers: tuple[Provider, ...], steps: int,
        warmup: int, budget_s: float, long_row: bool, inference: bool, smoke: bool,
        profile: tuple[Provider, ...] = (), out: Path | None = None,
        generate: tuple[Provider, ...] = tuple(parse(p, "generate") for p in GENERATE_PROVIDERS),
        paired: tuple[Provider, ...] = (), paired_rounds: tuple[int, int] = (10, 4),
        world: distributed.World = distributed.ONE) -> BenchmarkResults:
    """Every row in one run, each in its own try/except, within the time budget; `profile`: the training
    providers profiled; `paired`: two training providers stepped in turns in one process (`paired_rows`:
    `paired_rounds` = rounds, steps per round); `world`: the torchrun world this rank belongs to (every
    rank runs every row; rank 0 prints and writes)."""
    start = time.perf_counter()
    # a child process cannot join torchrun's process group: under it every row runs here, Liger's last
    isolate = not world.launched
    if world.launched:
        providers = tuple(sorted(providers, key=lambda p: p.base.startswith("liger")))
    results = BenchmarkResults(name="e2e", device=device_name(dev), smoke=smoke)
    ceilings = measure_ceilings(dev)
    results.ceilings = ceilings
    matmul = ceilings.matmul_tflops
    try:
        import liger_kernel  # noqa: F401
        has_liger = True
    except ImportError:
        has_liger = False
    jobs: list[tuple[dict, Callable[[], Row]]] = []
    label, dt = size.label, str(dtype).split(".")[-1]
    for p in providers:
        args = dict(op=f"train step {size.batch}x{size.seq}", shape=[size.batch, size.seq], config=label, dtype=dt,
                    provider=p.label, pass_name="fwd+bwd+adamw")
        if p.base.startswith("liger") and not has_liger:
            results.add(Row(**args, status="not installed", note="liger_kernel is not importable"))
            continue
        if p.base == "builtin" and size.family != "llama":
            results.add(Row(**args, status="not applicable", note="builtin is the built-in Llama"))
            continue
        name = p.label.replace("+", "_").replace(".", "_")
        where = out / f"e2e_profile_{name}.txt" if p in profile and out else None
        row_args = (p, size, dev, dtype, size.batch, size.seq, steps, warmup, matmul, where)
        if isolate and (p.base.startswith("liger") or (p.base.startswith("ours+compile") and dev.type == "cuda")):
            jobs.append((args, lambda row_args=row_args: in_child(train_row, row_args)))
        else:
            jobs.append((args, lambda row_args=row_args: train_row(*row_args)))
    if paired:
        args = dict(op=f"paired train step {size.batch}x{size.seq}", shape=[size.batch, size.seq], config=label,
                    dtype=dt, provider=" + ".join(p.label for p in paired), pass_name="fwd+bwd+adamw")
        pair_args = (paired, size, dev, dtype, paired_rounds[0], paired_rounds[1], warmup, matmul)
        jobs.append((args, lambda: in_child(paired_rows, pair_args) if isolate and dev.type == "cuda"
                     else paired_rows(*pair_args)))
    if world.launched and (long_row or inference):
        results.notes.append("the 16k-context and generate rows are one GPU's: left out under torchrun")
        long_row = inference = False
    if long_row:
        for p in (parse("eager"), parse("ours+compile")):
            args = dict(op=f"train step 1x{size.long_seq}", shape=[1, size.long_seq], config=label, dtype=dt,
                        provider=p.label, pass_name="fwd+bwd+adamw")
            jobs.append((args, lambda p=p: train_row(p, size, dev, dtype, 1, size.long_seq, max(2, steps // 4),
                                                     warmup, matmul)))
    if inference:
        for p in generate:
            args = dict(op=f"generate {size.prompt}+{size.decode}", shape=[1, size.prompt + size.decode], config=label,
                        dtype=dt, provider=p.label, pass_name="prefill+decode")
            jobs.append((args, lambda p=p: inference_row(p, size, dev, dtype)))
    skipped = []
    for args, job in jobs:
        # every rank takes the same decision (the slowest rank's clock), or the ranks' collectives would part
        if distributed.largest(time.perf_counter() - start, dev) > budget_s:
            skipped.append(f"{args['op']} / {args['provider']}")
            results.add(Row(**args, status="skipped", note=f"the {budget_s:.0f} s time budget was spent"))
            continue
        try:
            got = job()
        except KeyboardInterrupt:  # stopped at a time limit: keep the rows already measured
            results.notes.append(f"{PARTIAL_NOTE} during {args['op']} / {args['provider']}")
            break
        except Exception as exc:  # noqa: BLE001 (one provider's failure must not lose the others)
            got = _failed(args, exc)
        if isinstance(got, tuple):  # the paired rows and their note
            got, note = got
            results.notes.append(note)
        for row in got if isinstance(got, list) else [got]:
            results.add(row)
            if world.main:
                print(f"{row.op:>24} {row.provider:>26}: {row.status} {row.median_ms or 0:.4g} ms {row.note}",
                      flush=True)
        if out is not None and world.main:  # written after every row, so a run killed later still leaves these
            results.write(out)
        free(dev)
        distributed.barrier()
    results.notes.append(f"{steps} timed steps after {warmup} warm-up steps per training row; wall time "
                         f"{time.perf_counter() - start:.0f} s of a {budget_s:.0f} s budget")
    if skipped:
        results.notes.append(f"skipped for the time budget: {', '.join(skipped)}")
    results.notes.append("MFU: model FLOPs (6 x matmul params x tokens + causal attention, within sliding windows "
                         "and packed documents) per step / step time / the matmul ceiling above; tokens/s, warm-up "
                         "and MFU are in each row's status note")
    if any(p.variant.shard == "tp" for p in providers):
        results.notes.append(f"+tp rows: tensor and sequence parallelism over a world of {world.size} process(es), "
                             "one batch for the group; tokens/s the group's, MFU per GPU, peak the largest rank's")
    if any(p.variant.shard == "fsdp2" for p in providers):
        results.notes.append(f"+fsdp2 rows: FSDP2 over a world of {world.size} process(es)"
                             f"{' (torchrun, one GPU each)' if world.launched else ''}, {size.batch} x {size.seq} "
                             "tokens per GPU; tokens/s and MFU per GPU, peak memory the largest rank's")
    results.notes.extend(target_check(results, f"train step {size.batch}x{size.seq}"))
    return results


def generate_rows(args: argparse.Namespace) -> tuple[Provider, ...]:
    """The generate() rows the flags ask for (`providers.parse`: an unknown base or variant is a ValueError
    naming the known ones)."""
    if args.generate_providers is None:
        names = GENERATE_PROVIDERS[1:] if args.static_generate_only else GENERATE_PROVIDERS
        return tuple(parse(p, "generate") for p in names)
    return parse_list(args.generate_providers, "generate")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=describe(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny config, 2 steps: checks the pipeline")
    parser.add_argument("--family", choices=tuple(FAMILIES), default="llama",
                        help="the decoder family (e2e/families.py): 8 layers of hidden 2048 each")
    parser.add_argument("--size", choices=("e2e", "llama3-8b"), default="e2e",
                        help="the model: the benchmark's 8-layer Llama (default) or a Llama-3-8B shape (with +fsdp2 "
                        "over several GPUs: it does not fit one)")
    parser.add_argument("--batch", type=int, default=None, help="rows per training step (default 4)")
    parser.add_argument("--seq", type=int, default=None, help="tokens per row (default 2048)")
    parser.add_argument("--scaling-base", default=None, help="e2e.json of the same providers on one GPU: each "
                        "row's scaling efficiency (per-GPU tokens/s over that run's)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--out", default=None, help="results directory (default bench-results/e2e-<time>)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per training row (default 8; quick 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 3; quick 1)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop starting rows after this many seconds")
    parser.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS), help="comma-separated training providers, "
                        "each BASE[+VARIANT...] (below)")
    parser.add_argument("--no-long", action="store_true", help="skip the 16k-context row")
    parser.add_argument("--no-inference", action="store_true", help="skip the generate() rows")
    parser.add_argument("--static-generate-only", action="store_true",
                        help="of the generate() rows, only the two with the static cache (ours, HF's)")
    parser.add_argument("--generate-providers", default=None,
                        help="comma-separated generate() rows instead, each BASE[+VARIANT...] of the generate "
                        "bases (below), e.g. 'ours + static cache + compile+reference'")
    parser.add_argument("--paired", default=None, help="two training providers, comma-separated, stepped in turns "
                        "in one process after the other rows (a drift in the device's clock falls on both alike)")
    parser.add_argument("--paired-rounds", default="10x4", help="ROUNDSxSTEPS for --paired (default 10x4)")
    parser.add_argument("--profile", default="", help="comma-separated training providers to profile (two more "
                        "steps each, e2e_profile_<provider>.txt beside the results; on CUDA one more, what is "
                        "live at its memory peak by allocating line, e2e_memory_<provider>.txt)")
    args = parser.parse_args(argv)
    # every provider parses before anything runs: a misspelt one costs no device time
    try:
        providers, profile = parse_list(args.providers), parse_list(args.profile)
        paired = parse_list(args.paired or "")
        generate = generate_rows(args)
    except ValueError as exc:
        parser.error(str(exc))
    if paired and len(paired) != 2:
        parser.error(f"--paired takes two providers, got {len(paired)}: {args.paired!r}")
    if distributed.launched():
        unsharded = [p.label for p in (*providers, *paired) if p.variant.shard == "none"]
        if unsharded:
            parser.error(f"under torchrun every training provider takes +fsdp2 or +tp; not: {', '.join(unsharded)}")
    try:
        size = size_of(args.family, quick=args.quick, shape=args.size, batch=args.batch, seq=args.seq)
    except ValueError as exc:
        parser.error(str(exc))
    scaling_base = BenchmarkResults.load(Path(args.scaling_base)) if args.scaling_base else None
    rounds, per_round = (int(v) for v in args.paired_rounds.split("x"))
    world, dev = distributed.init(resolve_device(args.device))
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    steps = args.steps or (2 if args.quick else 8)
    warmup = args.warmup or (1 if args.quick else 3)
    budget = args.budget_s if args.budget_s is not None else (240.0 if dev.type == "cuda" else 600.0)
    out = Path(args.out) if args.out else Path("bench-results") / f"e2e-{time.strftime('%Y%m%d-%H%M%S')}"
    results = run(size, dev, dtype, providers, steps, warmup, budget, not args.no_long, not args.no_inference,
                  smoke=args.quick, profile=profile, out=out,
                  generate=generate, paired=paired, paired_rounds=(rounds, per_round), world=world)
    if scaling_base is not None:
        results.notes.extend(scaling_notes(results, scaling_base, world.size))
    if world.main:
        js, md = results.write(out)
        print(f"wrote {js} and {md}")
    distributed.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
