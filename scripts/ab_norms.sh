#!/usr/bin/env bash
# Old tree against this one in one run: the norms' eager fwd+bwd (do_bench and CUDA-graph replay),
# three alternating rounds, then the medians per op, shape and tree.
# usage: scripts/ab_norms.sh OLD_SRC OUT_DIR
#   OLD_SRC: the `src` directory of the old tree, e.g. made with
#            mkdir -p .ab/old && git archive 0b0d643 src | tar -x -C .ab/old   (OLD_SRC=.ab/old/src)
set -uo pipefail
old=${1:?usage: scripts/ab_norms.sh OLD_SRC OUT_DIR}
out=${2:?usage: scripts/ab_norms.sh OLD_SRC OUT_DIR}
mkdir -p "$out"
for round in 1 2 3; do
  PYTHONPATH="$old" python3 scripts/ab_norms.py old >> "$out/ab_norms.jsonl" || exit 1
  PYTHONPATH="$PWD/src" python3 scripts/ab_norms.py new >> "$out/ab_norms.jsonl" || exit 1
done
python3 - "$out/ab_norms.jsonl" <<'PY' | tee "$out/ab_norms.md"
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
keys = sorted({(r["op"], tuple(r["shape"])) for r in rows})
print("| op | shape | do_bench old | do_bench new | graph old | graph new |")
print("| --- | --- | --- | --- | --- | --- |")
for op, shape in keys:
    med = lambda tree, f: statistics.median(r[f] for r in rows if r["op"] == op and tuple(r["shape"]) == shape and r["tree"] == tree)
    print(f"| {op} | {shape[0]}x{shape[1]} | {med('old', 'do_bench_us')} | {med('new', 'do_bench_us')} "
          f"| {med('old', 'graph_us')} | {med('new', 'graph_us')} |")
PY
