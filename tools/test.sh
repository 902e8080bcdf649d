#!/usr/bin/env bash
# The tests: set up and build, install the Python tools' pinned packages into a venv,
# then run
#   1. the CPU test tier (ctest label `cpu`: it includes building examples/ against the
#      installed package with g++ and clang++-14), the Python tools' tests, and the main
#      job (tools/run.sh);
#   2. the CPU tier again under AddressSanitizer + UndefinedBehaviorSanitizer (clang) and
#      under ThreadSanitizer (gcc); the tests that see NVTX ranges with them compiled out
#      (-DKPACK_ENABLE_NVTX=OFF);
#   3. every libFuzzer target for $KPACK_FUZZ_SECONDS (default 30) seconds, plus the saved
#      regression inputs.
# `tools/test.sh --quick` runs step 1 only. The GPU tier (label `gpu`) needs a GPU:
#   KPACK_REQUIRE_GPU=1 ctest --test-dir build -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = "--quick" ] && quick=1
bash tools/setup.sh --for test

venv=build/venv
if [ ! -x "$venv/bin/python" ]; then
  echo "== making the Python venv $venv"
  python3 -m venv "$venv"
fi
# The kpack Python package from this checkout (pyproject.toml: the extension, built into
# build/python/, plus kpack_tools with kpack-build/kpack-record), with the tools' pinned
# Triton and the test runner as its extras.
launcher=()
command -v ccache >/dev/null && launcher=(-C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
echo "== pip install .[tools,test] numpy into $venv: compiles the extension kpack._kpack" \
  "(build/python/) and fetches triton==3.6.0, numpy and pytest when missing; a minute or" \
  "more the first time, quiet until it is done"
started=$SECONDS
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${launcher[@]}" \
  ".[tools,test]" numpy
echo "   installed in $((SECONDS - started)) s"
# pyproject.toml promises that rebuilding the wheel recompiles only what changed: a second
# install of the unchanged checkout must compile nothing.
tests/python/check_reinstall.sh "$venv/bin/python" "${launcher[@]}" ".[tools,test]" numpy

# The Llama tests' fixture (tests/llama/tiny_fixture.py) writes its checkpoint and runs the
# numpy oracle with this venv's numpy and safetensors.
cmake -S . -B build -DKPACK_LLAMA_PYTHON="$PWD/$venv/bin/python" >/dev/null

echo "== CPU tier"
# kpack_open_bench runs on its own below, where its figures are shown.
ctest --test-dir build -L cpu -E '^kpack_open_bench$' --output-on-failure -j"$(nproc)"
if [ -x build/bench/kpack_open_bench ]; then  # absent with -DKPACK_BUILD_BENCH=OFF
  echo "== What opening a pack costs (bench/open_bench.cc, against the fake driver)"
  KPACK_CUDA_DRIVER=build/tests/fake_driver/libkpack_fake_cuda.so build/bench/kpack_open_bench \
    --benchmark_min_time=0.2
fi
echo "== Python tools"
PYTHONPATH=tools "$venv/bin/python" -m pytest -q -p no:cacheprovider tools/tests
echo "== Python package (against the fake driver)"
KPACK_FAKE_DRIVER=build/tests/fake_driver/libkpack_fake_cuda.so \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python
echo "== the main job (tools/run.sh), as the README gives it"
bash tools/run.sh
[ "$quick" = 1 ] && exit 0

jobs="$(nproc)"
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKPACK_BUILD_BENCH=OFF
        -DCUDAToolkit_ROOT="${CUDA_HOME:-/usr/local/cuda}"
        -DKPACK_LLAMA_PYTHON="$PWD/$venv/bin/python")
echo "== CPU tier under ASan + UBSan (clang)"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan "${common[@]}" -DKPACK_SANITIZE=address \
  >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L cpu --output-on-failure -j"$jobs"

echo "== CPU tier under TSan (gcc)"
cmake -S . -B build-tsan "${common[@]}" -DKPACK_SANITIZE=thread >/dev/null
cmake --build build-tsan -j"$jobs"
TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan -L cpu --output-on-failure -j"$jobs"

echo "== NVTX compiled out (-DKPACK_ENABLE_NVTX=OFF): the tests that see NVTX ranges"
cmake -S . -B build-nonvtx "${common[@]}" -DKPACK_ENABLE_NVTX=OFF >/dev/null
cmake --build build-nonvtx -j"$jobs" --target kpack_nvtx_test kpack_cli_test \
  kpack_llama_engine_test
ctest --test-dir build-nonvtx -L cpu -R 'Nvtx|^CliTest\.Doctor$' --output-on-failure -j"$jobs"

echo "== fuzzers (libFuzzer, ASan + UBSan)"
CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz "${common[@]}" -DKPACK_BUILD_FUZZERS=ON \
  -DKPACK_BUILD_TESTS=OFF -DKPACK_BUILD_TOOLS=ON -DKPACK_FORTIFY_SOURCE=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined" >/dev/null
cmake --build build-fuzz -j"$jobs"
ctest --test-dir build-fuzz -L fuzz --output-on-failure
bash tests/fuzz/run_fuzzers.sh build-fuzz "${KPACK_FUZZ_SECONDS:-30}"
