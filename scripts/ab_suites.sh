#!/usr/bin/env bash
# An older tree against this one in one run, alternating: benchmark suites (norm, cross_entropy, ...) with
# our provider only, and the e2e training step (ours+compile beside torch.compile), ROUNDS rounds of old then
# new (then new then old, and so on), so a drift of the device's clock falls on both; then the medians per
# row and tree, and new over old.
# usage: scripts/ab_suites.sh OLD_TREE OUT_DIR SUITE...   (SUITE: a `kernel-pytorch bench` suite, or e2e)
#   OLD_TREE: the root of the old tree with its src/ and benchmarks/, e.g.
#             mkdir -p .ab/old && git archive f3445f2 src benchmarks | tar -x -C .ab/old
#   AB_ROUNDS (default 2); AB_FLAGS, AB_E2E_FLAGS: more flags for the suites and for bench_e2e.py (e.g. --quick --device cpu). A suite named differently in the old tree: AB_OLD_NAMES="norm=norms".
# Results: OUT_DIR/ab/<tree>/r<round>/<suite>.json (the suites' own results) and OUT_DIR/ab_suites.md.
set -uo pipefail
old=$(cd "${1:?usage: scripts/ab_suites.sh OLD_TREE OUT_DIR SUITE...}" && pwd)
out=$(mkdir -p "${2:?usage: scripts/ab_suites.sh OLD_TREE OUT_DIR SUITE...}" && cd "$2" && pwd)
shift 2
suites=${*:?name the suites}
new=$PWD
old_name() {
  for pair in ${AB_OLD_NAMES:-norm=norms}; do [ "${pair%%=*}" = "$1" ] && { echo "${pair#*=}"; return; }; done
  echo "$1"
}
run() {  # run TREE_DIR TREE_LABEL ROUND SUITE
  local dir=$1 label=$2 round=$3 suite=$4 dest="$out/ab/$2/r$3"
  mkdir -p "$dest"
  local name=$suite
  [ "$label" = old ] && name=$(old_name "$suite")
  echo "== $label r$round $suite ($(date -u +%H:%M:%S))"
  if [ "$suite" = e2e ]; then
    (cd "$dir" && PYTHONPATH="$dir/src" python3 benchmarks/bench_e2e.py --providers "${AB_E2E_PROVIDERS:-torch.compile,ours+compile}" \
      --no-long --no-inference --budget-s "${AB_E2E_BUDGET_S:-150}" ${AB_E2E_FLAGS:-} --out "$dest/e2e" > "$dest/e2e.log" 2>&1)
    cp "$dest/e2e/e2e.json" "$dest/e2e.json" 2>/dev/null
  else
    (cd "$dir" && PYTHONPATH="$dir/src" python3 -m kernel_pytorch.cli.main bench "$name" --providers ours --no-plots \
      --overwrite ${AB_FLAGS:-} --out "$dest/$suite" > "$dest/$suite.log" 2>&1)
    cp "$dest/$suite/$name.json" "$dest/$suite.json" 2>/dev/null
  fi
  tail -n 2 "$dest/$suite.log" 2>/dev/null || tail -n 2 "$dest/e2e.log"
}
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for suite in $suites; do
    if [ $((round % 2)) = 1 ]; then run "$old" old "$round" "$suite"; run "$new" new "$round" "$suite"
    else run "$new" new "$round" "$suite"; run "$old" old "$round" "$suite"; fi
  done
done
python3 scripts/ab_compare.py "$out/ab" > "$out/ab_suites.md"
cat "$out/ab_suites.md"
