"""The end-to-end benchmark's judgements of a run: the combined target for each `ours` training row, and
the scaling efficiency of rows under torchrun against a one-GPU run."""

from __future__ import annotations

from kernel_pytorch.benchmark.results import BenchmarkResults

# The combined target, one provider: tokens/s >= SPEEDUP x torch.compile's AND peak <= MEMORY x Liger's
TARGET_SPEEDUP, TARGET_MEMORY = 1.2, 0.9
# under FSDP2 (+fsdp2 rows, against torch.compile+fsdp2 and liger+fsdp2 of the same run)
FSDP2_SPEEDUP = 1.15
# the variants that change the work itself: a row with them is judged against the baselines with them
WORKLOAD_VARIANTS = ("packed", "fsdp2", "tp")


def target_check(results: BenchmarkResults, op: str) -> list[str]:
    """One note per measured `ours*` training row of `op`: its tokens/s over torch.compile's and its peak
    over Liger's in this run, and whether both halves of the target hold (a half whose baseline did not
    run is "-", and the target is then not judged). A row with variants that change the work (packed rows,
    FSDP2) is judged against the baselines with the same ones."""
    rows = {r.provider: r for r in results.rows if r.op == op and r.status == "ok" and r.median_ms}
    notes = []
    for name, row in rows.items():
        if not name.startswith("ours"):
            continue
        # labels list variants in one order (providers.VARIANTS: packed before fsdp2), so the suffix is the baselines'
        suffix = "".join(f"+{v}" for v in WORKLOAD_VARIANTS if f"+{v}" in name)
        target_speedup = FSDP2_SPEEDUP if "+fsdp2" in suffix else TARGET_SPEEDUP
        base_t, base_m = rows.get("torch.compile" + suffix), rows.get("liger" + suffix)
        speed = base_t.median_ms / row.median_ms if base_t else None
        memory = row.peak_mem_bytes / base_m.peak_mem_bytes if base_m and base_m.peak_mem_bytes and row.peak_mem_bytes \
            else None
        if speed is None or memory is None:
            verdict = "not judged (a baseline did not run)"
        else:
            verdict = "met" if speed >= target_speedup and memory <= TARGET_MEMORY else "not met"
        notes.append(f"target (>= {target_speedup}x torch.compile{suffix}'s tokens/s and <= {TARGET_MEMORY}x "
                     f"liger{suffix}'s peak): "
                     f"{name} {'-' if speed is None else f'{speed:.3f}x'} and "
                     f"{'-' if memory is None else f'{memory:.3f}x'}: {verdict}")
    return notes


def scaling_notes(results: BenchmarkResults, base: BenchmarkResults, world_size: int) -> list[str]:
    """For each training row measured here and in `base` (the same provider and shape, a world of one GPU):
    its scaling efficiency, this run's per-GPU tokens/s over the one-GPU row's (the per-GPU batch is the
    same, so 100% is linear scaling)."""
    one = {(r.op, r.provider): r for r in base.rows if r.ok and r.median_ms}
    notes = []
    for row in results.rows:
        ref = one.get((row.op, row.provider))
        if not (row.ok and row.median_ms and row.pass_name == "fwd+bwd+adamw" and ref):
            continue
        eff = ref.median_ms / row.median_ms
        row.note += f"; scaling {100 * eff:.1f}% of one GPU's tokens/s per GPU"
        notes.append(f"scaling efficiency, {row.provider} {row.op}: {100 * eff:.1f}% ({world_size} GPUs, per-GPU "
                     f"tokens/s over the one-GPU run of {base.device})")
    return notes
