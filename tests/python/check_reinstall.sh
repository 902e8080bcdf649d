#!/usr/bin/env bash
# Fails when `pip install` of an unchanged checkout compiles anything: pyproject.toml
# promises a persistent build tree (build/python/<wheel tag>) that rebuilds only what
# changed, also from pip's default isolated build environment, which is new every time
# (src/python/wheel/CMakeLists.txt and src/python/CMakeLists.txt say how).
#
#   tests/python/check_reinstall.sh PYTHON [pip install arguments...]
#
# Run it after a first `PYTHON -m pip install` with the same arguments (tools/test.sh
# does): it installs again, verbosely, and counts the compile and link steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
python="$1"
shift
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
start=$(date +%s)
"$python" -m pip install -v --disable-pip-version-check "$@" >"$log" 2>&1 || {
  tail -n 40 "$log"
  echo "check_reinstall: pip install failed" >&2
  exit 1
}
steps=$(grep -cE '(Building|Linking) [A-Z]+ ' "$log" || true)
echo "check_reinstall: a second pip install took $(( $(date +%s) - start )) s and ran $steps" \
     "compile or link steps"
if [ "$steps" != 0 ]; then
  grep -E '(Building|Linking) [A-Z]+ ' "$log" | head -n 20
  echo "check_reinstall: FAILED: nothing changed, so nothing should have been rebuilt" >&2
  exit 1
fi
