#!/usr/bin/env bash
# Runs kpack's libFuzzer targets for a while each and reports what they find.
#
#   tests/fuzz/run_fuzzers.sh BUILD_DIR [SECONDS] [TARGET...]
#
# BUILD_DIR is a fuzz build (see tests/fuzz/CMakeLists.txt); SECONDS (default 60) is the
# time per target; TARGETs (default: all) are short names: manifest grid_expr cubin npy.
# Each target fuzzes a temporary copy of its seed corpus (corpus/<target>/ plus
# regressions/<target>/), so nothing is written into the source tree; artifacts and logs
# also go to the temporary directory, which is kept only when something was found.
#
# Environment: KPACK_FUZZ_TIMEOUT (seconds one input may take, default 10),
# KPACK_FUZZ_RSS_MB (memory limit, default 2048), KPACK_FUZZ_KEEP=1 (keep the temporary
# directory even when nothing was found), KPACK_FUZZ_REGRESSIONS=0 (leave regressions/ out
# of the seeds: while a known crash there is unfixed, the fuzzer would stop on it at once).
#
# Exit status: 0 when no target found anything, 1 when one found a crash, leak, timeout or
# out-of-memory input (or an input slow again when replayed alone), 2 on a usage error or
# a missing fuzzer binary.

set -u

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
  exit 2
fi
build_dir=$1
seconds=${2:-60}
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
(( ${#targets[@]} )) || targets=(manifest grid_expr cubin npy)
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || (( seconds < 1 )); then
  echo "run_fuzzers.sh: SECONDS must be a positive integer, got '$seconds'" >&2
  exit 2
fi

timeout_s=${KPACK_FUZZ_TIMEOUT:-10}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kpack-fuzz.XXXXXX")
found=0
missing=0
summary=()

for t in "${targets[@]}"; do
  bin="$build_dir/tests/fuzz/kpack_${t}_fuzz"
  if [[ ! -x "$bin" ]]; then
    echo "run_fuzzers.sh: no fuzzer $bin (build the kpack_fuzzers target of a fuzz build)" >&2
    missing=1
    continue
  fi
  corpus="$work/$t/corpus"
  artifacts="$work/$t/artifacts"
  log="$work/$t/fuzz.log"
  mkdir -p "$corpus" "$artifacts"
  seed_dirs=("$here/corpus/$t")
  [[ "${KPACK_FUZZ_REGRESSIONS:-1}" == 0 ]] || seed_dirs+=("$here/regressions/$t")
  for seeds in "${seed_dirs[@]}"; do
    [[ -d "$seeds" ]] || continue
    find "$seeds" -maxdepth 1 -type f ! -name 'README*' -exec cp {} "$corpus/" \;
  done
  args=(-max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/"
        -timeout="$timeout_s" -rss_limit_mb="${KPACK_FUZZ_RSS_MB:-2048}")
  [[ -f "$here/dicts/$t.dict" ]] && args+=(-dict="$here/dicts/$t.dict")

  echo "== $t: fuzzing for ${seconds}s (log: $log)"
  "$bin" "${args[@]}" "$corpus" >"$log" 2>&1
  rc=$?

  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  units=$(grep -o 'corp: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  line=$(printf '%-10s execs=%-9s exec/s=%-7s cov=%-6s ft=%-6s corpus=%s' \
         "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${units:-?}")

  mapfile -t crashes < <(find "$artifacts" -type f | sort)
  # A slow-unit artifact is an input that took over 10 s (-report_slow_units) without
  # tripping -timeout: on a shared machine a stall of the whole process does that (CI,
  # 2026-12-03: "Slowest unit: 18 s", an input that replays in 0.05-0.2 s). It counts as
  # found only if it is slow again, replayed alone within the timeout.
  kept=() stalls=0
  for a in "${crashes[@]}"; do
    if (( rc == 0 )) && [[ $(basename "$a") == slow-unit-* ]]; then
      start=$SECONDS
      if timeout "$timeout_s" "$bin" "$a" > /dev/null 2>&1 &&
         (( SECONDS - start < timeout_s )); then
        stalls=$((stalls + 1))
        echo "-- $t: $a was slow once and replays in $((SECONDS - start)) s: not counted"
        continue
      fi
    fi
    kept+=("$a")
  done
  crashes=("${kept[@]}")
  (( stalls )) && line+="  ($stalls slow unit(s) fast on replay)"
  if (( rc != 0 || ${#crashes[@]} > 0 )); then
    found=1
    line+="  FOUND (exit $rc)"
    echo "!! $t: libFuzzer exited with $rc; the end of its log:"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*KPACK_FUZZ_CHECK|.*runtime error:|    #[0-9]+ )' "$log" \
      | head -40 | sed 's/^/   /'
    for a in "${crashes[@]}"; do
      echo "!! $t: artifact $a"
    done
    echo "!! reproduce: $bin <artifact>"
    echo "!! then copy it into tests/fuzz/regressions/$t/ so that ctest -L fuzz replays it"
  fi
  summary+=("$line")
done

echo
echo "== summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
if (( found )) || [[ "${KPACK_FUZZ_KEEP:-0}" == 1 ]]; then
  echo "== logs, corpora and artifacts kept in $work"
else
  rm -rf "$work"
fi
(( found )) && exit 1
(( missing )) && exit 2
exit 0
