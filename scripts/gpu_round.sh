#!/usr/bin/env bash
# One batched GPU round: the GPU test grid, then the family probes, each under its own time limit.
# usage: scripts/gpu_round.sh OUT_DIR   (Liger wheel in .whl/ is installed first when present)
set -uo pipefail
out=${1:?usage: scripts/gpu_round.sh OUT_DIR}
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$out/device.txt"
t() { local lim=$1 name=$2; shift 2; echo "== $name"; timeout -s INT "$lim" "$@" > "$out/$name.log" 2>&1; echo "rc=$?" >> "$out/$name.log"; tail -4 "$out/$name.log"; }
t 200 tests_gpu python3 -m pytest -q -p no:cacheprovider --maxfail=30 tests/ops tests/functional tests/nn -m "cuda or not cuda"
t 130 probe_mlp python3 scripts/probe_mlp.py --main --sweep --block
t 90 probe_rope python3 scripts/probe_rope.py --quick
t 150 probe_ce python3 scripts/probe_cross_entropy.py --quick
(cd "$out" && tar czf round.tgz *.log device.txt && rm -f *.log)
