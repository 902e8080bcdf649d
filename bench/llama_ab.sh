#!/usr/bin/env bash
# The Llama protocol (C++ step graph, kpack-llama) of several arms, alternating in one
# call on one GPU, so that a difference between arms is not a difference between machines
# (timings drift 10-25% from one H200 to the next). An arm is
#
#   NAME|SOURCE|PACK|FLAGS
#
# SOURCE: `.` (this tree) or a tarball of another tree (`git archive COMMIT > old.tar` on
# the machine with the repository); each distinct source is built once (kpack-llama only,
# under /tmp/llama_ab). PACK: the pack directory, relative to this directory if it exists
# here, else to the source tree (empty: the source's kernels/llamapack). FLAGS: more
# kpack-llama flags (e.g. `--graphs off`). Example:
#
#   ROUNDS=4 bench/llama_ab.sh "old|/tmp/old.tar||" "new|.||" "new-eager|.||--graphs off"
#
# Writes a Llama-3.2-1B-shaped checkpoint with the Python engine's writer (torch on the
# GPU) unless $CKPT has one, then runs the protocol (batch $BATCH, default 1; 32-token
# prompts, 127 steps, capacity 16,384, 3 warm-up + 5 timed sequences) arm by arm for
# ROUNDS rounds (default 3) and prints each run's µs/step, then each arm's median. Needs
# cmake, ninja, the build dependencies (tools/gpu_tier.sh's environment) and $PYTHON
# (default python3) with torch. Results: $OUT_DIR (default /tmp/llama_ab/out).
set -euo pipefail
(($#)) || { echo "usage: bench/llama_ab.sh 'NAME|SOURCE|PACK|FLAGS' ..."; exit 2; }
rounds=${ROUNDS:-3}
batch=${BATCH:-1}
python=${PYTHON:-python3}
work=/tmp/llama_ab
out=${OUT_DIR:-$work/out}
ckpt=${CKPT:-$work/ckpt}
mkdir -p "$work" "$out"
declare -A tree=() bin=() pids=()
names=() packs=() flags=() arm_bins=()
for arm in "$@"; do
  IFS='|' read -r name source pack flag <<< "$arm"
  [[ -n $name && -n $source ]] || { echo "arm '$arm': NAME|SOURCE|PACK|FLAGS"; exit 2; }
  if [[ -z ${tree[$source]:-} ]]; then
    if [[ $source == . ]]; then
      tree[$source]=$PWD
    else
      tree[$source]=$work/src${#tree[@]}
      rm -rf "${tree[$source]}" && mkdir -p "${tree[$source]}"
      tar xf "$source" -C "${tree[$source]}"
    fi
    bin[$source]=$work/build${#bin[@]}
  fi
  if [[ -z $pack ]]; then
    pack=${tree[$source]}/kernels/llamapack
  elif [[ -d $pack ]]; then
    pack=$(cd "$pack" && pwd)
  else
    pack=${tree[$source]}/$pack
  fi
  [[ -f $pack/manifest.json ]] || { echo "arm $name: no pack at $pack"; exit 2; }
  names+=("$name") packs+=("$pack") flags+=("$flag") arm_bins+=("${bin[$source]}")
done
jobs=$(( $(nproc) / ${#tree[@]} ))
for source in "${!tree[@]}"; do
  log=$out/build$(basename "${bin[$source]}").log
  { cmake -S "${tree[$source]}" -B "${bin[$source]}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython3_EXECUTABLE="$python" && \
    cmake --build "${bin[$source]}" -j"$((jobs > 1 ? jobs : 1))" --target kpack_llama_cli
  } > "$log" 2>&1 &
  pids[$source]=$!
done
for source in "${!tree[@]}"; do
  wait "${pids[$source]}" || { echo "building $source failed: see $out/"; exit 1; }
done
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
for round in $(seq 1 "$rounds"); do
  for i in "${!names[@]}"; do
    json=$out/${names[$i]}_$round.json
    # shellcheck disable=SC2086  # FLAGS are words
    "${arm_bins[$i]}/examples/llama/kpack-llama" --pack "${packs[$i]}" --checkpoint "$ckpt" \
      --batch "$batch" --prompt-lens 32 --steps 127 --capacity 16384 --graphs on --warmup-seqs 3 \
      --timed-seqs 5 --json "$json" ${flags[$i]} > "$out/${names[$i]}_$round.log" 2>&1 ||
      { echo "${names[$i]} round $round failed:"; tail -5 "$out/${names[$i]}_$round.log"; exit 1; }
    "$python" -c 'import json, sys
print(sys.argv[2], "round", sys.argv[3] + ":", "%.1f us/step" % json.load(open(sys.argv[1]))["us_per_step"])' \
      "$json" "${names[$i]}" "$round"
  done
done
"$python" - "$out" "$rounds" "${names[@]}" <<'PY'
import json, statistics, sys
out, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
for n in names:
    us = [json.load(open(f"{out}/{n}_{r}.json"))["us_per_step"] for r in range(1, rounds + 1)]
    print(f"{n}: median {statistics.median(us):.1f} us/step (min {min(us):.1f}, max {max(us):.1f})")
PY
