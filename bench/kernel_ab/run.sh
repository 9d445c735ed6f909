#!/usr/bin/env bash
# The GPU fingerprint kernels of a revision ("base") against the working tree's ("work"), in one
# process: every result of work checked against base's bit for bit and both against the CPU's,
# then both timed on the same tensors (main.cu says which). Build and run on the GPU machine
# (nvcc, sm_90): the extension's own build is not needed, and it takes about a minute.
#
#   git archive REV csrc -o .whl/base.tar           # on your machine; carry .whl/ along
#   bash bench/kernel_ab/run.sh .whl/base.tar        # prints the checks, then the timings
#
# A change to how blocks split a tensor (the partials) changes the float64 sums' order: the
# stats' sum and the sketch's low bits then differ from base's, and nothing else may.
set -euo pipefail
BASE_TAR=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
CSRC=$(cd "$HERE/../../csrc" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/base" "$WORK/obj"
tar -xf "$BASE_TAR" -C "$WORK/base"
NVCC="nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -I $HERE"
build() {  # NAME CSRC_DIR: its kernels and CPU fingerprint, in namespace NAME
  local name=$1 dir=$2
  $NVCC -I "$dir" -Dopguard="$name" -DAPI_PREFIX="$name" \
    -DVARIANT_SRC="\"$dir/fingerprint_cuda.cu\"" -c "$HERE/variant.cu" -o "$WORK/obj/$name.o"
  g++ -std=c++17 -O3 -I "$dir" -Dopguard="$name" -c "$dir/fingerprint_cpu.cpp" \
    -o "$WORK/obj/cpu_$name.o"
}
build base "$WORK/base/csrc" & base=$!
build work "$CSRC" & work=$!
$NVCC -c "$HERE/main.cu" -o "$WORK/obj/main.o" & main=$!
wait $base && wait $work && wait $main
$NVCC "$WORK"/obj/*.o -o "$WORK/kernel_ab"
"$WORK/kernel_ab"
