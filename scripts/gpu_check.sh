#!/usr/bin/env bash
# The GPU check, in steps that each fit one run of at most ~10 minutes, everything packed into one file at the end.
# usage: scripts/gpu_check.sh OUT_DIR [STEP ...]        (no STEP: every step, in the order below)
#   steps: tests tests_subset compile_check grid sweep norm attention rope_pairs rope mlp cross_entropy e2e decode deploy corpus analyze ab_norms ab
#   suite (a run of its own, 540 s): the test suite, unmarked and cuda tests, on the GPU with
#   KP_SUITE_WORKERS (default 6) pytest-xdist workers, over KP_SUITE_PATHS (default: tests); its full log is
#   pytest_suite.log. Measured on the H100 (2026-12-07, benchmarks/results/probes/tests/): 8 workers finished 41% of the whole suite in 560 s
#   and tests/{ops,functional,nn,reference,optim} in 536 s, so the whole suite takes three runs, e.g.
#   KP_SUITE_PATHS="tests/ops tests/functional tests/nn tests/reference tests/optim", then the rest.
#   verdict (opt-in, one run of its own, ~9 min): scripts/verdict_agreement.py, the compile verdict's agreement table
#   opt-in: loss_curve; prefill (bench_prefill: batch 1 x 4096 tokens against its GEMM floor, ~4 min); rewrite (optimize(rewrite=True): tests, then probe_rewrite); quant (our quantized matmuls: tests, then bench_quant_matmul); fsdp fsdp_8b (the e2e step
#   under FSDP2, torchrun over every GPU); e2e_families e2e_packed e2e_long (the e2e step on Qwen3 and Gemma 3,
#   on packed rows, at long context; each ~9 min, one run of its own);
#   probes: mlp_sweep ce_sweep onepass flce_chunks reinplace rope_flat flex_docs aoti aoti_diagnose
#   aoti_toolchain quant_decode e2e_norms e2e_memory memory_timeline channels_last adamw e2e_host
#   host (opt-in, < 30 s): benchmarks/probes/probe_host.py, ours vs eager torch at launch-bound shapes (do_bench medians)
#   KP_GPU_BUDGET_S (default 570): the whole run's limit in seconds; a step starts only with >= 20 s
#   left and is stopped by SIGINT at its own limit or the budget, whichever comes first. A benchmark
#   suite stopped that way still writes the rows it finished, marked PARTIAL.
# Measured wall times on the H100 with Liger installed (2026-11-23): CUDA tests > 4 min; suites mlp
# ~4 min, rope ~1.7 min, cross_entropy ~2 min, attention > 4 min: the full set takes two or three runs.
# Liger-Kernel is measured when its wheel is in .whl/ (installed here first, offline).
# Results: OUT_DIR/gpu_check.tgz (logs, results JSON/markdown/plots, device.txt), nothing else: a remote run
# brings back one file.
set -uo pipefail
out=${1:?usage: scripts/gpu_check.sh OUT_DIR [STEP ...]}
shift
steps=${*:-tests grid sweep norm attention rope_pairs rope mlp cross_entropy e2e decode deploy corpus analyze}
work="$out/gpu_check"
mkdir -p "$work/results"
T0=$(date +%s)
END=$((T0 + ${KP_GPU_BUDGET_S:-570}))
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/kp-site .whl/*.whl && export PYTHONPATH=/tmp/kp-site
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>/dev/null
  python3 -c "import importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" 2>/dev/null
  date -u
  echo "steps: $steps"
} > "$work/device.txt" 2>&1
status=0
# KP_SMI_LOG=1: the device's SM clock, power and clock-event reasons (power cap, thermal) every 200 ms
# into smi.csv while the steps run
if [ "${KP_SMI_LOG:-0}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,utilization.gpu,clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,clocks_event_reasons.hw_slowdown,clocks_event_reasons.sw_thermal_slowdown \
    --format=csv -lms 200 > "$work/smi.csv" 2>&1 &
  smi_pid=$!
fi
# step LIMIT NAME CMD...: run CMD under min(LIMIT, time left), output in NAME.log, return code noted
step() {
  local lim=$1 name=$2 left
  shift 2
  left=$((END - $(date +%s)))
  [ "$left" -lt "$lim" ] && lim=$left
  if [ "$lim" -lt 20 ]; then echo "== $name: skipped, budget spent" | tee -a "$work/device.txt"; return; fi
  echo "== $name (limit ${lim}s, at $(($(date +%s) - T0))s)"
  # -k: a process that ignores the interrupt (a kernel that never returns) is killed 15 s later
  timeout -k 15 -s INT "$lim" "$@" > "$work/$name.log" 2>&1
  local rc=$?
  echo "rc=$rc elapsed=$(($(date +%s) - T0))s" >> "$work/$name.log"
  tail -n 3 "$work/$name.log"
  [ "$rc" -ne 0 ] && status=1
}
bench() { step "$1" "bench_$2" python3 "benchmarks/bench_$2.py" --out "$work/results" --overwrite; }
for s in $steps; do
  case $s in
    tests) step 300 pytest_cuda python3 -m pytest -m cuda -q -p no:cacheprovider -rf tests ;;
    # every test, unmarked and cuda: the unmarked ones run the kernels here, not the CPU reference
    suite) step 540 pytest_suite python3 -m pytest -q -p no:cacheprovider -rfE -n "${KP_SUITE_WORKERS:-6}" \
             --dist loadfile --durations=25 ${KP_SUITE_PATHS:-tests} ;;
    # the CUDA tests of the files in KP_CUDA_TESTS only (space-separated paths)
    tests_subset) step 240 pytest_cuda_subset python3 -m pytest -m cuda -q -p no:cacheprovider -rf --durations=10 \
                    ${KP_CUDA_TESTS:?set KP_CUDA_TESTS to the test files} ;;
    # unmarked grid tests that also run on the GPU when one is present: the backward schedules' tails,
    # the paired partial rows (repeated, to catch a race) and bitwise determinism
    grid) step 120 pytest_grid python3 -m pytest -q -p no:cacheprovider tests/ops -k "paired or tails or deterministic" ;;
    sweep) step 120 sweep python3 benchmarks/probes/probe_norms.py --sweep ;;
    host) step 90 probe_host python3 benchmarks/probes/probe_host.py --breakdown ;;
    # how the RoPE tile kernel forms its pairs (decides TileConfig.pairs_* in ops/rope/config.py)
    rope_pairs) step 90 probe_rope_pairs python3 benchmarks/probes/probe_rope.py --sections pairs ;;
    # the flat RoPE kernel's launch sweep beside torch.compile's kernels (decides FlatConfig in ops/rope/config.py)
    rope_flat) step 200 probe_rope_flat python3 benchmarks/probes/probe_rope.py --sections flat ${KP_ROPE_FLAT_ARGS:-} ;;
    # the document mask's forward and backward against dense-mask SDPA, and their kernels under the profiler
    flex_docs) step 150 probe_flex_docs python3 benchmarks/probes/probe_flex_mask.py --passes build,fwd,bwd,profile ;;
    # AOTInductor packages of small models, built and loaded on the GPU (a faulting one under gdb)
    aoti) step 300 probe_aoti python3 benchmarks/probes/probe_aoti.py --out /tmp/kp_aoti_probe --jobs 4 \
            ${KP_AOTI_VARIANTS:+--variants "$KP_AOTI_VARIANTS"} ;;
    # where a faulting AOTInductor load faults: native backtrace, ldd, other aot_inductor settings, legacy loader
    aoti_diagnose) step 300 probe_aoti_diagnose python3 benchmarks/probes/probe_aoti.py --out /tmp/kp_aoti_diag \
                     --diagnose "${KP_AOTI_DIAGNOSE:-tiny-plain}" ;;
    # is the loader's fault a C++ runtime mismatch: compilers, libstdc++, a package linked against it
    aoti_toolchain) step 260 probe_aoti_toolchain python3 benchmarks/probes/probe_aoti.py --out /tmp/kp_aoti_tc --timeout 200 \
                      --toolchain "${KP_AOTI_DIAGNOSE:-tiny-plain}" ;;
    # launch sweeps of the bandwidth-bound kernels (re-run when the chip's memory rate changes)
    mlp_sweep) step 120 probe_mlp_sweep python3 benchmarks/probes/probe_mlp.py --sweep ;;
    ce_sweep) step 120 probe_ce_sweep python3 benchmarks/probes/probe_cross_entropy.py --only ce --quick --no-check \
                ${KP_CE_VARIANTS:+--variants "$KP_CE_VARIANTS"} ;;
    # the fused loss's one-read forward kernel at the e2e head: launch variants (KP_ONEPASS_VARIANTS) against
    # the two-pass kernel, and the fused forward with each
    onepass) step 200 probe_onepass python3 benchmarks/probes/probe_cross_entropy.py --only onepass \
               ${KP_ONEPASS_VARIANTS:+--onepass-variants "$KP_ONEPASS_VARIANTS"} ;;
    # fused linear CE chunk sizes at FLCE_SHAPES indices KP_FLCE_SHAPES (default 0,2: vocab 128256 and 262144)
    flce_chunks) step 150 probe_flce_chunks python3 benchmarks/probes/probe_cross_entropy.py --only flce --quick --no-check \
                   --shapes "${KP_FLCE_SHAPES:-0,2}" --chunks "${KP_FLCE_CHUNKS:-512,1024,2048}" ;;
    # does this torch's Inductor write a backward op's declared mutations over saved activations?
    reinplace) step 90 probe_reinplace env TORCH_LOGS=output_code python3 benchmarks/probes/probe_reinplace.py cuda ;;
    # the AdamW kernel on the GPU (its unmarked tests), then its step on the e2e Llama's parameters against
    # torch's fused and foreach AdamW at each launch variant (KP_ADAMW_VARIANTS)
    adamw) step 120 pytest_adamw python3 -m pytest -q -p no:cacheprovider -rf tests/ops/test_adamw.py tests/optim
           step 150 probe_adamw python3 benchmarks/probes/probe_adamw.py ${KP_ADAMW_VARIANTS:+--variants "$KP_ADAMW_VARIANTS"} ;;
    norm | attention | rope | mlp | cross_entropy) bench 300 "$s" ;;
    norms) bench 300 norm ;;  # the norm suite's former name
    # 50 AdamW steps of the built-in Llama, fused linear CE against the unfused loss (bf16)
    loss_curve) step 90 loss_curve python3 benchmarks/bench_loss_curve.py --out "$work/results" ;;
    # rows in the order the target reads them; the script writes after each row and stops starting rows
    # at --budget-s, so the step's limit leaves the last started row time to finish
    # (KP_E2E_PROVIDERS, KP_E2E_BUDGET_S and KP_E2E_FLAGS narrow it to what a run has time for;
    # KP_E2E_PROVIDERS= (set, empty) runs only the 16k-context and generate rows; providers are
    # BASE[+VARIANT...], e.g. "torch.compile,ours+compile+adamw+two_pass_ce" (bench_e2e.py --help lists
    # them); KP_E2E_PROFILE, the providers profiled; KP_E2E_GENERATE, the generate rows, e.g.
    # "ours + static cache + compile+reference,...")
    e2e) step $((${KP_E2E_BUDGET_S:-250} + 90)) bench_e2e python3 benchmarks/bench_e2e.py --out "$work/results" \
           --budget-s "${KP_E2E_BUDGET_S:-250}" ${KP_E2E_FLAGS:-} \
           --providers "${KP_E2E_PROVIDERS-eager,torch.compile,ours+compile,liger,ours,liger+compile,builtin}" \
           ${KP_E2E_GENERATE:+--generate-providers "$KP_E2E_GENERATE"} \
           --profile "${KP_E2E_PROFILE-torch.compile,ours+compile,ours}" ;;
    # the e2e step on transformers' Qwen3 and Gemma 3 at the same widths (8 layers, hidden 2048, 4 x 2048), one
    # run per family in KP_FAMILIES, results in results/e2e_<family>/ (KP_FAMILIES_PROVIDERS, KP_FAMILIES_BUDGET_S,
    # KP_FAMILIES_FLAGS, e.g. "--paired torch.compile,ours+compile")
    e2e_families) for fam in ${KP_FAMILIES:-qwen3 gemma3}; do
                    step $((${KP_FAMILIES_BUDGET_S:-180} + 90)) "bench_e2e_$fam" python3 benchmarks/bench_e2e.py \
                      --family "$fam" --no-long --no-inference --budget-s "${KP_FAMILIES_BUDGET_S:-180}" \
                      --out "$work/results/e2e_$fam" ${KP_FAMILIES_FLAGS:-} \
                      --providers "${KP_FAMILIES_PROVIDERS-torch.compile,ours+compile,liger,ours}"
                  done ;;
    # packed rows (+packed: documents of random lengths, position_ids restarting) of 4 x 4096 tokens, ours (Flex's
    # document block mask) against transformers' packed path (SDPA, dense block-diagonal mask), beside the unpacked
    # ours+compile row; results in results/e2e_packed/ (KP_PACKED_FAMILY, KP_PACKED_PROVIDERS, KP_PACKED_BUDGET_S,
    # KP_PACKED_FLAGS, e.g. "--seq 2048")
    e2e_packed) step $((${KP_PACKED_BUDGET_S:-380} + 90)) bench_e2e_packed python3 benchmarks/bench_e2e.py \
                  --family "${KP_PACKED_FAMILY:-llama}" --seq 4096 --no-long --no-inference \
                  --budget-s "${KP_PACKED_BUDGET_S:-380}" --out "$work/results/e2e_packed" ${KP_PACKED_FLAGS:-} \
                  --providers "${KP_PACKED_PROVIDERS-torch.compile+packed,ours+compile+packed,liger+packed,ours+compile,ours+packed}" ;;
    # long context: the training rows at 1 x 16384 and 2 x 8192 tokens (KP_LONG_SHAPES as BATCHxSEQ, one run each,
    # results in results/e2e_long_<shape>/; KP_LONG_FAMILY, KP_LONG_PROVIDERS, KP_LONG_BUDGET_S, KP_LONG_FLAGS)
    e2e_long) for shape in ${KP_LONG_SHAPES:-1x16384 2x8192}; do
                step $((${KP_LONG_BUDGET_S:-170} + 90)) "bench_e2e_long_$shape" python3 benchmarks/bench_e2e.py \
                  --family "${KP_LONG_FAMILY:-llama}" --batch "${shape%x*}" --seq "${shape#*x}" --no-long \
                  --no-inference --budget-s "${KP_LONG_BUDGET_S:-170}" --out "$work/results/e2e_long_$shape" \
                  ${KP_LONG_FLAGS:-} --providers "${KP_LONG_PROVIDERS-torch.compile,ours+compile,liger}"
              done ;;
    # every optimize() family on the e2e model under torch.compile, gradients against eager; a faulting set
    # is rerun synchronously with the generated code logged, and the faulting kernel named
    compile_check) step 430 compile_check python3 benchmarks/probes/probe_compile_components.py --sets auto --layers 8 \
                     --timeout-s 200 --out "$work/results/compile_check" ;;
    # the e2e model under FSDP2 (+fsdp2 rows: torchtitan's recipe), on one GPU, then under torchrun over every GPU
    # of the machine with the scaling efficiency against the one-GPU rows (KP_FSDP_PROVIDERS, KP_FSDP_BUDGET_S)
    fsdp) step $((${KP_FSDP_BUDGET_S:-200} + 60)) bench_e2e_fsdp_w1 python3 benchmarks/bench_e2e.py --no-long \
            --no-inference --budget-s "${KP_FSDP_BUDGET_S:-200}" --out "$work/results/e2e_fsdp_w1" \
            --providers "${KP_FSDP_PROVIDERS:-torch.compile+fsdp2,ours+compile+fsdp2,liger+fsdp2}"
          n=$(nvidia-smi -L | wc -l)
          [ "$n" -ge 2 ] && step $((${KP_FSDP_BUDGET_S:-200} + 60)) "bench_e2e_fsdp_w$n" torchrun --nproc-per-node "$n" \
            benchmarks/bench_e2e.py --no-long --no-inference --budget-s "${KP_FSDP_BUDGET_S:-200}" \
            --out "$work/results/e2e_fsdp_w$n" --scaling-base "$work/results/e2e_fsdp_w1/e2e.json" \
            --providers "${KP_FSDP_PROVIDERS:-torch.compile+fsdp2,ours+compile+fsdp2,liger+fsdp2}" ;;
    # tensor + sequence parallelism over every GPU (2 or more): ours against torch's styles on the plain model
    tp) n=$(nvidia-smi -L | wc -l)
        if [ "$n" -lt 2 ]; then echo "== tp: skipped, needs 2 or more GPUs" | tee -a "$work/device.txt"
        else step $((${KP_TP_BUDGET_S:-240} + 60)) "bench_e2e_tp_w$n" torchrun --nproc-per-node "$n" benchmarks/bench_e2e.py \
          --no-long --no-inference --budget-s "${KP_TP_BUDGET_S:-240}" --out "$work/results/e2e_tp_w$n" \
          --providers "${KP_TP_PROVIDERS:-torch.compile+tp,ours+compile+tp}"; fi ;;
    # a Llama-3-8B-shaped model under FSDP2 over every GPU (2 or more: it does not fit one)
    fsdp_8b) n=$(nvidia-smi -L | wc -l)
             if [ "$n" -lt 2 ]; then echo "== fsdp_8b: skipped, needs 2 or more GPUs" | tee -a "$work/device.txt"
             else step $((${KP_FSDP_BUDGET_S:-300} + 90)) "bench_e2e_fsdp_8b_w$n" torchrun --nproc-per-node "$n" \
               benchmarks/bench_e2e.py --size llama3-8b --no-long --no-inference --budget-s "${KP_FSDP_BUDGET_S:-300}" \
               --out "$work/results/e2e_fsdp_8b_w$n" \
               --providers "${KP_FSDP_PROVIDERS:-torch.compile+fsdp2,ours+compile+fsdp2,liger+fsdp2}"; fi ;;
    # checkpoint files, the AOTInductor package vs torch.compile, quantized checkpoints (torchao from .whl/)
    # (KP_DEPLOY_BUDGET_S and KP_DEPLOY_ARGS, e.g. "--sections aoti,compile", widen or narrow it)
    deploy) step $((${KP_DEPLOY_BUDGET_S:-150} + 20)) bench_deploy python3 benchmarks/bench_deploy.py \
              --out "$work/results" --budget-s "${KP_DEPLOY_BUDGET_S:-150}" ${KP_DEPLOY_ARGS:-} ;;
    # model-level decode: HF static cache eager / compiled, ours, the nn decoder, int8/fp8 (200 s budget)
    decode) step $((${KP_DECODE_BUDGET_S:-200} + 20)) bench_decode python3 benchmarks/bench_decode.py --out "$work/results" \
              --budget-s "${KP_DECODE_BUDGET_S:-200}" ${KP_DECODE_PROVIDERS:+--providers "$KP_DECODE_PROVIDERS"} ;;
    # model-level prefill: batch 1 x 4096 prompt tokens, HF eager / compiled, ours, and the model's GEMMs alone (and
    # with causal SDPA) as floors, 240 s budget (KP_PREFILL_BUDGET_S, KP_PREFILL_PROVIDERS); KP_PREFILL_PAIRED, e.g.
    # "hf-compile,ours,gemm-floor", times those again in turns (set KP_SMI_LOG=1 to log the clock beside)
    prefill) step $((${KP_PREFILL_BUDGET_S:-240} + 60)) bench_prefill python3 benchmarks/bench_prefill.py \
               --out "$work/results" --budget-s "${KP_PREFILL_BUDGET_S:-240}" \
               ${KP_PREFILL_PROVIDERS:+--providers "$KP_PREFILL_PROVIDERS"} ${KP_PREFILL_PAIRED:+--paired "$KP_PREFILL_PAIRED"} ;;
    # our weight-only quantized matmuls: their tests on the GPU (Llama shapes against the reference, dynamic
    # compile with CUDA graphs, an int4 AOTInductor package), then their benchmark against bf16 and torchao
    quant) step 240 pytest_quant python3 -m pytest -q -p no:cacheprovider -rf tests/ops/test_quant_matmul_kernels.py tests/ops/test_quant_matmul_gemv.py tests/ops/test_launch_keywords.py \
             tests/ops/test_quant_matmul_op.py tests/functional/test_quant_linear.py tests/nn/test_quant_linear.py \
             tests/deploy/test_quantize_kernels.py tests/reference/test_quant_matmul.py
           step 200 bench_quant_matmul python3 benchmarks/bench_quant_matmul.py --out "$work/results" \
             ${KP_QUANT_SWEEP:+--sweep} ;;
    # optimize(rewrite=True) on the GPU: its tests with the real kernels, then compile + rewrites against compile
    # alone and eager on hand-written blocks and the built-in Llama (fwd+bwd time and peak memory)
    rewrite) step 200 pytest_rewrite python3 -m pytest -q -p no:cacheprovider -rf tests/optimize/test_rewrite.py \
               tests/optimize/test_rewrite_rope_ce.py \
               tests/cli/test_optimize_cli.py tests/assistant/fusion/test_fusion.py
             step 420 probe_rewrite python3 benchmarks/probes/probe_rewrite.py --out "$work/results/probe_rewrite.md" ;;
    # the kernels of one quantized decode step (bf16, int8, fp8) under the decode bench's compile
    quant_decode) step 180 probe_quant_decode python3 benchmarks/probes/probe_quant_decode.py ;;
    # RMSNorm's launch variants at the e2e shapes beside torch.compile's (KP_NORM_SHAPES, KP_NORM_PASSES)
    e2e_norms) step 200 probe_e2e_norms python3 benchmarks/probes/probe_e2e_norms.py --shapes "${KP_NORM_SHAPES:-8192x2048,16384x4096}" \
                 --passes "${KP_NORM_PASSES:-fwd,bwd}" ;;
    # what is live at the e2e step's memory peak, by variant (up to about 2 min each: compile, steps, the trace)
    e2e_memory) step 300 probe_e2e_memory python3 benchmarks/probes/probe_e2e_memory.py \
                  --variants "${KP_E2E_MEMORY_VARIANTS:-ours+compile,ours+compile@noreuse}" ;;
    # channels_last against NCHW on resnet50 and convnext_tiny (bf16, batch 64, train mode), eager and compiled,
    # fwd and fwd+bwd, events and CUDA graphs (docs/examples/cnn_optimization.md)
    channels_last) step 480 probe_channels_last python3 benchmarks/probes/probe_channels_last.py \
                     --out "$work/results/channels_last.md" ${KP_CL_MODELS:+--models "$KP_CL_MODELS"} ;;
    # the guide's memory timeline: one e2e training step per provider, bytes allocated over time (JSON for
    # scripts/guide_figures.py; commit it as benchmarks/results/memory_timeline_<device>.json) and the peaks' report
    memory_timeline) step 360 probe_memory_timeline python3 benchmarks/probes/probe_e2e_memory.py \
                       --variants "${KP_TIMELINE_VARIANTS:-eager,torch.compile,ours+compile@noreuse,liger}" \
                       --timeline "$work/results/memory_timeline.json" --out "$work/results/memory_timeline_peaks.txt" ;;
    # the e2e step's host side: lead-in before the first kernel, synchronising calls, chrome traces
    e2e_host) step 300 probe_e2e_host python3 benchmarks/probes/probe_e2e_host.py --out "$work/results/e2e_host" \
                --providers "${KP_E2E_HOST_PROVIDERS:-torch.compile,ours+compile+adamw}" ;;
    corpus) step 300 corpus env KP_CORPUS_DEVICE=cuda python3 -m pytest tests/assistant/test_real_models.py \
              -q -p no:cacheprovider -rfxXs --durations=0 -s ;;
    # the compile verdict against a careful timing (CUDA events, L2 flushed) over the verdict corpus: the
    # agreement table (markdown + JSON); KP_VERDICT_BUDGET_S bounds the run, models past it are skipped
    verdict) step $((${KP_VERDICT_BUDGET_S:-480} + 40)) verdict python3 scripts/verdict_agreement.py \
               --out "$work/results/verdict" --budget-s "${KP_VERDICT_BUDGET_S:-480}" ${KP_VERDICT_ARGS:-} ;;
    analyze) step 150 analyze python3 -m kernel_pytorch.cli.main analyze --model llama-8l-2048 \
               --html "$work/results/analyze_llama8l_h100.html" --markdown "$work/results/analyze_llama8l_h100.md" \
               --json "$work/results/analyze_llama8l_h100.json" ;;
    # the old tree (git archive 0b0d643 src, unpacked into .ab/old and carried) against this one
    ab_norms) step 200 ab_norms bash scripts/ab_norms.sh .ab/old/src "$work/results" ;;
    # an older tree (f3445f2: module-global launch knobs, flat packages) against this one, alternating
    # (scripts/ab_suites.sh): carry .ab, made with
    # mkdir -p .ab/old && git archive f3445f2 src benchmarks/bench_e2e.py | tar -x -C .ab/old
    # (KP_AB_SUITES: "norm cross_entropy" in one run, "e2e" in another)
    ab) step 560 ab_suites bash scripts/ab_suites.sh .ab/old "$work/results" ${KP_AB_SUITES:-norm cross_entropy} ;;
    *) echo "unknown step $s" | tee -a "$work/device.txt"; status=1 ;;
  esac
done
[ -n "${smi_pid:-}" ] && kill "$smi_pid" 2>/dev/null
(cd "$out" && tar czf gpu_check.tgz gpu_check && rm -rf gpu_check)
echo "wrote $out/gpu_check.tgz"
exit $status
