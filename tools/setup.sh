#!/usr/bin/env bash
# Set-up shared by tools/run.sh and tools/test.sh: finds out what is missing from what is
# there, installs only that, then configures and builds into build/ what the profile
# needs: for run (the default), the kpack command line only (target kpack_cli); for test,
# everything (library, command line, tests, benchmarks).
#
#   tools/setup.sh [--for run|test] [--check]
#
# What counts is capability, not package names: tools on PATH (cmake >= 3.24, ninja, a
# C++20 compiler; for --for test also g++, clang-14 with its sanitizer and libFuzzer
# runtimes, valgrind, and python3 with venv and ensurepip) and the CMake packages that a
# configure probe (cmake/probe) finds the way the build does: abseil, fmt, spdlog,
# nlohmann_json, CLI11, GTest with gmock, Google Benchmark, OpenSSL and the CUDA
# toolkit's headers. So dependencies installed anywhere work: tools on PATH, libraries
# through CMAKE_PREFIX_PATH (or <Package>_ROOT), CUDA through CUDA_HOME.
#
# Only what is missing is installed, with apt-get (as root, or through sudo when it needs
# no password). Where that cannot be done (no apt-get, no root and no sudo, apt-get
# failing, e.g. without network, or a dependency apt cannot provide) it prints one line
# naming what is missing and how to point the build at it, and exits 1.
#   --check   report what is there and what is missing; install and build nothing
#             (exit 0 only when nothing is missing)
# Environment: CUDA_HOME (default /usr/local/cuda), KPACK_CMAKE_ARGS (more arguments for
# the probe and the configure, e.g. "-DKPACK_BUILD_BENCH=OFF"), CXX.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=run
check_only=0
while (($#)); do
  case "$1" in
    --for) profile="${2:-}"; shift 2 || true ;;
    --check) check_only=1; shift ;;
    *) echo "usage: tools/setup.sh [--for run|test] [--check]" >&2; exit 2 ;;
  esac
done
if [ "$profile" != run ] && [ "$profile" != test ]; then
  echo "usage: tools/setup.sh [--for run|test] [--check]" >&2
  exit 2
fi

build=build
cuda="${CUDA_HOME:-/usr/local/cuda}"
read -r -a extra_args <<< "${KPACK_CMAKE_ARGS:-}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

missing=()  # what is missing, in words
debs=()     # the Debian packages that provide it
no_deb=()   # what apt cannot provide
found=()    # what is there, for --check
need() {    # need WHAT [DEBIAN_PACKAGE...]
  missing+=("$1")
  if (($# > 1)); then debs+=("${@:2}"); else no_deb+=("$1"); fi
}

version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

probe_tools() {
  if ! command -v cmake >/dev/null 2>&1; then
    need "cmake >= 3.24" cmake
  else
    local v
    v="$(cmake --version | head -n1 | awk '{print $3}')"
    if version_ge "$v" 3.24; then
      found+=("cmake $v")
    else
      need "cmake >= 3.24 (found $v)" cmake
    fi
  fi
  if command -v ninja >/dev/null 2>&1; then found+=(ninja); else need ninja ninja-build; fi
  # $CXX if set, else what CMake would pick first (whether it compiles C++20 is probed).
  local cxx="${CXX:-}" c
  if [ -z "$cxx" ]; then
    for c in c++ g++ clang++; do
      if command -v "$c" >/dev/null 2>&1; then cxx="$c"; break; fi
    done
  fi
  if [ -n "$cxx" ] && command -v "$cxx" >/dev/null 2>&1; then
    found+=("$cxx")
  else
    need "a C++ compiler (${CXX:-c++, g++ or clang++})" g++
  fi
  [ "$profile" = test ] || return 0
  if [ "$cxx" != g++ ]; then
    if command -v g++ >/dev/null 2>&1; then found+=(g++); else need g++ g++; fi
  fi
  # The sanitizer and fuzzing stages: the compiler and its runtimes, tried for real.
  cat > "$scratch/fuzz.cc" <<'EOF'
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
EOF
  if command -v clang++-14 >/dev/null 2>&1 &&
     clang++-14 -fsanitize=fuzzer,address,undefined "$scratch/fuzz.cc" -o "$scratch/fuzz" \
       >/dev/null 2>&1; then
    found+=(clang++-14)
  else
    need "clang-14 with its sanitizer and libFuzzer runtimes" clang-14 libclang-rt-14-dev
  fi
  if command -v valgrind >/dev/null 2>&1; then found+=(valgrind); else need valgrind valgrind; fi
  # Debian ships ensurepip (which `python3 -m venv` needs for pip) in python3-venv.
  if command -v python3 >/dev/null 2>&1 && python3 -c 'import ensurepip, venv' 2>/dev/null; then
    found+=("python3 with venv")
  else
    need "python3 with venv" python3 python3-venv
  fi
}

deb_for() {  # the Debian packages of a CMake package the probe reports missing
  case "$1" in
    cxx20) echo g++ ;;
    absl) echo libabsl-dev ;;
    fmt) echo libfmt-dev ;;
    spdlog) echo libspdlog-dev ;;
    nlohmann_json) echo nlohmann-json3-dev ;;
    CLI11) echo libcli11-dev ;;
    GTest) echo libgtest-dev libgmock-dev ;;
    benchmark) echo libbenchmark-dev ;;
    OpenSSL) echo libssl-dev ;;
    *) echo "" ;;  # Threads comes with the C library; CUDA is not a Debian package here
  esac
}

probe_packages() {
  local out line name
  if ! out="$(cmake -S cmake/probe -B "$scratch/probe" -G Ninja \
                -DCUDAToolkit_ROOT="$cuda" "${extra_args[@]}" 2>&1)"; then
    echo "kpack setup: the CMake probe (cmake/probe) failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  while IFS= read -r line; do
    case "$line" in
      "-- kpack-probe: found cxx20") found+=("C++20") ;;
      "-- kpack-probe: found "*) found+=("${line#-- kpack-probe: found }") ;;
      "-- kpack-probe: missing "*)
        name="${line#-- kpack-probe: missing }"
        local what="$name"
        case "$name" in
          cxx20) what="a C++20 compiler (${CXX:-the default C++ compiler} cannot compile C++20)" ;;
          CUDAToolkit)
            what="the CUDA toolkit headers (cuda.h, cudaTypedefs.h; looked in $cuda: set CUDA_HOME)"
            ;;
          GTest) what="GTest with gmock" ;;
        esac
        # shellcheck disable=SC2046  # one word per package
        need "$what" $(deb_for "$name")
        ;;
    esac
  done <<< "$out"
}

probe() {
  missing=() debs=() no_deb=() found=()
  probe_tools
  # The package probe needs cmake, ninja and a compiler to run at all.
  if ((${#missing[@]} == 0)); then
    probe_packages
    packages_probed=1
  else
    packages_probed=0
  fi
}

# One line: what is missing, why it cannot be installed, how to point the build at it.
cannot_install() {
  local list
  list="$(printf '%s; ' "${missing[@]}")"
  list="${list%; }"
  local line="kpack setup: missing ${list}"
  ((packages_probed)) ||
    line+=" (CMake packages not probed yet: that needs cmake, ninja and a compiler)"
  line+="; cannot install: $1. Install them"
  ((${#debs[@]})) && line+=" (Debian/Ubuntu: ${debs[*]})"
  line+=", then put the tools on PATH and each library's prefix in CMAKE_PREFIX_PATH"
  line+=" (e.g. CMAKE_PREFIX_PATH=/opt/deps/usr tools/setup.sh)"
  echo "$line" >&2
  exit 1
}

probe
if ((check_only)); then
  echo "kpack setup: found: $(printf '%s, ' "${found[@]}" | sed 's/, $//')"
  if ((${#missing[@]})); then
    echo "kpack setup: missing: $(printf '%s; ' "${missing[@]}" | sed 's/; $//')"
    ((packages_probed)) ||
      echo "kpack setup: CMake packages not probed (needs cmake, ninja, a compiler)"
    ((${#debs[@]})) && echo "kpack setup: would install (apt-get): ${debs[*]}"
    exit 1
  fi
  echo "kpack setup: nothing missing"
  exit 0
fi

# At most two rounds: the first may install only tools (the package probe needs them),
# the second what the probe then reports; anything still missing after that is reported.
rounds=0
previous_probed=0
while ((${#missing[@]})); do
  if ((${#no_deb[@]})); then
    cannot_install "apt-get does not provide $(printf '%s; ' "${no_deb[@]}" | sed 's/; $//')"
  fi
  if ((rounds)) && { ((previous_probed)) || ((!packages_probed)); }; then
    cannot_install "still missing after apt-get install"
  fi
  command -v apt-get >/dev/null 2>&1 || cannot_install "no apt-get on PATH"
  sudo=()
  if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
      sudo=(sudo)
    else
      cannot_install "not root, and no sudo without a password"
    fi
  fi
  log="$(mktemp "${TMPDIR:-/tmp}/kpack-setup-apt.XXXXXX")"
  echo "kpack setup: installing ${debs[*]} (apt-get; log: $log)"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 ||
    cannot_install "apt-get update failed (no network? see $log)"
  # shellcheck disable=SC2046  # deduplicated package names
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      $(printf '%s\n' "${debs[@]}" | sort -u) >>"$log" 2>&1 ||
    cannot_install "apt-get install failed (see $log)"
  rounds=$((rounds + 1))
  previous_probed=$packages_probed
  probe
done

profile_args=()
targets=()  # the main job runs only the kpack command line; the tests need everything
if [ "$profile" = test ]; then
  profile_args+=("-DKPACK_EXAMPLE_COMPILERS=g++;clang++-14")
  echo "kpack setup: building everything (library, command line, tests, benchmarks) in $build/"
else
  targets=(--target kpack_cli)
  echo "kpack setup: building the kpack command line (target kpack_cli) in $build/"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" \
  "${profile_args[@]}" "${extra_args[@]}" >/dev/null
cmake --build "$build" -j"$(nproc)" "${targets[@]}"
