#!/usr/bin/env bash
# The whole GPU check in one call: CUDA tests, the launch-parameter sweep, then the benchmarks.
# usage: scripts/gpu_check.sh OUT_DIR
# Liger-Kernel is measured when importable (install its wheel first; see benchmarks/README.md).
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
python3 -m pytest -m cuda -q -p no:cacheprovider tests 2>&1 | tee "$out/pytest_cuda.log" | tail -5 || status=1
# unmarked grid tests that also run on the GPU when one is present: the backward schedules' tails, the
# paired partial rows (repeated, to catch a race) and bitwise determinism
python3 -m pytest -q -p no:cacheprovider tests/ops -k "paired or tails or deterministic" 2>&1 \
    | tee -a "$out/pytest_cuda.log" | tail -3 || status=1
python3 scripts/probe_norms.py --sweep 2>&1 | grep -v Warning | tee "$out/sweep.log" || status=1
# OUT is this script's own directory: a second run into it replaces the first run's results
python3 benchmarks/bench_norms.py --out "$out" --overwrite 2>&1 | tee "$out/bench_norms.log" | tail -40 || status=1
python3 benchmarks/bench_attention.py --out "$out" --overwrite 2>&1 | tee "$out/bench_attention.log" | tail -40 || status=1
# RoPE: how the tile kernel forms its pairs (decides PAIRS_* in ops/rope.py), then the suite
python3 scripts/probe_rope.py --sections pairs 2>&1 | grep -v Warning | tee "$out/probe_rope_pairs.log" || status=1
python3 benchmarks/bench_rope.py --out "$out" --overwrite 2>&1 | tee "$out/bench_rope.log" | tail -40 || status=1
python3 benchmarks/bench_mlp.py --out "$out" --overwrite 2>&1 | tee "$out/bench_mlp.log" | tail -40 || status=1
python3 benchmarks/bench_cross_entropy.py --out "$out" --overwrite 2>&1 | tee "$out/bench_cross_entropy.log" \
    | tail -40 || status=1
exit $status
