#!/usr/bin/env bash
# The batch-1 Llama protocol (C++ step graph, kpack-llama) of two source trees, alternating
# in one call on one GPU, so that a difference between them is not a difference between
# machines (timings drift 10-25% from one H200 to the next):
#
#   git archive OLD_COMMIT > /tmp/old.tar          # on the machine with the repository
#   bench/llama_commit_ab.sh /tmp/old.tar [ROUNDS] # on the GPU machine, from this tree
#
# Builds kpack-llama of both trees (only that target; the old one under /tmp/llama_ab),
# writes a Llama-3.2-1B-shaped checkpoint with the Python engine's writer (torch on the
# GPU) unless $CKPT has one, then runs the protocol (batch 1, 32-token prompt, 127 steps,
# capacity 16,384, 3 warm-up + 5 timed sequences) old, new, old, new ... for ROUNDS
# rounds (default 3), each with its own tree's pack, and prints each run's µs/step.
# Needs cmake, ninja, the build dependencies (tools/gpu_tier.sh's environment) and
# $PYTHON (default python3) with torch. Results: $OUT_DIR (default /tmp/llama_ab/out).
set -euo pipefail
old_tar=${1:?usage: bench/llama_commit_ab.sh OLD_TREE.tar [ROUNDS]}
rounds=${2:-3}
python=${PYTHON:-python3}
work=/tmp/llama_ab
out=${OUT_DIR:-$work/out}
ckpt=${CKPT:-$work/ckpt}
rm -rf "$work/old" && mkdir -p "$work/old" "$out"
tar xf "$old_tar" -C "$work/old"
build() {  # source dir, build dir, log name
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$python" \
    > "$out/cmake_$3.log" 2>&1 &&
    cmake --build "$2" -j"$(( $(nproc) / 2 ))" --target kpack_llama_cli > "$out/build_$3.log" 2>&1
}
build "$PWD" "$work/build_new" new & new_pid=$!
build "$work/old" "$work/build_old" old & old_pid=$!
wait "$new_pid" || { echo "building this tree failed: $out/build_new.log"; exit 1; }
wait "$old_pid" || { echo "building the old tree failed: $out/build_old.log"; exit 1; }
if [[ ! -f $ckpt/model.safetensors ]]; then
  "$python" - "$ckpt" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "examples/llama/python")
import checkpoint, config
checkpoint.write_checkpoint(Path(sys.argv[1]), config.preset_dict("llama-3.2-1b"), seed=1,
                            backend="torch", device="cuda")
PY
fi
run() {  # name binary pack round
  "$2" --pack "$3" --checkpoint "$ckpt" --batch 1 --prompt-lens 32 --steps 127 \
    --capacity 16384 --graphs on --warmup-seqs 3 --timed-seqs 5 --json "$out/$1_$4.json" \
    > "$out/$1_$4.log" 2>&1
  "$python" -c 'import json, sys
us = json.load(open(sys.argv[1]))["us_per_step"]
print(sys.argv[2], "round", sys.argv[3] + ":", "%.1f us/step" % us)' "$out/$1_$4.json" "$1" "$4"
}
for round in $(seq 1 "$rounds"); do
  run old "$work/build_old/examples/llama/kpack-llama" "$work/old/kernels/llamapack" "$round"
  run new "$work/build_new/examples/llama/kpack-llama" kernels/llamapack "$round"
done
