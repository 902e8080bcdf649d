#!/usr/bin/env bash
# The GPU tier on a GPU machine, in stages, each timed and logged:
#
#   tools/gpu_tier.sh [STAGE...]      (default: every stage, in this order)
#
#   build     configure and build build-gpu/ (Release), and `pip install
#             --no-build-isolation .` into $KPACK_PYTHON (the Python with torch/triton)
#   ctest     KPACK_REQUIRE_GPU=1 ctest -L gpu, except the stages below
#   memcheck  compute-sanitizer memcheck over the conformance suite (eager and captured,
#             and the step-graph tests Graph/*) and the 8-thread stress (own streams and
#             CU_STREAM_PER_THREAD)
#   examples  the example pack rebuilt tuned and checked against Triton's JIT
#             (kpack_examples_gpu); the tuned pack is kept in $LOGS/examplepack-tuned
#   python    the Python package, its torch ops and drop-in, the torch extension, graphs
#             (kpack_python_gpu, kpack_torch_ops_gpu, kpack_torch_extension_gpu,
#             kpack_python_graph_gpu), and `import kpack` before torch
#             (kpack_import_order_gpu)
#   bench     kpack_launch_bench (paired rows), the Python and Triton launch benchmarks,
#             kpack_open_bench, kpack_graph_bench (CUDA graphs; $LOGS/graph_bench.json)
#   run       tools/run.sh, the README's main job, with a GPU
#   llama-tune  kernels/llamapack tuned on this GPU in place (three kernel groups, each a
#             kpack-build with --jobs; their tuning merged; the pack rebuilt from it with
#             --reuse-tuning); tuning.json and the logs kept in $LOGS/llamapack-tuned.
#             Needs the kpack package installed (the build stage's pip install): the
#             grid-tolerance proof calls kpack's padding rule through the extension.
#             LLAMA_TUNE_GROUPS="a,b c,d" names the groups (default: all nine kernels
#             in three); a kernel no group names keeps the committed pack's tuning.
#             LLAMA_SPEC_CANDIDATES=N tunes each bucket's first N candidates only;
#             LLAMA_TUNE_BUCKETS="1" (kpack-build's --retune-buckets) tunes only those M
#             buckets of the named kernels, their other buckets kept from the committed
#             pack's tuning.json (bucket indices: KERNEL:B would be refused by each
#             group's build that lacks KERNEL; LLAMA_TUNE_GROUPS picks the kernels);
#             LLAMA_TUNE_BUCKETS=none tunes none: the named kernels recompiled from the
#             current source with the committed configs, their grid tolerance proven
#             again (after a change to a kernel's code, not its configs;
#             their correctness is then the llama stage's kernel check)
#   llama     the Llama engine's GPU tier: the kernels against their torch math
#             (kpack_llama_kernels_gpu), C++ graph vs eager on tiny and full size
#             (LlamaGpuTest.*), Python vs C++ and the reference's KL check
#             (kpack_llama_python_gpu), kpack-llama under memcheck
#   llama-bench  bench/llama_bench.py, every arm, into $LOGS/llama_bench
#
# Not in the default list (slow; name them): llama-tune, llama, llama-bench.
#
# Logs go to $LOGS (default: $OUT when set, else gpu-logs/): one <stage>.log each and
# summary.txt (stage, exit code, seconds). The exit code is the number of failed stages.
# Needs the C++ dependencies on CMAKE_PREFIX_PATH (on the project's H200 machine:
# `source .gpu/env.sh` first).
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${LOGS:-${OUT:-gpu-logs}}"
mkdir -p "$LOGS"
LOGS="$(cd "$LOGS" && pwd)"
python="${KPACK_PYTHON:-$(command -v python3)}"
build=build-gpu
stages=("$@")
((${#stages[@]})) || stages=(build ctest memcheck examples python bench run)
# Tests that other stages run (they are slow, or want the GPU to themselves).
separate='kpack_llama_|LlamaGpuTest|kpack_examples_gpu|kpack_python_gpu|kpack_torch_ops_gpu|kpack_torch_extension_gpu|kpack_python_graph_gpu|kpack_import_order_gpu|_bench_gpu$'

stage_build() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPython3_EXECUTABLE="$python" || return 1
  # The wheel's own C++ build runs beside the project's.
  "$python" -m pip install -q --no-build-isolation --no-deps . > "$LOGS/pip.log" 2>&1 &
  local pip=$!
  cmake --build "$build" -j"$(nproc)" || { wait "$pip"; return 1; }
  wait "$pip" || { echo "pip install failed: see pip.log"; return 1; }
}
stage_ctest() {
  KPACK_REQUIRE_GPU=1 ctest --test-dir "$build" -L gpu -E "$separate" -j4 \
    --output-on-failure --timeout 600
}
stage_memcheck() {
  local cs=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1)
  KPACK_REQUIRE_GPU=1 "${cs[@]}" "$build/tests/kpack_gpu_test" --gtest_filter='Suite/*:Graph/*' &&
    KPACK_REQUIRE_GPU=1 KPACK_STRESS_LAUNCHES=600 "${cs[@]}" "$build/tests/kpack_gpu_test" \
      --gtest_filter='Streams/*'
}
stage_examples() {
  rm -rf "$LOGS/examplepack-tuned"
  KPACK_REQUIRE_GPU=1 KPACK_EXAMPLES_KEEP="$LOGS/examplepack-tuned" \
    ctest --test-dir "$build" -R '^kpack_examples_gpu$' --output-on-failure -V --timeout 900
}
stage_python() {
  KPACK_REQUIRE_GPU=1 ctest --test-dir "$build" \
    -R 'kpack_python_gpu|kpack_torch_ops_gpu|kpack_torch_extension_gpu|kpack_python_graph_gpu|kpack_import_order_gpu' \
    -j2 --output-on-failure -V --timeout 1200
}
stage_bench() {
  "$build/bench/kpack_launch_bench" --benchmark_filter='paired/' --benchmark_repetitions=5 \
    --benchmark_min_time=0.05 --benchmark_report_aggregates_only=true &&
    "$python" bench/python_launch_bench.py --kpack-bench "$build/bench/kpack_launch_bench" \
      --out "$LOGS/python_bench" &&
    "$build/bench/kpack_open_bench" --benchmark_min_time=0.5 &&
    "$build/bench/kpack_graph_bench" --json "$LOGS/graph_bench.json"
}
stage_run() {
  KPACK_REQUIRE_GPU=1 bash tools/run.sh
}

stage_llama-tune() {
  local out="$LOGS/llamapack-tuned" group i=0 start
  local all="llama_embed,llama_rmsnorm,llama_attn_decode,llama_attn_prefill,llama_qkv_rope"
  all+=" llama_o_proj,llama_gate_up llama_down_proj,llama_lm_head"
  local groups
  read -r -a groups <<< "${LLAMA_TUNE_GROUPS:-$all}"
  "$python" -c 'import kpack._kpack' 2> /dev/null ||
    { echo "llama-tune: install the kpack package first (the build stage does)"; return 1; }
  rm -rf "$out" && mkdir -p "$out" || return 1
  local only=()
  if [[ ${LLAMA_TUNE_BUCKETS:-} == none ]]; then
    only=(--reuse-tuning kernels/llamapack/tuning.json)
  elif [[ -n ${LLAMA_TUNE_BUCKETS:-} ]]; then
    only=(--reuse-tuning kernels/llamapack/tuning.json --retune-buckets "$LLAMA_TUNE_BUCKETS")
  fi
  for group in "${groups[@]}"; do
    i=$((i + 1)) start=$SECONDS
    LLAMA_SPEC_KERNELS=$group PYTHONPATH=tools "$python" -m kpack_tools.build \
      kernels/llama/llama_spec.py --out "$out/group$i" --jobs "$(nproc)" "${only[@]}" \
      > "$out/tune$i.log" 2>&1 || { tail -n 20 "$out/tune$i.log"; return 1; }
    echo "llama-tune: group $i ($group) in $((SECONDS - start)) s"
  done
  # The groups' kernels, then the committed pack's entries of the kernels no group names
  # (the final build's --reuse-tuning refuses them if they no longer fit the spec).
  "$python" - "$out" "$i" kernels/llamapack/tuning.json <<'PY' || return 1
import json, sys
out, groups, committed = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parts = [json.load(open(f"{out}/group{i}/tuning.json")) for i in range(1, groups + 1)]
kernels = [k for p in parts for k in p["kernels"]]
named = {k["name"] for k in kernels}
kept = [k for k in json.load(open(committed))["kernels"] if k["name"] not in named]
if kept:
    print("llama-tune: kept from the committed pack:", ", ".join(k["name"] for k in kept))
merged = dict(parts[0], kernels=kernels + kept)
json.dump(merged, open(f"{out}/tuning.json", "w"), indent=1)
PY
  PYTHONPATH=tools "$python" -m kpack_tools.build kernels/llama/llama_spec.py \
    --out kernels/llamapack --no-tune --reuse-tuning "$out/tuning.json" --jobs "$(nproc)" \
    > "$out/pack.log" 2>&1 || { tail -n 20 "$out/pack.log"; return 1; }
  grep -h '^tune kernel' "$out"/tune*.log | sed 's/: .*-> / -> /'
  tar czf "$out/llamapack.tgz" kernels/llamapack
}
stage_llama() {
  KPACK_REQUIRE_GPU=1 ctest --test-dir "$build" \
    -R 'kpack_llama_kernels_gpu|LlamaGpuTest|kpack_llama_python_gpu|kpack_llama_memcheck_gpu' \
    --output-on-failure -V --timeout 1200
}
stage_llama-bench() {
  "$python" bench/llama_bench.py --kpack-llama "$build/examples/llama/kpack-llama" \
    --out "$LOGS/llama_bench" ${KPACK_LLAMA_BENCH_ARGS:-}
}

failed=0
for s in "${stages[@]}"; do
  start=$SECONDS
  echo "== $s"
  "stage_$s" > "$LOGS/$s.log" 2>&1
  rc=$?
  line="$s rc=$rc $((SECONDS - start))s"
  echo "$line" | tee -a "$LOGS/summary.txt"
  tail -n 25 "$LOGS/$s.log"
  ((rc == 0)) || failed=$((failed + 1))
done
exit "$failed"
