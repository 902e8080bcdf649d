#!/usr/bin/env bash
# The main job: set up and build, then show the `kpack` command line on the bundled packs.
# Without a GPU: doctor (why nothing launches), inspect and verify (offline), exit 0
# (KPACK_REQUIRE_GPU=1 makes that a failure). With one: also run a kernel and benchmark
# host launch cost against the raw driver.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
kpack=build/tools/cli/kpack

echo "== kpack doctor"
# doctor exits 1 when nothing can launch here (and says why); that decides what follows.
can_launch=1
$kpack doctor || can_launch=0
echo
echo "== kpack inspect kernels/dispatchpack axpy"
$kpack inspect kernels/dispatchpack axpy
echo
for pack in kernels/testpack kernels/dispatchpack; do
  echo "== kpack verify $pack"
  $kpack verify "$pack"
  echo
done

if [ "$can_launch" = 0 ]; then
  if [ "${KPACK_REQUIRE_GPU:-0}" = 1 ]; then
    echo "KPACK_REQUIRE_GPU=1, but nothing can launch here (kpack doctor above says why)" >&2
    exit 1
  fi
  echo "Nothing can launch on this machine (kpack doctor above says why): run and bench"
  echo "need a GPU. The packs above were checked offline (manifest, sha256, ELF layouts)."
  exit 0
fi
echo "== kpack run kernels/testpack add"
$kpack run kernels/testpack add --arg x_ptr=zeros:float32:4096 \
  --arg y_ptr=zeros:float32:4096 --arg out_ptr=zeros:float32:4096 --arg n=4096 --grid 4
echo
echo "== kpack bench kernels/dispatchpack axpy (n=65536: bucket 1)"
$kpack bench kernels/dispatchpack axpy --arg x_ptr=zeros:float32:65536 \
  --arg y_ptr=zeros:float32:65536 --arg out_ptr=zeros:float32:65536 --arg n=65536 \
  --arg stride_x=1 --arg alpha=2
